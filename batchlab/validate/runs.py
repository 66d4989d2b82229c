"""The calibration runs as a DataFrame, with which of them batchlab can replay and why not.

Every run stays in the table. A run is *representable* when batchlab can replay it as measured: a dense model
and a GPU it knows, everything on the GPU, and a server that kept up. An overloaded run is kept with reason
``overloaded``: it checks that the simulated server is overloaded too, not latencies (the measured means are
over the requests the client did not give up on). MoE models and CPU offload would be unrepresentable; none
are in these files (:data:`NOT_IN_DATA` names what the shared data left out).
"""
from __future__ import annotations

from functools import lru_cache

import pandas as pd

from ..hardware import hardware_names
from ..models import model_names
from .raw import e2e_dir, read_raw, read_runs

NOT_IN_DATA = (
    "inference-sim/training's Mixtral-8x7B runs: MoE (batchlab's cost model is dense), left out of "
    "../shared/data/e2e, so not in this table",
    "one dense inference-sim/training run and further rows of both sources: the held-out set, not in this table",
)
MOE_MARKERS = ("mixtral", "moe", "-a3b", "-a22b", "deepseek-v3", "deepseek-r1", "gpt-oss")  # in a Hugging Face id
CPU_OFFLOAD_COLUMNS = ("cpu_offload_gb", "kv_offloading_size")  # a positive value: weights or KV held on the CPU


def unrepresentable_reason(run) -> str:
    """Why batchlab cannot replay ``run`` as measured ("" when it can).

    Parameters
    ----------
    run : pandas.Series or dict
        One row of the calibration table.

    Returns
    -------
    str
        "" (representable), ``overloaded``, or a sentence naming what batchlab does not model (MoE, CPU offload,
        a model or GPU it has no preset for).
    """
    model_id = str(run.get("model_id", "")).lower()
    if any(marker in model_id for marker in MOE_MARKERS):
        return f"MoE model ({run['model_id']}): batchlab's cost model is dense"
    for col in CPU_OFFLOAD_COLUMNS:
        value = run.get(col)
        if value is not None and not pd.isna(value) and float(value) > 0:
            return f"CPU offload ({col}={value}): batchlab keeps weights and KV on the GPU"
    if run.get("model", "") not in model_names():
        return f"model {run.get('model_id', '')!r} has no batchlab preset"
    if run.get("hardware", "") not in hardware_names():
        return "GPU has no batchlab preset"
    if run.get("status") == "overloaded":
        return "overloaded"
    return ""


@lru_cache(maxsize=4)
def _table(key: str) -> pd.DataFrame:
    table = read_runs() if key == "" else read_raw(key)
    reasons = [unrepresentable_reason(row) for _, row in table.iterrows()]
    table["representable"] = pd.array([r == "" for r in reasons], dtype="boolean")
    table["reason"] = pd.array(reasons, dtype="str")
    return table


def calibration_runs(root=None) -> pd.DataFrame:
    """Every end-to-end calibration run: one row per inference-perf stage and per AIConfigurator row.

    Parameters
    ----------
    root : path-like, optional
        None reads the committed ``data/e2e_runs.csv``; a folder rebuilds the table from the raw files there
        (``../shared/data/e2e``), with the code ``scripts/make_e2e_runs.py`` uses. Both give the same frame.

    Returns
    -------
    pandas.DataFrame
        The columns of ``data/e2e_runs.csv`` (see ``data/README.md``; times in ms) plus ``representable``
        (bool) and ``reason`` ("" when representable, ``overloaded``, or what batchlab does not model).
    """
    return _table("" if root is None else str(e2e_dir(root))).copy()


def get_run(run, runs: pd.DataFrame | None = None) -> pd.Series:
    """One run as a row: ``run`` is a run id (looked up in ``runs``, default :func:`calibration_runs`) or a row.

    Raises
    ------
    ValueError
        An unknown run id, naming a few known ones.
    """
    if isinstance(run, pd.Series):
        return run
    if isinstance(run, dict):
        return pd.Series(run)
    table = calibration_runs() if runs is None else runs
    if not isinstance(run, str):
        raise ValueError(f"run must be a run id (str) or a row of calibration_runs(), got {type(run).__name__}")
    match = table[table["run_id"] == run]
    if match.empty:
        known = ", ".join(table["run_id"].head(3))
        raise ValueError(f"unknown run id {run!r}: see calibration_runs()['run_id'] ({len(table)} runs, e.g. {known})")
    return match.iloc[0]
