"""Where the project's own small data files live, and a CSV reader for presets."""
from __future__ import annotations

import csv
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def read_presets(filename: str) -> dict[str, dict[str, str]]:
    """Rows of ``data/<filename>`` keyed by their ``name`` column."""
    with open(DATA_DIR / filename, newline="") as fh:
        return {row["name"]: row for row in csv.DictReader(fh)}
