"""Chapter 01 (static batching): the padding sweep's invariants and closed forms, and its chart's spec."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from spec_helpers import axis_titles, marks, walk

import batchlab as bl
from batchlab.chapters import facts
from batchlab.chapters import static_batching as chapter


@pytest.fixture(scope="module")
def sweep(cost8b):
    return chapter.static_padding_sweep(cost8b, [0.0, 0.5, 1.0], n_requests=64, batch_size=8, seed=0)


def test_first_batch_rows_pad_to_the_longest():
    req = pd.DataFrame({"release_s": [5.0, 5.0, 5.0, 9.0], "output_tokens": [30, 10, 20, 99]})
    rows = chapter.first_batch_rows(req).pivot(index="row", columns="kind", values="tokens")
    assert rows["generated"].tolist() == [10, 20, 30]
    assert (rows["generated"] + rows["padding"]).tolist() == [30, 30, 30]


def test_static_padding_sweep_zero_at_zero_variance_and_rising(cost8b):
    summary, batches = chapter.static_padding_sweep(cost8b, [0.0, 0.5, 1.0, 2.0], n_requests=128, batch_size=16)
    assert summary.loc[0, ["padding_fraction", "half_empty_fraction", "padded_tokens"]].tolist() == [0, 0, 0]
    assert (np.diff(summary["padding_fraction"]) > 0).all()
    assert (np.diff(summary["half_empty_fraction"]) > 0).all()
    assert set(batches["output_cv"]) == {0.0, 0.5, 1.0, 2.0}
    assert batches.groupby("output_cv")["row"].nunique().tolist() == [16] * 4
    # The batch panel's padding is the per-request padded_tokens of the first batch (equal prompts).
    res = bl.simulate(bl.synthetic(128, 512, 256, prompt_cv=0.0, output_cv=1.0, seed=0), "static", cost8b,
                      batch_size=16)
    first = res.requests.iloc[:16]
    shown = batches[(batches["output_cv"] == 1.0) & (batches["kind"] == "padding")]["tokens"].sum()
    assert shown == first["padded_tokens"].sum()
    assert summary.loc[2, "padding_fraction"] == res.summary()["padding_fraction"]


def test_padding_chart(sweep):
    summary, batches = sweep
    spec = chapter.padding_chart(summary, batches).to_dict()  # validates against the Vega-Lite schema
    assert len(spec["hconcat"]) == 2 and "title" not in spec
    (param,) = spec["params"]
    assert param["name"] == "cv" and param["bind"] == {"input": "range", "min": 0.0, "max": 1.0, "step": 0.5,
                                                       "name": "output-length CV"}
    assert param["value"] == chapter.CV_SHOWN == 1.0  # the slider starts where the text reads
    assert {"line", "point", "text", "bar"} <= marks(spec)
    filters = [f for f in walk(spec, "filter") if isinstance(f, str)]
    # marker, the two readout lines and the batch panel follow the slider
    assert sum(" cv)" in f for f in filters) == 4
    assert set(axis_titles(spec)) >= {"share wasted (%)", "output-length coefficient of variation"}
    assert all(t == t.lower() for t in axis_titles(spec))
    bars = spec["hconcat"][1]
    assert bars["encoding"]["x"]["field"] == "tokens" and bars["encoding"]["color"]["field"] == "kind"
    # Every mark a reader can point at answers with titled fields; the readout is in words with a percentage.
    curves = spec["hconcat"][0]["layer"]
    hoverable = [layer for layer in curves if "tooltip" in layer.get("encoding", {})] + [bars]
    assert len(hoverable) == 3  # the grid's points, the selected markers, the batch's bars
    for layer in hoverable:
        assert all(t.get("title") for t in layer["encoding"]["tooltip"])
    calcs = [c for layer in curves for t in layer.get("transform", []) if (c := t.get("calculate"))]
    assert calcs == ["datum.measure + ': ' + format(datum.share, '.0%')"] * 2


def test_padding_chart_starts_at_the_grid_value_nearest_the_one_asked(sweep):
    spec = chapter.padding_chart(*sweep, value=0.3).to_dict()
    assert spec["params"][0]["value"] == 0.5


def test_the_facts_are_the_pages_sweep_at_cv1(cost8b):
    # Same seed at every CV (common random numbers): a one-CV sweep of the chapter's stream gives the facts.
    one, _ = chapter.static_padding_sweep(cost8b, [1.0], **chapter.PADDING_STREAM)
    assert facts.value("pad_cv1") == one.loc[0, "padding_fraction"]
    assert facts.value("half_empty_cv1") == one.loc[0, "half_empty_fraction"]
    assert 1.0 in chapter.CV_GRID and np.allclose(np.diff(chapter.CV_GRID), 0.05)
    assert facts.get("pad_cv1").chapter == "static_batching" and facts.rendered("pad_cv1").endswith("%")


def test_padding_chart_without_batch_panel(sweep):
    spec = chapter.padding_chart(sweep[0]).to_dict()
    assert "layer" in spec and spec["params"][0]["name"] == "cv"


def test_page_tables_have_units_in_headers(sweep, cost8b):
    summary, _ = sweep
    table = chapter.sweep_table(summary)
    assert list(table.data.columns) == ["output-length CV", "padded token slots", "batch time half empty",
                                        "longest output (tokens)", "run time (s)", "output throughput (tok/s)"]
    assert "%" in table.to_html()
    res = bl.simulate(bl.synthetic(64, 512, 256, prompt_cv=0.0, output_cv=1.0, seed=0), "static", cost8b,
                      batch_size=8)
    first = chapter.first_batch_table(res.requests, 8, n=5)
    assert len(first.data) == 5 and first.data["request"].tolist() == [0, 1, 2, 3, 4]
    assert first.data["slot released (s)"].nunique() == 1  # the whole batch leaves together
