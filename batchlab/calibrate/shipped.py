"""The shipped calibration: ``data/calibration.csv`` and ``data/calibration_errors.csv``, written and read back.

``python -m batchlab.calibrate`` (:func:`main`) refits and rewrites both files; :class:`batchlab.CostModel`
takes its defaults from the first, and :func:`shipped_floors` and :func:`shipped_own_kernels` read the values
that are not CostModel fields back from it.
"""
from __future__ import annotations

import argparse
import sys

import pandas as pd

from .._data import DATA_DIR, read_presets
from .fit import Calibration, fit
from .predict import KernelFloors, OwnKernels
from .readers import MEASURED_ENV, TIMINGS_FILE, measured_dir

FIT_NOTES = {  # the fitted_on column of data/calibration.csv
    "eta_compute": "vidur_h100 Llama-2-7B/70B per-layer BF16 GEMMs at TP 1-2, >= 1024 tokens",
    "eta_memory": (
        "same vidur GEMMs at <= 64 tokens (weight streaming) + h100_kernels decode attention at TP 1 (KV reads)"),
    "eta_attn": "h100_kernels prefill attention, geometries 32-8-128, 64-8-128, 40-40-128",
    "eta_elementwise": "vidur_h100 Llama-2-7B/70B per-layer norms, RoPE, SiLU-and-mul and add at TP 1-2",
    "overhead_s": (
        "derived: 32 layers (Llama-3-8B) x (4 x kernel_floor_gemm_s + kernel_floor_decode_attn_s + 5 x "
        "kernel_floor_elementwise_s)"),
    "allreduce_latency_s": (
        "vidur_h100 network/h100_dgx all_reduce, 2 and 8 GPUs, bandwidth term at the preset's 450 GB/s"),
    "eta_compute_fp8": "h100_kernels FP8 GEMMs with n=6144, m >= 4096 (the CostModel default when dtype='fp8')",
    "eta_memory_fp8": "h100_kernels FP8 GEMMs with n=6144, m <= 64 (the CostModel default when dtype='fp8')",
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
        "allreduce_latency_s": (cal.allreduce_latency_s, "s per all-reduce"),
        "eta_compute_fp8": (cal.own.eta_compute_fp8, "fraction of FP8 peak FLOP/s"),
        "eta_memory_fp8": (cal.own.eta_memory_fp8, "fraction of HBM bandwidth"),
        "eager_eta_attn": (cal.own.eager_eta_attn, "fraction of peak FLOP/s"),
        "eager_eta_elementwise": (cal.own.eager_eta_elementwise, "fraction of HBM bandwidth"),
        **{f"kernel_floor_{k}": (v, "s per kernel") for k, v in cal.floors._asdict().items()},
    }
    return pd.DataFrame([{"name": k, "value": float(f"{v:.6g}"), "unit": u, "fitted_on": FIT_NOTES[k]}
                         for k, (v, u) in values.items()])


def shipped_floors() -> KernelFloors:
    """The per-kernel floors of ``data/calibration.csv`` (seconds).

    They are not CostModel fields, so the errors of the per-operator sets after calibration need them
    alongside the CostModel's defaults.
    """
    values = read_presets("calibration.csv")
    return KernelFloors(*(float(values[f"kernel_floor_{k}"]["value"]) for k in KernelFloors._fields))


def shipped_own_kernels() -> OwnKernels:
    """FP8's and eager PyTorch's efficiencies from ``data/calibration.csv``."""
    values = read_presets("calibration.csv")
    return OwnKernels(*(float(values[k]["value"]) for k in OwnKernels._fields))


def main(argv=None) -> int:
    """Refit against the measured sets and write ``data/calibration.csv`` and ``data/calibration_errors.csv``."""
    ap = argparse.ArgumentParser(prog="python -m batchlab.calibrate", description=main.__doc__)
    ap.add_argument("root", nargs="?", help="folder of the raw measured timings to fit on (default: the compact "
                                            "table data/measured_timings.csv.gz)")
    ap.add_argument("--raw", action="store_true", help=f"fit on the raw files in ${MEASURED_ENV}, else "
                                                       "../shared/data/measured beside the repository")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        root = measured_dir(args.root) if args.raw or args.root else None
    except FileNotFoundError as err:
        ap.exit(2, f"{ap.prog}: {err}\n")
    cal = fit(root)
    params = parameter_table(cal)
    params.to_csv(DATA_DIR / "calibration.csv", index=False)
    cal.errors.round(4).to_csv(DATA_DIR / "calibration_errors.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(params[["name", "value", "unit"]].to_string(index=False, formatters={"value": "{:.6g}".format}))
        print()
        print(cal.errors.round(3).to_string(index=False))
    print(f"\nfitted on {root or TIMINGS_FILE}")
    print(f"wrote {DATA_DIR / 'calibration.csv'} and {DATA_DIR / 'calibration_errors.csv'}")
    return 0
