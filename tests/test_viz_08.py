"""Notebook 08's chart: its spec has the two knob sliders, the rate selector, the frontier, the default markers
and a highlight filtered by all three controls."""
import json

import numpy as np
import pandas as pd
import pytest

from batchlab import viz
from spec_helpers import walk

DEFAULTS = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}


@pytest.fixture
def df():
    seqs, tokens, rates = [1024, 2048, 4096], [2048, 4096, 8192, 16384], [5.0, 10.0]
    rows = [{"rate": r, "max_num_seqs": s, "max_num_batched_tokens": t, "output_throughput": 100.0 * r + s / 10,
             "p99_ttft_ms": 1e4 / s + t / 100 + r, "p99_itl_ms": t / 100 + 10}
            for r in rates for s in seqs for t in tokens]
    out = pd.DataFrame(rows)
    out["vllm_refuses"] = out["max_num_batched_tokens"] < out["max_num_seqs"]
    out["frontier"] = [i in (8, 17) for i in range(len(out))]
    return out


def test_two_knobs_chart_controls(df):
    spec = viz.two_knobs_chart(df, DEFAULTS, offline_tokens=16384).to_dict()  # validates the schema
    params = {p["name"]: p for p in spec["params"]}
    assert set(params) == {"log2_seqs", "log2_tokens", "rate"}
    assert params["log2_seqs"]["bind"]["input"] == "range" and params["log2_tokens"]["bind"]["input"] == "range"
    assert (params["log2_seqs"]["bind"]["min"], params["log2_seqs"]["bind"]["max"]) == (10.0, 12.0)
    assert params["log2_seqs"]["value"] == 10.0 and params["log2_tokens"]["value"] == 13.0  # vLLM's default
    assert params["rate"]["bind"]["input"] == "radio" and params["rate"]["bind"]["options"] == [5.0, 10.0]
    assert params["rate"]["value"] == 5.0  # the second highest rate


def test_two_knobs_chart_layers(df):
    spec = viz.two_knobs_chart(df, DEFAULTS, offline_tokens=16384).to_dict()
    readout, top, bottom = spec["vconcat"]
    assert readout["mark"]["type"] == "text"
    assert [layer["mark"]["type"] for layer in top["layer"]] == ["point", "line", "point", "point"]
    assert [layer["mark"]["type"] for layer in bottom["layer"]] == ["point", "point", "point"]  # no frontier
    assert top["layer"][0]["encoding"]["y"]["scale"]["type"] == "log"
    assert top["layer"][0]["encoding"]["y"]["title"] == "p99 ttft (ms)"
    assert bottom["layer"][0]["encoding"]["y"]["field"] == "p99_itl_ms"
    assert top["layer"][0]["encoding"]["x"]["title"] == "output throughput (tok/s)"
    assert {"filter": "datum.frontier"} in top["layer"][1]["transform"]
    highlight = json.dumps(top["layer"][3]["transform"])
    assert all(name in highlight for name in ("log2_seqs", "log2_tokens", "rate"))
    shapes = top["layer"][0]["encoding"]["shape"]["scale"]
    assert shapes["domain"] == list(viz.TWO_KNOB_KINDS) and "cross" in shapes["range"]


def test_two_knobs_chart_data(df):
    spec = viz.two_knobs_chart(df, DEFAULTS, offline_tokens=16384).to_dict()
    datasets = list(spec["datasets"].values())
    points = max(datasets, key=len)
    assert len(points) == len(df)  # the whole grid is in the page
    kinds = [row["kind"] for row in points]
    assert kinds.count("refused by vLLM") == int(df["vllm_refuses"].sum()) == 2  # 4096 sequences, 2048 tokens
    marks = [d for d in datasets if d is not points][0]
    assert sorted(row["kind"] for row in marks) == ["vLLM offline default"] * 2 + ["vLLM serve default"] * 2
    assert {(row["max_num_seqs"], row["max_num_batched_tokens"]) for row in marks} == {(1024, 8192), (1024, 16384)}
    assert {row["log2_seqs"] for row in points} == {10, 11, 12}
    without = viz.two_knobs_chart(df, DEFAULTS).to_dict()
    assert sum(len(d) for d in without["datasets"].values()) == len(df) + 2  # serve default only, per rate
    titles = [t for t in walk(spec, "title") if isinstance(t, str)]
    assert all(t == t.lower() for t in titles if t not in ("request rate (req/s)",))
    assert np.isclose(params_value(spec, "rate"), 5.0)


def params_value(spec, name):
    return next(p["value"] for p in spec["params"] if p["name"] == name)


def test_uneven_knob_grid_falls_back_to_a_select(df):
    uneven = df.replace({"max_num_seqs": {4096: 8192}})  # log2 10, 11, 13: a slider would stop on a missing value
    params = {p["name"]: p for p in viz.two_knobs_chart(uneven, DEFAULTS).to_dict()["params"]}
    assert params["log2_seqs"]["bind"]["input"] == "select" and params["log2_tokens"]["bind"]["input"] == "range"
    assert params["rate"]["bind"]["input"] == "radio"  # even two evenly spaced rates stay named choices
