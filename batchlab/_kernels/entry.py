"""The kernel ``simulate`` calls: per-request tables, rejections up front, then the policy's loop."""
from __future__ import annotations

import numpy as np
from numba import njit

from .batched import run_batched
from .engine import run_iterations
from .cost import serve_time
from .layout import (ITL_BINS, N_TOTALS, POLICY_CHUNKED, POLICY_CONTINUOUS, POLICY_DYNAMIC, REJECT_BUDGET, REJECT_KV,
                     REJECT_MODEL_LEN, REQ_CACHED, REQ_COLUMNS, REQ_COMPUTED, REQ_EMITTED, REQ_OUTPUT, REQ_PADDED,
                     REQ_PREEMPT, REQ_PREFIX_END,
                     REQ_PREFIX_START, REQ_PROMPT, REQ_RECOMPUTED, REQ_REJECT, REQ_TOK_OFF, RULE_CHUNKING, STATUS_OK,
                     TIME_ARRIVAL, TIME_COLUMNS, TIME_FINISH, TIME_FIRST, TIME_RELEASE, TIME_SCHED, TIME_SEEN,
                     TIME_SENT)
from .records import blocks_for
from .state import KernelOutput


@njit(cache=True)
def _tables(arrival, prompt, output, prefix_off, max_concurrency):
    """The per-request tables (token offsets are set by :func:`_token_offsets` once rejections are known)."""
    n = arrival.shape[0]
    req = np.zeros((n, REQ_COLUMNS), np.int64)
    times = np.full((n, TIME_COLUMNS), np.nan)
    for r in range(n):
        req[r, REQ_PROMPT] = prompt[r]
        req[r, REQ_OUTPUT] = output[r]
        req[r, REQ_PREFIX_START] = prefix_off[r]
        req[r, REQ_PREFIX_END] = prefix_off[r + 1]
        times[r, TIME_ARRIVAL] = arrival[r]
        if max_concurrency == 0:
            times[r, TIME_SENT] = arrival[r]
    return req, times


@njit(cache=True)
def reject_up_front(req, prompt, output, usable_blocks, block_size, budget, whole_prompts, max_model_len):
    """Mark the requests that can never be served rejected; returns the others (``live``), in arrival order."""
    n = prompt.shape[0]
    n_live = 0
    live = np.empty(n, np.int64)
    for r in range(n):
        if max_model_len > 0 and prompt[r] >= max_model_len:
            req[r, REQ_REJECT] = REJECT_MODEL_LEN
        elif blocks_for(prompt[r] + output[r] - 1, block_size) > usable_blocks:
            req[r, REQ_REJECT] = REJECT_KV
        elif budget > 0 and prompt[r] > budget and whole_prompts:
            req[r, REQ_REJECT] = REJECT_BUDGET
        else:
            live[n_live] = r
            n_live += 1
    live = live[:n_live]
    return live


@njit(cache=True, _nrt=False)
def _token_offsets(req, tok_off):
    """Each request's first token's index in the token record; a request rejected up front takes no room."""
    for r in range(req.shape[0]):
        req[r, REQ_TOK_OFF] = tok_off[r]
        tok_off[r + 1] = tok_off[r] + (req[r, REQ_OUTPUT] if req[r, REQ_REJECT] == 0 else 0)


@njit(cache=True, _nrt=False)
def clear_unemitted(emitted, tok_off, tok_times):
    """The loops write each token's time once it is known (``iterations._run_scheduled``); a request's slots past the
    ``emitted[r]`` tokens it emitted (rejected after a preemption) are never written, and become NaN here."""
    for r in range(emitted.shape[0]):
        lo, hi = tok_off[r], tok_off[r + 1]
        for i in range(lo + min(emitted[r], hi - lo), hi):
            tok_times[i] = np.nan


@njit(cache=True)
def _serve_in_order(live, arrival, prompt, coef, times):
    """Static and dynamic batching: when the server sees each request of ``live`` (``TIME_SEEN``), through the API
    server one at a time (``serve_time``); returns those times, ``arrival`` for the others (arrivals are in order)."""
    seen = arrival.copy()
    free = -np.inf
    for r in live:
        seen[r], free = serve_time(free, arrival[r], prompt[r], coef)
        times[r, TIME_SEEN] = seen[r]
    return seen


@njit(cache=True)
def simulate_kernel(stream, knobs):
    """Run one policy over a request stream (:class:`.state.Stream`, :class:`.state.Knobs`). Arrays in, arrays out;
    no globals, no randomness.

    Requests that can never be served are marked rejected before the loop and never enter it: a prompt plus
    output the whole pool cannot hold, a prompt over the budget of a policy that cannot split it, a prompt that
    leaves no room for one output token under ``max_model_len`` (> 0). Returns a :class:`.state.KernelOutput`.
    ``record_tokens``: keep every token's time and one row per iteration (without it, memory grows with requests,
    not tokens); the metrics are accumulated either way.
    """
    arrival, prompt, output = stream.arrival, stream.prompt, stream.output
    policy, rules, coef = knobs.policy, knobs.rules, knobs.coef
    n = arrival.shape[0]
    req, times = _tables(arrival, prompt, output, stream.prefix_off, knobs.max_concurrency)
    itl = np.zeros((ITL_BINS, 4))
    totals = np.zeros(N_TOTALS)
    whole_prompts = policy == POLICY_CONTINUOUS or (policy == POLICY_CHUNKED and rules & RULE_CHUNKING == 0)
    live = reject_up_front(req, prompt, output, knobs.usable_blocks, knobs.block_size, knobs.budget, whole_prompts,
                           knobs.max_model_len)
    tok_off = np.zeros(n + 1, np.int64)
    _token_offsets(req, tok_off)  # after the rejections: a request that can never be served allocates nothing
    n_tokens = tok_off[n] if knobs.record_tokens else 0
    status = STATUS_OK
    if policy <= POLICY_DYNAMIC:  # static or dynamic
        delay = knobs.max_queue_delay_s if policy == POLICY_DYNAMIC else np.inf
        seen = _serve_in_order(live, arrival, prompt, coef, times)  # when the server sees each request
        tok_times = np.full(n_tokens, np.nan)
        steps, sched = run_batched(seen, prompt, output, live, tok_off, req, times, coef, knobs.batch_size, delay,
                                   knobs.usable_blocks, knobs.block_size, knobs.record, tok_times, knobs.record_tokens,
                                   itl, totals)
    else:
        tok_times = np.empty(n_tokens)
        status, steps, sched = run_iterations(live, req, times, tok_times, stream, knobs, itl, totals)
        if n_tokens > 0:
            clear_unemitted(req[:, REQ_EMITTED], tok_off, tok_times)
    for r in range(n):
        if times[r, TIME_SENT] != times[r, TIME_SENT]:  # rejected before the loop: never waited for a client slot
            times[r, TIME_SENT] = arrival[r]
    return KernelOutput(status, times[:, TIME_FIRST].copy(), times[:, TIME_FINISH].copy(), times[:, TIME_SCHED].copy(),
                        times[:, TIME_RELEASE].copy(), req[:, REQ_PREEMPT].copy(), req[:, REQ_REJECT].copy(),
                        req[:, REQ_PADDED].copy(), req[:, REQ_COMPUTED].copy(), req[:, REQ_RECOMPUTED].copy(),
                        req[:, REQ_CACHED].copy(), times[:, TIME_SENT].copy(), times[:, TIME_SEEN].copy(), tok_off,
                        tok_times, steps, sched, itl, totals)
