"""Replay calibration runs through ``simulate`` and compare each measured mean with its prediction.

Metrics, defined the same way on both sides (times in ms):

- inference-perf, per stage: ``ttft`` and ``e2e`` are the means over the stage's completed requests; ``tpot`` =
  (E2E mean - TTFT mean) / (output_len - 1), since every request generated exactly output_len tokens (the
  source's own ``tpot_s`` and ``itl_s`` count blank stream lines and are about half the real time);
- AIConfigurator: ``ttft`` and ``tpot`` are means over the requests; ``e2e`` = TTFT + TPOT x (osl - 1).

A replay also says whether the simulated server was overloaded (open loop): completions per second clearly
below the offered rate, or a queue that grows through the stage (:func:`overload_signs`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..cost import CostModel
from ..sim import simulate
from .raw import CLOSED_LOOP, INFERENCEX, OPEN_LOOP
from .runs import get_run, unrepresentable_reason
from .setup import cost_for, knobs_for, knobs_with
from .streams import build_requests

METRICS = ("ttft", "tpot", "e2e")
OVERLOAD_RATE_SHARE = 0.9  # overloaded: completions per second below this share of the offered rate ...
OVERLOAD_TTFT_GROWTH_S = 1.0  # ... or TTFT in the stage's last quarter this many seconds above its first quarter's
RUN_COLUMNS = ("set", "model", "hardware", "tp", "dtype", "status", "representable", "reason")


def _cost(run: pd.Series, cost) -> CostModel:
    """The CostModel for ``run``: ``cost_for(run)``, ``cost(run)``, or a CostModel of the run's model, GPU, TP."""
    if cost is None:
        return cost_for(run)
    if isinstance(cost, CostModel):
        if (cost.model.name, cost.hardware.name, cost.tp) != (run["model"], run["hardware"], int(run["tp"])):
            raise ValueError(f"cost is for {cost.model.name} on {cost.tp} x {cost.hardware.name}, run "
                             f"{run['run_id']!r} is {run['model']} on {run['tp']} x {run['hardware']}")
        return cost
    if callable(cost):
        built = cost(run)
        if not isinstance(built, CostModel):
            raise ValueError(f"cost(run) must return a batchlab.CostModel, got {type(built).__name__}")
        return built
    raise ValueError(f"cost must be None, a CostModel or a callable run -> CostModel, got {type(cost).__name__}")


def simulate_run(run, cost=None, seed=0, record_tokens=False, **knob_overrides):
    """Simulate the whole stream ``run`` belongs to (every stage of its experiment).

    Parameters
    ----------
    run : str or pandas.Series
        A run id of :func:`batchlab.validate.calibration_runs` or one of its rows.
    cost : None, CostModel or callable, optional
        None: :func:`cost_for`; a callable ``cost(run) -> CostModel``; or a CostModel of the run's model and GPU.
    seed : int or numpy.random.Generator
        Seeds the stream (:func:`build_requests`).
    record_tokens : bool, default False
        Keep every token's time and iteration (:func:`batchlab.simulate`); the metrics do not need them.
    **knob_overrides
        Passed to :func:`knobs_for` (e.g. ``enable_prefix_caching=False``). The KV pool, where not published,
        is sized for the cost model used (so ``kv_dtype="fp8"`` doubles it).

    Returns
    -------
    result : SimResult
    stages : numpy.ndarray
        Stage index of each request.
    """
    run = get_run(run)
    cost = _cost(run, cost)
    requests, stages = build_requests(run, seed, *client_timing(run, cost))
    return simulate(requests, cost=cost, record_tokens=record_tokens,
                    **knobs_with(run, cost, **knob_overrides)), stages


def client_timing(run: pd.Series, cost: CostModel) -> tuple[float, float]:
    """Closed loop: (a time by which the first wave has surely finished, the spread of the clients' phases),
    seconds, from the cost model. (0, 0) for open-loop runs and InferenceX rows (whose varied lengths spread
    the clients by themselves, :mod:`batchlab.validate.streams`).

    The spread is the least one request can take (alone: its prefill, then ``osl - 1`` decode steps of one
    sequence): spread wider than a request's shortest cycle, a client whose second request finished early would
    wait for the last phase to send its third, and the waves would line up again. The first wave prefills every
    prompt at the token budget first, then decodes at the run's concurrency; twice that is the margin.
    """
    if run["set"] != CLOSED_LOOP or run.get("client", "") == INFERENCEX:
        return 0.0, 0.0
    isl, osl, clients = int(run["isl"]), int(run["osl"]), int(run["concurrency"])
    least = cost.request_latency_s + cost.prefill_time(isl) + (osl - 1) * cost.decode_step_time(1, isl + osl / 2)
    loaded = (osl - 1) * cost.decode_step_time(clients, isl + osl / 2)
    budget = int(knobs_for(run)["max_num_batched_tokens"])
    burst = np.ceil(clients * isl / budget) * cost.prefill_time(min(budget, clients * isl))
    return float(2 * (burst + loaded + least)), float(least)


def overload_signs(per_request: pd.DataFrame, mask: np.ndarray, rate_req_s: float) -> dict:
    """Whether the simulated server kept up with one open-loop stage (the requests ``mask`` selects).

    Returns
    -------
    dict
        ``completion_rate_req_s`` (completed / (last finish - first send)), ``ttft_growth_s`` (mean TTFT of the
        stage's last quarter of requests minus its first quarter's) and ``overloaded``: some request rejected,
        completions below :data:`OVERLOAD_RATE_SHARE` of ``rate_req_s``, or TTFT growing by more than
        :data:`OVERLOAD_TTFT_GROWTH_S`.
    """
    rows = per_request[mask]
    done = ~rows["rejected"].to_numpy()
    span = np.nanmax(rows["finish_s"].to_numpy()) - rows["sent_s"].min() if done.any() else np.inf
    completion = done.sum() / span
    ttft = rows["ttft_s"].to_numpy()
    quarter = max(len(ttft) // 4, 1)
    growth = float(np.nanmean(ttft[-quarter:]) - np.nanmean(ttft[:quarter])) if done.any() else np.inf
    overloaded = (not done.all()) or completion < OVERLOAD_RATE_SHARE * rate_req_s or growth > OVERLOAD_TTFT_GROWTH_S
    return {"completion_rate_req_s": float(completion), "ttft_growth_s": growth, "overloaded": bool(overloaded)}


def _predicted(run: pd.Series, per_request: pd.DataFrame, mask: np.ndarray) -> dict:
    """Predicted means (ms) of one run's requests, by the metric definitions of this module."""
    done = mask & ~per_request["rejected"].to_numpy()
    ttft = float(per_request["ttft_s"].to_numpy()[done].mean() * 1e3)
    if run["set"] == OPEN_LOOP:
        e2e = float(per_request["e2el_s"].to_numpy()[done].mean() * 1e3)
        return {"ttft": ttft, "tpot": (e2e - ttft) / (int(run["output_len"]) - 1), "e2e": e2e}
    tpot = float(per_request["tpot_s"].to_numpy()[done].mean() * 1e3)
    return {"ttft": ttft, "tpot": tpot, "e2e": ttft + tpot * (int(run["osl"]) - 1)}


def _evaluate(run: pd.Series, result, stages: np.ndarray) -> dict:
    """Measured against predicted for ``run``, from the simulation of its whole stream."""
    per_request = result.requests
    stage = int(run["stage"]) if run["set"] == OPEN_LOOP else 0
    mask = stages == stage
    out = {"run_id": run["run_id"], **{c: run[c] for c in RUN_COLUMNS if c in run.index}}
    if "reason" not in run.index:
        out["reason"] = unrepresentable_reason(run)
        out["representable"] = out["reason"] == ""
    predicted = _predicted(run, per_request, mask)
    for metric in METRICS:
        out[f"measured_{metric}_ms"] = float(run[f"{metric}_ms"])
        out[f"predicted_{metric}_ms"] = predicted[metric]
    out["completed"] = int((mask & ~per_request["rejected"].to_numpy()).sum())
    out["prefix_cache_hit_rate"] = float(per_request["cached_tokens"][mask].sum()
                                         / per_request["prompt_tokens"][mask].sum())
    if run["set"] == OPEN_LOOP:
        out["offered_rate_req_s"] = float(run["rate_req_s"])
        out.update(overload_signs(per_request, mask, float(run["rate_req_s"])))
        later = per_request["sent_s"].to_numpy()[stages > stage]
        out["drained"] = bool(later.size == 0 or np.nanmax(per_request["finish_s"].to_numpy()[mask]) < later.min())
    else:
        out.update(offered_rate_req_s=np.nan, completion_rate_req_s=np.nan, ttft_growth_s=np.nan,
                   overloaded=False, drained=True)
    return out


def replay_run(run, cost=None, seed=0, **knob_overrides) -> dict:
    """One calibration run replayed: measured and predicted means, and whether the simulated server kept up (not
    :func:`batchlab.replay`, which reads a public trace).

    Parameters
    ----------
    run : str or pandas.Series
        A run id of :func:`batchlab.validate.calibration_runs` (ValueError if unknown) or one of its rows.
    cost : None, CostModel or callable, optional
        See :func:`simulate_run`.
    seed : int or numpy.random.Generator
    **knob_overrides
        Passed to :func:`knobs_for`.

    Returns
    -------
    dict
        ``run_id``, the run's ``set``, ``model``, ``hardware``, ``tp``, ``dtype``, ``status``,
        ``representable``, ``reason``; ``measured_<m>_ms`` and ``predicted_<m>_ms`` for m in ttft, tpot, e2e;
        ``completed``, ``prefix_cache_hit_rate``; ``offered_rate_req_s``, ``completion_rate_req_s``,
        ``ttft_growth_s``, ``overloaded`` (the simulated server's, see :func:`overload_signs`; False in the
        closed loop) and ``drained`` (the stage finished before the next began).
    """
    run = get_run(run)
    result, stages = simulate_run(run, cost, seed, **knob_overrides)
    return _evaluate(run, result, stages)
