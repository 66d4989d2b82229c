"""The shipped calibration read back: the per-operator stage's values that are not CostModel fields, from
``data/calibration.csv`` (which :mod:`.shipped` writes and :func:`batchlab._data.read_calibration` reads)."""
from __future__ import annotations

from .._data import KERNELS_ONLY, kernels_only, read_calibration
from .predict import KernelFloors, OwnKernels


def shipped_floors() -> KernelFloors:
    """The per-kernel floors of ``data/calibration.csv`` (seconds).

    They are not CostModel fields, so the errors of the per-operator sets after calibration need them
    alongside the CostModel's defaults.
    """
    values = read_calibration()
    return KernelFloors(*(values[f"kernel_floor_{k}"] for k in KernelFloors._fields))


def shipped_own_kernels() -> OwnKernels:
    """FP8's and eager PyTorch's efficiencies from ``data/calibration.csv``."""
    values = read_calibration()
    return OwnKernels(*(values[k + "_kernels_only" if k in KERNELS_ONLY else k] for k in OwnKernels._fields))


shipped_kernels_only = kernels_only  # the name calibrate has always exported
