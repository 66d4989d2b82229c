"""Write data/mooncake_conversation_prefix.csv.gz: Mooncake's conversation trace with its prefix ids, compacted.

Usage (from the repository root)::

    .venv/bin/python scripts/make_mooncake_prefix.py [--data-dir DIR] [--out data/mooncake_conversation_prefix.csv.gz]

The trace is read from ``--data-dir``, else ``$BATCHLAB_DATA_DIR``, else ``../shared/data/traces``, through
``batchlab.replay`` (which checks its SHA-256 against the public original's). One row per request, in arrival
order (layout in data/README.md): ``arrival_ms``, ``prompt_tokens``, ``output_tokens`` and ``hash_id_runs``, the
request's ``hash_ids`` written as runs of consecutive integers (``0 14-27``). Nothing is dropped: the book's
chapter 10 replays the whole trace offline from this file.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batchlab import datasets  # noqa: E402
from batchlab.chapters import prefix_caching  # noqa: E402


def build_table(data_dir):
    """The table, from the raw trace in ``data_dir`` (read and checksummed from there, never downloaded)."""
    saved = os.environ.get(datasets.ENV_VAR)
    os.environ[datasets.ENV_VAR] = str(data_dir)
    try:
        reqs = datasets.replay("mooncake-conversation")
    finally:
        if saved is None:
            del os.environ[datasets.ENV_VAR]
        else:
            os.environ[datasets.ENV_VAR] = saved
    return prefix_caching.trace_table(reqs)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path,
                    default=Path(os.environ.get(datasets.ENV_VAR) or ROOT.parent / "shared" / "data" / "traces"))
    ap.add_argument("--out", type=Path, default=ROOT / "data" / prefix_caching.MOONCAKE_FILE)
    args = ap.parse_args(argv)
    if not args.data_dir.is_dir():
        sys.exit(f"no traces at {args.data_dir}: pass --data-dir or set {datasets.ENV_VAR}")
    table = build_table(args.data_dir)
    prefix_caching.write_trace_table(table, args.out)
    print(f"wrote {args.out} ({len(table)} requests, {args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
