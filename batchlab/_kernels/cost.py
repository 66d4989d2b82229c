"""The step cost: seconds of one iteration from its aggregates, shared by the loop and ``CostModel``."""
from __future__ import annotations

from numba import njit

from .layout import (COEF_ATTN_FLOPS_PER_WORK, COEF_COMM_S_PER_STEP, COEF_COMM_S_PER_TOKEN, COEF_CPU_HIDDEN,
                     COEF_CPU_SEQ_S, COEF_CPU_STEP_S, COEF_ELEMENTWISE_BYTES_PER_TOKEN, COEF_ETA_ATTN,
                     COEF_ETA_COMPUTE, COEF_ETA_ELEMENTWISE, COEF_ETA_MEMORY, COEF_FRONTEND_S_PER_TOKEN,
                     COEF_GEMM_FLOPS_PER_TOKEN,
                     COEF_HBM_BYTES_PER_S, COEF_KV_BYTES_PER_TOKEN, COEF_LM_HEAD_BYTES, COEF_LM_HEAD_FLOP_RATE,
                     COEF_LM_HEAD_FLOPS_PER_ROW,
                     COEF_OVERHEAD_S, COEF_PEAK_FLOPS, COEF_REQUEST_LATENCY_S, COEF_WEIGHT_BYTES)


@njit(cache=True, _nrt=False)
def step_cost(coef, new_tokens, attn_work, cached_tokens, sampled, n_seqs, asynchronous):
    """Seconds of one iteration from its aggregates (the formula is in :mod:`batchlab.cost`).

    ``new_tokens`` = T, ``attn_work`` = sum c(2p + c) + 2 sum l, ``cached_tokens`` = sum p + sum l,
    ``sampled`` = rows that sample a token (they run the LM head), ``n_seqs`` = sequences scheduled (CPU work),
    ``asynchronous``: async scheduling overlaps part of the CPU work with the GPU.
    Returns (total, gemm, attn, comm, elementwise, lm_head, cpu, flops, hbm_bytes, compute_bound): seconds (cpu
    is what the step pays for the CPU after overlap), FLOP and bytes per GPU.
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
    lm_head = 0.0
    lm_bytes = 0.0
    lm_flops = 0.0
    if sampled > 0:  # the LM head runs on the sampled rows only; its weights stream once
        lm_bytes = coef[COEF_LM_HEAD_BYTES]
        lm_flops = coef[COEF_LM_HEAD_FLOPS_PER_ROW] * sampled
        lm_head = max(lm_flops / coef[COEF_LM_HEAD_FLOP_RATE], lm_bytes / (coef[COEF_ETA_MEMORY] * bw))
    comm = coef[COEF_COMM_S_PER_TOKEN] * new_tokens + coef[COEF_COMM_S_PER_STEP]
    gpu = gemm + attn + elementwise + lm_head + comm + coef[COEF_OVERHEAD_S]
    cpu = coef[COEF_CPU_STEP_S] + coef[COEF_CPU_SEQ_S] * n_seqs
    if asynchronous:
        cpu -= min(coef[COEF_CPU_HIDDEN] * cpu, gpu)
    compute_bound = (gemm_math + attn_math) > (gemm_mem + attn_mem + elementwise)
    return (gpu + cpu, gemm, attn, comm, elementwise, lm_head, cpu, gemm_flops + attn_flops + lm_flops,
            coef[COEF_WEIGHT_BYTES] + kv_bytes + act_bytes + lm_bytes, compute_bound)


@njit(cache=True, _nrt=False)
def serve_time(frontend_free, sent, prompt_tokens, coef):
    """When the engine sees a request sent at ``sent``: the API server tokenises requests one at a time
    (``COEF_FRONTEND_S_PER_TOKEN`` per prompt token, from when it is free), then ``COEF_REQUEST_LATENCY_S``.
    Returns (seen, when the API server is free again)."""
    free = max(sent, frontend_free) + coef[COEF_FRONTEND_S_PER_TOKEN] * prompt_tokens
    return free + coef[COEF_REQUEST_LATENCY_S], free
