"""Whole-server validation: replay the measured end-to-end vLLM runs and compare predictions with them.

The calibration runs of ``../shared/data/e2e/`` (open-loop inference-perf stages on H100, closed-loop
AIConfigurator concurrency sweeps on H100 and H200) live as one compact table in ``data/e2e_runs.csv``, written
by ``scripts/make_e2e_runs.py`` (``data/README.md`` gives sources, licences and columns). This package reads
it, rebuilds each run's request stream, simulates it with vLLM's scheduler and the run's knobs, and reports
measured against predicted TTFT, TPOT and E2E (issue 11, item 4; notebook 10 shows the result).

Modules: :mod:`~batchlab.validate.raw` (the raw files and the compact table), :mod:`~batchlab.validate.runs`
(the table and which runs can be replayed), :mod:`~batchlab.validate.streams` (request streams),
:mod:`~batchlab.validate.setup` (cost model and knobs per run), :mod:`~batchlab.validate.replay` (one run) and
:mod:`~batchlab.validate.tables` (every run, and the error summary) and :mod:`~batchlab.validate.ablation` (each
mechanism switched off in turn).
"""
from .ablation import MECHANISMS, ablations, cost_without
from .raw import E2E_ENV, RUNS_FILE, e2e_dir, read_raw
from .replay import METRICS, overload_signs, replay_run, simulate_run
from .runs import NOT_IN_DATA, calibration_runs, get_run, unrepresentable_reason
from .setup import cost_for, knobs_for, knobs_with
from .streams import build_requests
from .tables import error_summary, replay_all

__all__ = [
    "E2E_ENV", "RUNS_FILE", "e2e_dir", "read_raw", "METRICS", "overload_signs", "replay_run", "simulate_run",
    "NOT_IN_DATA", "calibration_runs", "get_run", "unrepresentable_reason", "cost_for", "knobs_for",
    "knobs_with", "build_requests", "error_summary", "replay_all", "MECHANISMS", "ablations", "cost_without",
]
