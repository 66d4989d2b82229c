"""Notebook 05's experiment functions: the spike is the admitting step, the stream is what it says, and the
requests behind the long prompt wait for it."""
from __future__ import annotations

import numpy as np
import pytest

import batchlab as bl
from batchlab import experiments

H100 = bl.get_hardware("h100-sxm")


@pytest.fixture(scope="module")
def cost8():
    return bl.CostModel(H100, bl.get_model("llama-3-8b"))


@pytest.fixture(scope="module")
def orca(cost8):
    return experiments.prefill_spike(cost8, n_decoders=32, context=1024, newcomer_tokens=4000, n_behind=4,
                                     tail_steps=20, seed=1)


def test_spike_stream_layout():
    s = experiments.spike_stream(2.0, [2.1, 2.5], n_decoders=3, context=100, decode_tokens=7, newcomer_tokens=900,
                                 behind_tokens=50, output_tokens=5)
    assert s.arrival_s.tolist() == [0, 0, 0, 2.0, 2.1, 2.5]
    assert s.prompt_tokens.tolist() == [100, 100, 100, 900, 50, 50]
    assert s.output_tokens.tolist() == [7, 7, 7, 5, 5, 5]
    base = experiments.spike_stream(2.0, [2.1], n_decoders=2, newcomer=False)
    assert len(base) == 3 and 8000 not in base.prompt_tokens.tolist()


def test_the_largest_gap_is_the_admitting_step(orca, cost8):
    s, steps = orca.summary, orca.run.steps
    admit = steps.iloc[s["admit_step"]]
    assert admit["prefill_tokens"] >= 4000 and admit["decode_seqs"] == 32 and admit["bound"] == "compute"
    assert s["spike_s"] == pytest.approx(s["admit_step_s"], rel=1e-9)
    assert s["admit_step_s"] >= cost8.prefill_time(4000) == s["prefill_s"]
    # Every decoder sees that gap exactly once, at the end of the admitting step.
    top = orca.itl[orca.itl["itl_s"] == orca.itl["itl_s"].max()]
    assert top["sequences"].tolist() == [32]
    end = admit["start_s"] + admit["duration_s"] - orca.run.requests["arrival_s"].iloc[32]
    assert top["time_s"].iloc[0] == pytest.approx(end)
    # Before the long prompt the decoders run pure decode steps at the cost model's time.
    assert s["cadence_s"] == pytest.approx(cost8.decode_step_time(32, 1024 + 5), rel=0.01)
    assert s["ideal_prefill_s"] == cost8.ideal().prefill_time(4000) < s["prefill_s"]


def test_long_prompt_arrives_mid_step_and_the_gaps_are_complete(orca):
    gaps = orca.itl
    assert (gaps["time_s"] < 0).sum() >= 5 and gaps["itl_s"].min() > 0
    assert gaps["sequences"].sum() == 32 * (10 + 20 - 1)  # every decoder, every gap
    # Halfway through a step: the prompt waits half a cadence before its iteration starts.
    wait = orca.run.requests["queue_s"].iloc[32]
    assert wait == pytest.approx(orca.summary["cadence_s"] / 2, rel=0.05)


def test_requests_behind_wait_for_the_prefill(orca):
    b = orca.behind
    assert len(b) == 4 and (np.diff(b["arrival_s"]) >= 0).all()
    assert b["arrival_s"].min() >= 0 and b["arrival_s"].max() <= orca.summary["prefill_s"]
    assert (b["ttft_s"] > b["ttft_baseline_s"]).all()
    assert orca.summary["behind_ttft_s"] == pytest.approx(b["ttft_s"].mean())
    assert not orca.baseline.requests["prompt_tokens"].eq(4000).any()


def test_v0_order_makes_the_gap_longer_and_no_decode_runs_with_the_prompt(cost8):
    v0 = experiments.prefill_spike(cost8, n_decoders=32, context=1024, newcomer_tokens=4000, n_behind=0,
                                   tail_steps=20, prefill_only_steps=True)
    s = v0.summary
    admit = v0.run.steps.iloc[s["admit_step"]]
    assert admit["decode_seqs"] == 0 and admit["prefill_tokens"] == 4000
    nxt = v0.run.steps.iloc[s["admit_step"] + 1]
    assert s["spike_s"] == pytest.approx(admit["duration_s"] + nxt["duration_s"])


def test_spike_grows_with_the_prompt(cost8):
    spikes = [experiments.prefill_spike(cost8, n_decoders=16, context=512, newcomer_tokens=n, n_behind=0,
                                        tail_steps=5).summary["spike_s"] for n in (1000, 2000, 4000, 8000)]
    assert (np.diff(spikes) > 0).all()


def test_scenarios_frames(cost8):
    cost70 = bl.CostModel(H100, bl.get_model("llama-3-70b"), dtype="fp8")
    itl, behind, summary, spikes = experiments.spike_scenarios(
        {"8b": (cost8, 16), "70b": (cost70, 2)}, context=512, newcomer_tokens=2000, n_behind=3, tail_steps=5)
    assert len(summary) == 4 and set(spikes) == {(m, o) for m in ("8b", "70b") for o in experiments.SPIKE_ORDERS}
    assert set(behind["run"]) == {"with the long prompt", "without it"} and len(behind) == 4 * 3 * 2
    assert {"model", "order", "time_s", "itl_ms", "sequences"} <= set(itl.columns)
    for (m, o), s in spikes.items():
        sub = itl[(itl["model"] == m) & (itl["order"] == o)]
        assert sub["itl_ms"].max() == pytest.approx(s.summary["spike_s"] * 1e3)
    row = summary.set_index(["model", "order"]).loc[("70b", "mixed step (Orca)")]
    assert row["spike_s"] > row["ideal_prefill_s"] >= cost70.ideal().prefill_time(2000)
