"""The scheduler loop: one iteration at a time, for every batching policy, jitted.

Semantics (DESIGN section 4, vLLM V1 for ``chunked``) are spelled out where they are implemented, below.
Every jitted function this module's kernels call lives in this module, so numba's on-disk cache is
invalidated whenever any of them changes.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

N_COEF = 14

POLICIES = ("static", "dynamic", "continuous", "chunked")
POLICY_CODE = {name: i for i, name in enumerate(POLICIES)}

# Columns of the per-step record the kernel returns.
STEP_COLUMNS = (
    "start_s", "duration_s", "prefill_tokens", "decode_seqs", "running", "kv_blocks_used",
    "compute_bound", "flops", "hbm_bytes",
)
KIND_PREFILL, KIND_DECODE, KIND_PREEMPT = 0, 1, 2
KIND_NAMES = ("prefill", "decode", "preempt")

# Rejection codes (0 = served); the Python wrapper turns them into sentences.
REJECT_KV, REJECT_BUDGET, REJECT_RECOMPUTE = 1, 2, 3

STATUS_OK, STATUS_STUCK = 0, 1


@njit(cache=True)
def _step_cost(coef, new_tokens, attn_work, cached_tokens):
    """Seconds of one iteration from its aggregates (see ``cost`` for the formula).

    ``new_tokens`` = T, ``attn_work`` = sum c(2p + c) + 2 sum l, ``cached_tokens`` = sum p + sum l.
    Returns (total, gemm, attn, comm, elementwise, flops, hbm_bytes, compute_bound).
    """
    peak, bw = coef[4], coef[5]
    eta_c, eta_m, eta_a = coef[6], coef[7], coef[8]
    gemm_flops = coef[0] * new_tokens
    attn_flops = coef[2] * attn_work
    kv_bytes = coef[3] * (cached_tokens + new_tokens)
    act_bytes = coef[12] * new_tokens
    gemm_math = gemm_flops / (eta_c * peak)
    gemm_mem = coef[1] / (eta_m * bw)
    attn_math = attn_flops / (eta_a * peak)
    attn_mem = kv_bytes / (eta_m * bw)
    gemm = max(gemm_math, gemm_mem)
    attn = max(attn_math, attn_mem)
    elementwise = act_bytes / (coef[13] * bw)
    comm = coef[10] * new_tokens + coef[11]
    total = gemm + attn + elementwise + comm + coef[9]
    compute_bound = (gemm_math + attn_math) > (gemm_mem + attn_mem + elementwise)
    return total, gemm, attn, comm, elementwise, gemm_flops + attn_flops, coef[1] + kv_bytes + act_bytes, compute_bound


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
    steps[n_steps, 0] = start
    steps[n_steps, 1] = dur
    steps[n_steps, 2] = prefill_tokens
    steps[n_steps, 3] = decode_seqs
    steps[n_steps, 4] = running
    steps[n_steps, 5] = kv_used
    steps[n_steps, 6] = 1.0 if bound else 0.0
    steps[n_steps, 7] = flops
    steps[n_steps, 8] = nbytes
    return steps


@njit(cache=True)
def _record_sched(sched, n_sched, step, req, tokens, kind):
    sched = _grow(sched, n_sched + 1)
    sched[n_sched, 0] = step
    sched[n_sched, 1] = req
    sched[n_sched, 2] = tokens
    sched[n_sched, 3] = kind
    return sched


@njit(cache=True)
def _run_batched(arrival, prompt, output, live, tok_off, coef, batch_size, max_queue_delay_s, usable_blocks,
                 block_size, record, out_first, out_finish, out_sched, out_release, out_pad, out_computed, tok_times):
    """Static and dynamic batching: lockstep batches, padded prompts, every row runs to the longest output.

    A batch is dispatched when the server is free and either ``batch_size`` requests have arrived or the
    oldest has waited ``max_queue_delay_s`` (infinite for static), or the stream has ended. Its members are
    the oldest queued requests, as many as ``batch_size`` and the KV pool (padded reservation) allow.
    """
    n_live = live.shape[0]
    steps = np.empty((1024, 9))
    sched = np.empty((1024 if record else 1, 4), np.int64)
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
        dur, _g, _a, _c, _e, flops, nbytes, bound = _step_cost(coef, b * p_max, b * p_max * p_max, 0.0)
        steps = _record_step(steps, n_steps, t, dur, b * p_max, 0, b, kv_used, bound, flops, nbytes)
        if record:
            for k in range(head, end):
                sched = _record_sched(sched, n_sched, n_steps, live[k], p_max, KIND_PREFILL)
                n_sched += 1
        n_steps += 1
        t += dur
        for k in range(head, end):
            r = live[k]
            out_sched[r] = dispatch
            out_first[r] = t
            tok_times[tok_off[r]] = t
            out_pad[r] = (p_max - prompt[r]) + (o_max - output[r])
            out_computed[r] = prompt[r] + output[r] - 1
            if output[r] == 1:
                out_finish[r] = t
        # Decode: o_max - 1 steps of b rows; row contexts are p_max + s - 1 cached tokens.
        for s in range(1, o_max):
            ctx = p_max + s - 1
            dur, _g, _a, _c, _e, flops, nbytes, bound = _step_cost(coef, b, 2.0 * b * ctx, b * ctx)
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
                        out_finish[r] = t
        for k in range(head, end):
            out_release[live[k]] = t
        now = t
        head = end
    return steps[:n_steps], sched[:n_sched]


# Columns of the running table: one row per running request, in admission order, so every pass over the
# running set walks contiguous memory (the per-request arrays are too large to stay in cache).
_REQ, _PROMPT, _EMIT, _COMP, _OUT, _BLOCKS, _TOK, _TOKPOS = range(8)
_NCOL = 8


@njit(cache=True)
def _is_decode(run, k):
    """Row ``k`` needs one token on top of everything it knows: a decode, not a prompt chunk."""
    return run[k, _EMIT] > 0 and run[k, _COMP] == run[k, _PROMPT] + run[k, _EMIT] - 1


@njit(cache=True)
def _run_iterations(arrival, prompt, output, live, tok_off, coef, chunked, max_num_seqs, budget, threshold,
                    enable_chunking, prefill_only_steps, usable_blocks, block_size, record,
                    out_first, out_finish, out_sched, out_release, out_preempt, out_reject, out_computed,
                    out_recomputed, tok_times):
    """Iteration-level policies: Orca-style ``continuous`` and vLLM V1 ``chunked``.

    ``budget`` <= 0 means no token budget (continuous only). The requests scheduled in an iteration are
    always a contiguous range of the running table: V1 schedules running requests in order until the
    budget or the pool runs out (then admits nobody), and appends admitted ones at the end.
    """
    n = arrival.shape[0]
    n_live = live.shape[0]
    emitted = np.zeros(n, np.int64)  # tokens produced so far (kept across preemption)
    # Work lost to preemption: each preemption throws away the tokens computed so far. A request that
    # completes computes each of its prompt + output - 1 positions once, plus everything it lost again,
    # so its recomputed tokens equal its lost ones.
    lost = np.zeros(n, np.int64)
    high_water = np.zeros(n, np.int64)  # most tokens ever computed (for requests rejected after preemption)
    run = np.zeros((min(n, max_num_seqs) + 1, _NCOL), np.int64)
    n_running = 0
    # Waiting queue: a ring buffer, since preempted requests go back to its front.
    wait = np.empty(n, np.int64)
    w_head = 0
    w_len = 0
    skipped = np.empty(n, np.int64)
    victims = np.empty(n, np.int64)
    steps = np.empty((1024, 9))
    sched = np.empty((1024 if record else 1, 4), np.int64)
    n_steps = 0
    n_sched = 0
    free_blocks = usable_blocks
    now = 0.0
    nxt = 0  # next live request to arrive
    finished = 0
    while finished < n_live:
        while nxt < n_live and arrival[live[nxt]] <= now:
            wait[(w_head + w_len) % n] = live[nxt]
            w_len += 1
            nxt += 1
        if n_running == 0 and w_len == 0:
            now = arrival[live[nxt]]
            continue
        lo = 0  # scheduled rows of the running table: [lo, hi)
        hi = 0
        left = budget
        preempted = False
        n_victims = 0
        # Aggregates of the iteration for the cost model.
        new_tokens = 0
        attn_work = 0.0
        cached = 0
        prefill_tokens = 0
        decode_seqs = 0
        if chunked:
            # 1. Running requests, in admission order.
            while hi < n_running and left > 0:
                want = run[hi, _PROMPT] + run[hi, _EMIT] - run[hi, _COMP]
                if threshold > 0 and want > threshold:
                    want = threshold
                if want > left:
                    want = left
                need = 0
                if run[hi, _COMP] + want > run[hi, _BLOCKS] * block_size:  # skips a division on most steps
                    need = _blocks_for(run[hi, _COMP] + want, block_size) - run[hi, _BLOCKS]
                scheduled = True
                while need > free_blocks:
                    # Preempt the last running request: free everything, restart from zero, front of queue.
                    v = n_running - 1
                    victim = run[v, _REQ]
                    emitted[victim] = run[v, _EMIT]
                    lost[victim] += run[v, _COMP]
                    high_water[victim] = max(high_water[victim], run[v, _COMP])
                    free_blocks += run[v, _BLOCKS]
                    n_running -= 1
                    out_preempt[victim] += 1
                    w_head = (w_head - 1) % n
                    wait[w_head] = victim
                    w_len += 1
                    preempted = True
                    victims[n_victims] = victim
                    n_victims += 1
                    if v == hi:
                        scheduled = False
                        break
                if not scheduled:
                    break
                free_blocks -= need
                run[hi, _BLOCKS] += need
                run[hi, _TOK] = want
                left -= want
                hi += 1
            if record:
                # Recorded after the pass: reassigning an array inside the hot loop costs refcounting.
                for k in range(n_victims):
                    sched = _record_sched(sched, n_sched, n_steps, victims[k], 0, KIND_PREEMPT)
                    n_sched += 1
            # 2. Waiting requests, oldest first, only if nobody was preempted in this iteration.
            if not preempted:
                n_skip = 0
                while w_len > 0 and left > 0 and n_running < max_num_seqs:
                    r = wait[w_head]
                    want = prompt[r] + emitted[r]
                    if threshold > 0 and want > threshold:
                        want = threshold
                    if not enable_chunking and want > left:
                        # vLLM V1 sets it aside and tries the next one; it keeps its place at the front.
                        w_head = (w_head + 1) % n
                        w_len -= 1
                        if want > budget:
                            # A resumed request whose recomputation can never fit one iteration.
                            out_reject[r] = REJECT_RECOMPUTE
                            finished += 1
                        else:
                            skipped[n_skip] = r
                            n_skip += 1
                        continue
                    if want > left:
                        want = left
                    need = _blocks_for(want, block_size)
                    if need > free_blocks:
                        break
                    w_head = (w_head + 1) % n
                    w_len -= 1
                    free_blocks -= need
                    if out_sched[r] != out_sched[r]:  # NaN: first time scheduled
                        out_sched[r] = now
                    _admit(run, n_running, r, prompt, output, emitted, tok_off, need, want)
                    n_running += 1
                    hi = n_running
                    left -= want
                for k in range(n_skip - 1, -1, -1):
                    w_head = (w_head - 1) % n
                    wait[w_head] = skipped[k]
                    w_len += 1
        else:
            # Orca: whole prompts join, KV for prompt + output reserved up front; no preemption.
            first_new = n_running
            prompt_sum = 0
            while w_len > 0 and n_running < max_num_seqs:
                r = wait[w_head]
                need = _blocks_for(prompt[r] + output[r] - 1, block_size)
                if need > free_blocks or (budget > 0 and prompt_sum + prompt[r] > budget):
                    break
                w_head = (w_head + 1) % n
                w_len -= 1
                free_blocks -= need
                prompt_sum += prompt[r]
                out_sched[r] = now
                _admit(run, n_running, r, prompt, output, emitted, tok_off, need, prompt[r])
                n_running += 1
            lo = first_new if (prefill_only_steps and n_running > first_new) else 0
            hi = n_running
        if hi == lo:
            # Only possible when every waiting request was just rejected; anything else is a bug.
            if finished == n_live or (n_running == 0 and w_len == 0):
                continue
            return STATUS_STUCK, steps[:n_steps], sched[:n_sched]
        if record:
            for k in range(lo, hi):
                sched = _record_sched(sched, n_sched, n_steps, run[k, _REQ], run[k, _TOK],
                                      KIND_DECODE if _is_decode(run, k) else KIND_PREFILL)
                n_sched += 1
        # One pass over the scheduled rows sums the iteration's aggregates for the cost model and emits:
        # a request that has computed every token it knows samples the next one. Emissions are stamped
        # with the step's index and turned into times after the loop, so the duration is not needed here.
        first_done = -1
        for k in range(lo, hi):
            c = run[k, _TOK]
            p = run[k, _COMP]
            known = run[k, _PROMPT] + run[k, _EMIT]
            cached += p
            if run[k, _EMIT] > 0 and p == known - 1:  # a decode
                attn_work += 2.0 * p
                decode_seqs += 1
            else:
                attn_work += c * (2.0 * p + c)
                prefill_tokens += c
            run[k, _COMP] = p + c
            run[k, _TOK] = 1  # Orca: after its first iteration a row only decodes (chunked resets it anyway)
            if p + c == known:
                tok_times[run[k, _TOKPOS]] = n_steps
                run[k, _TOKPOS] += 1
                run[k, _EMIT] += 1
                if run[k, _EMIT] == 1:
                    out_first[run[k, _REQ]] = n_steps
                if run[k, _EMIT] == run[k, _OUT]:
                    r = run[k, _REQ]
                    out_finish[r] = n_steps
                    if first_done < 0:
                        first_done = k
        new_tokens = decode_seqs + prefill_tokens
        dur, _g, _a, _c, _e, flops, nbytes, bound = _step_cost(coef, new_tokens, attn_work, cached)
        steps = _record_step(steps, n_steps, now, dur, prefill_tokens, decode_seqs, n_running,
                             usable_blocks - free_blocks, bound, flops, nbytes)
        n_steps += 1
        now += dur
        if first_done >= 0:
            # Finished requests leave; the others keep their order.
            j = first_done
            for i in range(first_done, n_running):
                if run[i, _EMIT] == run[i, _OUT]:
                    emitted[run[i, _REQ]] = run[i, _EMIT]
                    free_blocks += run[i, _BLOCKS]
                    finished += 1
                else:
                    if j != i:
                        for col in range(_NCOL):
                            run[j, col] = run[i, col]
                    j += 1
            n_running = j
    # Step indices to times: every emission happens at the end of its step.
    ends = steps[:n_steps, 0] + steps[:n_steps, 1]
    for i in range(tok_times.shape[0]):
        if tok_times[i] == tok_times[i]:
            tok_times[i] = ends[int(tok_times[i])]
    for r in live:
        if out_first[r] == out_first[r]:
            out_first[r] = ends[int(out_first[r])]
        if out_finish[r] == out_finish[r]:
            out_finish[r] = ends[int(out_finish[r])]
            out_release[r] = out_finish[r]
    # Token accounting: a completed request computed prompt + output - 1 positions once, plus what it lost.
    for r in live:
        if out_reject[r] == 0:
            out_recomputed[r] = lost[r]
            out_computed[r] = prompt[r] + output[r] - 1 + lost[r]
        else:
            out_recomputed[r] = lost[r] - high_water[r]
            out_computed[r] = lost[r]
    return STATUS_OK, steps[:n_steps], sched[:n_sched]


@njit(cache=True)
def _admit(run, i, r, prompt, output, emitted, tok_off, blocks, tokens):
    """Fill row ``i`` of the running table with request ``r`` (nothing computed yet)."""
    run[i, _REQ] = r
    run[i, _PROMPT] = prompt[r]
    run[i, _EMIT] = emitted[r]
    run[i, _COMP] = 0
    run[i, _OUT] = output[r]
    run[i, _BLOCKS] = blocks
    run[i, _TOK] = tokens
    run[i, _TOKPOS] = tok_off[r] + emitted[r]


@njit(cache=True)
def _simulate_kernel(arrival, prompt, output, policy, coef, batch_size, max_queue_delay_s, max_num_seqs, budget,
                     threshold, enable_chunking, prefill_only_steps, usable_blocks, block_size, record):
    """Run one policy over a request stream. Arrays in, arrays out; no globals, no randomness.

    Requests that can never be served are marked in ``reject`` before the loop and never enter it.
    """
    n = arrival.shape[0]
    nan = np.nan
    first = np.full(n, nan)
    finish = np.full(n, nan)
    sched_s = np.full(n, nan)
    release = np.full(n, nan)
    preempt = np.zeros(n, np.int64)
    reject = np.zeros(n, np.int64)
    pad = np.zeros(n, np.int64)
    computed = np.zeros(n, np.int64)
    recomputed = np.zeros(n, np.int64)
    tok_off = np.zeros(n + 1, np.int64)
    for r in range(n):
        tok_off[r + 1] = tok_off[r] + output[r]
    tok_times = np.full(tok_off[n], nan)
    n_live = 0
    live = np.empty(n, np.int64)
    for r in range(n):
        if _blocks_for(prompt[r] + output[r] - 1, block_size) > usable_blocks:
            reject[r] = REJECT_KV
        elif budget > 0 and prompt[r] > budget and (policy == 2 or (policy == 3 and not enable_chunking)):
            reject[r] = REJECT_BUDGET
        else:
            live[n_live] = r
            n_live += 1
    live = live[:n_live]
    status = STATUS_OK
    if policy <= 1:
        delay = max_queue_delay_s if policy == 1 else np.inf
        steps, sched = _run_batched(arrival, prompt, output, live, tok_off, coef, batch_size, delay, usable_blocks,
                                    block_size, record, first, finish, sched_s, release, pad, computed, tok_times)
    else:
        status, steps, sched = _run_iterations(
            arrival, prompt, output, live, tok_off, coef, policy == 3, max_num_seqs, budget, threshold,
            enable_chunking, prefill_only_steps, usable_blocks, block_size, record,
            first, finish, sched_s, release, preempt, reject, computed, recomputed, tok_times)
    return (status, first, finish, sched_s, release, preempt, reject, pad, computed, recomputed, tok_off, tok_times,
            steps, sched)


# -- the public wrapper --------------------------------------------------------------------------

GiB = 1024**3


def vllm_defaults(hardware, usage: str = "serve") -> dict[str, int]:
    """vLLM V1's default ``max_num_seqs`` and ``max_num_batched_tokens`` for a GPU.

    They depend on the GPU, not the model: GPUs with at least 70 GiB other than the A100 get 1024
    sequences and 8192 tokens (``vllm serve``) or 16384 (offline ``LLM``); every other GPU 256 sequences and
    2048 / 8192 tokens (vLLM ``EngineArgs._set_default_args``).
    """
    if usage not in ("serve", "offline"):
        raise ValueError(f"usage must be 'serve' or 'offline', got {usage!r}")
    large = hardware.hbm_bytes >= 70 * GiB and "a100" not in hardware.name
    if large:
        return {"max_num_seqs": 1024, "max_num_batched_tokens": 8192 if usage == "serve" else 16384}
    return {"max_num_seqs": 256, "max_num_batched_tokens": 2048 if usage == "serve" else 8192}


_KNOB_POLICIES = {
    "batch_size": ("static", "dynamic"),
    "max_queue_delay_s": ("dynamic",),
    "max_num_seqs": ("continuous", "chunked"),
    "max_num_batched_tokens": ("continuous", "chunked"),
    "prefill_only_steps": ("continuous",),
    "long_prefill_token_threshold": ("chunked",),
    "enable_chunked_prefill": ("chunked",),
}


def _int_knob(name, value, low):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def simulate(requests, policy: str, cost, *, batch_size=None, max_queue_delay_s=None, max_num_seqs=None,
             max_num_batched_tokens=None, prefill_only_steps=None, long_prefill_token_threshold=None,
             enable_chunked_prefill=None, block_size: int = 16, gpu_memory_utilization: float = 0.9,
             num_kv_blocks=None, record_schedule: bool = False):
    """Replay ``requests`` through one batching policy, one iteration at a time.

    Parameters
    ----------
    requests : Requests
        The stream (arrivals in seconds, token counts).
    policy : {"static", "dynamic", "continuous", "chunked"}
        See DESIGN section 4 and the notebooks: lockstep batches (static, dynamic), Orca's
        iteration-level batching (continuous) and vLLM V1 / Sarathi-Serve chunked prefill (chunked).
    cost : CostModel
        Gives each iteration's duration.
    batch_size : int, default 32
        Requests per lockstep batch (static, dynamic).
    max_queue_delay_s : float, default 0.05
        Seconds the oldest queued request may wait before a partial batch leaves (dynamic).
    max_num_seqs : int, default vLLM's for the GPU
        Cap on running sequences (continuous, chunked).
    max_num_batched_tokens : int
        Token budget per iteration (chunked; default vLLM's ``vllm serve`` value for the GPU). Under
        continuous, optional: the most prompt tokens admitted in one iteration (vLLM V0).
    prefill_only_steps : bool, default False
        Continuous: iterations that admit prompts run prefill only (vLLM V0) instead of alongside decodes.
    long_prefill_token_threshold : int, default 0
        Chunked: cap on tokens per request per iteration (0 = none).
    enable_chunked_prefill : bool, default True
        Chunked: False makes a prompt that does not fit the remaining budget wait for a later iteration;
        as in vLLM V1, requests behind it that do fit are admitted meanwhile.
    block_size : int, default 16
        Tokens per KV block.
    gpu_memory_utilization : float, default 0.9
        Share of HBM for weights plus KV cache.
    num_kv_blocks : int, optional
        Override the KV pool size (blocks per GPU, one of them vLLM's null block).
    record_schedule : bool, default False
        Also record ``schedule``: one row per request per iteration it was scheduled or preempted in.

    Returns
    -------
    SimResult
    """
    from .cost import CostModel
    from .result import SimResult
    from .workload import Requests

    if not isinstance(requests, Requests):
        raise ValueError("requests must be a batchlab.Requests")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if not isinstance(cost, CostModel):
        raise ValueError("cost must be a batchlab.CostModel")
    given = {
        "batch_size": batch_size, "max_queue_delay_s": max_queue_delay_s, "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens, "prefill_only_steps": prefill_only_steps,
        "long_prefill_token_threshold": long_prefill_token_threshold,
        "enable_chunked_prefill": enable_chunked_prefill,
    }
    for knob, value in given.items():
        if value is not None and policy not in _KNOB_POLICIES[knob]:
            raise ValueError(f"{knob} applies to policy {' or '.join(_KNOB_POLICIES[knob])}, not {policy!r}")
    block_size = _int_knob("block_size", block_size, 1)
    if num_kv_blocks is None:
        num_kv_blocks = cost.kv_pool_blocks(gpu_memory_utilization, block_size)
        if num_kv_blocks < 2:
            raise ValueError(
                f"the weights ({cost.weight_bytes / 1e9:.1f} GB per GPU) leave no room for a KV cache at "
                f"gpu_memory_utilization={gpu_memory_utilization}; raise it, use tp > 1 or fp8"
            )
    else:
        num_kv_blocks = _int_knob("num_kv_blocks", num_kv_blocks, 2)
    defaults = vllm_defaults(cost.hardware)
    knobs = {"block_size": block_size, "num_kv_blocks": num_kv_blocks}
    if policy in ("static", "dynamic"):
        knobs["batch_size"] = _int_knob("batch_size", 32 if batch_size is None else batch_size, 1)
        if policy == "dynamic":
            delay = 0.05 if max_queue_delay_s is None else max_queue_delay_s
            if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not (0 <= delay < math.inf):
                raise ValueError(f"max_queue_delay_s must be finite seconds >= 0, got {delay!r}")
            knobs["max_queue_delay_s"] = float(delay)
    else:
        knobs["max_num_seqs"] = _int_knob(
            "max_num_seqs", defaults["max_num_seqs"] if max_num_seqs is None else max_num_seqs, 1)
        if policy == "chunked" and max_num_batched_tokens is None:
            max_num_batched_tokens = defaults["max_num_batched_tokens"]
        if max_num_batched_tokens is not None:
            knobs["max_num_batched_tokens"] = _int_knob("max_num_batched_tokens", max_num_batched_tokens, 1)
        if policy == "continuous":
            knobs["prefill_only_steps"] = bool(prefill_only_steps)
        else:
            knobs["long_prefill_token_threshold"] = _int_knob(
                "long_prefill_token_threshold", 0 if long_prefill_token_threshold is None
                else long_prefill_token_threshold, 0)
            knobs["enable_chunked_prefill"] = True if enable_chunked_prefill is None else bool(enable_chunked_prefill)
    raw = _simulate_kernel(
        requests.arrival_s, requests.prompt_tokens, requests.output_tokens, POLICY_CODE[policy],
        cost.coefficients(), knobs.get("batch_size", 1), knobs.get("max_queue_delay_s", 0.0),
        knobs.get("max_num_seqs", 1), knobs.get("max_num_batched_tokens", 0),
        knobs.get("long_prefill_token_threshold", 0), knobs.get("enable_chunked_prefill", True),
        knobs.get("prefill_only_steps", False), num_kv_blocks - 1, block_size, bool(record_schedule),
    )
    if raw[0] != STATUS_OK:
        raise RuntimeError("the scheduler loop could not schedule anything yet has unfinished requests (a bug)")
    return SimResult.from_kernel(requests, policy, cost, knobs, raw, record_schedule)
