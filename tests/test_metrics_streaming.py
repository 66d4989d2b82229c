"""Metrics the loop accumulates as it runs (issue 12) against the same metrics computed from every token's time.

``summary()`` reads ITL from a histogram of inter-token gaps the loop fills; every other key comes from per-request
times the loop stamps. The bound it promises: ITL percentiles within ``ITL_RELATIVE_ERROR`` (2**-13) of the
exact ones, the mean ITL and the busy fraction up to summation order, every other key exact.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import batchlab as bl
from batchlab import metrics
from batchlab._kernels import ITL_BINS, ITL_EXP_LO, ITL_RELATIVE_ERROR, ITL_SUB
from batchlab._kernels.gaps import add_gaps, gap_bin
from strategies import knobs, shared_prefix_streams, streams

ITL_PERCENTILES = ("median_itl_ms", "p90_itl_ms", "p99_itl_ms")
SUMMED = ("mean_itl_ms", "gpu_busy_fraction")  # equal up to the order of a floating-point sum


def bin_edges(b):
    """[low, high) seconds of histogram bin ``b`` (1 .. ITL_BINS - 2), from the layout's definition."""
    octave, part = divmod(b - 1, ITL_SUB)
    base = 2.0 ** (octave + ITL_EXP_LO - 1)
    return base * (1 + part / ITL_SUB), base * (1 + (part + 1) / ITL_SUB)


def assert_within_bound(fast, full):
    assert fast.keys() == full.keys()
    for key, exact in full.items():
        if key in ITL_PERCENTILES:
            assert abs(fast[key] - exact) <= ITL_RELATIVE_ERROR * abs(exact), key
        elif key in SUMMED:
            assert fast[key] == pytest.approx(exact, rel=1e-9, abs=1e-12), key
        elif isinstance(exact, float) and math.isnan(exact):
            assert math.isnan(fast[key]), key
        else:
            assert fast[key] == exact, key


@settings(max_examples=300)
@given(gap=st.floats(2.0 ** (ITL_EXP_LO - 1), 2.0**21, exclude_max=True, allow_nan=False))
def test_every_gap_lies_in_its_bin_and_bins_are_narrow(gap):
    b = gap_bin(gap)
    low, high = bin_edges(b)
    assert low <= gap < high
    assert high - low <= ITL_RELATIVE_ERROR * low * (1 + 1e-12)


def test_bins_tile_the_range_in_order():
    assert gap_bin(0.0) == 0 and gap_bin(1e-12) == 0 and gap_bin(float("nan")) == 0
    assert gap_bin(1e9) == ITL_BINS - 1
    for b in (1, 2, ITL_SUB, ITL_SUB + 1, ITL_BINS // 2, ITL_BINS - 2):
        low, high = bin_edges(b)
        assert gap_bin(low) == b and gap_bin(np.nextafter(high, 0)) == b and gap_bin(high) == b + 1


@settings(max_examples=200)
@given(values=st.lists(st.one_of(st.floats(1e-4, 2.0), st.sampled_from([0.005, 0.0071, 0.02])), min_size=1,
                       max_size=300),
       repeat=st.integers(1, 4))
def test_histogram_percentiles_match_numpy_within_bound(values, repeat):
    gaps = np.repeat(np.asarray(values), repeat)
    itl, totals = np.zeros((ITL_BINS, 4)), np.zeros(8)
    for value in values:
        add_gaps(itl, totals, value, float(repeat))
    fast, exact = metrics.histogram_stats("itl", itl), metrics.sample_stats("itl", gaps)
    assert fast["mean_itl_ms"] == pytest.approx(exact["mean_itl_ms"], rel=1e-12)
    for key in ITL_PERCENTILES:
        assert abs(fast[key] - exact[key]) <= ITL_RELATIVE_ERROR * exact[key]
    if len(set(values)) <= 2:  # each bin's values are its smallest or largest: exact
        assert all(fast[k] == pytest.approx(exact[k], rel=1e-15) for k in ITL_PERCENTILES)


def test_empty_histogram_reads_as_zero():
    assert set(metrics.histogram_stats("itl", np.zeros((ITL_BINS, 4))).values()) == {0.0}


@pytest.mark.parametrize("policy", ["static", "dynamic", "continuous", "chunked"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_summary_equals_full_record_summary_on_random_runs(cost8b, policy, data):
    shared = policy == "chunked" and data.draw(st.booleans())
    requests = data.draw(shared_prefix_streams() if shared else streams())
    k = {key: v for key, v in data.draw(knobs(policy)).items() if v is not None}
    full = bl.simulate(requests, policy, cost8b, **k)
    assert_within_bound(full.summary(), full.summary_from_tokens())
    lean = bl.simulate(requests, policy, cost8b, record_tokens=False, **k)
    assert lean.summary() == full.summary()  # the same loop, only the records differ
    assert lean.raw.token_times_s.size == 0 and lean.raw.steps.shape[0] == 0
    assert (lean.n_steps, lean.sequence_steps) == (len(full.steps), int(full.steps["running"].sum()))


BOOK_WORKLOADS = {"azure-conv-2023": None, "azure-code-2023": None, "mooncake-conversation": 0.5,
                  "sharegpt": None, "arxiv-summarization": 2.0}
BOOK_CONFIGS = [("static", {"batch_size": 32}), ("dynamic", {"batch_size": 32}), ("continuous", {}),
                ("continuous", {"prefill_only_steps": True, "max_num_batched_tokens": 16384}), ("chunked", {}),
                ("chunked", {"max_num_batched_tokens": 512, "max_num_seqs": 128, "num_kv_blocks": 700,
                             "max_model_len": 8192}),
                ("chunked", {"enable_chunked_prefill": False, "max_num_batched_tokens": 16384, "max_model_len": 8192})]


@pytest.mark.parametrize("workload", BOOK_WORKLOADS)
def test_summary_equals_full_record_summary_on_the_books_workloads(cost8b, workload):
    requests = bl.preset(workload, 400, BOOK_WORKLOADS[workload], seed=3)
    for policy, k in BOOK_CONFIGS:
        res = bl.simulate(requests, policy, cost8b, **k)
        assert_within_bound(res.summary(), res.summary_from_tokens())


def test_gaps_of_a_request_rejected_after_preemption_are_left_out(cost8b):
    # Chunking off, a 64-token budget: the second request is preempted after emitting, and recomputing its prompt
    # plus output would outgrow the budget, so it is rejected; its gaps must not count.
    r = bl.Requests([0.0, 0.0], [40, 40], [40, 40])
    res = bl.simulate(r, "chunked", cost8b.ideal(), max_num_seqs=2, max_num_batched_tokens=64,
                      enable_chunked_prefill=False, max_model_len=0, num_kv_blocks=10, async_scheduling=False,
                      enable_prefix_caching=False, scheduler_reserve_full_isl=False)
    assert res.requests["rejected"].tolist() == [False, True]
    assert np.isfinite(res.token_times[1]).sum() > 1  # it had emitted tokens, so it had gaps
    assert res.raw.itl[:, 0].sum() == 39 == res.itl_s().size
    assert_within_bound(res.summary(), res.summary_from_tokens())


def test_a_request_rejected_up_front_gets_no_token_record(cost8b):
    # The middle request can never fit the pool: rejected before the loop, it must not reserve 10**8 token slots.
    r = bl.Requests([0.0, 0.0, 0.1], [100, 100, 100], [5, 10**8, 7])
    for policy, per_policy in (("static", {"batch_size": 2}), ("continuous", {}), ("chunked", {"max_model_len": 0})):
        res = bl.simulate(r, policy, cost8b, **per_policy)
        assert res.requests["rejected"].tolist() == [False, True, False]
        assert res.token_offsets.tolist() == [0, 5, 5, 12] and res.token_times_flat.size == 12
        assert res.token_times[1].size == 0 and np.isfinite(res.token_times_flat).all()
        assert [np.all(np.diff(t) > 0) for t in res.token_times] == [True, True, True]


def test_records_are_refused_when_not_kept(cost8b):
    res = bl.simulate(bl.Requests([0.0], [10], [3]), "chunked", cost8b, record_tokens=False)
    for attribute in ("token_times", "token_times_flat", "steps"):
        with pytest.raises(AttributeError, match="record_tokens=True"):
            getattr(res, attribute)
    with pytest.raises(AttributeError, match="record_tokens=True"):
        res.itl_s()
    with pytest.raises(ValueError, match="record_tokens"):
        bl.simulate(bl.Requests([0.0], [10], [3]), "chunked", cost8b, record_tokens="no")
