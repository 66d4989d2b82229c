"""The end-to-end vLLM runs of ``../shared/data/e2e/`` as one tidy table: one row per comparable unit.

A comparable unit is one load stage of one inference-perf run (``set`` "inference-perf", from
inference-sim/training, open loop) or one row of AIConfigurator's silicon sample (``set`` "aiconfigurator",
closed loop). :func:`read_raw` builds the table from the raw files; ``scripts/make_e2e_runs.py`` writes it to
``data/e2e_runs.csv`` (:data:`RUNS_FILE`), which :func:`batchlab.validate.calibration_runs` reads by default.
``data/README.md`` gives every column's meaning, the sources with their commits and licences.

inference-sim/training has no licence: only re-typed facts (settings and measured numbers) travel, each row
with its source, as ``../shared/data/README.md`` does. AIConfigurator is Apache-2.0.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .._data import DATA_DIR

E2E_ENV = "BATCHLAB_E2E_DIR"
RUNS_FILE = DATA_DIR / "e2e_runs.csv"
OPEN_LOOP, CLOSED_LOOP = "inference-perf", "aiconfigurator"
TRAINING_DIR = "inference_sim_training"
AIC_FILE = "aiconfigurator/silicon_sample_vllm_dense_tp2plus.csv"
AIC_SOURCE = ("ai-dynamo/aiconfigurator@095f58a5, aic-core/src/aiconfigurator_core/systems/silicon_sample.csv",
              "Apache-2.0")
TRAINING_LICENCE = "none (facts re-typed)"
ASSUMED_GPU_MEMORY_UTILIZATION = 0.9  # not recorded; what the held-out check assumes (../shared/data/README.md)

# AIConfigurator rows exported from InferenceX (SemiAnalysis InferenceMAX): provenance "source_file=<date>.csv;
# model=...; silicon_concurrency=...; measured=...; wip=..." (the Llama-3.1-70B FP8 sweeps measured 2025-10-29:
# InferenceMAX v1's grid of 1k/1k, 1k/8k and 8k/1k at concurrency 4-64 and TP 2-8 on H100 and H200). Their
# client and server settings are public (InferenceMAX's benchmarks/70b_fp8_{h100_docker,h200_slurm}.sh and
# .github/workflows/full-sweep-tmpl.yml): vLLM's benchmark_serving.py (kimbochen/bench_serving) with
# --dataset-name random --random-range-ratio 0.8 --num-prompts 10 x concurrency --max-concurrency concurrency
# --request-rate inf --ignore-eos, against vllm serve --max-num-seqs concurrency --max-num-batched-tokens 8192
# --no-enable-prefix-caching --async-scheduling. Its random dataset draws every prompt and output length
# uniformly from the integers [int(0.8 x isl), isl] and [int(0.8 x osl), osl]: isl and osl are upper bounds.
INFERENCEX = "inferencex"
INFERENCEX_SOURCE = re.compile(r"^source_file=\d{4}-\d{2}-\d{2}\.csv; model=[^;]+;.*\bmeasured=")
INFERENCEX_RANGE_RATIO = 0.8  # --random-range-ratio
INFERENCEX_PROMPTS_PER_CLIENT = 10  # --num-prompts = 10 x concurrency
INFERENCEX_BATCHED_TOKENS = 8192  # --max-num-batched-tokens

MODEL_NAMES = {  # Hugging Face id -> batchlab model name (an FP8 checkpoint has the shapes of its BF16 model)
    "meta-llama/Llama-2-7b-hf": "llama-2-7b",
    "meta-llama/Llama-2-70b-hf": "llama-2-70b",
    "codellama/CodeLlama-34b-Instruct-hf": "codellama-34b",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
}
HARDWARE_NAMES = {"H100-SXM": "h100-sxm", "h100_sxm": "h100-sxm", "h200_sxm": "h200"}
PROMPT_QUANTILES = ("min", "p1", "p5", "p10", "p25", "median", "p75", "p90", "p95", "p99", "max")
PROMPT_PROBABILITIES = (0.0, 0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99, 1.0)  # of PROMPT_QUANTILES

# The table's columns and dtypes, in order (integer columns nullable: empty where a set has no such value).
COLUMNS = {
    "run_id": "str", "set": "str", "experiment": "str", "stage": "Int64", "source": "str", "licence": "str",
    "status": "str", "status_note": "str", "model_id": "str", "model": "str", "hardware": "str", "tp": "Int64",
    "dtype": "str", "vllm_version": "str",
    "max_num_seqs": "Int64", "max_num_batched_tokens": "Int64", "max_model_len": "Int64",
    "num_gpu_blocks": "Int64", "gpu_memory_utilization": "float64",
    "stages": "str", "rate_req_s": "float64", "duration_s": "float64", "stage_gap_s": "float64",
    "num_groups": "Int64", "prompts_per_group": "Int64", "system_prompt_len": "Int64", "question_len": "Int64",
    "output_len": "Int64", "prompt_tokens_mean": "float64",
    **{f"prompt_tokens_{q}": "float64" for q in PROMPT_QUANTILES},
    "isl": "Int64", "osl": "Int64", "concurrency": "Int64", "n_requests": "Int64", "client": "str",
    "range_ratio": "float64",
    "requests_sent": "Int64", "successes": "Int64", "failures": "Int64", "achieved_rate_req_s": "float64",
    "ttft_ms": "float64", "tpot_ms": "float64", "e2e_ms": "float64", "output_tokens_counted_mean": "float64",
}


def e2e_dir(path=None) -> Path:
    """The raw end-to-end folder: ``path``, else ``$BATCHLAB_E2E_DIR``, else ``../shared/data/e2e``.

    The default is relative to the repository. Raises ``FileNotFoundError`` saying what to set when the folder
    does not hold both sets.
    """
    if path is None:
        path = os.environ.get(E2E_ENV) or DATA_DIR.parent.parent / "shared" / "data" / "e2e"
    path = Path(path)
    if not ((path / TRAINING_DIR / "runs.csv").is_file() and (path / AIC_FILE).is_file()):
        raise FileNotFoundError(
            f"no end-to-end runs in {path}: set {E2E_ENV} to the folder holding {TRAINING_DIR}/ and "
            "aiconfigurator/ (../shared/data/e2e beside the repository)")
    return path.resolve()


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with exactly :data:`COLUMNS`, in order and of those dtypes (text never missing: ""), fresh index."""
    frame = frame.reindex(columns=list(COLUMNS))
    text = [col for col, kind in COLUMNS.items() if kind == "str"]
    frame[text] = frame[text].astype(object).where(frame[text].notna(), "")
    return frame.astype(COLUMNS).reset_index(drop=True)


def _stage_rows(run: pd.Series, metrics: pd.DataFrame) -> list[dict]:
    """The rows of one inference-perf run: one per load stage, settings from ``runs.csv``."""
    mine = metrics[metrics["experiment"] == run["experiment"]].set_index("scope")
    whole = mine.loc["summary"]  # the 100 prompts cycle across stages: their lengths are the run's
    specs = [s.split("@") for s in run["stages"].split(";")]
    common = {
        "set": OPEN_LOOP, "experiment": run["experiment"], "licence": TRAINING_LICENCE, "status": run["status"],
        "status_note": run["status_note"], "model_id": run["model"], "model": MODEL_NAMES.get(run["model"], ""),
        "hardware": HARDWARE_NAMES.get(run["gpu"], ""), "tp": run["tp"], "dtype": "bf16",
        **{k: run[k] for k in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_gpu_blocks")},
        "gpu_memory_utilization": ASSUMED_GPU_MEMORY_UTILIZATION, "stages": run["stages"],
        "stage_gap_s": run["stage_gap_interval_s"], "prompts_per_group": run["num_prompts_per_group"],
        **{k: run[k] for k in ("num_groups", "system_prompt_len", "question_len", "output_len")},
        **{f"prompt_tokens_{q}": whole[f"prompt_tokens_{q}"] for q in ("mean",) + PROMPT_QUANTILES},
    }
    rows = []
    for n, (rate, duration) in enumerate(specs):
        stage = mine.loc[f"stage_{n}"]
        ttft_ms, e2e_ms = stage["ttft_s_mean"] * 1e3, stage["e2e_s_mean"] * 1e3
        rows.append({
            **common, "run_id": f"{run['experiment']}/stage_{n}", "stage": n,
            "source": f"{run['source_repo']}@{run['source_commit'][:8]}, {run['source_dir']}/{stage['source_file']}",
            "rate_req_s": float(rate), "duration_s": float(duration), "n_requests": int(float(rate) * float(duration)),
            "requests_sent": stage["requests_sent"], "successes": stage["successes"], "failures": stage["failures"],
            "achieved_rate_req_s": stage["achieved_rate"], "ttft_ms": ttft_ms, "e2e_ms": e2e_ms,
            # Per-token time from the generated tokens (ignore_eos): tpot_s / itl_s of the source are not it.
            "tpot_ms": (e2e_ms - ttft_ms) / (run["output_len"] - 1),
            "output_tokens_counted_mean": stage["output_tokens_counted_mean"],
        })
    return rows


def _open_loop(root: Path) -> pd.DataFrame:
    runs = pd.read_csv(root / TRAINING_DIR / "runs.csv", keep_default_na=False, na_values=[""])
    metrics = pd.read_csv(root / TRAINING_DIR / "metrics.csv")
    return pd.DataFrame([row for _, run in runs.iterrows() for row in _stage_rows(run, metrics)])


def _closed_loop(root: Path) -> pd.DataFrame:
    aic = pd.read_csv(root / AIC_FILE, keep_default_na=False, na_values=[""])
    fp8 = (aic["precision"] == "fp8") | aic["model_path"].str.upper().str.endswith("-FP8")
    ttft_ms, tpot_ms = aic["silicon_ttft_ms"], aic["silicon_tpot_ms"]
    concurrency = aic["batch_size"]
    inferencex = aic["silicon_data_source"].str.match(INFERENCEX_SOURCE).to_numpy()
    return pd.DataFrame({
        "run_id": aic["id"], "set": CLOSED_LOOP, "experiment": aic["id"], "source": AIC_SOURCE[0],
        "licence": AIC_SOURCE[1], "status": "ok", "status_note": "", "model_id": aic["model_path"],
        "model": aic["model_path"].map(MODEL_NAMES).fillna(""),
        "hardware": aic["system"].map(HARDWARE_NAMES).fillna(""),
        "tp": aic["tp_size"], "dtype": np.where(fp8, "fp8", "bf16"), "vllm_version": aic["backend_version"],
        "max_num_seqs": np.where(inferencex, concurrency, pd.NA),
        "max_num_batched_tokens": np.where(inferencex, INFERENCEX_BATCHED_TOKENS, pd.NA),
        "gpu_memory_utilization": ASSUMED_GPU_MEMORY_UTILIZATION, "isl": aic["isl"], "osl": aic["osl"],
        "concurrency": concurrency,
        "n_requests": np.where(inferencex, INFERENCEX_PROMPTS_PER_CLIENT * concurrency,
                               np.maximum(8 * concurrency, 200)),
        "client": np.where(inferencex, INFERENCEX, ""),
        "range_ratio": np.where(inferencex, INFERENCEX_RANGE_RATIO, np.nan),
        "ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "e2e_ms": ttft_ms + tpot_ms * (aic["osl"] - 1),
    })


def read_raw(root=None) -> pd.DataFrame:
    """The table (:data:`COLUMNS`) built from the raw files in ``e2e_dir(root)``.

    Rows: the inference-perf stages in the order of ``runs.csv``, then AIConfigurator's rows in file order.
    Times in milliseconds. Measured means: inference-perf ``ttft_ms`` and ``e2e_ms`` are the stage's means over
    successful requests and ``tpot_ms`` = (E2E mean - TTFT mean) / (output_len - 1); AIConfigurator's
    ``silicon_ttft_ms`` and ``silicon_tpot_ms`` (read as means) and ``e2e_ms`` = TTFT + TPOT x (osl - 1).
    """
    root = e2e_dir(root)
    frames = [_open_loop(root), _closed_loop(root)]
    return _typed(pd.concat(frames, ignore_index=True))


def write_runs(table: pd.DataFrame, path=RUNS_FILE) -> Path:
    """Write the table as CSV (floats as the shortest text that reads back as the same double)."""
    path = Path(path)
    _typed(table).to_csv(path, index=False, lineterminator="\n")
    return path


def read_runs(path=RUNS_FILE) -> pd.DataFrame:
    """The table from the committed CSV: the same frame :func:`read_raw` builds."""
    text = {col: kind for col, kind in COLUMNS.items() if kind == "str"}
    frame = pd.read_csv(path, keep_default_na=False, na_values=[""], dtype=text)
    return _typed(frame)
