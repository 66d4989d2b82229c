"""Iteration-level batching, one iteration at a time: Orca's ``continuous`` and vLLM 0.33's ``chunked``.

The steps of one iteration (DESIGN sections 4 and 4c) are the helpers below: ``_send_and_queue`` (clients
send, requests join the waiting queue), ``_schedule_running`` (chunked step 1: running requests first,
preempting the last one when blocks run out), ``_admit_waiting`` (chunked step 2), ``_admit_whole_prompts``
(Orca's admission), ``_run_scheduled`` (step 3: the iteration's aggregates and the tokens it emits), once the
step is timed ``_stamp_events`` and ``_count_gaps``, and ``_release_finished``; after the loop, ``_settle_risky``
and ``_account_tokens``. vLLM 0.33's rules are switched by the bits of ``rules`` (``layout.RULE_*``); with none
of them set the loop is the first version's, bit for bit. Helpers are called only when they have work, since every
array argument of a call costs a little. The loop that calls them, resumable for several engines, is in
:mod:`.engine`.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import kvcache as kv
from .cost import serve_time
from .layout import (KIND_CACHED, KIND_DECODE, KIND_PREFILL, NO_ROW, REJECT_RECOMPUTE, REQ_CACHED, REQ_COMPUTED,
                     REQ_EMITTED, REQ_HIGH_WATER, REQ_LAST_HIT, REQ_LAST_STEP, REQ_LOST, REQ_OUTPUT, REQ_PREEMPT,
                     REQ_PRELOADED, REQ_PROMPT, REQ_RECOMPUTED, REQ_REJECT, REQ_RISK, REQ_TOK_OFF, RULE_CHUNKING,
                     RULE_RESERVE_FULL, RULE_STOP_UNFIT, RUN_BLOCKS, RUN_CACHED, RUN_COLUMNS, RUN_COMP, RUN_EMIT,
                     RUN_HIT, RUN_LAST, RUN_OUT, RUN_PROMPT, RUN_REQ, RUN_RISK, RUN_SEAT, RUN_TOK, RUN_TOKPOS, ST_DONE,
                     ST_FINISHED, ST_FREE_BLOCKS, ST_IN_FLIGHT, ST_NEXT, ST_PENDING, ST_RUNNING, ST_SCHED, ST_SLOT_HEAD,
                     ST_STEPS, ST_WAIT_HEAD, ST_WAIT_LEN, TIME_ARRIVAL, TIME_FINISH, TIME_FIRST, TIME_LAST,
                     TIME_RELEASE, TIME_SCHED, TIME_SEEN, TIME_SENT)
from .gaps import add_gaps
from .records import blocks_for, write_sched


@njit(cache=True, _nrt=False)
def _is_decode(run, k):
    """Row ``k`` needs one token on top of everything it knows: a decode, not a prompt chunk."""
    return run[k, RUN_EMIT] > 0 and run[k, RUN_COMP] == run[k, RUN_PROMPT] + run[k, RUN_EMIT] - 1


@njit(cache=True, _nrt=False)
def _write_last_token(tok_times, run, k, t):
    """Row ``k``'s latest token came at ``t``: into the token record, if there is one. Each token is written
    once, when its time is first known: at the row's next pass (it came at the end of the step before), at its
    stamp if it is the request's last, or when the row is preempted or left out of a step first."""
    if tok_times.shape[0] > 0:
        tok_times[run[k, RUN_TOKPOS] - 1] = t


@njit(cache=True, _nrt=False)
def _admit(run, run_t, i, r, req, times, blocks, tokens, computed, seat):
    """Fill row ``i`` of the running table with request ``r``, ``computed`` tokens already in its cache."""
    run[i, RUN_REQ] = r
    run[i, RUN_PROMPT] = req[r, REQ_PROMPT]
    run[i, RUN_EMIT] = req[r, REQ_EMITTED]
    run[i, RUN_COMP] = computed
    run[i, RUN_OUT] = req[r, REQ_OUTPUT]
    run[i, RUN_BLOCKS] = blocks
    run[i, RUN_TOK] = tokens
    run[i, RUN_TOKPOS] = req[r, REQ_TOK_OFF] + req[r, REQ_EMITTED]
    run[i, RUN_SEAT] = seat
    run[i, RUN_CACHED] = blocks  # blocks already cached: the hits (prefix caching)
    run[i, RUN_HIT] = computed
    run[i, RUN_LAST] = req[r, REQ_LAST_STEP]
    run[i, RUN_RISK] = req[r, REQ_RISK]
    run_t[i] = times[r, TIME_LAST]


@njit(cache=True, _nrt=False)
def _free_slot(st, slot_times, t):
    """A closed-loop client gets its answer at ``t`` and may send again."""
    n_slots = slot_times.shape[0]
    if n_slots > 0:
        slot_times[(st[ST_SLOT_HEAD] + n_slots - st[ST_IN_FLIGHT]) % n_slots] = t
        st[ST_IN_FLIGHT] -= 1


@njit(cache=True, _nrt=False)
def _send_and_queue(st, times, live, wait, slot_times, view_s, req, coef, frontend):
    """Clients send requests (closed loop: at most ``len(slot_times)`` in flight, each sent when a slot frees),
    the API server passes them on (``serve_time``; ``frontend[0]``: when it is free), and those the engine sees
    by ``view_s`` join the back of the waiting queue. Returns when the engine sees the next one."""
    n = wait.shape[0]
    n_live = live.shape[0]
    n_slots = slot_times.shape[0]
    while st[ST_NEXT] < n_live:
        r = live[st[ST_NEXT]]
        if times[r, TIME_SEEN] != times[r, TIME_SEEN]:  # NaN: not through the API server yet
            if times[r, TIME_SENT] != times[r, TIME_SENT]:  # NaN: a closed-loop request waiting for a client
                if st[ST_IN_FLIGHT] == n_slots:
                    return np.inf
                times[r, TIME_SENT] = max(times[r, TIME_ARRIVAL], slot_times[st[ST_SLOT_HEAD]])
                st[ST_SLOT_HEAD] = (st[ST_SLOT_HEAD] + 1) % n_slots
                st[ST_IN_FLIGHT] += 1
            times[r, TIME_SEEN], frontend[0] = serve_time(frontend[0], times[r, TIME_SENT], req[r, REQ_PROMPT], coef)
        if times[r, TIME_SEEN] > view_s:
            return times[r, TIME_SEEN]
        wait[(st[ST_WAIT_HEAD] + st[ST_WAIT_LEN]) % n] = r
        st[ST_WAIT_LEN] += 1
        st[ST_NEXT] += 1
    return np.inf


# -- the two choices vLLM's policy makes: whom to preempt and whom to admit next. Every other function works for
# any answer, so a policy (vLLM's priority scheduling: the victim is the running request of the largest (priority,
# arrival), the next admitted the waiting one of the smallest) changes these and their tests only.

@njit(cache=True, _nrt=False)
def choose_victim(run, n_running):
    """The running row vLLM 0.33's FCFS policy preempts: the last one, the latest admitted (``scheduler.py``
    ``Scheduler.schedule``: ``self.running.pop()``)."""
    return n_running - 1


@njit(cache=True, _nrt=False)
def next_waiting(st, wait):
    """The waiting request vLLM 0.33's FCFS policy tries next: the front of the queue (``scheduler.py``
    ``Scheduler.schedule``: ``self.waiting.peek_request()``), where a preempted request was put back too."""
    return wait[st[ST_WAIT_HEAD]]


@njit(cache=True, _nrt=False)
def _pop_waiting(st, wait):
    """Take the request :func:`next_waiting` named off the queue."""
    st[ST_WAIT_HEAD] = (st[ST_WAIT_HEAD] + 1) % wait.shape[0]
    st[ST_WAIT_LEN] -= 1


@njit(cache=True, _nrt=False)
def _preempt_row(st, run, run_t, wait, req, times, pool, seat_blocks, prefix_ids, prefix_tokens, unique_stride,
                 block_size, step_index, prev_end, tok_times, v):
    """Preempt running row ``v``: free its blocks, restart it from zero at the front of the queue; the rows
    after it move up one, keeping their order.

    Returns the request preempted, or -1 when the row had already finished (async scheduling still held it):
    it simply leaves. A token it emitted in the step just before is written to ``tok_times`` here.
    """
    n = wait.shape[0]
    victim = run[v, RUN_REQ]
    if pool.shape[0] > 1:
        seat = run[v, RUN_SEAT]
        if run[v, RUN_EMIT] < run[v, RUN_OUT]:
            kv.index_own_blocks(pool, req, victim, seat_blocks, seat, run[v, RUN_BLOCKS], block_size, prefix_ids,
                                prefix_tokens, unique_stride)
        kv.release(st, pool, seat_blocks, seat, run[v, RUN_BLOCKS])
    else:
        st[ST_FREE_BLOCKS] += run[v, RUN_BLOCKS]
    st[ST_RUNNING] -= 1
    req[victim, REQ_EMITTED] = run[v, RUN_EMIT]
    req[victim, REQ_LAST_STEP] = run[v, RUN_LAST]
    times[victim, TIME_LAST] = prev_end if run[v, RUN_LAST] == step_index - 1 else run_t[v]
    if run[v, RUN_LAST] == step_index - 1:
        _write_last_token(tok_times, run, v, prev_end)
    if run[v, RUN_EMIT] == run[v, RUN_OUT]:
        st[ST_FINISHED] += 1
        st[ST_PENDING] -= 1
        _move_rows(run, run_t, v, v + 1, st[ST_RUNNING] - v)
        return -1
    req[victim, REQ_LOST] += run[v, RUN_COMP] - run[v, RUN_HIT]
    req[victim, REQ_HIGH_WATER] = max(req[victim, REQ_HIGH_WATER], run[v, RUN_COMP])
    req[victim, REQ_PREEMPT] += 1
    req[victim, REQ_PRELOADED] = 0  # the KV that came with it is gone: it recomputes its prompt here
    st[ST_WAIT_HEAD] = (st[ST_WAIT_HEAD] - 1) % n
    wait[st[ST_WAIT_HEAD]] = victim
    st[ST_WAIT_LEN] += 1
    _move_rows(run, run_t, v, v + 1, st[ST_RUNNING] - v)
    return victim


@njit(cache=True, _nrt=False)
def _grow_blocks(st, run, k, need, known, req, pool, seat_blocks, prefix_ids, prefix_tokens, unique_stride,
                 block_size):
    """Give row ``k`` ``need`` more blocks (free ones, evicting cached keys) and cache its newly full blocks."""
    if pool.shape[0] > 1:
        seat = run[k, RUN_SEAT]
        if need > 0:
            kv.allocate(st, pool, seat_blocks, seat, run[k, RUN_BLOCKS], need)
        full = min(run[k, RUN_COMP] + run[k, RUN_TOK], known) // block_size
        if full > run[k, RUN_CACHED]:
            kv.register_full(st, pool, req, run[k, RUN_REQ], seat_blocks, seat, run[k, RUN_CACHED], full, block_size,
                             prefix_ids, prefix_tokens, unique_stride)
            run[k, RUN_CACHED] = full
    else:
        st[ST_FREE_BLOCKS] -= need
    run[k, RUN_BLOCKS] += need


@njit(cache=True, _nrt=False)
def _schedule_running(st, run, run_t, wait, req, times, victims, budget, threshold, block_size, pool, seat_blocks,
                      prefix_ids, prefix_tokens, unique_stride, step_index, prev_end, tok_times):
    """Chunked step 1: running requests in admission order, each asking for a decode or its next chunk.

    A request that cannot get its blocks preempts the row :func:`choose_victim` names (possibly itself, which
    ends the pass; one already scheduled in this step gives its tokens back). A row that has finished (held one
    more step by async scheduling) is skipped. Returns (rows passed, rows scheduled, budget left, requests
    preempted in ``victims``, rows dropped, the lowest row dropped or NO_ROW).
    """
    caching = pool.shape[0] > 1
    hi = 0
    n_scheduled = 0
    left = budget
    n_victims = 0
    n_dropped = 0
    lowest = NO_ROW
    n_running = st[ST_RUNNING]  # locals: the state vector is written only around calls that change it
    free = st[ST_FREE_BLOCKS]
    while hi < n_running and left > 0:
        known = run[hi, RUN_PROMPT] + run[hi, RUN_EMIT]
        if run[hi, RUN_EMIT] == run[hi, RUN_OUT]:
            run[hi, RUN_TOK] = 0
            hi += 1
            continue
        want = known - run[hi, RUN_COMP]
        if threshold > 0 and want > threshold:
            want = threshold
        if want > left:
            want = left
        need = 0
        if run[hi, RUN_COMP] + want > run[hi, RUN_BLOCKS] * block_size:  # skips a division on most steps
            need = blocks_for(run[hi, RUN_COMP] + want, block_size) - run[hi, RUN_BLOCKS]
        scheduled = True
        while need > free:
            v = choose_victim(run, n_running)
            if v < hi and run[v, RUN_EMIT] != run[v, RUN_OUT]:  # scheduled in this step: its tokens come back
                left += run[v, RUN_TOK]
                n_scheduled -= 1
            st[ST_FREE_BLOCKS] = free
            victim = _preempt_row(st, run, run_t, wait, req, times, pool, seat_blocks, prefix_ids, prefix_tokens,
                                  unique_stride, block_size, step_index, prev_end, tok_times, v)
            n_running = st[ST_RUNNING]
            free = st[ST_FREE_BLOCKS]
            n_dropped += 1
            lowest = min(lowest, v)
            if victim >= 0:
                victims[n_victims] = victim
                n_victims += 1
            if v == hi:
                scheduled = False
                break
            if v < hi:
                hi -= 1  # the rows after it, this one included, moved up one
        if not scheduled:
            break
        run[hi, RUN_TOK] = want
        if not caching:  # counted blocks: no call (a call with many array arguments costs about 100 ns)
            free -= need
            run[hi, RUN_BLOCKS] += need
        else:
            if need > 0:
                st[ST_FREE_BLOCKS] = free
                kv.allocate(st, pool, seat_blocks, run[hi, RUN_SEAT], run[hi, RUN_BLOCKS], need)
                free = st[ST_FREE_BLOCKS]
                run[hi, RUN_BLOCKS] += need
            if run[hi, RUN_COMP] + want >= (run[hi, RUN_CACHED] + 1) * block_size:  # a block filled up
                full = (run[hi, RUN_COMP] + want) // block_size  # want never passes the tokens known
                kv.register_full(st, pool, req, run[hi, RUN_REQ], seat_blocks, run[hi, RUN_SEAT], run[hi, RUN_CACHED],
                                 full, block_size, prefix_ids, prefix_tokens, unique_stride)
                run[hi, RUN_CACHED] = full
        left -= want
        hi += 1
        n_scheduled += 1
    st[ST_FREE_BLOCKS] = free
    if hi < n_running and n_dropped > 0:  # rows a victim before the last row kept the pass from reaching
        _settle_last(run, run_t, hi, n_running, step_index, prev_end, tok_times)
    return hi, n_scheduled, left, n_victims, n_dropped, lowest


@njit(cache=True, _nrt=False)
def _admit_waiting(st, run, run_t, wait, skipped, slot_times, pool, seat_blocks, hit_slots, req, times, config, now,
                   left, threshold):
    """Chunked step 2: waiting requests, oldest first, while seats, budget and blocks last.

    A newcomer reuses the cached blocks of its prefix (prefix caching), then asks for its first chunk, capped
    by the threshold and the budget left; if that chunk's blocks (or, with full-prompt reservation, its whole
    sequence's) cannot be had, admission stops. With chunking off, a request that does not fit the budget left
    stops admission (vLLM 0.33) or, without that rule, is set aside while the next is tried (vLLM before it).
    """
    budget, rules, max_num_seqs, block_size = config.budget, config.rules, config.max_num_seqs, config.block_size
    prefix_ids, prefix_tokens, unique_stride = config.prefix_ids, config.prefix_tokens, config.max_blocks + 1
    n = wait.shape[0]
    n_skip = 0
    caching = pool.shape[0] > 1
    while st[ST_WAIT_LEN] > 0 and left > 0 and st[ST_RUNNING] < max_num_seqs:
        r = next_waiting(st, wait)
        n_tokens = req[r, REQ_PROMPT] + req[r, REQ_EMITTED]
        hits = 0
        idle = 0
        if caching:
            hits, idle = kv.longest_hit(req, r, n_tokens, block_size, prefix_ids, prefix_tokens, unique_stride, pool,
                                        hit_slots)
        computed = hits * block_size
        if req[r, REQ_PRELOADED]:  # its prompt's KV came from a prefill instance: only the next token to compute
            computed = n_tokens - 1
        want = n_tokens - computed
        if threshold > 0 and want > threshold:
            want = threshold
        if rules & RULE_CHUNKING == 0 and want > left:
            if want > budget:  # a resumed request whose recomputation can never fit one iteration
                _pop_waiting(st, wait)
                req[r, REQ_REJECT] = REJECT_RECOMPUTE
                st[ST_FINISHED] += 1
                _free_slot(st, slot_times, now)
                continue
            if rules & RULE_STOP_UNFIT:
                break
            _pop_waiting(st, wait)  # set aside; it keeps its place at the front
            skipped[n_skip] = r
            n_skip += 1
            continue
        if want > left:
            want = left
        if caching:
            need, need_full = kv.blocks_to_admit(n_tokens, computed, want, hits, idle, block_size)
        else:
            need, need_full = blocks_for(computed + want, block_size), blocks_for(n_tokens, block_size)
        if need > st[ST_FREE_BLOCKS] or (rules & RULE_RESERVE_FULL and need_full > st[ST_FREE_BLOCKS]):
            break
        _pop_waiting(st, wait)
        if times[r, TIME_SCHED] != times[r, TIME_SCHED]:  # NaN: first time scheduled
            times[r, TIME_SCHED] = now
            req[r, REQ_CACHED] = computed
        req[r, REQ_LAST_HIT] = computed
        row = st[ST_RUNNING]
        seat = 0
        if caching:
            seat = kv.take_seat(st, pool)
            kv.take_hits(st, pool, seat_blocks, seat, hits, hit_slots)
        _admit(run, run_t, row, r, req, times, hits, want, computed, seat)
        _grow_blocks(st, run, row, blocks_for(computed + want, block_size) - hits, n_tokens, req, pool,
                     seat_blocks, prefix_ids, prefix_tokens, unique_stride, block_size)
        st[ST_RUNNING] += 1
        left -= want
    for k in range(n_skip - 1, -1, -1):
        st[ST_WAIT_HEAD] = (st[ST_WAIT_HEAD] - 1) % n
        wait[st[ST_WAIT_HEAD]] = skipped[k]
        st[ST_WAIT_LEN] += 1
    return left


@njit(cache=True)
def _admit_whole_prompts(st, run, run_t, wait, req, times, now, budget, max_num_seqs, block_size):
    """Orca's admission: whole prompts join, KV for prompt + output reserved up front; no preemption.

    ``budget`` > 0 caps the prompt tokens admitted in one iteration (vLLM V0). Returns the first new row.
    """
    first_new = st[ST_RUNNING]
    prompt_sum = 0
    while st[ST_WAIT_LEN] > 0 and st[ST_RUNNING] < max_num_seqs:
        r = next_waiting(st, wait)
        need = blocks_for(req[r, REQ_PROMPT] + req[r, REQ_OUTPUT] - 1, block_size)
        if need > st[ST_FREE_BLOCKS] or (budget > 0 and prompt_sum + req[r, REQ_PROMPT] > budget):
            break
        _pop_waiting(st, wait)
        st[ST_FREE_BLOCKS] -= need
        prompt_sum += req[r, REQ_PROMPT]
        times[r, TIME_SCHED] = now
        _admit(run, run_t, st[ST_RUNNING], r, req, times, need, req[r, REQ_PROMPT], 0, 0)
        st[ST_RUNNING] += 1
    return first_new


@njit(cache=True, _nrt=False)
def _run_scheduled(run, run_t, lo, hi, step_index, prev_end, tok_times, gap_t, gap_req, events):
    """Step 3: one pass over the rows ``[lo, hi)`` sums the iteration's aggregates and emits.

    A request that has computed every token it knows samples the next one; a row scheduled for no tokens
    (finished, held by async scheduling) is passed over. An emission is marked with the step's index
    (``RUN_LAST``); rows whose first or last token it is go to ``events``, stamped once the step is timed. A
    token's time goes into the token record when it is first known (:func:`_write_last_token`). The gap an
    emission closes is counted in ``n_next`` if the row's last token came in the step just before (which ended at
    ``prev_end``), else the time of that token goes to ``gap_t`` (with the request in ``gap_req`` if it may yet be
    rejected, else -1). ``run_t[k]`` is when row
    ``k``'s last token came, read only when that token came before the step just before (``RUN_LAST`` <
    ``step_index - 1``; otherwise it is ``prev_end``): a row that emits in consecutive steps never writes it, and
    one that emitted in the step before but emits nothing now writes it here (or in :func:`_settle_last`).
    Returns (prefill tokens, decode sequences, attention work, cached tokens, rows that sampled a token, first
    row that finished or -1, n_next, entries in ``gap_t``, entries in ``events``).
    """
    # The common row (a decode following the row's token of the step before) updates no counter: the counts are
    # derived from the rarer rows after the pass (a counter updated on every row is a chain through memory here).
    attn_work = 0.0
    cached = 0
    prefill_tokens = 0
    prefill_rows = 0
    idle_rows = 0  # finished rows passed over
    partial_rows = 0  # prompt chunks that sample nothing
    first_tokens = 0
    first_done = -1
    n_gaps = 0
    n_events = 0
    record_tokens = tok_times.shape[0] > 0  # tested first on every row: the common row has no token to write
    for k in range(lo, hi):
        last = run[k, RUN_LAST]
        c = run[k, RUN_TOK]
        if c == 0:  # a finished row: its last token was written when it came
            idle_rows += 1
            if last == step_index - 1:
                run_t[k] = prev_end
            continue
        if record_tokens and last == step_index - 1:  # the row's token of the step before came at prev_end
            _write_last_token(tok_times, run, k, prev_end)
        p = run[k, RUN_COMP]
        known = run[k, RUN_PROMPT] + run[k, RUN_EMIT]
        cached += p
        if run[k, RUN_EMIT] > 0 and p == known - 1:  # a decode
            attn_work += 2.0 * p
        else:
            attn_work += c * (2.0 * p + c)
            prefill_tokens += c
            prefill_rows += 1
        run[k, RUN_COMP] = p + c
        run[k, RUN_TOK] = 1  # Orca: after its first iteration a row only decodes (chunked resets it anyway)
        if p + c == known:
            run[k, RUN_TOKPOS] += 1
            emitted = run[k, RUN_EMIT] + 1
            if emitted == 1:
                first_tokens += 1
            elif last != step_index - 1 or run[k, RUN_RISK] != 0:  # the token closes a gap not counted in n_next
                gap_t[n_gaps] = prev_end if last == step_index - 1 else run_t[k]
                gap_req[n_gaps] = run[k, RUN_REQ] if run[k, RUN_RISK] else -1
                n_gaps += 1
            run[k, RUN_LAST] = step_index
            run[k, RUN_EMIT] = emitted
            if emitted == 1 or emitted == run[k, RUN_OUT]:
                events[n_events] = k
                n_events += 1
                if emitted == run[k, RUN_OUT] and first_done < 0:
                    first_done = k
        else:
            partial_rows += 1
            if last == step_index - 1:  # no token now: the row keeps the time of the one before
                run_t[k] = prev_end
    active = hi - lo - idle_rows
    decode_seqs = active - prefill_rows
    sampled = active - partial_rows
    n_next = sampled - first_tokens - n_gaps
    return prefill_tokens, decode_seqs, attn_work, cached, sampled, first_done, n_next, n_gaps, n_events


@njit(cache=True, _nrt=False)
def _settle_last(run, run_t, lo, hi, step_index, prev_end, tok_times):
    """Rows in ``[lo, hi)`` that emitted in the step before ``step_index`` (which ended at ``prev_end``) but take
    no part in this one learn when their last token came, and write its time (:func:`_run_scheduled` does it for
    the others).

    Only Orca's prefill-only steps leave such rows out. Under ``chunked`` a row that emitted in one step is
    scheduled in the next (the rows before it ask for no more tokens than they did: decodes stay at one, chunks
    only shrink), unless it is preempted, which :func:`_preempt_row` handles."""
    for k in range(lo, hi):
        if run[k, RUN_LAST] == step_index - 1:
            run_t[k] = prev_end
            _write_last_token(tok_times, run, k, prev_end)


@njit(cache=True, _nrt=False)
def _stamp_events(st, run, events, n_events, end_s, times, done_log, tok_times):
    """The step that emitted them ends at ``end_s``: first and last tokens are stamped on their requests (a last
    token's time also into ``tok_times``, if not empty), and the requests that finished are logged in
    ``done_log`` (the fleet loop hands them on: disaggregated serving)."""
    for m in range(n_events):
        k = events[m]
        r = run[k, RUN_REQ]
        if run[k, RUN_EMIT] == 1:
            times[r, TIME_FIRST] = end_s
        if run[k, RUN_EMIT] == run[k, RUN_OUT]:
            times[r, TIME_FINISH] = end_s
            times[r, TIME_RELEASE] = end_s
            _write_last_token(tok_times, run, k, end_s)
            done_log[st[ST_DONE]] = r
            st[ST_DONE] += 1


@njit(cache=True, _nrt=False)
def _count_gaps(itl, totals, gap_t, gap_req, n_gaps, end_s, risky):
    """The gaps of step ending at ``end_s`` that did not follow the step before, into the histogram or, for a
    request that may yet be rejected, into ``risky`` (request, gap) until the run ends (it has room for them)."""
    for m in range(n_gaps):
        if gap_req[m] < 0:
            add_gaps(itl, totals, end_s - gap_t[m], 1.0)
        else:
            n_risky = int(risky[0, 0])
            risky[n_risky + 1, 0] = gap_req[m]
            risky[n_risky + 1, 1] = end_s - gap_t[m]
            risky[0, 0] = n_risky + 1


@njit(cache=True, _nrt=False)
def _move_rows(run, run_t, dst, src, count):
    """Rows ``[src, src + count)`` of the running table move up to ``[dst, ...)``, ``dst`` <= ``src``, in order.

    One forward copy over the table's memory, indexed unsigned (a signed index pays numba's negative-index wrap on
    every element), which the compiler can vectorise; row by row and column by column it was a tenth of the loop.
    """
    if dst == src or count == 0:
        return
    flat = run.reshape(run.shape[0] * RUN_COLUMNS)
    d = np.uint64(dst * RUN_COLUMNS)
    s = np.uint64(src * RUN_COLUMNS)
    for x in range(np.uint64(count * RUN_COLUMNS)):
        flat[d + x] = flat[s + x]
    for x in range(count):
        run_t[dst + x] = run_t[src + x]


@njit(cache=True, _nrt=False)
def _release_finished(st, run, run_t, req, first, step_index, hold, end_s, slot_times, pool, seat_blocks):
    """Requests that produced their whole output leave the running table and free their blocks; the others keep
    their order. With ``hold`` (async scheduling) the ones that finished in step ``step_index`` stay one step
    more. A closed-loop client whose request finished in this step may send again from ``end_s``. Rows before
    ``first`` are neither finished nor held. Returns the first row still held (a large number: none)."""
    j = first  # rows kept so far end here
    seg = first  # rows [seg, i) stay, not moved yet
    held = 0
    first_held = NO_ROW
    n_running = st[ST_RUNNING]
    for i in range(first, n_running):
        if run[i, RUN_EMIT] != run[i, RUN_OUT]:
            continue
        just_done = run[i, RUN_LAST] == step_index
        if just_done:
            _free_slot(st, slot_times, end_s)
        if hold and just_done:  # stays one step more
            if held == 0:
                first_held = j + i - seg
            held += 1
            continue
        r = run[i, RUN_REQ]
        req[r, REQ_EMITTED] = run[i, RUN_EMIT]
        if pool.shape[0] > 1:
            kv.release(st, pool, seat_blocks, run[i, RUN_SEAT], run[i, RUN_BLOCKS])
        else:
            st[ST_FREE_BLOCKS] += run[i, RUN_BLOCKS]
        st[ST_FINISHED] += 1
        _move_rows(run, run_t, j, seg, i - seg)
        j += i - seg
        seg = i + 1
    _move_rows(run, run_t, j, seg, n_running - seg)
    st[ST_RUNNING] = j + n_running - seg
    st[ST_PENDING] = held
    return first_held


@njit(cache=True, _nrt=False)
def _settle_risky(itl, totals, risky, req):
    """The gaps set aside for requests that might have been rejected: counted for those that were not."""
    for m in range(1, int(risky[0, 0]) + 1):
        if req[int(risky[m, 0]), REQ_REJECT] == 0:
            add_gaps(itl, totals, risky[m, 1], 1.0)


@njit(cache=True, _nrt=False)
def _account_tokens(live, req):
    """Token accounting: positions computed, and recomputed because of preemption.

    A completed request computed prompt + output - 1 positions minus those its last admission found cached,
    plus everything it computed before each preemption (``lost``, net of the hits of that admission); what it
    computed beyond the least it needed (prompt + output - 1 less its first admission's hits) is
    recomputation. A request rejected after preemption recomputed what it lost beyond its furthest progress.
    """
    for r in live:
        least = req[r, REQ_PROMPT] + req[r, REQ_OUTPUT] - 1
        if req[r, REQ_REJECT] == 0:
            req[r, REQ_COMPUTED] = least - req[r, REQ_LAST_HIT] + req[r, REQ_LOST]
            req[r, REQ_RECOMPUTED] = req[r, REQ_COMPUTED] - (least - req[r, REQ_CACHED])
        else:
            req[r, REQ_RECOMPUTED] = req[r, REQ_LOST] - req[r, REQ_HIGH_WATER]
            req[r, REQ_COMPUTED] = req[r, REQ_LOST]


@njit(cache=True, _nrt=False)
def _record_scheduled(sched, st, run, lo, hi):
    """One schedule row per row scheduled in this iteration (and one for the prefix hits of a new admission), at
    most two a row: ``sched`` has room for them."""
    for k in range(lo, hi):
        if run[k, RUN_TOK] == 0:
            continue
        if run[k, RUN_HIT] > 0 and run[k, RUN_COMP] == run[k, RUN_HIT]:  # admitted now, with prefix hits
            write_sched(sched, st[ST_SCHED], st[ST_STEPS], run[k, RUN_REQ], run[k, RUN_HIT], KIND_CACHED)
            st[ST_SCHED] += 1
        write_sched(sched, st[ST_SCHED], st[ST_STEPS], run[k, RUN_REQ], run[k, RUN_TOK],
                    KIND_DECODE if _is_decode(run, k) else KIND_PREFILL)
        st[ST_SCHED] += 1
