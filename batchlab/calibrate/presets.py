"""The per-operator stage's values that are not CostModel fields, read back from ``data/calibration.csv``."""
from __future__ import annotations

from .._data import read_presets
from .predict import KernelFloors, OwnKernels

KERNELS_ONLY = ("eta_compute_fp8", "eta_memory_fp8", "allreduce_latency_s")  # refitted by the whole-server stage


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
    return OwnKernels(*(float(values[k + "_kernels_only" if k in KERNELS_ONLY else k]["value"])
                        for k in OwnKernels._fields))


def shipped_kernels_only() -> dict:
    """The per-operator stage's FP8 efficiencies and all-reduce latency (``*_kernels_only`` rows), by the CostModel
    field they were fitted for; the whole-server stage refits the CostModel's own."""
    values = read_presets("calibration.csv")
    return {k: float(values[k + "_kernels_only"]["value"]) for k in KERNELS_ONLY}
