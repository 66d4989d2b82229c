"""Static and dynamic batching: lockstep batches of padded prompts (DESIGN section 4)."""
from __future__ import annotations

import numpy as np
from numba import njit

from .cost import step_cost
from .layout import (KIND_DECODE, KIND_PREFILL, REQ_COMPUTED, REQ_PADDED, SCHED_COLUMNS, STEP_COLUMNS, TIME_FINISH,
                     TIME_FIRST, TIME_RELEASE, TIME_SCHED, TOTAL_BUSY_S, TOTAL_SEQ_STEPS, TOTAL_STEPS)
from .gaps import add_gaps
from .records import blocks_for, record_sched, record_step


@njit(cache=True, _nrt=False)
def _form_batch(arrival, prompt, output, live, head, now, batch_size, max_queue_delay_s, usable_blocks, block_size):
    """The next batch, from ``live[head]`` on, once the server is free at ``now``: when it is dispatched (the count
    rule or the timer, whichever fires first), its end in ``live`` (members queued by then, oldest first, within
    ``batch_size`` and the KV pool's padded reservation), its longest prompt and its longest output."""
    n_live = live.shape[0]
    # When would the count rule fire, and when the timer?
    last_needed = head + batch_size - 1
    if last_needed < n_live:
        t_count = arrival[live[last_needed]]
    elif max_queue_delay_s == np.inf:
        t_count = arrival[live[n_live - 1]]  # static: the stream has ended, run what is left
    else:
        t_count = np.inf  # dynamic: a partial batch leaves when the timer fires
    t_timer = arrival[live[head]] + max_queue_delay_s
    dispatch = max(now, min(t_count, t_timer))
    p_max = 0
    o_max = 0
    end = head
    while end < n_live and end - head < batch_size and arrival[live[end]] <= dispatch:
        r = live[end]
        p_new = max(p_max, prompt[r])
        o_new = max(o_max, output[r])
        if (end - head + 1) * blocks_for(p_new + o_new - 1, block_size) > usable_blocks:
            break
        p_max = p_new
        o_max = o_new
        end += 1
    return dispatch, end, p_max, o_max


@njit(cache=True)
def run_batched(arrival, prompt, output, live, tok_off, req, times, coef, batch_size, max_queue_delay_s, usable_blocks,
                 block_size, record, tok_times, record_steps, itl, totals):
    """Static and dynamic batching: lockstep batches, padded prompts, every row runs to the longest output.

    A batch is dispatched when the server is free and either ``batch_size`` requests have arrived or the
    oldest has waited ``max_queue_delay_s`` (infinite for static), or the stream has ended. Its members are
    the oldest queued requests, as many as ``batch_size`` and the KV pool (padded reservation) allow.
    ``arrival`` is when the server sees each request (sent + the serving term ``COEF_REQUEST_LATENCY_S``).
    ``record_steps``: keep one row per iteration; ``tok_times`` (empty: no token record) gets every token's time.
    Inter-token gaps go into the histogram ``itl`` and the run's totals into ``totals``.
    """
    record_tokens = tok_times.shape[0] > 0
    n_live = live.shape[0]
    steps = np.empty((1024 if record_steps else 1, len(STEP_COLUMNS)))
    sched = np.empty((1024 if record else 1, len(SCHED_COLUMNS)), np.int64)
    n_steps = 0
    n_sched = 0
    now = 0.0
    head = 0
    while head < n_live:
        dispatch, end, p_max, o_max = _form_batch(arrival, prompt, output, live, head, now, batch_size,
                                                  max_queue_delay_s, usable_blocks, block_size)
        b = end - head
        kv_used = b * blocks_for(p_max + o_max - 1, block_size)
        # Prefill: b rows of p_max tokens, padded rows cost what real rows cost.
        t = dispatch
        dur, _g, _a, _c, _e, _l, _u, flops, nbytes, bound = step_cost(coef, b * p_max, b * p_max * p_max, 0.0, b,
                                                                       b, False)
        if record_steps:
            steps = record_step(steps, n_steps, t, dur, b * p_max, 0, b, kv_used, bound, flops, nbytes, 0)
        totals[TOTAL_BUSY_S] += dur
        totals[TOTAL_SEQ_STEPS] += b
        if record:
            for k in range(head, end):
                sched = record_sched(sched, n_sched, n_steps, live[k], p_max, KIND_PREFILL)
                n_sched += 1
        n_steps += 1
        t += dur
        for k in range(head, end):
            r = live[k]
            times[r, TIME_SCHED] = dispatch
            times[r, TIME_FIRST] = t
            if record_tokens:
                tok_times[tok_off[r]] = t
            req[r, REQ_PADDED] = (p_max - prompt[r]) + (o_max - output[r])
            req[r, REQ_COMPUTED] = prompt[r] + output[r] - 1
            if output[r] == 1:
                times[r, TIME_FINISH] = t
        # Decode: o_max - 1 steps of b rows; row contexts are p_max + s - 1 cached tokens.
        for s in range(1, o_max):
            ctx = p_max + s - 1
            dur, _g, _a, _c, _e, _l, _u, flops, nbytes, bound = step_cost(coef, b, 2.0 * b * ctx, b * ctx, b, b,
                                                                           False)
            if record_steps:
                steps = record_step(steps, n_steps, t, dur, 0, b, b, kv_used, bound, flops, nbytes, 0)
            totals[TOTAL_BUSY_S] += dur
            totals[TOTAL_SEQ_STEPS] += b
            if record:
                for k in range(head, end):
                    sched = record_sched(sched, n_sched, n_steps, live[k], 1, KIND_DECODE)
                    n_sched += 1
            n_steps += 1
            prev = t
            t += dur
            emitted = 0
            for k in range(head, end):
                r = live[k]
                if s < output[r]:
                    emitted += 1
                    if record_tokens:
                        tok_times[tok_off[r] + s] = t
                    if s == output[r] - 1:
                        times[r, TIME_FINISH] = t
            if emitted > 0:  # lockstep: every row's previous token came at the end of the step before
                add_gaps(itl, totals, t - prev, emitted)
        for k in range(head, end):
            times[live[k], TIME_RELEASE] = t
        now = t
        head = end
    totals[TOTAL_STEPS] = n_steps
    return steps[:n_steps if record_steps else 0], sched[:n_sched]
