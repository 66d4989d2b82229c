"""The jitted loop agrees with the plain-Python reference in tests/reference.py, request by request."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import batchlab as bl
from reference import reference_simulate
from strategies import knobs, shared_prefix_streams, streams


def _compare(requests, policy, cost, k):
    res = bl.simulate(requests, policy, cost, **{key: v for key, v in k.items() if v is not None})
    ref_kwargs = dict(k)
    if ref_kwargs.get("max_num_batched_tokens") is None:
        ref_kwargs["max_num_batched_tokens"] = 0
    ref_kwargs["max_concurrency"] = ref_kwargs.get("max_concurrency") or 0
    if policy == "chunked":
        for switch in ("async_scheduling", "enable_prefix_caching", "scheduler_reserve_full_isl"):
            ref_kwargs.setdefault(switch, True)
        ref_kwargs.setdefault("max_model_len", cost.model.max_position_embeddings)
        ref_kwargs["vllm_033"] = True
    ref = reference_simulate(requests, policy, cost, **ref_kwargs)
    df = res.requests
    np.testing.assert_array_equal(df["rejected"].to_numpy(), [r.rejected for r in ref])
    np.testing.assert_allclose(df["first_token_s"].to_numpy(), [np.nan if r.rejected else r.first for r in ref],
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(df["finish_s"].to_numpy(), [np.nan if r.rejected else r.finish for r in ref],
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(df["preemptions"].to_numpy(), [r.preemptions for r in ref])
    np.testing.assert_allclose(df["sent_s"].to_numpy(), [r.sent for r in ref], rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(df["cached_tokens"].to_numpy(), [r.cached for r in ref])
    for times, r in zip(res.token_times, ref):
        if not r.rejected:
            np.testing.assert_allclose(times, r.token_times, rtol=1e-9, atol=1e-12)
    return res


@pytest.mark.parametrize("policy", bl.POLICIES)
@settings(max_examples=120)
@given(data=st.data())
def test_kernel_matches_reference(cost8b, policy, data):
    requests = data.draw(streams())
    k = data.draw(knobs(policy))
    _compare(requests, policy, cost8b, k)


@pytest.mark.parametrize("policy", bl.POLICIES)
@settings(max_examples=60)
@given(data=st.data())
def test_kernel_matches_reference_with_serving_terms(cost8b, policy, data):
    """Request latency, the one-at-a-time API server, CPU per step and per sequence, and async overlap: the same
    in the loop and the reference."""
    cost = cost8b.replace(
        request_latency_s=data.draw(st.floats(0.0, 0.2)), frontend_s_per_token=data.draw(st.floats(0.0, 1e-4)),
        cpu_step_s=data.draw(st.floats(0.0, 0.02)),
        cpu_seq_s=data.draw(st.floats(0.0, 1e-3)), cpu_hidden_fraction=data.draw(st.floats(0.0, 1.0)))
    requests = data.draw(streams())
    _compare(requests, policy, cost, data.draw(knobs(policy)))


@settings(max_examples=150)
@given(data=st.data())
def test_kernel_matches_reference_with_shared_prefixes(cost8b, data):
    requests = data.draw(shared_prefix_streams())
    k = data.draw(knobs("chunked", blocks=(20, 600)))
    k["enable_prefix_caching"] = True
    res = _compare(requests, "chunked", cost8b, k)
    hits = res.requests["cached_tokens"].to_numpy()
    assert (hits % k["block_size"] == 0).all() and (hits < res.requests["prompt_tokens"].to_numpy() + 1).all()


@pytest.mark.parametrize("policy", bl.POLICIES)
def test_kernel_matches_reference_on_a_larger_realistic_stream(cost8b, policy):
    requests = bl.synthetic(300, 600, 120, prompt_cv=1.0, output_cv=1.0, rate_req_s=30.0, seed=7)
    k = {"block_size": 16, "num_kv_blocks": 700}
    if policy in ("static", "dynamic"):
        k["batch_size"] = 16
    else:
        k["max_num_seqs"] = 64
    if policy == "chunked":
        k["max_num_batched_tokens"] = 512
    res = _compare(requests, policy, cost8b, k)
    if policy == "chunked":
        assert res.summary()["preemptions"] > 0  # the pool is small enough to exercise preemption
