"""Chapter 9 (tuning for your traffic): the tuning grid's layout and invariants (one pick and one default per
workload, SLO and load, loads as shares of capacity, the pick's goodput within 1 % of the largest and at least
the default's, its p99 / bound within 1 % of the smallest among those, and of those full ties the one nearest
vLLM's default; refused pairs without numbers; each run's longest gap read under every SLO; whether any pair holds
the SLO), the picks against a direct simulation, the headroom against simulation, goodput, p99 and the stall bound
read as different tests, the example trace read back by the loaders, the tables (no pick named where none holds),
the readout, and the goodput map's spec (radio rows labelled in words and ms, a heatmap on the two knobs in
tokens and sequences coloured by the share of requests within the SLO, the pick marked only where some pair
holds, the readout filtered by all three controls)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from spec_helpers import marks, titles, walk

import batchlab as bl
from batchlab import viz
from batchlab.chapters import tuning as chapter
from batchlab.chapters import two_knobs
from batchlab.tune import at_rate

SLOS = ["ttft:500 tpot:50", "ttft:500 tpot:50 itl:100"]
SLO_NAMES = {s: chapter.slo_label(bl.parse_goodput(s)) for s in SLOS}
WORKLOADS = {"azure-conv-2023": "conversation"}
LOADS = {0.5: "50% of capacity", 1.2: "120% of capacity"}
SEQS, TOKENS = (8, 64, 1024), (512, 2048, 8192)  # a small grid with vLLM's default (1024, 8192) and one refusal
N = 200


@pytest.fixture(scope="module")
def tuned(cost8b):
    return chapter.tuning_grid(cost8b, list(WORKLOADS), SLOS, list(LOADS), N, seed=1, max_num_seqs=SEQS,
                               max_num_batched_tokens=TOKENS)


def test_slo_label_reads_in_ms_and_names_the_longest_gap():
    assert SLO_NAMES == {"ttft:500 tpot:50": "TTFT 500 ms, TPOT 50 ms",
                         "ttft:500 tpot:50 itl:100": "TTFT 500 ms, TPOT 50 ms, longest gap 100 ms"}
    assert chapter.slo_label(bl.SLO(e2el_ms=1500)) == "E2EL 1,500 ms"


def test_chapter_settings():
    assert chapter.SLOS[1] == chapter.SLOS[0] + " itl:100"  # the stall bound beside the usual one, nothing else
    assert sorted(chapter.LOADS) == [two_knobs.CONV_LOADS["light"], two_knobs.CONV_LOADS["near"]]  # chapter 8's
    assert set(chapter.WORKLOAD_SCENES) == set(chapter.WORKLOADS)


def test_tuning_grid_layout_and_invariants(cost8b, tuned):
    grid, picks = tuned
    assert list(grid.columns) == chapter.GRID_COLUMNS and list(picks.columns) == chapter.PICK_COLUMNS
    assert len(grid) == 9 * 2 * 2 and len(picks) == 4
    for (_, spec, load), g in grid.groupby(["workload", "slo", "load"]):
        assert g["best"].sum() == 1 and g["vllm_default"].sum() == 1
        assert g.loc[g["vllm_default"], ["max_num_seqs", "max_num_batched_tokens"]].values.tolist() == [[1024, 8192]]
        best = g[g["best"]].iloc[0]
        top, dflt = g["request_goodput"].max(), g.loc[g["vllm_default"], "request_goodput"].item()
        assert best["request_goodput"] >= max(0.99 * top, dflt) and best["share_of_top"] >= 0.99
        candidates = g[~g["vllm_refuses"] & (g["request_goodput"] >= max(0.99 * top, dflt))]
        least = candidates["slo_load"].min()
        assert least <= best["slo_load"] <= least * 1.01  # the most headroom among the ties, to within 1 %
        full_ties = candidates[candidates["slo_load"] <= least * 1.01]
        distance = (np.abs(np.log2(full_ties["max_num_seqs"] / 1024))
                    + np.abs(np.log2(full_ties["max_num_batched_tokens"] / 8192)))
        best_distance = abs(np.log2(best["max_num_seqs"] / 1024)) + abs(np.log2(best["max_num_batched_tokens"] / 8192))
        assert best.name in full_ties.index and best_distance == distance.min()  # then the pair nearest the default
        refused = g[g["vllm_refuses"]]
        assert refused[["max_num_seqs", "max_num_batched_tokens"]].values.tolist() == [[1024, 512]]
        assert refused[["share_of_top", "share_within", "p99_ttft_ms", "slo_load"]].isna().all().all()
        ok = g[~g["vllm_refuses"]]
        assert ok["share_within"].between(0, 1).all() and ok["p99_longest_itl_ms"].notna().all()
        pick = picks[(picks["slo"] == spec) & (picks["load"] == load)].iloc[0]
        assert pick["best_goodput"] == best["request_goodput"] >= pick["default_goodput"]
        assert pick["best_slo_load"] == best["slo_load"] and pick["top_goodput"] == top
        assert pick["holds_any"] == ok["slo_met"].any()
        assert pick["best_p99_longest_itl_ms"] == best["p99_longest_itl_ms"]
        assert pick["default_goodput"] <= pick["served_req_s"] * (1 + 1e-12)  # goodput never beats what was served
        assert best["share_within"] <= 1 + 1e-12
    capacity = two_knobs.saturation_rate(cost8b, "azure-conv-2023", N, seed=1)
    assert sorted(picks["rate_req_s"].unique()) == [round(0.5 * capacity, 1), round(1.2 * capacity, 1)]
    heavy = grid[(grid["load"] == 1.2) & ~grid["vllm_refuses"]]
    light = grid[(grid["load"] == 0.5) & ~grid["vllm_refuses"]]
    assert heavy["p99_ttft_ms"].median() > light["p99_ttft_ms"].median()  # more load, longer queues
    with pytest.raises(ValueError, match="loads"):
        chapter.tuning_grid.uncached(cost8b, list(WORKLOADS), SLOS, [0.0], N)


def test_tuning_grid_matches_a_direct_simulation(cost8b, tuned):
    grid, _ = tuned
    row = grid[(grid["slo"] == SLOS[0]) & (grid["load"] == 0.5) & (grid["max_num_seqs"] == 64)
               & (grid["max_num_batched_tokens"] == 2048)].iloc[0]
    stream = bl.preset("azure-conv-2023", N, rate_req_s=row["rate_req_s"], seed=1)
    res = bl.simulate(stream, "chunked", cost8b, max_num_seqs=64, max_num_batched_tokens=2048)
    s = res.summary(slo=bl.parse_goodput(SLOS[0]))
    assert row["request_goodput"] == s["request_goodput"] and row["slo_met"] == s["slo_met"]
    assert row["p99_ttft_ms"] == s["p99_ttft_ms"]
    assert row["slo_load"] == pytest.approx(max(s["p99_ttft_ms"] / 500, s["p99_tpot_ms"] / 50), rel=1e-12)
    # the longest gap shown under the usual SLO is the same run's, read under the stall bound
    stall = res.summary(slo=bl.parse_goodput(SLOS[1]))
    assert row["p99_longest_itl_ms"] == pytest.approx(stall["p99_longest_itl_ms"], rel=1e-12)
    itl_row = grid[(grid["slo"] == SLOS[1]) & (grid["load"] == 0.5) & (grid["max_num_seqs"] == 64)
                   & (grid["max_num_batched_tokens"] == 2048)].iloc[0]
    assert itl_row["request_goodput"] == stall["request_goodput"] <= row["request_goodput"]  # one more bound


def test_headroom_brackets_by_simulation(cost8b, tuned):
    _, picks = tuned
    rates = chapter.headroom(cost8b, picks.iloc[:1], N, seed=1)
    row = rates.iloc[0]
    assert row["default_max_rate_req_s"] > 0 and row["best_max_rate_req_s"] > 0
    assert row["rate_ratio"] == pytest.approx(row["best_max_rate_req_s"] / row["default_max_rate_req_s"])
    stream = bl.preset("azure-conv-2023", N, rate_req_s=row["rate_req_s"], seed=1)
    slo = bl.parse_goodput(row["slo"])
    ok = bl.simulate(at_rate(stream, row["default_max_rate_req_s"]), "chunked", cost8b, record_tokens=False)
    assert slo.met_by(ok.summary())


def test_slo_readings_tell_goodput_from_p99_and_see_the_stall(cost8b):
    stream = bl.preset("azure-conv-2023", 300, seed=3)
    res = bl.simulate(stream, "chunked", cost8b)
    # bounds no request can miss, bounds every request misses, and a stall bound below every request's longest gap
    r = chapter.slo_readings(res, ["ttft:100000 tpot:100000", "ttft:1 tpot:1", "ttft:100000 tpot:100000 itl:1"])
    assert r["missed"].tolist() == [0, res.summary()["completed"], res.summary()["completed"]]
    assert r["request_goodput"].iloc[0] == pytest.approx(r["request_throughput"].iloc[0])
    assert r["slo_met"].tolist() == [True, False, False]
    assert np.isnan(r["p99_longest_itl_ms"].iloc[0]) and r["p99_longest_itl_ms"].iloc[2] > r["p99_tpot_ms"].iloc[2]
    html = chapter.slo_readings_table(r, {s: s for s in r["slo"]}).to_html()
    for header in ("goodput (req/s)", "requests missing a bound", "p99 TTFT", "p99 longest gap",
                   "p99s within the SLO", "not bounded"):
        assert header in html
    assert viz.format_duration(r["p99_tpot_ms"].iloc[0]).replace(" ", "\u00a0") in html  # the book's one rule


def test_example_trace_reads_back(tmp_path):
    from batchlab.loaders import load_workload
    stream = bl.preset("azure-code-2023", 50, seed=2)
    path = tmp_path / "my_trace.csv"
    chapter.write_example_trace(path, stream)
    back = load_workload(path).requests
    np.testing.assert_allclose(back.arrival_s, stream.arrival_s - stream.arrival_s[0])
    assert back.prompt_tokens.tolist() == stream.prompt_tokens.tolist()
    assert back.output_tokens.tolist() == stream.output_tokens.tolist()


def test_result_table_reads_a_tune_result_in_units(cost8b):
    stream = bl.preset("azure-conv-2023", 120, seed=4)
    result = bl.tune(stream, cost8b, bl.parse_goodput(SLOS[1]), max_num_seqs=[64, 1024],
                     max_num_batched_tokens=[2048, 8192], progress=False)
    html = chapter.result_table(result).to_html()
    assert "tuner's pick" in html and "vLLM default" in html and "p99 longest gap" in html
    assert "goodput (req/s)" in html and "8,192" in html and "{" not in html  # no raw dict on the page
    assert "seqs / tokens" in html and "max_num_batched_tokens" not in html  # short headers: fits 688 px
    knobs = result.best
    assert f"{knobs['max_num_seqs']:,} / {knobs['max_num_batched_tokens']:,}" in html
    assert viz.format_duration(knobs["p99_ttft_ms"]).replace(" ", "\u00a0") in html


def test_tables_name_no_pick_where_none_holds(tuned):
    _, picks = tuned
    none = picks.assign(holds_any=False)
    html = chapter.picks_table(none, SLO_NAMES, WORKLOADS).to_html()
    assert "none holds the SLO" in html and "goodput (req/s): pick / vLLM default, of served" in html
    rate = viz.format_rate  # the book's one rule for rates, as on the map
    assert f"– / {rate(none['default_goodput'].iloc[0])} of {rate(none['served_req_s'].iloc[0])}" in html  # no pick's
    # the code scene's readings (chapter 9): below 1 req/s two significant digits, as the map's cells; zero is "0"
    code = none.assign(default_goodput=0.049649, served_req_s=8.274874, top_goodput=0.71836)
    assert "– / 0.050 of 8.3" in chapter.picks_table(code, SLO_NAMES, WORKLOADS).to_html()
    assert "– / 0 of 8.3" in chapter.picks_table(code.assign(default_goodput=0.0), SLO_NAMES, WORKLOADS).to_html()
    assert chapter.readout_label(code.iloc[0]).split("\n")[1:] == ["goodput: best 0.72, default 0.050 req/s",
                                                                   "(vLLM default served 8.3 req/s)"]
    held = picks.assign(holds_any=True, best_max_num_seqs=1024, best_max_num_batched_tokens=8192)
    assert "1,024 / 8,192 (vLLM default)" in chapter.picks_table(held, SLO_NAMES, WORKLOADS).to_html()
    rates = none.assign(best_max_rate_req_s=0.0, default_max_rate_req_s=12.34, rate_ratio=np.nan)
    html = chapter.headroom_table(rates, SLO_NAMES, WORKLOADS).to_html()
    assert "no rate / 0.061" in chapter.headroom_table(rates.assign(default_max_rate_req_s=0.060991), SLO_NAMES,
                                                       WORKLOADS).to_html()
    assert "no rate / 12.3" in html and "largest rate (req/s): pick / vLLM default" in html and "(most goodput)" in html
    assert "SLO load" in chapter.picks_table(held, SLO_NAMES, WORKLOADS).to_html() and "p99 / bound" not in html


def test_readout_says_when_no_setting_holds(tuned):
    _, picks = tuned
    row = picks.iloc[0]
    same = row.copy()
    same["holds_any"], same["best_max_num_seqs"], same["best_max_num_batched_tokens"] = True, 1024, 8192
    assert chapter.readout_label(same).startswith("pick: vLLM's default itself\ngoodput: pick ")
    moved = same.copy()
    moved["best_max_num_batched_tokens"] = 2048
    assert chapter.readout_label(moved).startswith("pick: 1,024 sequences, 2,048 tokens\n")
    none = same.copy()
    none["holds_any"] = False
    label = chapter.readout_label(none)
    assert label.startswith("no setting holds the p99s") and "pick" not in label and "×" not in label
    for text in (chapter.readout_label(same), label):
        assert all(len(line) <= chapter.READOUT_CHARS for line in text.split("\n"))  # fits a phone's column
        assert len(text.split("\n")) == 3
        # goodput and what was served read by the book's one rule for rates, as the table and the map print them
        _, goodput, served = text.split("\n")
        first = none["top_goodput"] if text == label else same["best_goodput"]
        who = "best" if text == label else "pick"
        assert goodput == (f"goodput: {who} {viz.format_rate(first)}, default "
                           f"{viz.format_rate(same['default_goodput'])} req/s")
        assert served == f"(vLLM default served {viz.format_rate(same['served_req_s'])} req/s)"


def test_goodput_map_chart_spec(tuned):
    grid, picks = tuned
    spec = chapter.goodput_map_chart(grid, picks, WORKLOADS, SLO_NAMES, LOADS).to_dict()
    params = {p["name"]: p for p in walk(spec, "params") for p in p if "bind" in p}
    assert set(params) == {"slo_i", "load_i"}  # one workload: no control for it
    assert all(p["bind"]["input"] == "radio" for p in params.values())
    assert params["slo_i"]["bind"]["labels"] == list(SLO_NAMES.values())
    assert params["load_i"]["bind"]["labels"] == ["50% of capacity", "120% of capacity"]
    assert {"rect", "point", "text"} <= marks(spec)
    assert {"max_num_batched_tokens (tokens)", "max_num_seqs (sequences)"} <= set(titles(spec))
    filters = [f for f in walk(spec, "filter") if isinstance(f, str)]
    assert any("slo_i" in f and "load_i" in f for f in filters)
    colors = [c for c in walk(spec, "color") if isinstance(c, dict) and c.get("field") == "share_within"]
    assert colors and colors[0]["scale"]["domain"] == [0, 1] and colors[0]["legend"]["titleLimit"] == 0
    cells = next(ds for ds in spec["datasets"].values() if "kind" in ds[0])
    assert len(cells) == 9 * 4
    kinds = [d["kind"] for d in cells]
    assert kinds.count("tuner's pick") == int(picks["holds_any"].sum()) and kinds.count("refused by vLLM") == 4
    readout = [d for ds in spec["datasets"].values() for d in ds if "label" in d]
    assert len(readout) == 4 and all("vLLM default" in d["label"] for d in readout)
    tips = [t for ts in walk(spec, "tooltip") if isinstance(ts, list) for t in ts]
    fields = {t["field"] for t in tips}
    assert {"slo_load_text", "longest_itl_text", "tpot_text", "share_text", "ttft_text", "goodput_tip"} <= fields
    # A refused pair's marks (its cell and its cross) read its knobs and why, once; every other mark reads the
    # run's numbers, none of them "refused" or "null" (a numeric field with no value).
    layers = [v for v in walk(spec, "layer") for v in v if "mark" in v]
    refused_layers = [v for v in layers if 'datum.held == "refused"' in v.get("transform", [{}])[-1].get(
        "filter", "")]
    assert {v["mark"]["type"] for v in refused_layers} == {"rect", "point"}
    for v in refused_layers:
        assert [t["title"] for t in v["encoding"]["tooltip"]] == [
            "max_num_seqs (sequences)", "max_num_batched_tokens (tokens)", "this pair"]
    calcs = {c["as"]: c["calculate"] for c in walk(spec, "transform") for c in c if "calculate" in c}
    assert calcs["refused_text"] == f"'{two_knobs.REFUSED_TEXT}'" and "fewer tokens than sequences" in calcs[
        "refused_text"]
    full = [v for v in layers if "tooltip" in v.get("encoding", {}) and v not in refused_layers]
    ran_only = ('datum.held != "refused"', f'datum.kind == "{chapter.MAP_KINDS[0]}"')  # the pick is never refused
    assert full and all(any(str(t.get("filter")) in ran_only for t in v["transform"]) for v in full)
    ran = [d for d in cells if d["kind"] != "refused by vLLM"]
    assert [d["share_text"] for d in ran] == [f"{d['share_within']:.1%}" for d in ran]
    assert [d["slo_load_text"] for d in ran] == [f"{d['slo_load']:.2f}" for d in ran]
    assert not any(f.endswith("_ms") for f in fields)  # every duration in a tooltip by the book's one rule
    for col in ("tpot", "longest_itl"):  # read off the unrounded runs, in grid order
        assert [d[f"{col}_text"] for d in cells] == [viz.format_duration(v, missing="refused")
                                                      for v in grid[f"p99_{col}_ms"]]
    ttft = [np.nan if d["p99_ttft_ms"] is None else d["p99_ttft_ms"] for d in cells]
    texts = [d["ttft_text"] for d in cells]  # the book's rule, on the data before it was rounded for the page
    assert texts == [viz.format_duration(v, missing="refused") for v in ttft]
    assert texts.count("refused") == 4 and any(t.endswith(" s") for t in texts)  # seconds from one second
    assert all(t.get("title") for t in tips)
    # goodputs: the data holds the digits the labels print, none for a refused pair, read by the book's rule
    shown = [np.nan if d["request_goodput"] is None else d["request_goodput"] for d in cells]
    want = viz.round_rate(grid["request_goodput"].where(~grid["vllm_refuses"]))
    np.testing.assert_array_equal(shown, want)
    calcs = {c["as"]: c["calculate"] for c in walk(spec, "transform") for c in c if "calculate" in c}
    assert calcs["goodput_text"] == viz.rate_text("request_goodput", missing="")
    assert calcs["goodput_tip"] == viz.rate_text("request_goodput", missing="refused")
    assert {"field": "goodput_text", "type": "nominal"}.items() <= next(
        t for t in walk(spec, "text") if isinstance(t, dict) and t.get("field") == "goodput_text").items()


def test_the_table_and_the_map_print_one_string_per_rate(tuned):
    """The picks table's goodputs, the map's cell labels and its readout read each rate the same way: the
    default's cell label (viz.rate_text on the map's data, its Python twin viz.format_rate here) is the string
    the table and the readout print."""
    grid, picks = tuned
    spec = chapter.goodput_map_chart(grid, picks, WORKLOADS, SLO_NAMES, LOADS).to_dict()
    cells = next(ds for ds in spec["datasets"].values() if "kind" in ds[0])
    readout = {(d["slo_i"], d["load_i"]): d["label"] for ds in spec["datasets"].values() for d in ds if "label" in d}
    html = chapter.picks_table(picks, SLO_NAMES, WORKLOADS).to_html()
    rows = chapter._indices(picks, list(WORKLOADS), list(SLO_NAMES), list(LOADS))
    for r in rows.itertuples(index=False):
        (cell,) = [d for d in cells if (d["slo_i"], d["load_i"], d["max_num_seqs"], d["max_num_batched_tokens"])
                   == (r.slo_i, r.load_i, 1024, 8192)]  # vLLM's default on this GPU
        label = viz.format_rate(cell["request_goodput"])
        assert label == viz.format_rate(r.default_goodput)
        best = viz.format_rate(r.best_goodput) if r.holds_any else "–"
        assert f"{best} / {label} of {viz.format_rate(r.served_req_s)}" in html
        assert f"default {label} req/s" in readout[(r.slo_i, r.load_i)]


def _pick_legends(spec):
    """The legends of the map's pick layer: the shape encodings whose scale's domain is the pick alone."""
    shapes = [e for e in walk(spec, "shape") if isinstance(e, dict) and "scale" in e]
    return [e["legend"] for e in shapes if e["scale"].get("domain") == [chapter.MAP_KINDS[0]]]


def test_the_pick_legend_shows_only_where_a_pick_is_drawn(tuned):
    """The map's legend names the tuner's pick only at a selection that has one: its own legend, whose symbol and
    label are drawn under an expression of the buttons that is true exactly at the selections with a pick."""
    grid, picks = tuned
    picks = picks.assign(holds_any=[True, False] * (len(picks) // 2))
    (legend,) = _pick_legends(chapter.goodput_map_chart(grid, picks, WORKLOADS, SLO_NAMES, LOADS).to_dict())
    expr = legend["symbolOpacity"]["expr"]
    assert legend["labelExpr"].startswith(expr.split(" ? ")[0])
    rows = chapter._indices(picks, list(WORKLOADS), list(SLO_NAMES), list(LOADS))
    for r in rows.itertuples(index=False):  # the expression, read back: a key per selection with a pick
        key = f"'{r.workload_i},{r.slo_i},{r.load_i}'"
        assert (key in expr) == r.holds_any, (key, expr)
    others = [e for e in walk(chapter.goodput_map_chart(grid, picks, WORKLOADS, SLO_NAMES, LOADS).to_dict(), "shape")
              if isinstance(e, dict) and e.get("scale", {}).get("domain") == list(chapter.MAP_KINDS[1:])]
    assert others and "symbolOpacity" not in others[0]["legend"]  # the default and refused pairs: always shown


def test_goodput_map_marks_no_pick_where_no_pair_holds(tuned):
    grid, picks = tuned
    none = picks.assign(holds_any=False)
    spec = chapter.goodput_map_chart(grid, none, WORKLOADS, SLO_NAMES, LOADS).to_dict()
    cells = next(ds for ds in spec["datasets"].values() if "kind" in ds[0])
    assert "tuner's pick" not in {d["kind"] for d in cells}
    readout = [d["label"] for ds in spec["datasets"].values() for d in ds if "label" in d]
    assert all(label.startswith("no setting holds") for label in readout)


def test_goodput_map_chart_with_two_workloads_has_three_radio_rows(tuned):
    grid, picks = tuned
    both = pd.concat([grid, grid.assign(workload="b")], ignore_index=True)
    spec = chapter.goodput_map_chart(both, pd.concat([picks, picks.assign(workload="b")]),
                                     {"azure-conv-2023": "conversation", "b": "copy"}, SLO_NAMES, LOADS).to_dict()
    params = [p for p in walk(spec, "params") for p in p if "bind" in p]
    assert sorted(p["name"] for p in params) == ["load_i", "slo_i", "workload_i"]
    assert all(p["bind"]["input"] == "radio" for p in params)


def test_no_pair_holds_an_slo_tighter_than_any_run(cost8b):
    grid, picks = chapter.tuning_grid(cost8b, list(WORKLOADS), ["ttft:1 tpot:1"], [0.5], 100, seed=1,
                                      max_num_seqs=(64, 1024), max_num_batched_tokens=(2048, 8192))
    assert not picks["holds_any"].any() and not grid["slo_met"].any()
    assert chapter.readout_label(picks.iloc[0]).startswith("no setting holds")
    assert "none holds the SLO" in chapter.picks_table(picks, {"ttft:1 tpot:1": "tight"}, WORKLOADS).to_html()
