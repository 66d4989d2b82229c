"""The fit: efficiencies, kernel floors, the per-step overhead and the all-reduce latency (package notes)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from ..cost import CostModel
from ..hardware import get_hardware
from ..models import get_model
from . import cases as c
from .predict import (ETA_FIELDS, NO_FLOORS, START, KernelFloors, OwnKernels, _allreduce_predict, _predict, cost_etas,
                      evaluate)
from .readers import HARDWARE, REFERENCE_MODEL, VIDUR_GEMM_OPS, VIDUR_SMALL_OPS, source_key

ERROR_COLUMNS = ("set", "split", "cases", "median_rel_err_before", "worst_rel_err_before",
                 "median_rel_err_after", "worst_rel_err_after")
ROBUST_SCALE = 0.05  # log-error beyond which a residual counts linearly, not quadratically (about 5 %)
_ETA_X0 = 0.5  # where the fit starts an efficiency that has no starting value
_US = 1e-6  # floors and latencies are fitted in microseconds so every parameter is of order one
_FLOOR_UPPER_US = 200.0


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


def fit_eager(root=None, max_tokens: int = c.EAGER_FIT_MAX_TOKENS, cost: CostModel | None = None):
    """Eager PyTorch's attention and elementwise efficiencies and floors, from LLMServingSim's profile.

    Fitted on prompts of at most ``max_tokens`` tokens; ``cost`` holds the other efficiencies (the
    CostModel's defaults when None). ``root`` None reads the compact table in ``data/``, a folder the raw files.
    Returns ({"eta_attn": ..., "eta_elementwise": ...}, KernelFloors with only the two eager floors set).
    """
    cases = c.llmservingsim_op_cases(source_key(root))
    cases = cases[(cases["kernels"] == "eager") & (cases["tokens"] <= max_tokens)]
    cost = cost or CostModel(get_hardware(HARDWARE), get_model(REFERENCE_MODEL))
    return _fit_kernels(cases, ("eta_attn", "eta_elementwise"), ("eager_attn_s", "eager_elementwise_s"),
                        cost_etas(cost))


def fit(root=None) -> Calibration:
    """Fit efficiencies, kernel floors, the per-step overhead and the all-reduce latency to the measured sets.

    ``root`` None reads the compact table in ``data/``; a folder reads the raw public files there (the same
    numbers, so the same fit). The training split of each set is described in the package notes.
    ``overhead_s`` is not a free parameter: it is what the fitted per-kernel floors add to one step of the
    reference model, 32 layers x (4 GEMM floors + 1 decode-attention floor + 5 elementwise floors).

    FP8 GEMMs and eager PyTorch's attention and elementwise kernels get their own efficiencies
    (:class:`OwnKernels`): FP8's are the CostModel's defaults when ``dtype="fp8"``; eager PyTorch's are not
    CostModel defaults (vLLM runs neither kernel) and describe LLMServingSim's profile, fitted on prompts up to
    1,536 tokens and checked on longer ones. The diagnostic sets show each of them under the BF16 defaults.
    """
    key = source_key(root)
    vllm = pd.concat([c.vidur_gemm_cases(key), c.decode_cases(key), c.prefill_cases(key),
                      c.vidur_elementwise_cases(key)], ignore_index=True)
    etas, floors = _fit_kernels(_fit_split(vllm), ETA_FIELDS, ("gemm_s", "decode_attn_s", "prefill_attn_s",
                                                                "elementwise_s"))
    hw, model = get_hardware(HARDWARE), get_model(REFERENCE_MODEL)
    overhead_s = model.layers * (len(VIDUR_GEMM_OPS) * floors.gemm_s + floors.decode_attn_s
                                 + len(VIDUR_SMALL_OPS) * floors.elementwise_s)
    after = CostModel(hw, model, overhead_s=overhead_s, **etas)

    fp8_etas, fp8_floors = _fit_kernels(_fit_split(c.gemm_kernel_cases(key)), ("eta_compute", "eta_memory"),
                                        ("gemm_fp8_s",), cost_etas(after))
    eager_etas, eager_floors = fit_eager(root, cost=after)
    floors = floors._replace(gemm_fp8_s=fp8_floors.gemm_fp8_s, eager_attn_s=eager_floors.eager_attn_s,
                             eager_elementwise_s=eager_floors.eager_elementwise_s)
    own = OwnKernels(fp8_etas["eta_compute"], fp8_etas["eta_memory"], eager_etas["eta_attn"],
                     eager_etas["eta_elementwise"])

    after = after.replace(allreduce_latency_s=_fit_allreduce(_fit_split(c.allreduce_cases(key)), after))
    before = CostModel(hw, model, **START)

    errors = _error_table(evaluate(before, root), evaluate(after, root, floors, own))
    return Calibration(after.eta_compute, after.eta_memory, after.eta_attn, after.eta_elementwise, after.overhead_s,
                       after.allreduce_latency_s, own, floors, errors)
