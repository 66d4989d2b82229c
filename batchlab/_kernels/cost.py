"""The step cost: seconds of one iteration from its aggregates, shared by the loop and ``CostModel``."""
from __future__ import annotations

from numba import njit

from .layout import (COEF_ATTN_FLOPS_PER_WORK, COEF_COMM_S_PER_STEP, COEF_COMM_S_PER_TOKEN,
                     COEF_ELEMENTWISE_BYTES_PER_TOKEN, COEF_ETA_ATTN, COEF_ETA_COMPUTE, COEF_ETA_ELEMENTWISE,
                     COEF_ETA_MEMORY, COEF_GEMM_FLOPS_PER_TOKEN, COEF_HBM_BYTES_PER_S, COEF_KV_BYTES_PER_TOKEN,
                     COEF_OVERHEAD_S, COEF_PEAK_FLOPS, COEF_WEIGHT_BYTES)


@njit(cache=True)
def step_cost(coef, new_tokens, attn_work, cached_tokens):
    """Seconds of one iteration from its aggregates (the formula is in :mod:`batchlab.cost`).

    ``new_tokens`` = T, ``attn_work`` = sum c(2p + c) + 2 sum l, ``cached_tokens`` = sum p + sum l.
    Returns (total, gemm, attn, comm, elementwise, flops, hbm_bytes, compute_bound), seconds, FLOP and bytes.
    """
    peak, bw = coef[COEF_PEAK_FLOPS], coef[COEF_HBM_BYTES_PER_S]
    gemm_flops = coef[COEF_GEMM_FLOPS_PER_TOKEN] * new_tokens
    attn_flops = coef[COEF_ATTN_FLOPS_PER_WORK] * attn_work
    kv_bytes = coef[COEF_KV_BYTES_PER_TOKEN] * (cached_tokens + new_tokens)
    act_bytes = coef[COEF_ELEMENTWISE_BYTES_PER_TOKEN] * new_tokens
    gemm_math = gemm_flops / (coef[COEF_ETA_COMPUTE] * peak)
    gemm_mem = coef[COEF_WEIGHT_BYTES] / (coef[COEF_ETA_MEMORY] * bw)
    attn_math = attn_flops / (coef[COEF_ETA_ATTN] * peak)
    attn_mem = kv_bytes / (coef[COEF_ETA_MEMORY] * bw)
    gemm = max(gemm_math, gemm_mem)
    attn = max(attn_math, attn_mem)
    elementwise = act_bytes / (coef[COEF_ETA_ELEMENTWISE] * bw)
    comm = coef[COEF_COMM_S_PER_TOKEN] * new_tokens + coef[COEF_COMM_S_PER_STEP]
    total = gemm + attn + elementwise + comm + coef[COEF_OVERHEAD_S]
    compute_bound = (gemm_math + attn_math) > (gemm_mem + attn_mem + elementwise)
    return (total, gemm, attn, comm, elementwise, gemm_flops + attn_flops,
            coef[COEF_WEIGHT_BYTES] + kv_bytes + act_bytes, compute_bound)
