"""The request stream of a calibration run, as its load generator sent it.

Open loop (inference-perf): the ``shared_prefix`` data of ``num_groups`` x ``prompts_per_group`` distinct
prompts (a group's system prompt, then a question), shuffled once and cycled for the whole run, every stage
of an experiment in one stream; each stage sends int(rate x duration) requests. Closed loop (AIConfigurator):
``n_requests`` requests, the simulator's ``max_concurrency`` keeping ``concurrency`` of them in flight, and the
clients starting together, so that their first requests arrive as one burst (counted, as the benchmark counts
it). Two client protocols:

- InferenceX rows (``client`` "inferencex", see :data:`batchlab.validate.raw.INFERENCEX`): vLLM's
  ``benchmark_serving.py --dataset-name random --random-range-ratio 0.8 --num-prompts 10 x concurrency``, whose
  prompt and output lengths are drawn uniformly from the integers [int(0.8 x isl), isl] and
  [int(0.8 x osl), osl] (seeded here). Requests of different lengths finish at different steps, so the clients
  drift apart by themselves after the first burst, as they did on the measured server.
- Rows whose client was not recorded: max(8 x concurrency, 200) identical requests. Identical requests that
  finish together stay in lockstep in a deterministic simulator (every later wave is prefilled together and
  finishes together), which a measured server does not show: timing noise spreads its clients apart after the
  first request. So each client sends its second request at a seeded uniform phase within ``cycle_s`` (the
  shortest a request can take, so that no client waits for another's phase later), after the first wave has
  surely finished (``first_wave_s``; the client's idle wait counts in no latency), and keeps that phase.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..vllm import BLOCK_SIZE
from ..workload import Requests, _chain_ids, _rng
from .raw import CLOSED_LOOP, INFERENCEX, OPEN_LOOP, PROMPT_PROBABILITIES, PROMPT_QUANTILES
from .runs import get_run

BLOCK_TOKENS = BLOCK_SIZE  # vLLM's block size: one prefix id per 16-token block, as its hash chain sees the prompt
DRAIN_S = 600.0  # idle seconds added after each stage so that it drains before the next (inference-perf waits)


def parse_stages(stages: str) -> list[tuple[float, float]]:
    """``"8@600;20@600"`` -> [(8.0, 600.0), (20.0, 600.0)]: (rate in req/s, duration in s) per stage."""
    try:
        out = [(float(r), float(d)) for r, d in (part.split("@") for part in stages.split(";"))]
    except ValueError as err:
        raise ValueError(f"stages must read 'rate@duration;rate@duration...', got {stages!r}") from err
    if not out or any(not (r > 0 and d > 0) for r, d in out):
        raise ValueError(f"every stage needs a rate and a duration > 0, got {stages!r}")
    return out


def stage_arrivals(stages, stage_gap_s: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """Send times (s) and stage index of every request, as inference-perf's 'constant' load timer draws them.

    Each stage sends int(rate x duration) requests; its gaps are exponential, rescaled to sum to the stage's
    duration, so its last request goes out exactly at its end. A stage starts ``duration + stage_gap_s +``
    :data:`DRAIN_S` seconds after the previous one: inference-perf waits for every request to finish, and a
    server that keeps up drains within seconds.
    """
    times, labels, start = [], [], 0.0
    for k, (rate, duration) in enumerate(stages):
        n = int(rate * duration)
        gaps = rng.exponential(1.0 / rate, n)
        times.append(start + np.cumsum(gaps * (duration / gaps.sum())))
        labels.append(np.full(n, k, np.int64))
        start += duration + stage_gap_s + DRAIN_S
    return np.concatenate(times), np.concatenate(labels)


def prompt_lengths(run: pd.Series, n_prompts: int, rng) -> np.ndarray:
    """Token counts of the ``n_prompts`` distinct prompts: the measured quantiles at (i + 0.5) / n, shuffled.

    Inverse CDF, linear between the measured quantiles (min, p1, ..., p99, max), at evenly spaced levels, so the
    mean is the quantile table's (within a fraction of a per cent of the measured mean, not a random draw's).
    """
    q = run[[f"prompt_tokens_{name}" for name in PROMPT_QUANTILES]].to_numpy(dtype=np.float64)
    levels = (np.arange(n_prompts) + 0.5) / n_prompts
    return rng.permutation(np.rint(np.interp(levels, PROMPT_PROBABILITIES, q)).astype(np.int64))


def system_prompt_tokens(run: pd.Series) -> int:
    """Tokens of a group's system prompt as the server sees them: BOS + system_prompt_len, inflated as measured.

    Random token ids decoded to text and tokenised again come out longer (the measured mean prompt is about 5 %
    above BOS + system_prompt_len + question_len); the system prompt is taken to grow by the same factor.
    """
    nominal = 1 + int(run["system_prompt_len"]) + int(run["question_len"])
    return int(round((1 + int(run["system_prompt_len"])) * float(run["prompt_tokens_mean"]) / nominal))


def prefix_ids(run: pd.Series, lengths: np.ndarray) -> list[list[int]]:
    """Block ids of every distinct prompt (prompt i belongs to group i // prompts_per_group).

    Blocks that end inside the group's system prompt (:func:`system_prompt_tokens`) carry the group's ids; every
    block from the first that holds question tokens on carries ids of that prompt alone (a hash chain: the id of
    a block names everything before it). A prompt that recurs has the same ids every time.
    """
    groups, per_group = int(run["num_groups"]), int(run["prompts_per_group"])
    shared = system_prompt_tokens(run)
    stride = -(-int(lengths.max()) // BLOCK_TOKENS) + 1
    return [_chain_ids(int(n), BLOCK_TOKENS, shared, (i // per_group) * stride, (groups + i) * stride)
            for i, n in enumerate(lengths)]


def _open_loop(run: pd.Series, rng) -> tuple[Requests, np.ndarray]:
    distinct = int(run["num_groups"]) * int(run["prompts_per_group"])
    lengths = prompt_lengths(run, distinct, rng)
    ids = prefix_ids(run, lengths)
    order = rng.permutation(distinct)  # shuffled once, then cycled across every stage
    arrival, labels = stage_arrivals(parse_stages(run["stages"]), float(run["stage_gap_s"]), rng)
    chosen = order[np.arange(arrival.size) % distinct]
    output = np.full(arrival.size, int(run["output_len"]))
    return Requests(arrival, lengths[chosen], output, [ids[i] for i in chosen], BLOCK_TOKENS), labels


def random_lengths(upper: int, range_ratio: float, n: int, rng) -> np.ndarray:
    """``n`` lengths as vLLM's ``benchmark_serving.py`` random dataset draws them: uniform integers in
    [int(upper x range_ratio), upper] (``np.random.randint(int(upper * r), upper + 1)``)."""
    return rng.integers(int(upper * range_ratio), upper + 1, n).astype(np.int64)


def _inferencex(run: pd.Series, rng) -> tuple[Requests, np.ndarray]:
    n, ratio = int(run["n_requests"]), float(run["range_ratio"])
    prompts = random_lengths(int(run["isl"]), ratio, n, rng)
    outputs = random_lengths(int(run["osl"]), ratio, n, rng)
    return Requests(np.zeros(n), prompts, outputs), np.zeros(n, np.int64)  # every request waits for a client


def _closed_loop(run: pd.Series, rng, first_wave_s: float, cycle_s: float) -> tuple[Requests, np.ndarray]:
    if run.get("client", "") == INFERENCEX:
        return _inferencex(run, rng)
    n, clients = int(run["n_requests"]), int(run["concurrency"])
    arrival = np.zeros(n)  # the first wave: every client at once
    second = arrival[clients:2 * clients]
    second[:] = first_wave_s + np.sort(rng.uniform(0.0, cycle_s, second.size))  # each client's phase from then on
    arrival[2 * clients:] = second[-1] if second.size else 0.0  # sent when a client frees, after its phase
    reqs = Requests(arrival, np.full(n, int(run["isl"])), np.full(n, int(run["osl"])))
    return reqs, np.zeros(n, np.int64)


def build_requests(run, seed=0, first_wave_s: float = 0.0, cycle_s: float = 0.0) -> tuple[Requests, np.ndarray]:
    """The request stream of one calibration run and the stage of each request.

    Parameters
    ----------
    run : str or pandas.Series
        A run id of :func:`batchlab.validate.calibration_runs` or one of its rows.
    seed : int or numpy.random.Generator
        Seeds the prompt order, the prompt lengths' shuffle and the send times (open loop), or the clients'
        phases (closed loop).
    first_wave_s, cycle_s : float
        Closed loop, client not recorded: seconds by which the first wave has surely finished, and over which
        the clients' second requests are spread (at most one request's shortest cycle, send to answer); both 0:
        every request ready at time 0 (lockstep). Not used for InferenceX rows (their lengths vary).

    Returns
    -------
    requests : Requests
        Open loop: the whole experiment (every stage), with ``prefix_blocks`` of :data:`BLOCK_TOKENS` tokens and
        every output exactly ``output_len`` tokens (ignore_eos). Closed loop: ``n_requests`` requests, no prefix
        ids (synthetic prompts share nothing); InferenceX rows: lengths drawn by :func:`random_lengths`, every
        request ready at 0 (the clients send as they free); other rows: ``isl`` prompt and ``osl`` output tokens,
        the first wave at 0 and the second spread over ``cycle_s`` from ``first_wave_s``.
    stages : numpy.ndarray
        Stage index of each request (int64; all 0 in the closed loop).
    """
    run = get_run(run)
    if run["set"] == OPEN_LOOP:
        return _open_loop(run, _rng(seed))
    if run["set"] == CLOSED_LOOP:
        for name, value in (("first_wave_s", first_wave_s), ("cycle_s", cycle_s)):
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 <= value < np.inf):
                raise ValueError(f"{name} must be finite seconds >= 0, got {value!r}")
        return _closed_loop(run, _rng(seed), float(first_wave_s), float(cycle_s))
    raise ValueError(f"run set must be {OPEN_LOOP!r} or {CLOSED_LOOP!r}, got {run['set']!r}")
