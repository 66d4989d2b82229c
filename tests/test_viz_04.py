"""Notebook 04's chart: one panel per GPU, a context slider over the grid's index, knees drawn where
CostModel.knee says."""
from __future__ import annotations

import numpy as np
import pytest

import batchlab as bl
from batchlab import experiments, viz
from test_viz import axis_titles, marks, walk

CONTEXTS = [0, 512, 1024, 2048, 4096, 8192, 16384]


@pytest.fixture(scope="module")
def frames():
    cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))
    return experiments.step_time_grid(cost, [1, 4, 16, 64, 256, 1024, 2048], CONTEXTS)


def test_step_time_roofline_chart(frames):
    spec = viz.step_time_roofline_chart(*frames).to_dict()
    assert "title" not in spec and len(spec["hconcat"]) == 2
    (param,) = spec["params"]
    assert param["name"] == "context_step"
    assert param["bind"]["input"] == "range" and (param["bind"]["min"], param["bind"]["max"]) == (0.0, 6.0)
    assert param["bind"]["step"] == 1.0
    assert marks(spec) == {"line", "rule", "point", "text"}
    filters = [f for f in walk(spec, "filter") if isinstance(f, str)]
    assert sum("context_index" in f and "context_step" in f for f in filters) == 2 * 6  # six layers a panel
    for panel in spec["hconcat"]:
        line = panel["layer"][0]["encoding"]
        assert line["x"]["scale"]["type"] == "log" and line["y"]["scale"]["type"] == "log"
        assert line["x"]["field"] == "batch" and line["y"]["field"] == "step_time_ms"
        assert line["color"]["field"] == "cost"
        assert {lyr["encoding"]["x"]["field"] for lyr in panel["layer"][2:5]} == {"knee"}
    titles = set(axis_titles(spec))
    assert titles == {"batch size (sequences)", "step time (ms)"} and all(t == t.lower() for t in titles)


def test_drawn_knees_are_the_cost_models(frames):
    curves, knees = frames
    spec = viz.step_time_roofline_chart(curves, knees).to_dict()
    rows = [r for d in spec["datasets"].values() for r in d if "knee" in r]
    assert len(rows) == len(knees)
    drawn = {(r["hardware"], r["cost"], r["context"]): r["knee"] for r in rows}
    for r in knees.itertuples():
        assert drawn[r.hardware, r.cost, r.context] == r.knee
    ms = [r["step_time_ms"] for d in spec["datasets"].values() for r in d if "batch" in r]
    assert np.allclose(sorted(ms), sorted(curves["step_time_s"] * 1e3))


def test_uneven_grid_gets_a_select_and_one_context_nothing_to_choose(frames):
    curves, knees = frames
    some = knees["context"].isin([0, 1024, 16384])
    spec = viz.step_time_roofline_chart(curves[curves["context"].isin([0, 1024, 16384])], knees[some]).to_dict()
    assert spec["params"][0]["bind"]["input"] == "select"  # indices 0, 2, 6 are not evenly spaced
    one = curves[(curves["hardware"] == "h200") & (curves["context"] == 4096)]
    spec = viz.step_time_roofline_chart(one, knees[(knees["hardware"] == "h200") & (knees["context"] == 4096)]).to_dict()
    assert len(spec["hconcat"]) == 1 and "bind" not in spec["params"][0]  # a live explore cell's single context
    assert spec["params"][0]["value"] == 4.0
