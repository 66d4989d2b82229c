"""Notebook 06's experiment functions: the prefill-arrival scene, the budget sweep and the hyperbola fit."""
from __future__ import annotations

import math

import numpy as np
import pytest

import batchlab as bl
from batchlab import experiments

SMALL = dict(n_decoders=16, decoder_context=512, prompt_tokens=2000, decoder_prompt_tokens=32)


def test_hyperbola_fit_recovers_alpha_and_t_d_exactly():
    # Points that follow the model exactly: step = t_d + c alpha, ITL = step, TTFT = (N / c) step.
    alpha, t_d, n = 25e-6, 0.018, 8000
    c = np.array([128, 384, 896, 1920, 3968, 8000.0])
    fit = experiments.fit_chunk_hyperbola(t_d + c * alpha, n / c * (t_d + c * alpha), n)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9) and fit.t_d_s == pytest.approx(t_d, rel=1e-9)
    assert fit.max_residual < 1e-9 and fit.max_ttft_error < 1e-9
    # (ITL - t_d)(TTFT - N alpha) = N alpha t_d along the whole curve, and TTFT falls as ITL rises.
    curve = fit.curve(0.02, 0.3)
    product = (curve["itl_max_s"] - t_d) * (curve["ttft_s"] - n * alpha)
    assert np.allclose(product, n * alpha * t_d)
    assert (np.diff(curve["ttft_s"]) < 0).all() and curve["itl_max_s"].iloc[0] == pytest.approx(0.02)


def test_hyperbola_fit_reports_its_misfit():
    alpha, t_d, n = 25e-6, 0.018, 8000
    c = np.array([128, 384, 896, 1920, 3968, 8000.0])
    itl, ttft = t_d + c * alpha, n / c * (t_d + c * alpha)
    ttft[2] *= 1.3  # one point off the curve
    fit = experiments.fit_chunk_hyperbola(itl, ttft, n)
    errors = np.abs(fit.ttft_s(itl) / ttft - 1)
    assert fit.max_ttft_error == pytest.approx(errors.max()) and errors.max() > 0.1
    assert fit.max_residual > 0.05
    with pytest.raises(ValueError):
        experiments.fit_chunk_hyperbola([0.02], [0.5], n)
    with pytest.raises(ValueError):
        experiments.fit_chunk_hyperbola([0.02, -1.0], [0.5, 0.3], n)


def test_prefill_arrival_meets_every_decoder_at_the_same_context(cost8b):
    res, arrival = experiments.prefill_arrival(cost8b, max_num_batched_tokens=512, **SMALL)
    reach = SMALL["decoder_context"] - SMALL["decoder_prompt_tokens"]
    emitted = [int((t <= arrival + 1e-12).sum()) for t in res.token_times[:-1]]
    assert emitted == [reach] * SMALL["n_decoders"]  # context = prompt + outputs = decoder_context for all
    req = res.requests
    assert req["arrival_s"].iloc[-1] == arrival and req["prompt_tokens"].iloc[-1] == SMALL["prompt_tokens"]
    assert (req["finish_s"].iloc[:-1] > req["first_token_s"].iloc[-1]).all()  # decoders outlast its prefill
    assert not req["rejected"].any()


def test_unchunked_spike_is_one_step_of_the_whole_prompt_beside_the_decodes(cost8b):
    ideal = cost8b.ideal()
    res, arrival = experiments.prefill_arrival(ideal, policy="continuous", **SMALL)
    m, timeline = experiments.arrival_measures(res, arrival)
    n, ctx, big = SMALL["n_decoders"], SMALL["decoder_context"], SMALL["prompt_tokens"]
    # A decoder whose sequence holds ctx tokens has ctx - 1 in its KV cache: the last one is the token it decodes.
    step = ideal.step_time(prefill_chunks=[(big, 0)], decode_contexts=[ctx - 1] * n)
    assert m["itl_max_s"] == pytest.approx(step, rel=1e-9) and m["ttft_s"] == pytest.approx(step, rel=1e-9)
    assert m["decode_step_s"] == pytest.approx(ideal.decode_step_time(n, ctx - 2), rel=1e-9)
    assert m["prefill_steps"] == 1 and m["largest_chunk_tokens"] == big
    assert timeline["itl_s"].max() == pytest.approx(step) and timeline["time_s"].is_monotonic_increasing


def test_budget_sweep_trades_itl_for_ttft_monotonically(cost8b):
    # Chunks above the GEMM ridge (about 220 tokens per step here): below it a chunk rides almost free in the
    # memory-bound step, and the decoders' growing context can make a longer prefill's worst gap the taller.
    budgets = [256, 512, 1024, 2048]
    points, timeline = experiments.chunk_budget_sweep(cost8b, budgets, unchunked_budget=4096, **SMALL)
    chunked = points[points["config"] == "chunked"]
    assert chunked["budget"].tolist() == budgets
    assert (np.diff(chunked["itl_max_s"]) > 0).all()  # a bigger budget: taller worst gap ...
    assert (np.diff(chunked["ttft_s"]) < 0).all()  # ... and an earlier first token
    chunk = np.minimum(np.array(budgets) - SMALL["n_decoders"], SMALL["prompt_tokens"])  # decodes go first
    assert chunked["largest_chunk_tokens"].tolist() == chunk.tolist()
    steps = [math.ceil(SMALL["prompt_tokens"] / c) for c in chunk]
    assert chunked["prefill_steps"].tolist() == steps
    assert (chunked["itl_max_s"] > chunked["decode_step_s"]).all()
    assert np.allclose(chunked["log2_budget"], np.log2(budgets))
    off = points[points["config"] == "unchunked"].iloc[0]
    cont, arrival = experiments.prefill_arrival(cost8b, policy="continuous", **SMALL)
    m, _ = experiments.arrival_measures(cont, arrival)
    assert off["ttft_s"] == pytest.approx(m["ttft_s"]) and off["itl_max_s"] == pytest.approx(m["itl_max_s"])
    assert set(timeline["budget"]) == set(budgets) | {4096}


def test_scene_validation(cost8b):
    with pytest.raises(ValueError, match="n_decoders"):
        experiments.prefill_arrival(cost8b, max_num_batched_tokens=16, **SMALL)
    with pytest.raises(ValueError, match="decoder_prompt_tokens"):
        experiments.prefill_arrival(cost8b, n_decoders=4, decoder_context=32, decoder_prompt_tokens=32)
    with pytest.raises(ValueError, match="unchunked_budget"):
        experiments.chunk_budget_sweep(cost8b, [256], unchunked_budget=1024, **SMALL)
