"""Tuning for your own traffic: goodput under an SLO, the largest rate a configuration sustains, and the tuner.

An SLO (:class:`SLO`) bounds a request's TTFT, TPOT and end-to-end latency in milliseconds, as
``vllm bench serve --goodput ttft:500 tpot:50`` does (:func:`parse_goodput` reads that syntax). It is read two
ways, and the book keeps them apart:

- **goodput** (:meth:`SLO.goodput`), vLLM's definition: requests per second that completed with *every* bound
  met, each request judged on its own latencies (``request_goodput`` in ``summary(slo=...)``).
- **the SLO holds** (:meth:`SLO.met_by`, ``slo_met``): the run's ``percentile`` (p99 by default) of every
  bounded latency is within its bound, the way a service-level objective is usually written.

:func:`max_rate` finds the largest request rate at which a configuration still holds the SLO (bisection on a
time scaling of the given arrivals); :func:`tune` searches ``max_num_seqs`` x ``max_num_batched_tokens`` (and
optionally ``long_prefill_token_threshold``) for the largest goodput, beside vLLM's defaults, and among settings
whose goodputs tie (within ``goodput_rel_tol``) takes the one with the most SLO headroom (:meth:`SLO.load`, the
``slo_load``). Used in chapter 09 (``notebooks/09_tuning.ipynb``) and by ``python -m batchlab tune``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from .sim import simulate
from .vllm import vllm_defaults
from .sweep import pareto_front, sweep

SLO_KEYS = ("ttft", "tpot", "e2el", "itl")  # vLLM's --goodput keys and batchlab's itl, values in ms
# The summary() statistic each bound reads: itl bounds a request's longest gap between two tokens, not vLLM's
# pooled ITL percentiles, which count gaps, not requests.
SLO_STAT = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2el", "itl": "longest_itl"}
PERCENTILE_PREFIX = {50.0: "median", 90.0: "p90", 99.0: "p99"}  # the percentiles summary() reports
DEFAULT_MAX_NUM_SEQS = (8, 16, 32, 64, 128, 256, 512, 1024)
DEFAULT_MAX_NUM_BATCHED_TOKENS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
KNOBS = ("max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold")


def _check_bound(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number of milliseconds > 0 (or None), got {value!r}")


@dataclasses.dataclass(frozen=True)
class SLO:
    """Latency bounds per request, in milliseconds, and the percentile at which the run must hold them.

    Parameters
    ----------
    ttft_ms, tpot_ms, e2el_ms : float, optional
        Bounds on time to first token, time per output token and end-to-end latency (ms, > 0), vLLM's three.
    itl_ms : float, optional
        A bound on each request's **longest** gap between two consecutive tokens (ms, > 0): the longest stall its
        user sees. vLLM's ``--goodput`` has no such key. TPOT is the mean gap and hides a stall (one 500 ms pause
        among 200 tokens at 20 ms adds 2.4 ms to it); vLLM's ITL percentiles pool the gaps of all requests, so
        they cannot judge one request; and a request's own p99 gap over a few hundred tokens is its longest gap
        or the next. The longest gap is what the tail of the inter-token latency is made of. Needs the token
        record: :func:`tune`, :func:`max_rate` and ``sweep`` turn it on for such an SLO.
    percentile : float, default 99.0
        In (0, 100]: the SLO holds for a run when this percentile of every bounded latency is within its bound
        (:meth:`met_by`; for ``itl``, the percentile of the requests' longest gaps). Goodput (:meth:`goodput`)
        judges each request on its own and ignores it.

    At least one bound.
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    itl_ms: float | None = None
    percentile: float = 99.0

    def __post_init__(self):
        for key in SLO_KEYS:
            _check_bound(f"{key}_ms", getattr(self, f"{key}_ms"))
        if all(getattr(self, f"{key}_ms") is None for key in SLO_KEYS):
            raise ValueError("an SLO needs at least one bound: ttft_ms, tpot_ms, e2el_ms or itl_ms (milliseconds > 0)")
        p = self.percentile
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or not 0 < p <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {p!r}")

    @property
    def bounds_ms(self) -> dict[str, float]:
        """The given bounds, ``{"ttft": 500.0, ...}`` (ms)."""
        return {key: float(getattr(self, f"{key}_ms")) for key in SLO_KEYS if getattr(self, f"{key}_ms") is not None}

    def spec(self) -> str:
        """The bounds in vLLM's ``--goodput`` syntax, ``"ttft:500 tpot:50"`` (:func:`parse_goodput` reads it)."""
        return " ".join(f"{key}:{value:g}" for key, value in self.bounds_ms.items())

    def _prefix(self) -> str:
        prefix = PERCENTILE_PREFIX.get(float(self.percentile))
        if prefix is None:
            raise ValueError(f"summary() reports the 50th, 90th and 99th percentiles only, not {self.percentile!r}")
        return prefix

    def met_by(self, summary: dict) -> bool:
        """Whether the ``percentile`` of every bounded latency in ``summary`` (a ``summary()`` dict) is within it.

        Reads ``median_<m>_ms``, ``p90_<m>_ms`` or ``p99_<m>_ms``, the percentiles ``summary()`` reports; any
        other ``percentile`` raises ValueError.
        """
        prefix = self._prefix()
        return all(summary[f"{prefix}_{SLO_STAT[key]}_ms"] <= bound for key, bound in self.bounds_ms.items())

    def load(self, summary):
        """How close a run is to the SLO's percentile bounds: the largest ``percentile value / bound`` (no unit).

        The max over the bounded latencies of, e.g., ``p99_ttft_ms / ttft_ms``, read from ``summary`` (a
        ``summary()`` dict, a row of :func:`tune`'s table, or the whole table, for one value per row): below 1 the
        SLO holds with room to spare (0.5: every bounded p99 at most half its bound), above 1 it fails; the SLO
        holds (:meth:`met_by`) exactly when it is <= 1. NaN where a bounded percentile is NaN. Reads the same
        keys as :meth:`met_by`.
        """
        prefix = self._prefix()
        ratios = [np.asarray(summary[f"{prefix}_{SLO_STAT[key]}_ms"], dtype=float) / bound
                  for key, bound in self.bounds_ms.items()]
        out = np.maximum.reduce(ratios)  # NaN propagates
        return float(out) if np.ndim(out) == 0 else out

    def goodput(self, sim_result) -> float:
        """Requests per second that completed with every bound met (vLLM's ``--goodput``), of a :class:`SimResult`.

        Over the run's duration (first arrival to last finish, as ``request_throughput``); a one-token output has
        no TPOT and meets any TPOT bound, as in vLLM.
        """
        seconds = {f"{key}_s": bound / 1e3 for key, bound in self.bounds_ms.items()}
        return float(sim_result.goodput(**seconds))

    @property
    def needs_tokens(self) -> bool:
        """True when judging a run needs its token record (an ``itl`` bound: each request's longest gap)."""
        return self.itl_ms is not None


def parse_goodput(spec, percentile: float = 99.0) -> SLO:
    """An :class:`SLO` from vLLM's ``--goodput`` syntax: ``"ttft:500 tpot:50"`` or ``["ttft:500", "tpot:50"]``.

    Keys ``ttft``, ``tpot`` and ``e2el`` (vLLM's) and ``itl`` (batchlab's: each request's longest gap between two
    tokens, :class:`SLO`); values in milliseconds, numbers > 0; each key at most once.

    Raises
    ------
    ValueError
        Naming the bad item: an unknown key, a missing colon, a value that is not a number or not > 0, a key
        given twice, or nothing given.
    """
    if isinstance(spec, str):
        items = spec.split()
    elif isinstance(spec, (list, tuple)) and all(isinstance(item, str) for item in spec):
        items = [part for item in spec for part in item.split()]
    else:
        raise ValueError(f"goodput SLO must be a string like 'ttft:500 tpot:50' or a list of such items, got {spec!r}")
    if not items:
        raise ValueError("goodput SLO is empty: give at least one of ttft:<ms>, tpot:<ms>, e2el:<ms>, itl:<ms>")
    bounds: dict[str, float] = {}
    for item in items:
        key, colon, value = item.partition(":")
        if not colon:
            raise ValueError(f"goodput item {item!r} has no colon: write key:milliseconds, e.g. ttft:500")
        if key not in SLO_KEYS:
            raise ValueError(f"goodput key {key!r} in {item!r} is unknown: use ttft, tpot, e2el or itl")
        if key in bounds:
            raise ValueError(f"goodput key {key!r} is given twice")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"goodput value {value!r} in {item!r} is not a number of milliseconds") from None
        if not (math.isfinite(ms) and ms > 0):
            raise ValueError(f"goodput value in {item!r} must be a finite number of milliseconds > 0")
        bounds[key] = ms
    return SLO(**{f"{key}_ms": ms for key, ms in bounds.items()}, percentile=percentile)


# -- the largest rate a configuration sustains ---------------------------------------------------------------
class RateResult(NamedTuple):
    """What :func:`max_rate` found."""

    rate_req_s: float  # req/s, the largest rate found to hold the SLO (= low_req_s)
    low_req_s: float  # req/s, the SLO holds here (simulated)
    high_req_s: float  # req/s, the SLO fails here (simulated)
    runs: int  # simulations run


def arrival_rate(requests) -> float:
    """Mean arrival rate of a stream (req/s): (n - 1) arrival gaps over the span from first to last arrival."""
    arrivals = requests.arrival_s
    span = float(arrivals.max() - arrivals.min()) if len(requests) else 0.0
    if len(requests) < 2 or not span > 0:
        raise ValueError("the stream needs at least two distinct arrival times to have a rate to scale")
    return (len(requests) - 1) / span


def at_rate(requests, rate_req_s: float):
    """``requests`` with its arrivals scaled in time so that its mean rate (:func:`arrival_rate`) is ``rate_req_s``."""
    return requests.scale_time(rate_req_s / arrival_rate(requests))


def max_rate(requests, cost, slo: SLO, *, policy: str = "chunked", rel_tol: float = 0.02, max_runs: int = 40,
             **knobs) -> RateResult:
    """The largest request rate at which a configuration holds ``slo`` (its percentile bounds, :meth:`SLO.met_by`).

    The stream keeps its lengths and the shape of its arrivals; only time is scaled (:func:`at_rate`, the
    stream's own rate being :func:`arrival_rate`). Starting at the stream's own rate, the rate doubles while the
    SLO holds, or halves until it does, to bracket the largest rate; bisection then narrows the bracket until
    ``(high - low) / low <= rel_tol`` (2 % by default). The SLO holds at ``low`` and fails at ``high``, both
    simulated; the answer is ``low``. The search assumes the SLO, once broken, stays broken at higher rates.

    If the SLO fails even at 1/1024 of the stream's rate (requests then nearly always run alone: a bound
    tighter than an unloaded request's latency), the answer is 0 req/s with ``low = high = 0``, after at most two
    runs. If no bracket is found within ``max_runs`` simulations (the SLO still holds after the rate doubled
    that often, e.g. a stream too short to queue), ValueError says so. If ``max_runs`` ends the bisection
    first, the bracket reached so far is returned, wider than ``rel_tol``.

    Parameters
    ----------
    requests : Requests
        The stream (at least two distinct arrival times).
    cost : CostModel
    slo : SLO
    policy : str, default "chunked"
    rel_tol : float, default 0.02
        Relative width of the final bracket, in (0, 1).
    max_runs : int, default 40
        Most simulations to run.
    **knobs
        Passed to :func:`batchlab.simulate` (``record_tokens`` is False).

    Returns
    -------
    RateResult
        ``rate_req_s``, ``low_req_s``, ``high_req_s`` (req/s) and ``runs``.
    """
    if not isinstance(slo, SLO):
        raise ValueError("slo must be a batchlab.SLO (see batchlab.parse_goodput)")
    if not 0 < rel_tol < 1:
        raise ValueError(f"rel_tol must be in (0, 1), got {rel_tol!r}")
    if isinstance(max_runs, bool) or not isinstance(max_runs, (int, np.integer)) or max_runs < 2:
        raise ValueError(f"max_runs must be an integer >= 2, got {max_runs!r}")
    base = arrival_rate(requests)
    runs = 0

    def holds(rate):
        nonlocal runs
        runs += 1
        res = simulate(at_rate(requests, rate), policy, cost, **{**knobs, "record_tokens": slo.needs_tokens})
        return slo.met_by(res.summary(slo=slo) if slo.needs_tokens else res.summary())

    def no_bracket(rate, direction):
        return ValueError(f"no bracket found within max_runs={max_runs} simulations: the SLO still "
                          f"{direction} at {rate:.4g} req/s; raise max_runs or check the stream and the SLO")

    if holds(base):
        low = base
        while True:
            if runs >= max_runs:
                raise no_bracket(low, "holds")
            if not holds(2 * low):
                high = 2 * low
                break
            low *= 2
    else:
        high, tiny = base, base / 1024
        if not holds(tiny):
            return RateResult(0.0, 0.0, 0.0, runs)
        while True:  # ends by rate `tiny`, which holds
            if runs >= max_runs:
                raise no_bracket(high, "fails")
            low = high / 2
            if low <= tiny or holds(low):
                low = max(low, tiny)
                break
            high = low
    while (high - low) / low > rel_tol and runs < max_runs:
        mid = (low + high) / 2
        if holds(mid):
            low = mid
        else:
            high = mid
    return RateResult(float(low), float(low), float(high), runs)


# -- the tuner ------------------------------------------------------------------------------------------------
class TuneResult(NamedTuple):
    """What :func:`tune` found."""

    table: pd.DataFrame  # one row per configuration: knobs, vllm_refuses, vllm_default, summary, goodput,
    #                      slo_met, slo_load
    best: dict  # knobs, request_goodput (req/s), p99_ttft_ms, p99_tpot_ms, slo_met, slo_load of the pick
    defaults: dict  # the same for vLLM's defaults
    frontier: pd.DataFrame  # rows on the Pareto front of request_goodput (max) vs p99_ttft_ms (min)
    gain: float  # best goodput / defaults' goodput (inf if the defaults' is 0, NaN if both are)


def _values(name: str, values) -> list[int]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) == 0:
        raise ValueError(f"{name} must be a non-empty list of integers, got {values!r}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < (0 if name == KNOBS[2] else 1):
            raise ValueError(f"{name} values must be integers >= {0 if name == KNOBS[2] else 1}, got {v!r}")
        out.append(int(v))
    if len(set(out)) != len(out):
        raise ValueError(f"{name} has repeated values: {out}")
    return out


def _point(row) -> dict:
    stats = ["request_goodput", "p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "slo_met", "slo_load"]
    keys = [k for k in KNOBS if k in row] + stats + [k for k in ("p99_longest_itl_ms",) if k in row]
    out = {}
    for k in keys:
        v = row[k]
        out[k] = int(v) if k in KNOBS else bool(v) if k == "slo_met" else float(v)
    return out


def _grid(cost, max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold):
    """The configurations :func:`tune` runs, vLLM's defaults among them: ``(keys, points, default, is_default)``.

    ``keys`` are the searched knobs, ``points`` a frame with one row per configuration (the product of the
    grids, in order; the defaults appended last when the grid does not hold them), ``default`` vLLM's defaults
    for ``cost.hardware`` (``long_prefill_token_threshold`` 0 when it is searched) and ``is_default`` a boolean
    per row of ``points``. The grids' defaults are :data:`DEFAULT_MAX_NUM_SEQS` (sequences) and
    :data:`DEFAULT_MAX_NUM_BATCHED_TOKENS` (tokens per iteration).
    """
    grid = {"max_num_seqs": _values("max_num_seqs", DEFAULT_MAX_NUM_SEQS if max_num_seqs is None else max_num_seqs),
            "max_num_batched_tokens": _values("max_num_batched_tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS
                                              if max_num_batched_tokens is None else max_num_batched_tokens)}
    if long_prefill_token_threshold is not None:
        grid[KNOBS[2]] = _values(KNOBS[2], long_prefill_token_threshold)
    keys = list(grid)
    points = pd.DataFrame([dict(zip(keys, combo)) for combo in
                           pd.MultiIndex.from_product([grid[k] for k in keys]).tolist()])
    default = {**vllm_defaults(cost.hardware), **({KNOBS[2]: 0} if KNOBS[2] in grid else {})}
    is_default = np.all([points[k].to_numpy() == v for k, v in default.items()], axis=0)
    if not is_default.any():
        points = pd.concat([points, pd.DataFrame([default])], ignore_index=True)
        is_default = np.append(is_default, True)
    return keys, points, default, is_default


def _best(accepted: pd.DataFrame, default_goodput: float, keys, default: dict, tol: float) -> pd.Series:
    """The row of ``accepted`` (the runs vLLM accepts) that :func:`tune` picks, by steps 1 to 5 of its docstring.

    ``default_goodput`` is the defaults' goodput (req/s), ``keys`` the searched knobs (the last tie-breaks, in
    order), ``default`` vLLM's defaults (the distance of step 4) and ``tol`` the relative tolerance (0 to 1) on
    goodput and SLO load.
    """
    goodput = accepted["request_goodput"]
    floor = max((1 - tol) * goodput.max(), default_goodput)
    candidates = accepted[goodput >= floor]  # tied with the largest and at least the defaults' (the largest is)
    load = candidates["slo_load"]
    if load.notna().any():  # the most headroom, and loads within the tolerance of it
        candidates = candidates[load <= load.min() * (1 + tol)]
    distance = sum(np.abs(np.log2(candidates[k].clip(lower=1) / max(v, 1))) for k, v in default.items())
    order = candidates.assign(_distance=distance).sort_values(["_distance", *keys], kind="mergesort")
    return order.iloc[0]


def tune(requests, cost, slo: SLO, *, max_num_seqs=None, max_num_batched_tokens=None,
         long_prefill_token_threshold=None, policy: str = "chunked", executor=None, progress: bool = True,
         goodput_rel_tol: float = 0.01, **fixed_knobs) -> TuneResult:
    """The ``max_num_seqs`` x ``max_num_batched_tokens`` setting with the largest goodput under ``slo``.

    A grid search (:func:`batchlab.sweep`: any executor, a progress bar) replaying ``requests`` through every
    configuration, vLLM's defaults for the GPU (:func:`batchlab.vllm_defaults`) always among them (a row of its
    own, last, when the grid does not hold them). The objective is goodput as ``vllm bench serve --goodput``
    counts it (:meth:`SLO.goodput`). A pair with ``max_num_batched_tokens < max_num_seqs`` is not simulated
    (vLLM refuses to start with it): its row has goodput 0, ``slo_met`` False, ``vllm_refuses`` True and no other
    numbers.

    **How the best is chosen.** When most settings keep up with the offered load their goodputs agree to within
    rounding, and the largest of them says only how the last requests of the run drained. So:

    1. goodputs within ``goodput_rel_tol`` of the largest, ``goodput >= (1 - goodput_rel_tol) * max``, are ties;
    2. of the tied settings, only those whose goodput is also at least the defaults' are candidates (the largest
       always is one), so the best's goodput is never below the defaults';
    3. the candidates with the most SLO headroom remain: the smallest ``slo_load`` (:meth:`SLO.load`), the
       largest ratio of a bounded latency's percentile (``slo.percentile``, p99 by default) to its bound, e.g.
       ``max(p99_ttft_ms / 500, p99_tpot_ms / 50)``, loads within ``goodput_rel_tol`` of the smallest tying
       too (a load 0.02 % lower is the same run drained a millisecond sooner, not more headroom); a setting whose
       ``slo_load`` is NaN comes last;
    4. of those, the one nearest vLLM's defaults wins (the smallest sum of ``|log2(knob / default)|``): when the
       traffic cannot tell settings apart, a knob that does not bind is left where vLLM puts it, rather than
       lowered to a cap that the same traffic at a higher rate would hit;
    5. then the smaller ``max_num_seqs``, ``max_num_batched_tokens`` (and ``long_prefill_token_threshold``), in
       that order, so the answer is deterministic.

    With ``goodput_rel_tol=0`` only the largest goodput and the smallest load tie (to the last bit), and the best is
    a setting with the largest goodput.

    Parameters
    ----------
    requests : Requests
        Your traffic (arrivals in seconds, token counts).
    cost : CostModel
        Model, GPU, dtype and tensor parallelism.
    slo : SLO
        Bounds per request (ms), e.g. ``parse_goodput("ttft:500 tpot:50")``.
    max_num_seqs : list of int, default 8, 16, ..., 1024
    max_num_batched_tokens : list of int, default 512, 1024, ..., 65536 (tokens per iteration)
    long_prefill_token_threshold : list of int, optional
        Searched too when given (tokens; 0 = no cap); vLLM's default is 0.
    policy : str, default "chunked"
    executor : concurrent.futures.Executor, optional
        Runs the simulations; the result is the same with any executor.
    progress : bool, default True
        A tqdm progress bar.
    goodput_rel_tol : float, default 0.01
        In [0, 1): goodputs this close to the largest, relatively, tie (1 %; 0 = only the largest), and so do SLO
        loads this close to the smallest.
    **fixed_knobs
        Further knobs of :func:`batchlab.simulate` for every configuration (``record_tokens`` is False).

    Returns
    -------
    TuneResult
        ``table`` (with ``slo_load``, NaN where vLLM refuses the pair), ``best`` and ``defaults`` (knobs,
        ``request_goodput`` in req/s, ``p99_ttft_ms``, ``p99_tpot_ms``, ``slo_met``, ``slo_load``), ``frontier``
        and ``gain`` (best goodput / defaults').
    """
    if not isinstance(slo, SLO):
        raise ValueError("slo must be a batchlab.SLO (see batchlab.parse_goodput)")
    tol = goodput_rel_tol
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.integer, np.floating)) or not 0 <= tol < 1:
        raise ValueError(f"goodput_rel_tol must be a number in [0, 1), got {tol!r}")
    keys, points, default, is_default = _grid(cost, max_num_seqs, max_num_batched_tokens,
                                              long_prefill_token_threshold)
    fixed_knobs.pop("record_tokens", None)
    refused = (points["max_num_batched_tokens"] < points["max_num_seqs"]).to_numpy()
    runs = sweep(requests, points[~refused].to_dict("records"), cost, policy=policy, executor=executor,
                 progress=progress, slo=slo, **fixed_knobs)
    table = points.merge(runs, on=keys, how="left")
    table["request_goodput"] = table["request_goodput"].fillna(0.0)
    table["slo_met"] = table["slo_met"].fillna(False).astype(bool)
    table["slo_load"] = slo.load(table)  # NaN where refused: no percentiles
    table["policy"] = policy
    table.insert(len(keys), "vllm_refuses", refused)
    table.insert(len(keys) + 1, "vllm_default", is_default)
    accepted = table[~refused]
    best = _point(_best(accepted, float(table.loc[is_default, "request_goodput"].iloc[0]), keys, default, tol))
    defaults = _point(table[is_default].iloc[0])
    frontier = pareto_front(accepted, "request_goodput", "p99_ttft_ms")
    b, d = best["request_goodput"], defaults["request_goodput"]
    gain = b / d if d > 0 else (math.inf if b > 0 else math.nan)
    return TuneResult(table, best, defaults, frontier, float(gain))
