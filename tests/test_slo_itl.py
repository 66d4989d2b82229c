"""The tail inter-token bound ``itl:MS``: each request judged by its longest gap between two tokens, in the SLO,
goodput, the tuner, the rate search and the command line (chapter 09 reconciles chapter 08 with it)."""
from __future__ import annotations

import numpy as np
import pytest

import batchlab as bl
from batchlab import metrics


def reference_longest(token_times):
    """Plain Python: per request, the largest difference of consecutive token times, NaN under two tokens."""
    return [max(b - a for a, b in zip(t, t[1:])) if len(t) > 1 else float("nan") for t in token_times]


@pytest.mark.parametrize("seed", range(5))
def test_longest_gaps_match_a_plain_python_reference(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 6, 40)  # requests with no, one or several tokens
    per = [np.cumsum(rng.exponential(1.0, n)) + rng.uniform(0, 100) for n in counts]
    flat = np.concatenate(per) if per else np.empty(0)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    np.testing.assert_allclose(metrics.longest_gaps(flat, offsets), reference_longest(per), equal_nan=True)


def test_longest_gaps_by_hand():
    times = np.array([0.0, 1.0, 1.5, 10.0, 20.0, 20.2, 25.0])
    got = metrics.longest_gaps(times, np.array([0, 3, 3, 4, 7]))  # 3 tokens, none, one, 3 tokens
    np.testing.assert_allclose(got, [1.0, np.nan, np.nan, 4.8], equal_nan=True)  # never across two requests


def test_parse_goodput_reads_itl():
    slo = bl.parse_goodput("ttft:500 itl:120")
    assert (slo.ttft_ms, slo.itl_ms, slo.tpot_ms) == (500.0, 120.0, None) and slo.needs_tokens
    assert bl.parse_goodput(slo.spec()) == slo and slo.spec() == "ttft:500 itl:120"
    assert not bl.parse_goodput("ttft:500 tpot:50").needs_tokens
    with pytest.raises(ValueError, match="use ttft, tpot, e2el or itl"):
        bl.parse_goodput("stall:100")
    with pytest.raises(ValueError, match="itl_ms must be a finite number"):
        bl.SLO(itl_ms=-1)


@pytest.fixture(scope="module")
def loaded(cost8b):
    """The conversation trace near capacity under vLLM's default budget: its tail gaps are long."""
    reqs = bl.preset("azure-conv-2023", 600, rate_req_s=16.0, seed=0)
    return reqs, bl.simulate(reqs, "chunked", cost8b)


def test_goodput_counts_requests_whose_longest_gap_is_within_the_bound(loaded):
    _, res = loaded
    done = ~res.requests["rejected"].to_numpy()
    longest = np.array(reference_longest(res.token_times))
    bound_ms = float(np.nanpercentile(longest[done], 70) * 1e3)  # about 70 % of requests within it
    good = done & ~(longest > bound_ms / 1e3)
    req = res.requests[done]
    duration = req["finish_s"].max() - res.requests["arrival_s"].min()
    slo = bl.SLO(itl_ms=bound_ms)
    assert slo.goodput(res) == pytest.approx(good.sum() / duration)
    s = res.summary(slo=slo)
    assert s["p99_longest_itl_ms"] == pytest.approx(np.percentile(longest[done], 99) * 1e3)
    assert s["slo_met"] == (s["p99_longest_itl_ms"] <= bound_ms) and s["slo_met"] is False
    assert slo.load(s) == pytest.approx(s["p99_longest_itl_ms"] / bound_ms)
    assert s["p99_longest_itl_ms"] >= s["p99_itl_ms"]  # a request's longest gap is at least its gaps' tail


def test_an_itl_bound_needs_the_token_record(cost8b, loaded):
    reqs, _ = loaded
    res = bl.simulate(reqs, "chunked", cost8b, record_tokens=False)
    with pytest.raises(AttributeError, match="record_tokens=True"):
        bl.SLO(itl_ms=100).goodput(res)


def test_tune_under_an_itl_bound_lowers_the_budget(cost8b, loaded):
    """TTFT and TPOT cannot see a stall: under them the default's budget ties; bounding the longest gap, the tuner
    moves to a smaller budget, which holds it."""
    reqs, _ = loaded
    grid = dict(max_num_seqs=[256, 1024], max_num_batched_tokens=[1024, 2048, 8192], progress=False)
    plain = bl.tune(reqs, cost8b, bl.parse_goodput("ttft:1000 tpot:50"), **grid)
    stall = bl.tune(reqs, cost8b, bl.parse_goodput("ttft:1000 tpot:50 itl:100"), **grid)
    assert plain.defaults["slo_met"] and plain.gain < 1.01
    assert not stall.defaults["slo_met"] and stall.defaults["p99_longest_itl_ms"] > 100
    assert stall.best["max_num_batched_tokens"] < 8192 and stall.best["slo_met"] and stall.gain > 1.5
    assert stall.best["p99_longest_itl_ms"] <= 100


def test_max_rate_under_an_itl_bound(cost8b, loaded):
    reqs, _ = loaded
    slo = bl.parse_goodput("ttft:1000 itl:100")  # a stall bound alone never breaks once chunks are small
    small = bl.max_rate(reqs, cost8b, slo, max_num_batched_tokens=1024, max_num_seqs=256)
    big = bl.max_rate(reqs, cost8b, slo)  # vLLM's default budget
    assert small.rate_req_s > big.rate_req_s > 0


def test_cli_tune_prints_the_longest_gap_under_an_itl_bound(capsys):
    from batchlab import cli

    assert cli.main(["tune", "--dataset", "azure-conv-2023", "--num-prompts", "300", "--request-rate", "16",
                     "--goodput", "ttft:1000", "itl:100", "--max-num-seqs-grid", "256,1024",
                     "--max-num-batched-tokens-grid", "2048,8192", "--disable-tqdm"]) == 0
    out = capsys.readouterr().out
    assert "SLO (--goodput, ms):" in out and "itl:100" in out
    assert out.count("P99 longest gap per request (ms):") == 2  # the best setting and vLLM's defaults
