"""Several engines in one simulation (batchlab.fleet): replicas behind a router, disaggregated prefill and decode.

Checks: one replica is ``simulate`` bit for bit (several workloads and knob sets); every request is served once,
by the engine that holds its KV; KV transfers take kv_bytes_per_token x prompt / bandwidth (+ latency); the
routers do what they say. Relations only: nothing here depends on the calibrated efficiencies.
"""
from __future__ import annotations

import numpy as np
import pytest

import batchlab as bl


@pytest.fixture(scope="module")
def cost():
    return bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))


WORKLOADS = {
    "synthetic": lambda: bl.synthetic(400, 900, 150, prompt_cv=1.0, output_cv=1.0, rate_req_s=20.0, seed=1),
    "multi_turn": lambda: bl.multi_turn(40, 4, 600, 120, 80, rate_req_s=4.0, turn_gap_s=2.0, seed=2),
    "shared_prefix": lambda: bl.shared_prefix(300, 4, 5, 1000, 100, 60, rate_req_s=30.0, seed=3),
    "burst": lambda: bl.synthetic(200, 1500, 100, prompt_cv=0.5, output_cv=0.5, seed=4),  # all at t = 0
}
KNOBS = {
    "defaults": {},
    "sync": {"async_scheduling": False},
    "small_budget_no_cache": {"enable_prefix_caching": False, "max_num_seqs": 32, "max_num_batched_tokens": 512},
    "tiny_pool": {"num_kv_blocks": 700, "max_model_len": 0},  # preemptions
    "no_chunking": {"enable_chunked_prefill": False, "max_num_batched_tokens": 16384, "max_model_len": 8192},
    "threshold": {"long_prefill_token_threshold": 256, "max_num_seqs": 64},
}
FIELDS = ("first_token_s", "finish_s", "scheduled_s", "release_s", "preemptions", "reject_code", "computed_tokens",
          "recomputed_tokens", "cached_tokens", "sent_s", "seen_s", "token_offsets", "token_times_s", "steps",
          "schedule", "itl", "totals")


@pytest.mark.parametrize("knobs", list(KNOBS))
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_one_replica_is_simulate_bit_for_bit(cost, workload, knobs):
    reqs = WORKLOADS[workload]()
    ref = bl.simulate(reqs, "chunked", cost, record_schedule=True, **KNOBS[knobs])
    fleet = bl.simulate_fleet(reqs, cost, 1, record_tokens=True, record_schedule=True, **KNOBS[knobs])
    for field in FIELDS:
        a, b = getattr(fleet.fleet.raw, field), getattr(ref.raw, field)
        assert a.shape == b.shape and np.array_equal(a, b, equal_nan=True), field
    assert fleet.fleet.summary() == ref.summary()
    assert fleet.summary() == {**ref.summary(), "n_gpus": 1}
    # The replica's own view: the requests it saw (those rejected up front reach no engine), all its steps.
    rep, mine = fleet.replica(0), np.flatnonzero(fleet.engine == 0)
    assert np.array_equal(mine, np.flatnonzero(ref.raw.reject_code == 0) if knobs != "tiny_pool" else mine)
    for field in ("steps", "schedule", "itl", "totals"):
        assert np.array_equal(getattr(rep.raw, field), getattr(ref.raw, field), equal_nan=True), field
    for field in ("first_token_s", "finish_s", "preemptions", "cached_tokens"):
        assert np.array_equal(getattr(rep.raw, field), getattr(ref.raw, field)[mine], equal_nan=True), field


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "prefix_aware"])
def test_replicas_serve_every_request_once(cost, router):
    reqs = WORKLOADS["shared_prefix"]()
    fleet = bl.simulate_fleet(reqs, cost, 3, router=router, record_tokens=True)
    assert sorted(np.concatenate([np.flatnonzero(fleet.engine == i) for i in range(3)])) == list(range(len(reqs)))
    table = fleet.summaries()
    assert table["completed"].sum() == fleet.summary()["completed"] == len(reqs)
    assert table["requests"].sum() == len(reqs)
    done = fleet.fleet.requests
    assert np.isfinite(done["finish_s"]).all() and (done["finish_s"] >= done["first_token_s"]).all()
    for i in range(3):  # each replica's tokens come from its own steps
        rep = fleet.replica(i)
        ends = rep.steps["start_s"] + rep.steps["duration_s"]
        assert np.isin(rep.token_times_flat, ends.to_numpy()).all()
    if router == "round_robin":
        assert np.array_equal(fleet.engine, np.arange(len(reqs)) % 3)


def test_least_outstanding_balances_a_burst(cost):
    reqs = bl.fixed(90, 500, 200)  # every request at t = 0: nothing finishes before routing ends
    fleet = bl.simulate_fleet(reqs, cost, 3, router="least_outstanding")
    assert np.bincount(fleet.engine).tolist() == [30, 30, 30]


def test_prefix_aware_routing_finds_more_cache_than_round_robin(cost):
    reqs = bl.shared_prefix(600, 6, 4, 2000, 50, 20, rate_req_s=20.0, seed=5)
    hit = {r: bl.simulate_fleet(reqs, cost, 4, router=r).summary()["prefix_cache_hit_rate"]
           for r in ("round_robin", "prefix_aware")}
    assert hit["prefix_aware"] > hit["round_robin"]
    one = bl.simulate(reqs, "chunked", cost).summary()["prefix_cache_hit_rate"]
    assert hit["prefix_aware"] <= one + 1e-12  # four pools cannot share more than one pool holding everything


@pytest.mark.parametrize("link", ["nvlink", "network"])
def test_disaggregated_conservation_and_transfers(cost, link):
    reqs = bl.synthetic(300, 1200, 120, prompt_cv=1.0, output_cv=1.0, rate_req_s=10.0, seed=6)
    res = bl.simulate_disaggregated(reqs, cost, 2, 3, link=link, record_tokens=True, record_schedule=True,
                                    max_model_len=0)
    out = reqs.output_tokens
    multi = out > 1
    assert (res.engine >= 0).all() and (res.engine < 2).all()
    assert np.array_equal(res.decode_engine >= 2, multi) and (res.decode_engine[~multi] == -1).all()
    roles = res.summaries()
    assert roles.loc[roles.role == "prefill", "completed"].sum() == len(reqs)  # every prompt, once
    assert roles.loc[roles.role == "decode", "completed"].sum() == multi.sum()  # every output, once
    assert res.summary()["completed"] == len(reqs)
    # KV: bytes and seconds as the cost model and the link give them.
    hw = cost.hardware
    bw, lat = ((hw.interconnect_bytes_per_s, hw.interconnect_latency_s) if link == "nvlink"
               else (hw.network_bytes_per_s, hw.network_latency_s))
    t = res.transfers
    prompt = reqs.prompt_tokens[t.index]
    np.testing.assert_allclose(t["kv_bytes"], cost.model.kv_bytes_per_token("bf16") * prompt, rtol=1e-12)
    np.testing.assert_allclose(t["transfer_s"], lat + cost.model.kv_bytes_per_token("bf16") * prompt / bw, rtol=1e-12)
    np.testing.assert_allclose(t["landed_s"] - t["left_s"], t["transfer_s"], rtol=1e-9, atol=1e-12)
    df = res.fleet.requests
    np.testing.assert_array_equal(t["left_s"], df["first_token_s"].to_numpy()[t.index])
    # The decode instance that holds the KV produces the rest, after it lands, never recomputing the prompt.
    for j in range(2, 5):
        rep = res.replica(j)
        mine = np.flatnonzero(res.decode_engine == j)
        sched = rep.schedule
        assert set(sched["request"]) <= set(mine)
        assert not (sched["kind"] == "prefill").any()  # no preemption here, so no prompt is recomputed
        first_step = sched.groupby("request")["step"].min()
        start = rep.steps["start_s"].to_numpy()[first_step.to_numpy()]
        assert (start >= t.loc[first_step.index, "landed_s"].to_numpy() - 1e-12).all()
        np.testing.assert_array_equal(rep.requests["finish_s"].to_numpy(), df["finish_s"].to_numpy()[mine])
    for i in range(2):
        kinds = set(res.replica(i).schedule["kind"])
        assert kinds <= {"prefill", "cached"}
    # Every token: the first from the prefill instance, then one per decode step.
    assert all(len(tt) == n and np.all(np.diff(tt) > 0) for tt, n in zip(res.fleet.token_times, out))


def test_decode_side_waits_for_blocks(cost):
    """A decode pool that holds few requests: they queue there (KV present) and none is lost or recomputed."""
    reqs = bl.fixed(60, 2000, 300, rate_req_s=50.0)
    res = bl.simulate_disaggregated(reqs, cost, 1, 1, num_kv_blocks=700, max_model_len=0, record_schedule=True)
    assert res.summary()["completed"] == 60
    dec = res.replica(1)
    t = res.transfers
    waited = dec.requests["scheduled_s"].to_numpy() - t.loc[np.flatnonzero(res.decode_engine == 1), "landed_s"]
    assert (waited > 0.05).any()  # some waited for blocks on the decode side
    assert (waited >= -1e-12).all()


def test_disaggregation_moves_prefill_off_the_decode_steps(cost):
    """Long prompts: on one colocated engine chunks share the steps with decodes; split, decode steps carry no
    prefill, so TPOT falls (the DistServe/Splitwise argument)."""
    reqs = bl.synthetic(300, 6000, 200, rate_req_s=3.0, seed=7)
    colo = bl.simulate_fleet(reqs, cost, 2)
    split = bl.simulate_disaggregated(reqs, cost, 1, 1)
    assert split.summary()["p90_tpot_ms"] < colo.summary()["p90_tpot_ms"]
    assert split.n_gpus == colo.n_gpus == 2


def test_bad_arguments(cost):
    reqs = bl.fixed(4, 100, 10)
    with pytest.raises(ValueError, match="router"):
        bl.simulate_fleet(reqs, cost, 2, router="random")
    with pytest.raises(ValueError, match="max_concurrency"):
        bl.simulate_fleet(reqs, cost, 2, max_concurrency=4)
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        bl.simulate_fleet(reqs, cost, 2, router="prefix_aware", enable_prefix_caching=False)
    with pytest.raises(ValueError, match="n_replicas"):
        bl.simulate_fleet(reqs, cost, 0)
    with pytest.raises(ValueError, match="link"):
        bl.simulate_disaggregated(reqs, cost, 1, 1, link="carrier-pigeon")
    with pytest.raises(ValueError, match="n_decode"):
        bl.simulate_disaggregated(reqs, cost, 1, 0)


# -- properties over random streams and knobs (tests/strategies.py) --------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from strategies import knobs as knob_draws  # noqa: E402
from strategies import shared_prefix_streams  # noqa: E402

_COST = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))


@st.composite
def stream_and_knobs(draw):
    reqs = draw(shared_prefix_streams())
    k = draw(knob_draws("chunked", requests=reqs))
    k.pop("max_concurrency")  # open-loop clients only in a fleet
    return reqs, k


@given(stream_and_knobs())
@settings(max_examples=150, deadline=None)
def test_one_replica_is_simulate_on_random_streams(case):
    reqs, k = case
    ref = bl.simulate(reqs, "chunked", _COST, record_schedule=True, **k)
    fleet = bl.simulate_fleet(reqs, _COST, 1, record_tokens=True, record_schedule=True, **k).fleet
    for field in FIELDS:
        a, b = getattr(fleet.raw, field), getattr(ref.raw, field)
        assert a.shape == b.shape and np.array_equal(a, b, equal_nan=True), field


@given(stream_and_knobs(), st.integers(1, 3), st.integers(1, 3), st.sampled_from(["round_robin", "least_outstanding"]))
@settings(max_examples=150, deadline=None)
def test_disaggregated_serves_each_request_once_on_random_streams(case, n_prefill, n_decode, router):
    reqs, k = case
    res = bl.simulate_disaggregated(reqs, _COST, n_prefill, n_decode, router=router, record_tokens=True,
                                    record_schedule=True, **k)
    df = res.fleet.requests
    served = ~df["rejected"].to_numpy()
    out = res.generated
    front, back = res.engine, res.decode_engine
    assert ((front >= 0) & (front < n_prefill))[served].all()
    handed = np.flatnonzero(back >= 0)
    assert (back[handed] >= n_prefill).all() and (out[handed] > 1).all()
    assert np.isin(np.flatnonzero(served & (out > 1)), handed).all()  # every served multi-token output was handed over
    landed = res.transfers["landed_s"]
    first, finish = df["first_token_s"].to_numpy(), df["finish_s"].to_numpy()
    assert (finish[served] >= first[served]).all()
    ok = served[handed]  # a request can be rejected on the decode side (preempted, chunking off, over the budget)
    assert (landed.to_numpy()[ok] >= first[handed][ok]).all()
    np.testing.assert_array_equal(landed.index, handed)
    table = res.summaries()
    # every request routed to a prefill instance counts there, served or not (one rejected on the decode side after a
    # preemption was served by its prefill instance), and every handed-over one once more on its decode instance
    assert table["requests"].sum() == (front >= 0).sum() + len(handed)
    for i in range(res.n_engines):  # each request appears in the schedule of its own engines only
        mine = np.flatnonzero((front if i < n_prefill else back) == i)
        if mine.size == 0:
            with pytest.raises(ValueError, match="served no request"):
                res.replica(i)
            continue
        sched = res.replica(i).schedule
        assert set(sched["request"]) <= set(mine)
        if i >= n_prefill:  # a decode instance computes a prompt only for a request it preempted
            pre = sched[sched["kind"] == "prefill"]["request"]
            assert set(pre) <= set(sched[sched["kind"] == "preempt"]["request"])
    times = res.fleet.token_times
    for r in np.flatnonzero(served):
        assert len(times[r]) == out[r] and np.all(np.diff(times[r]) > 0)
