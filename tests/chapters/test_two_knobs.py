"""Chapter 8 (the two knobs): vLLM's defaults per GPU, the sweep's invariants and capacity (pairs vLLM refuses are
not run), the per-rate reading of the default against the pick, the phrase that says where a reading holds, the
readable tables, and the chart's spec (a slider per knob labelled in its unit, radio buttons for one rate or every
load, every panel filtered by them, log latency axes labelled in ms and s over a fixed throughput axis, the
frontier, the default markers, the readout in the reader's units, the trail of visited pairs, the grid with the
refused ones)."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import altair as alt
import numpy as np
import pandas as pd
import pytest
from spec_helpers import walk

import batchlab as bl
from batchlab import viz
from batchlab.chapters import two_knobs as chapter

X, Y = "output_throughput", "p99_ttft_ms"
DEFAULTS = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}


def test_vllm_defaults_follow_the_gpu():
    table = chapter.vllm_defaults_table(["h100-sxm", "h200", "a100-80gb", "h100-pcie"]).set_index("gpu")
    assert table.loc["h100-sxm", ["max_num_seqs", "max_num_batched_tokens_serve",
                                  "max_num_batched_tokens_offline"]].tolist() == [1024, 8192, 16384]
    assert table.loc["h200"].tolist()[1:] == table.loc["h100-sxm"].tolist()[1:]
    assert table.loc["a100-80gb"].tolist()[1:] == [256, 2048, 8192]  # 80 GiB, but an A100
    assert table.loc["a100-80gb", "hbm_gib"] == pytest.approx(80.0)
    assert table.loc["h100-pcie", "max_num_seqs"] == 1024  # 79.6 GiB >= 70


def test_the_chapter_grid_is_evenly_spaced_by_index_and_holds_the_defaults():
    for grid in (chapter.MAX_NUM_SEQS, chapter.MAX_NUM_BATCHED_TOKENS):
        assert list(grid) == sorted(set(grid)) and np.all(np.diff(np.log2(grid)) <= 0.6)  # a half octave or less
    assert DEFAULTS["max_num_seqs"] in chapter.MAX_NUM_SEQS
    assert {DEFAULTS["max_num_batched_tokens"], 16384} <= set(chapter.MAX_NUM_BATCHED_TOKENS)


@pytest.fixture(scope="module")
def small_sweep(cost8b):
    return chapter.two_knob_sweep(cost8b, "azure-conv-2023", [4.0, 40.0], [4, 64, 1024], [512, 2048],
                                  n_requests=150, seed=1)


def test_two_knob_sweep_layout_and_invariants(small_sweep):
    df = small_sweep
    assert len(df) == 12 and df["rate_req_s"].tolist() == [4.0] * 6 + [40.0] * 6
    assert df["vllm_refuses"].tolist() == [False, False, False, False, True, False] * 2
    refused, accepted = df[df["vllm_refuses"]], df[~df["vllm_refuses"]]
    assert refused[["max_num_seqs", "max_num_batched_tokens"]].drop_duplicates().values.tolist() == [[1024, 512]]
    summary_cols = df.columns[df.columns.get_loc("completed"):df.columns.get_loc("rate_req_s")]
    assert refused[summary_cols].isna().all().all() and accepted[summary_cols].notna().all().all()  # never run
    assert (df["policy"] == "chunked").all()
    assert accepted["total_output_tokens"].nunique() == 1  # same lengths at every rate
    assert (accepted["rejected"] == 1).all()  # one prompt of the 150 is longer than Llama-3's 8,192-token context
    at = df.set_index(["rate_req_s", "max_num_seqs", "max_num_batched_tokens"])
    assert at.loc[(40.0, 4, 2048), Y] > at.loc[(40.0, 64, 2048), Y]  # a cap of 4 queues an overload
    assert at.loc[(40.0, 4, 2048), X] < at.loc[(40.0, 64, 2048), X]
    assert at.loc[(4.0, 64, 2048), Y] < at.loc[(40.0, 64, 2048), Y]  # more load, longer queues


def test_two_knob_sweep_is_the_same_on_an_executor(cost8b, small_sweep):
    with ThreadPoolExecutor(2) as pool:
        pooled = chapter.two_knob_sweep(cost8b, "azure-conv-2023", [4.0, 40.0], [4, 64, 1024], [512, 2048],
                                        n_requests=150, seed=1, executor=pool)
    pd.testing.assert_frame_equal(small_sweep, pooled)


def test_saturation_rate_is_the_queued_run_throughput(cost8b):
    cap = chapter.saturation_rate(cost8b, "azure-conv-2023", 300, seed=2)
    res = bl.simulate(bl.preset("azure-conv-2023", 300, rate_req_s=np.inf, seed=2), "chunked", cost8b)
    assert cap == pytest.approx(300 / res.requests["finish_s"].max())
    assert chapter.saturation_rate(cost8b, "azure-conv-2023", 300, seed=2, max_num_seqs=8) < cap / 2


def _pairs(rate, rows):
    """A one-rate sweep from (seqs, tokens, throughput, p99 TTFT, p99 ITL) rows."""
    out = pd.DataFrame(rows, columns=["max_num_seqs", "max_num_batched_tokens", X, Y, "p99_itl_ms"])
    return out.assign(rate_req_s=rate, p99_tpot_ms=out["p99_itl_ms"] / 3,
                      vllm_refuses=out["max_num_batched_tokens"] < out["max_num_seqs"])


@pytest.fixture
def reading():
    light = _pairs(10.0, [(1024, 8192, 100.0, 250.0, 80.0),  # the default
                          (1024, 3072, 100.0, 231.0, 75.0),  # the lowest TTFT: within 5 % of the default, not best
                          (1024, 2048, 100.0, 255.0, 50.0),  # as good a TTFT as the default's, the lowest ITL
                          (256, 2048, 100.0, 255.0, 50.2),  # the same run with a cap further from the default's
                          (1024, 1024, 100.0, 300.0, 30.0),  # lower ITL, but a TTFT 20 % worse
                          (8, 512, 50.0, 9e4, 10.0),  # cannot keep up: half the throughput
                          (2048, 1024, np.nan, np.nan, np.nan)])  # refused
    heavy = _pairs(20.0, [(1024, 8192, 200.0, 400.0, 160.0), (1024, 4096, 199.0, 410.0, 100.0)])
    return pd.concat([light, heavy], ignore_index=True)


def test_default_vs_pick_reads_each_rate_at_as_good_a_ttft_as_the_defaults(reading):
    picks = chapter.default_vs_pick(reading, DEFAULTS).set_index("rate_req_s")
    light, heavy = picks.loc[10.0], picks.loc[20.0]
    # within 5 % of the default's TTFT (not of the lowest), the lowest ITL; of the tie, the default's cap
    assert (light["pick_max_num_seqs"], light["pick_max_num_batched_tokens"]) == (1024, 2048)
    assert light["itl_ratio"] == pytest.approx(80 / 50) and light["lowest_p99_ttft_ms"] == 231.0
    assert light["pick_p99_tpot_ms"] == pytest.approx(50 / 3) and light["default_p99_ttft_ms"] == 250.0
    assert (heavy["pick_max_num_batched_tokens"], heavy["itl_ratio"]) == (4096, pytest.approx(1.6))  # 1 % less
    only_default = chapter.default_vs_pick(reading[reading["max_num_batched_tokens"] == 8192], DEFAULTS)
    assert (only_default["itl_ratio"] == 1).all()  # the default is always a candidate
    with pytest.raises(ValueError, match="ttft_tol"):
        chapter.default_vs_pick(reading, DEFAULTS, ttft_tol=1.5)


def test_rates_phrase_says_where_a_reading_holds():
    rates = [10.4, 16.7, 19.8]
    assert chapter.rates_phrase(rates, [True, True, True]) == "at each of the three loads below capacity"
    assert chapter.rates_phrase(rates, [False, True, True]) == "from 16.7 req/s on"
    assert chapter.rates_phrase(rates, [True, False, True]) == "at 10.4 and 19.8 req/s"
    assert chapter.rates_phrase(rates, [False, False, True]) == "at 19.8 req/s"
    assert chapter.rates_phrase(rates, [False] * 3) == "at none of the loads below capacity"
    assert chapter.rates_phrase([19.8, 10.4], [True, False]) == "at 19.8 req/s"  # sorted by rate first
    with pytest.raises(ValueError):
        chapter.rates_phrase(rates, [True])


@pytest.fixture
def df():
    seqs, tokens, rates = [1024, 2048, 4096], [2048, 4096, 8192, 16384], [5.0, 10.0]
    rows = [{"rate_req_s": r, "max_num_seqs": s, "max_num_batched_tokens": t, X: 100.0 * r + s / 10,
             Y: 1e4 / s + t / 100 + r * 1e3 * (r > 6), "p99_itl_ms": t / 100 + 10, "p99_tpot_ms": 12.5}
            for r in rates for s in seqs for t in tokens]
    out = pd.DataFrame(rows)
    out["vllm_refuses"] = out["max_num_batched_tokens"] < out["max_num_seqs"]
    out["frontier"] = [i in (8, 17) for i in range(len(out))]
    return out


def params_of(spec):
    return {p["name"]: p for p in spec["params"]}


def test_two_knobs_chart_has_a_slider_per_knob_and_radio_buttons_for_the_rate(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS, offline_tokens=16384).to_dict()  # validates the schema
    params = params_of(spec)
    assert set(params) == {"seqs_i", "tokens_i", "rate_i", "visited", "visited_push"}
    seqs, tokens = params["seqs_i"]["bind"], params["tokens_i"]["bind"]
    assert seqs == {"input": "range", "min": 0.0, "max": 2.0, "step": 1.0, "name": "max_num_seqs (sequences)"}
    assert tokens["input"] == "range" and (tokens["min"], tokens["max"], tokens["step"]) == (0.0, 3.0, 1.0)
    labels = bl.viz._slider_labels(spec)  # what the page's runtime writes beside each slider (viz.render)
    assert labels["seqs_i"]["labels"] == ["1,024", "2,048", "4,096"]
    assert labels["tokens_i"]["labels"] == ["2,048", "4,096", "8,192", "16,384"]
    assert params["seqs_i"]["value"] == 0.0 and params["tokens_i"]["value"] == 2.0  # vLLM's default, 8,192
    rate = params["rate_i"]
    assert rate["bind"]["input"] == "radio" and rate["bind"]["options"] == [0.0, 1.0, 2.0]
    assert rate["bind"]["labels"] == ["5.0", "10.0", chapter.EVERY_LOAD] and rate["value"] == 2.0  # every load
    assert params_of(chapter.two_knobs_chart(df, DEFAULTS, rate_req_s=10.0).to_dict())["rate_i"]["value"] == 1.0


def test_every_panel_shows_the_selected_rate_or_every_load(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS, offline_tokens=16384).to_dict()
    readout, top, bottom, grid = spec["vconcat"]
    one_rate = "(rate_i == 2 || abs(datum['rate_i'] - rate_i) < 0.5)"
    for panel in (top, bottom, grid):
        for layer in panel["layer"]:
            assert one_rate in json.dumps(layer.get("transform", [])), layer["mark"]
    for panel in (top, bottom):  # refused pairs were never run: they have no operating point
        assert {"filter": "!datum.vllm_refuses"} in panel["layer"][0]["transform"]
    line = [layer for layer in top["layer"] if layer["mark"]["type"] == "line"]
    assert len(line) == 1 and {"filter": "rate_i == 2"} in line[0]["transform"]  # the frontier line: every load
    assert [layer["mark"]["type"] for layer in top["layer"]] == ["point", "line", "point", "point", "point", "point"]
    assert [layer["mark"]["type"] for layer in bottom["layer"]] == ["point"] * 4  # no frontier
    chosen = json.dumps(top["layer"][-1]["transform"])
    assert all(name in chosen for name in ("seqs_i", "tokens_i", "rate_i"))


def test_latency_axes_are_log_in_ms_and_s_over_a_fixed_throughput_axis(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS).to_dict()
    _, top, bottom, _ = spec["vconcat"]
    for panel, col in ((top, Y), (bottom, "p99_itl_ms")):
        y = panel["layer"][0]["encoding"]["y"]
        assert y["field"] == col and y["scale"]["type"] == "log" and all(  # fits the runs shown
            "[rate_i]" in end["expr"] for end in y["scale"]["domain"])
        assert y["axis"]["labelExpr"] == chapter.DURATION_LABEL
        x = panel["layer"][0]["encoding"]["x"]
        accepted = df.loc[~df["vllm_refuses"], X]
        assert x["scale"]["domain"] == [pytest.approx(accepted.min() * 0.95, rel=1e-3),  # tok/s as shown, whole
                                        pytest.approx(accepted.max() * 1.03, rel=1e-3)]
    assert top["layer"][0]["encoding"]["y"]["title"] == "p99 TTFT (log scale)"
    assert top["layer"][0]["encoding"]["x"]["title"] == "output throughput (tok/s)"
    rows = max(spec["datasets"].values(), key=len)
    assert len(rows) == len(df) and max(r[Y] for r in rows if r[Y] is not None) > 1e4  # no run clamped or dropped


def test_readout_reads_durations_as_a_reader_writes_them(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS).to_dict()
    readout = spec["vconcat"][0]
    assert [layer["mark"]["type"] for layer in readout["layer"]] == ["text", "text"]
    calc = {c["as"]: c["calculate"] for c in readout["layer"][1]["transform"] if "calculate" in c}
    assert calc["y_text"] == viz.duration_text(Y) and calc["y2_text"] == viz.duration_text("p99_itl_ms")
    assert "datum.y_text" in calc["label"] and "datum.rate_req_s" in calc["label"]
    refusal = calc["label"].split("? '")[1].split("'")[0]
    assert refusal.startswith("refused by vLLM") and len(refusal) < 50  # fits a phone's column
    assert "datum.rate_i" in calc["line_y"] and "rate_i ==" not in calc["line_y"]  # a line per rate, always
    color = readout["layer"][1]["encoding"]["color"]  # the selected rate's line dark, the others grey
    (shown,) = color["condition"]
    assert color["value"] == chapter.READOUT_OTHER and shown["value"] == chapter.READOUT_SHOWN
    assert "rate_i == 2" in shown["test"]  # every load: every line dark


def test_chart_data_round_once_to_what_the_readout_prints(df):
    """The chart's durations are rounded once, to the digits the readout prints (batchlab.viz.round_duration),
    so it reads as the table does: 249.496 ms is "249 ms" in both, 8,987.2 ms "8.99 s"."""
    spec = chapter.two_knobs_chart(df, DEFAULTS).to_dict()
    runs = next(ds for ds in spec["datasets"].values() if Y in ds[0] and "seqs_i" in ds[0])
    shown = [r[Y] for r in runs if r[Y] is not None]
    assert shown and all(v == viz.round_duration([v])[0] for v in shown)  # no digit the readout hides
    raw = df.loc[df[Y].notna(), Y]
    assert sorted(viz.format_duration(v) for v in shown) == sorted(viz.format_duration(v) for v in raw)


def test_tooltips_are_titled_in_words_with_units(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS).to_dict()
    tips = [t for tips in walk(spec, "tooltip") if isinstance(tips, list) for t in tips]
    assert tips and all(isinstance(t, dict) and t.get("title") for t in tips)
    assert "frontier" not in {t["field"] for t in tips}  # a yes or a no, not a raw boolean
    titles = {t["field"]: t["title"] for t in tips}
    assert titles["y_text"] == "p99 TTFT" and titles["tpot_text"] == "p99 TPOT" and "p99_tpot_ms" not in titles
    calcs = {c["as"]: c["calculate"] for c in walk(spec, "transform") for c in c if "calculate" in c}
    assert calcs["tpot_text"] == viz.duration_text("p99_tpot_ms")  # "9.80 ms": each duration by the book's rule
    assert titles["max_num_seqs"] == "max_num_seqs (sequences)"


def test_two_knobs_chart_rate_colours_are_distinct_okabe_ito(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS).to_dict()
    colour = spec["vconcat"][1]["layer"][0]["encoding"]["color"]
    assert colour["field"] == "rate_req_s"
    assert colour["scale"]["domain"] == [5.0, 10.0]  # every rate, so a rate keeps its colour when shown alone
    assert colour["legend"]["labelExpr"] == "format(toNumber(datum.value), '.1f')"  # "25.0", as the buttons say
    assert colour["scale"]["range"] == chapter.RATE_COLORS[:2]
    first4 = chapter.RATE_COLORS[:4]
    assert set(first4) <= set(bl.viz.PALETTE) and len(set(first4)) == 4
    assert chapter.HIGHLIGHT not in chapter.RATE_COLORS
    for a, b in [("#56B4E9", "#0072B2"), ("#E69F00", "#D55E00")]:  # the two near-identical pairs
        assert not {a, b} <= set(first4)


def test_grid_panel_draws_refused_pairs_as_crosses_and_the_frontier_on_top(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS).to_dict()
    grid = spec["vconcat"][3]
    assert [layer["mark"]["type"] for layer in grid["layer"]] == ["point"] * 4
    dots = grid["layer"][0]["encoding"]
    assert dots["x"]["field"] == "max_num_batched_tokens" and dots["y"]["field"] == "max_num_seqs"
    assert "datum.frontier" in json.dumps(dots["color"]) and dots["order"]["field"] == "front"
    for layer in grid["layer"]:
        scale = layer["encoding"]["shape"]["scale"]
        assert dict(zip(scale["domain"], scale["range"]))["refused by vLLM"] == "cross"
    rows = max(spec["datasets"].values(), key=len)
    assert {r["kind"] for r in rows if r["vllm_refuses"]} == {"refused by vLLM"}


def test_two_knobs_chart_trail_of_visited_pairs(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS).to_dict()
    params = params_of(spec)
    trail = params["visited"]["select"]
    assert trail["type"] == "point" and trail["toggle"] == "true" and trail["clear"] is False
    assert trail["fields"] == ["seqs_i", "tokens_i"]
    push = params["visited_push"]["expr"]  # every move of a slider inserts the picked pair
    assert push.startswith("modify('visited_store'") and "values: [seqs_i, tokens_i]" in push
    _, top, bottom, grid = spec["vconcat"]
    for panel in (top, bottom, grid):
        faded = [layer for layer in panel["layer"]
                 if {"filter": {"param": "visited", "empty": False}} in layer.get("transform", [])]
        assert len(faded) == 1 and faded[0]["mark"]["filled"] is False and faded[0]["mark"]["opacity"] < 1


def test_two_knobs_chart_data(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS, offline_tokens=16384).to_dict()
    datasets = list(spec["datasets"].values())
    points = max(datasets, key=len)
    assert len(points) == len(df)  # the whole grid is in the page
    assert [row["kind"] for row in points].count("refused by vLLM") == int(df["vllm_refuses"].sum()) == 2
    marks = [d for d in datasets if d is not points][0]
    pick_kind = chapter.TWO_KNOB_KINDS[4]
    assert sorted(row["kind"] for row in marks if row["kind"] != pick_kind) == \
        ["vLLM offline default"] * 2 + ["vLLM serve default"] * 2
    # the pick of the page's table, one per rate, at its own rate
    picks = chapter.default_vs_pick(df, DEFAULTS)
    marked = sorted((r["rate_req_s"], r["max_num_seqs"], r["max_num_batched_tokens"]) for r in marks
                    if r["kind"] == pick_kind)
    assert marked == sorted(zip(picks["rate_req_s"], picks["pick_max_num_seqs"], picks["pick_max_num_batched_tokens"]))
    assert {row["seqs_i"] for row in points} == {0, 1, 2} and {row["rate_i"] for row in points} == {0, 1}
    assert {(r["seqs_i"], r["max_num_seqs"]) for r in points} == {(0, 1024), (1, 2048), (2, 4096)}
    without = chapter.two_knobs_chart(df, DEFAULTS).to_dict()
    assert sum(len(d) for d in without["datasets"].values()) == len(df) + 2 + 2  # serve default and pick, per rate


def test_latency_axes_end_on_labelled_ticks_around_the_shown_runs(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS).to_dict()
    _, top, bottom, _ = spec["vconcat"]
    rates = np.sort(df["rate_req_s"].unique())
    for panel, col in ((top, "p99_ttft_ms"), (bottom, "p99_itl_ms")):
        scale = panel["layer"][0]["encoding"]["y"]["scale"]
        low, high = scale["domain"]  # no domain read off the data: an empty layer would give an infinite extent
        lo = eval(low["expr"].split("[rate_i]")[0])  # one end per rate, then every load
        hi = eval(high["expr"].split("[rate_i]")[0])
        ran = df[~df["vllm_refuses"]]
        groups = [ran.loc[ran["rate_req_s"] == r, col] for r in rates] + [ran[col]]
        assert len(lo) == len(hi) == len(rates) + 1
        for a, b, g in zip(lo, hi, groups):
            assert a <= g.min() * (1 + 1e-6) and b >= g.max() * (1 - 1e-3) and b < 2.5 * g.max()
            for end in (a, b):
                mantissa = end / 10 ** np.floor(np.log10(end) + 1e-9)
                assert min(abs(mantissa - m) for m in (1, 2, 5)) < 1e-9, end  # a tick the axis labels


def test_tables_read_in_units():
    df = pd.DataFrame({"rate_req_s": [19.8] * 4, "load": [0.95] * 4, "max_num_seqs": [8, 1024, 512, 16],
                       "p99_ttft_ms": [468317.0, 422.0, 1286.0, np.nan], "itl_ratio": [1.95, 1.0, 1.0, 1.0]})
    runs = chapter.runs_table(df, {"rate_req_s": "rate (req/s)", "load": "load", "max_num_seqs": "max_num_seqs",
                                   "p99_ttft_ms": "p99 TTFT", "itl_ratio": "p99 ITL, default / pick"}).to_html()
    assert "422\u00a0ms" in runs  # a value and its unit stay on one line
    runs = runs.replace("\u00a0", " ")
    assert "19.8" in runs and "95%" in runs and "468 s" in runs and "422 ms" in runs and "1,024" in runs
    assert "×1.9" in runs and "468317" not in runs
    assert "1.29 s" in runs and "refused" in runs  # the book's rule; a pair vLLM refuses was never run
    gpus = chapter.vllm_defaults_style(chapter.vllm_defaults_table(["a100-80gb"]).set_index("gpu")).to_html()
    assert "HBM (GiB)" in gpus and "2,048 / 8,192" in gpus and "hbm_gib" not in gpus  # serve / offline, one column
    assert gpus.count("max_num_batched_tokens") == 1  # one long header, so the table fits the book's column
    assert "A100 80GB" in gpus and ">index<" not in gpus and ">gpu<" not in gpus  # the page's names, no stray index


def test_uneven_knob_grid_still_gets_a_slider_over_its_positions(df):
    uneven = df.replace({"max_num_seqs": {4096: 8192}})  # 1,024, 2,048, 8,192: positions 0, 1, 2
    spec = chapter.two_knobs_chart(uneven, DEFAULTS).to_dict()
    assert params_of(spec)["seqs_i"]["bind"]["input"] == "range"
    assert bl.viz._slider_labels(spec)["seqs_i"]["labels"] == ["1,024", "2,048", "8,192"]


def test_duration_axis_labels_carry_units_and_separators():
    import vl_convert

    df = pd.DataFrame({"ms": [5.0, 2_000_000.0]})
    chart = alt.Chart(df).mark_point().encode(y=alt.Y("ms:Q", scale=alt.Scale(type="log"), axis=alt.Axis(
        values=[10, 200, 1_000_000], labelExpr=chapter.DURATION_LABEL)))
    svg = vl_convert.vegalite_to_svg(chart.to_dict())
    for text in (">10 ms<", ">200 ms<", ">1,000 s<"):
        assert text in svg, text

