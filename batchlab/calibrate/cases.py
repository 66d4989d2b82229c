"""The measured sets as cases: what each measurement ran (its work, counted by the CostModel) and its seconds.

Each builder turns the rows of one set of the tidy table (:func:`batchlab.calibrate.readers.measured_timings`)
into one row per measured case: descriptors (model, tp, tokens, ...), ``split`` (how the fit uses the case),
``measured_s``, and the work of the operator as ``_kernels.step_cost`` counts it (GEMM and attention FLOPs,
weight, KV and activation bytes, per GPU), with the kernels it launched (``n_kernels``, ``floor_kind``).
Builders are cached per source (:func:`~batchlab.calibrate.readers.source_key`): "" is the compact table.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from ..cost import CostModel
from ..hardware import get_hardware
from ..models import ModelSpec, get_model
from .readers import HARDWARE, REFERENCE_MODEL, VIDUR_GEMM_OPS, VIDUR_SMALL_OPS, _llmservingsim_layers, _table

LLMSERVINGSIM_SMALL_OPS = ("input_layernorm", "post_layernorm", "rope", "act_fn")  # no separate residual add
# LLMServingSim's eager kernels are fitted on prompts up to here and checked on longer ones. Below about 1,000
# tokens eager attention's time is mostly its floor and jumps with the prompt's alignment to the kernel's tiles,
# so a fit that stops at 1,024 pins the quadratic term poorly (notebook 10 shows what that does to the check).
EAGER_FIT_MAX_TOKENS = 1536
VIDUR_FIT_MODELS = ("Llama-2-7b-hf", "Llama-2-70b-hf")
VIDUR_FIT_TP = (1, 2)
# The max() roofline has a sharp corner where real GEMMs bend smoothly, so each efficiency is fitted where it
# binds: memory-bound cases (at most 64 tokens) and compute-bound ones (at least 1024 BF16 / 4096 FP8 tokens),
# well away from the ridge (about 230 / 600 tokens with the fitted values). Cases near the ridge stay out of
# the fit (split "ridge") and are still reported.
MEMORY_BOUND_MAX_TOKENS = 64
COMPUTE_BOUND_MIN_TOKENS = {"bf16": 1024, "fp8": 4096}
GEMM_FIT_N = 6144
DECODE_FIT_TP = 1
PREFILL_FIT_GEOMETRIES = ("32-8-128", "64-8-128", "40-40-128")
ALLREDUCE_FIT_WORKERS = (2, 8)

LLAMA31_8B_GEMMS = {  # LLMServingSim's unfused projections of Llama-3.1-8B: (in, out) features
    "q_proj": (4096, 4096), "k_proj": (4096, 1024), "v_proj": (4096, 1024), "o_proj": (4096, 4096),
    "gate_proj": (4096, 14336), "up_proj": (4096, 14336), "down_proj": (14336, 4096), "lm_head": (4096, 128256),
}


# -- operator work, counted by the CostModel's own constants ----------------------------------------

def _work(cost: CostModel, gemm_tokens=0.0, attn_work=0.0, kv_tokens=0.0, elementwise_tokens=0.0) -> dict:
    """FLOPs and bytes of the GEMM, attention and elementwise terms of ``_kernels.step_cost`` for one operator.

    Per GPU. ``gemm_tokens`` rows through the weights (weights are read once if any), ``attn_work`` =
    sum c(2p + c) + 2 sum l as in ``step_cost``, ``kv_tokens`` = cached + new tokens whose KV is read or
    written, ``elementwise_tokens`` = tokens through the norms, RoPE and SiLU-and-mul.
    """
    coef = cost.named_coefficients()
    gemm_tokens = np.asarray(gemm_tokens, dtype=np.float64)
    return {
        "gemm_flops": coef["gemm_flops_per_token"] * gemm_tokens,
        "gemm_bytes": np.where(gemm_tokens > 0, coef["weight_bytes"], 0.0),
        "attn_flops": coef["attn_flops_per_work"] * np.asarray(attn_work, dtype=np.float64),
        "attn_bytes": coef["kv_bytes_per_token"] * np.asarray(kv_tokens, dtype=np.float64),
        "elem_bytes": cost.elementwise_bytes_per_token * np.asarray(elementwise_tokens, dtype=np.float64),
        "peak_flops": cost.peak_flops,
        "hbm_bytes_per_s": cost.hardware.hbm_bytes_per_s,
    }


def _spec(name, params, d_model, heads, kv_heads, head_dim, d_ff=0, layers=1) -> ModelSpec:
    """One layer's (or one operator's) shape: no embedding table or LM head (vocab 0), so every parameter is in
    the GEMMs."""
    return ModelSpec(name=name, params=int(params), layers=layers, d_model=int(d_model), heads=int(heads),
                     kv_heads=int(kv_heads), head_dim=int(head_dim), d_ff=int(d_ff), vocab=0)


def _ideal(model: ModelSpec, dtype="bf16", tp=1) -> CostModel:
    return CostModel(get_hardware(HARDWARE), model, dtype=dtype, tp=int(tp)).ideal()


def _bound(tokens, dtype):
    """True where a GEMM of ``tokens`` rows is clearly memory- or compute-bound (away from the ridge)."""
    return (tokens <= MEMORY_BOUND_MAX_TOKENS) | (tokens >= COMPUTE_BOUND_MIN_TOKENS[dtype])


def _set(key: str, name: str) -> pd.DataFrame:
    table = _table(key)
    return table[table["set"] == name]


def _vidur_wide(key: str, name: str):
    """(model, one row per source row: shape columns, tokens and each op's measured ms) per vidur model file."""
    shape = ["d_model", "heads", "kv_heads", "head_dim", "d_ff", "gated", "vocab", "tp", "tokens"]
    for model, rows in _set(key, name).groupby("model", sort=False):
        first = rows.drop_duplicates("source_row").set_index("source_row")[shape]
        yield model, first.join(rows.pivot(index="source_row", columns="op", values="measured"))


# -- the measured sets, as cases (descriptors, work, measured seconds) --------------------------------

@lru_cache(maxsize=4)
def vidur_gemm_cases(key: str) -> pd.DataFrame:
    """vidur: one layer's four GEMMs (QKV, output, gate+up, down) vs tokens and TP, summed per layer.

    Shapes come from each file's own columns (n_embd, n_head, n_kv_head, n_expanded_embd, use_gated_mlp), so
    every model in the folder is used; biases (phi-2) are ignored. Attention is not in these files.
    """
    frames = []
    for name, wide in _vidur_wide(key, "vidur_gemm"):
        for shape, g in wide.groupby(["d_model", "heads", "kv_heads", "head_dim", "d_ff", "gated", "vocab", "tp"]):
            d, heads, kv_heads, head_dim, d_ff, gated, vocab, tp = shape
            params = (d * (heads + 2 * kv_heads) * head_dim + heads * head_dim * d
                      + (2 if gated else 1) * d * d_ff + d_ff * d)
            cost = _ideal(_spec(name, params, d, heads, kv_heads, head_dim, d_ff), tp=tp)
            tokens = g["tokens"].to_numpy(dtype=np.float64)
            measured = sum(g[op].to_numpy() for op in VIDUR_GEMM_OPS) * 1e-3
            if name not in VIDUR_FIT_MODELS:
                split = np.full(len(g), "holdout_model")
            elif tp not in VIDUR_FIT_TP:
                split = np.full(len(g), "holdout_tp")
            else:
                split = np.where(_bound(tokens, "bf16"), "fit", "ridge")
            frames.append(pd.DataFrame({
                "set": "vidur_gemm", "split": split,
                "model": name, "tp": int(tp), "tokens": tokens, "measured_s": measured,
                "n_kernels": len(VIDUR_GEMM_OPS), "floor_kind": "gemm_s", **_work(cost, gemm_tokens=tokens),
            }))
    return pd.concat(frames, ignore_index=True)


@lru_cache(maxsize=4)
def vidur_elementwise_cases(key: str) -> pd.DataFrame:
    """vidur: one layer's norms, RoPE, SiLU-and-mul and residual add (5 kernels) vs tokens and TP.

    The activation bytes are the CostModel's least traffic for that shape (``elementwise_bytes_per_token``).
    Only models of Llama's layout (two RMSNorms, gated MLP, full RoPE) have these rows: phi-2, with one
    LayerNorm, a GELU MLP and partial RoPE, is left out when the table is read.
    """
    frames = []
    for name, wide in _vidur_wide(key, "vidur_elementwise"):
        for shape, g in wide.groupby(["d_model", "heads", "kv_heads", "head_dim", "d_ff", "tp"]):
            d, heads, kv_heads, head_dim, d_ff, tp = shape
            cost = _ideal(_spec(name, 0, d, heads, kv_heads, head_dim, d_ff), tp=tp)
            tokens = g["tokens"].to_numpy(dtype=np.float64)
            split = ("holdout_model" if name not in VIDUR_FIT_MODELS else
                     "holdout_tp" if tp not in VIDUR_FIT_TP else "fit")
            frames.append(pd.DataFrame({
                "set": "vidur_elementwise", "split": split, "model": name, "tp": int(tp), "tokens": tokens,
                "measured_s": sum(g[op].to_numpy() for op in VIDUR_SMALL_OPS) * 1e-3,
                "n_kernels": len(VIDUR_SMALL_OPS), "floor_kind": "elementwise_s",
                **_work(cost, elementwise_tokens=tokens),
            }))
    return pd.concat(frames, ignore_index=True)


@lru_cache(maxsize=4)
def gemm_kernel_cases(key: str) -> pd.DataFrame:
    """inference-sim: single FP8 GEMMs (DeepGEMM, 1-byte weights, FP8 peak) of m tokens through a k x n weight."""
    frames = []
    for (k, n), g in _set(key, "gemm_kernels_fp8").groupby(["k", "n"]):
        cost = _ideal(_spec(f"gemm-{k}x{n}", k * n, k, 1, 1, 1, n), dtype="fp8")
        m = g["m"].to_numpy(dtype=np.float64)
        frames.append(pd.DataFrame({
            "set": "gemm_kernels_fp8", "split": np.where(n != GEMM_FIT_N, "holdout_shape",
                                                         np.where(_bound(m, "fp8"), "fit", "ridge")),
            "m": m, "k": int(k), "n": int(n), "measured_s": g["measured"].to_numpy() * 1e-6,
            "n_kernels": 1, "floor_kind": "gemm_fp8_s", "kernels": "fp8", **_work(cost, gemm_tokens=m),
        }))
    return pd.concat(frames, ignore_index=True)


def _geometries(key: str, name: str):
    """(file stem, heads, kv heads, head dim, tp, rows) per geometry file of an attention set, in file order."""
    for (heads, kv_heads, head_dim, tp), g in _set(key, name).groupby(["heads", "kv_heads", "head_dim", "tp"],
                                                                       sort=False):
        stem = f"{heads}-{kv_heads}-{head_dim}" + (f"-tp{tp}" if name == "decode_attn" else "")
        yield stem, heads, kv_heads, head_dim, tp, g


@lru_cache(maxsize=4)
def decode_cases(key: str) -> pd.DataFrame:
    """inference-sim: one layer's decode attention (FlashInfer, BF16 KV) for ``batch`` sequences of ``kv_len``.

    Files are ``<q heads>-<kv heads>-<head dim>-tp<N>``; a GPU holds heads / N of them.
    """
    frames = []
    for stem, heads, kv_heads, head_dim, tp, g in _geometries(key, "decode_attn"):
        cost = _ideal(_spec(stem, 0, heads * head_dim, heads, kv_heads, head_dim), tp=tp)
        b, ell = g["batch"].to_numpy(dtype=np.float64), g["kv_len"].to_numpy(dtype=np.float64)
        frames.append(pd.DataFrame({
            "set": "decode_attn", "split": "fit" if tp == DECODE_FIT_TP else "holdout_tp",
            "geometry": stem.rsplit("-tp", 1)[0], "tp": int(tp), "batch": b, "kv_len": ell,
            "measured_s": g["measured"].to_numpy() * 1e-6, "n_kernels": 1, "floor_kind": "decode_attn_s",
            **_work(cost, attn_work=2 * b * ell, kv_tokens=b * ell + b),
        }))
    return pd.concat(frames, ignore_index=True)


@lru_cache(maxsize=4)
def prefill_cases(key: str) -> pd.DataFrame:
    """inference-sim: one layer's causal prefill attention (FlashAttention-3, BF16) of one ``seq_len`` prompt."""
    frames = []
    for stem, heads, kv_heads, head_dim, _, g in _geometries(key, "prefill_attn"):
        cost = _ideal(_spec(stem, 0, heads * head_dim, heads, kv_heads, head_dim))
        c = g["tokens"].to_numpy(dtype=np.float64)
        frames.append(pd.DataFrame({
            "set": "prefill_attn", "split": "fit" if stem in PREFILL_FIT_GEOMETRIES else "holdout_geometry",
            "geometry": stem, "tokens": c, "measured_s": g["measured"].to_numpy() * 1e-6,
            "n_kernels": 1, "floor_kind": "prefill_attn_s", **_work(cost, attn_work=c * c, kv_tokens=c),
        }))
    return pd.concat(frames, ignore_index=True)


@lru_cache(maxsize=4)
def llmservingsim_op_cases(key: str) -> pd.DataFrame:
    """LLMServingSim, Llama-3.1-8B, eager PyTorch: each GEMM, and one layer's attention and elementwise kernels."""
    table = _llmservingsim_layers(key)
    tokens = table.index.to_numpy(dtype=np.float64)
    frames = []
    for op, (k, n) in LLAMA31_8B_GEMMS.items():
        cost = _ideal(_spec(op, k * n, k, 1, 1, 1, n))
        frames.append(pd.DataFrame({
            "set": "llmservingsim_gemm", "split": "holdout_source", "op": op, "tokens": tokens,
            "measured_s": table[op].to_numpy(), "n_kernels": 1, "floor_kind": "gemm_s",
            **_work(cost, gemm_tokens=tokens),
        }))
    m = get_model(REFERENCE_MODEL)  # Llama-3.1-8B has Llama-3-8B's shapes
    layer = _ideal(_spec("layer", 0, m.d_model, m.heads, m.kv_heads, m.head_dim, m.d_ff))
    split = np.where(tokens <= EAGER_FIT_MAX_TOKENS, "fit", "holdout_tokens")
    frames.append(pd.DataFrame({
        "set": "llmservingsim_attn", "split": split, "op": "attn", "tokens": tokens,
        "measured_s": table["attn"].to_numpy(), "n_kernels": 1, "floor_kind": "eager_attn_s", "kernels": "eager",
        **_work(layer, attn_work=tokens * tokens, kv_tokens=tokens),
    }))
    frames.append(pd.DataFrame({
        "set": "llmservingsim_elementwise", "split": split, "op": "norms+rope+act", "tokens": tokens,
        "measured_s": table[list(LLMSERVINGSIM_SMALL_OPS)].sum(axis=1).to_numpy(),
        "n_kernels": len(LLMSERVINGSIM_SMALL_OPS), "floor_kind": "eager_elementwise_s", "kernels": "eager",
        **_work(layer, elementwise_tokens=tokens),
    }))
    return pd.concat(frames, ignore_index=True)


@lru_cache(maxsize=4)
def allreduce_cases(key: str) -> pd.DataFrame:
    """vidur: NCCL all-reduce on one DGX H100 (NVSwitch) vs message bytes and GPUs (rank 0's median)."""
    frames = []
    for workers, g in _set(key, "allreduce").groupby("workers"):
        frames.append(pd.DataFrame({
            "set": "allreduce", "split": "fit" if workers in ALLREDUCE_FIT_WORKERS else "holdout_workers",
            "workers": int(workers), "size_bytes": g["size_bytes"].to_numpy(dtype=np.float64),
            "measured_s": g["measured"].to_numpy() * 1e-3,
        }))
    return pd.concat(frames, ignore_index=True)
