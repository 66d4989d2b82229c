"""The shipped calibration: ``data/calibration.csv``, ``data/calibration_errors.csv`` and
``data/calibration_e2e_errors.csv``, written and read back.

``python -m batchlab.calibrate`` (:func:`main`) refits the per-operator stage and rewrites the files, keeping the
whole-server rows; with ``--e2e`` it also refits the whole-server stage (:mod:`.serving`, minutes).
:class:`batchlab.CostModel` takes its defaults from ``calibration.csv``; :func:`shipped_floors` and
:func:`shipped_own_kernels` read the values that are not CostModel fields back from it. The per-operator
stage's FP8 efficiencies and all-reduce latency are kept under ``*_kernels_only`` names (the per-operator error
table uses them); the CostModel's own come from the whole-server stage, which refits them.
"""
from __future__ import annotations

import argparse
import sys

import pandas as pd

from .._data import CALIBRATION_FILE, DATA_DIR, calibration_rows
from ..validate import error_summary
from .fit import Calibration, fit

from .readers import MEASURED_ENV, TIMINGS_FILE, measured_dir
from .serving import FIXED, SERVING_TERMS, UNITS, ServingFit, fit_serving

E2E_ERRORS_FILE = "calibration_e2e_errors.csv"
E2E_NOTE = ("whole-server fit on every end-to-end calibration run (data/e2e_runs.csv, TTFT, TPOT and E2E) with the "
            "FP8 GEMM set; see batchlab.calibrate.serving and data/calibration_e2e_errors.csv")
E2E_HELD_NOTE = ("held in the whole-server fit, not fitted: the end-to-end runs do not pin it (the previous fit's "
                 "value; see batchlab.calibrate.serving.FIXED)")

FIT_NOTES = {  # the fitted_on column of data/calibration.csv
    "eta_compute": "vidur_h100 Llama-2-7B/70B per-layer BF16 GEMMs at TP 1-2, >= 1024 tokens",
    "eta_memory": (
        "same vidur GEMMs at <= 64 tokens (weight streaming) + h100_kernels decode attention at TP 1 (KV reads)"),
    "eta_attn": "h100_kernels prefill attention, geometries 32-8-128, 64-8-128, 40-40-128",
    "eta_elementwise": "vidur_h100 Llama-2-7B/70B per-layer norms, RoPE, SiLU-and-mul and add at TP 1-2",
    "overhead_s": (
        "derived: 32 layers (Llama-3-8B) x (4 x kernel_floor_gemm_s + kernel_floor_decode_attn_s + 5 x "
        "kernel_floor_elementwise_s)"),
    "allreduce_latency_s_kernels_only": (
        "vidur_h100 network/h100_dgx all_reduce (NCCL), 2 and 8 GPUs, bandwidth term at the preset's 450 GB/s"),
    "eta_compute_fp8_kernels_only": "h100_kernels FP8 GEMMs with n=6144, m >= 4096",
    "eta_memory_fp8_kernels_only": "h100_kernels FP8 GEMMs with n=6144, m <= 64",
    "eager_eta_attn": (
        "llmservingsim_h100 Llama-3.1-8B eager attention, <= 1536 tokens (eager PyTorch only; not a CostModel "
        "default)"),
    "eager_eta_elementwise": (
        "llmservingsim_h100 Llama-3.1-8B eager norms, RoPE and SiLU, <= 1536 tokens (eager PyTorch only; not a "
        "CostModel default)"),
    "kernel_floor_gemm_s": "vidur_h100 per-layer GEMMs, fitted with eta_memory (per kernel; not a CostModel field)",
    "kernel_floor_gemm_fp8_s": "h100_kernels FP8 GEMMs (per kernel; not a CostModel field)",
    "kernel_floor_decode_attn_s": "h100_kernels decode attention at TP 1 (per kernel; not a CostModel field)",
    "kernel_floor_prefill_attn_s": "h100_kernels prefill attention (per kernel; not a CostModel field)",
    "kernel_floor_elementwise_s": (
        "vidur_h100 per-layer norms, RoPE, SiLU-and-mul and add (per kernel; not a CostModel field)"),
    "kernel_floor_eager_attn_s": "llmservingsim_h100 eager attention (per kernel; not a CostModel field)",
    "kernel_floor_eager_elementwise_s": (
        "llmservingsim_h100 eager norms, RoPE and SiLU (per kernel; not a CostModel field)"),
}


def parameter_table(cal: Calibration) -> pd.DataFrame:
    """One row per fitted value: name, value, unit, fitted_on (the rows of ``data/calibration.csv``)."""
    values = {
        "eta_compute": (cal.eta_compute, "fraction of peak FLOP/s"),
        "eta_memory": (cal.eta_memory, "fraction of HBM bandwidth"),
        "eta_attn": (cal.eta_attn, "fraction of peak FLOP/s"),
        "eta_elementwise": (cal.eta_elementwise, "fraction of HBM bandwidth"),
        "overhead_s": (cal.overhead_s, "s per step"),
        "allreduce_latency_s_kernels_only": (cal.allreduce_latency_s, "s per all-reduce"),
        "eta_compute_fp8_kernels_only": (cal.own.eta_compute_fp8, "fraction of FP8 peak FLOP/s"),
        "eta_memory_fp8_kernels_only": (cal.own.eta_memory_fp8, "fraction of HBM bandwidth"),
        "eager_eta_attn": (cal.own.eager_eta_attn, "fraction of peak FLOP/s"),
        "eager_eta_elementwise": (cal.own.eager_eta_elementwise, "fraction of HBM bandwidth"),
        **{f"kernel_floor_{k}": (v, "s per kernel") for k, v in cal.floors._asdict().items()},
    }
    return pd.DataFrame([{"name": k, "value": float(f"{v:.6g}"), "unit": u, "fitted_on": FIT_NOTES[k]}
                         for k, (v, u) in values.items()])


def serving_table(terms: dict) -> pd.DataFrame:
    """The whole-server stage's rows of ``data/calibration.csv``."""
    return pd.DataFrame([{"name": k, "value": float(f"{terms[k]:.6g}"), "unit": UNITS[k],
                          "fitted_on": E2E_HELD_NOTE if k in FIXED else E2E_NOTE} for k in SERVING_TERMS])


def shipped_serving_terms() -> dict:
    """The whole-server stage's terms in ``data/calibration.csv`` (empty if it has not been fitted yet)."""
    values = calibration_rows()
    if not all(k in values and values[k]["fitted_on"] in (E2E_NOTE, E2E_HELD_NOTE) for k in SERVING_TERMS):
        return {}
    return {k: float(values[k]["value"]) for k in SERVING_TERMS}


def main(argv=None) -> int:
    """Refit against the measured sets and write ``data/calibration.csv`` and ``data/calibration_errors.csv``."""
    ap = argparse.ArgumentParser(prog="python -m batchlab.calibrate", description=main.__doc__)
    ap.add_argument("root", nargs="?", help="folder of the raw measured timings to fit on (default: the compact "
                                            "table data/measured_timings.csv.gz)")
    ap.add_argument("--raw", action="store_true", help=f"fit on the raw files in ${MEASURED_ENV}, else "
                                                       "../shared/data/measured beside the repository")
    ap.add_argument("--e2e", action="store_true", help="also refit the whole-server stage on the end-to-end runs "
                                                       "(serving terms, FP8, all-reduce; minutes)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        root = measured_dir(args.root) if args.raw or args.root else None
    except FileNotFoundError as err:
        ap.exit(2, f"{ap.prog}: {err}\n")
    kept = shipped_serving_terms()  # the whole-server rows, kept unless refitted
    cal = fit(root)
    params = parameter_table(cal)
    if args.e2e:
        params.to_csv(DATA_DIR / CALIBRATION_FILE, index=False)  # the whole-server stage starts from these
        serving = fit_serving(root=root)
        kept = serving.terms
        write_e2e_errors(serving)
        print(f"whole-server fit: objective {serving.objective:.4f} after {serving.evaluations} evaluations")
    if kept:
        params = pd.concat([params, serving_table(kept)], ignore_index=True)
    params.to_csv(DATA_DIR / CALIBRATION_FILE, index=False)
    cal.errors.round(4).to_csv(DATA_DIR / "calibration_errors.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(params[["name", "value", "unit"]].to_string(index=False, formatters={"value": "{:.6g}".format}))
        print()
        print(cal.errors.round(3).to_string(index=False))
    print(f"\nfitted on {root or TIMINGS_FILE}")
    print(f"wrote {DATA_DIR / CALIBRATION_FILE} and {DATA_DIR / 'calibration_errors.csv'}")
    return 0


def write_e2e_errors(serving: ServingFit) -> None:
    """``data/calibration_e2e_errors.csv``: the end-to-end error summary at the whole-server fit."""
    error_summary(serving.table).round(4).to_csv(DATA_DIR / E2E_ERRORS_FILE, index=False)
