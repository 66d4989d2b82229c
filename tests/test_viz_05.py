"""Notebook 05's chart: a timeline and a TTFT panel that two select boxes filter together."""
from __future__ import annotations

import pytest

import batchlab as bl
from batchlab import experiments, viz
from test_viz import axis_titles, marks, walk


@pytest.fixture(scope="module")
def frames():
    h100 = bl.get_hardware("h100-sxm")
    scen = {"8b": (bl.CostModel(h100, bl.get_model("llama-3-8b")), 8),
            "70b": (bl.CostModel(h100, bl.get_model("llama-3-70b"), dtype="fp8"), 2)}
    return experiments.spike_scenarios(scen, context=512, newcomer_tokens=2000, n_behind=2, tail_steps=5)


def test_spike_chart(frames):
    itl, behind, _, _ = frames
    spec = viz.spike_chart(itl, behind, 400, "the article's 400 ms").to_dict()
    assert "title" not in spec and len(spec["vconcat"]) == 2
    params = {p["name"]: p for p in spec["params"]}
    assert set(params) == {"model", "order"}
    assert params["model"]["bind"] == {"input": "select", "options": ["8b", "70b"], "name": "model"}
    assert params["order"]["bind"]["options"] == list(experiments.SPIKE_ORDERS)
    assert params["model"]["value"] == "8b"
    picks = [f for f in walk(spec, "filter") if isinstance(f, str) and "== model" in f]
    assert len(picks) == 3 and all("== order" in f for f in picks)  # dots, spike label, ttft panel
    assert {"circle", "text", "rule", "line"} <= marks(spec)
    timeline, ttft = spec["vconcat"]
    dots = timeline["layer"][0]["encoding"]
    assert dots["x"]["field"] == "time_s" and dots["y"]["field"] == "itl_ms"
    assert ttft["encoding"]["color"]["field"] == "run" and ttft["encoding"]["y"]["field"] == "ttft_ms"
    assert set(axis_titles(spec)) >= {"inter-token latency (ms)", "ttft (ms)"}
    assert all(t == t.lower() for t in axis_titles(spec))
    ref = [r for d in spec["datasets"].values() for r in d if r.get("text") == "the article's 400 ms"]
    assert ref == [{"itl_ms": 400, "text": "the article's 400 ms"}]


def test_spike_label_marks_the_largest_gap(frames):
    itl, behind, _, _ = frames
    spec = viz.spike_chart(itl, behind).to_dict()
    label = spec["vconcat"][0]["layer"][1]
    ops = [t for t in label["transform"] if "joinaggregate" in t or "filter" in t]
    assert ops[-2]["joinaggregate"] == [{"op": "max", "field": "itl_ms", "as": "top"}]
    assert ops[-1]["filter"] == "datum.itl_ms == datum.top"
    assert len(spec["vconcat"][0]["layer"]) == 2  # no reference rule unless asked


def test_choice_param():
    param, pred = viz.choice_param("gpu", ["h100-sxm", "h200"], "GPU", field="hardware")
    d = param.param.to_dict()
    assert d["bind"] == {"input": "select", "options": ["h100-sxm", "h200"], "name": "GPU"} and d["value"] == "h100-sxm"
    assert pred == "datum['hardware'] == gpu"
