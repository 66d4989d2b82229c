"""Every bad or edge input of issue 16, one row each: a ValueError whose message names the field (and, where it has
one, the allowed range), or a sane result where the input is valid.

The rows are what a careless or hurried user types: token counts that wrap int64, datetimes or epoch nanoseconds as
arrivals, strings as flags, booleans as numbers, NumPy scalars, custom hardware with zero bandwidth, misspelt sweep
knobs. Each refusal must be a ``ValueError`` (never a ``TypeError`` from deep inside, a numba typing error or an
executor's traceback), and its message must name the field that is wrong, not another one.
"""
import datetime
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import batchlab as bl


@pytest.fixture(scope="module")
def ctx(h100):
    m = bl.get_model("llama-3-8b")
    cost = bl.CostModel(h100, m)
    reqs = bl.Requests([0.0, 0.1], [10, 20], [5, 5])
    return SimpleNamespace(h=h100, m=m, cost=cost, reqs=reqs, run=bl.simulate(reqs, "chunked", cost))


def req(arrival=(0.0, 1.0), prompt=(10, 20), output=(3, 3)):
    return bl.Requests(list(arrival) if isinstance(arrival, tuple) else arrival,
                       list(prompt) if isinstance(prompt, tuple) else prompt,
                       list(output) if isinstance(output, tuple) else output)


TOKENS = r"from 1 to 2\*\*40"
BAD = {
    # 1. token counts past int64 (or past the stated 2**40 maximum) are refused before any cast
    "prompt 2**63": (lambda c: req(prompt=[2**63, 1]), "prompt_tokens must hold whole numbers " + TOKENS),
    "prompt 1e19": (lambda c: req(prompt=[1e19, 1]), "prompt_tokens.*" + TOKENS),
    "prompt 1e300": (lambda c: req(prompt=[1e300, 1]), "prompt_tokens.*" + TOKENS),
    "prompt uint64 max": (lambda c: req(prompt=np.array([2**64 - 1, 1], np.uint64)), "prompt_tokens.*" + TOKENS),
    "output 2**63 - 1": (lambda c: req(output=np.array([2**63 - 1, 1], np.int64)), "output_tokens.*" + TOKENS),
    "output 2**40 + 1": (lambda c: req(output=[2**40 + 1, 1]), "output_tokens.*found 1.09951e\\+12"),
    "prompt 2**70 (object)": (lambda c: req(prompt=[2**70, 1]), "prompt_tokens must hold.*dtype object"),
    "prompt strings": (lambda c: req(prompt=["10", "20"]), "prompt_tokens must hold.*dtype <U2"),
    "stream over 2**62": (lambda c: bl.Requests(np.zeros(2**23), np.full(2**23, 2**40), np.ones(2**23, np.int64)),
                          r"sum to at most 2\*\*62"),
    "generator mean 1e300": (lambda c: bl.lengths_lognormal(3, 1e300, 1.0), "mean must be .*2\\*\\*40"),
    "generator max_tokens 2**63": (lambda c: bl.lengths_lognormal(3, 10, 1.0, max_tokens=2**63), "max_tokens"),
    "uniform high 2**63": (lambda c: bl.lengths_uniform(3, 1, 2**63), "high must be an integer from 1 to"),
    "uniform low > high": (lambda c: bl.lengths_uniform(3, 5, 4), "high must be an integer from 5 to"),
    "empirical quantiles strings": (lambda c: bl.lengths_empirical(3, ["a", "b"]), "quantiles must be"),
    "static b*p^2 past 2**63": (lambda c: bl.simulate(req(prompt=[2**33, 1]), "static", c.cost,
                                                      num_kv_blocks=2**30, block_size=2**6),
                                r"prefill work .* pass 2\*\*63"),
    # 2. datetimes and epoch timestamps as arrivals
    "epoch ns floats": (lambda c: req(arrival=[1.7e18, 1.7e18 + 1e9]), "arrival_s must be seconds since the stream"
                                                                       ".*epoch timestamp: pass seconds"),
    "epoch s floats": (lambda c: req(arrival=[1.7e9, 1.7e9 + 1]), "arrival_s.*from 0 to 1e\\+08.*epoch"),
    "epoch ns ints": (lambda c: req(arrival=np.array([1_700_000_000_000_000_000, 1_700_000_001_000_000_000])),
                      "arrival_s.*epoch"),
    "NaT arrival": (lambda c: req(arrival=np.array(["2024-01-01", "NaT"], "datetime64[ns]")), "arrival_s holds NaT"),
    "datetimes unsorted": (lambda c: req(arrival=[datetime.datetime(2024, 1, 2), datetime.datetime(2024, 1, 1)]),
                           "arrival_s must be sorted"),
    "complex arrivals": (lambda c: req(arrival=[0j, 1j]), "arrival_s must hold real numbers.*complex128"),
    "string arrivals": (lambda c: req(arrival=["0", "1"]), "arrival_s must hold real numbers.*<U1"),
    "negative arrival": (lambda c: req(arrival=[-1.0, 0.0]), "arrival_s must be seconds >= 0, found -1"),
    # 3. strings as flags, booleans as numbers
    "enable_chunked_prefill='no'": (lambda c: bl.simulate(c.reqs, "chunked", c.cost, enable_chunked_prefill="no"),
                                    "enable_chunked_prefill must be True or False, got 'no'"),
    "prefill_only_steps='False'": (lambda c: bl.simulate(c.reqs, "continuous", c.cost, prefill_only_steps="False"),
                                   "prefill_only_steps must be True or False, got 'False'"),
    "record_schedule='no'": (lambda c: bl.simulate(c.reqs, "chunked", c.cost, record_schedule="no"),
                             "record_schedule must be True or False"),
    "record_tokens=1": (lambda c: bl.simulate(c.reqs, "chunked", c.cost, record_tokens=1), "record_tokens must be"),
    "async_scheduling=0": (lambda c: bl.simulate(c.reqs, "chunked", c.cost, async_scheduling=0),
                           "async_scheduling must be True or False, got 0"),
    "asynchronous='no' (step_time)": (lambda c: c.cost.step_time(decode_contexts=[10], asynchronous="no"),
                                      "asynchronous must be True or False"),
    "shared_system_prompt='yes'": (lambda c: bl.multi_turn(2, 2, 10, 10, 10, shared_system_prompt="yes"),
                                   "shared_system_prompt must be True or False"),
    "overhead_s=True": (lambda c: bl.CostModel(c.h, c.m, overhead_s=True),
                        "overhead_s must be a finite number of seconds >= 0, got True"),
    "eta_compute=True": (lambda c: bl.CostModel(c.h, c.m, eta_compute=True), r"eta_compute must be in \(0, 1\]"),
    "max_queue_delay_s=True": (lambda c: bl.simulate(c.reqs, "dynamic", c.cost, max_queue_delay_s=True),
                               "max_queue_delay_s must be finite seconds >= 0, got True"),
    "gpu_memory_utilization=True": (lambda c: bl.simulate(c.reqs, "chunked", c.cost, gpu_memory_utilization=True),
                                    r"gpu_memory_utilization must be a finite number in \(0, 1\], got True"),
    "max_num_seqs=True": (lambda c: bl.simulate(c.reqs, "chunked", c.cost, max_num_seqs=True),
                          "max_num_seqs must be an integer from 1 to"),
    "speedup=True": (lambda c: c.reqs.scale_time(True), "speedup must be a finite number > 0, got True"),
    "rate_req_s=True": (lambda c: bl.arrivals_gamma(3, True), "rate_req_s must be a number > 0"),
    "n_requests=True": (lambda c: bl.synthetic(True, 10, 10), "n_requests must be an integer from 1 to 2\\*\\*31"),
    # 5. custom hardware and model specs
    "Hardware zero bandwidth": (lambda c: c.h._replace(hbm_bytes_per_s=0.0),
                                "Hardware.hbm_bytes_per_s must be a finite number > 0, got 0.0"),
    "Hardware negative FLOP/s": (lambda c: bl.Hardware("x", -1.0, 1.0, 1.0, 1.0, 1.0, False),
                                 "Hardware.flops_bf16 must be a finite number > 0, got -1.0"),
    "Hardware NaN capacity": (lambda c: c.h._replace(hbm_bytes=math.nan), "Hardware.hbm_bytes"),
    "Hardware has_fp8='no'": (lambda c: c.h._replace(has_fp8="no"), "Hardware.has_fp8 must be True or False"),
    "ModelSpec zero layers": (lambda c: c.m._replace(layers=0), "ModelSpec.layers must be an integer from 1 to"),
    "ModelSpec negative params": (lambda c: c.m._replace(params=-5), "ModelSpec.params must be an integer from 0"),
    "ModelSpec kv_heads=0": (lambda c: c.m._replace(kv_heads=0), "ModelSpec.kv_heads must be an integer from 1"),
    "ModelSpec kv_heads > heads": (lambda c: c.m._replace(kv_heads=64), r"kv_heads \(64\) must be from 1 to heads"),
    "ModelSpec params < tables": (lambda c: c.m._replace(params=1000), "params .* must be at least the embedding"),
    "ModelSpec layers=2.0": (lambda c: c.m._replace(layers=2.0), "ModelSpec.layers must be an integer"),
    "CostModel of a bypassed Hardware": (
        lambda c: bl.CostModel(tuple.__new__(bl.Hardware, c.h[:3] + (0.0,) + c.h[4:]), c.m),
        "Hardware.hbm_bytes_per_s must be a finite number > 0"),
    "CostModel tp=2**63": (lambda c: bl.CostModel(c.h, c.m, tp=2**63), "tp must be an integer from 1 to 8"),
    "CostModel dtype list": (lambda c: bl.CostModel(c.h, c.m, dtype=["fp8"]), "dtype must be one of"),
    # 6. sweep
    "sweep empty grid": (lambda c: bl.sweep(c.reqs, {}, c.cost, progress=False), "grid must name at least one knob"),
    "sweep grid=None": (lambda c: bl.sweep(c.reqs, None, c.cost, progress=False), "grid must be a mapping"),
    "sweep grid='max_num_seqs'": (lambda c: bl.sweep(c.reqs, "max_num_seqs", c.cost), "grid must be a mapping"),
    "sweep misspelt knob": (lambda c: bl.sweep(c.reqs, {"max_num_seq": [4]}, c.cost, progress=False),
                            "unknown knob 'max_num_seq' .*did you mean 'max_num_seqs'.*knobs are"),
    "sweep misspelt knob, executor": (
        lambda c: bl.sweep(c.reqs, {"max_num_seq": [4]}, c.cost, executor=_NeverRun(), progress=False),
        "unknown knob 'max_num_seq'"),
    "sweep misspelt fixed knob": (lambda c: bl.sweep(c.reqs, {"max_num_seqs": [4]}, c.cost, progress=False,
                                                     block_sise=16), "unknown knob 'block_sise'"),
    "sweep misspelt knob in a list": (lambda c: bl.sweep(c.reqs, [{"max_num_seqs": 4}, {"polcy": "static"}],
                                                         c.cost, progress=False), r"grid\[1\] names an unknown knob"),
    # 7. wrong exception types or wrong causes
    "string rate": (lambda c: bl.arrivals_gamma(3, "10"), "rate_req_s must be a number > 0 requests/s"),
    "string rate, synthetic": (lambda c: bl.synthetic(3, 10, 10, rate_req_s="10"), "rate_req_s must be"),
    "string rate, preset": (lambda c: bl.preset("sharegpt", 3, rate_req_s="10"), "rate_req_s must be"),
    "string mean": (lambda c: bl.lengths_lognormal(3, "10", 1.0), "mean must be a finite number of tokens"),
    "list name to preset": (lambda c: bl.preset(["sharegpt"], 3), "preset must be one of"),
    "list name to replay": (lambda c: bl.replay(["azure-code-2023"]), "dataset must be one of"),
    "list name to trace_stats": (lambda c: bl.trace_stats(["sharegpt"]), "preset must be one of"),
    "policy as a list": (lambda c: bl.simulate(c.reqs, ["chunked"], c.cost), "policy must be one of"),
    "max_num_seqs=2**63": (lambda c: bl.simulate(c.reqs, "chunked", c.cost, max_num_seqs=2**63),
                           "max_num_seqs must be an integer from 1 to 1099511627776, got 9223372036854775808"),
    "max_num_batched_tokens=-2**63": (lambda c: bl.simulate(c.reqs, "chunked", c.cost,
                                                            max_num_batched_tokens=-2**63), "max_num_batched_tokens"),
    "block_size=2**40": (lambda c: bl.simulate(c.reqs, "chunked", c.cost, block_size=2**40),
                         "block_size must be an integer from 1 to 65536"),
    "num_kv_blocks=2**63": (lambda c: bl.simulate(c.reqs, "chunked", c.cost, num_kv_blocks=2**63), "num_kv_blocks"),
    "rate=1e-320": (lambda c: bl.synthetic(3, 10, 10, rate_req_s=1e-320), "rate_req_s=1e-320 req/s spreads"),
    "rate=1e-320, gamma": (lambda c: bl.arrivals_gamma(3, 1e-320), "rate_req_s=1e-320.*raise rate_req_s"),
    "rate=nan": (lambda c: bl.arrivals_gamma(3, math.nan), "rate_req_s must be a number > 0"),
    "speedup=inf": (lambda c: c.reqs.scale_time(math.inf), "speedup must be a finite number > 0, got inf"),
    "replay speedup string": (lambda c: bl.replay("azure-code-2023", speedup="2"), "speedup must be a finite"),
    "replay limit 0": (lambda c: bl.replay("azure-code-2023", limit=0), "limit must be an integer from 1 to"),
    "replay limit 2.5": (lambda c: bl.replay("azure-code-2023", limit=2.5), "limit must be an integer"),
    "head('3')": (lambda c: c.reqs.head("3"), "n_requests must be an integer from 1"),
    "seed=-1": (lambda c: bl.synthetic(5, 100, 10, seed=-1), "seed must be an integer >= 0"),
    "prefill_time('8000')": (lambda c: c.cost.prefill_time("8000"), "tokens must be an integer from 1 to"),
    "prefill_time(2**63)": (lambda c: c.cost.prefill_time(2**63), "tokens must be an integer from 1 to"),
    "kv_pool_blocks(max_num_seqs=-1)": (lambda c: c.cost.kv_pool_blocks(max_num_seqs=-1), "max_num_seqs must be"),
    # 9. fleets, disaggregated serving and goodput (added after the list, as the API grew)
    "fleet n_replicas 0": (lambda c: bl.simulate_fleet(c.reqs, c.cost, 0),
                           r"^n_replicas must be an integer from 1 to 1024, got 0$"),
    "fleet n_replicas True": (lambda c: bl.simulate_fleet(c.reqs, c.cost, True), r"^n_replicas must be .*got True$"),
    "fleet n_replicas '2'": (lambda c: bl.simulate_fleet(c.reqs, c.cost, "2"), r"^n_replicas must be .*got '2'$"),
    "fleet n_replicas 2**63": (lambda c: bl.simulate_fleet(c.reqs, c.cost, 2**63), r"^n_replicas must be .* 1024"),
    "fleet router": (lambda c: bl.simulate_fleet(c.reqs, c.cost, 2, router="random"),
                     r"^router must be one of \['round_robin', 'least_outstanding', 'prefix_aware'\], got 'random'$"),
    "fleet misspelt knob": (lambda c: bl.simulate_fleet(c.reqs, c.cost, 2, max_num_seq=4),
                            r"^unknown knob 'max_num_seq' for a fleet of chunked engines; allowed: "),
    "fleet policy knob": (lambda c: bl.simulate_fleet(c.reqs, c.cost, 2, policy="static"), r"^unknown knob 'policy'"),
    "fleet record_tokens 'no'": (lambda c: bl.simulate_fleet(c.reqs, c.cost, 2, record_tokens="no"),
                                 r"^record_tokens must be True or False, got 'no'$"),
    "fleet max_num_seqs 0": (lambda c: bl.simulate_fleet(c.reqs, c.cost, 2, max_num_seqs=0),
                             r"^max_num_seqs must be an integer from 1 to"),
    "fleet requests list": (lambda c: bl.simulate_fleet([1, 2], c.cost, 2), r"^requests must be a batchlab.Requests"),
    "disaggregated n_prefill 0": (lambda c: bl.simulate_disaggregated(c.reqs, c.cost, 0, 1),
                                  r"^n_prefill must be an integer from 1 to 1024, got 0$"),
    "disaggregated n_decode '1'": (lambda c: bl.simulate_disaggregated(c.reqs, c.cost, 1, "1"),
                                   r"^n_decode must be an integer from 1 to 1024, got '1'$"),
    "disaggregated link None": (lambda c: bl.simulate_disaggregated(c.reqs, c.cost, 1, 1, link=None),
                                r"^link must be one of \['nvlink', 'network'\], got None$"),
    "disaggregated link typo": (lambda c: bl.simulate_disaggregated(c.reqs, c.cost, 1, 1, link="nvlnk"),
                                r"^link must be one of .*got 'nvlnk'$"),
    "goodput SLO string": (lambda c: bl.metrics.goodput(c.run.requests, ttft_s="0.5"),
                           r"^ttft_s SLO must be > 0 seconds, got '0.5'$"),
    "goodput SLO True": (lambda c: bl.metrics.goodput(c.run.requests, tpot_s=True),
                         r"^tpot_s SLO must be > 0 seconds, got True$"),
    "goodput SLO nan": (lambda c: bl.metrics.goodput(c.run.requests, e2el_s=math.nan),
                        r"^e2el_s SLO must be > 0 seconds, got nan$"),
    "goodput of a dict": (lambda c: bl.metrics.goodput({}, ttft_s=0.5),
                          r"^requests must be a per-request table \(SimResult.requests\).*missing \['rejected'"),
}


class _NeverRun:
    """An executor that fails the test if a configuration reaches it."""

    def submit(self, *args, **kwargs):
        raise AssertionError("a misspelt knob reached the executor")


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_is_a_value_error_naming_the_field(ctx, case):
    call, match = BAD[case]
    with pytest.raises(ValueError, match=match):
        call(ctx)


# -- valid inputs of the same kinds get a sane result ----------------------------------------------------------
SECONDS = np.array([0.0, 1.5, 3.0])


@pytest.mark.parametrize("arrival", [
    np.array(["2024-01-01T00:00:00", "2024-01-01T00:00:01.5", "2024-01-01T00:00:03"], "datetime64[ns]"),
    np.array(["2024-01-01T00:00:00.000", "2024-01-01T00:00:01.500", "2024-01-01T00:00:03.000"], "datetime64[ms]"),
    [datetime.datetime(2024, 1, 1), datetime.datetime(2024, 1, 1, 0, 0, 1, 500000),
     datetime.datetime(2024, 1, 1, 0, 0, 3)],
    [pd.Timestamp("2024-01-01 12:00:00"), pd.Timestamp("2024-01-01 12:00:01.5"), pd.Timestamp("2024-01-01 12:00:03")],
    pd.Series(pd.to_datetime(["2024-01-01 00:00:00.0", "2024-01-01 00:00:01.5", "2024-01-01 00:00:03.0"], utc=True)),
    np.array([0, 1500, 3000], "timedelta64[ms]"),
    [datetime.timedelta(0), datetime.timedelta(seconds=1.5), datetime.timedelta(seconds=3)],
], ids=["datetime64[ns]", "datetime64[ms]", "datetime", "Timestamp", "tz-aware Series", "timedelta64", "timedelta"])
def test_datetimes_become_seconds_since_the_first(arrival):
    r = bl.Requests(arrival, [10, 10, 10], [2, 2, 2])
    np.testing.assert_array_equal(r.arrival_s, SECONDS)


def test_datetime_arrivals_give_the_same_run_as_seconds(engine8b):
    start = np.datetime64("2024-05-01T09:00:00", "ns")
    as_dates = bl.Requests(start + (SECONDS * 1e9).astype("timedelta64[ns]"), [100, 200, 300], [4, 4, 4])
    as_seconds = bl.Requests(SECONDS, [100, 200, 300], [4, 4, 4])
    a = bl.simulate(as_dates, "chunked", engine8b).summary()
    b = bl.simulate(as_seconds, "chunked", engine8b).summary()
    assert a == b and a["duration"] < 10  # not 1e9 s


class _Python:
    """NumPy's scalar constructors, returning the same value as a Python number (``np.float32(0.1)`` as the float
    it rounds to), so a call made with these and with NumPy's own must agree."""

    def __getattr__(self, name):
        return lambda value: getattr(np, name)(value).item()


_PYTHON = _Python()


def _same(a, b) -> bool:
    """Two results of one call agree: runs by their summaries, tables and arrays element by element."""
    if hasattr(a, "summary") and callable(a.summary):
        return a.summary() == b.summary()
    if isinstance(a, pd.DataFrame):
        return a.equals(b)
    if isinstance(a, bl.Requests):
        return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("arrival_s", "prompt_tokens",
                                                                            "output_tokens"))
    if isinstance(a, tuple) and not hasattr(a, "_fields"):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


@pytest.mark.parametrize("call", [
    lambda c, n: bl.simulate(c.reqs, "chunked", c.cost, max_num_seqs=n.int64(8), max_num_batched_tokens=n.int32(512)),
    lambda c, n: bl.simulate(c.reqs, "dynamic", c.cost, batch_size=n.int16(4), max_queue_delay_s=n.float32(0.01)),
    lambda c, n: bl.simulate(c.reqs, "chunked", c.cost, enable_chunked_prefill=n.bool_(False),
                          gpu_memory_utilization=n.float32(0.9), max_model_len=n.int64(4096)),
    lambda c, n: bl.CostModel(c.h, c.m, eta_compute=n.float32(0.5), tp=n.int64(2), overhead_s=n.float64(1e-3)),
    lambda c, n: c.reqs.scale_time(n.float32(2.0)),
    lambda c, n: c.reqs.head(n.int64(1)),
    lambda c, n: bl.synthetic(n.int64(5), n.float32(100), n.int32(10), rate_req_s=n.float32(3.0), seed=n.uint8(1)),
    lambda c, n: bl.lengths_uniform(n.int64(3), n.int8(1), n.int64(9)),
    lambda c, n: bl.preset("sharegpt", n.int64(5), rate_req_s=n.float32(2.0)),
    lambda c, n: bl.multi_turn(2, n.int64(2), 10, 10, 10, turn_gap_s=n.float32(1.0), shared_system_prompt=n.bool_(1)),
    lambda c, n: c.h._replace(hbm_bytes_per_s=n.float32(3e12)),
    lambda c, n: c.m._replace(layers=n.int64(16)),
    lambda c, n: bl.sweep(c.reqs, {"max_num_seqs": np.array([4, 8])}, c.cost, progress=False, block_size=n.int64(16)),
    lambda c, n: bl.simulate_fleet(c.reqs, c.cost, n.int64(2), max_num_seqs=n.int32(4)),
    lambda c, n: bl.simulate_disaggregated(c.reqs, c.cost, n.int8(1), n.uint16(2)),
    lambda c, n: bl.metrics.goodput(c.run.requests, ttft_s=n.float32(0.5), e2el_s=n.int64(2)),
], ids=["int knobs", "dynamic knobs", "flag and float knobs", "cost fields", "scale_time", "head", "synthetic",
        "uniform", "preset", "multi_turn", "hardware field", "model field", "sweep", "fleet", "disaggregated",
        "goodput"])
def test_numpy_scalars_are_accepted_where_python_numbers_are(ctx, call):
    """Each call with NumPy scalars gives what it gives with the same values as Python numbers."""
    assert _same(call(ctx, np), call(ctx, _PYTHON))


def test_goodput_reads_a_result_as_its_table_and_an_infinite_slo_as_no_limit(ctx):
    table = ctx.run.requests
    assert bl.metrics.goodput(ctx.run, ttft_s=0.5) == bl.metrics.goodput(table, ttft_s=0.5)
    every_completed = (~table["rejected"]).sum() / (table["finish_s"].max() - table["arrival_s"].min())
    assert bl.metrics.goodput(table, ttft_s=math.inf) == pytest.approx(every_completed, rel=1e-12)


def test_numpy_efficiency_gives_the_same_model_as_a_float(ctx):
    assert bl.CostModel(ctx.h, ctx.m, eta_compute=np.float32(0.5)) == bl.CostModel(ctx.h, ctx.m, eta_compute=0.5)


def test_replay_takes_numpy_limit_and_speedup(monkeypatch, tmp_path):
    from batchlab import datasets
    path = tmp_path / "t.jsonl"
    path.write_text("".join(f'{{"timestamp": {t}, "input_length": 10, "output_length": 2, "hash_ids": [{t}]}}\n'
                            for t in (0, 3000, 6000, 9000)))
    monkeypatch.setattr(datasets, "fetch", lambda name: path)
    r = bl.replay("mooncake-conversation", speedup=np.float32(2.0), limit=np.int64(3))
    np.testing.assert_allclose(r.arrival_s, [0.0, 1.5, 3.0])


def test_largest_accepted_tokens_run_without_wrapping(engine8b):
    """2**40-token requests are accepted and (as the pool cannot hold them) rejected up front, never reported
    as completed with a 6.8 ms TTFT or negative steps. Chunked clips the long output to max_model_len (8,192 for
    Llama-3-8B) as vLLM does, so that request completes with 8,092 tokens."""
    r = bl.Requests([0.0, 0.0], [2**40, 100], [1, 2**40 - 100])
    for policy in ("static", "continuous"):
        s = bl.simulate(r, policy, engine8b, record_tokens=False).summary()
        assert (s["completed"], s["rejected"]) == (0, 2), policy
    s = bl.simulate(r, "chunked", engine8b, record_tokens=False).summary()
    assert (s["completed"], s["rejected"], s["total_output_tokens"]) == (1, 1, 8192 - 100)
    assert s["duration"] > 0 and s["mean_ttft_ms"] > 0
    for policy in ("static", "continuous", "chunked"):
        res = bl.simulate(bl.Requests([0.0], [2**40], [1]), policy, engine8b, record_tokens=False)
        assert res.requests["rejected"].all()


def test_static_prefill_of_a_3e9_token_prompt_does_not_overflow(engine8b):
    """Static prefill work is b p^2: 3e9 tokens squared passes int64 but only a pool of billions of tokens admits
    such a prompt, and that pool is refused above; a pool that admits a 3e6-token prompt gives a positive step."""
    r = bl.Requests([0.0], [3_000_000], [1])
    res = bl.simulate(r, "static", engine8b, num_kv_blocks=200_000, block_size=16)
    steps = res.steps
    assert len(steps) == 1 and steps["duration_s"].iloc[0] > 0 and not res.requests["rejected"].any()
    assert steps["duration_s"].iloc[0] == pytest.approx(engine8b.step_time(prefill_chunks=[(3_000_000, 0)],
                                                                           asynchronous=False), rel=1e-12)
