"""The whole-server fit: serving terms, FP8 efficiencies and all-reduce latency on the end-to-end runs.

One global fit (issue 11) of the terms a per-operator timing cannot see, over every end-to-end calibration run
batchlab can represent (:func:`batchlab.validate.calibration_runs`, the overloaded ones left out) together with
the per-operator sets the re-fitted terms also govern:

- ``request_latency_s``, ``frontend_s_per_token``, ``cpu_step_s``, ``cpu_seq_s`` and ``cpu_hidden_fraction``:
  the serving terms of :class:`batchlab.CostModel` (DESIGN section 3);
- ``eta_compute_fp8`` and ``eta_memory_fp8``: FP8 GEMMs, fitted before on small H100 GEMMs only, now also on
  FP8 whole-server runs (the ``gemm_kernels_fp8`` set stays in the objective);
- ``allreduce_latency_s``: fitted before on NCCL's all-reduce microbenchmark, now on TP 2-8 servers only. vLLM
  does not run NCCL for the small activations of a step: its custom all-reduce (one-shot or two-shot over
  NVLink peer memory, messages up to 8 MB) has a fraction of NCCL's latency, so the NCCL set is the kernel
  fit's business (``allreduce_latency_s_kernels_only``) and not in this objective.

The objective is the mean over the two end-to-end sets of each set's mean soft-L1 loss of log(predicted /
measured) over its runs' TTFT, TPOT and E2E, so neither set, and no run, can pull the fit alone; plus a steep
penalty if the FP8 GEMM set's median error (its kernel floors held) leaves the 15 % target, so the re-fitted FP8
efficiencies hold there too. The fit uses every open-loop run and every third closed-loop run
(:data:`CLOSED_LOOP_EVERY`, in table order; the closed-loop sweeps are dense grids); the error tables are over
all runs. Nelder-Mead from fixed starting values, a fixed number of evaluations: deterministic. The BF16
efficiencies and kernel floors of the per-operator fit are held fixed.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from ..cost import CostModel
from ..hardware import get_hardware
from ..models import get_model
from ..validate import calibration_runs, cost_for, replay_all
from .predict import load_gemm_kernels
from .readback import shipped_floors, shipped_own_kernels

SERVING_TERMS = ("request_latency_s", "frontend_s_per_token", "cpu_step_s", "cpu_seq_s", "cpu_hidden_fraction",
                 "eta_compute_fp8", "eta_memory_fp8", "allreduce_latency_s")
# The API server's tokenising cost per prompt token is not pinned by these runs: the medians move by under a
# point between 0 and 1 us per token, and the fit drifts to 0.017 us, faster than any tokenizer runs (tens of
# millions of tokens a second on one thread). It is held at 0.47 us, what the previous whole-server fit of the
# same runs found (about 2 M tokens/s, a fast tokenizer on one thread), and the rest is fitted around it.
FIXED = {"frontend_s_per_token": 4.71934e-07}
FITTED_TERMS = tuple(k for k in SERVING_TERMS if k not in FIXED)
UNITS = {"request_latency_s": "s per request", "frontend_s_per_token": "s per prompt token",
         "cpu_step_s": "s per step", "cpu_seq_s": "s per scheduled sequence per step",
         "cpu_hidden_fraction": "fraction of the step's CPU work", "eta_compute_fp8": "fraction of FP8 peak FLOP/s",
         "eta_memory_fp8": "fraction of HBM bandwidth", "allreduce_latency_s": "s per all-reduce"}
START = {"request_latency_s": 0.01, "frontend_s_per_token": 4e-6, "cpu_step_s": 1e-3, "cpu_seq_s": 2e-5,
         "cpu_hidden_fraction": 0.4, "eta_compute_fp8": 0.6, "eta_memory_fp8": 0.85, "allreduce_latency_s": 2e-5}
_FRACTIONS = ("cpu_hidden_fraction", "eta_compute_fp8", "eta_memory_fp8")
MAX_EVALUATIONS = 300
CLOSED_LOOP_EVERY = 3
KERNEL_TARGET = 0.15  # median relative error the FP8 GEMM set must keep
KERNEL_PENALTY = 100.0  # objective per unit of median error above the target
SOFT_L1_SCALE = 0.1  # log-ratio where the loss turns from quadratic to linear (about 10 %)


class ServingFit(NamedTuple):
    """What :func:`fit_serving` found: the terms, the objective, and every run's errors at the fit."""

    terms: dict  # name -> value, SI units (:data:`UNITS`)
    objective: float  # mean over sets of the mean soft-L1 loss of log(predicted / measured)
    table: pd.DataFrame  # batchlab.validate.replay_all at the fit, every calibration run
    evaluations: int  # objective evaluations spent


def _to_x(terms: dict) -> np.ndarray:
    return np.array([np.log(terms[k] / (1 - terms[k])) if k in _FRACTIONS else np.log(terms[k])
                     for k in FITTED_TERMS])


def _from_x(x: np.ndarray) -> dict:
    return {**FIXED, **{k: float(1 / (1 + np.exp(-v)) if k in _FRACTIONS else np.exp(v))
                        for k, v in zip(FITTED_TERMS, x)}}


def cost_with(run: pd.Series, terms: dict, base=None) -> CostModel:
    """The run's CostModel (:func:`batchlab.validate.cost_for`) with ``terms`` applied (FP8 ones to FP8 runs)."""
    fields = {k: terms[k] for k in SERVING_TERMS if k not in ("eta_compute_fp8", "eta_memory_fp8")}
    if run["dtype"] == "fp8":
        fields.update(eta_compute=terms["eta_compute_fp8"], eta_memory=terms["eta_memory_fp8"])
    return cost_for(run, **fields)


def _soft_l1(log_ratio: np.ndarray) -> float:
    z = (np.asarray(log_ratio) / SOFT_L1_SCALE) ** 2
    return float(np.mean(2 * (np.sqrt(1 + z) - 1)))


def _e2e_losses(runs: pd.DataFrame, terms: dict) -> tuple[list[float], pd.DataFrame]:
    table = replay_all(runs, cost=lambda run: cost_with(run, terms))
    fit = table[table["representable"] & (table["status"] == "ok")]
    losses = [_soft_l1(np.log(g["predicted_ms"] / g["measured_ms"])) for _, g in fit.groupby("set")]
    return losses, table


def kernel_error(terms: dict, root=None) -> float:
    """Median relative error of the per-operator FP8 GEMM set (every split) under ``terms``."""
    cost = CostModel(get_hardware("h100-sxm"), get_model("llama-3-8b"))
    own = shipped_own_kernels()._replace(eta_compute_fp8=terms["eta_compute_fp8"],
                                         eta_memory_fp8=terms["eta_memory_fp8"])
    gemm = load_gemm_kernels(cost, root, shipped_floors(), own)
    gemm = gemm[gemm["set"] == "gemm_kernels_fp8"]
    return float((gemm["predicted_s"] / gemm["measured_s"] - 1).abs().median())


def objective(terms: dict, runs: pd.DataFrame | None = None, root=None) -> float:
    """Mean over the two end-to-end sets of each set's mean soft-L1 loss, plus the FP8 GEMM set's penalty."""
    runs = fit_runs() if runs is None else runs
    losses, _ = _e2e_losses(runs, terms)
    return float(np.mean(losses) + KERNEL_PENALTY * max(0.0, kernel_error(terms, root) - KERNEL_TARGET))


def fit_runs() -> pd.DataFrame:
    """The runs the whole-server fit uses: usable (representable, not overloaded); every open-loop run and every
    :data:`CLOSED_LOOP_EVERY`-th closed-loop run."""
    runs = calibration_runs()
    runs = runs[runs["representable"].astype(bool) & (runs["status"] == "ok")]
    closed = runs[runs["set"] == "aiconfigurator"].iloc[::CLOSED_LOOP_EVERY]
    return pd.concat([runs[runs["set"] != "aiconfigurator"], closed])


def fit_serving(runs: pd.DataFrame | None = None, root=None, max_evaluations: int = MAX_EVALUATIONS,
                start: dict | None = None) -> ServingFit:
    """Fit :data:`SERVING_TERMS` globally (see the module notes). Deterministic; about 15 minutes here.

    Returns the terms, the objective, the evaluations spent and :func:`batchlab.validate.replay_all` of every
    calibration run at the fit."""
    runs = fit_runs() if runs is None else runs
    start = dict(START if start is None else start)
    count = 0

    def f(x):
        nonlocal count
        count += 1
        return objective(_from_x(x), runs, root)

    best = minimize(f, _to_x(start), method="Nelder-Mead",
                    options={"maxfev": max_evaluations, "xatol": 1e-3, "fatol": 1e-5, "initial_simplex": None})
    terms = {k: float(f"{v:.6g}") for k, v in _from_x(best.x).items()}
    _, table = _e2e_losses(calibration_runs(), terms)
    return ServingFit(terms, objective(terms, runs, root), table, count)
