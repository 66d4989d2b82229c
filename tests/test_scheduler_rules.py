"""Hand-worked cases for scheduler rules that only the comparison with the plain-Python reference checked before:
the budget of vLLM V0's continuous batching, the seat cap, the dynamic batcher's count rule, a lockstep batch cut
by the KV pool, and a preempted request whose recomputation can never fit the budget (``REJECT_RECOMPUTE``).

Each is small enough to state step by step in its docstring; the engine has no serving terms (conftest), so the
schedule is in whole iterations.
"""
import numpy as np
import pytest

import batchlab as bl
from batchlab._kernels import REJECT_RECOMPUTE


def step(res, index: int) -> dict[int, int]:
    """Request -> tokens scheduled in iteration ``index``."""
    s = res.schedule
    s = s[(s["step"] == index) & (s["kind"] != "preempt")]
    return dict(zip(s["request"].tolist(), s["tokens"].tolist()))


def reqs(prompts, outputs, arrivals=None):
    return bl.Requests(np.zeros(len(prompts)) if arrivals is None else arrivals, prompts, outputs)


def test_continuous_v0_budget_caps_the_prompt_tokens_admitted_per_iteration(engine8b):
    """Budget 100 prompt tokens per iteration, prompts of 60, 60 and 30. Step 0: request 0's 60; request 1 would
    make 120, so admission stops there and request 2 (30, which would fit) does not jump the queue. Step 1:
    60 + 30 = 90 <= 100 both come in beside request 0's decode."""
    res = bl.simulate(reqs([60, 60, 30], [3, 3, 3]), "continuous", engine8b, max_num_batched_tokens=100,
                      max_num_seqs=8, record_schedule=True)
    assert [step(res, i) for i in range(4)] == [{0: 60}, {0: 1, 1: 60, 2: 30}, {0: 1, 1: 1, 2: 1}, {1: 1, 2: 1}]
    assert res.steps["prefill_tokens"].tolist()[:2] == [60, 90]


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
def test_seat_cap_admits_the_third_request_when_a_seat_frees(engine8b, policy):
    """Two seats, three 10-token prompts with outputs 3, 5 and 2. Steps 0-2 run requests 0 and 1 (prefill, then
    two decodes); request 0 finishes at step 2 with its third token, so request 2 takes its seat at step 3, and
    finishes at step 4 beside request 1's last decode."""
    kw = {"async_scheduling": False} if policy == "chunked" else {}
    res = bl.simulate(reqs([10, 10, 10], [3, 5, 2]), policy, engine8b, max_num_seqs=2, record_schedule=True, **kw)
    assert [step(res, i) for i in range(5)] == [{0: 10, 1: 10}, {0: 1, 1: 1}, {0: 1, 1: 1}, {1: 1, 2: 10},
                                               {1: 1, 2: 1}]
    assert len(res.steps) == 5 and (res.steps["running"] <= 2).all()


def test_dynamic_dispatches_on_the_count_before_the_timer(engine8b):
    """Batch size 2, timer 1 s; arrivals at 0, 1 ms, 2 ms and 5 s. The second arrival completes a batch at 1 ms
    (the count rule, long before the timer); the third waits alone until its timer fires at 1.002 s; the fourth
    arrives after everything has finished and leaves on its own timer at 6 s."""
    res = bl.simulate(reqs([10] * 4, [2] * 4, [0.0, 0.001, 0.002, 5.0]), "dynamic", engine8b, batch_size=2,
                      max_queue_delay_s=1.0)
    np.testing.assert_allclose(res.requests["scheduled_s"], [0.001, 0.001, 1.002, 6.0], rtol=1e-12)


def test_static_batch_is_cut_by_the_padded_kv_reservation(engine8b):
    """Five requests of 100 + 29 tokens, batch size 4, 20 usable blocks of 16 tokens. Each row reserves
    ceil(128 / 16) = 8 blocks, so a batch holds two rows (16 blocks; a third would need 24): batches of 2, 2
    and 1, each starting when the one before is released."""
    res = bl.simulate(reqs([100] * 5, [29] * 5), "static", engine8b, batch_size=4, num_kv_blocks=21, block_size=16)
    df = res.requests
    sched = df["scheduled_s"].to_numpy()
    assert sched[0] == sched[1] == 0.0 and sched[2] == sched[3] and sched[4] > sched[3] > 0
    np.testing.assert_array_equal(sched[[2, 4]], df["release_s"].to_numpy()[[0, 2]])  # back to back
    assert (res.steps["kv_blocks_used"] <= 16).all() and res.steps["kv_blocks_used"].max() == 16
    # One batch of two rows: a prefill step of 2 x 100 tokens, then 28 decode steps.
    assert len(res.steps) == 3 * 29


def test_preempted_request_whose_recompute_exceeds_the_budget_is_rejected(engine8b):
    """REJECT_RECOMPUTE. Chunking and prefix caching off, budget 64, 40 usable blocks of 4 tokens (160 tokens),
    two requests of 60 + 40 tokens. Step 0 admits request 0 (request 1's 60 do not fit the 4 left); step 1
    admits request 1 beside request 0's decode. At step k >= 2 request 0 holds 60 + k tokens and request 1
    59 + k: at step 21, 81 + 80 tokens need 21 + 20 = 41 blocks, so request 1 (the last admitted) is
    preempted, having emitted 20 tokens. Recomputing its 60 + 20 = 80 tokens can never fit one iteration of 64
    without chunking, so it is rejected with that reason, while request 0 completes all 40 tokens."""
    res = bl.simulate(reqs([60, 60], [40, 40]), "chunked", engine8b, block_size=4, num_kv_blocks=41,
                      max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=False, max_model_len=0,
                      enable_prefix_caching=False, async_scheduling=False, record_schedule=True)
    s = res.schedule
    assert s[s["kind"] == "preempt"][["step", "request"]].values.tolist() == [[21, 1]]
    assert step(res, 0) == {0: 60} and step(res, 1) == {0: 1, 1: 60}
    df = res.requests
    assert df["rejected"].tolist() == [False, True] and df["preemptions"].tolist() == [0, 1]
    assert res.raw.reject_code.tolist() == [0, REJECT_RECOMPUTE]
    assert "preempted, and recomputing its prompt plus output exceeds max_num_batched_tokens=64" in \
        df["reject_reason"].iloc[1]
    assert df["computed_tokens"].tolist() == [99, 79]  # 60 + 40 - 1; 60 + 19 decodes before the preemption
    assert s[s["request"] == 1]["step"].max() == 21  # never scheduled again
    # With chunking on, the same preemption is survived: the recomputation is split over iterations.
    chunked = bl.simulate(reqs([60, 60], [40, 40]), "chunked", engine8b, block_size=4, num_kv_blocks=41,
                          max_num_seqs=4, max_num_batched_tokens=64, max_model_len=0, enable_prefix_caching=False,
                          async_scheduling=False)
    assert chunked.summary()["completed"] == 2 and chunked.summary()["preemptions"] >= 1
