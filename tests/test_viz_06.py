"""Notebook 06's chart: the chunking trade-off with a budget slider and a chunking checkbox."""
from __future__ import annotations

import numpy as np
import pytest

from batchlab import experiments, viz
from spec_helpers import marks, walk

SMALL = dict(n_decoders=16, decoder_context=512, prompt_tokens=2000, decoder_prompt_tokens=32)


@pytest.fixture(scope="module")
def frames(cost8b):
    points, timeline = experiments.chunk_budget_sweep(cost8b, [256, 512, 1024, 2048], unchunked_budget=4096, **SMALL)
    chunked = points[points["config"] == "chunked"]
    fit = experiments.fit_chunk_hyperbola(chunked["itl_max_s"], chunked["ttft_s"], SMALL["prompt_tokens"])
    return points, timeline, fit.curve(chunked["itl_max_s"].min(), chunked["itl_max_s"].max())


def test_chunking_chart_params_bind_a_budget_slider_and_a_checkbox(frames):
    spec = viz.chunking_chart(*frames, value=1024).to_dict()
    params = {p["name"]: p for p in spec["params"]}
    assert params["log2_budget"]["bind"] == {"input": "range", "min": 8.0, "max": 11.0, "step": 1.0,
                                             "name": "max_num_batched_tokens = 2^"}
    assert params["log2_budget"]["value"] == 10.0
    assert params["chunking"]["bind"]["input"] == "checkbox" and params["chunking"]["value"] is True
    assert "title" not in spec and len(spec["vconcat"]) == 2


def test_chunking_chart_layers_and_encodings(frames):
    spec = viz.chunking_chart(*frames).to_dict()
    left, right = spec["vconcat"]
    assert {"line", "point", "text"} <= marks(left) and {"bar", "rule", "text"} <= marks(right)
    x, y = left["layer"][1]["encoding"]["x"], left["layer"][1]["encoding"]["y"]
    assert (x["field"], y["field"]) == ("ttft_ms", "itl_ms") and x["scale"]["type"] == y["scale"]["type"] == "log"
    assert x["title"] == "newcomer's time to first token (ms)"
    bars = right["layer"][0]["encoding"]
    assert bars["x"]["field"] == "time_s" and bars["y"]["field"] == "itl_ms"
    # The ring, the bars, the first-token rule and its label follow both controls.
    chosen = [f for f in walk(spec, "filter") if isinstance(f, str) and f.startswith("chunking ?")]
    assert len(chosen) == 4 and all("log2_budget" in f and "unchunked" in f for f in chosen)
    titles = [e[c]["title"] for e in walk(spec, "encoding") for c in ("x", "y")
              if c in e and isinstance(e[c], dict) and isinstance(e[c].get("title"), str)]
    assert titles and all(t == t.lower() for t in titles)


def test_chunking_chart_data_in_seconds_shown_in_ms(frames):
    points, timeline, curve = frames
    spec = viz.chunking_chart(points, timeline, curve).to_dict()
    calcs = [c["calculate"] for c in walk(spec, "transform") for c in (c if isinstance(c, list) else [c])
             if isinstance(c, dict) and "calculate" in c]
    assert "datum.itl_max_s * 1000" in calcs and "datum.itl_s * 1000" in calcs
    assert np.isclose(timeline["itl_s"].max(), points["itl_max_s"].max())


def test_log_ticks_span_the_data_in_1_2_3_5_steps():
    assert viz.log_ticks([212.6, 1221.8]) == [200, 300, 500, 1000]
    assert viz.log_ticks([19.7, 212.6]) == [20, 30, 50, 100, 200, 300]  # a tick past the data is not drawn
    assert viz.log_ticks([3.3e13, 9.9e14], scale=1e-12) == [30, 50, 100, 200, 300, 500, 1000]
    assert viz.log_ticks([0.05, 0.2]) == [0.05, 0.1, 0.2, 0.3]
