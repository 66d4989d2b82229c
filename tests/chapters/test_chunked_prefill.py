"""Chapter 6 (chunked prefill): the budget sweep over the shared scene, the hyperbola fit, and the chart with
a budget slider and a chunking checkbox, and the facts of the trade."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
from spec_helpers import marks, walk
from batchlab import viz
from batchlab.chapters import chunked_prefill as chapter
from batchlab.chapters import scenes

SMALL = dict(n_decoders=16, context=512, prompt_tokens=2000)
BUDGETS = [256, 512, 1024, 2048]


def test_hyperbola_fit_recovers_alpha_and_t_d_exactly():
    # Points that follow the model exactly: step = t_d + c alpha, ITL = step, TTFT = (N / c) step.
    alpha, t_d, n = 25e-6, 0.018, 8000
    c = np.array([128, 384, 896, 1920, 3968, 8000.0])
    fit = chapter.fit_chunk_hyperbola(t_d + c * alpha, n / c * (t_d + c * alpha), n)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9) and fit.t_d_s == pytest.approx(t_d, rel=1e-9)
    assert fit.max_residual < 1e-9 and fit.max_ttft_error < 1e-9
    # (ITL - t_d)(TTFT - N alpha) = N alpha t_d along the whole curve, and TTFT falls as ITL rises.
    curve = fit.curve(0.02, 0.3)
    product = (curve["itl_max_s"] - t_d) * (curve["ttft_s"] - n * alpha)
    assert np.allclose(product, n * alpha * t_d)
    assert (np.diff(curve["ttft_s"]) < 0).all() and curve["itl_max_s"].iloc[0] == pytest.approx(0.02)


def test_hyperbola_fit_takes_the_request_latency_as_known():
    # The client's TTFT includes the request latency L before the engine sees the prompt: TTFT = L + (N / c) step.
    alpha, t_d, n, latency = 25e-6, 0.018, 8000, 0.0064
    c = np.array([128, 384, 896, 1920, 3968, 8000.0])
    itl, ttft = t_d + c * alpha, latency + n / c * (t_d + c * alpha)
    fit = chapter.fit_chunk_hyperbola(itl, ttft, n, latency_s=latency)
    assert (fit.alpha_s, fit.t_d_s, fit.latency_s) == pytest.approx((alpha, t_d, latency), rel=1e-9)
    assert fit.max_residual < 1e-9 and fit.max_ttft_error < 1e-9
    assert fit.curve(0.02, 0.3)["ttft_s"].min() > latency + n * alpha  # the TTFT floor: L + N alpha
    assert chapter.fit_chunk_hyperbola(itl, ttft, n).max_ttft_error > 1e-4  # leaving L out misfits
    with pytest.raises(ValueError, match="latency_s"):
        chapter.fit_chunk_hyperbola(itl, ttft, n, latency_s=-1.0)
    with pytest.raises(ValueError, match="ttft_s > latency_s"):
        chapter.fit_chunk_hyperbola(itl, ttft, n, latency_s=1.0)


def test_hyperbola_fit_reports_its_misfit():
    alpha, t_d, n = 25e-6, 0.018, 8000
    c = np.array([128, 384, 896, 1920, 3968, 8000.0])
    itl, ttft = t_d + c * alpha, n / c * (t_d + c * alpha)
    ttft[2] *= 1.3  # one point off the curve
    fit = chapter.fit_chunk_hyperbola(itl, ttft, n)
    errors = np.abs(fit.ttft_s(itl) / ttft - 1)
    assert fit.max_ttft_error == pytest.approx(errors.max()) and errors.max() > 0.1
    assert fit.max_residual > 0.05
    with pytest.raises(ValueError):
        chapter.fit_chunk_hyperbola([0.02], [0.5], n)
    with pytest.raises(ValueError):
        chapter.fit_chunk_hyperbola([0.02, -1.0], [0.5, 0.3], n)


@pytest.fixture(scope="module")
def sweep(cost8b):
    # Chunking off, vLLM wants a budget of max_model_len (Llama-3's 8,192 tokens) at least.
    return chapter.chunk_budget_sweep(cost8b, BUDGETS, unchunked_max_num_batched_tokens=8192, **SMALL)


def test_budget_sweep_trades_itl_for_ttft_monotonically(sweep):
    # Chunks above the GEMM ridge (about 220 tokens per step here): below it a chunk rides almost free in the
    # memory-bound step, and the decoders' growing context can make a longer prefill's worst gap the taller.
    points, timeline = sweep
    chunked = points[points["config"] == "chunked"]
    assert chunked["max_num_batched_tokens"].tolist() == BUDGETS
    assert (np.diff(chunked["itl_max_s"]) > 0).all()  # a bigger budget: taller worst gap ...
    assert (np.diff(chunked["ttft_s"]) < 0).all()  # ... and an earlier first token
    chunk = np.minimum(np.array(BUDGETS) - SMALL["n_decoders"], SMALL["prompt_tokens"])  # decodes go first
    assert chunked["largest_chunk_tokens"].tolist() == chunk.tolist()
    assert chunked["chunks"].tolist() == [math.ceil(SMALL["prompt_tokens"] / c) for c in chunk]
    assert (chunked["itl_max_s"] > chunked["cadence_s"]).all()
    assert np.allclose(chunked["log2_tokens"], np.log2(BUDGETS))
    assert set(timeline["max_num_batched_tokens"]) == set(BUDGETS) | {8192}
    assert np.isclose(timeline["itl_s"].max(), points["itl_max_s"].max())


def test_chunking_off_is_orcas_unchunked_step(sweep, cost8b):
    points, timeline = sweep
    off = points[points["config"] == "unchunked"].iloc[0]
    m = scenes.run(cost8b, "continuous", **SMALL).measures
    assert (off["itl_max_s"], off["ttft_s"]) == (m["itl_max_s"], m["ttft_s"])
    # The scene's synchronous engine: the step pays all of its CPU work.
    step = cost8b.step_time(prefill_chunks=[(SMALL["prompt_tokens"], 0)], decode_contexts=[SMALL["context"]] * 16,
                            asynchronous=False)
    assert off["itl_max_s"] == pytest.approx(step, rel=1e-9) and off["chunks"] == 1
    assert off["ttft_s"] == pytest.approx(cost8b.request_latency_s + step, rel=1e-9)  # the client's TTFT
    assert off["seen_s"] - off["arrival_s"] == pytest.approx(cost8b.request_latency_s, abs=1e-12)
    tl = timeline[timeline["config"] == "unchunked"]
    assert tl["time_s"].is_monotonic_increasing and tl["time_s"].min() >= -0.1


def test_every_timeline_spans_the_shared_axis(sweep):
    # The page draws every run on one time axis, to 0.1 s after the latest first token (the smallest budget's):
    # each run's gaps reach that end, not only its own TTFT + 0.1 s (chunking off once went blank after 0.3 s).
    points, timeline = sweep
    end = points["ttft_s"].max() + 0.1
    for (config, tokens), tl in timeline.groupby(["config", "max_num_batched_tokens"]):
        run = points[(points["config"] == config) & (points["max_num_batched_tokens"] == tokens)].iloc[0]
        assert tl["time_s"].min() >= -0.1 - 1e-9 and tl["time_s"].max() <= end + 1e-9
        assert tl["time_s"].max() > end - 2 * run["cadence_s"], (config, tokens)  # within a step of the end


def test_sweep_validation(cost8b):
    with pytest.raises(ValueError, match="n_decoders"):
        chapter.chunk_budget_sweep(cost8b, [16], **SMALL)
    with pytest.raises(ValueError, match="unchunked_max_num_batched_tokens"):
        chapter.chunk_budget_sweep(cost8b, [256], unchunked_max_num_batched_tokens=1024, **SMALL)


@pytest.fixture(scope="module")
def frames(sweep):
    points, timeline = sweep
    chunked = points[points["config"] == "chunked"]
    fit = chapter.fit_chunk_hyperbola(chunked["itl_max_s"], chunked["ttft_s"], SMALL["prompt_tokens"])
    return points, timeline, fit.curve(chunked["itl_max_s"].min(), chunked["itl_max_s"].max())


def test_chunking_chart_binds_a_budget_slider_and_a_checkbox_that_disables_it(frames):
    spec = chapter.chunking_chart(*frames, max_num_batched_tokens=1024).to_dict()
    params = {p["name"]: p for p in spec["params"]}
    # the reader slides the budget in tokens; the parameter keeps its log2 (evenly spaced), which the filters compare
    assert params["log2_tokens"]["bind"] == {"input": "range", "min": 8.0, "max": 11.0, "step": 1.0,
                                             "name": "max_num_batched_tokens (tokens)"}
    assert params["log2_tokens"]["value"] == 10.0
    shown = viz._slider_labels(spec)["log2_tokens"]  # what the slider shows beside itself, in tokens
    assert shown == {"min": 8.0, "step": 1.0, "labels": ["256", "512", "1,024", "2,048"]}
    assert not any("2^" in b.get("name", "") for b in walk(spec, "bind") if isinstance(b, dict))
    assert params["chunking"]["bind"]["input"] == "checkbox" and params["chunking"]["value"] is True
    # chunking off, the budget changes nothing: the slider is disabled exactly then
    assert spec["usermeta"]["disabledBy"] == {"log2_tokens": "log2_tokens_disabled"}
    points = frames[0]
    off = int(points.loc[points["config"] == "unchunked", "max_num_batched_tokens"].iloc[0])
    assert spec["usermeta"]["disabledShown"] == {"log2_tokens": f"{off:,}, chunking off"}  # not a chunked budget
    assert params["log2_tokens_disabled"]["expr"] == "!chunking"
    assert "title" not in spec and len(spec["vconcat"]) == 2


def test_chunking_chart_tooltips_are_titled_in_words(frames):
    spec = chapter.chunking_chart(*frames).to_dict()
    tips = [t for tt in walk(spec, "tooltip") for t in (tt if isinstance(tt, list) else [tt])]
    assert len(tips) >= 10 and all(isinstance(t, dict) and t.get("title") for t in tips)
    assert not [t["title"] for t in tips if re.search(r"[a-z]+_[a-z]+", t["title"])]  # words, not code names
    assert all("(" in t["title"] for t in tips if t["field"].endswith(("_ms", "_s")))  # with their unit
    fields = {t["field"] for t in tips}
    assert {"setting", "itl_text", "ttft_text", "time_s", "sequences"} <= fields and "config" not in fields
    assert not fields & {"itl_ms", "ttft_ms"}  # durations as the book prints them ("1.22 s"), not "1,221"


def test_chunking_chart_layers_and_encodings(frames):
    spec = chapter.chunking_chart(*frames).to_dict()
    left, right = spec["vconcat"]
    assert {"line", "point", "text"} <= marks(left) and {"bar", "rule", "text"} <= marks(right)
    x, y = left["layer"][1]["encoding"]["x"], left["layer"][1]["encoding"]["y"]
    assert (x["field"], y["field"]) == ("ttft_ms", "itl_ms") and x["scale"]["type"] == y["scale"]["type"] == "log"
    assert x["scale"]["padding"] > 0 and y["scale"]["padding"] > 0  # end points clear of the axes
    assert x["title"] == "newcomer's time to first token (ms)"
    bars = right["layer"][0]["encoding"]
    assert bars["x"]["field"] == "time_s" and bars["y"]["field"] == "itl_ms"
    # The ring, the bars, the first-token rule and its label (two layers: one per side) follow both controls.
    chosen = [f for f in walk(spec, "filter") if isinstance(f, str) and f.startswith("chunking ?")]
    assert len(chosen) == 5 and all("log2_tokens" in f and "unchunked" in f for f in chosen)
    # The label stands beside its rule on the side with room, never across it: right of a rule in the left half
    # of the panel, left of one in the right half; both at the rule's x.
    labels = [lyr for lyr in right["layer"] if lyr["mark"]["type"] == "text"]
    lo, hi = frames[1]["time_s"].min(), frames[1]["time_s"].max()
    assert [(lyr["mark"]["align"], lyr["mark"]["dx"]) for lyr in labels] == [("left", 5), ("right", -5)]
    assert all(lyr["encoding"]["x"]["field"] == "ttft_s" for lyr in labels)
    (rule,) = [lyr for lyr in right["layer"] if lyr["mark"]["type"] == "rule"]
    assert all(lyr["data"] == rule["data"] for lyr in labels)  # the runs' points, not an empty frame
    sides = [next(t["filter"] for t in lyr["transform"][::-1] if "filter" in t) for lyr in labels]
    mid = float((lo + hi) / 2)
    assert sides == [f"datum.ttft_s <= {mid!r}", f"datum.ttft_s > {mid!r}"]
    titles = [e[c]["title"] for e in walk(spec, "encoding") for c in ("x", "y")
              if c in e and isinstance(e[c], dict) and isinstance(e[c].get("title"), str)]
    assert titles and all(t == t.lower() for t in titles)


def test_chunking_chart_data_in_seconds_shown_in_ms(frames):
    points, timeline, curve = frames
    spec = chapter.chunking_chart(points, timeline, curve).to_dict()
    calcs = [c["calculate"] for c in walk(spec, "transform") for c in (c if isinstance(c, list) else [c])
             if isinstance(c, dict) and "calculate" in c]
    assert "datum.itl_max_s * 1000" in calcs and "datum.itl_s * 1000" in calcs


def test_page_tables_and_async_change(sweep):
    points, _ = sweep
    table = chapter.budget_table(points)
    assert list(table.data.columns) == ["max_num_batched_tokens (tokens)", "largest slice (tokens)", "slices",
                                        "decoders' worst gap", "newcomer's TTFT"]
    assert table.data.iloc[-1, 0] == "8,192, chunking off" and table.data.iloc[0, 0] == f"{BUDGETS[0]:,}"
    assert np.allclose(table.data["newcomer's TTFT"], points["ttft_s"] * 1e3)
    shown = table.to_html()  # each duration in the book's one rule, its unit in the cell
    assert all(f">{viz.format_duration(v, 's')}<" in shown for v in (*points["ttft_s"], *points["itl_max_s"]))
    later = points.assign(ttft_s=points["ttft_s"] + 0.002, itl_max_s=points["itl_max_s"] - 0.001)
    change = chapter.async_change(points, later)
    assert list(change.index.names) == ["config", "max_num_batched_tokens"]
    assert np.allclose(change["ttft_s"], 0.002) and np.allclose(change["itl_max_s"], -0.001)
    html = chapter.async_change_table(change).to_html()
    assert "+2.0" in html and "-1.00" in html and "8,192, chunking off" in html


def test_facts_are_the_spike_scenes_sweep(cost8b):
    # The facts the cheat sheet, the intro and chapter 14 quote: the scene's own runs (its defaults: the batch of
    # the 20 ms step, the synchronous scheduler), the unchunked gap chapter 5's.
    from batchlab.chapters import facts

    points, _ = chapter.chunk_budget_sweep(cost8b, [512, 2048], unchunked_max_num_batched_tokens=16384)
    at = points.set_index(["config", "max_num_batched_tokens"])
    for b in chapter.FACT_BUDGETS:
        assert facts.value(f"chunk_{b}_gap_ms") == at.loc[("chunked", b), "itl_max_s"] * 1e3
        assert facts.value(f"chunk_{b}_ttft_ms") == at.loc[("chunked", b), "ttft_s"] * 1e3
    assert facts.value("chunk_off_ttft_ms") == at.loc[("unchunked", 16384), "ttft_s"] * 1e3
    assert facts.value("spike_gap_ms") == at.loc[("unchunked", 16384), "itl_max_s"] * 1e3
    # the trade: a smaller budget, a shorter gap and a later first token; chunking off, the tallest and earliest
    assert facts.value("chunk_512_gap_ms") < facts.value("chunk_2048_gap_ms") < facts.value("spike_gap_ms")
    assert facts.value("chunk_512_ttft_ms") > facts.value("chunk_2048_ttft_ms") > facts.value("chunk_off_ttft_ms")
    assert {f.name for f in facts.registry().values() if f.chapter == "chunked_prefill"} == {
        "chunk_off_ttft_ms", "chunk_512_gap_ms", "chunk_512_ttft_ms", "chunk_2048_gap_ms", "chunk_2048_ttft_ms"}
