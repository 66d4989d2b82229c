"""vLLM 0.33's scheduler rules (DESIGN section 4c), each pinned by a hand-worked case.

Cases named after a vLLM test transcribe it (``tests/v1/core/test_scheduler.py`` of vLLM 0.33.0): the same
requests and knobs, and the assertion it makes, read off ``res.schedule``. The others are worked by hand in
their comments. Every request arrives at 0 unless said otherwise.
"""
from __future__ import annotations

import numpy as np
import pytest

import batchlab as bl

SYNC = {"async_scheduling": False}
OFF = {"async_scheduling": False, "enable_prefix_caching": False, "scheduler_reserve_full_isl": False}


@pytest.fixture(scope="module")
def cost8b(engine8b):
    """Hand-worked cases are stated in whole steps: the engine without the serving terms (conftest)."""
    return engine8b


def step(res, index: int) -> dict[int, int]:
    """Request -> tokens scheduled in iteration ``index``."""
    s = res.schedule
    s = s[(s["step"] == index) & (s["kind"] != "preempt")]
    return dict(zip(s["request"].tolist(), s["tokens"].tolist()))


def requests(prompts, outputs, arrivals=None):
    n = len(prompts)
    return bl.Requests(np.zeros(n) if arrivals is None else arrivals, prompts, outputs)


@pytest.mark.parametrize("enable_chunked_prefill", [True, False])
def test_schedule_order(cost8b, enable_chunked_prefill):
    # vLLM test_schedule_order: budget 1024, 3 seats; two 800-token prompts, then two of 10 tokens.
    reqs = requests([800, 800, 10, 10], [4] * 4)
    res = bl.simulate(reqs, "chunked", cost8b, max_num_batched_tokens=1024, max_num_seqs=3, max_model_len=1024,
                      enable_chunked_prefill=enable_chunked_prefill, record_schedule=True)
    if enable_chunked_prefill:  # the second long prompt is chunked into what is left: 224 tokens
        assert step(res, 0) == {0: 800, 1: 224}
    else:  # the second does not fit the 224 left and stops admission; the short ones behind it do not jump
        assert step(res, 0) == {0: 800}


def test_long_prefill_threshold_ignored_when_alone(cost8b):
    # vLLM test_long_prefill_threshold_ignored_when_alone: nobody to starve, the whole budget.
    res = bl.simulate(requests([2000], [2]), "chunked", cost8b, max_num_batched_tokens=1024,
                      long_prefill_token_threshold=400, record_schedule=True)
    assert step(res, 0) == {0: 1024}


def test_long_prefill_threshold_applies_with_other_requests(cost8b):
    # vLLM test_long_prefill_threshold_applies_with_other_requests.
    res = bl.simulate(requests([2000, 10], [2, 2]), "chunked", cost8b, max_num_batched_tokens=1024,
                      long_prefill_token_threshold=400, record_schedule=True)
    assert step(res, 0) == {0: 400, 1: 10}


@pytest.mark.parametrize("reserve", [True, False])
def test_full_prompt_reservation_under_kv_pressure(cost8b, reserve):
    # 10 usable blocks of 16 tokens, budget 100. Step 0: the 80-token prompt takes 5 blocks, 20 tokens of budget
    # are left. The 100-token prompt's first chunk (20 tokens) needs 2 blocks, which are free, but its whole
    # prompt needs 7 and only 5 are: with the reservation it waits; without it, it starts.
    res = bl.simulate(requests([80, 100], [2, 2]), "chunked", cost8b, num_kv_blocks=11, block_size=16,
                      max_num_batched_tokens=100, max_num_seqs=4, max_model_len=160, async_scheduling=False,
                      scheduler_reserve_full_isl=reserve, record_schedule=True)
    assert step(res, 0) == ({0: 80} if reserve else {0: 80, 1: 20})


@pytest.mark.parametrize("caching", [True, False])
def test_preemption_and_resume(cost8b, caching):
    # 8 usable blocks of 4 tokens, two requests of 8 prompt + 12 output tokens. Step 0: 2 blocks each; the
    # 3rd, 4th and 5th blocks come at steps 1, 5 and 9. At step 9 the first request needs its 5th block and none
    # is free: the last running request (1, with 16 tokens computed in 4 blocks) is preempted. Its blocks join
    # the free queue's tail, last block first, so the first request's new block evicts its 4th. Request 0
    # finishes at step 11; at step 12 request 1 comes back with 8 + 9 = 17 tokens to know: with prefix caching
    # it finds its first 3 blocks (12 tokens) and computes 5, without it all 17. Either way it finishes at 14.
    res = bl.simulate(requests([8, 8], [12, 12]), "chunked", cost8b, num_kv_blocks=9, block_size=4,
                      max_num_batched_tokens=64, max_num_seqs=2, max_model_len=32, async_scheduling=False,
                      scheduler_reserve_full_isl=False, enable_prefix_caching=caching, record_schedule=True)
    s = res.schedule
    assert s[s["kind"] == "preempt"][["step", "request"]].values.tolist() == [[9, 1]]
    assert step(res, 12) == {1: 5 if caching else 17}
    assert s[s["request"] == 1]["step"].max() == 14
    r = res.requests.loc[1]
    assert r["preemptions"] == 1
    assert r["computed_tokens"] == (16 + 5 + 2 if caching else 16 + 17 + 2)
    assert r["recomputed_tokens"] == (4 if caching else 16)  # positions 12-15 again, or all 16


def test_prefix_hit_never_covers_the_last_token(cost8b):
    # Two identical 32-token prompts (two 16-token blocks with the same ids). The second finds both blocks cached
    # but must recompute the last token to get logits: vLLM caps the hit at 31 tokens, so one block (16).
    reqs = bl.Requests([0.0, 1.0], [32, 32], [2, 2], prefix_blocks=[[7, 8], [7, 8]], prefix_block_tokens=16)
    res = bl.simulate(reqs, "chunked", cost8b, record_schedule=True)
    assert res.requests["cached_tokens"].tolist() == [0, 16]
    second = res.schedule[(res.schedule["request"] == 1) & (res.schedule["kind"] == "prefill")]
    assert second["tokens"].tolist() == [16]
    assert res.summary()["prefix_cache_hit_rate"] == pytest.approx(16 / 64)


def test_shared_prefix_is_found_block_by_block(cost8b):
    # Ids of 64 tokens: the second prompt shares the first two ids (128 tokens = 8 blocks of 16), then differs.
    reqs = bl.Requests([0.0, 1.0], [200, 200], [2, 2], prefix_blocks=[[1, 2, 3, 4], [1, 2, 9, 9]],
                       prefix_block_tokens=64)
    res = bl.simulate(reqs, "chunked", cost8b)
    assert res.requests["cached_tokens"].tolist() == [0, 128]
    off = bl.simulate(reqs, "chunked", cost8b, enable_prefix_caching=False)
    assert off.requests["cached_tokens"].tolist() == [0, 0]


def test_async_scheduling_holds_a_finished_seat_one_step(cost8b):
    # Two seats: request 0 (2 output tokens) and 1 (10) start at step 0; request 2 waits. Request 0 finishes in
    # step 1. Synchronous: its seat frees at the end of step 1 and request 2 starts at step 2. Async: step 2 was
    # planned when step 1 started, with request 0 still holding its seat, so request 2 starts at step 3.
    reqs = requests([16, 16, 16], [2, 10, 4])
    for asynchronous, start in ((False, 2), (True, 3)):
        res = bl.simulate(reqs, "chunked", cost8b, max_num_seqs=2, max_num_batched_tokens=64,
                          async_scheduling=asynchronous, record_schedule=True)
        s = res.schedule
        assert s[s["request"] == 2]["step"].min() == start
        if asynchronous:
            assert step(res, 2) == {1: 1} and res.steps.loc[2, "running"] == 2  # the finished one still counted


def test_async_scheduling_sees_an_arrival_one_step_later(cost8b):
    # Request 0 decodes alone; request 1 arrives during step 1. Synchronous: it is scheduled in step 2, planned
    # when step 1 ends. Async: step 2 was planned when step 1 started, before it arrived, so it starts at step 3.
    probe = bl.simulate(requests([64], [50]), "chunked", cost8b, async_scheduling=False)
    t0, t1 = probe.steps.loc[1, ["start_s", "duration_s"]]
    reqs = requests([64, 64], [50, 2], arrivals=np.array([0.0, t0 + t1 / 2]))
    for asynchronous, start in ((False, 2), (True, 3)):
        res = bl.simulate(reqs, "chunked", cost8b, async_scheduling=asynchronous, record_schedule=True)
        s = res.schedule
        assert s[s["request"] == 1]["step"].min() == start


def test_async_scheduling_plans_again_when_its_early_plan_is_empty(cost8b):
    # One seat: request 0 finishes at step 1, which would leave the plan for step 2 empty; the engine then waits
    # for step 1 and plans with request 0 gone, so request 1 starts at step 2 either way.
    reqs = requests([16, 16], [2, 2])
    for asynchronous in (False, True):
        res = bl.simulate(reqs, "chunked", cost8b, max_num_seqs=1, max_num_batched_tokens=64,
                          async_scheduling=asynchronous, record_schedule=True)
        assert step(res, 2) == {1: 16}


def test_max_model_len_rejects_and_clips(cost8b):
    res = bl.simulate(requests([100, 8192, 8000], [10, 5, 500]), "chunked", cost8b, max_model_len=8192)
    df = res.requests
    assert df["rejected"].tolist() == [False, True, False]
    assert "max_model_len=8192" in df.loc[1, "reject_reason"]
    assert df["output_tokens"].tolist() == [10, 5, 192]  # 8000 + 192 = 8192: the context is full
    assert len(res.token_times[2]) == 192


def test_closed_loop_sends_when_a_slot_frees(cost8b):
    # Four requests all at 0, one client: each is sent when the previous answer is complete, and its latencies
    # count from then.
    res = bl.simulate(requests([64] * 4, [8] * 4), "chunked", cost8b, max_concurrency=1)
    df = res.requests
    np.testing.assert_array_equal(df["sent_s"].to_numpy()[1:], df["finish_s"].to_numpy()[:-1])
    np.testing.assert_allclose(df["ttft_s"], df["first_token_s"] - df["sent_s"])
    assert (res.steps["running"] == 1).all()
    two = bl.simulate(requests([64] * 4, [8] * 4), "chunked", cost8b, max_concurrency=2)
    assert two.steps["running"].max() == 2 and (two.requests["sent_s"].to_numpy()[:2] == 0).all()


def test_vllm_033_defaults(cost8b, h100):
    res = bl.simulate(requests([16], [2]), "chunked", cost8b)
    k = res.knobs
    assert bl.VLLM_VERSION == "0.33.0"
    assert k["async_scheduling"] and k["enable_prefix_caching"] and k["scheduler_reserve_full_isl"]
    assert k["enable_chunked_prefill"] and k["max_model_len"] == 8192
    assert k["num_kv_blocks"] == cost8b.kv_pool_blocks(0.92, 16, 8192, 1024)
    big = h100._replace(name="b200-like", hbm_bytes=180 * 1024**3)
    assert bl.vllm_defaults(big) == {"max_num_seqs": 1024, "max_num_batched_tokens": 16384}


def test_kv_pool_matches_the_published_llama2_7b_pool(h100):
    # inference-sim's golden dataset: 7,463 blocks for Llama-2-7B on one H100 at 0.9, 2048 tokens, 128 seqs.
    cost = bl.CostModel(h100, bl.get_model("llama-2-7b"))
    assert cost.kv_pool_blocks(0.9, 16, 2048, 128) == 7463
    assert cost.kv_pool_blocks(0.92, 16, 2048, 128) > 7463  # more memory, more blocks
    assert cost.kv_pool_blocks(0.9, 16, 8192, 1024) < 7463  # a bigger profiling step reserves more


@pytest.mark.parametrize(("knobs", "message"), [
    ({"max_num_batched_tokens": 512, "max_num_seqs": 1024}, "max_num_batched_tokens .512. must be >= max_num_seqs"),
    ({"num_kv_blocks": 100}, "cannot hold one request of max_model_len=8192"),
    ({"enable_chunked_prefill": False, "max_num_batched_tokens": 4096},
     "enable_chunked_prefill=False, max_num_batched_tokens .4096. must be >= max_model_len"),
    ({"max_concurrency": 0}, "max_concurrency must be an integer from 1"),
    ({"max_model_len": 1}, "max_model_len must be an integer from 2"),
    ({"async_scheduling": "no"}, "async_scheduling must be True or False"),
])
def test_configurations_vllm_refuses(cost8b, knobs, message):
    with pytest.raises(ValueError, match=message):
        bl.simulate(requests([16], [2]), "chunked", cost8b, **knobs)


def test_new_knobs_belong_to_chunked(cost8b):
    for knob in ("async_scheduling", "enable_prefix_caching", "scheduler_reserve_full_isl", "max_model_len",
                 "max_concurrency"):
        with pytest.raises(ValueError, match=f"{knob} applies to policy chunked"):
            bl.simulate(requests([16], [2]), "continuous", cost8b, **{knob: 1})


@pytest.mark.parametrize(("blocks", "message"), [
    ([[1, 2]], "one sequence of block ids per request .2., got 1 sequences"),
    ([[1], [2], [3]], "one sequence of block ids per request .2., got 3 sequences"),
    ("ab", "one sequence of block ids per request"),
    ([[1.5], [2]], r"prefix_blocks\[0\] must be a one-dimensional sequence of integer ids"),
    ([[1], [-2]], r"prefix_blocks\[1\] must hold ids >= 0"),
    ([[1, 2, 3], [1]], r"prefix_blocks\[0\] has 3 ids of 16 tokens, more than its prompt and output"),
])
def test_bad_prefix_blocks(blocks, message):
    with pytest.raises(ValueError, match=message):
        bl.Requests([0.0, 0.0], [20, 20], [2, 2], prefix_blocks=blocks, prefix_block_tokens=16)


def test_prefix_blocks_follow_sorting_and_slicing():
    reqs = bl.from_frame(__import__("pandas").DataFrame({"t": [2.0, 1.0], "p": [40, 20], "o": [2, 2],
                                                         "ids": [[5, 6], [7]]}), "t", "p", "o", prefix_blocks="ids")
    assert [list(x) for x in reqs.prefix_blocks] == [[7], [5, 6]]
    assert [list(x) for x in reqs.head(1).prefix_blocks] == [[7]]
    assert [list(x) for x in reqs.scale_time(2.0).prefix_blocks] == [[7], [5, 6]]
    with pytest.raises(ValueError, match="prefix_block_tokens must be an integer from 1"):
        bl.Requests([0.0], [4], [1], prefix_blocks=[[1]], prefix_block_tokens=0)


def test_the_notation_page_names_the_vllm_version():
    from pathlib import Path
    page = (Path(__file__).resolve().parents[1] / "book" / "notation.md").read_text()
    # glued from the one constant, with its date, never typed: the built page then reads "vLLM 0.33.0, released on ..."
    assert 'glue("vllm_version", bl.VLLM_VERSION' in page and 'glue("vllm_date", bl.VLLM_RELEASED' in page
    assert "**vLLM {glue:text}`vllm_version`**, released on\n{glue:text}`vllm_date`" in page
    assert bl.VLLM_VERSION not in page.split("## Which vLLM")[1].split("**If you run vLLM")[0]
