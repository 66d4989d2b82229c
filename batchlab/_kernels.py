"""Every numba-jitted function of batchlab: the step cost and the scheduler loop with its helpers.

They live in one module so that numba's on-disk cache, which is keyed on this file, is invalidated whenever
any of them changes. Kernels take and return NumPy arrays and scalars, read no mutable globals and draw no
random numbers; the module-level integer constants below (slot names) are frozen into the compiled code.
The public wrappers are :class:`batchlab.CostModel` (the step cost) and :func:`batchlab.simulate` (the
loop); the plain-Python reference in ``tests/reference.py`` must agree with both.

The loop follows DESIGN section 4; its steps are the helpers below, named after them:
``_queue_arrivals`` (requests join the waiting queue), ``_schedule_running`` (chunked step 1: running requests
first, preempting the last one when blocks run out), ``_admit_waiting`` (chunked step 2), ``_admit_whole_prompts``
(Orca's admission), ``_run_scheduled`` (step 3: the iteration's aggregates and its emitted tokens),
``_release_finished`` and, after the loop, ``_stamp_times`` and ``_account_tokens``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# -- the cost model's coefficients: one float64 vector, per GPU, filled by CostModel.coefficients() ----------
COEF_GEMM_FLOPS_PER_TOKEN = 0  # FLOP per new token in the weight GEMMs, 2 P / t
COEF_WEIGHT_BYTES = 1  # bytes of weights streamed once per step, P b_w / t
COEF_ATTN_FLOPS_PER_WORK = 2  # FLOP per unit of attention work, 2 L d / t
COEF_KV_BYTES_PER_TOKEN = 3  # KV bytes per cached or new token, k (per GPU)
COEF_PEAK_FLOPS = 4  # FLOP/s, dense peak for the weight dtype
COEF_HBM_BYTES_PER_S = 5  # bytes/s
COEF_ETA_COMPUTE = 6  # fraction of peak FLOP/s in GEMMs
COEF_ETA_MEMORY = 7  # fraction of HBM bandwidth
COEF_ETA_ATTN = 8  # fraction of peak FLOP/s in attention
COEF_OVERHEAD_S = 9  # seconds per step
COEF_COMM_S_PER_TOKEN = 10  # seconds of all-reduce bandwidth per new token (0 at TP 1)
COEF_COMM_S_PER_STEP = 11  # seconds of all-reduce latency per step (0 at TP 1)
COEF_ELEMENTWISE_BYTES_PER_TOKEN = 12  # activation bytes of norms, RoPE, SiLU-and-mul per token (0: no term)
COEF_ETA_ELEMENTWISE = 13  # fraction of HBM bandwidth in the elementwise kernels
N_COEF = 14

# -- policies, step and schedule records, rejections -----------------------------------------------------------
POLICIES = ("static", "dynamic", "continuous", "chunked")
POLICY_STATIC, POLICY_DYNAMIC, POLICY_CONTINUOUS, POLICY_CHUNKED = range(4)

STEP_COLUMNS = (  # one row per iteration, float64
    "start_s", "duration_s", "prefill_tokens", "decode_seqs", "running", "kv_blocks_used",
    "compute_bound", "flops", "hbm_bytes",
)
(STEP_START, STEP_DURATION, STEP_PREFILL_TOKENS, STEP_DECODE_SEQS, STEP_RUNNING, STEP_KV_BLOCKS,
 STEP_COMPUTE_BOUND, STEP_FLOPS, STEP_HBM_BYTES) = range(len(STEP_COLUMNS))

SCHED_COLUMNS = ("step", "request", "tokens", "kind")  # one row per request per iteration, int64
SCHED_STEP, SCHED_REQUEST, SCHED_TOKENS, SCHED_KIND = range(len(SCHED_COLUMNS))
KIND_PREFILL, KIND_DECODE, KIND_PREEMPT = 0, 1, 2
KIND_NAMES = ("prefill", "decode", "preempt")

# Rejection codes (0 = served); the Python side turns them into sentences.
REJECT_KV, REJECT_BUDGET, REJECT_RECOMPUTE = 1, 2, 3

STATUS_OK, STATUS_STUCK = 0, 1

# -- the running table: one row per running request, in admission order, so every pass over the running set walks
# contiguous memory (the per-request arrays are too large to stay in cache).
RUN_REQ, RUN_PROMPT, RUN_EMIT, RUN_COMP, RUN_OUT, RUN_BLOCKS, RUN_TOK, RUN_TOKPOS = range(8)
RUN_COLUMNS = 8

# -- the loop's scalar state, one int64 vector so the step helpers can update it in place ------------------------
ST_RUNNING = 0  # rows of the running table in use
ST_WAIT_HEAD = 1  # ring-buffer head of the waiting queue
ST_WAIT_LEN = 2  # requests waiting
ST_FREE_BLOCKS = 3  # free KV blocks
ST_FINISHED = 4  # live requests finished or rejected
ST_NEXT = 5  # next live request to arrive
ST_STEPS = 6  # iterations recorded
ST_SCHED = 7  # schedule rows recorded
N_STATE = 8

# -- per-request tables: one row per request, so a request's fields share a cache line and every helper takes
# one array for them (each array argument of a jitted call costs reference counting, once per iteration).
(REQ_PROMPT, REQ_OUTPUT, REQ_TOK_OFF, REQ_EMITTED, REQ_LOST, REQ_HIGH_WATER, REQ_PREEMPT, REQ_REJECT,
 REQ_COMPUTED, REQ_RECOMPUTED, REQ_PADDED) = range(11)
REQ_COLUMNS = 11  # int64: prompt and output tokens, token offset, then what the loop counts
TIME_FIRST, TIME_FINISH, TIME_SCHED, TIME_RELEASE = range(4)
TIME_COLUMNS = 4  # float64, seconds (step indices inside the iteration loop until it ends)


# == the step cost =============================================================================================

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


# == records ===================================================================================================

@njit(cache=True)
def _grow(a, needed):
    """``a`` itself if it has ``needed`` rows, else a copy with at least twice the rows."""
    if needed <= a.shape[0]:
        return a
    shape = (max(needed, 2 * a.shape[0]),) + a.shape[1:]
    b = np.empty(shape, a.dtype)
    b[: a.shape[0]] = a
    return b


@njit(cache=True)
def _blocks_for(tokens, block_size):
    return (tokens + block_size - 1) // block_size


@njit(cache=True)
def _record_step(steps, n_steps, start, dur, prefill_tokens, decode_seqs, running, kv_used, bound, flops, nbytes):
    steps = _grow(steps, n_steps + 1)
    steps[n_steps, STEP_START] = start
    steps[n_steps, STEP_DURATION] = dur
    steps[n_steps, STEP_PREFILL_TOKENS] = prefill_tokens
    steps[n_steps, STEP_DECODE_SEQS] = decode_seqs
    steps[n_steps, STEP_RUNNING] = running
    steps[n_steps, STEP_KV_BLOCKS] = kv_used
    steps[n_steps, STEP_COMPUTE_BOUND] = 1.0 if bound else 0.0
    steps[n_steps, STEP_FLOPS] = flops
    steps[n_steps, STEP_HBM_BYTES] = nbytes
    return steps


@njit(cache=True)
def _record_sched(sched, n_sched, step, req, tokens, kind):
    sched = _grow(sched, n_sched + 1)
    sched[n_sched, SCHED_STEP] = step
    sched[n_sched, SCHED_REQUEST] = req
    sched[n_sched, SCHED_TOKENS] = tokens
    sched[n_sched, SCHED_KIND] = kind
    return sched


# == static and dynamic batching ================================================================================

@njit(cache=True)
def _run_batched(arrival, prompt, output, live, tok_off, req, times, coef, batch_size, max_queue_delay_s, usable_blocks,
                 block_size, record, tok_times):
    """Static and dynamic batching: lockstep batches, padded prompts, every row runs to the longest output.

    A batch is dispatched when the server is free and either ``batch_size`` requests have arrived or the
    oldest has waited ``max_queue_delay_s`` (infinite for static), or the stream has ended. Its members are
    the oldest queued requests, as many as ``batch_size`` and the KV pool (padded reservation) allow.
    """
    n_live = live.shape[0]
    steps = np.empty((1024, len(STEP_COLUMNS)))
    sched = np.empty((1024 if record else 1, len(SCHED_COLUMNS)), np.int64)
    n_steps = 0
    n_sched = 0
    now = 0.0
    head = 0
    while head < n_live:
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
        # Members: queued by the dispatch time, oldest first, within batch size and the KV pool.
        p_max = 0
        o_max = 0
        end = head
        while end < n_live and end - head < batch_size and arrival[live[end]] <= dispatch:
            r = live[end]
            p_new = max(p_max, prompt[r])
            o_new = max(o_max, output[r])
            if (end - head + 1) * _blocks_for(p_new + o_new - 1, block_size) > usable_blocks:
                break
            p_max = p_new
            o_max = o_new
            end += 1
        b = end - head
        kv_used = b * _blocks_for(p_max + o_max - 1, block_size)
        # Prefill: b rows of p_max tokens, padded rows cost what real rows cost.
        t = dispatch
        dur, _g, _a, _c, _e, flops, nbytes, bound = step_cost(coef, b * p_max, b * p_max * p_max, 0.0)
        steps = _record_step(steps, n_steps, t, dur, b * p_max, 0, b, kv_used, bound, flops, nbytes)
        if record:
            for k in range(head, end):
                sched = _record_sched(sched, n_sched, n_steps, live[k], p_max, KIND_PREFILL)
                n_sched += 1
        n_steps += 1
        t += dur
        for k in range(head, end):
            r = live[k]
            times[r, TIME_SCHED] = dispatch
            times[r, TIME_FIRST] = t
            tok_times[tok_off[r]] = t
            req[r, REQ_PADDED] = (p_max - prompt[r]) + (o_max - output[r])
            req[r, REQ_COMPUTED] = prompt[r] + output[r] - 1
            if output[r] == 1:
                times[r, TIME_FINISH] = t
        # Decode: o_max - 1 steps of b rows; row contexts are p_max + s - 1 cached tokens.
        for s in range(1, o_max):
            ctx = p_max + s - 1
            dur, _g, _a, _c, _e, flops, nbytes, bound = step_cost(coef, b, 2.0 * b * ctx, b * ctx)
            steps = _record_step(steps, n_steps, t, dur, 0, b, b, kv_used, bound, flops, nbytes)
            if record:
                for k in range(head, end):
                    sched = _record_sched(sched, n_sched, n_steps, live[k], 1, KIND_DECODE)
                    n_sched += 1
            n_steps += 1
            t += dur
            for k in range(head, end):
                r = live[k]
                if s < output[r]:
                    tok_times[tok_off[r] + s] = t
                    if s == output[r] - 1:
                        times[r, TIME_FINISH] = t
        for k in range(head, end):
            times[live[k], TIME_RELEASE] = t
        now = t
        head = end
    return steps[:n_steps], sched[:n_sched]


# == iteration-level batching: the steps of one iteration ========================================================

@njit(cache=True)
def _is_decode(run, k):
    """Row ``k`` needs one token on top of everything it knows: a decode, not a prompt chunk."""
    return run[k, RUN_EMIT] > 0 and run[k, RUN_COMP] == run[k, RUN_PROMPT] + run[k, RUN_EMIT] - 1


@njit(cache=True)
def _admit(run, i, r, req, blocks, tokens):
    """Fill row ``i`` of the running table with request ``r`` (nothing computed yet)."""
    run[i, RUN_REQ] = r
    run[i, RUN_PROMPT] = req[r, REQ_PROMPT]
    run[i, RUN_EMIT] = req[r, REQ_EMITTED]
    run[i, RUN_COMP] = 0
    run[i, RUN_OUT] = req[r, REQ_OUTPUT]
    run[i, RUN_BLOCKS] = blocks
    run[i, RUN_TOK] = tokens
    run[i, RUN_TOKPOS] = req[r, REQ_TOK_OFF] + req[r, REQ_EMITTED]


@njit(cache=True)
def _queue_arrivals(st, arrival, live, wait, now):
    """Every live request that has arrived by ``now`` joins the back of the waiting queue (a ring buffer)."""
    n = wait.shape[0]
    n_live = live.shape[0]
    nxt = st[ST_NEXT]
    while nxt < n_live and arrival[live[nxt]] <= now:
        wait[(st[ST_WAIT_HEAD] + st[ST_WAIT_LEN]) % n] = live[nxt]
        st[ST_WAIT_LEN] += 1
        nxt += 1
    st[ST_NEXT] = nxt


@njit(cache=True)
def _preempt_last(st, run, wait, req):
    """Preempt the last running request: free its blocks, restart it from zero at the front of the queue.

    Returns the request preempted.
    """
    n = wait.shape[0]
    v = st[ST_RUNNING] - 1
    victim = run[v, RUN_REQ]
    req[victim, REQ_EMITTED] = run[v, RUN_EMIT]
    req[victim, REQ_LOST] += run[v, RUN_COMP]
    req[victim, REQ_HIGH_WATER] = max(req[victim, REQ_HIGH_WATER], run[v, RUN_COMP])
    st[ST_FREE_BLOCKS] += run[v, RUN_BLOCKS]
    st[ST_RUNNING] -= 1
    req[victim, REQ_PREEMPT] += 1
    st[ST_WAIT_HEAD] = (st[ST_WAIT_HEAD] - 1) % n
    wait[st[ST_WAIT_HEAD]] = victim
    st[ST_WAIT_LEN] += 1
    return victim


@njit(cache=True)
def _schedule_running(st, run, wait, req, victims, budget, threshold, block_size):
    """Chunked step 1: running requests in admission order, each asking for a decode or its next chunk.

    A request that cannot get its blocks preempts the last running request (possibly itself, which ends
    the pass). Returns (rows scheduled, budget left, preempted requests in ``victims``).
    """
    hi = 0
    left = budget
    n_victims = 0
    free_blocks = st[ST_FREE_BLOCKS]
    n_running = st[ST_RUNNING]  # locals: the state vector is written only when someone is preempted
    while hi < n_running and left > 0:
        want = run[hi, RUN_PROMPT] + run[hi, RUN_EMIT] - run[hi, RUN_COMP]
        if threshold > 0 and want > threshold:
            want = threshold
        if want > left:
            want = left
        need = 0
        if run[hi, RUN_COMP] + want > run[hi, RUN_BLOCKS] * block_size:  # skips a division on most steps
            need = _blocks_for(run[hi, RUN_COMP] + want, block_size) - run[hi, RUN_BLOCKS]
        scheduled = True
        while need > free_blocks:
            st[ST_FREE_BLOCKS] = free_blocks
            was_last = n_running - 1 == hi
            victims[n_victims] = _preempt_last(st, run, wait, req)
            n_victims += 1
            free_blocks = st[ST_FREE_BLOCKS]
            n_running = st[ST_RUNNING]
            if was_last:
                scheduled = False
                break
        if not scheduled:
            break
        free_blocks -= need
        run[hi, RUN_BLOCKS] += need
        run[hi, RUN_TOK] = want
        left -= want
        hi += 1
    st[ST_FREE_BLOCKS] = free_blocks
    return hi, left, n_victims


@njit(cache=True)
def _admit_waiting(st, run, wait, skipped, req, times, now, left, budget, threshold, enable_chunking,
                   max_num_seqs, block_size):
    """Chunked step 2: waiting requests, oldest first, while seats, budget and blocks last.

    A newcomer's first chunk is capped by the threshold and the budget left; one whose blocks cannot be had
    stops admission. With chunking off, a request that does not fit the budget left is set aside (it keeps
    its place at the front) and the next is tried. Returns the budget left.
    """
    n = wait.shape[0]
    n_skip = 0
    while st[ST_WAIT_LEN] > 0 and left > 0 and st[ST_RUNNING] < max_num_seqs:
        r = wait[st[ST_WAIT_HEAD]]
        want = req[r, REQ_PROMPT] + req[r, REQ_EMITTED]
        if threshold > 0 and want > threshold:
            want = threshold
        if not enable_chunking and want > left:
            st[ST_WAIT_HEAD] = (st[ST_WAIT_HEAD] + 1) % n
            st[ST_WAIT_LEN] -= 1
            if want > budget:
                # A resumed request whose recomputation can never fit one iteration.
                req[r, REQ_REJECT] = REJECT_RECOMPUTE
                st[ST_FINISHED] += 1
            else:
                skipped[n_skip] = r
                n_skip += 1
            continue
        if want > left:
            want = left
        need = _blocks_for(want, block_size)
        if need > st[ST_FREE_BLOCKS]:
            break
        st[ST_WAIT_HEAD] = (st[ST_WAIT_HEAD] + 1) % n
        st[ST_WAIT_LEN] -= 1
        st[ST_FREE_BLOCKS] -= need
        if times[r, TIME_SCHED] != times[r, TIME_SCHED]:  # NaN: first time scheduled
            times[r, TIME_SCHED] = now
        _admit(run, st[ST_RUNNING], r, req, need, want)
        st[ST_RUNNING] += 1
        left -= want
    for k in range(n_skip - 1, -1, -1):
        st[ST_WAIT_HEAD] = (st[ST_WAIT_HEAD] - 1) % n
        wait[st[ST_WAIT_HEAD]] = skipped[k]
        st[ST_WAIT_LEN] += 1
    return left


@njit(cache=True)
def _admit_whole_prompts(st, run, wait, req, times, now, budget, max_num_seqs, block_size):
    """Orca's admission: whole prompts join, KV for prompt + output reserved up front; no preemption.

    ``budget`` > 0 caps the prompt tokens admitted in one iteration (vLLM V0). Returns the first new row.
    """
    n = wait.shape[0]
    first_new = st[ST_RUNNING]
    prompt_sum = 0
    while st[ST_WAIT_LEN] > 0 and st[ST_RUNNING] < max_num_seqs:
        r = wait[st[ST_WAIT_HEAD]]
        need = _blocks_for(req[r, REQ_PROMPT] + req[r, REQ_OUTPUT] - 1, block_size)
        if need > st[ST_FREE_BLOCKS] or (budget > 0 and prompt_sum + req[r, REQ_PROMPT] > budget):
            break
        st[ST_WAIT_HEAD] = (st[ST_WAIT_HEAD] + 1) % n
        st[ST_WAIT_LEN] -= 1
        st[ST_FREE_BLOCKS] -= need
        prompt_sum += req[r, REQ_PROMPT]
        times[r, TIME_SCHED] = now
        _admit(run, st[ST_RUNNING], r, req, need, req[r, REQ_PROMPT])
        st[ST_RUNNING] += 1
    return first_new


@njit(cache=True)
def _run_scheduled(run, lo, hi, step_index, times, tok_times):
    """Step 3: one pass over the scheduled rows ``[lo, hi)`` sums the iteration's aggregates and emits.

    A request that has computed every token it knows samples the next one. Emissions are stamped with the
    step's index (turned into times after the loop), so the step's duration is not needed here. Returns
    (prefill tokens, decode sequences, attention work, cached tokens, first finished row or -1).
    """
    attn_work = 0.0
    cached = 0
    prefill_tokens = 0
    decode_seqs = 0
    first_done = -1
    for k in range(lo, hi):
        c = run[k, RUN_TOK]
        p = run[k, RUN_COMP]
        known = run[k, RUN_PROMPT] + run[k, RUN_EMIT]
        cached += p
        if run[k, RUN_EMIT] > 0 and p == known - 1:  # a decode
            attn_work += 2.0 * p
            decode_seqs += 1
        else:
            attn_work += c * (2.0 * p + c)
            prefill_tokens += c
        run[k, RUN_COMP] = p + c
        run[k, RUN_TOK] = 1  # Orca: after its first iteration a row only decodes (chunked resets it anyway)
        if p + c == known:
            tok_times[run[k, RUN_TOKPOS]] = step_index
            run[k, RUN_TOKPOS] += 1
            run[k, RUN_EMIT] += 1
            if run[k, RUN_EMIT] == 1:
                times[run[k, RUN_REQ], TIME_FIRST] = step_index
            if run[k, RUN_EMIT] == run[k, RUN_OUT]:
                times[run[k, RUN_REQ], TIME_FINISH] = step_index
                if first_done < 0:
                    first_done = k
    return prefill_tokens, decode_seqs, attn_work, cached, first_done


@njit(cache=True)
def _release_finished(st, run, first_done, req):
    """Requests that produced their whole output leave the running table and free their blocks; the rest keep
    their order."""
    j = first_done
    for i in range(first_done, st[ST_RUNNING]):
        if run[i, RUN_EMIT] == run[i, RUN_OUT]:
            req[run[i, RUN_REQ], REQ_EMITTED] = run[i, RUN_EMIT]
            st[ST_FREE_BLOCKS] += run[i, RUN_BLOCKS]
            st[ST_FINISHED] += 1
        else:
            if j != i:
                for col in range(RUN_COLUMNS):
                    run[j, col] = run[i, col]
            j += 1
    st[ST_RUNNING] = j


@njit(cache=True)
def _stamp_times(steps, n_steps, live, tok_times, times):
    """Step indices to times: every emission happens at the end of its step."""
    ends = steps[:n_steps, STEP_START] + steps[:n_steps, STEP_DURATION]
    for i in range(tok_times.shape[0]):
        if tok_times[i] == tok_times[i]:
            tok_times[i] = ends[int(tok_times[i])]
    for r in live:
        if times[r, TIME_FIRST] == times[r, TIME_FIRST]:
            times[r, TIME_FIRST] = ends[int(times[r, TIME_FIRST])]
        if times[r, TIME_FINISH] == times[r, TIME_FINISH]:
            times[r, TIME_FINISH] = ends[int(times[r, TIME_FINISH])]
            times[r, TIME_RELEASE] = times[r, TIME_FINISH]


@njit(cache=True)
def _account_tokens(live, req):
    """Token accounting: a completed request computed prompt + output - 1 positions once, plus what it lost.

    Each preemption throws away the tokens computed so far, so a completed request's recomputed tokens equal
    its lost ones; a request rejected after preemption recomputed what it lost beyond its furthest progress.
    """
    for r in live:
        if req[r, REQ_REJECT] == 0:
            req[r, REQ_RECOMPUTED] = req[r, REQ_LOST]
            req[r, REQ_COMPUTED] = req[r, REQ_PROMPT] + req[r, REQ_OUTPUT] - 1 + req[r, REQ_LOST]
        else:
            req[r, REQ_RECOMPUTED] = req[r, REQ_LOST] - req[r, REQ_HIGH_WATER]
            req[r, REQ_COMPUTED] = req[r, REQ_LOST]


# == iteration-level batching: the loop ==========================================================================

@njit(cache=True)
def _run_iterations(arrival, live, req, times, coef, chunked, max_num_seqs, budget, threshold, enable_chunking,
                    prefill_only_steps, usable_blocks, block_size, record, tok_times):
    """Iteration-level policies: Orca-style ``continuous`` and vLLM V1 ``chunked`` (DESIGN section 4).

    ``budget`` <= 0 means no token budget (continuous only). The requests scheduled in an iteration are
    always a contiguous range of the running table: V1 schedules running requests in order until the
    budget or the pool runs out (then admits nobody), and appends admitted ones at the end. The helpers are
    called only when they have work (an arrival, a seat, a finished request), since each call costs a little.
    """
    n = req.shape[0]
    n_live = live.shape[0]
    run = np.zeros((min(n, max_num_seqs) + 1, RUN_COLUMNS), np.int64)
    wait = np.empty(n, np.int64)  # waiting queue: a ring buffer, since preempted requests go back to its front
    skipped = np.empty(n, np.int64)
    victims = np.empty(n, np.int64)
    steps = np.empty((1024, len(STEP_COLUMNS)))
    sched = np.empty((1024 if record else 1, len(SCHED_COLUMNS)), np.int64)
    st = np.zeros(N_STATE, np.int64)
    st[ST_FREE_BLOCKS] = usable_blocks
    now = 0.0
    while st[ST_FINISHED] < n_live:
        if st[ST_NEXT] < n_live and arrival[live[st[ST_NEXT]]] <= now:
            _queue_arrivals(st, arrival, live, wait, now)
        if st[ST_RUNNING] == 0 and st[ST_WAIT_LEN] == 0:
            now = arrival[live[st[ST_NEXT]]]
            continue
        lo = 0  # scheduled rows of the running table: [lo, hi)
        if chunked:
            hi, left, n_victims = _schedule_running(st, run, wait, req, victims, budget, threshold, block_size)
            if record:
                # Recorded after the pass: reassigning an array inside the hot loop costs refcounting.
                for k in range(n_victims):
                    sched = _record_sched(sched, st[ST_SCHED], st[ST_STEPS], victims[k], 0, KIND_PREEMPT)
                    st[ST_SCHED] += 1
            # Nobody is admitted in an iteration that preempted.
            if n_victims == 0 and st[ST_WAIT_LEN] > 0 and left > 0 and st[ST_RUNNING] < max_num_seqs:
                _admit_waiting(st, run, wait, skipped, req, times, now, left, budget, threshold, enable_chunking,
                               max_num_seqs, block_size)
                if st[ST_RUNNING] > hi:
                    hi = st[ST_RUNNING]
        else:
            first_new = _admit_whole_prompts(st, run, wait, req, times, now, budget, max_num_seqs, block_size)
            lo = first_new if (prefill_only_steps and st[ST_RUNNING] > first_new) else 0
            hi = st[ST_RUNNING]
        if hi == lo:
            # Only possible when every waiting request was just rejected; anything else is a bug.
            if st[ST_FINISHED] == n_live or (st[ST_RUNNING] == 0 and st[ST_WAIT_LEN] == 0):
                continue
            return STATUS_STUCK, steps[:st[ST_STEPS]], sched[:st[ST_SCHED]]
        if record:
            for k in range(lo, hi):
                sched = _record_sched(sched, st[ST_SCHED], st[ST_STEPS], run[k, RUN_REQ], run[k, RUN_TOK],
                                      KIND_DECODE if _is_decode(run, k) else KIND_PREFILL)
                st[ST_SCHED] += 1
        prefill_tokens, decode_seqs, attn_work, cached, first_done = _run_scheduled(
            run, lo, hi, st[ST_STEPS], times, tok_times)
        dur, _g, _a, _c, _e, flops, nbytes, bound = step_cost(coef, decode_seqs + prefill_tokens, attn_work,
                                                              cached)
        steps = _record_step(steps, st[ST_STEPS], now, dur, prefill_tokens, decode_seqs, st[ST_RUNNING],
                             usable_blocks - st[ST_FREE_BLOCKS], bound, flops, nbytes)
        st[ST_STEPS] += 1
        now += dur
        if first_done >= 0:
            _release_finished(st, run, first_done, req)
    n_steps = st[ST_STEPS]
    _stamp_times(steps, n_steps, live, tok_times, times)
    _account_tokens(live, req)
    return STATUS_OK, steps[:n_steps], sched[:st[ST_SCHED]]


# == the kernel ================================================================================================

@njit(cache=True)
def simulate_kernel(arrival, prompt, output, policy, coef, batch_size, max_queue_delay_s, max_num_seqs, budget,
                    threshold, enable_chunking, prefill_only_steps, usable_blocks, block_size, record):
    """Run one policy over a request stream. Arrays in, arrays out; no globals, no randomness.

    Requests that can never be served are marked rejected before the loop and never enter it. Returns the
    fields of :class:`batchlab.result.KernelOutput`, in its order.
    """
    n = arrival.shape[0]
    req = np.zeros((n, REQ_COLUMNS), np.int64)
    times = np.full((n, TIME_COLUMNS), np.nan)
    tok_off = np.zeros(n + 1, np.int64)
    for r in range(n):
        req[r, REQ_PROMPT] = prompt[r]
        req[r, REQ_OUTPUT] = output[r]
        req[r, REQ_TOK_OFF] = tok_off[r]
        tok_off[r + 1] = tok_off[r] + output[r]
    tok_times = np.full(tok_off[n], np.nan)
    n_live = 0
    live = np.empty(n, np.int64)
    for r in range(n):
        if _blocks_for(prompt[r] + output[r] - 1, block_size) > usable_blocks:
            req[r, REQ_REJECT] = REJECT_KV
        elif budget > 0 and prompt[r] > budget and (policy == POLICY_CONTINUOUS or (policy == POLICY_CHUNKED
                                                                                      and not enable_chunking)):
            req[r, REQ_REJECT] = REJECT_BUDGET
        else:
            live[n_live] = r
            n_live += 1
    live = live[:n_live]
    status = STATUS_OK
    if policy <= POLICY_DYNAMIC:  # static or dynamic
        delay = max_queue_delay_s if policy == POLICY_DYNAMIC else np.inf
        steps, sched = _run_batched(arrival, prompt, output, live, tok_off, req, times, coef, batch_size, delay,
                                    usable_blocks, block_size, record, tok_times)
    else:
        status, steps, sched = _run_iterations(arrival, live, req, times, coef, policy == POLICY_CHUNKED,
                                               max_num_seqs, budget, threshold, enable_chunking, prefill_only_steps,
                                               usable_blocks, block_size, record, tok_times)
    return (status, times[:, TIME_FIRST].copy(), times[:, TIME_FINISH].copy(), times[:, TIME_SCHED].copy(),
            times[:, TIME_RELEASE].copy(), req[:, REQ_PREEMPT].copy(), req[:, REQ_REJECT].copy(),
            req[:, REQ_PADDED].copy(), req[:, REQ_COMPUTED].copy(), req[:, REQ_RECOMPUTED].copy(), tok_off,
            tok_times, steps, sched)
