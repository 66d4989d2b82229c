"""Growing record arrays and block arithmetic shared by every loop."""
from __future__ import annotations

import numpy as np
from numba import njit

from .layout import (SCHED_KIND, SCHED_REQUEST, SCHED_STEP, SCHED_TOKENS, STEP_COMPUTE_BOUND, STEP_DECODE_SEQS,
                     STEP_DURATION, STEP_FLOPS, STEP_HBM_BYTES, STEP_KV_BLOCKS, STEP_KV_CACHED, STEP_PREFILL_TOKENS,
                     STEP_RUNNING, STEP_START)


@njit(cache=True)
def grow(a, needed):
    """``a`` itself if it has ``needed`` rows, else a copy with at least twice the rows."""
    if needed <= a.shape[0]:
        return a
    shape = (max(needed, 2 * a.shape[0]),) + a.shape[1:]
    b = np.empty(shape, a.dtype)
    b[: a.shape[0]] = a
    return b


@njit(cache=True, _nrt=False)
def blocks_for(tokens, block_size):
    return (tokens + block_size - 1) // block_size


@njit(cache=True)
def record_step(steps, n_steps, start, dur, prefill_tokens, decode_seqs, running, kv_used, bound, flops, nbytes,
                kv_cached):
    """Row ``n_steps`` of ``steps``, grown if need be; returns the record (:func:`write_step` writes in place)."""
    steps = grow(steps, n_steps + 1)
    write_step(steps, n_steps, start, dur, prefill_tokens, decode_seqs, running, kv_used, bound, flops, nbytes,
               kv_cached)
    return steps


@njit(cache=True, _nrt=False)
def write_step(steps, n_steps, start, dur, prefill_tokens, decode_seqs, running, kv_used, bound, flops, nbytes,
               kv_cached):
    """Row ``n_steps`` of ``steps``, which has room for it."""
    steps[n_steps, STEP_START] = start
    steps[n_steps, STEP_DURATION] = dur
    steps[n_steps, STEP_PREFILL_TOKENS] = prefill_tokens
    steps[n_steps, STEP_DECODE_SEQS] = decode_seqs
    steps[n_steps, STEP_RUNNING] = running
    steps[n_steps, STEP_KV_BLOCKS] = kv_used
    steps[n_steps, STEP_COMPUTE_BOUND] = 1.0 if bound else 0.0
    steps[n_steps, STEP_FLOPS] = flops
    steps[n_steps, STEP_HBM_BYTES] = nbytes
    steps[n_steps, STEP_KV_CACHED] = kv_cached


@njit(cache=True)
def record_sched(sched, n_sched, step, req, tokens, kind):
    """Row ``n_sched`` of ``sched``, grown if need be; returns the record (:func:`write_sched` writes in place)."""
    sched = grow(sched, n_sched + 1)
    write_sched(sched, n_sched, step, req, tokens, kind)
    return sched


@njit(cache=True, _nrt=False)
def write_sched(sched, n_sched, step, req, tokens, kind):
    """Row ``n_sched`` of ``sched``, which has room for it."""
    sched[n_sched, SCHED_STEP] = step
    sched[n_sched, SCHED_REQUEST] = req
    sched[n_sched, SCHED_TOKENS] = tokens
    sched[n_sched, SCHED_KIND] = kind
