"""Workloads from where users have them: a preset, a synthetic spec, a trace file, or a saved ``vllm bench serve``.

:func:`load_workload` turns any of these into a :class:`Workload`: the request stream plus what the client did
(its request rate, its concurrency limit), so the command line (``python -m batchlab simulate --dataset ...``)
and the tuning chapter read a reader's traffic the same way. Everything it cannot read unambiguously it refuses
with a ``ValueError`` that names the file, what is missing or malformed, and what was expected.

Source kinds
------------
preset name
    One of :func:`batchlab.preset_names` (``n_requests`` default 1000, ``rate_req_s`` default the trace's own).
synthetic spec
    ``synthetic:prompt=512,output=128,rate=4,n=1000`` -- comma-separated ``key=value`` after ``synthetic:``.
    Keys: ``prompt`` and ``output`` (mean tokens, required), ``n`` (requests; default ``n_requests``, else
    1000), ``rate`` (requests/s, ``inf`` = all at time 0; default inf), ``prompt_cv`` and ``output_cv``
    (coefficients of variation of the lognormal lengths; default 0 = every request the same), ``arrival_cv``
    (CV of the gamma inter-arrival gaps; default 1 = Poisson), ``max_tokens`` (upper clip of each length).
    Mapped onto :func:`batchlab.synthetic`.
CSV or JSON-lines trace (``.csv``, ``.jsonl``; a ``.json`` holding a list of records)
    One row per request: arrival time and token counts. Columns are found by name, case-insensitively and
    ignoring ``_``, ``-`` and spaces (``_ARRIVAL``, ``_PROMPT``, ``_OUTPUT`` list the spellings), or given with
    ``arrival=``, ``prompt=``, ``output=``.
``vllm bench serve --save-result --save-detailed`` JSON
    See :func:`_bench_workload`.

Trace files are read by :mod:`batchlab.traces` (columns, arrival times, prefix blocks), the reader behind
:func:`batchlab.read_trace` and :func:`batchlab.replay` too.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from .traces import TIME_UNITS, _ARRIVAL, read_columns, read_csv, read_json_lines, sorted_requests
from .vllm import BLOCK_SIZE
from .workload import Requests, _rng, arrivals_gamma, preset, preset_names, synthetic

DEFAULT_N_REQUESTS = 1000  # requests drawn from a preset or a synthetic spec when no count is given
# Keys of a ``vllm bench serve`` result (vllm/benchmarks/serve.py, main_async and benchmark).
_BENCH_MARKERS = ("input_lens", "output_lens", "num_prompts", "completed", "total_input_tokens", "request_rate",
                  "burstiness", "max_concurrency")
_BENCH_REQUIRED = ("input_lens", "output_lens", "request_rate")

_SYNTHETIC_KEYS = {  # key -> (synthetic() argument, parser)
    "prompt": "prompt_mean", "output": "output_mean", "n": "n_requests", "rate": "rate_req_s",
    "prompt_cv": "prompt_cv", "output_cv": "output_cv", "arrival_cv": "arrival_cv", "max_tokens": "max_tokens",
}


class Workload(NamedTuple):
    """A request stream and how the client sent it."""

    requests: Requests  # the stream; arrivals in seconds
    max_concurrency: int | None  # at most this many requests in flight (closed loop); None: open loop
    request_rate: float | None  # requests/s the arrivals were drawn at (inf: all at time 0); a timed trace's mean
    source: str  # what was read and how, for printing
    n_prompts: int  # requests in the source (a bench result's num_prompts, failed ones included)


def load_workload(source, *, n_requests: int | None = None, rate_req_s: float | None = None, seed=0,
                  arrival: str | None = None, prompt: str | None = None, output: str | None = None,
                  time_unit: str | None = None, burstiness: float | None = None,
                  max_concurrency: int | None = None, prefix_blocks: str | None = None,
                  prefix_block_tokens: int = BLOCK_SIZE) -> Workload:
    """A :class:`Workload` from a preset name, a synthetic spec, a trace file or a saved ``vllm bench serve``.

    Parameters
    ----------
    source : str, os.PathLike or pandas.DataFrame
        A preset name, ``synthetic:...`` spec, a ``.csv`` / ``.jsonl`` / ``.json`` file, or a table with one
        row per request (read as a trace). See the module docstring for each kind.
    n_requests : int, optional
        Requests to draw (preset, synthetic; default 1000) or the first ``n_requests`` to keep, in arrival order
        (trace, bench result; default all).
    rate_req_s : float, optional
        Mean arrival rate, requests/s (inf: all at time 0). Preset: default the trace's own rate. Trace with
        arrival times: rescales them to this mean rate (their shape kept). Trace without arrival times: gamma
        arrivals at this rate from ``seed``. Bench result: replaces the saved rate.
    seed : int or numpy.random.Generator
        Seeds every draw (lengths of presets and synthetic specs, arrivals drawn at a rate).
    arrival, prompt, output : str, optional
        Column names of a trace, when detection does not find them.
    time_unit : {"s", "ms", "us", "ns"}, optional
        Unit of numeric arrival times.
    prefix_blocks : str, optional
        Trace column of prefix block ids (lists, or their text in a CSV cell), ``prefix_block_tokens`` tokens per
        id: read by :mod:`batchlab.traces` as :func:`batchlab.read_trace` reads it.
    burstiness : float, optional
        ``vllm bench serve --burstiness``: the shape of the gamma inter-arrival gaps (1 = Poisson, < 1 burstier,
        inf evenly spaced); CV = 1 / sqrt(burstiness). Preset: replaces the trace's inter-arrival CV. Synthetic
        spec: sets ``arrival_cv``. Trace without arrival times: shapes the drawn gaps. Bench result: replaces the
        saved value. A trace with arrival times refuses it.
    max_concurrency : int, optional
        Closed-loop clients: at most this many requests in flight (``simulate(..., max_concurrency=)``).
        Bench result: replaces the saved value. Lets a trace without arrival times replay closed-loop.

    Returns
    -------
    Workload

    Raises
    ------
    ValueError
        Naming the file (or source) and what is missing, malformed or ambiguous; a missing file too.
    """
    _check_options(n_requests, rate_req_s, time_unit, burstiness, max_concurrency)
    if isinstance(source, pd.DataFrame):
        return _trace_workload(source, "DataFrame", n_requests, rate_req_s, seed, arrival, prompt, output,
                               time_unit, burstiness, max_concurrency, prefix_blocks, prefix_block_tokens)
    if not isinstance(source, (str, Path)):
        raise ValueError(f"source must be a preset name, a synthetic spec, a file path or a DataFrame, "
                         f"got {type(source).__name__}")
    text = str(source)
    if isinstance(source, str) and text in preset_names():
        return _preset_workload(text, n_requests, rate_req_s, seed, burstiness, max_concurrency)
    if isinstance(source, str) and text.startswith("synthetic:"):
        return _synthetic_workload(text, n_requests, rate_req_s, seed, burstiness, max_concurrency)
    return _file_workload(Path(source), n_requests, rate_req_s, seed, arrival, prompt, output, time_unit,
                          burstiness, max_concurrency, prefix_blocks, prefix_block_tokens)


def _check_options(n_requests, rate_req_s, time_unit, burstiness, max_concurrency) -> None:
    if n_requests is not None and (isinstance(n_requests, bool) or not isinstance(n_requests, (int, np.integer))
                                   or n_requests < 1):
        raise ValueError(f"n_requests must be an integer >= 1, got {n_requests!r}")
    if rate_req_s is not None and not (isinstance(rate_req_s, (int, float, np.number)) and rate_req_s > 0):
        raise ValueError(f"rate_req_s must be a number > 0 (requests/s; inf for all at once), got {rate_req_s!r}")
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of {list(TIME_UNITS)}, got {time_unit!r}")
    if burstiness is not None and not (isinstance(burstiness, (int, float, np.number)) and burstiness > 0):
        raise ValueError(f"burstiness must be a number > 0 (1 = Poisson), got {burstiness!r}")
    if max_concurrency is not None and (isinstance(max_concurrency, bool)
                                        or not isinstance(max_concurrency, (int, np.integer)) or max_concurrency < 1):
        raise ValueError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")


def _cv(burstiness: float) -> float:
    """CV of gamma gaps of shape ``burstiness``: 1 / sqrt(shape) (inf: evenly spaced)."""
    return 0.0 if math.isinf(burstiness) else 1.0 / math.sqrt(burstiness)


def vllm_arrivals(n_requests: int, rate_req_s: float, burstiness: float = 1.0, seed=0) -> np.ndarray:
    """Send times (s) as ``vllm bench serve`` draws them for ``--request-rate`` and ``--burstiness``.

    vLLM draws one gamma gap (shape ``burstiness``, mean 1 / rate) before every request, the first included,
    and rescales their running sum so the last request goes at exactly ``n_requests / rate_req_s`` seconds
    (``get_request`` in ``vllm/benchmarks/serve.py``). ``rate_req_s = inf`` sends everything at 0. The gaps are
    drawn with :func:`batchlab.arrivals_gamma` from ``seed``, not vLLM's own random stream.
    """
    if math.isinf(rate_req_s):
        return np.zeros(n_requests)
    sent = arrivals_gamma(n_requests + 1, rate_req_s, _cv(burstiness), seed)[1:]
    return sent * (n_requests / rate_req_s / sent[-1]) if sent[-1] > 0 else sent


def _ramp_arrivals(n: int, strategy: str, start_rps: float, end_rps: float, burstiness: float, seed) -> np.ndarray:
    """Send times (s) of ``vllm bench serve --ramp-up-strategy``: request i's gap is drawn at the rate ramped
    linearly or exponentially from ``start_rps`` to ``end_rps`` over the requests (no rescaling, as vLLM)."""
    progress = np.arange(n) / max(n - 1, 1)
    if strategy == "linear":
        rates = start_rps + (end_rps - start_rps) * progress
    else:
        rates = start_rps * (end_rps / start_rps) ** progress
    unit_gaps = np.diff(arrivals_gamma(n + 1, 1.0, _cv(burstiness), seed))
    return np.cumsum(unit_gaps / rates)


# -- presets and synthetic specs ---------------------------------------------------------------------------------

def _preset_workload(name, n_requests, rate_req_s, seed, burstiness, max_concurrency) -> Workload:
    n = n_requests or DEFAULT_N_REQUESTS
    rng = _rng(seed)
    reqs = preset(name, n, rate_req_s, rng)
    rate = rate_req_s if rate_req_s is not None else float(_preset_rate(name))
    how = f"trace's own rate {rate:g} req/s" if rate_req_s is None else f"{rate:g} req/s"
    if burstiness is not None:  # replace the trace's inter-arrival CV with vLLM's burstiness
        reqs = Requests(arrivals_gamma(n, rate, _cv(burstiness), rng), reqs.prompt_tokens, reqs.output_tokens)
        how += f", burstiness {burstiness:g}"
    return Workload(reqs, max_concurrency, rate, f"preset {name!r}: {n} requests at {how}", n)


def _preset_rate(name: str) -> float:
    from .workload import trace_stats
    return trace_stats(name)["rate_req_per_s"]


def parse_synthetic(spec: str) -> dict:
    """The keyword arguments of :func:`batchlab.synthetic` a ``synthetic:key=value,...`` spec names.

    Raises ``ValueError`` naming an unknown, repeated, missing or malformed key.
    """
    body = spec[len("synthetic:"):] if spec.startswith("synthetic:") else spec
    out: dict = {}
    for part in filter(None, (p.strip() for p in body.split(","))):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"synthetic spec {spec!r}: {part!r} is not key=value")
        if key not in _SYNTHETIC_KEYS:
            raise ValueError(f"synthetic spec {spec!r}: unknown key {key!r}; keys are {list(_SYNTHETIC_KEYS)}")
        arg = _SYNTHETIC_KEYS[key]
        if arg in out:
            raise ValueError(f"synthetic spec {spec!r}: key {key!r} given twice")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"synthetic spec {spec!r}: key {key!r} must be a number, got {value.strip()!r}") from None
        if key in ("n", "max_tokens"):
            if not (math.isfinite(number) and number == round(number) and number >= 1):
                raise ValueError(f"synthetic spec {spec!r}: key {key!r} must be a whole number >= 1, got {value!r}")
            number = int(number)
        out[arg] = number
    missing = [k for k in ("prompt", "output") if _SYNTHETIC_KEYS[k] not in out]
    if missing:
        raise ValueError(f"synthetic spec {spec!r}: missing {', '.join(k + '=' for k in missing)} (mean tokens); "
                         f"e.g. synthetic:prompt=512,output=128,rate=4,n=1000")
    return out


def _synthetic_workload(spec, n_requests, rate_req_s, seed, burstiness, max_concurrency) -> Workload:
    kwargs = parse_synthetic(spec)
    for key, arg, given in (("n", "n_requests", n_requests), ("rate", "rate_req_s", rate_req_s)):
        if given is not None and arg in kwargs and kwargs[arg] != given:
            raise ValueError(f"synthetic spec {spec!r} says {key}={kwargs[arg]:g} but {arg}={given!r} was also "
                             f"given; give one")
        if given is not None:
            kwargs[arg] = given
    if burstiness is not None:
        if "arrival_cv" in kwargs:
            raise ValueError(f"synthetic spec {spec!r} gives arrival_cv and burstiness was also given; give one")
        kwargs["arrival_cv"] = _cv(burstiness)
    kwargs.setdefault("n_requests", DEFAULT_N_REQUESTS)
    try:
        reqs = synthetic(seed=seed, **kwargs)
    except ValueError as err:
        raise ValueError(f"synthetic spec {spec!r}: {err}") from None
    rate = float(kwargs.get("rate_req_s", math.inf))
    return Workload(reqs, max_concurrency, rate, f"{spec}: {len(reqs)} requests", len(reqs))


# -- files -------------------------------------------------------------------------------------------------------

def _file_workload(path, n_requests, rate_req_s, seed, arrival, prompt, output, time_unit, burstiness,
                   max_concurrency, prefix_blocks=None, prefix_block_tokens=BLOCK_SIZE) -> Workload:
    if not path.exists():
        raise ValueError(f"{path}: no such file, and not a preset name ({', '.join(preset_names())}) or a "
                         f"synthetic spec (synthetic:prompt=...,output=...)")
    if not path.is_file():
        raise ValueError(f"{path}: not a file")
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl", ".json"):
        raise ValueError(f"{path}: unknown extension {path.suffix!r}; expected a .csv or .jsonl trace or a "
                         f".json vllm bench serve result")
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise ValueError(f"{path}: the file is empty; expected "
                         + ("a vllm bench serve result or a list of requests" if suffix == ".json"
                            else "one request per row, with token counts"))
    trace_args = (n_requests, rate_req_s, seed, arrival, prompt, output, time_unit, burstiness, max_concurrency,
                  prefix_blocks, prefix_block_tokens)
    if suffix == ".csv":
        return _trace_workload(read_csv(path), str(path), *trace_args)
    if suffix == ".jsonl":
        return _trace_workload(pd.DataFrame(read_json_lines(path, text)), str(path), *trace_args)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data":  # several objects: JSON lines, or results appended with --append-result
            records = read_json_lines(path, text)
            if any(isinstance(r, dict) and "input_lens" in r for r in records):
                raise ValueError(f"{path}: holds {len(records)} JSON objects, one per line (results appended with "
                                 f"vllm bench serve --append-result?); keep one result per file") from None
            return _trace_workload(pd.DataFrame(records), str(path), *trace_args)
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    if isinstance(data, dict) and any(k in data for k in _BENCH_MARKERS):
        return _bench_workload(data, path, n_requests, rate_req_s, seed, burstiness, max_concurrency)
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        return _trace_workload(pd.DataFrame(data), str(path), *trace_args)
    what = f"an object with keys {sorted(data)[:8]}" if isinstance(data, dict) else type(data).__name__
    raise ValueError(f"{path}: neither a vllm bench serve result (an object with {', '.join(_BENCH_REQUIRED)}) "
                     f"nor a list of request records; found {what}")


def _trace_workload(df, where, n_requests, rate_req_s, seed, arrival, prompt, output, time_unit, burstiness,
                    max_concurrency, prefix_blocks=None, prefix_block_tokens=BLOCK_SIZE) -> Workload:
    cols = read_columns(df, where, arrival, prompt, output, time_unit, prefix_blocks)
    n_rows = len(df)
    if cols.arrival_s is None:
        bursty = 1.0 if burstiness is None else burstiness
        if rate_req_s is not None:
            secs, how = vllm_arrivals(n_rows, rate_req_s, bursty, seed), f"no arrival column: gamma arrivals " \
                f"at {rate_req_s:g} req/s, burstiness {bursty:g}, seed {seed}"
            rate = float(rate_req_s)
        elif max_concurrency is not None:
            secs, how, rate = np.zeros(n_rows), "no arrival column: all sent at once, closed loop", math.inf
        else:
            raise ValueError(f"{where}: no arrival column (tried {', '.join(_ARRIVAL)}, case and _ ignored); pass "
                             f"rate_req_s= (--request-rate) for Poisson arrivals at that rate, or max_concurrency= "
                             f"(--max-concurrency) to send every request at once closed-loop, or name the column "
                             f"with arrival= (--arrival-column)")
        blocks = None if cols.prefix_blocks is None else cols.prefix_blocks[:n_requests]
        reqs = Requests(secs[:n_requests], cols.prompt_tokens[:n_requests], cols.output_tokens[:n_requests], blocks,
                        prefix_block_tokens)
    else:
        if burstiness is not None:
            raise ValueError(f"{where}: has arrival times ({cols.names['arrival']!r}), so burstiness does not "
                             f"apply; drop it")
        reqs = sorted_requests(cols, prefix_block_tokens, n_requests)  # unsorted traces allowed; ties keep order
        how = f"arrival={cols.names['arrival']!r} [{cols.unit}]"
        span = float(reqs.arrival_s[-1])
        rate = (len(reqs) - 1) / span if span > 0 else math.inf
        if rate_req_s is not None:  # rescale to the asked mean rate, the trace's burst shape kept
            secs = np.zeros_like(reqs.arrival_s) if math.isinf(rate_req_s) or span == 0 else \
                reqs.arrival_s * (rate / rate_req_s)
            reqs = reqs._select(np.arange(len(reqs)), secs)
            how += f", rescaled from {rate:.4g} to {rate_req_s:g} req/s"
            rate = float(rate_req_s)
    desc = f"{where}: {len(reqs)} of {n_rows} requests (prompt={cols.names['prompt']!r}, " \
           f"output={cols.names['output']!r}, {how})"
    return Workload(reqs, max_concurrency, rate, desc, n_rows)


# -- vllm bench serve results ------------------------------------------------------------------------------------

def _int_list(data: dict, key: str, where: str, low: int) -> np.ndarray:
    values = data[key]
    if not isinstance(values, list):
        raise ValueError(f"{where}: {key!r} is a {type(values).__name__}, expected a list of token counts")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) or v < low:
            raise ValueError(f"{where}: {key}[{i}] is {v!r}; expected whole numbers >= {low}")
    return np.array(values, dtype=np.int64)


def _bench_workload(data: dict, path: Path, n_requests, rate_req_s, seed, burstiness, max_concurrency) -> Workload:
    """A ``vllm bench serve --save-result --save-detailed`` JSON, replayed as vLLM sent it.

    vLLM (``vllm/benchmarks/serve.py``) writes ``input_lens`` (every request's prompt length, failed ones
    included) and ``output_lens`` (tokens generated; 0 for a failed request) only with ``--save-detailed``,
    next to ``request_rate`` (a number or "inf"), ``burstiness``, ``max_concurrency``, ``num_prompts``,
    ``completed``, ``total_input_tokens`` (successful requests only), ``total_output_tokens`` and, per request,
    ``errors`` (empty for a success). The replay keeps the successful requests (no error, at least one output
    token) with their token counts as saved, and checks them against the saved ``completed`` and totals, so a
    replay reproduces the run's request count and token totals exactly or refuses. Send times are drawn as vLLM
    draws them (:func:`vllm_arrivals`, or the ramp-up when ``ramp_up_strategy`` is saved) for every request and
    kept for the successful ones; ``rate_req_s = inf`` sends all at 0, to at most ``max_concurrency`` at once.
    """
    where = str(path)
    missing = [k for k in _BENCH_REQUIRED if k not in data]
    if missing:
        hint = (" (vllm bench serve writes input_lens and output_lens only with --save-detailed)"
                if {"input_lens", "output_lens"} & set(missing) else "")
        raise ValueError(f"{where}: a vllm bench serve result without {', '.join(missing)}{hint}")
    inputs = _int_list(data, "input_lens", where, 1)
    outputs = _int_list(data, "output_lens", where, 0)
    if inputs.size != outputs.size:
        raise ValueError(f"{where}: input_lens has {inputs.size} entries but output_lens {outputs.size}; expected "
                         f"one of each per request")
    if inputs.size == 0:
        raise ValueError(f"{where}: input_lens and output_lens are empty; expected one entry per request")
    errors = data.get("errors")
    if errors is not None and (not isinstance(errors, list) or len(errors) != inputs.size):
        raise ValueError(f"{where}: errors must be a list with one entry per request ({inputs.size}), got "
                         f"{len(errors) if isinstance(errors, list) else type(errors).__name__}")
    failed = outputs == 0
    if errors is not None:
        failed |= np.array([bool(e) for e in errors])
    kept = np.flatnonzero(~failed)
    if kept.size == 0:
        raise ValueError(f"{where}: every request failed (no output tokens); nothing to replay")
    checks = (("completed", kept.size), ("total_input_tokens", int(inputs[kept].sum())),
              ("total_output_tokens", int(outputs[kept].sum())))
    for key, counted in checks:
        saved = data.get(key)
        if saved is not None and saved != counted:
            raise ValueError(f"{where}: {key} is {saved} but the per-request lists give {counted} (successful "
                             f"requests: no error, output_lens > 0); the file is inconsistent")
    rate = _saved_number(data, "request_rate", where) if rate_req_s is None else float(rate_req_s)
    bursty = burstiness if burstiness is not None else (
        _saved_number(data, "burstiness", where) if data.get("burstiness") is not None else 1.0)
    if bursty <= 0:
        raise ValueError(f"{where}: burstiness is {bursty}; expected a number > 0")
    conc = data.get("max_concurrency") if max_concurrency is None else max_concurrency
    if conc is not None and (isinstance(conc, bool) or not isinstance(conc, int) or conc < 1):
        raise ValueError(f"{where}: max_concurrency is {conc!r}; expected an integer >= 1 or null")
    n = inputs.size
    strategy = data.get("ramp_up_strategy") if rate_req_s is None else None
    if strategy is not None:
        if strategy not in ("linear", "exponential"):
            raise ValueError(f"{where}: ramp_up_strategy is {strategy!r}; expected 'linear' or 'exponential'")
        start, end = (_saved_number(data, k, where) for k in ("ramp_up_start_rps", "ramp_up_end_rps"))
        if not (0 <= start <= end and end > 0 and (strategy == "linear" or start > 0)):
            raise ValueError(f"{where}: ramp-up from {start} to {end} req/s cannot be replayed")
        sent = _ramp_arrivals(n, strategy, start, end, bursty, seed)
        how = f"{strategy} ramp-up {start:g} to {end:g} req/s"
    else:
        sent = vllm_arrivals(n, rate, bursty, seed)
        how = "all at once" if math.isinf(rate) else f"{rate:g} req/s, burstiness {bursty:g}"
    if n_requests is not None:
        kept = kept[:n_requests]
    reqs = Requests(sent[kept], inputs[kept], outputs[kept])
    if conc is not None:
        how += f", at most {conc} in flight"
    n_prompts = data.get("num_prompts")
    n_prompts = int(n_prompts) if isinstance(n_prompts, int) and not isinstance(n_prompts, bool) else n
    dropped = int(failed.sum())
    desc = (f"{where}: vllm bench serve result, {len(reqs)} of {n} requests ({dropped} failed, not replayed; "
            f"{how})")
    return Workload(reqs, conc, rate, desc, n_prompts)


def _saved_number(data: dict, key: str, where: str) -> float:
    value = data.get(key)
    if value is None:
        raise ValueError(f"{where}: {key} is missing; expected a number")
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        raise ValueError(f"{where}: {key} is {value!r}; expected a number > 0 or \"inf\"")
    return float(value)
