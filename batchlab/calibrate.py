"""Calibrate the cost model against measured H100 timings: efficiencies, kernel floors, overheads.

The measured sets live outside the repository (``../shared/data/measured``, or the folder named by the
environment variable ``BATCHLAB_MEASURED_DIR``); ``data/README.md`` names their sources and licences.
Run ``python -m batchlab.calibrate`` to refit and rewrite ``data/calibration.csv`` (the fitted values, which
:class:`batchlab.CostModel` then uses as its defaults) and ``data/calibration_errors.csv`` (per set and
split, the median and worst relative error before and after calibration).

The model of one operator
-------------------------
Every per-operator prediction is ``sim._step_cost``'s term for that operator alone (its FLOPs and bytes come
from :meth:`CostModel.coefficients` and :attr:`CostModel.elementwise_bytes_per_token`, so shapes are counted
exactly as the simulator counts them) plus a fixed *kernel floor* for every kernel launched::

    t_op = n_kernels * floor + max(flops / (eta * F), bytes / (eta_memory * BW))     GEMMs, attention
    t_op = n_kernels * floor + activation_bytes / (eta_elementwise * BW)             norms, RoPE, SiLU, add

The floor is what a kernel costs however little it does (ramp-up, tail, and in some harnesses the launch). It
matters for small operators, so it is fitted, once per measuring harness because each harness times kernels
its own way. The CostModel has no per-kernel term, only ``overhead_s`` per step, and the floors map onto it:
``overhead_s = L * (4 * floor_gemm + floor_decode_attn + 5 * floor_elementwise)`` with the L = 32 layers of the
reference model Llama-3-8B (4 GEMM kernels and one attention kernel per layer, as vLLM fuses them, and the
five elementwise kernels of vidur's profile).

DESIGN section 3's formula has no elementwise term; vidur's profile shows the norms, RoPE, SiLU-and-mul and
residual add are 10 to 15 % of a layer's time at a few thousand tokens, so the calibrated CostModel has one
(``eta_elementwise``), and ``CostModel.ideal()`` keeps DESIGN's formula without it.

The fit
-------
:func:`scipy.optimize.least_squares` on log(predicted / measured), so relative error, symmetric in over- and
under-prediction, with a soft-L1 (robust) loss of scale 5 % and every training set weighted equally. Each
efficiency is fitted where it binds: the max() form has a sharp corner where real GEMMs bend smoothly, so GEMM
cases near the ridge (between 64 and 1024 tokens for BF16, 64 and 4096 for FP8) stay out of the fit and are
reported as split ``ridge``. Training splits:

- ``eta_compute``, ``eta_memory`` and the GEMM floor: vidur's per-layer GEMMs of Llama-2-7B and Llama-2-70B at
  TP 1 and 2;
- ``eta_memory`` (one bandwidth efficiency for weights and KV, as in the CostModel) and the decode floor:
  decode-attention kernels at TP 1;
- ``eta_attn`` and the prefill floor: prefill-attention kernels of geometries 32-8-128, 64-8-128, 40-40-128;
- ``eta_elementwise`` and the elementwise floor: vidur's per-layer norms, RoPE, SiLU-and-mul and add of the
  same two models at TP 1 and 2;
- ``allreduce_latency_s``: vidur's NCCL all-reduce on a DGX H100 with 2 and 8 GPUs, the bandwidth term held at
  the hardware preset's interconnect bandwidth, as the CostModel computes it;
- kernels that are not vLLM's BF16 ones get their own efficiencies (:class:`OwnKernels`): FP8 GEMMs
  (``eta_compute_fp8``, ``eta_memory_fp8`` and a floor, on the FP8 GEMM benchmark with n = 6144; the CostModel's
  defaults when ``dtype="fp8"``) and eager PyTorch's attention and elementwise kernels (on LLMServingSim's
  profile up to 1,536 prompt tokens; not CostModel defaults, since vLLM runs neither). Each of those sets is
  also reported under the BF16 defaults as a diagnostic set (:data:`DIAGNOSTIC_SETS`).

Held out, only evaluated: vidur at TP 4 and 8 and its other models (CodeLlama-34B, InternLM-20B, Qwen-72B, and
phi-2 for GEMMs; shapes read from the files' own columns), the FP8 GEMMs with n = 11008, decode attention at TP 2
and 4, the other three prefill geometries, 4-GPU all-reduce, and of LLMServingSim's Llama-3.1-8B profile each
GEMM, the eager kernels on prompts of more than 1,536 tokens, and the whole forward pass against
:meth:`CostModel.prefill_time` (the CostModel's defaults, vLLM's kernels, against eager PyTorch's).
"""
from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from ._data import DATA_DIR
from .cost import CostModel
from .hardware import get_hardware
from .models import ModelSpec, get_model

MEASURED_ENV = "BATCHLAB_MEASURED_DIR"
HARDWARE = "h100-sxm"  # every measured set is an H100 SXM (the pairwise-NVLink network set is not used)

# DESIGN section 3's starting values: the "before" of every error table.
START = {"eta_compute": 0.6, "eta_memory": 0.8, "eta_attn": 0.5, "eta_elementwise": None, "overhead_s": 1e-3,
         "allreduce_latency_s": 0.0}  # eta_elementwise None: DESIGN's formula has no elementwise term
_ETA_X0 = 0.5  # where the fit starts an efficiency that has no starting value
ETA_FIELDS = ("eta_compute", "eta_memory", "eta_attn", "eta_elementwise")  # the CostModel's efficiencies

REFERENCE_MODEL = "llama-3-8b"  # overhead_s maps per-layer kernel floors onto this model's layers

VIDUR_GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")  # QKV and gate+up fused
VIDUR_SMALL_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
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

ERROR_COLUMNS = ("set", "split", "cases", "median_rel_err_before", "worst_rel_err_before",
                 "median_rel_err_after", "worst_rel_err_after")


class KernelFloors(NamedTuple):
    """Fixed seconds per kernel launch, per measuring harness (not a CostModel field; see the module notes)."""

    gemm_s: float  # seconds per BF16 GEMM kernel (vidur's kineto-timed PyTorch GEMMs; reused for LLMServingSim)
    gemm_fp8_s: float  # seconds per FP8 GEMM kernel (inference-sim's DeepGEMM benchmark)
    decode_attn_s: float  # seconds per decode-attention kernel (inference-sim's FlashInfer benchmark)
    prefill_attn_s: float  # seconds per prefill-attention kernel (inference-sim's FlashAttention-3 benchmark)
    elementwise_s: float  # seconds per norm, RoPE, activation or add kernel (vidur's vLLM kernels)
    eager_attn_s: float  # seconds per eager-PyTorch attention (LLMServingSim's profile)
    eager_elementwise_s: float  # seconds per eager-PyTorch norm, RoPE or activation (LLMServingSim's profile)


NO_FLOORS = KernelFloors(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


class OwnKernels(NamedTuple):
    """Efficiencies of kernels other than the BF16 ones vLLM runs, for the measured sets that time them.

    Not CostModel defaults for BF16: FP8 GEMMs (the defaults when ``dtype="fp8"``) and eager PyTorch's
    attention and elementwise kernels (LLMServingSim's profile; vLLM does not run them).
    """

    eta_compute_fp8: float  # fraction of FP8 peak FLOP/s in FP8 GEMMs
    eta_memory_fp8: float  # fraction of HBM bandwidth in FP8 GEMMs
    eager_eta_attn: float  # fraction of peak FLOP/s in eager attention (causal FLOPs counted)
    eager_eta_elementwise: float  # fraction of HBM bandwidth in eager norms, RoPE and SiLU (least traffic counted)


class Calibration(NamedTuple):
    """The fitted cost-model parameters and how well they reproduce each measured set."""

    eta_compute: float  # fraction of peak FLOP/s reached by GEMMs
    eta_memory: float  # fraction of HBM bandwidth reached streaming weights and KV
    eta_attn: float  # fraction of peak FLOP/s reached by prefill attention
    eta_elementwise: float  # fraction of HBM bandwidth reached by the norms, RoPE, SiLU-and-mul and add
    overhead_s: float  # seconds per step: the kernel floors of one Llama-3-8B forward pass
    allreduce_latency_s: float  # seconds of fixed latency per all-reduce
    own: OwnKernels  # FP8 GEMMs' and eager PyTorch's efficiencies
    floors: KernelFloors  # seconds per kernel, per harness
    errors: pd.DataFrame  # per set and split: median and worst relative error before and after

    def cost_model(self, hardware=None, model=None, dtype: str = "bf16", **changes) -> CostModel:
        """A :class:`CostModel` with these fitted values (H100 SXM and Llama-3-8B unless given).

        With ``dtype="fp8"`` the GEMM efficiencies are the FP8 ones (the CostModel's defaults are BF16's).
        """
        params = {k: getattr(self, k) for k in START}
        if dtype == "fp8":
            params.update(eta_compute=self.own.eta_compute_fp8, eta_memory=self.own.eta_memory_fp8)
        params.update(changes)
        return CostModel(hardware or get_hardware(HARDWARE), model or get_model(REFERENCE_MODEL), dtype=dtype, **params)


# -- where the measurements are ---------------------------------------------------------------------

def measured_dir(path=None) -> Path:
    """The measured-timings folder: ``path``, else ``$BATCHLAB_MEASURED_DIR``, else ``../shared/data/measured``.

    The default is relative to the repository. Raises ``FileNotFoundError`` saying what to set when the folder
    chosen does not hold the measured sets.
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


# -- operator work, counted by the CostModel's own constants ----------------------------------------

def _work(cost: CostModel, gemm_tokens=0.0, attn_work=0.0, kv_tokens=0.0, elementwise_tokens=0.0) -> dict:
    """FLOPs and bytes of the GEMM, attention and elementwise terms of ``sim._step_cost`` for one operator, per GPU.

    ``gemm_tokens`` rows through the weights (weights are read once if any), ``attn_work`` = sum c(2p + c) +
    2 sum l as in ``_step_cost``, ``kv_tokens`` = cached + new tokens whose KV is read or written,
    ``elementwise_tokens`` = tokens through the norms, RoPE and SiLU-and-mul.
    """
    coef = cost.coefficients()
    gemm_tokens = np.asarray(gemm_tokens, dtype=np.float64)
    return {
        "gemm_flops": coef[0] * gemm_tokens,
        "gemm_bytes": np.where(gemm_tokens > 0, coef[1], 0.0),
        "attn_flops": coef[2] * np.asarray(attn_work, dtype=np.float64),
        "attn_bytes": coef[3] * np.asarray(kv_tokens, dtype=np.float64),
        "elem_bytes": cost.elementwise_bytes_per_token * np.asarray(elementwise_tokens, dtype=np.float64),
        "peak_flops": cost.peak_flops,
        "hbm_bytes_per_s": cost.hardware.hbm_bytes_per_s,
    }


def _spec(name, params, d_model, heads, kv_heads, head_dim, d_ff=0, vocab=0, layers=1) -> ModelSpec:
    return ModelSpec(name=name, params=int(params), layers=layers, d_model=int(d_model), heads=int(heads),
                     kv_heads=int(kv_heads), head_dim=int(head_dim), d_ff=int(d_ff), vocab=int(vocab))


def _ideal(model: ModelSpec, dtype="bf16", tp=1) -> CostModel:
    return CostModel(get_hardware(HARDWARE), model, dtype=dtype, tp=int(tp)).ideal()


def _predict(cases: pd.DataFrame, etas: dict, floors: KernelFloors) -> np.ndarray:
    """Seconds per case: kernel floors plus the GEMM, attention and elementwise terms of ``sim._step_cost``.

    ``etas`` holds eta_compute, eta_memory, eta_attn and eta_elementwise (None: no elementwise term).
    """
    eta_c, eta_m, eta_a, eta_e = (etas[k] for k in ETA_FIELDS)
    peak, bw = cases["peak_flops"].to_numpy(), cases["hbm_bytes_per_s"].to_numpy()
    gemm = np.maximum(cases["gemm_flops"].to_numpy() / (eta_c * peak), cases["gemm_bytes"].to_numpy() / (eta_m * bw))
    attn = np.maximum(cases["attn_flops"].to_numpy() / (eta_a * peak), cases["attn_bytes"].to_numpy() / (eta_m * bw))
    elem = 0.0 if eta_e is None else cases["elem_bytes"].to_numpy() / (eta_e * bw)
    floor = cases["floor_kind"].map(floors._asdict()).fillna(0.0).to_numpy()
    return gemm + attn + elem + cases["n_kernels"].to_numpy() * floor


# -- the measured sets, as cases (descriptors, work, measured seconds) --------------------------------

@lru_cache(maxsize=4)
def _vidur_files(root: str) -> tuple[tuple[str, pd.DataFrame], ...]:
    """(model name, raw frame) of every vidur per-layer profile, read once for the GEMM and elementwise sets."""
    return tuple((path.parent.name, pd.read_csv(path))
                 for path in sorted(Path(root, "vidur_h100").glob("*/*/mlp.csv")))


@lru_cache(maxsize=4)
def _vidur_cases(root: str) -> pd.DataFrame:
    """vidur: one layer's four GEMMs (QKV, output, gate+up, down) vs tokens and TP, summed per layer.

    Shapes come from each file's own columns (n_embd, n_head, n_kv_head, n_expanded_embd, use_gated_mlp), so
    every model in the folder is used; biases (phi-2) are ignored. Attention is not in these files.
    """
    frames = []
    for name, raw in _vidur_files(root):
        for key, g in raw.groupby(["n_embd", "n_head", "n_kv_head", "n_expanded_embd", "use_gated_mlp",
                                   "vocab_size", "num_tensor_parallel_workers"]):
            d, heads, kv_heads, d_ff, gated, vocab, tp = key
            head_dim = d // heads
            params = (d * (heads + 2 * kv_heads) * head_dim + heads * head_dim * d
                      + (2 if gated else 1) * d * d_ff + d_ff * d)
            cost = _ideal(_spec(name, params, d, heads, kv_heads, head_dim, d_ff, vocab), tp=tp)
            tokens = g["num_tokens"].to_numpy(dtype=np.float64)
            measured = sum(g[f"time_stats.{op}.median"].to_numpy() for op in VIDUR_GEMM_OPS) * 1e-3
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
def _vidur_elementwise_cases(root: str) -> pd.DataFrame:
    """vidur: one layer's norms, RoPE, SiLU-and-mul and residual add (5 kernels) vs tokens and TP.

    The activation bytes are the CostModel's least traffic for that shape (``elementwise_bytes_per_token``).
    Only models of Llama's layout (two RMSNorms, gated MLP, full RoPE): phi-2, with one LayerNorm, a GELU MLP
    and partial RoPE, is left out.
    """
    frames = []
    for name, raw in _vidur_files(root):
        columns = [f"time_stats.{op}.median" for op in VIDUR_SMALL_OPS]
        if not set(columns) <= set(raw.columns) or not raw["use_gated_mlp"].all():
            continue
        for key, g in raw.groupby(["n_embd", "n_head", "n_kv_head", "n_expanded_embd", "num_tensor_parallel_workers"]):
            d, heads, kv_heads, d_ff, tp = key
            cost = _ideal(_spec(name, 0, d, heads, kv_heads, d // heads, d_ff), tp=tp)
            tokens = g["num_tokens"].to_numpy(dtype=np.float64)
            split = ("holdout_model" if name not in VIDUR_FIT_MODELS else
                     "holdout_tp" if tp not in VIDUR_FIT_TP else "fit")
            frames.append(pd.DataFrame({
                "set": "vidur_elementwise", "split": split, "model": name, "tp": int(tp), "tokens": tokens,
                "measured_s": sum(g[c].to_numpy() for c in columns) * 1e-3,
                "n_kernels": len(VIDUR_SMALL_OPS), "floor_kind": "elementwise_s",
                **_work(cost, elementwise_tokens=tokens),
            }))
    return pd.concat(frames, ignore_index=True)


@lru_cache(maxsize=4)
def _gemm_kernel_cases(root: str) -> pd.DataFrame:
    """inference-sim: single FP8 GEMMs (DeepGEMM, 1-byte weights, FP8 peak) of m tokens through a k x n weight."""
    raw = pd.read_csv(Path(root, "h100_kernels", "gemm", "h100", "data.csv"))
    frames = []
    for (k, n), g in raw.groupby(["k", "n"]):
        cost = _ideal(_spec(f"gemm-{k}x{n}", k * n, k, 1, 1, 1, n), dtype="fp8")
        m = g["m"].to_numpy(dtype=np.float64)
        frames.append(pd.DataFrame({
            "set": "gemm_kernels_fp8", "split": np.where(n != GEMM_FIT_N, "holdout_shape",
                                                         np.where(_bound(m, "fp8"), "fit", "ridge")),
            "m": m, "k": int(k), "n": int(n), "measured_s": g["latency_us"].to_numpy() * 1e-6,
            "n_kernels": 1, "floor_kind": "gemm_fp8_s", "kernels": "fp8", **_work(cost, gemm_tokens=m),
        }))
    return pd.concat(frames, ignore_index=True)


def _bound(tokens, dtype):
    """True where a GEMM of ``tokens`` rows is clearly memory- or compute-bound (away from the ridge)."""
    return (tokens <= MEMORY_BOUND_MAX_TOKENS) | (tokens >= COMPUTE_BOUND_MIN_TOKENS[dtype])


def _geometry(stem: str):
    parts = stem.split("-")
    heads, kv_heads, head_dim = (int(p) for p in parts[:3])
    tp = int(parts[3][2:]) if len(parts) > 3 else 1
    return heads, kv_heads, head_dim, tp


@lru_cache(maxsize=4)
def _decode_cases(root: str) -> pd.DataFrame:
    """inference-sim: one layer's decode attention (FlashInfer, BF16 KV) for ``batch`` sequences of ``kv_len``.

    Files are ``<q heads>-<kv heads>-<head dim>-tp<N>``; a GPU holds heads / N of them.
    """
    frames = []
    for path in sorted(Path(root, "h100_kernels", "mha", "decode", "h100").glob("*.csv")):
        raw = pd.read_csv(path)
        heads, kv_heads, head_dim, tp = _geometry(path.stem)
        cost = _ideal(_spec(path.stem, 0, heads * head_dim, heads, kv_heads, head_dim), tp=tp)
        b, ell = raw["batch_size"].to_numpy(dtype=np.float64), raw["kv_len"].to_numpy(dtype=np.float64)
        frames.append(pd.DataFrame({
            "set": "decode_attn", "split": "fit" if tp == DECODE_FIT_TP else "holdout_tp",
            "geometry": path.stem.rsplit("-tp", 1)[0], "tp": tp, "batch": b, "kv_len": ell,
            "measured_s": raw["latency_us"].to_numpy() * 1e-6, "n_kernels": 1, "floor_kind": "decode_attn_s",
            **_work(cost, attn_work=2 * b * ell, kv_tokens=b * ell + b),
        }))
    return pd.concat(frames, ignore_index=True)


@lru_cache(maxsize=4)
def _prefill_cases(root: str) -> pd.DataFrame:
    """inference-sim: one layer's causal prefill attention (FlashAttention-3, BF16) of one ``seq_len`` prompt."""
    frames = []
    for path in sorted(Path(root, "h100_kernels", "mha", "prefill", "h100").glob("*.csv")):
        raw = pd.read_csv(path)
        heads, kv_heads, head_dim, _ = _geometry(path.stem)
        cost = _ideal(_spec(path.stem, 0, heads * head_dim, heads, kv_heads, head_dim))
        c = raw["seq_len"].to_numpy(dtype=np.float64)
        frames.append(pd.DataFrame({
            "set": "prefill_attn", "split": "fit" if path.stem in PREFILL_FIT_GEOMETRIES else "holdout_geometry",
            "geometry": path.stem, "tokens": c, "measured_s": raw["latency_us"].to_numpy() * 1e-6,
            "n_kernels": 1, "floor_kind": "prefill_attn_s", **_work(cost, attn_work=c * c, kv_tokens=c),
        }))
    return pd.concat(frames, ignore_index=True)


@lru_cache(maxsize=4)
def _llmservingsim_raw(root: str) -> pd.DataFrame:
    raw = pd.read_csv(Path(root, "llmservingsim_h100", "Llama-3.1-8B", "tp1", "layers.csv"))
    if (raw["kv_cache"] != 0).any() or (raw["tp_size"] != 1).any():
        raise ValueError("LLMServingSim layers.csv: expected kv_cache == 0 and tp_size == 1 throughout")
    return raw.pivot_table(index="input", columns="layer_name", values="latency(ns)") * 1e-9


@lru_cache(maxsize=4)
def _llmservingsim_op_cases(root: str) -> pd.DataFrame:
    """LLMServingSim, Llama-3.1-8B, eager PyTorch: each GEMM and the attention of one layer vs prompt tokens."""
    table = _llmservingsim_raw(root)
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


def _llmservingsim_forward_s(root: str) -> pd.Series:
    """Measured seconds of a whole forward pass: embedding, 32 layers of every per-layer op, final norm, LM head."""
    table = _llmservingsim_raw(root)
    once = ["embedding", "final_layernorm", "lm_head"]
    per_layer = table.drop(columns=once).sum(axis=1)
    return table[once].sum(axis=1) + get_model(REFERENCE_MODEL).layers * per_layer


@lru_cache(maxsize=4)
def _allreduce_cases(root: str) -> pd.DataFrame:
    """vidur: NCCL all-reduce on one DGX H100 (NVSwitch) vs message bytes and GPUs (rank 0's median)."""
    raw = pd.read_csv(Path(root, "vidur_h100", "network", "h100_dgx", "all_reduce.csv"), index_col=0)
    raw = raw[raw["rank"] == 0]
    frames = []
    for workers, g in raw.groupby("num_workers"):
        frames.append(pd.DataFrame({
            "set": "allreduce", "split": "fit" if workers in ALLREDUCE_FIT_WORKERS else "holdout_workers",
            "workers": int(workers), "size_bytes": g["size"].to_numpy(dtype=np.float64),
            "measured_s": g["time_stats.all_reduce.median"].to_numpy() * 1e-3,
        }))
    return pd.concat(frames, ignore_index=True)


def _allreduce_predict(cases: pd.DataFrame, cost: CostModel) -> np.ndarray:
    """Seconds of one all-reduce: the per-layer comm term of ``CostModel.coefficients`` for that message, halved.

    A one-layer model with d_model = bytes / 2 (BF16 activations) makes coef[10] + coef[11] the time of the two
    all-reduces of one layer for one token: 2 (latency + 2 (t - 1) / t * bytes / interconnect).
    """
    out = np.empty(len(cases))
    for i, (workers, nbytes) in enumerate(zip(cases["workers"], cases["size_bytes"])):
        spec = _spec("allreduce", 0, nbytes // 2, 1, 1, 1)
        coef = cost.replace(model=spec, tp=int(workers)).coefficients()
        out[i] = (coef[10] + coef[11]) / 2
    return out


# -- public loaders: tidy frames of measured vs predicted -------------------------------------------

# Sets timed with kernels other than vLLM's BF16 ones are predicted twice: with their own efficiencies (the
# set itself) and with the CostModel's BF16 ones (a diagnostic set under this name, which shows the gap).
DIAGNOSTIC_SETS = {"gemm_kernels_fp8": "gemm_kernels_fp8_bf16_eta",
                   "llmservingsim_attn": "llmservingsim_attn_vllm_eta",
                   "llmservingsim_elementwise": "llmservingsim_elementwise_vllm_eta"}
_VLLM_FLOOR = {"eager_attn_s": "prefill_attn_s", "eager_elementwise_s": "elementwise_s"}


def _check_hardware(cost: CostModel):
    if cost.hardware.name != HARDWARE:
        raise ValueError(f"the measured sets are {HARDWARE}; got a CostModel for {cost.hardware.name!r}")


def _etas(cost: CostModel, kernels: str, own: OwnKernels | None) -> dict:
    """The efficiencies that predict a case timed with ``kernels`` ("vllm", "fp8" or "eager")."""
    etas = cost_etas(cost)
    if own is not None and kernels == "fp8":
        etas.update(eta_compute=own.eta_compute_fp8, eta_memory=own.eta_memory_fp8)
    if own is not None and kernels == "eager":
        etas.update(eta_attn=own.eager_eta_attn, eta_elementwise=own.eager_eta_elementwise)
    return etas


def cost_etas(cost: CostModel) -> dict:
    """``cost``'s efficiencies by field name (:data:`ETA_FIELDS`)."""
    return {k: getattr(cost, k) for k in ETA_FIELDS}


def _with_prediction(cases: pd.DataFrame, cost: CostModel, floors: KernelFloors,
                     own: OwnKernels | None = None) -> pd.DataFrame:
    """``cases`` with ``predicted_s``; each case with its own kernels' efficiencies when ``own`` is given.

    Sets in :data:`DIAGNOSTIC_SETS` come back a second time under their diagnostic name, predicted with
    ``cost``'s BF16 efficiencies and vLLM's kernel floors.
    """
    _check_hardware(cost)
    out = cases.copy()
    if "kernels" not in out:
        out["kernels"] = "vllm"
    out["kernels"] = out["kernels"].fillna("vllm")
    diag = out[out["set"].isin(list(DIAGNOSTIC_SETS))].copy()
    diag["set"] = diag["set"].map(DIAGNOSTIC_SETS)
    diag["floor_kind"] = diag["floor_kind"].replace(_VLLM_FLOOR)
    diag["kernels"] = "vllm"
    out = pd.concat([out, diag], ignore_index=True)
    out["predicted_s"] = np.nan
    for kernels, rows in out.groupby("kernels").groups.items():
        out.loc[rows, "predicted_s"] = _predict(out.loc[rows], _etas(cost, kernels, own), floors)
    return out.drop(columns=["gemm_flops", "gemm_bytes", "attn_flops", "attn_bytes", "elem_bytes", "peak_flops",
                             "hbm_bytes_per_s", "n_kernels", "floor_kind", "kernels"])


def load_vidur_gemm(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS) -> pd.DataFrame:
    """vidur's per-layer GEMM time (4 kernels) vs ``tokens`` and ``tp``, for six models, with predictions.

    ``cost`` supplies the efficiencies (its model and TP are replaced by each case's); ``floors`` adds the
    fixed time per kernel (zero by default: the CostModel alone). Columns: set, split, model, tp, tokens,
    measured_s, predicted_s.
    """
    return _with_prediction(_vidur_cases(str(measured_dir(root))), cost, floors)


def load_vidur_elementwise(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS) -> pd.DataFrame:
    """vidur's per-layer norms, RoPE, SiLU-and-mul and add (5 kernels) vs ``tokens`` and ``tp``, five models.

    Predicted with ``cost.eta_elementwise`` (``None``, DESIGN's formula, predicts only the floors).
    """
    return _with_prediction(_vidur_elementwise_cases(str(measured_dir(root))), cost, floors)


def load_gemm_kernels(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS,
                      own: OwnKernels | None = None) -> pd.DataFrame:
    """FP8 GEMM kernel latency vs m, k, n (weights 1 byte, FP8 peak), with predictions. Seconds.

    Set ``gemm_kernels_fp8`` uses ``own``'s FP8 efficiencies (``cost``'s when ``own`` is None), set
    ``gemm_kernels_fp8_bf16_eta`` always ``cost``'s.
    """
    return _with_prediction(_gemm_kernel_cases(str(measured_dir(root))), cost, floors, own)


def load_decode_attention(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS) -> pd.DataFrame:
    """Decode-attention kernel latency vs geometry, tp, batch and kv_len, with predictions. Seconds."""
    return _with_prediction(_decode_cases(str(measured_dir(root))), cost, floors)


def load_prefill_attention(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS) -> pd.DataFrame:
    """Prefill-attention kernel latency vs geometry and tokens (one prompt), with predictions. Seconds."""
    return _with_prediction(_prefill_cases(str(measured_dir(root))), cost, floors)


def load_llmservingsim(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS,
                       own: OwnKernels | None = None) -> pd.DataFrame:
    """LLMServingSim's Llama-3.1-8B profile (eager PyTorch, TP 1, no cached tokens), per operator and whole. Seconds.

    ``llmservingsim_gemm``: each GEMM (q, k, v, o, gate, up, down, LM head) per operator, with ``cost``'s
    efficiencies (the same cuBLAS kernels vLLM runs). ``llmservingsim_attn`` and ``llmservingsim_elementwise``:
    one layer's attention, and its two RMSNorms, RoPE and SiLU, with eager PyTorch's own efficiencies from
    ``own`` (``cost``'s when None), and again with ``cost``'s under the names of :data:`DIAGNOSTIC_SETS`.
    ``llmservingsim_step``: the whole forward pass (embedding, 32 layers of every op, final norm, LM head over
    all tokens) against ``CostModel.prefill_time`` of Llama-3-8B with ``cost``'s efficiencies and overheads,
    i.e. exactly what the simulator charges for that step, eager kernels or not.
    """
    root = str(measured_dir(root))
    ops = _with_prediction(_llmservingsim_op_cases(root), cost, floors, own)
    forward = _llmservingsim_forward_s(root)
    step_cost = cost.replace(model=get_model(REFERENCE_MODEL), dtype="bf16", kv_dtype="bf16", tp=1)
    step = pd.DataFrame({
        "set": "llmservingsim_step", "split": "holdout_source", "op": "forward", "tokens": forward.index.to_numpy(dtype=np.float64),
        "measured_s": forward.to_numpy(), "predicted_s": [step_cost.prefill_time(int(t)) for t in forward.index],
    })
    return pd.concat([ops, step], ignore_index=True)


def load_allreduce(cost: CostModel, root=None) -> pd.DataFrame:
    """NCCL all-reduce time vs workers and size_bytes on a DGX H100, with the CostModel's comm prediction."""
    _check_hardware(cost)
    cases = _allreduce_cases(str(measured_dir(root)))
    return cases.assign(predicted_s=_allreduce_predict(cases, cost))


def load_all(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS, own: OwnKernels | None = None) -> pd.DataFrame:
    """Every measured set, one tidy frame: set, split, case descriptors, measured_s, predicted_s.

    ``own`` gives the efficiencies of the kernels that are not vLLM's BF16 ones (FP8 GEMMs, eager PyTorch);
    without it ``cost``'s apply everywhere, as for DESIGN's starting values.
    """
    parts = [load_vidur_gemm(cost, root, floors), load_vidur_elementwise(cost, root, floors),
             load_gemm_kernels(cost, root, floors, own), load_decode_attention(cost, root, floors),
             load_prefill_attention(cost, root, floors), load_llmservingsim(cost, root, floors, own),
             load_allreduce(cost, root)]
    return pd.concat(parts, ignore_index=True)


# -- errors ------------------------------------------------------------------------------------------

def relative_errors(frame: pd.DataFrame) -> pd.DataFrame:
    """Per set and per split (then the whole set, split ``all``): cases, median and worst |predicted / measured - 1|.

    The acceptance target (median at most 15 %) is per set, on the ``all`` rows; the sets named in
    :data:`DIAGNOSTIC_SETS`'s values are diagnostics, not targets.
    """
    rel = (frame["predicted_s"] / frame["measured_s"] - 1.0).abs()
    rows = []
    for name, per_set in rel.groupby(frame["set"], sort=False):
        splits = frame.loc[per_set.index, "split"]
        order = sorted(splits.unique(), key=lambda k: (k != "fit", k != "ridge", k))
        parts = [(k, per_set[splits == k]) for k in order] + [("all", per_set)]
        rows += [{"set": name, "split": k, "cases": len(v), "median_rel_err": float(v.median()),
                  "worst_rel_err": float(v.max())} for k, v in parts]
    return pd.DataFrame(rows)


def evaluate(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS, own: OwnKernels | None = None) -> pd.DataFrame:
    """Median and worst relative error of ``cost`` on every measured set (and split: fit or held out).

    ``floors`` are the per-kernel times the CostModel does not have and ``own`` the efficiencies of FP8 and
    eager kernels; pass ``Calibration.floors`` and ``Calibration.own`` to evaluate the per-operator sets the
    way they were fitted. The ``llmservingsim_step`` set uses ``cost`` alone.
    """
    return relative_errors(load_all(cost, root, floors, own))


# -- the fit -----------------------------------------------------------------------------------------

ROBUST_SCALE = 0.05  # log-error beyond which a residual counts linearly, not quadratically (about 5 %)
_US = 1e-6  # floors and latencies are fitted in microseconds so every parameter is of order one
_FLOOR_UPPER_US = 200.0


def _soft_l1(r, scale=ROBUST_SCALE):
    """Residuals whose squares sum to scipy's ``soft_l1`` loss of ``r`` (applied before the per-set weights)."""
    return np.sign(r) * scale * np.sqrt(2.0 * (np.sqrt(1.0 + (r / scale) ** 2) - 1.0))


def _fit_kernels(cases: pd.DataFrame, free: tuple[str, ...], floor_kinds: tuple[str, ...], fixed: dict = START):
    """Least squares on log(predicted / measured) over ``cases``, every set weighted equally.

    ``free`` names the efficiencies fitted (the others keep their value in ``fixed``); ``floor_kinds`` the
    kernel floors fitted (others zero). Returns ({efficiency: value}, KernelFloors).
    """
    measured = cases["measured_s"].to_numpy()
    weight = 1.0 / np.sqrt(cases.groupby("set")["set"].transform("size").to_numpy())
    n_eta = len(free)

    def unpack(x):
        etas = dict(fixed, **dict(zip(free, x[:n_eta])))
        floors = NO_FLOORS._replace(**{k: v * _US for k, v in zip(floor_kinds, x[n_eta:])})
        return etas, floors

    def residuals(x):
        etas, floors = unpack(x)
        return weight * _soft_l1(np.log(_predict(cases, etas, floors) / measured))

    x0 = [_ETA_X0 if fixed.get(k) is None else fixed[k] for k in free] + [1.0] * len(floor_kinds)
    bounds = ([0.02] * n_eta + [0.0] * len(floor_kinds), [1.0] * n_eta + [_FLOOR_UPPER_US] * len(floor_kinds))
    res = least_squares(residuals, x0, bounds=bounds, method="trf")
    if not res.success:
        raise RuntimeError(f"calibration fit did not converge: {res.message}")
    etas, floors = unpack(res.x)
    return {k: float(etas[k]) for k in free}, KernelFloors(*(float(v) for v in floors))


def _fit_allreduce(cases: pd.DataFrame, cost: CostModel) -> float:
    """The latency that, with the CostModel's own bandwidth term, best matches the all-reduce times."""
    measured = cases["measured_s"].to_numpy()
    bw_part = _allreduce_predict(cases, cost.replace(allreduce_latency_s=0.0))

    def residuals(x):
        return _soft_l1(np.log((bw_part + x[0] * _US) / measured))

    res = least_squares(residuals, [10.0], bounds=([0.0], [1000.0]))
    return float(res.x[0] * _US)


def _error_table(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    merged = before.merge(after, on=["set", "split", "cases"], suffixes=("_before", "_after"))
    return merged[list(ERROR_COLUMNS)]


def _fit_split(cases: pd.DataFrame) -> pd.DataFrame:
    return cases[cases["split"] == "fit"]


def fit_eager(root=None, max_tokens: int = EAGER_FIT_MAX_TOKENS, cost: CostModel | None = None):
    """Eager PyTorch's attention and elementwise efficiencies and floors, from LLMServingSim's profile.

    Fitted on prompts of at most ``max_tokens`` tokens; ``cost`` holds the other efficiencies (the
    CostModel's defaults when None). Returns ({"eta_attn": ..., "eta_elementwise": ...}, KernelFloors with
    only the two eager floors set).
    """
    cases = _llmservingsim_op_cases(str(measured_dir(root)))
    cases = cases[(cases["kernels"] == "eager") & (cases["tokens"] <= max_tokens)]
    cost = cost or CostModel(get_hardware(HARDWARE), get_model(REFERENCE_MODEL))
    return _fit_kernels(cases, ("eta_attn", "eta_elementwise"), ("eager_attn_s", "eager_elementwise_s"),
                        cost_etas(cost))


def fit(root=None) -> Calibration:
    """Fit efficiencies, kernel floors, the per-step overhead and the all-reduce latency to the measured sets.

    The training split of each set is described in the module docstring. ``overhead_s`` is not a free
    parameter: it is what the fitted per-kernel floors add to one step of the reference model, 32 layers x
    (4 GEMM floors + 1 decode-attention floor + 5 elementwise floors).

    FP8 GEMMs and eager PyTorch's attention and elementwise kernels get their own efficiencies
    (:class:`OwnKernels`): FP8's are the CostModel's defaults when ``dtype="fp8"``; eager PyTorch's are not
    CostModel defaults (vLLM runs neither kernel) and describe LLMServingSim's profile, fitted on prompts up to
    1,536 tokens and checked on longer ones. The diagnostic sets show each of them under the BF16 defaults.
    """
    root = str(measured_dir(root))
    vllm = pd.concat([_vidur_cases(root), _decode_cases(root), _prefill_cases(root), _vidur_elementwise_cases(root)],
                     ignore_index=True)
    etas, floors = _fit_kernels(_fit_split(vllm), ETA_FIELDS, ("gemm_s", "decode_attn_s", "prefill_attn_s",
                                                                "elementwise_s"))
    hw, model = get_hardware(HARDWARE), get_model(REFERENCE_MODEL)
    overhead_s = model.layers * (len(VIDUR_GEMM_OPS) * floors.gemm_s + floors.decode_attn_s
                                 + len(VIDUR_SMALL_OPS) * floors.elementwise_s)
    after = CostModel(hw, model, overhead_s=overhead_s, **etas)

    fp8_etas, fp8_floors = _fit_kernels(_fit_split(_gemm_kernel_cases(root)), ("eta_compute", "eta_memory"),
                                        ("gemm_fp8_s",), cost_etas(after))
    eager_etas, eager_floors = fit_eager(root, cost=after)
    floors = floors._replace(gemm_fp8_s=fp8_floors.gemm_fp8_s, eager_attn_s=eager_floors.eager_attn_s,
                             eager_elementwise_s=eager_floors.eager_elementwise_s)
    own = OwnKernels(fp8_etas["eta_compute"], fp8_etas["eta_memory"], eager_etas["eta_attn"],
                     eager_etas["eta_elementwise"])

    ar = _allreduce_cases(root)
    after = after.replace(allreduce_latency_s=_fit_allreduce(_fit_split(ar), after))
    before = CostModel(hw, model, **START)

    errors = _error_table(evaluate(before, root), evaluate(after, root, floors, own))
    return Calibration(after.eta_compute, after.eta_memory, after.eta_attn, after.eta_elementwise, after.overhead_s,
                       after.allreduce_latency_s, own, floors, errors)


# -- files -------------------------------------------------------------------------------------------

FIT_NOTES = {
    "eta_compute": "vidur_h100 Llama-2-7B/70B per-layer BF16 GEMMs at TP 1-2, >= 1024 tokens",
    "eta_memory": "same vidur GEMMs at <= 64 tokens (weight streaming) + h100_kernels decode attention at TP 1 (KV reads)",
    "eta_attn": "h100_kernels prefill attention, geometries 32-8-128, 64-8-128, 40-40-128",
    "eta_elementwise": "vidur_h100 Llama-2-7B/70B per-layer norms, RoPE, SiLU-and-mul and add at TP 1-2",
    "overhead_s": "derived: 32 layers (Llama-3-8B) x (4 x kernel_floor_gemm_s + kernel_floor_decode_attn_s + 5 x kernel_floor_elementwise_s)",
    "allreduce_latency_s": "vidur_h100 network/h100_dgx all_reduce, 2 and 8 GPUs, bandwidth term at the preset's 450 GB/s",
    "eta_compute_fp8": "h100_kernels FP8 GEMMs with n=6144, m >= 4096 (the CostModel default when dtype='fp8')",
    "eta_memory_fp8": "h100_kernels FP8 GEMMs with n=6144, m <= 64 (the CostModel default when dtype='fp8')",
    "eager_eta_attn": "llmservingsim_h100 Llama-3.1-8B eager attention, <= 1024 tokens (eager PyTorch only; not a CostModel default)",
    "eager_eta_elementwise": "llmservingsim_h100 Llama-3.1-8B eager norms, RoPE and SiLU, <= 1024 tokens (eager PyTorch only; not a CostModel default)",
    "kernel_floor_gemm_s": "vidur_h100 per-layer GEMMs, fitted with eta_memory (per kernel; not a CostModel field)",
    "kernel_floor_gemm_fp8_s": "h100_kernels FP8 GEMMs (per kernel; not a CostModel field)",
    "kernel_floor_decode_attn_s": "h100_kernels decode attention at TP 1 (per kernel; not a CostModel field)",
    "kernel_floor_prefill_attn_s": "h100_kernels prefill attention (per kernel; not a CostModel field)",
    "kernel_floor_elementwise_s": "vidur_h100 per-layer norms, RoPE, SiLU-and-mul and add (per kernel; not a CostModel field)",
    "kernel_floor_eager_attn_s": "llmservingsim_h100 eager attention (per kernel; not a CostModel field)",
    "kernel_floor_eager_elementwise_s": "llmservingsim_h100 eager norms, RoPE and SiLU (per kernel; not a CostModel field)",
}


def parameter_table(cal: Calibration) -> pd.DataFrame:
    """One row per fitted value: name, value, unit, fitted_on (the rows of ``data/calibration.csv``)."""
    values = {
        "eta_compute": (cal.eta_compute, "fraction of peak FLOP/s"),
        "eta_memory": (cal.eta_memory, "fraction of HBM bandwidth"),
        "eta_attn": (cal.eta_attn, "fraction of peak FLOP/s"),
        "eta_elementwise": (cal.eta_elementwise, "fraction of HBM bandwidth"),
        "overhead_s": (cal.overhead_s, "s per step"),
        "allreduce_latency_s": (cal.allreduce_latency_s, "s per all-reduce"),
        "eta_compute_fp8": (cal.own.eta_compute_fp8, "fraction of FP8 peak FLOP/s"),
        "eta_memory_fp8": (cal.own.eta_memory_fp8, "fraction of HBM bandwidth"),
        "eager_eta_attn": (cal.own.eager_eta_attn, "fraction of peak FLOP/s"),
        "eager_eta_elementwise": (cal.own.eager_eta_elementwise, "fraction of HBM bandwidth"),
        **{f"kernel_floor_{k}": (v, "s per kernel") for k, v in cal.floors._asdict().items()},
    }
    return pd.DataFrame([{"name": k, "value": float(f"{v:.6g}"), "unit": u, "fitted_on": FIT_NOTES[k]}
                         for k, (v, u) in values.items()])


def main(argv=None) -> int:
    """Refit against the measured sets and write ``data/calibration.csv`` and ``data/calibration_errors.csv``."""
    argv = sys.argv[1:] if argv is None else argv
    cal = fit(argv[0] if argv else None)
    params = parameter_table(cal)
    params.to_csv(DATA_DIR / "calibration.csv", index=False)
    cal.errors.round(4).to_csv(DATA_DIR / "calibration_errors.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(params[["name", "value", "unit"]].to_string(index=False, formatters={"value": "{:.6g}".format}))
        print()
        print(cal.errors.round(3).to_string(index=False))
    print(f"\nwrote {DATA_DIR / 'calibration.csv'} and {DATA_DIR / 'calibration_errors.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
