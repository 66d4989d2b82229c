"""Every calibration run replayed, as one long table, and its error summary per metric and per set."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .replay import METRICS, _evaluate, simulate_run
from .runs import calibration_runs, get_run


def _as_table(runs) -> pd.DataFrame:
    """``runs`` as rows of the calibration table: None (all), a DataFrame of its rows, or run ids."""
    if runs is None:
        return calibration_runs()
    if isinstance(runs, pd.DataFrame):
        return runs
    if isinstance(runs, str):
        runs = [runs]
    table = calibration_runs()
    return pd.DataFrame([get_run(run, table) for run in runs])


def _long(wide: pd.DataFrame) -> pd.DataFrame:
    """One row per run and metric: measured_ms, predicted_ms, rel_error = predicted / measured - 1."""
    keep = [c for c in wide.columns if not c.startswith(("measured_", "predicted_"))]
    parts = []
    for metric in METRICS:
        part = wide[keep].copy()
        part.insert(1, "metric", metric)
        part["measured_ms"] = wide[f"measured_{metric}_ms"].to_numpy()
        part["predicted_ms"] = wide[f"predicted_{metric}_ms"].to_numpy()
        part["rel_error"] = part["predicted_ms"] / part["measured_ms"] - 1.0
        parts.append(part)
    order = {run_id: i for i, run_id in enumerate(wide["run_id"])}
    out = pd.concat(parts, ignore_index=True)
    out["_run"], out["_metric"] = out["run_id"].map(order), out["metric"].map(METRICS.index)
    return out.sort_values(["_run", "_metric"]).drop(columns=["_run", "_metric"]).reset_index(drop=True)


def replay_all(runs=None, cost=None, seed=0, **knob_overrides) -> pd.DataFrame:
    """Replay calibration runs, simulating each experiment's stream once for all its stages.

    Parameters
    ----------
    runs : None, DataFrame or sequence of str, optional
        Rows of :func:`batchlab.validate.calibration_runs` (default: all of them) or run ids.
    cost : None or callable, optional
        None: :func:`batchlab.validate.cost_for`; or ``cost(run) -> CostModel``.
    seed : int
        Seeds every stream (:func:`batchlab.validate.build_requests`).
    **knob_overrides
        Passed to :func:`batchlab.validate.knobs_for` for every run (e.g. ``enable_prefix_caching=False``).

    Returns
    -------
    pandas.DataFrame
        One row per run and metric (``ttft``, ``tpot``, ``e2e``), runs in table order: ``run_id``, ``metric``,
        the run's descriptors (see :func:`batchlab.validate.replay_run`), ``measured_ms``, ``predicted_ms`` and
        ``rel_error`` = predicted / measured - 1.
    """
    table = _as_table(runs)
    rows = []
    for _, group in table.groupby("experiment", sort=False):
        result, stages = simulate_run(group.iloc[0], cost, seed, **knob_overrides)
        rows += [_evaluate(run, result, stages) for _, run in group.iterrows()]
    return _long(pd.DataFrame(rows))


def error_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Median and worst absolute relative error per metric and per set, over representable runs that were ok.

    Parameters
    ----------
    table : pandas.DataFrame
        What :func:`replay_all` returns.

    Returns
    -------
    pandas.DataFrame
        One row per set (and ``all``) and metric: ``runs``, ``median_abs_error`` and ``worst_abs_error`` (of
        |predicted / measured - 1|), ``median_error`` (signed: below 0 predicts too little) and ``worst_run_id``.
    """
    used = table[table["representable"].astype(bool) & (table["status"] == "ok")]
    rows = []
    for name, part in [*used.groupby("set", sort=False), ("all", used)]:
        for metric in METRICS:
            rows.append(_errors(part[part["metric"] == metric], name, metric))
    return pd.DataFrame(rows)


def _errors(part: pd.DataFrame, name: str, metric: str) -> dict:
    err = part["rel_error"].to_numpy(dtype=np.float64)
    worst = int(np.argmax(np.abs(err))) if err.size else None
    return {"set": name, "metric": metric, "runs": int(err.size),
            "median_abs_error": float(np.median(np.abs(err))) if err.size else np.nan,
            "worst_abs_error": float(np.abs(err[worst])) if err.size else np.nan,
            "median_error": float(np.median(err)) if err.size else np.nan,
            "worst_run_id": part["run_id"].iloc[worst] if err.size else ""}
