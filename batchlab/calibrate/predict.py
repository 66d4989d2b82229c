"""Predict every measured case with a CostModel (plus kernel floors), and the errors of those predictions.

The public loaders return tidy frames of measured against predicted seconds, one per measured set; ``root``
None reads the compact table in ``data/``, a folder the raw files there (:mod:`batchlab.calibrate.readers`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from ..cost import SERVING_FIELDS, CostModel
from ..models import get_model
from . import cases as c
from .readers import HARDWARE, REFERENCE_MODEL, _llmservingsim_forward, source_key

# DESIGN section 3's starting values: the "before" of every error table.
START = {"eta_compute": 0.6, "eta_memory": 0.8, "eta_attn": 0.5, "eta_elementwise": None, "overhead_s": 1e-3,
         "allreduce_latency_s": 0.0}  # eta_elementwise None: DESIGN's formula has no elementwise term
ETA_FIELDS = ("eta_compute", "eta_memory", "eta_attn", "eta_elementwise")  # the CostModel's efficiencies

# Sets timed with kernels other than vLLM's BF16 ones are predicted twice: with their own efficiencies (the
# set itself) and with the CostModel's BF16 ones (a diagnostic set under this name, which shows the gap).
DIAGNOSTIC_SETS = {"gemm_kernels_fp8": "gemm_kernels_fp8_bf16_eta",
                   "llmservingsim_attn": "llmservingsim_attn_vllm_eta",
                   "llmservingsim_elementwise": "llmservingsim_elementwise_vllm_eta"}
_VLLM_FLOOR = {"eager_attn_s": "prefill_attn_s", "eager_elementwise_s": "elementwise_s"}
_WORK_COLUMNS = ["gemm_flops", "gemm_bytes", "attn_flops", "attn_bytes", "elem_bytes", "peak_flops",
                 "hbm_bytes_per_s", "n_kernels", "floor_kind", "kernels"]


class KernelFloors(NamedTuple):
    """Fixed seconds per kernel launch, per measuring harness (not a CostModel field; see the package notes)."""

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


def cost_etas(cost: CostModel) -> dict:
    """``cost``'s efficiencies by field name (:data:`ETA_FIELDS`)."""
    return {k: getattr(cost, k) for k in ETA_FIELDS}


def _predict(cases: pd.DataFrame, etas: dict, floors: KernelFloors) -> np.ndarray:
    """Seconds per case: kernel floors plus the GEMM, attention and elementwise terms of ``_kernels.step_cost``.

    ``etas`` holds eta_compute, eta_memory, eta_attn and eta_elementwise (None: no elementwise term).
    """
    eta_c, eta_m, eta_a, eta_e = (etas[k] for k in ETA_FIELDS)
    peak, bw = cases["peak_flops"].to_numpy(), cases["hbm_bytes_per_s"].to_numpy()
    gemm = np.maximum(cases["gemm_flops"].to_numpy() / (eta_c * peak), cases["gemm_bytes"].to_numpy() / (eta_m * bw))
    attn = np.maximum(cases["attn_flops"].to_numpy() / (eta_a * peak), cases["attn_bytes"].to_numpy() / (eta_m * bw))
    elem = 0.0 if eta_e is None else cases["elem_bytes"].to_numpy() / (eta_e * bw)
    floor = cases["floor_kind"].map(floors._asdict()).fillna(0.0).to_numpy()
    return gemm + attn + elem + cases["n_kernels"].to_numpy() * floor


def _allreduce_predict(cases: pd.DataFrame, cost: CostModel) -> np.ndarray:
    """Seconds of one all-reduce: the per-layer comm term of ``CostModel.coefficients`` for that message, halved.

    A one-layer model with d_model = bytes / 2 (BF16 activations) makes the comm slots per token and per step
    together the time of the two all-reduces of one layer for one token: 2 (latency + 2 (t - 1) / t * bytes /
    interconnect).
    """
    out = np.empty(len(cases))
    for i, (workers, nbytes) in enumerate(zip(cases["workers"], cases["size_bytes"])):
        spec = c._spec("allreduce", 0, nbytes // 2, 1, 1, 1)
        coef = cost.replace(model=spec, tp=int(workers)).named_coefficients()
        out[i] = (coef["comm_s_per_token"] + coef["comm_s_per_step"]) / 2
    return out


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
    return out.drop(columns=_WORK_COLUMNS)


# -- public loaders: tidy frames of measured vs predicted -------------------------------------------

def load_vidur_gemm(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS) -> pd.DataFrame:
    """vidur's per-layer GEMM time (4 kernels) vs ``tokens`` and ``tp``, for six models, with predictions.

    ``cost`` supplies the efficiencies (its model and TP are replaced by each case's); ``floors`` adds the
    fixed time per kernel (zero by default: the CostModel alone). Columns: set, split, model, tp, tokens,
    measured_s, predicted_s.
    """
    return _with_prediction(c.vidur_gemm_cases(source_key(root)), cost, floors)


def load_vidur_elementwise(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS) -> pd.DataFrame:
    """vidur's per-layer norms, RoPE, SiLU-and-mul and add (5 kernels) vs ``tokens`` and ``tp``, five models.

    Predicted with ``cost.eta_elementwise`` (``None``, DESIGN's formula, predicts only the floors).
    """
    return _with_prediction(c.vidur_elementwise_cases(source_key(root)), cost, floors)


def load_gemm_kernels(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS,
                      own: OwnKernels | None = None) -> pd.DataFrame:
    """FP8 GEMM kernel latency vs m, k, n (weights 1 byte, FP8 peak), with predictions. Seconds.

    Set ``gemm_kernels_fp8`` uses ``own``'s FP8 efficiencies (``cost``'s when ``own`` is None), set
    ``gemm_kernels_fp8_bf16_eta`` always ``cost``'s.
    """
    return _with_prediction(c.gemm_kernel_cases(source_key(root)), cost, floors, own)


def load_decode_attention(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS) -> pd.DataFrame:
    """Decode-attention kernel latency vs geometry, tp, batch and kv_len, with predictions. Seconds."""
    return _with_prediction(c.decode_cases(source_key(root)), cost, floors)


def load_prefill_attention(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS) -> pd.DataFrame:
    """Prefill-attention kernel latency vs geometry and tokens (one prompt), with predictions. Seconds."""
    return _with_prediction(c.prefill_cases(source_key(root)), cost, floors)


def load_llmservingsim(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS,
                       own: OwnKernels | None = None) -> pd.DataFrame:
    """LLMServingSim's Llama-3.1-8B profile (eager PyTorch, TP 1, no cached tokens), per operator and whole. Seconds.

    ``llmservingsim_gemm``: each GEMM (q, k, v, o, gate, up, down, LM head) per operator, with ``cost``'s
    efficiencies (the same cuBLAS kernels vLLM runs). ``llmservingsim_attn`` and ``llmservingsim_elementwise``:
    one layer's attention, and its two RMSNorms, RoPE and SiLU, with eager PyTorch's own efficiencies from
    ``own`` (``cost``'s when None), and again with ``cost``'s under the names of :data:`DIAGNOSTIC_SETS`.
    ``llmservingsim_step``: the whole forward pass (embedding, 32 layers of every op, final norm, LM head over
    all tokens) against what ``CostModel.prefill_time`` of Llama-3-8B charges for that step with the LM head
    over every token, as the profile ran it, and eager PyTorch's attention and elementwise efficiencies from
    ``own`` (``cost``'s when None).
    """
    key = source_key(root)
    ops = _with_prediction(c.llmservingsim_op_cases(key), cost, floors, own)
    forward = _llmservingsim_forward(key)
    step_cost = cost.replace(model=get_model(REFERENCE_MODEL), dtype="bf16", kv_dtype="bf16", tp=1)
    if own is not None:  # the kernels the profile ran
        step_cost = step_cost.replace(eta_attn=own.eager_eta_attn, eta_elementwise=own.eager_eta_elementwise)
    step = pd.DataFrame({
        "set": "llmservingsim_step", "split": "holdout_source", "op": "forward",
        "tokens": forward.index.to_numpy(dtype=np.float64), "measured_s": forward.to_numpy(),
        "predicted_s": [_eager_forward_s(step_cost, int(t)) for t in forward.index],
    })
    return pd.concat([ops, step], ignore_index=True)


def _eager_forward_s(cost: CostModel, tokens: int) -> float:
    """What ``cost`` charges for a prompt of ``tokens`` alone, with the LM head over every token, as the eager
    profile ran it (vLLM runs it on the one row that samples; ``CostModel.prefill_time`` charges that)."""
    cost = cost.replace(**dict.fromkeys(SERVING_FIELDS, 0.0))  # GPU time only, as the profile timed it
    rows = cost.step_breakdown(prefill_chunks=[(tokens, 0)])
    m = cost.model
    lm_all = max(2.0 * m.embedding_params * tokens / (cost.eta_compute * cost.hardware.peak_flops("bf16")),
                 cost.lm_head_bytes / (cost.eta_memory * cost.hardware.hbm_bytes_per_s))
    return rows.total_s - rows.lm_head_s + lm_all


def load_allreduce(cost: CostModel, root=None) -> pd.DataFrame:
    """NCCL all-reduce time vs workers and size_bytes on a DGX H100, with the CostModel's comm prediction."""
    _check_hardware(cost)
    cases = c.allreduce_cases(source_key(root))
    return cases.assign(predicted_s=_allreduce_predict(cases, cost))


def load_all(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS,
             own: OwnKernels | None = None) -> pd.DataFrame:
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


def evaluate(cost: CostModel, root=None, floors: KernelFloors = NO_FLOORS,
             own: OwnKernels | None = None) -> pd.DataFrame:
    """Median and worst relative error of ``cost`` on every measured set (and split: fit or held out).

    ``floors`` are the per-kernel times the CostModel does not have and ``own`` the efficiencies of FP8 and
    eager kernels; pass ``Calibration.floors`` and ``Calibration.own`` to evaluate the per-operator sets the
    way they were fitted; the ``llmservingsim_step`` set takes eager PyTorch's efficiencies from ``own`` too.
    """
    return relative_errors(load_all(cost, root, floors, own))
