"""Notebook 07's charts: per-step utilisation and roofline, the budget split with its slider, the mixing comparison."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab import experiments, viz
from spec_helpers import marks, titles, walk


@pytest.fixture(scope="module")
def stream():
    return bl.preset("azure-conv-2023", 200, rate_req_s=float("inf"), seed=2)


def test_utilisation_chart(cost8b, stream):
    runs = {"chunked": bl.simulate(stream, "chunked", cost8b, max_num_batched_tokens=2048),
            "v0": bl.simulate(stream, "continuous", cost8b, prefill_only_steps=True)}
    steps = experiments.step_utilisation(runs)
    spec = viz.utilisation_chart(steps, experiments.roofline_ceiling(cost8b, np.geomspace(1, 1e4, 20))).to_dict()
    left, right = spec["vconcat"]
    assert marks(left) == {"circle"} and marks(right) == {"line", "circle"}
    assert left["encoding"]["x"]["field"] == "bandwidth_util" and left["encoding"]["y"]["field"] == "compute_util"
    assert left["encoding"]["color"]["scale"]["domain"] == ["decode", "mixed", "prefill"]
    dots = right["layer"][1]["encoding"]
    assert dots["x"]["scale"]["type"] == "log" and dots["y"]["scale"]["type"] == "log"
    assert "title" not in spec and all(t == t.lower() for t in titles(spec))


def test_budget_split_chart_slider(cost8b, stream):
    split = experiments.budget_split(stream, cost8b, [512, 1024, 2048, 4096])
    spec = viz.budget_split_chart(split, value=2048).to_dict()
    (param,) = spec["params"]
    assert param["name"] == "log2_budget" and param["value"] == 11.0
    assert param["bind"] == {"input": "range", "min": 9.0, "max": 12.0, "step": 1.0,
                             "name": "max_num_batched_tokens = 2^"}
    assert marks(spec) == {"area", "rule", "text"}
    area = spec["layer"][0]["encoding"]
    assert area["y"]["stack"] == "zero" and area["color"]["field"] == "kind"
    assert all("log2_budget" in f for f in walk(spec, "filter") if isinstance(f, str))
    assert all(t == t.lower() for t in titles(spec))


def test_mixing_chart():
    df = pd.DataFrame({"rate": [10.0, 10.0, 20.0, 20.0, np.inf, np.inf], "policy": ["a", "b"] * 3,
                       "output_throughput": [1e3, 1e3, 2e3, 1.9e3, 2.1e3, 2e3], "p99_itl_ms": [50, 90] * 3})
    spec = viz.mixing_chart(df, rate=20.0).to_dict()
    left, right = spec["vconcat"]
    assert marks(spec) == {"line", "rule"}
    assert left["layer"][0]["encoding"]["y"]["field"] == "output_throughput"
    assert right["layer"][0]["encoding"]["y"]["scale"]["type"] == "log"
    data = spec["datasets"]
    assert not any(np.isinf(r["rate"]) for rows in data.values() for r in rows if isinstance(r.get("rate"), float))
    assert all(t == t.lower() for t in titles(spec))
