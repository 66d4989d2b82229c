"""Chapter 08 (the two knobs): vLLM's defaults per GPU, the sweep's invariants and capacity (pairs vLLM refuses are
not run), the readable tables, and the chart's spec (the two knob button rows, the rate selector, the frontier,
the default markers, a highlight filtered by all three controls, the clamped TTFT axis with its off-axis marks,
distinct rate colours, the trail of visited configurations, and the grid of pairs with the refused ones)."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest
from spec_helpers import walk

import batchlab as bl
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


@pytest.fixture
def df():
    seqs, tokens, rates = [1024, 2048, 4096], [2048, 4096, 8192, 16384], [5.0, 10.0]
    rows = [{"rate_req_s": r, "max_num_seqs": s, "max_num_batched_tokens": t, X: 100.0 * r + s / 10,
             Y: 1e4 / s + t / 100 + r, "p99_itl_ms": t / 100 + 10}
            for r in rates for s in seqs for t in tokens]
    out = pd.DataFrame(rows)
    out["vllm_refuses"] = out["max_num_batched_tokens"] < out["max_num_seqs"]
    out["frontier"] = [i in (8, 17) for i in range(len(out))]
    return out


def test_two_knobs_chart_controls(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS, offline_tokens=16384).to_dict()  # validates the schema
    params = {p["name"]: p for p in spec["params"]}
    assert set(params) == {"log2_seqs", "log2_tokens", "rate_req_s", "visited", "visited_push"}
    seqs, tokens = params["log2_seqs"]["bind"], params["log2_tokens"]["bind"]
    assert seqs == {"input": "radio", "options": [10.0, 11.0, 12.0], "labels": ["1,024", "2,048", "4,096"],
                    "name": "max_num_seqs (sequences)"}  # each knob in its own unit; the parameters hold log2
    assert tokens == {"input": "radio", "options": [11.0, 12.0, 13.0, 14.0],
                      "labels": ["2,048", "4,096", "8,192", "16,384"], "name": "max_num_batched_tokens (tokens)"}
    assert not any("2^" in b.get("name", "") for b in walk(spec, "bind") if isinstance(b, dict))
    assert params["log2_seqs"]["value"] == 10.0 and params["log2_tokens"]["value"] == 13.0  # vLLM's default
    assert params["rate_req_s"]["bind"]["input"] == "radio"
    assert params["rate_req_s"]["bind"]["options"] == [5.0, 10.0]
    assert params["rate_req_s"]["value"] == 5.0  # the second highest rate
    chosen = chapter.two_knobs_chart(df, DEFAULTS, rate_req_s=10.0).to_dict()
    assert params_value(chosen, "rate_req_s") == 10.0


def test_two_knobs_chart_layers(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS, offline_tokens=16384).to_dict()
    readout, top, bottom, grid = spec["vconcat"]
    assert readout["mark"]["type"] == "text"
    assert "vllm_refuses" in json.dumps(readout["transform"])  # a refused pair is named, not given numbers
    assert [layer["mark"]["type"] for layer in top["layer"]] == ["point", "line", "point", "point", "point"]
    assert [layer["mark"]["type"] for layer in bottom["layer"]] == ["point", "point", "point", "point"]  # no frontier
    for panel in (top, bottom):  # refused pairs were never run: they have no operating point
        assert {"filter": "!datum.vllm_refuses"} in panel["layer"][0]["transform"]
    assert [layer["mark"]["type"] for layer in grid["layer"]] == ["point", "point", "point", "point"]
    dots = grid["layer"][0]["encoding"]
    assert dots["x"]["field"] == "max_num_batched_tokens" and dots["y"]["field"] == "max_num_seqs"
    assert dots["shape"]["field"] == "kind" and "datum.frontier" in json.dumps(dots["color"])
    grid_filter = json.dumps(grid["layer"][0]["transform"])
    assert "rate_req_s" in grid_filter and "vllm_refuses" not in grid_filter  # every pair of the selected rate
    assert top["layer"][0]["encoding"]["y"]["scale"]["type"] == "log"
    assert top["layer"][0]["encoding"]["y"]["title"] == "p99 ttft (ms)"
    assert "p99_itl_ms" in json.dumps(bottom["layer"][0]["transform"])
    assert top["layer"][0]["encoding"]["x"]["title"] == "output throughput (tok/s)"
    assert {"filter": "datum.frontier"} in top["layer"][1]["transform"]
    highlight = json.dumps(top["layer"][4]["transform"])
    assert all(name in highlight for name in ("log2_seqs", "log2_tokens", "rate_req_s"))
    shapes = top["layer"][0]["encoding"]["shape"]["scale"]
    assert shapes["domain"] == list(chapter.TWO_KNOB_KINDS) and "cross" in shapes["range"]


def test_two_knobs_chart_clamps_the_ttft_axis_and_marks_what_lies_beyond(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS, y_domain=[32.0, 50.0]).to_dict()
    _, top, bottom, _ = spec["vconcat"]
    y = top["layer"][0]["encoding"]["y"]
    assert y["scale"] == {"type": "log", "domain": [32.0, 50.0], "nice": False}
    assert y["axis"]["values"] == [50]
    calc = {c["as"]: c["calculate"] for c in top["layer"][0]["transform"] if "calculate" in c}
    assert calc["y_shown"] == "clamp(datum['p99_ttft_ms'], 32.0, 50.0)"  # drawn on the edge, not dropped
    assert "triangle-up" in json.dumps(top["layer"][0]["encoding"]["shape"]["scale"]["range"])
    shape = top["layer"][0]["encoding"]["shape"]
    kinds = dict(zip(shape["scale"]["domain"], shape["scale"]["range"]))
    assert shape["field"] == "kind_shown" and kinds[chapter.OFF_AXIS_KINDS["above"][0]] == "triangle-up"
    assert kinds[chapter.OFF_AXIS_KINDS["below"][0]] == "triangle-down"  # the fixture has TTFTs below 32 and above 50
    tips = {t["field"] for t in top["layer"][0]["encoding"]["tooltip"]}
    assert "p99_ttft_ms" in tips and "y_shown" not in tips  # the tooltip reads the true value
    rows = max(spec["datasets"].values(), key=len)
    assert len(rows) == len(df) and max(r["p99_ttft_ms"] for r in rows) > 50  # no run dropped
    assert "domain" not in bottom["layer"][0]["encoding"]["y"]["scale"]  # the ITL panel is not clamped
    whole = chapter.two_knobs_chart(df, DEFAULTS).to_dict()["vconcat"][1]["layer"][0]["encoding"]
    assert whole["shape"]["scale"]["domain"] == list(chapter.TWO_KNOB_KINDS)  # nothing off the axis: no legend entry


def test_ttft_axis_carries_the_frontier_and_the_default_below_capacity():
    df = pd.DataFrame({"rate_req_s": [1.0, 1.0, 1.0, 9.0], "max_num_seqs": [8, 16, 32, 32],
                       "max_num_batched_tokens": [512, 512, 2048, 2048], "frontier": [True, False, False, True],
                       "p99_ttft_ms": [236.0, 5000.0, 422.0, 90000.0]})
    # the frontier (236) and the default (422) below capacity; not the dominated run, not the overloaded one
    assert chapter.ttft_axis(df, {"max_num_seqs": 32, "max_num_batched_tokens": 2048}, 5.0) == [150.0, 700.0]


def test_carrying_domain_rounds_outward():
    assert chapter.carrying_domain([236.0, 422.0]) == [150.0, 700.0]  # 157 -> 150, 633 -> 700
    assert chapter.carrying_domain([100.0], pad=1.0) == [100.0, 100.0]
    assert chapter.carrying_domain([0.0, 12.0, np.nan, 30.0], pad=2.0) == [5.0, 70.0]
    with pytest.raises(ValueError):
        chapter.carrying_domain([np.nan])


def test_two_knobs_chart_rate_colours_are_distinct_okabe_ito(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS).to_dict()
    colour = spec["vconcat"][1]["layer"][0]["encoding"]["color"]
    assert colour["field"] == "rate_req_s"
    first4 = colour["scale"]["range"][:4]
    assert set(first4) <= set(bl.viz.PALETTE) and len(set(first4)) == 4
    assert chapter.HIGHLIGHT not in colour["scale"]["range"]
    for a, b in [("#56B4E9", "#0072B2"), ("#E69F00", "#D55E00")]:  # the two near-identical pairs
        assert not {a, b} <= set(first4)


def test_two_knobs_chart_refused_pair_is_a_cross_with_a_short_readout(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS).to_dict()
    readout, _, _, grid = spec["vconcat"]
    for layer in grid["layer"]:
        scale = layer["encoding"]["shape"]["scale"]
        assert dict(zip(scale["domain"], scale["range"]))["refused by vLLM"] == "cross"
        assert layer["encoding"]["shape"]["field"] == "kind"  # the chosen pair too: a green cross, not a circle
    label = readout["transform"][-1]["calculate"]
    refusal = label.split("? '")[1].split("'")[0]
    assert refusal.startswith("refused by vLLM") and len(refusal) < 50  # fits the chart's width
    rows = max(spec["datasets"].values(), key=len)
    assert {r["kind"] for r in rows if r["vllm_refuses"]} == {"refused by vLLM"}


def test_two_knobs_chart_trail_of_visited_configurations(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS).to_dict()
    params = {p["name"]: p for p in spec["params"]}
    trail = params["visited"]["select"]
    assert trail["type"] == "point" and trail["toggle"] == "true" and trail["clear"] is False
    assert trail["fields"] == ["log2_seqs", "log2_tokens", "rate_req_s"]
    push = params["visited_push"]["expr"]  # every change of the buttons inserts the picked configuration
    assert push.startswith("modify('visited_store'") and "values: [log2_seqs, log2_tokens, rate_req_s]" in push
    _, top, bottom, grid = spec["vconcat"]
    for panel in (top, bottom, grid):
        faded = [layer for layer in panel["layer"]
                 if {"filter": {"param": "visited", "empty": False}} in layer.get("transform", [])]
        assert len(faded) == 1 and faded[0]["mark"]["filled"] is False and faded[0]["mark"]["opacity"] < 1
        assert faded[0]["mark"]["color"] == chapter.HIGHLIGHT


def test_two_knobs_chart_data(df):
    spec = chapter.two_knobs_chart(df, DEFAULTS, offline_tokens=16384).to_dict()
    datasets = list(spec["datasets"].values())
    points = max(datasets, key=len)
    assert len(points) == len(df)  # the whole grid is in the page
    kinds = [row["kind"] for row in points]
    assert kinds.count("refused by vLLM") == int(df["vllm_refuses"].sum()) == 2  # 4096 sequences, 2048 tokens
    marks = [d for d in datasets if d is not points][0]
    assert sorted(row["kind"] for row in marks) == ["vLLM offline default"] * 2 + ["vLLM serve default"] * 2
    assert {(row["max_num_seqs"], row["max_num_batched_tokens"]) for row in marks} == {(1024, 8192), (1024, 16384)}
    assert {row["log2_seqs"] for row in points} == {10, 11, 12}
    without = chapter.two_knobs_chart(df, DEFAULTS).to_dict()
    assert sum(len(d) for d in without["datasets"].values()) == len(df) + 2  # serve default only, per rate
    titles = [t for t in walk(spec, "title") if isinstance(t, str)]
    assert all(t == t.lower() for t in titles if t not in ("request rate (req/s)",))
    assert np.isclose(params_value(spec, "rate_req_s"), 5.0)


def test_tables_read_in_units():
    assert [chapter.format_ms(v) for v in (412.4, 1286.0, 468317.0, np.nan)] == ["412 ms", "1.3 s", "468 s",
                                                                               "refused"]
    df = pd.DataFrame({"rate_req_s": [19.8] * 3, "max_num_seqs": [8, 8, 1024],
                       "max_num_batched_tokens": [512, 1024, 512], "p99_ttft_ms": [468317.0, 422.0, np.nan]})
    html = chapter.ttft_grid_table(df, 19.8).to_html()
    assert "468 s" in html and "422 ms" in html and "refused" in html and "468317" not in html
    assert "1,024" in html and "max_num_seqs (sequences)" in html
    runs = chapter.runs_table(df, {"rate_req_s": "rate (req/s)", "max_num_seqs": "max_num_seqs",
                                   "p99_ttft_ms": "p99 TTFT"}).to_html()
    assert "19.8" in runs and "p99 TTFT" in runs and "468 s" in runs
    gpus = chapter.vllm_defaults_style(chapter.vllm_defaults_table(["a100-80gb"]).set_index("gpu")).to_html()
    assert "HBM (GiB)" in gpus and "2,048" in gpus and "hbm_gib" not in gpus
    assert "A100 80GB" in gpus and ">index<" not in gpus and ">gpu<" not in gpus  # the page's names, no stray index


def params_value(spec, name):
    return next(p["value"] for p in spec["params"] if p["name"] == name)


def test_uneven_knob_grid_gets_buttons_on_its_values(df):
    uneven = df.replace({"max_num_seqs": {4096: 8192}})  # log2 10, 11, 13: a slider would stop on a missing value
    params = {p["name"]: p for p in chapter.two_knobs_chart(uneven, DEFAULTS).to_dict()["params"]}
    assert params["log2_seqs"]["bind"]["options"] == [10.0, 11.0, 13.0]
    assert params["log2_seqs"]["bind"]["labels"] == ["1,024", "2,048", "8,192"]
    assert params["rate_req_s"]["bind"]["input"] == "radio"  # even two evenly spaced rates stay named choices
