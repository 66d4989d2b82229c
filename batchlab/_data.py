"""Where the project's own small data files live, a CSV reader for presets, and the one reader of the shipped
calibration."""
from __future__ import annotations

import csv
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def read_presets(filename: str) -> dict[str, dict[str, str]]:
    """Rows of ``data/<filename>`` keyed by their ``name`` column."""
    with open(DATA_DIR / filename, newline="") as fh:
        return {row["name"]: row for row in csv.DictReader(fh)}


CALIBRATION_FILE = "calibration.csv"  # written by python -m batchlab.calibrate (batchlab.calibrate.shipped)
# The per-operator stage's values of the fields the whole-server stage refits, kept as "<field>_kernels_only" rows.
KERNELS_ONLY = ("eta_compute_fp8", "eta_memory_fp8", "allreduce_latency_s")


def calibration_rows() -> dict[str, dict[str, str]]:
    """The rows of ``data/calibration.csv`` (name, value, unit, fitted_on) by name; empty if the file is absent (a
    fit not yet run). Read afresh on each call, so a refit that rewrites the file is seen by the next reader."""
    return read_presets(CALIBRATION_FILE) if (DATA_DIR / CALIBRATION_FILE).is_file() else {}


def read_calibration() -> dict[str, float]:
    """Every value of ``data/calibration.csv`` by name (:func:`calibration_rows`)."""
    return {name: float(row["value"]) for name, row in calibration_rows().items()}


def kernels_only() -> dict[str, float]:
    """The per-operator stage's FP8 efficiencies and all-reduce latency (the ``*_kernels_only`` rows), by the
    CostModel field they were fitted for; the whole-server stage refits the CostModel's own."""
    values = read_calibration()
    return {k: values[k + "_kernels_only"] for k in KERNELS_ONLY}
