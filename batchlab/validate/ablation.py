"""What each mechanism buys: the end-to-end errors with one mechanism switched off at a time (notebook 10).

Mechanisms: vLLM's prefix caching and async scheduling (knobs of ``simulate``), the serving terms of the cost
model (API server, request latency, CPU per step), the LM-head correction of DESIGN section 3 (without it every
token runs the LM head and the embedding table streams every step, as batchlab first charged them), and the
whole-server re-fit of FP8 GEMMs and all-reduce latency (without it the per-operator fit's values), and the
InferenceX client of the AIConfigurator rows exported from InferenceX (without it those rows are replayed as the
rows whose client was not recorded: max(8 x concurrency, 200) requests of exactly the labelled lengths, the
clients' phases spread, vLLM's default knobs; see :mod:`batchlab.validate.streams`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .._data import kernels_only
from ..cost import SERVING_FIELDS, CostModel
from .raw import INFERENCEX
from .setup import cost_for
from .tables import error_summary, replay_all

MECHANISMS = ("none", "prefix caching", "async scheduling", "serving terms", "LM-head correction", "FP8 and "
              "all-reduce re-fit", "InferenceX client")


def without_client(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with the InferenceX rows' client protocol forgotten: replayed as a row whose client was not
    recorded (fixed lengths, max(8 x concurrency, 200) requests, ``vllm serve``'s default knobs)."""
    out = runs.copy()
    mine = out["client"] == INFERENCEX
    out.loc[mine, "n_requests"] = np.maximum(8 * out.loc[mine, "concurrency"], 200)
    out.loc[mine, ["max_num_seqs", "max_num_batched_tokens"]] = pd.NA
    out.loc[mine, "range_ratio"] = np.nan
    out.loc[mine, "client"] = ""
    return out


def cost_without(run, mechanism: str) -> CostModel:
    """The run's CostModel (:func:`cost_for`) without one cost-model ``mechanism`` of :data:`MECHANISMS`."""
    cost = cost_for(run)
    if mechanism == "serving terms":
        return cost.replace(**dict.fromkeys(SERVING_FIELDS, 0.0))
    if mechanism == "LM-head correction":  # vocab 0: every parameter in the per-token GEMMs, no separate LM head
        return cost.replace(model=cost.model._replace(vocab=0))
    if mechanism == "FP8 and all-reduce re-fit":
        old = kernels_only()
        fields = {"allreduce_latency_s": old["allreduce_latency_s"]}
        if cost.dtype == "fp8":
            fields.update(eta_compute=old["eta_compute_fp8"], eta_memory=old["eta_memory_fp8"])
        return cost.replace(**fields)
    return cost


def ablations(runs=None, seed=0) -> pd.DataFrame:
    """Median and worst absolute error per metric over every usable calibration run, each mechanism off in turn.

    Returns
    -------
    pandas.DataFrame
        One row per mechanism switched off ("none": the full model) and metric: ``mechanism``, ``metric``,
        ``median_abs_error``, ``worst_abs_error``, ``median_error`` (signed).
    """
    if runs is None:
        from .runs import calibration_runs

        runs = calibration_runs()
    knobs = {"prefix caching": {"enable_prefix_caching": False}, "async scheduling": {"async_scheduling": False}}
    rows = []
    for mechanism in MECHANISMS:
        mine = without_client(runs) if mechanism == "InferenceX client" else runs
        table = replay_all(mine, cost=lambda run, m=mechanism: cost_without(run, m), seed=seed,
                           **knobs.get(mechanism, {}))
        summary = error_summary(table)
        summary = summary[summary["set"] == "all"].drop(columns=["set", "runs", "worst_run_id"])
        rows.append(summary.assign(mechanism=mechanism))
    out = pd.concat(rows, ignore_index=True)
    return out[["mechanism", "metric", "median_abs_error", "worst_abs_error", "median_error"]]
