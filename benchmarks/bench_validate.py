"""Replay every end-to-end calibration run once (``batchlab.validate.replay_all``) and time it.

Issue 11 asks for all calibration runs in under a minute. Prints the machine's load (a busy machine is slower),
the wall time, how many runs and simulated requests it took, whether each overloaded run is recognised as
overloaded, and the error summary (median and worst |predicted / measured - 1| per metric and per set, over the
representable runs that were ok). Reads only the committed ``data/e2e_runs.csv``.
Run: ``python benchmarks/bench_validate.py``.
"""
from __future__ import annotations

import os
import time

import pandas as pd

from batchlab import validate

LIMIT_S = 60.0


def main():
    load = os.getloadavg()
    runs = validate.calibration_runs()
    t0 = time.perf_counter()
    table = validate.replay_all(runs)
    wall = time.perf_counter() - t0
    streams = runs.drop_duplicates("experiment")
    simulated = int(runs["n_requests"].sum())  # an experiment's stream holds every stage's requests
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} "
          "(1 / 5 / 15 min)")
    print(f"replay_all: {len(runs)} runs ({len(streams)} simulated streams, {simulated:,} requests) in {wall:.1f} s "
          f"(limit {LIMIT_S:.0f} s: {'ok' if wall < LIMIT_S else 'TOO SLOW'})")
    per_run = table.drop_duplicates("run_id")
    flagged = per_run[per_run["status"] == "overloaded"]
    false_alarms = int((per_run["overloaded"] & (per_run["status"] == "ok")).sum())
    print(f"overloaded runs recognised: {int(flagged['overloaded'].sum())} of {len(flagged)}; "
          f"ok runs the simulation calls overloaded: {false_alarms}")
    summary = validate.error_summary(table)
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(summary.to_string(index=False, float_format=lambda x: f"{x:.3f}"))


if __name__ == "__main__":
    main()
