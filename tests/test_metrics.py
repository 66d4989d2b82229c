"""Metrics by their definitions, on runs whose timestamps can be worked out by hand."""
import numpy as np
import pytest

import batchlab as bl
from batchlab import metrics

KEYS = {"completed", "rejected", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
        "output_throughput", "total_token_throughput", "preemptions", "padding_fraction", "gpu_busy_fraction"}
for m in ("ttft", "tpot", "itl", "e2el"):
    KEYS |= {f"{s}_{m}_ms" for s in ("mean", "median", "p90", "p99")}


def test_summary_keys_are_vllm_bench_names(cost8b):
    s = bl.simulate(bl.fixed(10, 100, 10), "chunked", cost8b).summary()
    assert set(s) == KEYS


def test_single_request_by_hand(cost8b):
    c = cost8b.ideal()
    r = bl.Requests([0.5], [1000], [4])
    res = bl.simulate(r, "chunked", c)
    t_pre = c.prefill_time(1000)
    t_dec = [c.decode_step_time(1, 1000 + i) for i in range(3)]
    s = res.summary()
    assert s["mean_ttft_ms"] == pytest.approx(t_pre * 1e3)
    assert s["mean_tpot_ms"] == pytest.approx(sum(t_dec) / 3 * 1e3)
    assert s["mean_e2el_ms"] == pytest.approx((t_pre + sum(t_dec)) * 1e3)
    assert s["p99_itl_ms"] == pytest.approx(np.percentile(np.array(t_dec) * 1e3, 99))
    assert s["duration"] == pytest.approx(t_pre + sum(t_dec))  # first arrival to last finish
    assert s["output_throughput"] == pytest.approx(4 / s["duration"])
    assert s["total_token_throughput"] == pytest.approx(1004 / s["duration"])
    assert s["gpu_busy_fraction"] == pytest.approx(1.0)


def test_itl_never_spans_two_requests():
    times = np.array([1.0, 2.0, 4.0, 10.0, 10.5])
    off = np.array([0, 3, 5])
    np.testing.assert_allclose(metrics.inter_token_gaps(times, off, np.array([True, True])), [1.0, 2.0, 0.5])
    np.testing.assert_allclose(metrics.inter_token_gaps(times, off, np.array([False, True])), [0.5])


def test_goodput(cost8b):
    res = bl.simulate(bl.fixed(50, 500, 50, rate_req_s=20.0, seed=1), "chunked", cost8b)
    s = res.summary()
    assert res.goodput(ttft_s=1e3, tpot_s=1e3) == pytest.approx(s["request_throughput"])
    assert res.goodput(ttft_s=1e-9) == 0.0
    with pytest.raises(ValueError, match="SLO"):
        res.goodput()


def test_aggregates_over_nothing_are_zero(cost8b):
    r = bl.Requests([0.0], [10**6], [10])  # can never fit the pool
    s = bl.simulate(r, "chunked", cost8b).summary()
    assert s["completed"] == 0 and s["rejected"] == 1
    assert s["mean_ttft_ms"] == 0.0 and s["request_throughput"] == 0.0


def test_step_utilisation_is_a_fraction_of_peak(cost8b):
    res = bl.simulate(bl.synthetic(200, 2000, 200, 1.0, 1.0, rate_req_s=20.0, seed=2), "chunked", cost8b)
    st = res.steps
    assert (st.compute_util > 0).all() and (st.compute_util <= max(cost8b.eta_compute, cost8b.eta_attn) + 1e-9).all()
    assert (st.bandwidth_util > 0).all() and (st.bandwidth_util <= cost8b.eta_memory + 1e-9).all()
