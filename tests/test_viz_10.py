"""Notebook 10's chart builders: the parity chart (select over sets, before/after panels, log axes, y = x and the
target band) and the end-to-end chart beside the published vLLM figures."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from batchlab import experiments, viz
from spec_helpers import marks, walk


@pytest.fixture(scope="module")
def sample():
    rows = []
    for name, scale in (("set_a", 1.0), ("set_b", 100.0)):
        for stage, bias in (("before", 0.5), ("after", 1.1)):
            measured = scale * np.array([0.01, 0.1, 1.0])
            rows.append(pd.DataFrame({"case_id": [0, 1, 2], "set": name, "group": ["fit", "ridge", "held out"],
                                      "stage": stage, "case": ["tokens 1", "tokens 10", "tokens 100"],
                                      "measured_ms": measured, "predicted_ms": measured * bias,
                                      "rel_err": abs(bias - 1.0)}))
    return pd.concat(rows, ignore_index=True)


def test_parity_frame_lines_span_each_set(sample):
    frame = viz.parity_frame(sample, band=0.15)
    lines = frame[frame["kind"] != "case"]
    assert set(lines["kind"]) == {"y = x", "±15%"}
    assert len(lines) == 2 * 2 * 3 * 2  # sets x stages x lines x two ends
    diag = lines[lines["kind"] == "y = x"]
    assert (diag["measured_ms"] == diag["predicted_ms"]).all()
    b = frame[(frame["set"] == "set_b") & (frame["kind"] != "case")]
    assert b["measured_ms"].min() <= 0.5 and b["measured_ms"].max() >= 110  # covers predicted and measured
    assert set(frame["panel"]) == set(viz.STAGE_LABELS.values()) and "stage" not in frame


def test_parity_chart_spec(sample):
    spec = viz.parity_chart(sample, value="set_b").to_dict()
    (param,) = spec["params"]
    assert param["name"] == "measured_set" and param["value"] == "set_b"
    assert param["bind"]["input"] == "select" and param["bind"]["options"] == ["set_a", "set_b"]
    assert spec["facet"]["column"]["field"] == "panel"
    assert spec["facet"]["column"]["sort"] == list(viz.STAGE_LABELS.values())
    assert marks(spec) == {"circle", "line"}
    enc = [e for e in walk(spec, "encoding") if "x" in e]
    assert all(e["x"]["scale"]["type"] == "log" and e["y"]["scale"]["type"] == "log" for e in enc)
    assert {e["x"]["title"] for e in enc} == {"measured time (ms)"} and {e["y"]["title"] for e in enc} == {"predicted time (ms)"}
    filters = list(walk(spec, "filter"))
    assert all("measured_set" in f for f in filters if "datum.set" in f) and len(filters) >= 4
    points = next(e for e in enc if "color" in e)
    assert points["color"]["field"] == "group" and points["color"]["scale"]["domain"] == list(viz.GROUP_COLORS)
    assert "title" not in spec


def test_log_axis_labels_one_two_five_per_decade(sample):
    import vl_convert  # evaluates the label expression the way the page does
    values = [0.0002, 0.0003, 0.002, 0.05, 0.07, 1.0, 3.0, 20.0, 500.0]
    spec = {"$schema": "https://vega.github.io/schema/vega-lite/v6.json", "data": {"values": [{"v": v} for v in values]},
            "mark": "text", "encoding": {"text": {"field": "label"}, "y": {"field": "v", "type": "ordinal", "axis": None}},
            "transform": [{"calculate": viz.LOG125_LABEL.replace("datum.value", "datum.v"), "as": "label"}]}
    texts = re.findall(r">([^<>]+)</text>", vl_convert.vegalite_to_svg(spec))
    assert sorted(texts) == sorted(["2e-4", "0.002", "0.05", "1", "20", "500"])  # 3e-4, 0.07 and 3 get no label
    spec = viz.parity_chart(sample).to_dict()
    axes = [e[c]["axis"] for e in walk(spec, "encoding") for c in ("x", "y") if c in e]
    assert all(a["labelExpr"] == viz.LOG125_LABEL and a["labelOverlap"] == "greedy" for a in axes)


def test_published_chart_spec():
    runs = pd.DataFrame({"rate": [np.inf, 2.0, 32.0] * 2, "lengths": ["blog"] * 3 + ["trace"] * 3,
                         "mean_ttft_ms": [900.0, 12, 16, 900.0, 13, 20], "mean_tpot_ms": [28.0, 7, 8.5, 28.0, 7, 9.7]})
    spec = viz.published_chart(runs, experiments.PUBLISHED_VLLM_V060).to_dict()
    assert len(spec["hconcat"]) == 2
    assert {"line", "point", "text"} <= marks(spec)
    ys = [layer["encoding"]["y"]["field"] for panel in spec["hconcat"] for layer in panel["layer"]]
    assert set(ys) == {"mean_ttft_ms", "mean_tpot_ms"}
    datasets = spec["datasets"].values()
    assert not any(np.isinf(row.get("rate", 0)) for data in datasets for row in data)  # the offline run is not drawn
    assert any(row.get("mean_tpot_ms") == 13.4 and row.get("rate") == 32.0 for data in datasets for row in data)
    legend = next(e["color"] for e in walk(spec, "encoding") if "color" in e)
    assert "202" in legend["legend"]["labelExpr"]  # the blog's means, from the published figures


def test_parity_frame_leaves_out_cases_predicted_at_zero(sample):
    zero = sample.copy()
    zero.loc[(zero["set"] == "set_a") & (zero["stage"] == "before"), "predicted_ms"] = 0.0
    frame = viz.parity_frame(zero)
    assert (frame["predicted_ms"] > 0).all() and (frame["measured_ms"] > 0).all()  # drawable on log axes
    kept = frame[(frame["set"] == "set_a") & (frame["kind"] == "case")]
    assert set(kept["panel"]) == {viz.STAGE_LABELS["after"]}
