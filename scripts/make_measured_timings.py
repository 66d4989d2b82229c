"""Write data/measured_timings.csv.gz: the measured H100 timings the calibration uses, one tidy table.

Usage (from the repository root)::

    .venv/bin/python scripts/make_measured_timings.py [--measured-dir DIR] [--out data/measured_timings.csv.gz]

The raw public files are read from ``--measured-dir``, else ``$BATCHLAB_MEASURED_DIR``, else
``../shared/data/measured`` beside the repository (``batchlab.calibrate.measured_dir``), by the same reader the
calibration uses on them (``batchlab.calibrate.read_raw``). One row per measured number: its source
(repository @ commit), set, operator, the descriptors that rebuild the case, and the measured value exactly as
the source has it, in the source's unit. Columns, units and sources: data/README.md. The file is gzip-compressed
with a zero header time, so the same table gives the same bytes.
"""
from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batchlab import calibrate  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured-dir", type=Path, default=None,
                    help=f"raw measured timings (default: ${calibrate.MEASURED_ENV}, else ../shared/data/measured)")
    ap.add_argument("--out", type=Path, default=calibrate.TIMINGS_FILE)
    args = ap.parse_args(argv)
    try:
        root = calibrate.measured_dir(args.measured_dir)
    except FileNotFoundError as err:
        sys.exit(str(err))
    table = calibrate.read_raw(root)
    path = calibrate.write_timings(table, args.out)
    with gzip.open(path, "rb") as fh:
        size = len(fh.read())
    print(f"wrote {path} from {root}: {len(table)} rows, {path.stat().st_size} bytes ({size} uncompressed)")
    print(table.groupby(["set", "source", "unit"], sort=False).size().rename("rows").to_string())


if __name__ == "__main__":
    main()
