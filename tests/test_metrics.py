"""Metrics by their definitions, on runs whose timestamps can be worked out by hand; the run-level measures of
slot and GPU use (tail waste, idle while waiting, full batches, tokens per step) by closed forms and invariants."""
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab import metrics

KEYS = {"completed", "rejected", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
        "output_throughput", "total_token_throughput", "preemptions", "padding_fraction", "gpu_busy_fraction",
        "prefix_cache_hit_rate"}
for m in ("ttft", "tpot", "itl", "e2el"):
    KEYS |= {f"{s}_{m}_ms" for s in ("mean", "median", "p90", "p99")}


@pytest.fixture(scope="module")
def cost8b(engine8b):
    """Hand-worked cases are stated in whole steps: the engine without the serving terms (conftest)."""
    return engine8b


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


# -- run-level measures of slot and GPU use -------------------------------------------------------------------
def batch_frame(scheduled, finish, release):
    n = len(finish)
    return pd.DataFrame({"scheduled_s": scheduled, "finish_s": finish, "release_s": release,
                         "rejected": [False] * n, "output_tokens": [1] * n})


def test_half_empty_fraction_closed_forms():
    # One batch of two rows from 0 s: half the rows are done at 1 s, the batch ends at 3 s -> 2/3.
    assert metrics.half_empty_fraction(batch_frame([0, 0], [1, 3], [3, 3])) == pytest.approx(2 / 3)
    # Every row ends with the batch: no tail.
    assert metrics.half_empty_fraction(batch_frame([0, 0, 0], [3, 3, 3], [3, 3, 3])) == 0.0
    # Two batches weigh by their running time: (2 + 0) / (3 + 1).
    two = batch_frame([0, 0, 3, 3], [1, 3, 4, 4], [3, 3, 4, 4])
    assert metrics.half_empty_fraction(two) == pytest.approx(0.5)
    # Three rows: "half done" is the second finish.
    assert metrics.half_empty_fraction(batch_frame([0, 0, 0], [1, 2, 4], [4, 4, 4])) == pytest.approx(0.5)


def fake_run(arrival, scheduled, finish, starts, durations):
    """The parts of a SimResult that idle_while_waiting_fraction reads."""
    n = len(arrival)
    req = pd.DataFrame({"arrival_s": arrival, "scheduled_s": scheduled, "finish_s": finish, "rejected": [False] * n})
    return SimpleNamespace(requests=req, steps=pd.DataFrame({"start_s": starts, "duration_s": durations}))


def test_idle_while_waiting_closed_forms():
    # A batch of two that waits for its second request: idle from 0 (first arrival) to 1 s, busy 1 to 3 s.
    run = fake_run([0.0, 1.0], [1.0, 1.0], [3.0, 3.0], [1.0, 2.0], [1.0, 1.0])
    assert metrics.idle_while_waiting_fraction(run) == pytest.approx(1 / 3)
    # Idle gap with nobody waiting (the next request arrives when its step starts): no waste.
    run = fake_run([0.0, 5.0], [0.0, 5.0], [1.0, 6.0], [0.0, 5.0], [1.0, 1.0])
    assert metrics.idle_while_waiting_fraction(run) == 0.0
    # Same gap, but the second request arrived at 2 s and was only scheduled at 5 s: 3 s of 6 wasted.
    run = fake_run([0.0, 2.0], [0.0, 5.0], [1.0, 6.0], [0.0, 5.0], [1.0, 1.0])
    assert metrics.idle_while_waiting_fraction(run) == pytest.approx(3 / 6)


def test_idle_while_waiting_on_real_runs(cost8b):
    stream = bl.synthetic(200, 256, 64, prompt_cv=0.5, output_cv=1.0, rate_req_s=2.0, seed=1)
    frac = {}
    for policy, knobs in [("static", {"batch_size": 8}), ("dynamic", {"batch_size": 8, "max_queue_delay_s": 0.2}),
                          ("continuous", {}), ("chunked", {})]:
        frac[policy] = metrics.idle_while_waiting_fraction(bl.simulate(stream, policy, cost8b, **knobs))
    assert frac["continuous"] == 0.0 and frac["chunked"] == 0.0  # iteration-level servers never idle with work
    assert frac["static"] > frac["dynamic"] > 0.0
    # A lockstep batch of one is work-conserving too: it starts as soon as anything waits and the GPU is free.
    one = bl.simulate(stream, "static", cost8b, batch_size=1)
    assert metrics.idle_while_waiting_fraction(one) == 0.0


def test_dynamic_idles_at_most_one_timer_per_batch(cost8b):
    stream = bl.synthetic(300, 256, 32, prompt_cv=0.5, output_cv=1.0, rate_req_s=1.0, seed=2)
    delay = 0.3
    res = bl.simulate(stream, "dynamic", cost8b, batch_size=16, max_queue_delay_s=delay)
    batches = int((res.steps["prefill_tokens"] > 0).sum())
    duration = res.requests["finish_s"].max() - res.requests["arrival_s"].min()
    idle_s = metrics.idle_while_waiting_fraction(res) * duration
    assert 0 < idle_s <= batches * delay + 1e-9


def test_full_batch_fraction(cost8b):
    at_once = bl.synthetic(70, 128, 16, output_cv=1.0, seed=0)  # 70 = 8 full batches of 8 and one of 6
    for policy, knobs in [("static", {}), ("dynamic", {"max_queue_delay_s": 0.0})]:
        res = bl.simulate(at_once, policy, cost8b, batch_size=8, **knobs)
        assert metrics.full_batch_fraction(res) == pytest.approx(8 / 9)
    assert np.isnan(metrics.full_batch_fraction(bl.simulate(at_once, "continuous", cost8b)))
    # Requests 100 s apart: a dynamic batch never holds more than one.
    sparse = bl.Requests(np.arange(5) * 100.0, np.full(5, 128), np.full(5, 16))
    assert metrics.full_batch_fraction(bl.simulate(sparse, "dynamic", cost8b, batch_size=2)) == 0.0


def test_tokens_per_step_counts_every_token_once(cost8b):
    stream = bl.preset("azure-conv-2023", 12, rate_req_s=4.0, seed=0)
    runs = {"static": bl.simulate(stream, "static", cost8b, batch_size=4),
            "dynamic": bl.simulate(stream, "dynamic", cost8b, batch_size=4, max_queue_delay_s=0.05),
            "continuous": bl.simulate(stream, "continuous", cost8b, max_num_seqs=4)}
    for policy, res in runs.items():
        gen = metrics.tokens_per_step(res)
        assert gen.sum() == stream.output_tokens.sum(), policy
        assert (gen <= res.steps["running"].to_numpy()).all()
    # Continuous (prompts whole, decodes alongside): every running row emits a token every iteration.
    cont = runs["continuous"]
    assert (metrics.tokens_per_step(cont) == cont.steps["running"].to_numpy()).all()
    # Lockstep: the prefill step emits a first token for every row, later steps only for unfinished rows.
    static = runs["static"]
    opens = (static.steps["prefill_tokens"] > 0).to_numpy()
    assert (metrics.tokens_per_step(static)[opens] == static.steps["running"].to_numpy()[opens]).all()
    assert (metrics.tokens_per_step(static) < static.steps["running"].to_numpy()).any()


# -- hand-worked cases that catch unit and peak mix-ups (issue 16's planted bugs) ----------------------------
def test_goodput_by_hand_counts_slos_in_seconds():
    """Three requests over 2 s of a run: TTFTs of 0.1, 0.25 and 0.5 s, TPOTs of 20, 40 and 60 ms. The SLOs are
    seconds, so a TTFT SLO of 0.3 s passes two of three (1 req/s); one that compared milliseconds (100, 250, 500)
    against 0.3 would pass none."""
    frame = pd.DataFrame({"arrival_s": [0.0, 0.5, 1.0], "finish_s": [1.0, 1.5, 2.0], "rejected": [False] * 3,
                          "ttft_s": [0.1, 0.25, 0.5], "tpot_s": [0.02, 0.04, 0.06], "e2el_s": [1.0, 1.0, 1.0]})
    assert metrics.goodput(frame, ttft_s=0.3) == 1.0
    assert metrics.goodput(frame, tpot_s=0.05) == 1.0
    assert metrics.goodput(frame, ttft_s=0.3, tpot_s=0.03) == 0.5
    assert metrics.goodput(frame, ttft_s=0.3, tpot_s=0.06) == 1.0  # each SLO narrows the set; none widens it
    assert metrics.goodput(frame, e2el_s=1.0) == 1.5  # <= counts as met
    assert metrics.goodput(frame, ttft_s=0.5, tpot_s=0.06, e2el_s=1.0) == 1.5
    with pytest.raises(ValueError, match="ttft_s SLO must be > 0 seconds"):
        metrics.goodput(frame, ttft_s=0.0)


def test_goodput_of_one_run_by_hand(cost8b):
    """One 1,000-token prompt alone: its TTFT is the prefill, so an SLO 1 % above it is met and 1 % below is not."""
    c = cost8b.ideal()
    res = bl.simulate(bl.Requests([0.0], [1000], [4]), "chunked", c)
    ttft = c.prefill_time(1000)
    duration = res.summary()["duration"]
    assert res.goodput(ttft_s=ttft * 1.01) == pytest.approx(1 / duration, rel=1e-12)
    assert res.goodput(ttft_s=ttft * 0.99) == 0.0


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_compute_util_divides_by_the_peak_of_the_weight_dtype(h100, dtype):
    """A step's compute_util is its FLOPs over (peak FLOP/s of the weights' dtype x its duration): FP8 weights run
    at the FP8 peak (twice BF16's on an H100), so dividing by the BF16 peak would double it. On the ideal model a
    long prefill is compute-bound with its GEMMs at 100 % of that peak, so its utilisation is just under 1."""
    c = bl.CostModel(h100, bl.get_model("llama-3-8b"), dtype=dtype).ideal()
    res = bl.simulate(bl.Requests([0.0], [8000], [3]), "chunked", c, max_num_batched_tokens=8192)
    st = res.steps
    peak = h100.flops_fp8 if dtype == "fp8" else h100.flops_bf16
    np.testing.assert_allclose(st.compute_util, st.flops / (peak * st.duration_s), rtol=1e-12)
    prefill = st.iloc[0]
    assert prefill["bound"] == "compute"
    assert 0.85 < prefill["compute_util"] <= 1.0  # attention at eta 1 too; the LM head and memory terms add time
    assert (st.compute_util <= 1.0 + 1e-12).all() and (st.bandwidth_util <= 1.0 + 1e-12).all()


def test_fp8_compute_util_is_bounded_by_its_efficiencies(cost70b_fp8):
    res = bl.simulate(bl.synthetic(60, 2000, 50, 1.0, 1.0, rate_req_s=20.0, seed=2, max_tokens=3000), "chunked",
                      cost70b_fp8, max_model_len=4096)
    st = res.steps
    assert (st.compute_util > 0).all()
    assert (st.compute_util <= max(cost70b_fp8.eta_compute, cost70b_fp8.eta_attn) + 1e-9).all()


# -- cases that kill the surviving mutants of metrics.py (scripts/MUTANTS.md) -----------------------------------
def test_per_request_latencies_by_hand():
    """Arrivals 1 and 2 s, scheduled 1.5 and 2 s, first tokens 2 and 3 s, finishes 5 and 3 s, outputs of 4 and 1
    and 2 tokens: queue 0.5 and 0; TTFT 1 and 1; TPOT (5 - 2) / 3 = 1, NaN for one token, (4 - 3.5) / 1 = 0.5
    for two; E2E 4 and 1."""
    out = metrics.per_request([1, 2, 3], [4, 1, 2], [1.5, 2, 3], [2, 3, 3.5], [5, 3, 4])
    np.testing.assert_array_equal(out["queue_s"], [0.5, 0.0, 0.0])
    np.testing.assert_array_equal(out["ttft_s"], [1.0, 1.0, 0.5])
    np.testing.assert_array_equal(out["tpot_s"], [1.0, np.nan, 0.5])
    np.testing.assert_array_equal(out["e2el_s"], [4.0, 1.0, 1.0])


def test_goodput_edges_by_hand():
    """The duration runs from the first arrival (here 0.5 s, not 0) to the last finish (0.9 s): 0.4 s, under a
    second; a run with nothing completed, or that lasts no time, has no goodput."""
    frame = pd.DataFrame({"arrival_s": [0.5, 0.6], "finish_s": [0.8, 0.9], "rejected": [False, False],
                          "ttft_s": [0.1, 0.2], "tpot_s": [np.nan, 0.01], "e2el_s": [0.3, 0.3]})
    assert metrics.goodput(frame, ttft_s=0.15) == pytest.approx(1 / 0.4, rel=1e-12)
    assert metrics.goodput(frame, tpot_s=1e-6) == pytest.approx(1 / 0.4, rel=1e-12)  # NaN TPOT meets any SLO
    assert metrics.goodput(frame.assign(rejected=True), ttft_s=1.0) == 0.0
    instant = frame.assign(arrival_s=[0.5, 0.5], finish_s=[0.5, 0.5])
    assert metrics.goodput(instant, ttft_s=1.0) == 0.0
    with pytest.raises(ValueError, match="^goodput needs at least one SLO: ttft_s, tpot_s, e2el_s or itl_s$"):
        metrics.goodput(frame)
    with pytest.raises(ValueError, match=r"^e2el_s SLO must be > 0 seconds, got -1$"):
        metrics.goodput(frame, e2el_s=-1)


def test_summary_of_a_run_with_nothing_completed_is_all_zero(cost8b):
    s = bl.simulate(bl.Requests([0.0], [10**6], [10]), "chunked", cost8b).summary()
    assert (s["duration"], s["padding_fraction"], s["gpu_busy_fraction"], s["prefix_cache_hit_rate"]) == (0, 0, 0, 0)
    assert s["preemptions"] == 0 and isinstance(s["preemptions"], int)


def test_prefix_cache_hit_rate_is_cached_over_prompt_tokens(cost8b):
    """Two identical 64-token prompts of four 16-token blocks, the second after the first finished: it finds three
    blocks cached (never the one holding its last token), 48 of 128 prompt tokens: 0.375."""
    r = bl.Requests([0.0, 1.0], [64, 64], [2, 2], [[1, 2, 3, 4], [1, 2, 3, 4]], 16)
    res = bl.simulate(r, "chunked", cost8b)
    assert res.requests["cached_tokens"].tolist() == [0, 48]
    assert res.summary()["prefix_cache_hit_rate"] == 48 / 128


# 1, 2, ..., 100 ms in a shuffled order, and what NumPy's linear rule (np.percentile's default) makes of them by
# hand: rank (n - 1) q / 100 = 49.5, 89.1 and 98.01 between the order statistics k + 1 and k + 2 ms.
SPREAD_MS = np.random.default_rng(3).permutation(np.arange(1, 101)).astype(float)
SPREAD_STATS = {"mean": 50.5, "median": 50.5, "p90": 90.1, "p99": 99.01}


def test_every_percentile_key_on_spread_values_by_hand():
    """Each percentile key is its own percentile: on spread values p99, p90 and the median are far apart, so a key
    read at another percentile (p99 taken as p95 would be 95.05 ms) fails here, whatever the shipped tables say."""
    want = {f"{k}_ttft_ms": v for k, v in SPREAD_STATS.items()}
    assert metrics.sample_stats("ttft", SPREAD_MS / 1e3) == pytest.approx(want, rel=1e-12)


def test_summary_reads_every_latency_percentile_by_hand():
    """summary() on requests whose TTFT, TPOT and end-to-end latency are 1 to 100 ms (and 10 to 1,000 ms): every
    mean, median, p90 and p99 key is the hand-worked value."""
    n = SPREAD_MS.size
    ttft = SPREAD_MS / 1e3
    tpot = SPREAD_MS / 1e3 / 2
    out = np.full(n, 11)  # ten gaps of tpot after the first token
    requests = {"rejected": np.zeros(n, bool), "arrival_s": np.zeros(n), "prompt_tokens": np.full(n, 8),
                "output_tokens": out, "padded_tokens": np.zeros(n, int), "cached_tokens": np.zeros(n, int),
                "preemptions": np.zeros(n, int), "ttft_s": ttft, "tpot_s": tpot, "e2el_s": ttft + 10 * tpot,
                "finish_s": ttft + 10 * tpot}
    s = metrics.summary(requests, {}, busy_s=0.0)
    for metric, scale in (("ttft", 1.0), ("tpot", 0.5), ("e2el", 6.0)):
        for key, value in SPREAD_STATS.items():
            assert s[f"{key}_{metric}_ms"] == pytest.approx(value * scale, rel=1e-12), (metric, key)


def test_itl_histogram_reads_spread_gaps_exactly():
    """Gaps of 1 to 100 ms each fall in a bin of their own, so the histogram's percentiles are the exact ones."""
    from batchlab._kernels import ITL_BINS
    from batchlab._kernels.gaps import add_gaps

    itl, totals = np.zeros((ITL_BINS, 4)), np.zeros(8)
    for gap_ms in SPREAD_MS:
        add_gaps(itl, totals, gap_ms / 1e3, 1.0)
    want = {f"{k}_itl_ms": v for k, v in SPREAD_STATS.items()}
    assert metrics.histogram_stats("itl", itl) == pytest.approx(want, rel=1e-12)
