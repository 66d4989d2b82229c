"""Chart schemas of notebook 02: the queue-delay chart (slider + metric menu) and the load sweep."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab import experiments, viz
from spec_helpers import marks, titles, walk


@pytest.fixture(scope="module")
def cost():
    return bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))


@pytest.fixture(scope="module")
def runs(cost):
    return experiments.policy_grid(cost, "azure-conv-2023", 48, {"high": 6.0, "low": 0.3}, batch_size=8,
                                   delays_s=[0.0, 0.01, 0.02], seed=0)


def test_latency_frame_is_one_row_per_run_and_metric(runs):
    long = viz.latency_frame(runs)
    assert len(long) == 4 * len(runs)
    assert set(long["metric"]) == set(viz.LATENCY_LABELS.values())
    p99 = long[(long["metric"] == "p99 e2el")]["latency_s"].to_numpy()
    assert np.allclose(p99, runs["p99_e2el_ms"].to_numpy() / 1e3)
    assert sorted(long["max_queue_delay_ms"].dropna().unique()) == pytest.approx([0.0, 10.0, 20.0])


def test_queue_delay_chart(runs):
    spec = viz.queue_delay_chart(runs).to_dict()
    assert "title" not in spec
    facet = spec["facet"]["column"]
    assert facet["field"] == "load" and facet["sort"] == ["low", "high"]  # panels ordered by rate
    assert spec["resolve"]["scale"]["y"] == "independent"
    params = {p["name"]: p for p in spec["params"]}
    assert params["delay"]["bind"] == {"input": "range", "min": 0.0, "max": 20.0, "step": 10.0,
                                       "name": "max queue delay (ms)"}
    assert params["metric"]["bind"]["input"] == "select"
    assert params["metric"]["bind"]["options"] == list(viz.LATENCY_LABELS.values())
    assert marks(spec) == {"line", "rule", "text", "point"}
    filters = [f for f in walk(spec, "filter") if isinstance(f, str)]
    assert all(any("metric" in f for f in layer_filters(layer)) for layer in spec["spec"]["layer"])
    assert sum("delay)" in f for f in filters) == 3  # the ring and its label (two alignments) follow the slider
    y = spec["spec"]["layer"][0]["encoding"]["y"]
    assert y["scale"]["type"] == "log" and y["title"] == "latency (s)"
    assert all(t == t.lower() for t in titles(spec)) and "max queue delay (ms)" in titles(spec)
    colors = spec["spec"]["layer"][0]["encoding"]["color"]["scale"]
    assert colors["domain"] == ["static", "dynamic", "continuous", "chunked"]


def layer_filters(layer):
    return [t["filter"] for t in layer.get("transform", []) if isinstance(t.get("filter"), str)]


def test_load_sweep_chart(cost):
    sweep = experiments.policy_grid(cost, "azure-conv-2023", 48, [0.3, 1.0, 3.0], batch_size=8, delays_s=[0.05],
                                    iteration=("continuous",))
    caps = pd.DataFrame({"rate_req_s": [2.0, 20.0], "label": ["lockstep saturation", "iteration-level saturation"]})
    spec = viz.load_sweep_chart(sweep, caps).to_dict()
    assert marks(spec) == {"line", "rule", "text"} and "title" not in spec
    line = spec["layer"][0]["encoding"]
    assert line["x"]["scale"]["type"] == "log" and line["y"]["scale"]["type"] == "log"
    assert line["y"]["title"] == "mean e2el (s)" and line["x"]["title"] == "offered load (req/s)"
    assert spec["layer"][1]["encoding"]["x"]["field"] == "rate_req_s"
    p99 = viz.load_sweep_chart(sweep, caps, metric="p99_ttft_ms").to_dict()
    assert p99["layer"][0]["encoding"]["y"]["title"] == "p99 ttft (s)"
