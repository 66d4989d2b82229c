"""Hand-worked scheduling cases whose answer can be stated in a sentence."""
import numpy as np
import pytest

import batchlab as bl
from batchlab.result import PROGRESS_GUARD


@pytest.fixture(scope="module")
def cost8b(engine8b):
    """Hand-worked cases are stated in whole steps: the engine without the serving terms (conftest)."""
    return engine8b


def test_static_with_equal_lengths_has_no_padding(cost8b):
    r = bl.Requests(np.zeros(12), [500] * 12, [100] * 12)
    s = bl.simulate(r, "static", cost8b, batch_size=4).summary()
    assert s["padding_fraction"] == 0.0
    # Each batch of four holds two outputs of 100 and two of 300: two rows pad 200 decode tokens each (400) out of
    # 4 x (500 + 300 - 1) = 3,196 token slots, in each of the three batches.
    r2 = bl.Requests(np.zeros(12), [500] * 12, [100, 300] * 6)
    res2 = bl.simulate(r2, "static", cost8b, batch_size=4)
    assert res2.summary()["padding_fraction"] == pytest.approx(400 / 3196, rel=1e-12)
    assert res2.requests["padded_tokens"].tolist() == [200, 0] * 6


def test_static_one_long_output_holds_five_short_ones_hostage(cost8b):
    r = bl.Requests(np.zeros(6), [100] * 6, [2000] + [100] * 5)
    res = bl.simulate(r, "static", cost8b, batch_size=6)
    steps, df = res.steps, res.requests
    assert len(steps) == 1 + 1999  # one prefill, then decode until the longest output ends
    assert (steps.running == 6).all()  # all six slots stay occupied to the end
    assert df.release_s.nunique() == 1 and df.release_s.iloc[0] == df.finish_s.iloc[0]
    ends = (steps.start_s + steps.duration_s).to_numpy()
    np.testing.assert_allclose(df.finish_s.iloc[1:], ends[99])  # short ones are done at step 100 ...
    assert (df.release_s.iloc[1:] == df.finish_s.iloc[0]).all()  # ... but held until the long one ends
    assert (df.release_s.iloc[1:] > 10 * df.finish_s.iloc[1:]).all()
    # padding: 5 rows x 1900 tail tokens out of 6 x (100 + 2000 - 1) slots
    assert res.summary()["padding_fraction"] == pytest.approx(5 * 1900 / (6 * 2099))


def test_dynamic_dispatches_on_the_timer_at_low_load(cost8b):
    r = bl.Requests([0.0, 1.0], [10, 10], [5, 5])
    res = bl.simulate(r, "dynamic", cost8b, batch_size=8, max_queue_delay_s=0.02)
    np.testing.assert_allclose(res.requests.scheduled_s, [0.02, 1.02])
    static = bl.simulate(r, "static", cost8b, batch_size=8)
    np.testing.assert_allclose(static.requests.scheduled_s, [1.0, 1.0])  # waits for the stream to end


def _decoders_then_big_prompt(n_dec=4, big=8000, at=0.5):
    arrival = [0.0] * n_dec + [at]
    return bl.Requests(arrival, [100] * n_dec + [big], [400] * n_dec + [10])


def test_chunked_never_leaves_a_decode_out_of_a_prefill_step(cost8b):
    r = _decoders_then_big_prompt()
    res = bl.simulate(r, "chunked", cost8b, max_num_batched_tokens=512, max_num_seqs=256, record_schedule=True)
    sched = res.schedule
    chunk_steps = sched[(sched.request == 4) & (sched.kind == "prefill")].step.unique()
    assert len(chunk_steps) == int(np.ceil(8000 / 508))  # 4 decodes + 508 prompt tokens per step
    for s in chunk_steps:
        rows = sched[sched.step == s]
        assert set(rows[rows.kind == "decode"].request) == {0, 1, 2, 3}
        assert rows.tokens.sum() <= 512


def test_orca_step_that_admits_a_long_prompt_lasts_the_whole_prefill(cost8b):
    r = _decoders_then_big_prompt()
    res = bl.simulate(r, "continuous", cost8b, record_schedule=True)
    sched, steps = res.schedule, res.steps
    s = sched[(sched.request == 4) & (sched.kind == "prefill")].step.item()
    ctx = sched[(sched.step == s) & (sched.kind == "decode")]
    assert len(ctx) == 4
    # The step is the 8,000-token prefill plus the four decodes, each at context 100 + s - 1 (its prompt and the
    # s - 1 tokens decoded since the prefill step 0): both sides of the bound, to the last bit.
    assert steps.duration_s[s] == pytest.approx(
        cost8b.step_time([(8000, 0)], [100 + s - 1] * 4, asynchronous=False), rel=1e-12)
    assert steps.duration_s[s] > cost8b.prefill_time(8000)
    # The decoders' inter-token gap across that step is the whole step.
    gaps = np.diff(res.token_times[0])
    assert gaps.max() == pytest.approx(steps.duration_s[s])
    # vLLM V0 order: that step runs prefill only, then decoders resume.
    v0 = bl.simulate(r, "continuous", cost8b, prefill_only_steps=True, record_schedule=True)
    s0 = v0.schedule
    k = s0[(s0.request == 4) & (s0.kind == "prefill")].step.item()
    assert set(s0[s0.step == k].request) == {4}
    assert v0.steps.duration_s[k] == pytest.approx(cost8b.prefill_time(8000))


def test_a_step_that_preempts_admits_nobody(cost8b):
    # Two requests grow until the pool is full; a third waits. The preempting step must not admit it.
    r = bl.Requests([0.0, 0.0, 0.001], [16, 16, 4], [40, 40, 4])
    res = bl.simulate(r, "chunked", cost8b, block_size=4, num_kv_blocks=20, max_num_batched_tokens=64,
                      max_num_seqs=8, max_model_len=64, record_schedule=True)
    sched = res.schedule
    pre_steps = sched[sched.kind == "preempt"].step.unique()
    assert len(pre_steps) > 0
    first_seen = sched[sched.kind != "preempt"].groupby("request").step.min()
    for s in pre_steps:
        assert s not in set(first_seen.values), "a request was admitted in a step that preempted"
    assert res.summary()["completed"] == 3


def test_preempted_request_recomputes_prompt_and_output(cost8b):
    r = bl.Requests([0.0, 0.0], [16, 16], [40, 40])
    res = bl.simulate(r, "chunked", cost8b, block_size=4, num_kv_blocks=20, max_num_batched_tokens=64,
                      max_num_seqs=8, max_model_len=64, enable_prefix_caching=False, record_schedule=True)
    df = res.requests
    victim = df.preemptions.idxmax()
    assert df.preemptions[victim] >= 1
    assert df.recomputed_tokens[victim] > df.prompt_tokens[victim]  # the prompt plus tokens it had produced
    sched = res.schedule
    resumed = sched[(sched.request == victim) & (sched.kind == "prefill")].tokens.iloc[-1]
    assert resumed > 16


def test_chunking_disabled_stops_at_a_prompt_that_does_not_fit(cost8b):
    # vLLM 0.33 (PR #28911): a waiting request that does not fit the budget left stops admission; nobody
    # behind it jumps the queue. A (60) goes in step 0; B (60 > 40 left) stops it there, so C waits too.
    r = bl.Requests([0, 0, 0, 0, 0.001], [60, 60, 30, 60, 50], [5] * 5)
    res = bl.simulate(r, "chunked", cost8b, max_num_batched_tokens=100, max_num_seqs=100, max_model_len=100,
                      enable_chunked_prefill=False, record_schedule=True)
    sched = res.schedule
    first_step = sched[sched.kind == "prefill"].groupby("request").step.min()
    assert first_step[0] == 0 and first_step[1] > 0 and first_step[2] >= first_step[1]  # arrival order kept
    assert first_step.is_monotonic_increasing


def test_rejections_are_recorded_with_a_reason(cost8b):
    r = bl.Requests([0, 0, 0], [100, 5000, 100], [10, 10, 10])
    res = bl.simulate(r, "continuous", cost8b, max_num_batched_tokens=4096)
    df = res.requests
    assert df.rejected.tolist() == [False, True, False]
    assert "max_num_batched_tokens=4096" in df.reject_reason[1]
    tiny = bl.simulate(r, "chunked", cost8b, num_kv_blocks=10, max_model_len=0)
    assert "KV blocks" in tiny.requests.reject_reason[1]
    assert tiny.requests.rejected.tolist() == [False, True, False]
    short = bl.simulate(r, "chunked", cost8b, num_kv_blocks=10, max_model_len=144)
    assert "leaves no room for one output token under max_model_len=144" in short.requests.reject_reason[1]


@pytest.mark.parametrize("policy", bl.POLICIES)
def test_request_latency_delays_the_engine_not_the_clock(cost8b, policy):
    """A lone request: with the serving latency the engine sees it that much later, so its TTFT and E2E grow by
    exactly the latency while its TPOT and the steps stay the same; it still counts as sent at its arrival."""
    r = bl.Requests([0.0], [300], [20])
    base = bl.simulate(r, policy, cost8b)
    late = bl.simulate(r, policy, cost8b.replace(request_latency_s=0.25))
    for col in ("ttft_s", "e2el_s"):
        assert late.requests[col].iloc[0] == pytest.approx(base.requests[col].iloc[0] + 0.25, rel=1e-12)
    assert late.requests["tpot_s"].iloc[0] == pytest.approx(base.requests["tpot_s"].iloc[0], rel=1e-12)
    assert late.requests["sent_s"].iloc[0] == 0.0
    np.testing.assert_allclose(late.steps["duration_s"], base.steps["duration_s"])


def test_closed_loop_client_waits_for_the_latency_each_time(cost8b):
    """One client, two requests: the second is sent when the first finishes, and reaches the engine the latency
    later, so the engine idles that long between them."""
    r = bl.Requests([0.0, 0.0], [300, 300], [10, 10])
    res = bl.simulate(r, "chunked", cost8b.replace(request_latency_s=0.1), max_concurrency=1)
    df = res.requests
    assert df["sent_s"].iloc[1] == pytest.approx(df["finish_s"].iloc[0], rel=1e-12)
    steps = res.steps
    first_of_second = steps["start_s"].to_numpy()[steps["start_s"].to_numpy() > df["finish_s"].iloc[0] - 1e-12][0]
    assert first_of_second == pytest.approx(df["finish_s"].iloc[0] + 0.1, rel=1e-9)


def test_api_server_spreads_a_burst(cost8b):
    """Four requests sent together: the API server tokenises one at a time, so the engine sees them 1000 x
    frontend_s_per_token apart (plus the fixed latency), and the first one's TTFT is the shortest."""
    r = bl.Requests(np.zeros(4), [1000] * 4, [5] * 4)
    cost = cost8b.replace(frontend_s_per_token=1e-5, request_latency_s=0.02)
    res = bl.simulate(r, "chunked", cost, async_scheduling=False)
    first_step = res.steps["start_s"].iloc[0]
    assert first_step == pytest.approx(0.01 + 0.02, rel=1e-12)  # the first request is through after 10 ms + 20 ms
    ttft = res.requests["ttft_s"].to_numpy()
    assert (np.diff(ttft) >= 0).all() and ttft[-1] > ttft[0]


@pytest.mark.parametrize("knobs", [
    {"max_num_seqs": 64, "max_num_batched_tokens": 512},
    # Chunking off with a small pool: preemptions whose recomputation may not fit, so gaps are held back.
    {"max_num_seqs": 64, "max_num_batched_tokens": 8192, "max_model_len": 8192, "enable_chunked_prefill": False,
     "num_kv_blocks": 900},
], ids=["chunked", "unchunked-small-pool"])
def test_records_that_outgrow_their_first_room_keep_every_row(cost8b, knobs):
    """The loop writes its records in place and stops to grow them when one has no room for an iteration
    (engine.advance): a run of several thousand iterations and schedule rows, past the first 1,024 of each,
    keeps every one, each consistent with the others."""
    reqs = bl.synthetic(400, 600, 200, prompt_cv=1.0, output_cv=1.0, rate_req_s=50.0, seed=3)
    res = bl.simulate(reqs, "chunked", cost8b, record_schedule=True, **knobs)
    steps, sched = res.steps, res.schedule
    assert len(steps) == res.n_steps > 1024 and len(sched) > 3 * 1024
    np.testing.assert_array_equal(np.unique(sched.step), np.arange(res.n_steps))  # every iteration schedules
    ran = sched[sched.kind.isin(["prefill", "decode"])].groupby("step")
    np.testing.assert_array_equal(ran.tokens.sum().to_numpy(), steps.prefill_tokens + steps.decode_seqs)
    np.testing.assert_array_equal(ran.kind.apply(lambda k: (k == "decode").sum()).to_numpy(), steps.decode_seqs)
    ends = (steps.start_s + steps.duration_s).to_numpy()
    assert np.all(np.diff(steps.start_s) > 0) and np.all(steps.start_s.to_numpy()[1:] >= ends[:-1])
    served = np.flatnonzero(res.requests.reject_reason.isna().to_numpy())
    tokens = res.token_times
    for r in served:  # every token is the end of an iteration, the last one the request's finish
        assert np.isin(tokens[r], ends).all() and np.all(np.diff(tokens[r]) >= 0)
        assert tokens[r][-1] == res.requests.finish_s.iloc[r]
    if not knobs.get("enable_chunked_prefill", True):
        assert (sched.kind == "preempt").any()


_PLANTED_WHOLE_HIT = """
import batchlab as bl
from batchlab._kernels import kvcache

real = kvcache.longest_hit
# the bug: a prefix hit may cover the whole prompt (vLLM caps it at num_tokens - 1), so the second request has
# nothing to compute and, without the guard, the loop would schedule it forever
kvcache.longest_hit = lambda req, r, n_tokens, *rest: real(req, r, n_tokens + 1, *rest)
reqs = bl.Requests([0.0, 5.0], [32, 32], [4, 4], prefix_blocks=[[1, 2], [1, 2]])
cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))
try:
    bl.simulate(reqs, "chunked", cost, record_tokens=False)
except RuntimeError as e:
    print(e)
else:
    print("no error")
"""


def test_a_loop_that_cannot_progress_fails_fast_naming_its_guard():
    """With the prefix-hit cap planted away (kernels as plain Python, so the planted function is the one called),
    the second of two identical 32-token prompts finds both blocks cached and has nothing to compute: the loop's
    progress guard stops it at the first iteration that computes no token, and simulate names the guard, instead
    of the loop spinning until the test runner is killed."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    done = subprocess.run([sys.executable, "-c", _PLANTED_WHOLE_HIT], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == PROGRESS_GUARD, done.stdout
