"""Chart schemas of notebook 03: the Gantt chart with a request slider and last-end rule, and occupancy panels."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab import experiments, viz
from spec_helpers import marks, walk


@pytest.fixture(scope="module")
def runs():
    cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))
    return experiments.timeline_runs(cost, bl.preset("azure-conv-2023", 12, rate_req_s=4.0, seed=0), slots=4)


@pytest.fixture(scope="module")
def gantt(runs):
    return pd.concat([viz.gantt_frame(r) for r in runs.values()], ignore_index=True)


def test_gantt_chart_with_highlight_and_last_end(gantt):
    spec = viz.gantt_chart(gantt, highlight=True, last_end=True).to_dict()
    assert "title" not in spec
    assert spec["facet"]["row"]["field"] == "policy"
    assert spec["facet"]["row"]["sort"] == ["static", "dynamic", "continuous"]  # the order the runs came in
    (param,) = spec["params"]
    assert param["name"] == "request" and param["value"] == -1
    assert param["bind"] == {"input": "range", "min": -1.0, "max": 11.0, "step": 1.0,
                             "name": "highlight request (-1: none)"}
    bars, rule, text = spec["spec"]["layer"]
    assert bars["mark"]["type"] == "bar" and bars["encoding"]["x2"]["field"] == "end_s"
    assert bars["encoding"]["color"]["scale"]["domain"] == list(viz.PHASES)
    assert "datum.request == request" in bars["encoding"]["opacity"]["condition"][0]["test"]
    assert rule["mark"]["type"] == "rule" and rule["encoding"]["x"]["field"] == "last_s"
    assert rule["transform"][0]["aggregate"][0] == {"op": "max", "field": "end_s", "as": "last_s"}
    assert text["mark"]["type"] == "text" and text["encoding"]["text"]["field"] == "label"


def test_gantt_chart_options_apart_and_default_unchanged(gantt):
    assert "params" not in viz.gantt_chart(gantt, last_end=True).to_dict()
    only = viz.gantt_chart(gantt, highlight=True).to_dict()
    assert marks(only) == {"bar"} and only["params"][0]["name"] == "request"
    plain = viz.gantt_chart(gantt).to_dict()  # the original builder: bars faceted, nothing else
    assert marks(plain) == {"bar"} and "params" not in plain and "layer" not in plain["spec"]
    bare = viz.gantt_chart(gantt.drop(columns="policy"), highlight=True, last_end=True).to_dict()
    assert "facet" not in bare and {"bar", "rule", "text"} == marks(bare)


def test_occupancy_frame_steps_and_idle_zeros(runs):
    res = runs["static"]
    df = viz.occupancy_frame(res)
    assert set(df["measure"]) == {"slots held", "rows generating"} and (df["policy"] == "static").all()
    wide = df.pivot(index="time_s", columns="measure", values="rows")
    assert (wide["rows generating"] <= wide["slots held"]).all()
    # Static waits for its fourth request: nothing held before the first dispatch, zero again at the end.
    first = res.steps["start_s"].iloc[0]
    assert wide.index[0] == first and wide.iloc[-1].tolist() == [0, 0]
    assert wide.index[-1] == pytest.approx((res.steps["start_s"] + res.steps["duration_s"]).iloc[-1])
    # Between lockstep batches with a gap, the frame drops to zero.
    end = (res.steps["start_s"] + res.steps["duration_s"]).to_numpy()
    gaps = end[:-1][res.steps["start_s"].to_numpy()[1:] > end[:-1]]
    for t in gaps:
        assert wide.loc[t, "slots held"] == 0
    # The step function reproduces the slot-time of the run.
    held = wide["slots held"].to_numpy()
    assert np.sum(held[:-1] * np.diff(wide.index.to_numpy())) == pytest.approx(
        float((res.steps["running"] * res.steps["duration_s"]).sum()))


def test_occupancy_panels_chart(runs):
    df = pd.concat([viz.occupancy_frame(r) for r in runs.values()], ignore_index=True)
    spec = viz.occupancy_panels_chart(df).to_dict()
    assert spec["facet"]["row"]["field"] == "policy" and "title" not in spec
    area, line = spec["spec"]["layer"]
    assert area["mark"]["type"] == "area" and line["mark"]["type"] == "line"
    assert area["mark"]["interpolate"] == line["mark"]["interpolate"] == "step-after"
    assert area["encoding"]["y"]["title"] == "sequences" and area["encoding"]["x"]["title"] == "time (s)"
    assert area["encoding"]["color"]["scale"]["domain"] == ["slots held", "rows generating"]
