"""Notebook 11's experiments: each fact-check number against its closed form, and the chunking trade-off's shape."""
from __future__ import annotations

import math

import numpy as np
import pytest

import batchlab as bl
from batchlab import experiments


@pytest.fixture(scope="module")
def small(h100):
    return bl.CostModel(h100, bl.get_model("llama-3-8b"))


@pytest.fixture(scope="module")
def large(h100):
    return bl.CostModel(h100, bl.get_model("llama-3-70b"), dtype="fp8")


def test_cadence_batch_is_the_closest_batch(small):
    b = experiments.cadence_batch(small, 0.020, 2048)
    step = [small.decode_step_time(x, 2048) for x in (b - 1, b, b + 1)]
    assert abs(step[1] - 0.020) <= min(abs(step[0] - 0.020), abs(step[2] - 0.020))
    assert experiments.cadence_batch(small, 0.030, 2048) > b  # a slower cadence carries more sequences
    with pytest.raises(ValueError, match="outside"):
        experiments.cadence_batch(small, 0.001, 2048)  # faster than one sequence's step


def test_prefill_gap_closed_forms(small, large, h100):
    ideal = experiments.prefill_gap(small.ideal(), 8000)
    assert ideal["step_s"] == pytest.approx(0.1468, abs=5e-4)  # DESIGN: about 147 ms at 100 % of BF16 peak
    assert ideal["mfu"] == pytest.approx(1.0) and ideal["bound"] == "compute"  # the roofline runs at peak
    m = small.model
    flops = 2 * m.params * 8000 + 2 * m.layers * m.attn_dim * 8000**2
    assert ideal["flops"] == pytest.approx(flops)
    big = experiments.prefill_gap(large.ideal(), 8000)
    assert big["step_s"] == pytest.approx(0.6128, abs=5e-4)  # >= 613 ms at 100 % of FP8 peak
    assert big["flops"] / h100.flops_fp8 == pytest.approx(big["step_s"])
    calibrated = experiments.prefill_gap(small, 8000, decoders=64, context=2048)
    assert calibrated["step_s"] > ideal["step_s"] and 0 < calibrated["mfu"] < 1


def test_implied_mfu(small, large):
    assert experiments.implied_mfu(large.ideal(), 8000, 0.400) > 1  # impossible on one H100
    assert experiments.implied_mfu(small, 8000, 0.400, 149, 2048) == pytest.approx(0.373, abs=0.002)
    gap = experiments.prefill_gap(small, 8000, 10, 1024)
    assert experiments.implied_mfu(small, 8000, gap["step_s"], 10, 1024) == pytest.approx(gap["mfu"])


def test_max_num_seqs_table_follows_the_gpu_not_the_model():
    gpus = [bl.get_hardware(n) for n in bl.hardware_names()]
    models = [bl.get_model("llama-3-8b"), bl.get_model("llama-3-70b")]
    table = experiments.max_num_seqs_table(gpus, models)
    assert len(table) == len(gpus) * 2
    assert (table.groupby("gpu")["max_num_seqs"].nunique() == 1).all()
    at = table.set_index(["gpu", "model"])
    assert at.loc[("h100-sxm", "llama-3-70b"), "max_num_seqs"] == 1024
    assert at.loc[("a100-80gb", "llama-3-8b"), ["max_num_seqs", "max_num_batched_tokens", "offline_tokens"]].tolist() \
        == [256, 2048, 8192]
    assert at.loc[("h200", "llama-3-8b"), ["max_num_batched_tokens", "offline_tokens"]].tolist() == [8192, 16384]
    assert (table["agrees"] == (table["max_num_seqs"] == table["article_rule"])).all()
    assert not at.loc[("h100-sxm", "llama-3-70b"), "agrees"] and at.loc[("h100-sxm", "llama-3-8b"), "agrees"]


@pytest.fixture(scope="module")
def trade(small):
    return experiments.chunking_tradeoff(small, [64, 128, 512, 4096], decoders=16, context=512, prompt_tokens=2000)


def test_chunking_tradeoff_chunks_are_the_budget_left_by_the_decodes(trade):
    # Every iteration gives one token to each of the 16 decoders and the rest of the budget to the prompt.
    expected = [math.ceil(2000 / (b - 16)) for b in trade["max_num_batched_tokens"]]
    assert trade["chunks"].tolist() == expected and expected[-1] == 1
    np.testing.assert_allclose(trade["log2_budget"], np.log2(trade["max_num_batched_tokens"]))


def test_chunking_tradeoff_no_budget_improves_both(trade, small):
    assert (np.diff(trade["ttft_ms"]) < 0).all() and (np.diff(trade["max_itl_ms"]) > 0).all()
    assert (trade["max_itl_ms"] > trade["base_itl_ms"]).all()
    # Unchunked, the tallest gap is the step holding the whole prompt beside the decodes (contexts have grown a
    # little past 512 by then, so it is a bit longer than at exactly 512).
    whole = small.step_time(prefill_chunks=[(2000, 0)], decode_contexts=[512] * 16) * 1e3
    assert whole <= trade["max_itl_ms"].iloc[-1] < 1.1 * whole


def test_chunking_tradeoff_rejects_a_budget_the_decodes_fill(small):
    with pytest.raises(ValueError, match="exceed"):
        experiments.chunking_tradeoff(small, [16, 512], decoders=16, context=512)
