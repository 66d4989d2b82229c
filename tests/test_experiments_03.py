"""Experiment functions of notebook 03 (continuous batching): token accounting per step, slot-use closed forms."""
from __future__ import annotations

import numpy as np
import pytest

import batchlab as bl
from batchlab import experiments


@pytest.fixture(scope="module")
def cost():
    return bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))


@pytest.fixture(scope="module")
def stream():
    return bl.preset("azure-conv-2023", 12, rate_req_s=4.0, seed=0)


@pytest.fixture(scope="module")
def runs(cost, stream):
    return experiments.timeline_runs(cost, stream, slots=4, max_queue_delay_s=0.05)


def test_timeline_runs_share_the_slot_count(runs):
    assert list(runs) == ["static", "dynamic", "continuous"]
    assert runs["static"].knobs["batch_size"] == runs["dynamic"].knobs["batch_size"] == 4
    assert runs["continuous"].knobs["max_num_seqs"] == 4
    assert runs["dynamic"].knobs["max_queue_delay_s"] == 0.05
    for res in runs.values():
        assert res.steps["running"].max() == 4


def test_tokens_per_step_counts_every_token_once(runs, stream):
    for policy, res in runs.items():
        gen = experiments.tokens_per_step(res)
        assert gen.sum() == stream.output_tokens.sum(), policy
        assert (gen <= res.steps["running"].to_numpy()).all()
    # Continuous (prompts whole, decodes alongside): every running row emits a token every iteration.
    cont = runs["continuous"]
    assert (experiments.tokens_per_step(cont) == cont.steps["running"].to_numpy()).all()
    # Lockstep: the prefill step emits a first token for every row, later steps only for unfinished rows.
    static = runs["static"]
    opens = (static.steps["prefill_tokens"] > 0).to_numpy()
    assert (experiments.tokens_per_step(static)[opens] == static.steps["running"].to_numpy()[opens]).all()
    assert (experiments.tokens_per_step(static) < static.steps["running"].to_numpy()).any()


def test_held_share_closed_form(cost):
    # One batch of two rows, outputs 1 and 3: step 0 (prefill) emits both first tokens, steps 1 and 2 only
    # the long row's, so the short row holds its slot for steps 1 and 2.
    two = bl.Requests(np.zeros(2), np.array([64, 64]), np.array([1, 3]))
    res = bl.simulate(two, "static", cost, batch_size=2)
    d = res.steps["duration_s"].to_numpy()
    assert d.size == 3
    row = experiments.timeline_summary({"static": res}).iloc[0]
    assert row["held_share"] == pytest.approx((d[1] + d[2]) / (2 * d.sum()))
    assert row["mean_generating"] == pytest.approx((2 * d[0] + d[1] + d[2]) / d.sum())
    assert row["last_finish_s"] == pytest.approx(d.sum()) and row["iterations"] == 3
    # Equal outputs: nobody is ever held.
    same = bl.Requests(np.zeros(4), np.full(4, 64), np.full(4, 5))
    assert experiments.timeline_summary({"s": bl.simulate(same, "static", cost, batch_size=2)})["held_share"][0] == 0


def test_timeline_summary_orders_the_policies(runs):
    summ = experiments.timeline_summary(runs).set_index("policy")
    assert summ.loc["continuous", "held_share"] == 0
    assert summ.loc["static", "held_share"] > 0 and summ.loc["dynamic", "held_share"] > 0
    assert summ.loc["continuous", "last_finish_s"] < summ.loc[["static", "dynamic"], "last_finish_s"].min()
    assert (summ["mean_e2el_s"] >= summ["mean_ttft_s"]).all()


def test_last_finish_by_seed_matches_single_runs(cost):
    check = experiments.last_finish_by_seed(cost, "azure-conv-2023", 12, 4.0, [0, 5], slots=4)
    assert list(check.index) == [0, 5] and list(check.columns) == ["static", "dynamic", "continuous"]
    one = experiments.timeline_runs(cost, bl.preset("azure-conv-2023", 12, rate_req_s=4.0, seed=5), slots=4)
    assert check.loc[5, "dynamic"] == one["dynamic"].requests["finish_s"].max()
    # With one slot continuous batching is first come, first served, like lockstep batches of one.
    solo = experiments.last_finish_by_seed(cost, "azure-conv-2023", 12, 4.0, [1], slots=1)
    assert solo.loc[1, "continuous"] == pytest.approx(solo.loc[1, "static"], rel=1e-9)
