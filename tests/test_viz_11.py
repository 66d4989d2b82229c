"""Notebook 11's chart builder: the chunking trade-off with a slider over log2 of the token budget."""
from __future__ import annotations

import pandas as pd

from batchlab import viz
from spec_helpers import walk


def test_tradeoff_chart_spec():
    trade = pd.DataFrame({"max_num_batched_tokens": [512, 1024, 2048], "log2_budget": [9.0, 10.0, 11.0],
                          "ttft_ms": [670.0, 400.0, 300.0], "max_itl_ms": [30.0, 41.0, 65.0],
                          "base_itl_ms": [22.0, 22.5, 22.4], "chunks": [23, 10, 5]})
    spec = viz.tradeoff_chart(trade).to_dict()
    (param,) = spec["params"]
    assert param["name"] == "log2_budget" and param["value"] == 11.0
    assert param["bind"] == {"input": "range", "min": 9.0, "max": 11.0, "step": 1.0, "name": "max_num_batched_tokens = 2^"}
    kinds = [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"] for layer in spec["layer"]]
    assert kinds.count("text") == 3 and {"line", "rule", "point"} <= set(kinds)
    filters = [f for f in walk(spec, "filter")]
    assert len(filters) == 2 and all("log2_budget" in f for f in filters)  # ring and readout follow the slider
    line = spec["layer"][0]["encoding"]
    assert line["x"]["field"] == "ttft_ms" and line["y"]["field"] == "max_itl_ms"
    assert line["x"]["title"] == "newcomer's ttft (ms)" and line["y"]["title"] == "tallest decoder gap (ms)"
    rule = next(layer for layer in spec["layer"] if layer["mark"] == "rule" or layer["mark"].get("type") == "rule")
    assert spec["datasets"][rule["data"]["name"]][0]["max_itl_ms"] == 22.4  # the median cadence
