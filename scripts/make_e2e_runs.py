"""Write data/e2e_runs.csv: the measured end-to-end vLLM runs, one row per comparable unit.

Usage (from the repository root)::

    .venv/bin/python scripts/make_e2e_runs.py [--e2e-dir DIR] [--out data/e2e_runs.csv]

The raw files are read from ``--e2e-dir``, else ``$BATCHLAB_E2E_DIR``, else ``../shared/data/e2e`` beside the
repository, by the reader ``batchlab.validate.calibration_runs(root)`` uses on them
(``batchlab.validate.read_raw``): one row per load stage of each inference-perf run (inference-sim/training,
no licence: only re-typed settings and measured numbers, each row with its source) and one per AIConfigurator
row (Apache-2.0). Times in milliseconds. Columns, units and sources: data/README.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batchlab.validate import raw  # noqa: E402


def build_table(e2e_dir=None):
    """The table the script writes, from the raw files in ``e2e_dir`` (default: see the module docstring)."""
    return raw.read_raw(raw.e2e_dir(e2e_dir))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--e2e-dir", type=Path, default=None,
                    help=f"raw end-to-end runs (default: ${raw.E2E_ENV}, else ../shared/data/e2e)")
    ap.add_argument("--out", type=Path, default=raw.RUNS_FILE)
    args = ap.parse_args(argv)
    try:
        table = build_table(args.e2e_dir)
    except FileNotFoundError as err:
        sys.exit(str(err))
    path = raw.write_runs(table, args.out)
    print(f"wrote {path}: {len(table)} runs, {path.stat().st_size} bytes")
    print(table.groupby(["set", "status", "model", "hardware"], sort=False).size().rename("runs").to_string())


if __name__ == "__main__":
    main()
