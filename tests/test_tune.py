"""Goodput under an SLO, vLLM's --goodput syntax, the largest sustained rate and the tuner (issue 14).

Goodput is checked on a hand-worked run (requests that each run alone, so TTFT is exactly one prefill); the
rate search by simulating at the rates it returns; the tuner against vLLM's defaults and across executors, and its
choice among goodputs that tie (within ``goodput_rel_tol``) by SLO headroom (``slo_load``) on constructed streams.
"""
import math
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import batchlab as bl
from pinned import PINNED_CALIBRATION
from batchlab.tune import RateResult, arrival_rate, at_rate

GRID = {"max_num_seqs": [4, 16, 64], "max_num_batched_tokens": [256, 2048]}


# -- parse_goodput and SLO ---------------------------------------------------------------------------------------
def test_parse_goodput_string_and_list():
    assert bl.parse_goodput("ttft:500 tpot:50") == bl.SLO(ttft_ms=500, tpot_ms=50)
    assert bl.parse_goodput(["ttft:500", "tpot:50"]) == bl.SLO(ttft_ms=500.0, tpot_ms=50.0)
    assert bl.parse_goodput("e2el:2000.5") == bl.SLO(e2el_ms=2000.5)
    assert bl.parse_goodput("tpot:25", percentile=90).percentile == 90
    assert bl.parse_goodput(bl.SLO(ttft_ms=300, tpot_ms=50).spec()) == bl.SLO(ttft_ms=300, tpot_ms=50)


@pytest.mark.parametrize("spec, match", [
    ("ttfb:500", "unknown"),
    ("ttft=500", "no colon"),
    ("ttft500", "no colon"),
    ("ttft:fast", "not a number"),
    ("ttft:", "not a number"),
    ("ttft:0", "> 0"),
    ("tpot:-50", "> 0"),
    ("ttft:nan", "> 0"),
    ("ttft:inf", "> 0"),
    ("ttft:500 ttft:300", "twice"),
    ("", "empty"),
    ([], "empty"),
    (500, "string"),
    (["ttft:500", 50], "string"),
])
def test_parse_goodput_rejects(spec, match):
    with pytest.raises(ValueError, match=match):
        bl.parse_goodput(spec)


@pytest.mark.parametrize("kwargs, match", [
    ({}, "at least one bound"),
    ({"ttft_ms": 0}, "ttft_ms"),
    ({"tpot_ms": -1.0}, "tpot_ms"),
    ({"e2el_ms": float("nan")}, "e2el_ms"),
    ({"ttft_ms": True}, "ttft_ms"),
    ({"ttft_ms": 500, "percentile": 0}, r"percentile must be in \(0, 100\]"),
    ({"ttft_ms": 500, "percentile": 100.5}, "percentile"),
])
def test_slo_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bl.SLO(**kwargs)


def test_met_by_reads_the_percentile_keys():
    s = {"p99_ttft_ms": 400.0, "p99_tpot_ms": 60.0, "p90_ttft_ms": 300.0, "p90_tpot_ms": 40.0,
         "median_ttft_ms": 100.0, "median_tpot_ms": 20.0, "p99_e2el_ms": 9e3}
    assert not bl.SLO(ttft_ms=500, tpot_ms=50).met_by(s)  # p99 TPOT 60 > 50
    assert bl.SLO(ttft_ms=500, tpot_ms=60).met_by(s)  # a bound is inclusive
    assert bl.SLO(ttft_ms=500, tpot_ms=50, percentile=90).met_by(s)
    assert not bl.SLO(ttft_ms=99, percentile=50).met_by(s)
    assert not bl.SLO(e2el_ms=8e3).met_by(s)
    with pytest.raises(ValueError, match="50th, 90th and 99th"):
        bl.SLO(ttft_ms=500, percentile=95).met_by(s)


def test_load_is_the_largest_percentile_over_bound():
    s = {"p99_ttft_ms": 400.0, "p99_tpot_ms": 60.0, "p90_ttft_ms": 300.0, "p90_tpot_ms": 40.0,
         "median_ttft_ms": 100.0, "median_tpot_ms": 20.0, "p99_e2el_ms": 9e3}
    assert bl.SLO(ttft_ms=500, tpot_ms=50).load(s) == pytest.approx(60 / 50)  # TPOT binds
    assert bl.SLO(ttft_ms=500, tpot_ms=120).load(s) == pytest.approx(400 / 500)  # TTFT binds
    assert bl.SLO(ttft_ms=500, tpot_ms=50, percentile=90).load(s) == pytest.approx(40 / 50)  # p90s: TPOT binds
    assert bl.SLO(e2el_ms=1e4).load(s) == pytest.approx(0.9)
    assert math.isnan(bl.SLO(ttft_ms=500, tpot_ms=50).load({**s, "p99_tpot_ms": float("nan")}))
    for slo in (bl.SLO(ttft_ms=500, tpot_ms=50), bl.SLO(ttft_ms=500, tpot_ms=60), bl.SLO(ttft_ms=399, tpot_ms=80)):
        assert slo.met_by(s) == (slo.load(s) <= 1)  # a bound is inclusive in both
    table = pd.DataFrame([s, {**s, "p99_ttft_ms": 100.0}])
    np.testing.assert_allclose(bl.SLO(ttft_ms=200).load(table), [2.0, 0.5])  # one value per row
    with pytest.raises(ValueError, match="50th, 90th and 99th"):
        bl.SLO(ttft_ms=500, percentile=95).load(s)


# -- goodput on a hand-worked run --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def alone(engine8b):
    """Three requests 10 s apart, each alone on the GPU: TTFT is exactly one unchunked prefill."""
    reqs = bl.Requests([0.0, 10.0, 20.0], [500, 500, 8000], [5, 5, 5])
    return bl.simulate(reqs, "chunked", engine8b)


def test_goodput_hand_worked(alone, engine8b):
    t500, t8000 = engine8b.prefill_time(500), engine8b.prefill_time(8000)
    assert 0.005 < t500 < 0.05 < t8000 < 1.0  # 50 ms lies between the two TTFTs
    np.testing.assert_allclose(alone.requests["ttft_s"], [t500, t500, t8000], rtol=1e-12)
    duration = alone.requests["finish_s"].max()  # first arrival at 0
    slo = bl.SLO(ttft_ms=50)
    # two of the three meet 50 ms; a bound read as seconds would pass all three, as microseconds none
    assert slo.goodput(alone) == pytest.approx(2 / duration, rel=1e-12)
    assert bl.SLO(ttft_ms=t8000 * 1e3 * 1.001).goodput(alone) == pytest.approx(3 / duration, rel=1e-12)
    assert bl.SLO(ttft_ms=t500 * 1e3 * 0.999).goodput(alone) == 0.0
    # every bound must hold: all three meet a TTFT bound of 1 s, the long one misses an E2E or TPOT bound
    e2el_long, tpot_long = alone.requests[["e2el_s", "tpot_s"]].iloc[2]
    assert alone.requests["tpot_s"].iloc[0] < tpot_long
    assert bl.SLO(ttft_ms=1e3).goodput(alone) == pytest.approx(3 / duration, rel=1e-12)
    assert bl.SLO(ttft_ms=1e3, e2el_ms=e2el_long * 1e3 * 0.999).goodput(alone) == pytest.approx(2 / duration)
    assert bl.SLO(ttft_ms=1e3, tpot_ms=tpot_long * 1e3 * 0.999).goodput(alone) == pytest.approx(2 / duration)


def test_summary_with_slo_adds_two_keys_only(alone):
    plain = alone.summary()
    slo = bl.SLO(ttft_ms=50, tpot_ms=50)
    with_slo = alone.summary(slo=slo)
    assert list(with_slo) == list(plain) + ["request_goodput", "slo_met"]
    assert {k: with_slo[k] for k in plain} == plain
    assert "request_goodput" not in plain
    assert with_slo["request_goodput"] == slo.goodput(alone)
    assert with_slo["slo_met"] is False  # p99 TTFT is the 8,000-token prefill, over 50 ms
    assert alone.summary(slo=bl.SLO(ttft_ms=1e3, tpot_ms=50))["slo_met"] is True


# -- max_rate ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stream():
    return bl.synthetic(300, 800, 120, prompt_cv=1.0, output_cv=1.0, rate_req_s=5.0, seed=5)


def _holds(stream, cost, slo, rate, **knobs):
    res = bl.simulate(at_rate(stream, rate), "chunked", cost, record_tokens=False, **knobs)
    return slo.met_by(res.summary())


def test_at_rate_scales_the_mean_rate(stream):
    assert arrival_rate(at_rate(stream, 12.5)) == pytest.approx(12.5)
    with pytest.raises(ValueError, match="two distinct arrival times"):
        arrival_rate(bl.fixed(5, 100, 10))  # all at time 0


def test_max_rate_brackets(stream, cost8b):
    slo = bl.SLO(ttft_ms=500, tpot_ms=50)
    knobs = {"max_num_seqs": 64, "max_num_batched_tokens": 2048}
    r = bl.max_rate(stream, cost8b, slo, **knobs)
    assert r.rate_req_s == r.low_req_s > 0
    assert (r.high_req_s - r.low_req_s) / r.low_req_s <= 0.02
    assert 2 <= r.runs <= 40
    assert _holds(stream, cost8b, slo, r.low_req_s, **knobs)
    assert not _holds(stream, cost8b, slo, r.high_req_s, **knobs)
    assert not _holds(stream, cost8b, slo, 1.5 * r.high_req_s, **knobs)


def test_max_rate_is_monotone_in_the_slo(stream, cost8b):
    rates = [bl.max_rate(stream, cost8b, bl.SLO(ttft_ms=ttft, tpot_ms=tpot)).rate_req_s
             for ttft, tpot in [(200, 20), (300, 30), (500, 50), (500, 80), (2000, 80)]]
    assert rates == sorted(rates)
    assert rates[0] < rates[-1]  # the SLO matters on this stream


def test_max_rate_zero_when_even_a_tiny_rate_fails(stream, cost8b):
    r = bl.max_rate(stream, cost8b, bl.SLO(ttft_ms=1.0))  # no prompt prefills in 1 ms
    assert r == RateResult(0.0, 0.0, 0.0, r.runs) and r.runs <= 2


def test_max_rate_says_when_no_bracket_is_found(cost8b):
    three = bl.Requests([0.0, 1.0, 2.0], [100, 100, 100], [10, 10, 10])  # too few to ever queue
    with pytest.raises(ValueError, match="no bracket found within max_runs=6"):
        bl.max_rate(three, cost8b, bl.SLO(e2el_ms=1e6), max_runs=6)


@pytest.mark.parametrize("kwargs, match", [({"rel_tol": 0}, "rel_tol"), ({"rel_tol": 1.5}, "rel_tol"),
                                           ({"max_runs": 1}, "max_runs"), ({"max_runs": 2.5}, "max_runs")])
def test_max_rate_rejects_bad_arguments(stream, cost8b, kwargs, match):
    with pytest.raises(ValueError, match=match):
        bl.max_rate(stream, cost8b, bl.SLO(ttft_ms=500), **kwargs)


# -- tune --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def loaded(stream):
    return at_rate(stream, 14.0)  # near the defaults' limit under ttft:500 tpot:50, so the knobs matter


def test_tune_beats_or_matches_the_defaults(loaded, cost8b):
    slo = bl.parse_goodput("ttft:500 tpot:50")
    t = bl.tune(loaded, cost8b, slo, progress=False, **GRID)
    assert len(t.table) == 6 + 1  # vLLM's defaults (1024 seqs, 8192 tokens) are not in the grid: a row of their own
    assert t.table["vllm_default"].tolist() == [False] * 6 + [True]
    assert t.defaults["max_num_seqs"] == 1024 and t.defaults["max_num_batched_tokens"] == 8192
    assert t.best["request_goodput"] >= t.defaults["request_goodput"] > 0
    assert t.best["request_goodput"] >= 0.99 * t.table["request_goodput"].max()  # within goodput_rel_tol
    assert t.gain == pytest.approx(t.best["request_goodput"] / t.defaults["request_goodput"])
    row = t.table.iloc[0]
    res = bl.simulate(loaded, "chunked", cost8b, max_num_seqs=4, max_num_batched_tokens=256)
    assert row["request_goodput"] == slo.goodput(res) and row["slo_met"] == slo.met_by(res.summary())
    assert t.table["request_goodput"].nunique() > 2  # the knobs matter here, so the comparison is not trivial
    front = t.frontier
    assert not bl.is_dominated(front, "request_goodput", "p99_ttft_ms").any()
    assert t.table.loc[t.table["request_goodput"].idxmax(), "p99_ttft_ms"] >= front["p99_ttft_ms"].min()


def test_tune_marks_refused_pairs_and_finds_defaults_in_the_grid(loaded, cost8b):
    t = bl.tune(loaded.head(60), cost8b, bl.SLO(ttft_ms=500), max_num_seqs=[512, 1024],
                max_num_batched_tokens=[512, 8192], progress=False)
    assert len(t.table) == 4  # (1024, 8192) is in the grid
    refused = t.table[t.table["vllm_refuses"]]
    assert refused[["max_num_seqs", "max_num_batched_tokens"]].values.tolist() == [[1024, 512]]
    assert refused["request_goodput"].iloc[0] == 0.0 and not refused["slo_met"].iloc[0]
    assert np.isnan(refused["p99_ttft_ms"].iloc[0])
    assert t.table["vllm_default"].sum() == 1


def test_tune_equal_runs_keep_the_knobs_nearest_vllms_defaults(engine8b):
    # requests far apart each run alone with one chunk: every pair gives the same run, so no knob binds and the
    # pick is vLLM's defaults (1,024 seqs, 8,192 tokens on an H100) or, off the grid, the pair nearest them
    sparse = bl.Requests(np.arange(5) * 10.0, [500] * 5, [5] * 5)
    for tol in (0.01, 0.0):
        t = bl.tune(sparse, engine8b, bl.SLO(ttft_ms=500), max_num_seqs=[64, 4, 16],
                    max_num_batched_tokens=[2048, 1024], progress=False, goodput_rel_tol=tol)
        assert t.table["request_goodput"].nunique() == 1 and t.table["slo_load"].nunique() == 1
        assert (t.best["max_num_seqs"], t.best["max_num_batched_tokens"]) == (1024, 8192)
    grid_only = bl.tune(sparse, engine8b, bl.SLO(ttft_ms=500), max_num_seqs=[64, 4, 16, 1024],
                        max_num_batched_tokens=[2048, 1024, 8192], progress=False)
    assert (grid_only.best["max_num_seqs"], grid_only.best["max_num_batched_tokens"]) == (1024, 8192)
    capped = bl.tune(sparse, engine8b, bl.SLO(ttft_ms=500), max_num_seqs=[4, 16, 64],
                     max_num_batched_tokens=[1024, 2048], goodput_rel_tol=0.5, progress=False, max_model_len=0)
    assert capped.table["request_goodput"].nunique() == 1


# A steady stream of 1,500-token prompts every 0.2 s: every setting serves it all and goodput differs only in how
# the last requests drain. With 1,024 tokens a step the prompt takes two chunks (p99 TTFT ~60 ms, the most goodput);
# with 8,192, one (p99 TTFT ~57 ms, goodput lower by ~7e-5 of itself). Under a TTFT bound of 100 ms TTFT binds.
STEADY = bl.Requests(np.arange(120) / 5.0, [1500] * 120, [200] * 120)
STEADY_SLO = bl.SLO(ttft_ms=100, tpot_ms=200)


def _row(t, seqs, tokens):
    return t.table[(t.table["max_num_seqs"] == seqs) & (t.table["max_num_batched_tokens"] == tokens)].iloc[0]


# The serving terms this case was constructed with (a re-fit of data/calibration.csv must not undo it).
STEADY_TERMS = {k: PINNED_CALIBRATION[k] for k in ("request_latency_s", "frontend_s_per_token", "cpu_step_s",
                                                  "cpu_seq_s", "cpu_hidden_fraction")}


def test_tune_takes_the_tied_setting_with_the_most_slo_headroom(cost8b):
    cost8b = cost8b.replace(**STEADY_TERMS)
    t = bl.tune(STEADY, cost8b, STEADY_SLO, max_num_seqs=[64], max_num_batched_tokens=[1024, 8192], progress=False)
    one_chunk, two_chunks = _row(t, 64, 8192), _row(t, 64, 1024)
    # the case as constructed: a tie on goodput within 1 %, won on goodput by the pair with less headroom
    assert two_chunks["request_goodput"] > one_chunk["request_goodput"] > 0.99 * two_chunks["request_goodput"]
    assert one_chunk["p99_ttft_ms"] / 100 < two_chunks["p99_ttft_ms"] / 100 < 1
    assert one_chunk["p99_tpot_ms"] / 200 < one_chunk["p99_ttft_ms"] / 100  # TTFT is the binding metric
    res = bl.simulate(STEADY, "chunked", cost8b, max_num_seqs=64, max_num_batched_tokens=8192)
    s = res.summary()
    assert one_chunk["slo_load"] == pytest.approx(max(s["p99_ttft_ms"] / 100, s["p99_tpot_ms"] / 200), rel=1e-12)
    # lower p99 / bound; the defaults (1,024 seqs, 8,192 tokens) give the very same run, so they keep their cap
    assert (t.best["max_num_seqs"], t.best["max_num_batched_tokens"]) == (1024, 8192)
    assert t.best["slo_load"] == one_chunk["slo_load"] < two_chunks["slo_load"]
    assert t.best["request_goodput"] == t.defaults["request_goodput"] and t.gain == 1.0  # the default's run too
    # goodput_rel_tol=0: only the largest goodput ties, the strict-max answer
    strict = bl.tune(STEADY, cost8b, STEADY_SLO, max_num_seqs=[64], max_num_batched_tokens=[1024, 8192],
                     progress=False, goodput_rel_tol=0)
    assert (strict.best["max_num_seqs"], strict.best["max_num_batched_tokens"]) == (64, 1024)
    assert strict.best["request_goodput"] == strict.table["request_goodput"].max() and strict.gain > 1
    pd.testing.assert_frame_equal(strict.table, t.table)  # the tolerance changes the choice, not the runs


def test_tune_never_picks_below_the_defaults_goodput(cost8b):
    # Prompts of 3,000 tokens, 30 output tokens, 6 req/s; TPOT binds. With 1,024 tokens a step decodes wait less
    # (the lowest p99 TPOT) but TTFT grows and goodput is a little below the defaults' (1,024 seqs, 8,192 tokens).
    burst = bl.Requests(np.arange(120) / 6.0, [3000] * 120, [30] * 120)
    slo = bl.SLO(ttft_ms=2000, tpot_ms=200)
    t = bl.tune(burst, cost8b, slo, max_num_seqs=[8], max_num_batched_tokens=[1024, 8192], progress=False)
    small = _row(t, 8, 1024)
    assert 0.99 * t.defaults["request_goodput"] < small["request_goodput"] < t.defaults["request_goodput"]
    assert small["slo_load"] == t.table["slo_load"].min() < t.defaults["slo_load"]  # the most headroom, yet
    assert (t.best["max_num_seqs"], t.best["max_num_batched_tokens"]) == (1024, 8192)  # the defaults' run: theirs
    assert t.best["request_goodput"] == t.defaults["request_goodput"] and t.gain == 1.0


@given(seed=st.integers(0, 10_000), rate=st.floats(2.0, 40.0), tol=st.sampled_from([0.0, 0.005, 0.01, 0.05, 0.5]),
       seqs=st.lists(st.sampled_from([2, 8, 32, 128, 1024]), min_size=1, max_size=3, unique=True),
       tokens=st.lists(st.sampled_from([64, 256, 1024, 8192]), min_size=1, max_size=3, unique=True),
       bounds=st.sampled_from([(500, 50), (200, 25), (100, 10), (2000, 200)]))
def test_tune_pick_holds_its_rule_on_random_grids(cost8b, seed, rate, tol, seqs, tokens, bounds):
    reqs = bl.synthetic(60, 700, 60, prompt_cv=1.0, output_cv=1.0, rate_req_s=rate, seed=seed)
    slo = bl.SLO(ttft_ms=bounds[0], tpot_ms=bounds[1])
    t = bl.tune(reqs, cost8b, slo, max_num_seqs=seqs, max_num_batched_tokens=tokens, progress=False,
                goodput_rel_tol=tol)
    accepted = t.table[~t.table["vllm_refuses"]]
    goodput, dflt = accepted["request_goodput"], t.defaults["request_goodput"]
    assert t.best["request_goodput"] >= dflt and t.gain >= 1  # the acceptance line, always
    assert t.best["request_goodput"] >= (1 - tol) * goodput.max()
    candidates = accepted[(goodput >= (1 - tol) * goodput.max()) & (goodput >= dflt)]
    loads = candidates["slo_load"]
    assert t.best["slo_load"] <= loads.min() * (1 + tol) or np.isnan(loads).all()  # loads within tol tie too
    if tol == 0:
        assert t.best["request_goodput"] == goodput.max()
    assert t.best["slo_load"] == slo.load(_row(t, t.best["max_num_seqs"], t.best["max_num_batched_tokens"]))


def test_tune_searches_the_threshold_when_given(loaded, cost8b):
    t = bl.tune(loaded.head(100), cost8b, bl.SLO(ttft_ms=500), max_num_seqs=[64], max_num_batched_tokens=[2048],
                long_prefill_token_threshold=[0, 256], progress=False)
    assert t.table["long_prefill_token_threshold"].tolist() == [0, 256, 0]  # and vLLM's defaults, threshold 0
    assert "long_prefill_token_threshold" in t.best


def test_tune_is_deterministic_and_executor_independent(loaded, cost8b):
    slo = bl.SLO(ttft_ms=500, tpot_ms=50)
    a = bl.tune(loaded, cost8b, slo, progress=False, **GRID)
    b = bl.tune(loaded, cost8b, slo, progress=False, **GRID)
    with ProcessPoolExecutor(2) as pool:
        c = bl.tune(loaded, cost8b, slo, executor=pool, progress=False, **GRID)
    for other in (b, c):
        pd.testing.assert_frame_equal(a.table, other.table)
        pd.testing.assert_frame_equal(a.frontier, other.frontier)
        assert a.best == other.best and a.defaults == other.defaults and a.gain == other.gain


@pytest.mark.parametrize("kwargs, match", [({"max_num_seqs": []}, "non-empty"), ({"max_num_seqs": [0]}, ">= 1"),
                                           ({"max_num_batched_tokens": [512, 512]}, "repeated"),
                                           ({"max_num_seqs": "64"}, "non-empty list")])
def test_tune_rejects_bad_grids(stream, cost8b, kwargs, match):
    with pytest.raises(ValueError, match=match):
        bl.tune(stream, cost8b, bl.SLO(ttft_ms=500), progress=False, **kwargs)


@pytest.mark.parametrize("tol", [-0.01, 1, 1.5, float("nan"), float("inf"), True, "0.01", None])
def test_tune_rejects_a_bad_goodput_rel_tol(stream, cost8b, tol):
    with pytest.raises(ValueError, match="goodput_rel_tol"):
        bl.tune(stream.head(20), cost8b, bl.SLO(ttft_ms=500), progress=False, goodput_rel_tol=tol)


def test_tune_needs_an_slo(stream, cost8b):
    with pytest.raises(ValueError, match="batchlab.SLO"):
        bl.tune(stream, cost8b, "ttft:500", progress=False)


def test_sweep_with_an_slo_adds_goodput_columns_only(stream, cost8b):
    slo = bl.SLO(ttft_ms=300, tpot_ms=30)
    plain = bl.sweep(stream.head(80), GRID, cost8b, progress=False)
    graded = bl.sweep(stream.head(80), GRID, cost8b, progress=False, slo=slo)
    assert list(graded.columns) == list(plain.columns) + ["request_goodput", "slo_met"]
    pd.testing.assert_frame_equal(graded[plain.columns], plain)
    res = bl.simulate(stream.head(80), "chunked", cost8b, max_num_seqs=64, max_num_batched_tokens=2048)
    assert graded["request_goodput"].iloc[-1] == slo.goodput(res)


def test_tune_shows_a_progress_bar(loaded, cost8b, capsys):
    bl.tune(loaded.head(40), cost8b, bl.SLO(ttft_ms=500), max_num_seqs=[8, 16, 32], max_num_batched_tokens=[512, 1024],
            progress=True)
    assert "sweep" in capsys.readouterr().err  # tqdm writes its bar to stderr
