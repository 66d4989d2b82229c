"""Every latency and throughput metric, defined once, named as ``vllm bench serve`` names them.

Per request: ttft = first token - arrival; tpot = (finish - first token) / (output - 1); e2el = finish -
arrival; itl = every gap between consecutive tokens of one request; queue = first scheduled - arrival.
Aggregates use completed requests only. As in ``vllm bench serve``, an aggregate over an empty set is 0.
The loop does not keep every token's time unless asked (``record_tokens``): it bins every inter-token gap in a
histogram as it runs, and ITL percentiles read from it are within ``ITL_RELATIVE_ERROR`` (2**-13, 0.012 %) of
the exact ones (:func:`histogram_stats`); every other key is exact.

Run-level measures of how a policy used its slots and its GPU (the book's chapters 01 to 03): the tail
waste of lockstep batches (:func:`half_empty_fraction`), idle time while work waited
(:func:`idle_while_waiting_fraction`), full lockstep batches (:func:`full_batch_fraction`) and the rows that
emitted a token in each iteration (:func:`tokens_per_step`).
"""
from __future__ import annotations

import math

import numpy as np

from . import _checks
from ._kernels import ITL_RELATIVE_ERROR  # noqa: F401 - the bound summary() promises on ITL percentiles


PERCENTILES = (("median", 50), ("p90", 90), ("p99", 99))
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


def per_request(arrival_s, output_tokens, scheduled_s, first_token_s, finish_s) -> dict[str, np.ndarray]:
    """Per-request latencies in seconds (NaN where a request was rejected, tpot NaN for one-token outputs)."""
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    out = np.asarray(output_tokens)
    first = np.asarray(first_token_s, dtype=np.float64)
    finish = np.asarray(finish_s, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (finish - first) / (out - 1), np.nan)
    return {
        "queue_s": np.asarray(scheduled_s, dtype=np.float64) - arrival_s,
        "ttft_s": first - arrival_s,
        "tpot_s": tpot,
        "e2el_s": finish - arrival_s,
    }


def inter_token_gaps(token_times_s: np.ndarray, token_offsets: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Every gap between consecutive tokens of the requests selected by ``mask`` (seconds, flat)."""
    gaps = np.diff(token_times_s)
    # Drop the gap that straddles two requests (it ends at a request's first token) and the gaps of
    # requests outside ``mask``: a token-level mask, shifted by one because gap i ends at token i + 1.
    keep = np.repeat(mask, np.diff(token_offsets))
    keep[token_offsets[:-1][np.diff(token_offsets) > 0]] = False
    return gaps[keep[1:]]


def longest_gaps(token_times_s: np.ndarray, token_offsets: np.ndarray) -> np.ndarray:
    """Per request, the longest gap between two of its consecutive output tokens (s): the longest stall its user
    sees in the stream. NaN for a request with fewer than two tokens. The statistic of an ``itl:`` bound
    (:class:`batchlab.SLO`, chapter 09)."""
    counts = np.diff(token_offsets)
    out = np.full(counts.size, np.nan)
    multi = counts >= 2
    if not multi.any():
        return out
    gaps = np.diff(np.asarray(token_times_s, dtype=float))  # gap i ends at token i + 1
    straddle = token_offsets[1:-1] - 1  # the gap ending at the next request's first token
    gaps[straddle[(straddle >= 0) & (straddle < gaps.size)]] = -np.inf
    out[multi] = np.maximum.reduceat(gaps, token_offsets[:-1][multi])
    return out


def sample_stats(name: str, values_s: np.ndarray) -> dict[str, float]:
    """``mean_{name}_ms`` and the ``PERCENTILES`` of ``values_s`` (seconds; NaN ignored), in milliseconds."""
    v = values_s[np.isfinite(values_s)] * 1e3
    out = {f"mean_{name}_ms": float(v.mean()) if v.size else 0.0}
    qs = np.percentile(v, [q for _, q in PERCENTILES]) if v.size else np.zeros(len(PERCENTILES))
    for (label, _), value in zip(PERCENTILES, qs):  # one partition of the data for every percentile
        out[f"{label}_{name}_ms"] = float(value)
    return out


def bench_serve_stats(name: str, values_ms: np.ndarray, percentiles) -> dict[str, float]:
    """``mean_/median_/std_/p<q>_<name>_ms`` of ``values_ms`` (ms; NaN ignored) as ``vllm bench serve`` computes
    them (``vllm/benchmarks/serve.py`` ``calculate_metrics``: ``np.mean``, ``np.median``, ``np.std``,
    ``np.percentile``; an empty sample counts as one 0). ``percentiles`` in (0, 100]: 99 -> ``p99``, 99.9 ->
    ``p99.9``. The command line's JSON; :func:`sample_stats` is the summary's."""
    values = np.asarray(values_ms, dtype=np.float64)
    values = values[np.isfinite(values)]
    sample = values if values.size else np.zeros(1)
    out = {f"mean_{name}_ms": float(np.mean(sample)), f"median_{name}_ms": float(np.median(sample)),
           f"std_{name}_ms": float(np.std(sample))}
    for p in percentiles:
        out[f"p{percentile_word(p)}_{name}_ms"] = float(np.percentile(sample, p))
    return out


def percentile_word(p: float) -> str:
    """vLLM's spelling of a percentile in a key: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def peak_concurrency(sent_s: np.ndarray, finish_s: np.ndarray) -> int:
    """Most requests in flight at once over half-open intervals [sent, finish), as vLLM's sweep line counts."""
    if len(sent_s) == 0:
        return 0
    starts, ends = np.sort(sent_s), np.sort(finish_s)
    in_flight = np.arange(1, starts.size + 1) - np.searchsorted(ends, starts, side="right")
    return int(in_flight.max())


def _lerp(a, b, t):
    """NumPy's linear interpolation between two order statistics (``np.percentile``'s default method)."""
    diff = b - a
    return np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)


def histogram_stats(name: str, histogram: np.ndarray) -> dict[str, float]:
    """:func:`sample_stats` of the values binned in ``histogram`` (rows of (count, sum, min, max) in seconds).

    The mean is exact up to rounding. A percentile takes np.percentile's two order statistics around its rank and
    interpolates between them as np.percentile does. An order statistic that is the first of its bin is the bin's
    smallest value, the last its largest (both exact); one in between is estimated by the bin's mean, within one
    bin's width, ``ITL_RELATIVE_ERROR`` of the value, of the exact one.
    """
    counts = histogram[:, 0]
    full = np.flatnonzero(counts)
    n = int(counts[full].sum())
    if n == 0:
        return {f"mean_{name}_ms": 0.0, **{f"{label}_{name}_ms": 0.0 for label, _ in PERCENTILES}}
    c, total, smallest, largest = (histogram[full, i] for i in range(4))
    last = np.cumsum(c) - 1  # rank of the last value in each bin
    first = last - c + 1

    def order_statistic_ms(rank):
        b = np.searchsorted(last, rank)
        value = smallest[b] if rank == first[b] else largest[b] if rank == last[b] else total[b] / c[b]
        return value * 1e3

    out = {f"mean_{name}_ms": float(total.sum() / n * 1e3)}
    for label, q in PERCENTILES:
        rank = (n - 1) * q / 100
        below = np.floor(rank)
        lo, hi = order_statistic_ms(below), order_statistic_ms(min(below + 1, n - 1))
        out[f"{label}_{name}_ms"] = float(_lerp(lo, hi, rank - below))
    return out


def summary(requests, itl_ms: dict[str, float], busy_s: float) -> dict[str, float]:
    """The ``vllm bench serve`` summary of one run (see DESIGN section 5 for every key).

    ``requests`` maps the per-request columns of a :class:`~batchlab.sim.SimResult` to arrays (its
    ``requests`` DataFrame will do); ``itl_ms`` is the ITL part (:func:`histogram_stats` or
    :func:`sample_stats`); ``busy_s`` the seconds the GPU ran steps.
    """
    col = {name: np.asarray(requests[name]) for name in (
        "rejected", "arrival_s", "finish_s", "prompt_tokens", "output_tokens", "padded_tokens", "cached_tokens",
        "preemptions", "ttft_s", "tpot_s", "e2el_s")}
    done = ~col["rejected"]
    duration = float(np.nanmax(col["finish_s"][done]) - col["arrival_s"].min()) if done.any() else 0.0
    inp = int(col["prompt_tokens"][done].sum())
    outp = int(col["output_tokens"][done].sum())
    padded = col["padded_tokens"]
    slots = col["prompt_tokens"] + col["output_tokens"] - 1 + padded
    rate = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    out = {
        "completed": int(done.sum()),
        "rejected": int((~done).sum()),
        "duration": duration,
        "total_input_tokens": inp,
        "total_output_tokens": outp,
        "request_throughput": rate(int(done.sum())),
        "output_throughput": rate(outp),
        "total_token_throughput": rate(inp + outp),
    }
    out.update(sample_stats("ttft", col["ttft_s"][done]))
    out.update(sample_stats("tpot", col["tpot_s"][done]))
    out.update(itl_ms)
    out.update(sample_stats("e2el", col["e2el_s"][done]))
    out["preemptions"] = int(col["preemptions"].sum())
    out["padding_fraction"] = float(padded[done].sum() / slots[done].sum()) if done.any() else 0.0
    out["gpu_busy_fraction"] = float(busy_s / duration) if duration > 0 else 0.0
    looked_up = col["prompt_tokens"][done].sum()
    hits = col["cached_tokens"][done].sum()
    out["prefix_cache_hit_rate"] = float(hits / looked_up) if looked_up else 0.0
    return out


GOODPUT_COLUMNS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2el_s", "itl": "longest_itl_s"}


def goodput(requests, ttft_s: float | None = None, tpot_s: float | None = None, e2el_s: float | None = None,
            itl_s: float | None = None) -> float:
    """Requests per second that completed within every given SLO (seconds), as ``vllm bench serve --goodput``.

    ``requests`` is a per-request table (``SimResult.requests``, or a mapping of its columns; a result is read
    through it). Each SLO given must be a number of seconds > 0 (infinity: no limit on that measure). ``itl_s``
    bounds each request's longest gap between two tokens (column ``longest_itl_s``, :func:`longest_gaps`), a bound
    vLLM's ``--goodput`` does not have; a request with one token meets it."""
    given = {"ttft": ttft_s, "tpot": tpot_s, "e2el": e2el_s, "itl": itl_s}
    slos = {GOODPUT_COLUMNS[k]: slo for k, slo in given.items() if slo is not None}
    if not slos:
        raise ValueError("goodput needs at least one SLO: ttft_s, tpot_s, e2el_s or itl_s")
    inner = getattr(requests, "requests", None)
    if hasattr(inner, "columns"):  # a SimResult or FleetResult
        if itl_s is not None:
            return float(requests.goodput(ttft_s=ttft_s, tpot_s=tpot_s, e2el_s=e2el_s, itl_s=itl_s))
        requests = inner
    needed = ["rejected", "arrival_s", "finish_s", *slos]
    missing = [c for c in needed if not hasattr(requests, "__getitem__") or c not in requests]
    if missing:
        raise ValueError(f"requests must be a per-request table (SimResult.requests) with columns {needed}; "
                         f"missing {missing}")
    done = ~np.asarray(requests["rejected"])
    ok = done.copy()
    for col, slo in slos.items():
        slo = _checks.real(f"{col} SLO", slo, 0.0, math.inf, low_open=True, allow_inf=True, allowed="> 0 seconds")
        ok &= ~(np.asarray(requests[col]) > slo)  # NaN (a one-token output) meets a tpot or itl SLO
    if not done.any():
        return 0.0
    duration = float(np.nanmax(np.asarray(requests["finish_s"])[done]) - np.asarray(requests["arrival_s"]).min())
    return float(ok.sum() / duration) if duration > 0 else 0.0


# -- run-level measures of how a policy used its slots and its GPU --------------------------------------------
def half_empty_fraction(requests) -> float:
    """Share of lockstep-batch time spent after half of the batch's rows had already finished.

    The tail waste of static and dynamic batching: a finished row keeps its slot until the batch's longest
    output ends. Batches are told apart by their release time (every row of a batch is released together).
    Used in chapter 01.

    Parameters
    ----------
    requests : DataFrame
        ``SimResult.requests`` of a ``static`` or ``dynamic`` run (seconds in ``scheduled_s``, ``finish_s``,
        ``release_s``).

    Returns
    -------
    float
        Dimensionless, in [0, 1]; exactly 0 when every row of every batch ends on the same step.
    """
    done = requests[~requests["rejected"]]
    tail = busy = 0.0
    for release, batch in done.groupby("release_s"):
        finish = np.sort(batch["finish_s"].to_numpy())
        half = finish[(finish.size + 1) // 2 - 1]  # when at least half of the rows are done
        tail += release - half
        busy += release - batch["scheduled_s"].min()
    return float(tail / busy) if busy > 0 else 0.0


def idle_while_waiting_fraction(res, since: str = "arrival_s") -> float:
    """Share of a run's duration in which the GPU ran nothing although an arrived request was waiting.

    Lockstep policies idle between batches while a static batch fills up or a dynamic timer runs; an
    iteration-level server never does, unless the KV pool is full. The oldest request not yet scheduled
    when an iteration starts is the one that was waiting during the gap before it (every policy here admits
    oldest first). A preempted request waiting to resume is not counted. Used in chapter 02.

    Parameters
    ----------
    res : SimResult
    since : {"arrival_s", "seen_s"}
        The per-request column a request waits from: its arrival (the client's view), or when the engine saw it
        (:func:`idle_while_queued_fraction`).

    Returns
    -------
    float
        Dimensionless, in [0, 1]: idle seconds with a request waiting over the run's duration (first ``since``
        to last finish).
    """
    req = res.requests[~res.requests["rejected"]]
    start = res.steps["start_s"].to_numpy()
    prev_end = np.concatenate([[-np.inf], (start + res.steps["duration_s"].to_numpy())[:-1]])
    order = np.argsort(req["scheduled_s"].to_numpy(), kind="stable")
    sched = req["scheduled_s"].to_numpy()[order]
    oldest = np.minimum.accumulate(req[since].to_numpy()[order][::-1])[::-1]  # oldest of those scheduled later
    k = np.searchsorted(sched, start, side="left")  # first request scheduled at or after each step's start
    waiting_since = np.where(k < sched.size, oldest[np.minimum(k, sched.size - 1)], np.inf)
    idle = np.clip(start - np.maximum(prev_end, waiting_since), 0.0, None)
    duration = req["finish_s"].max() - res.requests[since].min()
    return float(idle.sum() / duration) if duration > 0 else 0.0


def idle_while_queued_fraction(res) -> float:
    """:func:`idle_while_waiting_fraction` as the engine sees it: the GPU ran nothing although a request had
    reached the engine (``seen_s``: after the API server and ``request_latency_s``) and was not yet scheduled.

    The time a request spends on its way is left out: no scheduler can run a request it has not seen.
    Dimensionless, over the run from the engine's first sight of a request to the last finish. Used in chapter 02.
    """
    return idle_while_waiting_fraction(res, since="seen_s")


def full_batch_fraction(res) -> float:
    """Share of the lockstep batches of a ``static`` or ``dynamic`` run that left with ``batch_size`` rows.

    A dynamic batch leaves full when ``batch_size`` requests queued before its timer fired. NaN for the
    iteration-level policies, which have no batches to fill. Used in chapter 02.

    Parameters
    ----------
    res : SimResult

    Returns
    -------
    float
        Dimensionless, in [0, 1], or NaN.
    """
    if res.policy not in ("static", "dynamic"):
        return float("nan")
    prefills = res.steps[res.steps["prefill_tokens"] > 0]  # one prefill step opens each lockstep batch
    return float((prefills["running"] == res.knobs["batch_size"]).mean())


def tokens_per_step(res) -> np.ndarray:
    """Output tokens each iteration of ``res`` emitted: the rows that did useful work in it.

    A token's emission time is exactly its iteration's end (``start_s + duration_s``), so this counts
    equal times. In a lockstep batch, rows that have finished keep running (held) but emit nothing.
    Used in chapter 03.

    Parameters
    ----------
    res : SimResult

    Returns
    -------
    numpy.ndarray of int
        Tokens (one per generating row), one entry per row of ``res.steps``.
    """
    tokens = np.sort(res.token_times_flat[np.isfinite(res.token_times_flat)])
    end = (res.steps["start_s"] + res.steps["duration_s"]).to_numpy()
    return np.searchsorted(tokens, end, side="right") - np.searchsorted(tokens, end, side="left")
