"""The measured H100 timings as one tidy table, read from the compact copy in ``data/`` or from the raw files.

Two places hold the same measurements:

- ``data/measured_timings.csv.gz`` (:data:`TIMINGS_FILE`), committed with the project: one row per measured
  number, written by ``scripts/make_measured_timings.py`` from the raw files. Every function reads it when its
  ``root`` is None (the default), so a fresh clone needs nothing beside it.
- the raw public files (``../shared/data/measured`` beside the repository, or the folder named by
  ``$BATCHLAB_MEASURED_DIR``; :func:`measured_dir`), read only when a ``root`` is given. They come from three
  public repositories (:data:`SOURCES`; ``data/README.md`` names their commits, paths and licences).

Both are read into the same tidy frame (:data:`COLUMNS`), so everything after this module is one code path, and
``measured`` holds the source's own number in the source's unit (``unit``), bit for bit.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from .._data import DATA_DIR
from ..models import get_model

MEASURED_ENV = "BATCHLAB_MEASURED_DIR"
HARDWARE = "h100-sxm"  # every measured set is an H100 SXM (the pairwise-NVLink network set is not used)
REFERENCE_MODEL = "llama-3-8b"  # LLMServingSim's Llama-3.1-8B has its shapes; overhead_s maps floors onto it
TIMINGS_FILE = DATA_DIR / "measured_timings.csv.gz"

SOURCES = {  # set: the repository @ commit its rows come from
    "vidur_gemm": "microsoft/vidur@7d47513",
    "vidur_elementwise": "microsoft/vidur@7d47513",
    "gemm_kernels_fp8": "inference-sim/inference-sim@a410740f",
    "decode_attn": "inference-sim/inference-sim@a410740f",
    "prefill_attn": "inference-sim/inference-sim@a410740f",
    "llmservingsim": "casys-kaist/LLMServingSim@5daddb21",
    "allreduce": "microsoft/vidur@7d47513",
}

# The tidy table: one row per measured number. Integer columns are nullable (empty where a set has no such
# descriptor); ``measured`` is the source's number in ``unit``.
COLUMNS = {
    "source": "str", "set": "str", "source_row": "Int64", "op": "str", "model": "str",
    "d_model": "Int64", "heads": "Int64", "kv_heads": "Int64", "head_dim": "Int64", "d_ff": "Int64",
    "gated": "boolean", "vocab": "Int64", "tp": "Int64", "workers": "Int64", "tokens": "Int64", "batch": "Int64",
    "kv_len": "Int64", "m": "Int64", "k": "Int64", "n": "Int64", "size_bytes": "Int64",
    "measured": "float64", "unit": "str",
}

VIDUR_GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")  # QKV and gate+up fused
VIDUR_SMALL_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
LLMSERVINGSIM_MODEL = "Llama-3.1-8B"
LLMSERVINGSIM_ONCE = ("embedding", "final_layernorm", "lm_head")  # once per forward pass, not per layer


def measured_dir(path=None) -> Path:
    """The raw measured-timings folder: ``path``, else ``$BATCHLAB_MEASURED_DIR``, else ``../shared/data/measured``.

    The default is relative to the repository. Raises ``FileNotFoundError`` saying what to set when the folder
    chosen does not hold the measured sets. Only needed to read the raw files; the compact table in ``data/``
    needs no folder.
    """
    if path is None:
        path = os.environ.get(MEASURED_ENV) or DATA_DIR.parent.parent / "shared" / "data" / "measured"
    path = Path(path)
    if not (path / "vidur_h100").is_dir():
        raise FileNotFoundError(
            f"no measured H100 timings in {path}: set {MEASURED_ENV} to the folder holding vidur_h100/, "
            "llmservingsim_h100/ and h100_kernels/ (../shared/data/measured beside the repository; data/README.md "
            "names the public sources to rebuild it from)"
        )
    return path.resolve()


def source_key(root=None) -> str:
    """What :func:`measured_timings` reads for ``root``: "" for the compact table, else the raw folder's path."""
    return "" if root is None else str(measured_dir(root))


# -- raw files -> tidy rows ------------------------------------------------------------------------

def _rows(set_name: str, unit: str, measured, **columns) -> pd.DataFrame:
    """Tidy rows of one set: the descriptors given (scalars or columns), the measured numbers and their unit."""
    return pd.DataFrame({"source": SOURCES[set_name], "set": set_name, **columns, "measured": measured,
                         "unit": unit})


def _vidur(root: Path) -> list[pd.DataFrame]:
    """vidur's per-layer operator profiles: the median ms of the four GEMMs and (Llama-layout models) five
    elementwise kernels, per source row (tokens, TP) of each model's ``mlp.csv``.

    phi-2 (one LayerNorm, a GELU MLP, partial RoPE) has no elementwise rows: only Llama's layout is modelled.
    """
    frames = []
    for path in sorted(root.joinpath("vidur_h100").glob("*/*/mlp.csv")):
        raw = pd.read_csv(path)
        shape = {"source_row": np.arange(len(raw)), "model": path.parent.name, "d_model": raw["n_embd"],
                 "heads": raw["n_head"], "kv_heads": raw["n_kv_head"], "head_dim": raw["n_embd"] // raw["n_head"],
                 "d_ff": raw["n_expanded_embd"], "gated": raw["use_gated_mlp"], "vocab": raw["vocab_size"],
                 "tp": raw["num_tensor_parallel_workers"], "tokens": raw["num_tokens"]}
        small = [f"time_stats.{op}.median" for op in VIDUR_SMALL_OPS]
        llama_layout = set(small) <= set(raw.columns) and raw["use_gated_mlp"].all()
        for set_name, ops in (("vidur_gemm", VIDUR_GEMM_OPS), ("vidur_elementwise", VIDUR_SMALL_OPS)):
            if set_name == "vidur_elementwise" and not llama_layout:
                continue
            frames += [_rows(set_name, "ms", raw[f"time_stats.{op}.median"], op=op, **shape) for op in ops]
    return frames


def _kernels(root: Path) -> list[pd.DataFrame]:
    """inference-sim's kernel benchmarks: FP8 GEMMs (m, k, n), decode and prefill attention per geometry (us)."""
    base = root / "h100_kernels"
    raw = pd.read_csv(base / "gemm" / "h100" / "data.csv")
    frames = [_rows("gemm_kernels_fp8", "us", raw["latency_us"], source_row=np.arange(len(raw)), op="gemm_fp8",
                    m=raw["m"], k=raw["k"], n=raw["n"])]
    for kind in ("decode", "prefill"):
        for path in sorted((base / "mha" / kind / "h100").glob("*.csv")):
            raw = pd.read_csv(path)
            if (raw["dtype"] != "bf16").any() or ("kv_dtype" in raw and (raw["kv_dtype"] != "bf16").any()):
                raise ValueError(f"{path}: expected BF16 attention throughout")
            parts = path.stem.split("-")
            geometry = {"source_row": np.arange(len(raw)), "op": f"{kind}_attn", "heads": int(parts[0]),
                        "kv_heads": int(parts[1]), "head_dim": int(parts[2]),
                        "tp": int(parts[3][2:]) if len(parts) > 3 else 1}
            if kind == "decode":
                frames.append(_rows("decode_attn", "us", raw["latency_us"], **geometry, batch=raw["batch_size"],
                                    kv_len=raw["kv_len"]))
            else:
                frames.append(_rows("prefill_attn", "us", raw["latency_us"], **geometry, tokens=raw["seq_len"]))
    return frames


def _llmservingsim(root: Path) -> pd.DataFrame:
    """LLMServingSim's per-layer latency (ns) of Llama-3.1-8B in eager PyTorch vs prompt tokens, every layer."""
    raw = pd.read_csv(root / "llmservingsim_h100" / LLMSERVINGSIM_MODEL / "tp1" / "layers.csv")
    return _rows("llmservingsim", "ns", raw["latency(ns)"], source_row=np.arange(len(raw)), op=raw["layer_name"],
                 model=LLMSERVINGSIM_MODEL, tp=raw["tp_size"], tokens=raw["input"], kv_len=raw["kv_cache"])


def _allreduce(root: Path) -> pd.DataFrame:
    """vidur's NCCL all-reduce on one DGX H100 (NVSwitch): rank 0's median ms vs workers and message bytes."""
    raw = pd.read_csv(root / "vidur_h100" / "network" / "h100_dgx" / "all_reduce.csv", index_col=0)
    raw = raw.assign(source_row=np.arange(len(raw)))
    raw = raw[raw["rank"] == 0]
    return _rows("allreduce", "ms", raw["time_stats.all_reduce.median"], source_row=raw["source_row"],
                 op="all_reduce", workers=raw["num_workers"], size_bytes=raw["size"])


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with exactly :data:`COLUMNS`, in that order and of those dtypes, and a fresh index."""
    return frame.reindex(columns=list(COLUMNS)).astype(COLUMNS).reset_index(drop=True)


def read_raw(root=None) -> pd.DataFrame:
    """The tidy table (:data:`COLUMNS`) read from the raw public files in ``measured_dir(root)``.

    Rows in the order the calibration reads them: vidur's GEMM and elementwise kernels per model file, the FP8
    GEMMs, decode then prefill attention per geometry file, LLMServingSim's profile, the all-reduces.
    """
    root = measured_dir(root)
    frames = [*_vidur(root), *_kernels(root), _llmservingsim(root), _allreduce(root)]
    return _typed(pd.concat([f.reset_index(drop=True) for f in frames], ignore_index=True))


def write_timings(table: pd.DataFrame, path=TIMINGS_FILE) -> Path:
    """Write the tidy table as CSV, gzip-compressed with a fixed header time (same bytes for the same table)."""
    path = Path(path)
    _typed(table).to_csv(path, index=False, compression={"method": "gzip", "mtime": 0})
    return path


def read_timings(path=TIMINGS_FILE) -> pd.DataFrame:
    """The tidy table from the compact file: the raw files' numbers, bit for bit.

    ``measured`` was written as the shortest text that round-trips; Python's ``float`` reads it back correctly
    rounded whatever pandas' own float parser does.
    """
    frame = pd.read_csv(path, dtype=dict(COLUMNS, measured="str"), keep_default_na=False, na_values=[""])
    frame["measured"] = np.array(frame["measured"].tolist(), dtype=np.float64)
    return _typed(frame)


@lru_cache(maxsize=4)
def _table(key: str) -> pd.DataFrame:
    return read_timings() if key == "" else read_raw(key)


def measured_timings(root=None) -> pd.DataFrame:
    """Every measured number the calibration uses, one row each (:data:`COLUMNS`; units in ``unit``).

    ``root`` None reads the compact table in ``data/`` (:data:`TIMINGS_FILE`); a folder reads the raw public files
    there (``measured_dir(root)``). Both give the same frame.
    """
    return _table(source_key(root)).copy()


# -- LLMServingSim's profile, as the per-layer table and the whole forward pass ----------------------

@lru_cache(maxsize=4)
def _llmservingsim_layers(key: str) -> pd.DataFrame:
    rows = _table(key)
    rows = rows[rows["set"] == "llmservingsim"]
    if (rows["kv_len"] != 0).any() or (rows["tp"] != 1).any():
        raise ValueError("LLMServingSim layers.csv: expected kv_cache == 0 and tp_size == 1 throughout")
    table = rows.pivot_table(index="tokens", columns="op", values="measured") * 1e-9
    table.index = table.index.astype(np.int64)
    return table.rename_axis(index="tokens", columns="layer")


def llmservingsim_layers(root=None) -> pd.DataFrame:
    """LLMServingSim's Llama-3.1-8B profile (eager PyTorch, TP 1, no cached tokens): seconds per layer kind.

    Index ``tokens`` (prompt tokens, 1 to 2048), one column per layer name (``embedding``, ``input_layernorm``,
    ``q_proj``, ..., ``attn``, ..., ``final_layernorm``, ``lm_head``): the latency of one such layer.
    """
    return _llmservingsim_layers(source_key(root)).copy()


def _llmservingsim_forward(key: str) -> pd.Series:
    table = _llmservingsim_layers(key)
    once = list(LLMSERVINGSIM_ONCE)
    per_layer = table.drop(columns=once).sum(axis=1)
    return table[once].sum(axis=1) + get_model(REFERENCE_MODEL).layers * per_layer


def llmservingsim_forward_s(root=None) -> pd.Series:
    """Measured seconds of LLMServingSim's whole forward pass per prompt length (index ``tokens``).

    The embedding, 32 layers of every per-layer operator, the final norm and the LM head (over all tokens, as
    the eager profile ran it).
    """
    return _llmservingsim_forward(source_key(root))
