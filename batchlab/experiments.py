"""The experiments behind the notebooks, as functions: each runs the simulator over a grid and returns tidy frames.

Notebooks call one of these per idea and chart the result with :mod:`batchlab.viz`; the hidden assert cells
and the tests check the same frames, so a number on a page and the number a test checks are one computation.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from ._data import read_presets
from .cost import DEFAULT_EFFICIENCY
from .hardware import get_hardware
from .models import get_model
from .sim import GiB, simulate, vllm_defaults
from .sweep import sweep
from .workload import _rng, preset, Requests, synthetic


# --- 01_static_batching ---
def half_empty_fraction(requests: pd.DataFrame) -> float:
    """Share of lockstep-batch time spent after half of the batch's rows had already finished.

    The tail waste of static and dynamic batching: a finished row keeps its slot until the batch's longest
    output ends. Batches are told apart by their release time (every row of a batch is released together).

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


def first_batch_rows(requests: pd.DataFrame) -> pd.DataFrame:
    """The rows of the first lockstep batch, shortest output first, as generated and padded decode tokens.

    Returns a long frame with columns ``row`` (1 = shortest output), ``kind`` ("generated" or "padding")
    and ``tokens``; padding here is the decode tail a row sits through after its own output ended.
    """
    first = requests[requests["release_s"] == requests["release_s"].min()]
    rows = first.sort_values(["output_tokens"], kind="stable").reset_index(drop=True)
    longest = int(rows["output_tokens"].max())
    wide = pd.DataFrame({"row": np.arange(1, len(rows) + 1), "generated": rows["output_tokens"].to_numpy(),
                         "padding": longest - rows["output_tokens"].to_numpy()})
    return wide.melt(id_vars="row", var_name="kind", value_name="tokens")


def static_padding_sweep(cost, output_cvs, *, n_requests: int = 512, batch_size: int = 32,
                         prompt_tokens: int = 512, output_mean: float = 256.0, seed=0):
    """Padding tax and tail waste of static batching as the output-length variance grows (notebook 01).

    Every stream has the same prompt length (so prompt padding is zero and all padding is decode tail) and
    lognormal outputs of mean ``output_mean`` and coefficient of variation ``cv``. The same ``seed`` is used
    for every CV, so the streams differ only by their spread (common random numbers).

    Parameters
    ----------
    cost : CostModel
        Times each iteration.
    output_cvs : sequence of float
        Coefficients of variation of the output length (dimensionless, >= 0).
    n_requests, batch_size : int
        Requests in each stream (all arriving at time 0) and rows per lockstep batch.
    prompt_tokens : int
        Tokens in every prompt.
    output_mean : float
        Mean output tokens.
    seed : int or numpy.random.Generator

    Returns
    -------
    summary : DataFrame
        One row per CV: ``output_cv``, ``padding_fraction`` (share of computed token slots that were
        padding), ``half_empty_fraction`` (see :func:`half_empty_fraction`), ``padded_tokens``,
        ``max_output_tokens``, ``duration_s`` and ``output_throughput`` (tok/s).
    batches : DataFrame
        :func:`first_batch_rows` of each CV, with an ``output_cv`` column.
    """
    rows, batches = [], []
    for cv in output_cvs:
        stream = synthetic(n_requests, prompt_tokens, output_mean, prompt_cv=0.0, output_cv=float(cv), seed=seed)
        res = simulate(stream, "static", cost, batch_size=batch_size)
        summ, req = res.summary(), res.requests
        rows.append({"output_cv": float(cv), "padding_fraction": summ["padding_fraction"],
                     "half_empty_fraction": half_empty_fraction(req),
                     "padded_tokens": int(req["padded_tokens"].sum()),
                     "max_output_tokens": int(req["output_tokens"].max()),
                     "duration_s": summ["duration"], "output_throughput": summ["output_throughput"]})
        batches.append(first_batch_rows(req).assign(output_cv=float(cv)))
    return pd.DataFrame(rows), pd.concat(batches, ignore_index=True)


# --- 02_dynamic_batching ---
def idle_while_waiting_fraction(res) -> float:
    """Share of a run's duration in which the GPU ran nothing although an arrived request was waiting.

    Lockstep policies idle between batches while a static batch fills up or a dynamic timer runs; an
    iteration-level server never does, unless the KV pool is full. The oldest request not yet scheduled
    when an iteration starts is the one that was waiting during the gap before it (every policy here admits
    oldest first). A preempted request waiting to resume is not counted.

    Parameters
    ----------
    res : SimResult

    Returns
    -------
    float
        Dimensionless, in [0, 1]: idle seconds with a request waiting over the run's duration (first arrival
        to last finish).
    """
    req = res.requests[~res.requests["rejected"]]
    start = res.steps["start_s"].to_numpy()
    prev_end = np.concatenate([[-np.inf], (start + res.steps["duration_s"].to_numpy())[:-1]])
    order = np.argsort(req["scheduled_s"].to_numpy(), kind="stable")
    sched = req["scheduled_s"].to_numpy()[order]
    oldest = np.minimum.accumulate(req["arrival_s"].to_numpy()[order][::-1])[::-1]  # oldest of those scheduled later
    k = np.searchsorted(sched, start, side="left")  # first request scheduled at or after each step's start
    waiting_since = np.where(k < sched.size, oldest[np.minimum(k, sched.size - 1)], np.inf)
    idle = np.clip(start - np.maximum(prev_end, waiting_since), 0.0, None)
    duration = req["finish_s"].max() - res.requests["arrival_s"].min()
    return float(idle.sum() / duration) if duration > 0 else 0.0


def full_batch_fraction(res) -> float:
    """Share of the lockstep batches of a ``static`` or ``dynamic`` run that left with ``batch_size`` rows.

    A dynamic batch leaves full when ``batch_size`` requests queued before its timer fired. NaN for the
    iteration-level policies, which have no batches to fill.
    """
    if res.policy not in ("static", "dynamic"):
        return float("nan")
    prefills = res.steps[res.steps["prefill_tokens"] > 0]  # one prefill step opens each lockstep batch
    return float((prefills["running"] == res.knobs["batch_size"]).mean())


LATENCY_COLUMNS = ("mean_e2el_ms", "p99_e2el_ms", "mean_ttft_ms", "p99_ttft_ms")


def policy_grid(cost, workload: str, n: int, rates, *, batch_size: int = 32, delays_s=(), seed=0,
                iteration=("continuous", "chunked")) -> pd.DataFrame:
    """One real-trace workload under static, dynamic (each delay) and iteration-level batching, at each rate.

    At every rate the stream is ``preset(workload, n, rate, seed)``: the same lengths and the same arrival
    pattern, compressed or stretched in time (common random numbers), so the rates differ only by load.
    Iteration-level policies run with vLLM's default ``max_num_seqs`` and ``max_num_batched_tokens`` for
    the GPU (:func:`batchlab.vllm_defaults`); ``rate = inf`` puts every request at time 0, which measures
    a policy's saturation throughput as ``vllm bench throughput`` does.

    Parameters
    ----------
    cost : CostModel
    workload : str
        A :func:`batchlab.preset` name, e.g. ``"azure-conv-2023"``.
    n : int
        Requests per stream.
    rates : sequence of float, or mapping of label -> float
        Mean arrival rates (requests/s; ``inf`` allowed). A mapping also fills a ``load`` column.
    batch_size : int
        Rows per lockstep batch (static, dynamic).
    delays_s : sequence of float
        ``max_queue_delay_s`` values for ``dynamic`` (seconds); empty: no dynamic runs.
    seed : int
    iteration : sequence of str
        Iteration-level policies to run (``continuous``, ``chunked``).

    Returns
    -------
    DataFrame
        One row per (rate, policy, delay): ``load`` (with a mapping), ``rate_req_s``, ``policy``,
        ``max_queue_delay_s`` (NaN except dynamic), :data:`LATENCY_COLUMNS` (ms), ``request_throughput``
        (req/s), ``output_throughput`` (tok/s), ``gpu_busy_fraction``, ``padding_fraction``,
        :func:`idle_while_waiting_fraction` and :func:`full_batch_fraction`.
    """

    labelled = list(rates.items()) if hasattr(rates, "items") else [(None, r) for r in rates]
    runs = ([("static", float("nan"), {"batch_size": batch_size})]
            + [("dynamic", float(d), {"batch_size": batch_size, "max_queue_delay_s": float(d)}) for d in delays_s]
            + [(p, float("nan"), vllm_defaults(cost.hardware)) for p in iteration])
    rows = []
    for label, rate in labelled:
        stream = preset(workload, n, rate_req_s=float(rate), seed=seed)
        for policy, delay, knobs in runs:
            res = simulate(stream, policy, cost, **knobs)
            summ = res.summary()
            row = {"load": label} if label is not None else {}
            rows.append(row | {"rate_req_s": float(rate), "policy": policy, "max_queue_delay_s": delay}
                        | {k: summ[k] for k in LATENCY_COLUMNS + ("request_throughput", "output_throughput",
                                                                  "gpu_busy_fraction", "padding_fraction")}
                        | {"idle_while_waiting_fraction": idle_while_waiting_fraction(res),
                           "full_batch_fraction": full_batch_fraction(res)})
    return pd.DataFrame(rows)


# --- 03_continuous_batching ---
def tokens_per_step(res) -> np.ndarray:
    """Output tokens each iteration of ``res`` emitted: the rows that did useful work in it (int array).

    A token's emission time is exactly its iteration's end (``start_s + duration_s``), so this counts
    equal times. In a lockstep batch, rows that have finished keep running (held) but emit nothing.
    """
    tokens = np.sort(res.token_times_flat[np.isfinite(res.token_times_flat)])
    end = (res.steps["start_s"] + res.steps["duration_s"]).to_numpy()
    return np.searchsorted(tokens, end, side="right") - np.searchsorted(tokens, end, side="left")


def timeline_runs(cost, requests, *, slots: int = 4, max_queue_delay_s: float = 0.05) -> dict:
    """One request stream under static, dynamic and continuous batching with the same number of slots.

    ``slots`` is the batch size of the lockstep policies and ``max_num_seqs`` of continuous batching, so
    the three differ only in when a slot can change hands. Returns ``{policy: SimResult}``.
    """
    knobs = {"static": {"batch_size": slots},
             "dynamic": {"batch_size": slots, "max_queue_delay_s": max_queue_delay_s},
             "continuous": {"max_num_seqs": slots}}
    return {policy: simulate(requests, policy, cost, **kw) for policy, kw in knobs.items()}


def timeline_summary(runs: dict) -> pd.DataFrame:
    """Per run of :func:`timeline_runs`: when the stream ends and how well the slots were used.

    Columns: ``policy``, ``last_finish_s`` (s, the last request's last token), ``mean_e2el_s`` and
    ``mean_ttft_s`` (s), ``mean_generating`` (rows producing a token, averaged over the time from the first
    arrival to the last finish, idle time counting as zero), ``held_share`` (share of occupied slot-time
    held by rows that had already finished) and ``iterations``.
    """
    rows = []
    for policy, res in runs.items():
        req, steps = res.requests, res.steps
        span = req["finish_s"].max() - req["arrival_s"].min()
        gen = tokens_per_step(res)
        slot_time = float((steps["running"] * steps["duration_s"]).sum())
        rows.append({"policy": policy, "last_finish_s": float(req["finish_s"].max()),
                     "mean_e2el_s": float(req["e2el_s"].mean()), "mean_ttft_s": float(req["ttft_s"].mean()),
                     "mean_generating": float((gen * steps["duration_s"]).sum() / span),
                     "held_share": 1.0 - float((gen * steps["duration_s"]).sum()) / slot_time,
                     "iterations": len(steps)})
    return pd.DataFrame(rows)


def last_finish_by_seed(cost, workload: str, n: int, rate: float, seeds, *, slots: int = 4,
                        max_queue_delay_s: float = 0.05) -> pd.DataFrame:
    """When the last request of ``preset(workload, n, rate, seed)`` ends under each policy, for many seeds.

    Checks that one stream's picture is not a lucky draw: one row per seed, one column per policy of
    :func:`timeline_runs` (the last finish in seconds), indexed by ``seed``.
    """

    rows = {}
    for seed in seeds:
        runs = timeline_runs(cost, preset(workload, n, rate_req_s=rate, seed=int(seed)), slots=slots,
                             max_queue_delay_s=max_queue_delay_s)
        rows[int(seed)] = {p: float(r.requests["finish_s"].max()) for p, r in runs.items()}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("seed")


# --- 04_step_time_roofline ---
def kv_knee(cost, context: float) -> float:
    """B_kv = P b_w / (context k): the batch whose KV reads equal the weight bytes (notebook 04).

    Parameters
    ----------
    cost : CostModel
        Gives the weight bytes per GPU (P b_w) and KV bytes per token (k).
    context : float
        Cached tokens per sequence (>= 0).

    Returns
    -------
    float
        Sequences; ``inf`` with no context (the KV term never binds).
    """
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context!r}")
    return float("inf") if context == 0 else cost.weight_bytes / (context * cost.kv_bytes_per_token)


def step_time_grid(cost, batches, contexts, hardware=("h100-sxm", "h200")):
    """Decode step time over a batch x context grid, pure roofline and calibrated, on each GPU (notebook 04).

    Parameters
    ----------
    cost : CostModel
        The model, dtype and calibrated efficiencies; its hardware is replaced by each of ``hardware``.
    batches : sequence of int
        Decode batch sizes (sequences, >= 1).
    contexts : sequence of int
        Cached tokens per sequence (>= 0); ``context_index`` numbers them in the given order, so a slider
        can walk an uneven grid.
    hardware : sequence of str
        Presets of :func:`batchlab.get_hardware`.

    Returns
    -------
    curves : DataFrame
        ``hardware``, ``cost`` ("roofline" = ``cost.ideal()``, or "calibrated"), ``context``,
        ``context_index``, ``batch``, ``step_time_s`` (s) and ``kv_fits`` (the batch's KV cache fits the
        pool beside the weights at 90 % memory utilisation).
    knees : DataFrame
        One row per hardware, cost and context: ``knee`` = ``CostModel.knee(context)`` (sequences),
        ``b_kv`` (:func:`kv_knee`) and ``step_time_s`` at the knee (s).
    """

    b, c = np.meshgrid(np.asarray(batches, dtype=float), np.asarray(contexts, dtype=float))
    index = np.broadcast_to(np.arange(len(contexts))[:, None], b.shape)
    curves, knees = [], []
    for hw in hardware:
        calibrated = cost.replace(hardware=get_hardware(hw))
        for label, cm in (("roofline", calibrated.ideal()), ("calibrated", calibrated)):
            curves.append(pd.DataFrame({"hardware": hw, "cost": label, "context": c.ravel(),
                                        "context_index": index.ravel(), "batch": b.ravel(),
                                        "step_time_s": cm.decode_step_time(b.ravel(), c.ravel()),
                                        # blocks of 16 for context + the new token, vLLM's null block kept back
                                        "kv_fits": b.ravel() * np.ceil((c.ravel() + 1) / 16) <= cm.kv_pool_blocks() - 1}))
            k = np.array([cm.knee(x) for x in contexts])
            knees.append(pd.DataFrame({"hardware": hw, "cost": label, "context": np.asarray(contexts, dtype=float),
                                       "context_index": np.arange(len(contexts)), "knee": k,
                                       "b_kv": [kv_knee(cm, x) for x in contexts],
                                       "step_time_s": cm.decode_step_time(k, np.asarray(contexts, dtype=float))}))
    return pd.concat(curves, ignore_index=True), pd.concat(knees, ignore_index=True)


def knee_table(costs: dict, contexts, hardware=("h100-sxm", "h200")) -> pd.DataFrame:
    """Knees of several models at several contexts, pure roofline, on each GPU (notebook 04).

    Parameters
    ----------
    costs : dict
        Label -> CostModel (its hardware is replaced by each of ``hardware``; efficiencies set to 1).
    contexts : sequence of int
        Cached tokens per sequence.
    hardware : sequence of str
        Hardware presets, one ``knee_<name>`` column each.

    Returns
    -------
    DataFrame
        One row per label and context: ``model``, ``context`` (tokens), ``b_kv`` (sequences, :func:`kv_knee`;
        inf at 0) and ``knee_<hardware>`` = min(ridge, B_kv) (sequences) per GPU.
    """

    rows = []
    for label, cost in costs.items():
        ideal = {hw: cost.replace(hardware=get_hardware(hw)).ideal() for hw in hardware}
        for x in contexts:
            row = {"model": label, "context": int(x), "b_kv": kv_knee(cost, x)}
            rows.append(row | {f"knee_{hw}": cm.knee(x) for hw, cm in ideal.items()})
    return pd.DataFrame(rows)


# --- 05_prefill_spike ---


def spike_stream(arrival_s: float, behind_s, *, n_decoders: int = 128, context: int = 2048, decode_tokens: int = 64,
                 newcomer_tokens: int = 8000, behind_tokens: int = 256, output_tokens: int = 16,
                 newcomer: bool = True):
    """Decoders at time 0, one long prompt at ``arrival_s``, short requests at ``behind_s`` (notebook 05).

    Parameters
    ----------
    arrival_s : float
        When the long prompt arrives (s).
    behind_s : sequence of float
        Arrival times (s, sorted, >= ``arrival_s``) of the short requests queued behind it.
    n_decoders, context, decode_tokens : int
        Requests present at time 0, their prompt tokens and their output tokens.
    newcomer_tokens, behind_tokens, output_tokens : int
        Prompt tokens of the long prompt and of each short request; output tokens of both.
    newcomer : bool
        False leaves the long prompt out (the counterfactual run).

    Returns
    -------
    Requests
        Decoders first (indices 0 .. n_decoders - 1), then the long prompt (if any), then the short ones.
    """

    behind = np.asarray(behind_s, dtype=float)
    one = [1] if newcomer else []
    arrival = np.concatenate([np.zeros(n_decoders), np.multiply(one, arrival_s), behind])
    prompt = np.concatenate([np.full(n_decoders, context), np.multiply(one, newcomer_tokens),
                             np.full(behind.size, behind_tokens)])
    output = np.concatenate([np.full(n_decoders, decode_tokens), np.multiply(one, output_tokens),
                             np.full(behind.size, output_tokens)])
    return Requests(arrival, prompt.astype(np.int64), output.astype(np.int64))


def decoder_gaps(res, n_decoders: int, origin_s: float = 0.0) -> pd.DataFrame:
    """The decoders' inter-token gaps, one row per distinct (emission time, gap), with how many sequences had it.

    Decoders admitted together advance in lockstep, so their gaps coincide; counting them keeps the frame
    small enough to inline in a page. Columns: ``time_s`` (emission of the later token minus ``origin_s``,
    s), ``itl_s`` (s) and ``sequences``.
    """
    times = [res.token_times[i] for i in range(n_decoders)]
    df = pd.DataFrame({"time_s": np.concatenate([t[1:] for t in times]) - origin_s,
                       "itl_s": np.concatenate([np.diff(t) for t in times])})
    return df.round(12).groupby(["time_s", "itl_s"], as_index=False).size().rename(columns={"size": "sequences"})


class Spike(NamedTuple):
    """One prefill-spike run (notebook 05), from :func:`prefill_spike`."""

    itl: pd.DataFrame  # decoder_gaps, time relative to the long prompt's arrival (s)
    behind: pd.DataFrame  # short requests: arrival_s (relative), ttft_s with and ttft_baseline_s without it
    summary: dict  # the numbers the page reads (seconds unless named otherwise)
    run: object  # SimResult with the long prompt
    baseline: object  # SimResult of the same stream without it


def prefill_spike(cost, *, n_decoders: int = 128, context: int = 2048, newcomer_tokens: int = 8000,
                  lead_steps: int = 10, tail_steps: int = 40, n_behind: int = 6, behind_tokens: int = 256,
                  output_tokens: int = 16, prefill_only_steps: bool = False, seed=0) -> Spike:
    """Decoders in steady state, then one long prompt joins unchunked (policy ``continuous``) (notebook 05).

    A pilot run of the decoders alone gives their token times; the long prompt arrives halfway through
    their ``lead_steps``-th decode step. ``n_behind`` short requests arrive at times drawn uniformly within
    ``cost.prefill_time(newcomer_tokens)`` after it. The same stream without the long prompt is the
    counterfactual for their TTFT. ``max_num_seqs`` admits everyone; the KV pool is the model's own.

    Parameters
    ----------
    cost : CostModel
    n_decoders, context : int
        Sequences decoding when the long prompt arrives, and their prompt tokens.
    newcomer_tokens : int
        Prompt tokens of the long prompt.
    lead_steps, tail_steps : int
        Decode steps before the long prompt arrives (>= 1), and tokens each decoder emits after that.
    n_behind, behind_tokens, output_tokens : int
        Short requests queued behind, their prompt tokens, and the output tokens of every later request.
    prefill_only_steps : bool
        vLLM V0's order: an iteration that admits prompts runs only them, and the decodes wait.
    seed : int or numpy.random.Generator
        Draws the short requests' arrival times.

    Returns
    -------
    Spike
        ``summary`` keys (seconds): ``cadence_s`` (median decoder gap before the long prompt), ``spike_s``
        (largest decoder gap), ``admit_step_s`` (duration of the step that admitted the long prompt),
        ``prefill_s`` (``cost.prefill_time``), ``ideal_prefill_s`` (``cost.ideal().prefill_time``),
        ``newcomer_ttft_s``, ``behind_ttft_s`` and ``behind_ttft_baseline_s`` (means over the short
        requests); and ``admit_step`` (its index), ``n_decoders``, ``context``, ``kv_pool_tokens``.
    """

    kw = dict(n_decoders=n_decoders, context=context, decode_tokens=lead_steps + tail_steps,
              newcomer_tokens=newcomer_tokens, behind_tokens=behind_tokens, output_tokens=output_tokens)
    knobs = dict(max_num_seqs=n_decoders + n_behind + 1, prefill_only_steps=prefill_only_steps)
    pilot = simulate(spike_stream(0.0, [], newcomer=False, **kw), "continuous", cost, **knobs).token_times[0]
    arrival = 0.5 * (pilot[lead_steps - 1] + pilot[lead_steps])
    behind = arrival + np.sort(_rng(seed).uniform(0.0, cost.prefill_time(newcomer_tokens), n_behind))
    run = simulate(spike_stream(arrival, behind, **kw), "continuous", cost, **knobs)
    base = simulate(spike_stream(arrival, behind, newcomer=False, **kw), "continuous", cost, **knobs)
    ttft = pd.DataFrame({"arrival_s": behind - arrival,
                         "ttft_s": run.requests["ttft_s"].to_numpy()[n_decoders + 1:],
                         "ttft_baseline_s": base.requests["ttft_s"].to_numpy()[n_decoders:]})
    gaps = decoder_gaps(run, n_decoders, arrival)
    return Spike(gaps, ttft, _spike_summary(cost, run, gaps, ttft, n_decoders, context, newcomer_tokens), run, base)


def _spike_summary(cost, run, gaps, ttft, n_decoders, context, newcomer_tokens) -> dict:
    """The numbers notebook 05 reads from one :func:`prefill_spike` run."""
    req, steps = run.requests, run.steps
    admit = int(np.flatnonzero(steps["start_s"].to_numpy() == req["scheduled_s"].iloc[n_decoders])[0])
    return {"cadence_s": float(gaps.loc[gaps["time_s"] < 0, "itl_s"].median()), "spike_s": float(gaps["itl_s"].max()),
            "admit_step": admit, "admit_step_s": float(steps["duration_s"].iloc[admit]),
            "prefill_s": cost.prefill_time(newcomer_tokens), "ideal_prefill_s": cost.ideal().prefill_time(newcomer_tokens),
            "newcomer_ttft_s": float(req["ttft_s"].iloc[n_decoders]), "behind_ttft_s": float(ttft["ttft_s"].mean()),
            "behind_ttft_baseline_s": float(ttft["ttft_baseline_s"].mean()), "n_decoders": n_decoders,
            "context": context, "kv_pool_tokens": (run.knobs["num_kv_blocks"] - 1) * run.knobs["block_size"]}


SPIKE_ORDERS = {"mixed step (Orca)": False, "prefill-only step (vLLM V0)": True}


def spike_scenarios(scenarios: dict, orders: dict = SPIKE_ORDERS, **kw):
    """:func:`prefill_spike` for several models and scheduler orders, as tidy frames for one chart (notebook 05).

    Parameters
    ----------
    scenarios : dict
        Label -> (CostModel, n_decoders).
    orders : dict
        Label -> ``prefill_only_steps``.
    **kw
        Passed to :func:`prefill_spike` (context, newcomer_tokens, seed, ...).

    Returns
    -------
    itl : DataFrame
        Decoder gaps with ``model`` and ``order`` columns, ``time_s`` (s, since the long prompt arrived),
        ``itl_ms`` and ``sequences``.
    behind : DataFrame
        The short requests: ``model``, ``order``, ``arrival_ms`` (after the long prompt), ``run`` ("with the
        long prompt" or "without it") and ``ttft_ms``.
    summary : DataFrame
        One row per model and order: the ``Spike.summary`` keys.
    spikes : dict
        (model, order) -> Spike, for anything else a page reads.
    """
    spikes = {(m, o): prefill_spike(cost, n_decoders=n, prefill_only_steps=v0, **kw)
              for m, (cost, n) in scenarios.items() for o, v0 in orders.items()}
    itl = pd.concat([s.itl.assign(model=m, order=o, itl_ms=s.itl["itl_s"] * 1e3) for (m, o), s in spikes.items()],
                    ignore_index=True)
    behind = pd.concat([s.behind.assign(model=m, order=o) for (m, o), s in spikes.items()], ignore_index=True)
    behind = behind.rename(columns={"ttft_s": "with the long prompt", "ttft_baseline_s": "without it"}).melt(
        id_vars=["model", "order", "arrival_s"], var_name="run", value_name="ttft_s")
    behind = behind.assign(arrival_ms=behind["arrival_s"] * 1e3, ttft_ms=behind["ttft_s"] * 1e3)
    summary = pd.DataFrame([{"model": m, "order": o, **s.summary} for (m, o), s in spikes.items()])
    return itl.drop(columns="itl_s"), behind.drop(columns=["arrival_s", "ttft_s"]), summary, spikes


# --- 06_chunked_prefill ---


def prefill_arrival(cost, *, policy: str = "chunked", n_decoders: int = 128, decoder_context: int = 2048,
                    prompt_tokens: int = 8000, decoder_prompt_tokens: int = 64, newcomer_output_tokens: int = 16,
                    **knobs):
    """One long prompt arriving while a batch of sequences decodes (notebook 06).

    ``n_decoders`` requests with short prompts arrive at time 0 and decode. The newcomer (the last request)
    arrives at the step boundary where every decoder's context has reached ``decoder_context`` tokens, so
    whatever the budget, it meets the same batch: prompts were kept short so that their warm-up barely
    depends on the budget. The decoders keep decoding well past the newcomer's first token.

    Parameters
    ----------
    cost : CostModel
    policy : {"chunked", "continuous"}
    n_decoders : int
        Sequences decoding when the prompt arrives.
    decoder_context : int
        Tokens in each decoder's context (prompt + output so far) when the prompt arrives.
    prompt_tokens : int
        Tokens of the newcomer's prompt (N).
    decoder_prompt_tokens, newcomer_output_tokens : int
        Prompt tokens of each decoder; output tokens of the newcomer.
    **knobs
        Passed to :func:`batchlab.simulate` (``max_num_batched_tokens``, ``enable_chunked_prefill``, ...).

    Returns
    -------
    res : SimResult
        The newcomer is the last request.
    arrival_s : float
        Seconds, when the newcomer arrived.
    """
    if not 0 < decoder_prompt_tokens < decoder_context:
        raise ValueError("decoder_prompt_tokens must be >= 1 and below decoder_context")
    budget = knobs.get("max_num_batched_tokens")
    if policy == "chunked" and budget is not None and budget <= n_decoders:
        raise ValueError(f"max_num_batched_tokens={budget} leaves no token for the prompt beside "
                         f"{n_decoders} decodes: it must exceed n_decoders")
    chunk = prompt_tokens if budget is None else max(budget - n_decoders, 1)
    reach = decoder_context - decoder_prompt_tokens  # outputs each decoder emits before the prompt arrives
    output = reach + -(-prompt_tokens // chunk) + 64  # and enough to outlast the newcomer's prefill
    n = n_decoders
    decoders = Requests(np.zeros(n), np.full(n, decoder_prompt_tokens), np.full(n, output))
    warm = simulate(decoders, policy, cost, **knobs)
    arrival = max(float(t[reach - 1]) for t in warm.token_times)  # a step end: the next step admits it
    stream = Requests(np.r_[np.zeros(n), arrival], np.r_[np.full(n, decoder_prompt_tokens), prompt_tokens],
                      np.r_[np.full(n, output), newcomer_output_tokens])
    return simulate(stream, policy, cost, **knobs), arrival


def arrival_measures(res, arrival_s: float, window_s: float = 0.1):
    """What the decoders and the newcomer of :func:`prefill_arrival` saw.

    Returns
    -------
    measures : dict
        ``itl_max_s`` (the decoders' largest gap ending between the arrival and the newcomer's first token:
        later gaps grow only with the decoders' context), ``ttft_s`` (the newcomer's),
        ``decode_step_s`` (the decoders' median gap on the step before the arrival), ``prefill_steps``
        (steps from the arrival to the newcomer's first token) and ``largest_chunk_tokens``.
    timeline : DataFrame
        ``time_s`` (seconds since the arrival) and ``itl_s`` of the decoders' tokens from ``window_s``
        before the arrival to ``window_s`` after the newcomer's first token; every decoder is in every step,
        so their gaps coincide and one row per step (the largest gap at that time) is kept.
    """
    times = res.token_times[:-1]
    ends = np.concatenate([t[1:] for t in times])
    gaps = np.concatenate([np.diff(t) for t in times])
    before = [np.diff(t)[t[1:] <= arrival_s][-1] for t in times]
    ttft = float(res.requests["ttft_s"].iloc[-1])
    steps = res.steps
    during = steps[(steps["start_s"] >= arrival_s - 1e-12) & (steps["start_s"] < arrival_s + ttft - 1e-12)]
    prefill = (ends > arrival_s) & (ends <= arrival_s + ttft + 1e-12)  # tokens emitted during its prefill
    measures = {"itl_max_s": float(gaps[prefill].max()), "ttft_s": ttft,
                "decode_step_s": float(np.median(before)), "prefill_steps": len(during),
                "largest_chunk_tokens": int(during["prefill_tokens"].max())}
    keep = (ends >= arrival_s - window_s) & (ends <= arrival_s + ttft + window_s)
    timeline = pd.DataFrame({"time_s": ends[keep] - arrival_s, "itl_s": gaps[keep]})
    timeline = timeline.groupby(timeline["time_s"].round(9), as_index=False)["itl_s"].max()
    return measures, timeline


def chunk_budget_sweep(cost, budgets, *, unchunked_budget: int = 16384, window_s: float = 0.1, **scene):
    """The decoders' worst ITL and the newcomer's TTFT at each token budget, and with chunking off (notebook 06).

    Chunking off is vLLM V1's own switch: ``policy="chunked"`` with ``enable_chunked_prefill=False`` and a
    budget of ``unchunked_budget`` tokens, large enough for the whole prompt and the decodes in one step.

    Parameters
    ----------
    cost : CostModel
    budgets : sequence of int
        ``max_num_batched_tokens`` values (each above the number of decoders).
    unchunked_budget : int
        Budget of the unchunked run; must hold ``prompt_tokens + n_decoders``.
    window_s : float
        Seconds of timeline kept before the arrival and after the newcomer's first token.
    **scene
        Passed to :func:`prefill_arrival` (``n_decoders``, ``decoder_context``, ``prompt_tokens``, ...).

    Returns
    -------
    points : DataFrame
        One row per run: ``config`` ("chunked" or "unchunked"), ``budget`` (tokens), ``log2_budget``, the measures of
        :func:`arrival_measures` (seconds) and ``arrival_s``.
    timeline : DataFrame
        :func:`arrival_measures`' timelines with ``config``, ``budget`` and ``log2_budget`` columns.
    """
    need = scene.get("prompt_tokens", 8000) + scene.get("n_decoders", 128)
    if unchunked_budget < need:
        raise ValueError(f"unchunked_budget must hold the prompt and the decodes ({need} tokens)")
    runs = [("chunked", int(b), {}) for b in budgets]
    runs.append(("unchunked", int(unchunked_budget), {"enable_chunked_prefill": False}))
    points, lines = [], []
    for config, budget, extra in runs:
        res, arrival = prefill_arrival(cost, max_num_batched_tokens=budget, **extra, **scene)
        measures, timeline = arrival_measures(res, arrival, window_s)
        log2 = float(np.log2(budget))  # sliders walk powers of two evenly in log2
        points.append({"config": config, "budget": budget, "log2_budget": log2, **measures, "arrival_s": arrival})
        lines.append(timeline.assign(config=config, budget=budget, log2_budget=log2))
    return pd.DataFrame(points), pd.concat(lines, ignore_index=True)


class HyperbolaFit(NamedTuple):
    """(ITL_max - t_d)(TTFT - N alpha) = N alpha t_d, fitted to chunked-prefill runs (notebook 06)."""

    alpha_s: float  # s per prompt token: the marginal prefill time
    t_d_s: float  # s: the decode step the chunks ride on
    prompt_tokens: int  # N
    max_residual: float  # largest |N alpha / TTFT + t_d / ITL_max - 1| over the fitted points
    max_ttft_error: float  # largest |TTFT from the hyperbola at a point's ITL_max / its TTFT - 1|

    def ttft_s(self, itl_max_s):
        """TTFT (s) the hyperbola gives for a worst ITL (s) above t_d."""
        n_alpha = self.prompt_tokens * self.alpha_s
        return n_alpha * np.asarray(itl_max_s) / (np.asarray(itl_max_s) - self.t_d_s)

    def curve(self, itl_lo_s: float, itl_hi_s: float, n: int = 60) -> pd.DataFrame:
        """``itl_max_s`` and ``ttft_s`` along the hyperbola, log-spaced ITLs from lo to hi (lo > t_d)."""
        itl = np.geomspace(itl_lo_s, itl_hi_s, n)
        return pd.DataFrame({"itl_max_s": itl, "ttft_s": self.ttft_s(itl)})


def fit_chunk_hyperbola(itl_max_s, ttft_s, prompt_tokens: int) -> HyperbolaFit:
    """Least-squares fit of alpha and t_d to (ITL_max, TTFT) pairs (seconds) of one prompt of N tokens.

    With chunks of c tokens each step takes t_d + c alpha, so ITL_max = t_d + c alpha and
    TTFT = (N / c)(t_d + c alpha). Then N alpha / TTFT + t_d / ITL_max = c alpha / step + t_d / step = 1 for
    every c: an equation linear in (N alpha, t_d), solved by ordinary least squares over the points.
    """
    u, v = np.asarray(itl_max_s, dtype=float), np.asarray(ttft_s, dtype=float)
    if u.shape != v.shape or u.size < 2 or (u <= 0).any() or (v <= 0).any():
        raise ValueError("need at least two positive (itl_max_s, ttft_s) pairs of one shape")
    design = np.column_stack([1 / v, 1 / u])
    (n_alpha, t_d), *_ = np.linalg.lstsq(design, np.ones(u.size), rcond=None)
    residual = float(np.abs(design @ np.array([n_alpha, t_d]) - 1).max())
    fit = HyperbolaFit(float(n_alpha / prompt_tokens), float(t_d), int(prompt_tokens), residual, np.nan)
    return fit._replace(max_ttft_error=float(np.abs(fit.ttft_s(u) / v - 1).max()))


# --- 07_piggybacking ---

STEP_KINDS = ("decode", "mixed", "prefill")
MIXING_POLICIES = {  # label -> (policy, knobs): three ways to combine prompts with the decodes of a batch
    "chunked: prompt chunks mixed in (vLLM V1)": ("chunked", {}),
    "whole prompts mixed in (Orca)": ("continuous", {}),
    "prefill-only steps (vLLM V0)": ("continuous", {"prefill_only_steps": True}),
}


def step_kinds(steps: pd.DataFrame) -> np.ndarray:
    """Kind of each iteration: "decode" (no prompt tokens), "prefill" (no decodes) or "mixed" (both)."""
    prefill, decode = steps["prefill_tokens"].to_numpy() > 0, steps["decode_seqs"].to_numpy() > 0
    return np.where(prefill & decode, "mixed", np.where(prefill, "prefill", "decode"))


def step_utilisation(runs: dict, window_s=None) -> pd.DataFrame:
    """Per-iteration compute and bandwidth utilisation of labelled runs (notebook 07).

    Parameters
    ----------
    runs : dict of label -> SimResult
    window_s : (float, float), optional
        Keep steps starting in this interval of seconds (default: every step).

    Returns
    -------
    DataFrame
        ``run``, ``kind`` (:func:`step_kinds`), ``start_s``, ``duration_s``, ``prefill_tokens``, ``decode_seqs``,
        ``compute_util`` and ``bandwidth_util`` (shares of peak FLOP/s and HBM bytes/s over the step),
        ``intensity`` (FLOP per HBM byte) and ``flops_per_s`` (achieved).
    """
    parts = []
    for label, res in runs.items():
        s = res.steps.assign(run=label, kind=step_kinds(res.steps))
        if window_s is not None:
            s = s[(s["start_s"] >= window_s[0]) & (s["start_s"] < window_s[1])]
        parts.append(s.assign(intensity=s["flops"] / s["hbm_bytes"], flops_per_s=s["flops"] / s["duration_s"]))
    cols = ["run", "kind", "start_s", "duration_s", "prefill_tokens", "decode_seqs", "compute_util",
            "bandwidth_util", "intensity", "flops_per_s"]
    return pd.concat(parts, ignore_index=True)[cols]


def roofline_ceiling(cost, intensities) -> pd.DataFrame:
    """The hardware roofline min(F, I * BW) at 100 % of peak: ``intensity`` (FLOP/byte), ``flops_per_s``."""
    i = np.asarray(intensities, dtype=float)
    return pd.DataFrame({"intensity": i, "flops_per_s": np.minimum(cost.peak_flops, i * cost.hardware.hbm_bytes_per_s)})


def budget_split(requests, cost, budgets, *, bin_s: float = 1.0, **knobs) -> pd.DataFrame:
    """How each iteration's token budget goes to prompt chunks and to decodes, over a run (notebook 07).

    Runs ``policy="chunked"`` once per ``max_num_batched_tokens`` in ``budgets`` and averages, in bins of
    ``bin_s`` seconds, the prompt tokens and the decode tokens (one per decoding sequence) per step.

    Returns
    -------
    DataFrame
        ``budget``, ``log2_budget``, ``time_s`` (bin start, s), ``kind`` ("prefill" or "decode"), ``tokens_per_step`` and
        ``steps`` (iterations in the bin).
    """
    parts = []
    for budget in budgets:
        s = simulate(requests, "chunked", cost, max_num_batched_tokens=int(budget), **knobs).steps
        b = (s["start_s"] // bin_s) * bin_s
        per_bin = s.groupby(b).agg(prefill=("prefill_tokens", "mean"), decode=("decode_seqs", "mean"),
                                   steps=("duration_s", "size")).rename_axis("time_s").reset_index()
        long = per_bin.melt(id_vars=["time_s", "steps"], value_vars=["prefill", "decode"], var_name="kind",
                            value_name="tokens_per_step")
        parts.append(long.assign(budget=int(budget), log2_budget=float(np.log2(budget))))
    return pd.concat(parts, ignore_index=True)[["budget", "log2_budget", "time_s", "kind", "tokens_per_step", "steps"]]


def mixing_comparison(preset_name: str, n: int, rates, cost, *, budget: int = 2048, seed=0,
                      policies=None) -> pd.DataFrame:
    """Throughput and latency with and without mixed steps, over offered load (notebook 07).

    Every rate replays the same ``n`` request lengths of :func:`batchlab.preset` (one ``seed``: lengths are
    drawn before arrivals), so runs differ only by their arrival rate and policy.

    Parameters
    ----------
    preset_name : str
        A real-trace preset, e.g. ``"azure-conv-2023"``.
    n : int
        Requests per run.
    rates : sequence of float
        Offered arrival rates (requests/s; ``inf`` = all at time 0).
    cost : CostModel
    budget : int
        ``max_num_batched_tokens`` of the chunked policy.
    policies : dict, optional
        Label -> (policy, knobs); default :data:`MIXING_POLICIES`.

    Returns
    -------
    DataFrame
        One row per rate and policy: ``rate``, ``policy`` (label) and every ``summary()`` key.
    """
    rows = []
    for rate in rates:
        stream = preset(preset_name, n, rate_req_s=float(rate), seed=seed)
        for label, (policy, knobs) in (policies or MIXING_POLICIES).items():
            extra = {"max_num_batched_tokens": budget} if policy == "chunked" else {}
            res = simulate(stream, policy, cost, **knobs, **extra)
            rows.append({"rate": float(rate), "policy": label, **res.summary()})
    return pd.DataFrame(rows)


# --- 08_two_knobs ---


def saturation_rate(cost, workload: str, n_requests: int, *, seed=0, **knobs) -> float:
    """Requests/s the server completes when every request of a real-trace preset is queued at time 0 (notebook 08).

    The capacity that request rates are expressed against: ``request_throughput`` of one ``chunked`` run of
    ``preset(workload, n_requests, rate_req_s=inf, seed=seed)`` with ``knobs`` (vLLM's defaults for the GPU if none).
    The drain at the end of the run, when fewer requests are left than the batch holds, is included, so this
    is slightly below the steady-state capacity.
    """
    stream = preset(workload, n_requests, rate_req_s=np.inf, seed=seed)
    return float(simulate(stream, "chunked", cost, **knobs).summary()["request_throughput"])


def two_knob_sweep(cost, workload: str, rates, max_num_seqs, max_num_batched_tokens, *, n_requests: int = 3000,
                   seed=0, executor=None) -> pd.DataFrame:
    """Every (``max_num_seqs``, ``max_num_batched_tokens``) pair under ``chunked`` at every request rate (notebook 08).

    Each rate replays ``preset(workload, n_requests, rate, seed)``; with one seed the prompt and output lengths
    are the same at every rate and the arrival gaps only scale (common random numbers).

    Parameters
    ----------
    cost : CostModel
    workload : str
        A real-trace preset (:func:`batchlab.preset_names`).
    rates : sequence of float
        Mean arrival rates (requests/s).
    max_num_seqs, max_num_batched_tokens : sequence of int
        The grid (sequences, tokens per iteration).
    n_requests : int
    seed : int
    executor : concurrent.futures.Executor, optional
        Passed to :func:`batchlab.sweep`; the frame is the same with any executor.

    Returns
    -------
    DataFrame
        One row per rate and pair, rates outermost: ``rate`` (req/s), the knobs, the ``summary()`` columns, and
        ``vllm_refuses`` (True where ``max_num_batched_tokens < max_num_seqs``, which vLLM's
        ``SchedulerConfig`` rejects at start-up; the simulator runs them anyway).
    """
    grid = {"max_num_seqs": [int(s) for s in max_num_seqs],
            "max_num_batched_tokens": [int(t) for t in max_num_batched_tokens]}
    parts = [sweep(preset(workload, n_requests, rate_req_s=float(rate), seed=seed), grid, cost, policy="chunked",
                   executor=executor, progress=False).assign(rate=float(rate)) for rate in rates]
    df = pd.concat(parts, ignore_index=True)
    df["vllm_refuses"] = df["max_num_batched_tokens"] < df["max_num_seqs"]
    return df


def tolerant_front(df: pd.DataFrame, x: str = "output_throughput", y: str = "p99_ttft_ms",
                   rel_tol: float = 0.01) -> np.ndarray:
    """Mask of the rows on the latency-throughput frontier, counting throughputs within ``rel_tol`` as equal.

    A row is beaten when another has a lower ``y`` at an ``x`` of at least (1 - rel_tol) times its own, or an
    equal-or-lower ``y`` at a higher ``x``; ``x`` is maximised, ``y`` minimised. With ``rel_tol = 0`` this is
    exact Pareto dominance (:func:`batchlab.is_dominated`); a positive tolerance also removes rows that are
    ahead only by the drain tail of a finite run. Of rows with identical (x, y), only the first is kept, so
    the frontier names the configuration that comes first in grid order (the smallest ``max_num_seqs``).
    Every row kept is non-dominated in the exact sense.
    """
    if not 0 <= rel_tol < 1:
        raise ValueError(f"rel_tol must be in [0, 1), got {rel_tol!r}")
    xs, ys = df[x].to_numpy(dtype=float), df[y].to_numpy(dtype=float)
    lower = (ys[None, :] < ys[:, None]) & (xs[None, :] >= xs[:, None] * (1 - rel_tol))
    faster = (ys[None, :] <= ys[:, None]) & (xs[None, :] > xs[:, None])
    return ~(lower | faster).any(axis=1) & ~df.duplicated([x, y]).to_numpy()


def with_frontier(df: pd.DataFrame, x: str = "output_throughput", y: str = "p99_ttft_ms",
                  rel_tol: float = 0.01) -> pd.DataFrame:
    """``df`` with a boolean ``frontier`` column: :func:`tolerant_front` over the configurations vLLM accepts.

    Rows with ``vllm_refuses`` are never on the frontier and never push another row off it.
    """
    accepted = df[~df["vllm_refuses"]]
    front = accepted.index[tolerant_front(accepted, x, y, rel_tol)]
    return df.assign(frontier=df.index.isin(front))


def seqs_plateau(df: pd.DataFrame, y: str = "p99_ttft_ms", tol: float = 0.05) -> pd.DataFrame:
    """Per rate and token budget, the smallest ``max_num_seqs`` whose ``y`` is within ``tol`` of the best one.

    Where raising the concurrency cap stops paying: every larger cap improves ``y`` by less than ``tol``
    (a fraction) over this one. Returns ``rate``, ``max_num_batched_tokens``, ``max_num_seqs``, ``y`` there
    and ``best_<y>`` (the lowest over all caps).
    """
    rows = []
    for (rate, tokens), g in df.groupby(["rate", "max_num_batched_tokens"], sort=True):
        best = float(g[y].min())
        first = g[g[y] <= best * (1 + tol)].sort_values("max_num_seqs").iloc[0]
        rows.append({"rate": rate, "max_num_batched_tokens": int(tokens), "max_num_seqs": int(first["max_num_seqs"]),
                     y: float(first[y]), f"best_{y}": best})
    return pd.DataFrame(rows)


def default_vs_best(df: pd.DataFrame, defaults: dict, x: str = "output_throughput", y: str = "p99_ttft_ms",
                    rel_tol: float = 0.01, also=("p99_itl_ms",)) -> pd.DataFrame:
    """Per rate, vLLM's default configuration beside the lowest-``y`` configuration at the same throughput.

    "Same throughput" means an ``x`` of at least (1 - rel_tol) times the default's, at any rate of the sweep;
    configurations vLLM refuses are left out. Ties go to the first in grid order. Returns one row per rate:
    ``rate``, ``default_<col>`` and ``best_<col>`` for ``x``, ``y`` and each column of ``also``, and the
    best configuration's ``best_max_num_seqs`` and ``best_max_num_batched_tokens``.
    """
    ok = df[~df["vllm_refuses"]]
    cols = [x, y, *also]
    rows = []
    for rate, g in ok.groupby("rate", sort=True):
        dflt = g[(g["max_num_seqs"] == defaults["max_num_seqs"])
                 & (g["max_num_batched_tokens"] == defaults["max_num_batched_tokens"])].iloc[0]
        peers = ok[ok[x] >= dflt[x] * (1 - rel_tol)]
        best = peers.loc[peers[y].idxmin()]
        rows.append({"rate": rate} | {f"default_{c}": float(dflt[c]) for c in cols}
                    | {f"best_{c}": float(best[c]) for c in cols}
                    | {f"best_{k}": int(best[k]) for k in ("max_num_seqs", "max_num_batched_tokens")})
    return pd.DataFrame(rows)


def vllm_defaults_table(gpus=("h100-sxm", "h200", "a100-80gb")) -> pd.DataFrame:
    """vLLM's default knobs per GPU (:func:`batchlab.vllm_defaults`): they depend on the GPU, not on the model.

    Returns one row per GPU: ``gpu``, ``hbm_gib`` (GiB), ``max_num_seqs``, ``max_num_batched_tokens_serve``
    (``vllm serve``) and ``max_num_batched_tokens_offline`` (the ``LLM`` class).
    """
    rows = []
    for name in gpus:
        hw = get_hardware(name)
        serve, offline = vllm_defaults(hw, "serve"), vllm_defaults(hw, "offline")
        rows.append({"gpu": name, "hbm_gib": hw.hbm_bytes / 2**30, "max_num_seqs": serve["max_num_seqs"],
                     "max_num_batched_tokens_serve": serve["max_num_batched_tokens"],
                     "max_num_batched_tokens_offline": offline["max_num_batched_tokens"]})
    return pd.DataFrame(rows)


# --- 10_validation ---
# The calibrated cost model against measured H100 timings, and end-to-end runs against published vLLM figures.

PARITY_DESCRIPTORS = ("model", "op", "geometry", "tp", "workers", "tokens", "batch", "kv_len", "m", "k", "n",
                      "size_bytes")  # the columns that name a measured case, in the order a label shows them


def shipped_floors():
    """The per-kernel floors of ``data/calibration.csv`` as :class:`batchlab.calibrate.KernelFloors` (seconds).

    They are not CostModel fields (see :mod:`batchlab.calibrate`), so the errors of the per-operator sets
    after calibration need them alongside the CostModel's defaults.
    """
    from . import calibrate

    values = read_presets("calibration.csv")
    return calibrate.KernelFloors(*(float(values[f"kernel_floor_{k}"]["value"]) for k in calibrate.KernelFloors._fields))


def shipped_own_kernels():
    """FP8's and eager PyTorch's efficiencies from ``data/calibration.csv``, as :class:`batchlab.calibrate.OwnKernels`."""
    from . import calibrate

    values = read_presets("calibration.csv")
    return calibrate.OwnKernels(*(float(values[k]["value"]) for k in calibrate.OwnKernels._fields))


def _stage_group(split: pd.Series) -> pd.Series:
    """fit / ridge / held out: how a measured case was used by the calibration."""
    return split.where(split.isin(["fit", "ridge"]), "held out")


def validation_frames(before, after, floors=None, own=None, root=None):
    """Every measured case predicted twice, before and after calibration, and the error table (notebook 10).

    Parameters
    ----------
    before, after : CostModel
        H100 SXM cost models: DESIGN's starting efficiencies (``cost.replace(**calibrate.START)``) and the
        calibrated defaults. Their model and TP are replaced by each measured case's own.
    floors : KernelFloors, optional
        Seconds per kernel added to the per-operator sets after calibration (default: :func:`shipped_floors`);
        the "before" predictions have none, as in ``data/calibration_errors.csv``.
    own : OwnKernels, optional
        FP8's and eager PyTorch's efficiencies after calibration (default: :func:`shipped_own_kernels`); the
        "before" predictions use ``before``'s everywhere.
    root : path, optional
        Measured-timings folder (default ``$BATCHLAB_MEASURED_DIR``).

    Returns
    -------
    cases : DataFrame
        One row per case and stage: ``case_id`` (same case in both stages), ``set``, ``split``, ``group``
        (fit, ridge, held out), ``stage`` (before, after), ``measured_s``, ``predicted_s``, ``rel_err``
        (|predicted / measured - 1|) and the case descriptors.
    errors : DataFrame
        One row per set: ``cases``, ``median_rel_err_before``, ``worst_rel_err_before``,
        ``median_rel_err_after``, ``worst_rel_err_after``, ``diagnostic`` (a set timed under efficiencies
        that are not its kernels', :data:`batchlab.calibrate.DIAGNOSTIC_SETS`), as in the ``all`` rows of
        ``data/calibration_errors.csv``.
    """
    from . import calibrate

    floors = shipped_floors() if floors is None else floors
    own = shipped_own_kernels() if own is None else own
    stages = {"before": calibrate.load_all(before, root), "after": calibrate.load_all(after, root, floors, own)}
    tables, frames = [], []
    for stage, frame in stages.items():
        frame = frame.assign(case_id=np.arange(len(frame)), stage=stage, group=_stage_group(frame["split"]),
                             rel_err=(frame["predicted_s"] / frame["measured_s"] - 1.0).abs())
        frames.append(frame)
        err = calibrate.relative_errors(frame)
        err = err[err["split"] == "all"].set_index("set")
        tables.append(err[["cases", "median_rel_err", "worst_rel_err"]].add_suffix(f"_{stage}"))
    errors = tables[0].join(tables[1].drop(columns="cases_after")).rename(columns={"cases_before": "cases"})
    errors["diagnostic"] = errors.index.isin(list(calibrate.DIAGNOSTIC_SETS.values()))
    return pd.concat(frames, ignore_index=True), errors.reset_index()


def parity_sample(cases: pd.DataFrame, per_set: int = 100) -> pd.DataFrame:
    """A few hundred cases per set for a parity chart: evenly spaced in measured time, plus each stage's worst.

    The same cases are kept in both stages, so the before and after panels show the same points. Adds
    ``measured_ms``, ``predicted_ms`` and a ``case`` label (the descriptors that name the case).
    """
    keep = []
    for _, per in cases.groupby("set", sort=False):
        first = per[per["stage"] == per["stage"].iloc[0]].sort_values("measured_s", kind="stable")
        pick = np.unique(np.linspace(0, len(first) - 1, min(per_set, len(first))).round().astype(int))
        worst = per.loc[per.groupby("stage")["rel_err"].idxmax(), "case_id"]
        keep += [*first["case_id"].iloc[pick], *worst]
    out = cases[cases["case_id"].isin(keep)].copy()
    out["measured_ms"], out["predicted_ms"] = out["measured_s"] * 1e3, out["predicted_s"] * 1e3
    cols = [c for c in PARITY_DESCRIPTORS if c in out.columns]
    out["case"] = [", ".join(f"{c} {v:g}" if isinstance(v, float) else f"{c} {v}" for c, v in zip(cols, row)
                             if not pd.isna(v)) for row in out[cols].itertuples(index=False)]
    return out[["case_id", "set", "group", "stage", "case", "measured_ms", "predicted_ms", "rel_err"]].reset_index(drop=True)


def llmservingsim_forward(cost, root=None) -> pd.DataFrame:
    """LLMServingSim's eager forward pass of Llama-3.1-8B against ``cost.prefill_time``, elementwise part apart.

    Per prompt length (``tokens``): ``measured_s`` (the whole pass), ``measured_elementwise_s`` (its norms, RoPE
    and SiLU kernels in 32 layers plus the final norm), ``predicted_s`` (``cost.prefill_time``),
    ``predicted_elementwise_s`` (the part of it that is the elementwise term) and
    ``predicted_without_elementwise_s`` (DESIGN's formula, ``eta_elementwise=None``).
    """
    from . import calibrate

    root = str(calibrate.measured_dir(root))
    raw = calibrate._llmservingsim_raw(root)
    measured = calibrate._llmservingsim_forward_s(root)
    model = get_model(calibrate.REFERENCE_MODEL)
    measured_elem = model.layers * raw[list(calibrate.LLMSERVINGSIM_SMALL_OPS)].sum(axis=1) + raw["final_layernorm"]
    cost = cost.replace(model=model, dtype="bf16", kv_dtype="bf16", tp=1)
    parts = [cost.step_breakdown([(int(t), 0)]) for t in measured.index]
    predicted = np.array([p.total_s for p in parts])
    elementwise = np.array([p.elementwise_s for p in parts])
    return pd.DataFrame({
        "tokens": measured.index.to_numpy(dtype=np.float64), "measured_s": measured.to_numpy(),
        "measured_elementwise_s": measured_elem.reindex(measured.index).to_numpy(),
        "predicted_s": predicted, "predicted_elementwise_s": elementwise,
        "predicted_without_elementwise_s": predicted - elementwise,
    })


def eager_holdout_error(cost, max_tokens: int, root=None) -> pd.Series:
    """Median error of eager PyTorch's kernels on prompts longer than ``max_tokens``, fitted up to it.

    Refits eager attention's and elementwise efficiencies and floors (:func:`batchlab.calibrate.fit_eager`)
    on LLMServingSim's prompts of at most ``max_tokens`` tokens, with ``cost``'s other efficiencies, and
    returns the median relative error per set (``llmservingsim_attn``, ``llmservingsim_elementwise``) on the
    longer prompts: how far the fitted shape carries.
    """
    from . import calibrate

    etas, floors = calibrate.fit_eager(root, max_tokens, cost)
    own = shipped_own_kernels()._replace(eager_eta_attn=etas["eta_attn"], eager_eta_elementwise=etas["eta_elementwise"])
    frame = calibrate.load_llmservingsim(cost, root, floors, own)
    frame = frame[frame["set"].isin(["llmservingsim_attn", "llmservingsim_elementwise"]) & (frame["tokens"] > max_tokens)]
    return (frame["predicted_s"] / frame["measured_s"] - 1).abs().groupby(frame["set"]).median()


# vLLM v0.6.0 performance update (vLLM blog, 2024-09-05, https://blog.vllm.ai/2024/09/05/perf-update.html),
# as quoted in ../shared/data/README.md: Llama-3-8B BF16 on one H100, 500 ShareGPT prompts.
PUBLISHED_VLLM_V060 = {
    "prompt_tokens_mean": 202.0,  # tokens, the blog's ShareGPT sample
    "output_tokens_mean": 179.0,  # tokens
    "n_requests": 500,
    "request_throughput": 36.9,  # req/s, every request sent at once
    "mean_tpot_ms": 13.4,  # ms, at 32 QPS
    "tpot_qps": 32.0,  # req/s
    "mean_ttft_ms_ceiling": 120.0,  # ms, mean TTFT stays under it from 2 to 32 QPS
    "ttft_qps": (2.0, 32.0),
    "gpu_busy_before_v060": 0.38,  # share of time the GPU was busy before v0.6 (8B on H100), same post
}


def match_means(requests, prompt_mean: float, output_mean: float):
    """The same stream with every prompt and output length scaled so their means are the given ones.

    Lengths are rounded and kept >= 1 token; arrivals are unchanged, and so is the shape of each
    distribution (its coefficient of variation) up to the rounding.
    """

    def scale(tokens, mean):
        return np.maximum(np.rint(tokens * (mean / tokens.mean())), 1).astype(np.int64)

    return Requests(requests.arrival_s, scale(requests.prompt_tokens, prompt_mean),
                    scale(requests.output_tokens, output_mean))


V060_COLUMNS = ("request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                "p99_tpot_ms", "gpu_busy_fraction", "preemptions")


def vllm_v060_runs(cost, rates, *, n_requests: int = 500, seed=0, lengths: str = "blog", **knobs) -> pd.DataFrame:
    """The ShareGPT preset through the ``chunked`` policy at each arrival rate (notebook 10).

    Parameters
    ----------
    cost : CostModel
    rates : sequence of float
        Mean arrival rates in requests/s; ``inf`` sends every request at time 0 (the throughput run).
    n_requests : int
        Requests per run (the blog used 500).
    seed : int
        Seed of :func:`batchlab.preset` (lengths and arrivals); the same for every rate.
    lengths : {"blog", "trace"}
        "blog" rescales the sampled lengths to the blog's means (:data:`PUBLISHED_VLLM_V060`, with
        :func:`match_means`); "trace" keeps the ShareGPT file's own.
    **knobs
        Passed to :func:`batchlab.simulate` (default: vLLM's defaults for the GPU).

    Returns
    -------
    DataFrame, one row per rate: ``rate``, ``lengths``, ``prompt_tokens_mean``, ``output_tokens_mean`` and the
    summary keys of :data:`V060_COLUMNS`.
    """

    rows = []
    for rate in rates:
        stream = preset("sharegpt", n_requests, rate_req_s=float(rate), seed=seed)
        if lengths == "blog":
            stream = match_means(stream, PUBLISHED_VLLM_V060["prompt_tokens_mean"],
                                 PUBLISHED_VLLM_V060["output_tokens_mean"])
        elif lengths != "trace":
            raise ValueError(f"lengths must be 'blog' or 'trace', got {lengths!r}")
        summ = simulate(stream, "chunked", cost, **knobs).summary()
        rows.append({"rate": float(rate), "lengths": lengths, "prompt_tokens_mean": float(stream.prompt_tokens.mean()),
                     "output_tokens_mean": float(stream.output_tokens.mean()), **{k: summ[k] for k in V060_COLUMNS}})
    return pd.DataFrame(rows)


def published_comparison(runs: pd.DataFrame, published: dict = PUBLISHED_VLLM_V060) -> pd.DataFrame:
    """Predicted beside published for the three figures of the vLLM v0.6.0 post, with ``ratio`` = predicted / published.

    ``runs`` is :func:`vllm_v060_runs` of one ``lengths`` over rates including ``inf``, ``tpot_qps`` and the
    TTFT range. The TTFT figure is a ceiling: its row compares the highest predicted mean TTFT in the range.
    """
    at = runs.set_index("rate")
    lo, hi = published["ttft_qps"]
    in_range = at[(at.index >= lo) & (at.index <= hi)]
    rows = [("request throughput (req/s)", "all 500 requests at once", published["request_throughput"],
             at.loc[np.inf, "request_throughput"]),
            ("mean TPOT (ms)", f"{published['tpot_qps']:g} QPS", published["mean_tpot_ms"],
             at.loc[published["tpot_qps"], "mean_tpot_ms"]),
            ("mean TTFT (ms), highest", f"{lo:g} to {hi:g} QPS", published["mean_ttft_ms_ceiling"],
             in_range["mean_ttft_ms"].max())]
    out = pd.DataFrame(rows, columns=["figure", "condition", "published", "predicted"])
    out["ratio"] = out["predicted"] / out["published"]
    return out


# --- 11_fact_check ---
# The article's quantitative claims, each recomputed from the cost model, vLLM's defaults or the simulator.

def cadence_batch(cost, step_s: float, context: int, max_batch: int = 4096) -> int:
    """The decode batch whose step time is closest to ``step_s`` seconds, every sequence at ``context`` tokens.

    Decode step time rises monotonically with the batch, so this is where the cost model puts a given
    inter-token cadence. Raises ``ValueError`` if even one sequence, or ``max_batch``, misses it by more
    than one step's increment (the cadence is then out of this model's reach on this GPU).
    """
    batch = np.arange(1, max_batch + 1)
    step = cost.decode_step_time(batch, context)
    if step[0] > step_s or step[-1] < step_s:
        raise ValueError(f"a {step_s * 1e3:g} ms decode step is outside 1..{max_batch} sequences at {context} "
                         f"tokens: the step takes {step[0] * 1e3:.1f} to {step[-1] * 1e3:.1f} ms")
    return int(batch[np.argmin(np.abs(step - step_s))])


def prefill_gap(cost, prompt_tokens: int, decoders: int = 0, context: int = 0) -> dict:
    """The one iteration that prefills a whole ``prompt_tokens`` prompt beside ``decoders`` decodes at ``context``.

    Returns ``step_s`` (seconds: the gap every decoder sees), ``flops`` (FLOP in the step), ``mfu`` (the share
    of the dtype's peak FLOP/s the step runs at, flops / (step_s * peak)) and ``bound``.
    """
    ctx = [context] * decoders
    br = cost.step_breakdown(prefill_chunks=[(prompt_tokens, 0)], decode_contexts=ctx)
    return {"step_s": br.total_s, "flops": br.flops, "mfu": br.flops / (br.total_s * cost.peak_flops),
            "bound": br.bound}


def implied_mfu(cost, prompt_tokens: int, gap_s: float, decoders: int = 0, context: int = 0) -> float:
    """The model FLOPs utilisation at which that prefill step would take exactly ``gap_s`` seconds."""
    return prefill_gap(cost, prompt_tokens, decoders, context)["flops"] / (gap_s * cost.peak_flops)


def max_num_seqs_table(hardware_list, models, tp: int = 1) -> pd.DataFrame:
    """vLLM's default ``max_num_seqs`` for each GPU and model, beside the article's size rule (notebook 11).

    The article says 1,024 for small models and 256 for large ones; vLLM decides from the GPU alone
    (:func:`batchlab.vllm_defaults`). One row per (GPU, model): ``gpu``, ``hbm_gib`` (memory the driver
    reports, GiB), ``model``, ``params_b`` (billions), ``max_num_seqs`` and ``max_num_batched_tokens``
    (``vllm serve``), ``offline_tokens`` (``LLM``), ``article_rule`` (1024 if under 20 B parameters, else
    256) and ``agrees``.
    """

    rows = []
    for hw in hardware_list:
        serve, offline = vllm_defaults(hw, "serve"), vllm_defaults(hw, "offline")
        for m in models:
            rule = 1024 if m.params < 20e9 else 256
            rows.append({"gpu": hw.name, "hbm_gib": hw.hbm_bytes / GiB, "model": m.name, "params_b": m.params / 1e9,
                         "max_num_seqs": serve["max_num_seqs"], "max_num_batched_tokens": serve["max_num_batched_tokens"],
                         "offline_tokens": offline["max_num_batched_tokens"], "article_rule": rule,
                         "agrees": serve["max_num_seqs"] == rule})
    return pd.DataFrame(rows)


def chunking_tradeoff(cost, budgets, *, decoders: int, context: int, prompt_tokens: int = 8000,
                      newcomer_output: int = 16, margin_steps: int = 20) -> pd.DataFrame:
    """The 8,000-token scene under each token budget: the newcomer's TTFT against the decoders' tallest gap.

    ``decoders`` requests with ``context``-token prompts arrive at time 0; once all of them are decoding
    under the smallest budget (and ``margin_steps`` decode steps later), one ``prompt_tokens`` prompt
    arrives. Every budget replays the same scene through the ``chunked`` policy, with ``max_num_seqs`` and a
    KV pool large enough that nothing waits for a slot or for memory: the scene isolates how the budget
    splits the prompt. Raises ``RuntimeError`` if a decoder finishes before the newcomer's first token.

    Returns
    -------
    DataFrame, one row per budget: ``max_num_batched_tokens``, ``log2_budget``, ``ttft_ms`` (the
    newcomer's), ``max_itl_ms`` (the tallest gap between two tokens of any decoder, among tokens emitted
    after the newcomer's arrival up to its first token), ``base_itl_ms`` (the decoders' median gap in the
    0.2 s before it arrived) and ``chunks`` (iterations its prompt was computed in).
    """
    budgets = sorted(int(b) for b in budgets)
    if budgets[0] <= decoders:
        raise ValueError(f"every budget must exceed the {decoders} decode tokens of each iteration")
    warm_steps = -(-decoders * context // (budgets[0] - decoders)) + decoders + margin_steps
    warm = _tradeoff_scene(decoders, context, warm_steps, prompt_tokens, None, newcomer_output)
    knobs = {"max_num_seqs": decoders + 1, "num_kv_blocks": 1 << 24}
    first = simulate(warm, "chunked", cost, max_num_batched_tokens=budgets[0], **knobs).requests["first_token_s"]
    arrive = float(first.max()) + margin_steps * cost.decode_step_time(decoders, context)
    rows = [{"max_num_batched_tokens": b, "log2_budget": float(np.log2(b)),
             **_tradeoff_run(cost, b, decoders, context, prompt_tokens, newcomer_output, arrive, knobs)}
            for b in budgets]
    return pd.DataFrame(rows)


def _tradeoff_scene(decoders, context, output, prompt_tokens, arrive, newcomer_output):
    """Decoders at time 0 and, if ``arrive`` is given, the newcomer at ``arrive`` seconds."""

    if arrive is None:
        return Requests(np.zeros(decoders), np.full(decoders, context), np.full(decoders, output))
    return Requests(np.r_[np.zeros(decoders), arrive], np.r_[np.full(decoders, context), prompt_tokens],
                    np.r_[np.full(decoders, output), newcomer_output])


def _tradeoff_run(cost, budget, decoders, context, prompt_tokens, newcomer_output, arrive, knobs) -> dict:
    """One budget of :func:`chunking_tradeoff`, decoders long enough to outlive the newcomer's prefill."""
    chunks = -(-prompt_tokens // (budget - decoders))
    horizon = arrive + cost.prefill_time(prompt_tokens) + (chunks + 2) * cost.decode_step_time(decoders, context)
    output = int(np.ceil(2 * horizon / cost.decode_step_time(1, 0)))  # no step is shorter than a lone decode
    stream = _tradeoff_scene(decoders, context, output, prompt_tokens, arrive, newcomer_output)
    res = simulate(stream, "chunked", cost, max_num_batched_tokens=budget, record_schedule=True, **knobs)
    new = res.requests.iloc[-1]
    if not (res.requests["finish_s"].iloc[:decoders] > new["first_token_s"]).all():
        raise RuntimeError("a decoder finished before the newcomer's first token: lengthen the decoders")
    gaps = [(t[1:], np.diff(t)) for t in res.token_times[:decoders]]
    during = max(g[(e > arrive) & (e <= new["first_token_s"])].max(initial=0.0) for e, g in gaps)
    before = np.median(np.concatenate([g[(e < arrive) & (e > arrive - 0.2)] for e, g in gaps]))
    sched = res.schedule
    n_chunks = int(((sched["request"] == decoders) & (sched["kind"] == "prefill")).sum())
    return {"ttft_ms": new["ttft_s"] * 1e3, "max_itl_ms": during * 1e3, "base_itl_ms": before * 1e3,
            "chunks": n_chunks}
