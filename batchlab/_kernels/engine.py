"""One engine's iteration loop as a resumable state: the loop stops before planning at a given time and resumes.

``run_iterations`` (what :func:`batchlab.simulate` runs) is :func:`new_engine`, one :func:`advance` to infinity
and :func:`finish_engine`. The fleet loop (:mod:`.fleet`) keeps several engines, advances each to the moment
the next request is sent, routes it by what the engines hold then, and appends it to one engine's ``live``
list: an engine never plans an iteration before it knows every request sent by then, so stopping and resuming
changes nothing (the test with one replica checks it bit for bit).

An engine is an :class:`.state.Engine` of arrays (:func:`new_engine`), its settings a :class:`.state.LoopConfig`
(:func:`loop_config`); the records that grow (``steps``, ``sched``, ``risky``) are
passed and returned beside it. The helpers of each step are in :mod:`.iterations`.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import kvcache as kv
from .cost import step_cost
from .gaps import add_gaps
from .iterations import (_account_tokens, _admit_waiting, _admit_whole_prompts, _count_gaps, _record_scheduled,
                         _release_finished, _run_scheduled, _schedule_running, _send_and_queue, _settle_last,
                         _settle_risky, _stamp_events)
from .layout import (CLOCK_BUSY, CLOCK_LAST_START, CLOCK_NOW, CLOCK_PREV_END, KIND_PREEMPT, N_CLOCK, N_STATE, NO_ROW,
                     POLICY_CHUNKED, REQ_LAST_STEP, REQ_OUTPUT, REQ_PROMPT, REQ_RISK, RULE_ASYNC, RULE_CHUNKING,
                     RULE_PREFIX_CACHE, RULE_THRESHOLD_ALONE, RUN_COLUMNS, SCHED_COLUMNS, ST_CACHED_BLOCKS, ST_FINISHED,
                     ST_FIRST_HELD, ST_FREE_BLOCKS, ST_NEXT, ST_PENDING, ST_RUNNING, ST_SCHED, ST_SEATS, ST_STEPS,
                     ST_WAIT_LEN, STATUS_FULL, STATUS_OK, STATUS_PAUSED, STATUS_STUCK, STEP_COLUMNS, TIME_SEEN,
                     TOTAL_BUSY_S, TOTAL_SEQ_STEPS, TOTAL_STEPS)
from .records import blocks_for, grow, write_sched, write_step
from .state import Engine, LoopConfig


@njit(cache=True)
def prepare_requests(live, req, chunked, rules, budget, block_size):
    """Mark the requests of ``live`` for the loop; returns the most blocks one of them can hold."""
    max_blocks = 1
    for r in live:
        max_blocks = max(max_blocks, blocks_for(req[r, REQ_PROMPT] + req[r, REQ_OUTPUT], block_size))
        req[r, REQ_LAST_STEP] = -2
        # Chunking off: a preempted request whose recomputation outgrows the budget is rejected.
        risk = chunked and rules & RULE_CHUNKING == 0 and req[r, REQ_PROMPT] + req[r, REQ_OUTPUT] - 1 > budget
        req[r, REQ_RISK] = 1 if risk else 0
    return max_blocks


@njit(cache=True)
def new_engine(n, caching, max_num_seqs, usable_blocks, max_blocks, max_concurrency, itl, totals):
    """An idle engine for a stream of ``n`` requests: its state, its scratch arrays and where its metrics go
    (``itl``, the inter-token-gap histogram, and ``totals``), as one :class:`.state.Engine`."""
    rows = min(n, max_num_seqs) + 1
    st = np.zeros(N_STATE, np.int64)
    st[ST_FREE_BLOCKS] = usable_blocks
    st[ST_SEATS] = rows if caching else 0
    st[ST_FIRST_HELD] = NO_ROW
    clock = np.zeros(N_CLOCK)
    clock[CLOCK_PREV_END] = np.nan
    run = np.zeros((rows, RUN_COLUMNS), np.int64)
    run_t = np.full(rows, np.nan)  # when each row's last token came, if before the step just before
    gap_t = np.empty(rows)
    gap_req = np.empty(rows, np.int64)
    events = np.empty(rows, np.int64)
    wait = np.empty(n, np.int64)  # waiting queue: a ring buffer, since preempted requests go back to its front
    skipped = np.empty(n, np.int64)
    victims = np.empty(n, np.int64)
    slot_times = np.zeros(max_concurrency, np.float64)  # when each free client slot freed (closed loop)
    pool = kv.new_pool(usable_blocks, rows) if caching else np.zeros(1, np.int64)
    seat_blocks = np.zeros((rows, max_blocks) if caching else (1, 1), np.int64)
    hit_slots = np.empty(max_blocks if caching else 1, np.int64)
    frontend = np.full(1, -np.inf)  # when the API server is free
    done_log = np.empty(n, np.int64)  # requests in the order they emitted their last token
    return Engine(st, clock, run, run_t, gap_t, gap_req, events, wait, skipped, victims, slot_times, pool,
                  seat_blocks, hit_slots, frontend, done_log, itl, totals)


@njit(cache=True)
def loop_config(knobs, stream, chunked, rules, max_blocks):
    """The :class:`.state.LoopConfig` of an engine running ``knobs`` (a :class:`.state.Knobs`) over ``stream``,
    under the rule bits ``rules``; ``max_blocks``: the most blocks one request can hold (:func:`prepare_requests`)."""
    return LoopConfig(knobs.coef, chunked, rules, knobs.max_num_seqs, knobs.budget, knobs.threshold,
                      knobs.prefill_only_steps, knobs.usable_blocks, knobs.block_size, knobs.record,
                      stream.prefix_tokens, knobs.record_tokens, max_blocks, stream.prefix_ids)


@njit(cache=True)
def new_records(record_steps, record):
    """Empty growing records: steps, schedule rows, and the gaps of requests that may yet be rejected."""
    steps = np.empty((1024 if record_steps else 1, len(STEP_COLUMNS)))
    sched = np.empty((1024 if record else 1, len(SCHED_COLUMNS)), np.int64)
    risky = np.zeros((1, 2))  # row 0: entries; then (request, gap s) of requests that may yet be rejected
    return steps, sched, risky


@njit(cache=True)
def advance(engine, steps, sched, risky, live, req, times, tok_times, config, until_s):
    """Run iterations while the engine's next plan comes before ``until_s`` (DESIGN sections 4 and 4c).

    An engine plans an iteration at its planning moment: with async scheduling, when the iteration before it
    started; else when it ended (or, idle, when the next request reaches it). Requests of ``live`` sent by then
    join its waiting queue. Returns (status, steps, sched, risky): ``STATUS_PAUSED`` when the next plan is at
    or after ``until_s``, or the engine is idle with every request of ``live`` finished (more may be appended);
    ``STATUS_OK`` when every request finished and ``until_s`` is infinite; ``STATUS_STUCK`` on a bug.

    The iterations run in :func:`_run_until`, which writes the records in place and stops, as at a pause, when
    one has no room for another iteration; they are grown here and the loop resumes. An array reassigned inside
    the loop (a record grown where it fills) cost reference counting on every iteration, taken or not.
    """
    rows = engine.run.shape[0]
    record, record_steps = config.record, config.record_steps
    while True:
        status = _run_until(engine, steps, sched, risky, live, req, times, tok_times, config, until_s)
        if status != STATUS_FULL:
            return status, steps, sched, risky
        need_steps, need_sched, need_risky = _rows_needed(engine.st, risky, rows, record, record_steps)
        steps, sched, risky = grow(steps, need_steps), grow(sched, need_sched), grow(risky, need_risky)


@njit(cache=True, _nrt=False)
def _rows_needed(st, risky, rows, record, record_steps):
    """Rows each record needs to take one more iteration: a step row, a schedule row for each victim and two for
    each row scheduled (at most ``rows`` of each), and a held-back gap for each row (after ``risky``'s count)."""
    return (st[ST_STEPS] + 1 if record_steps else 1, st[ST_SCHED] + 3 * rows if record else 1,
            int(risky[0, 0]) + rows + 1)


@njit(cache=True, _nrt=False)
def _room(st, steps, sched, risky, rows, record, record_steps):
    """The records can take one more iteration (:func:`_rows_needed`)."""
    need_steps, need_sched, need_risky = _rows_needed(st, risky, rows, record, record_steps)
    return need_steps <= steps.shape[0] and need_sched <= sched.shape[0] and need_risky <= risky.shape[0]


@njit(cache=True, _nrt=False)
def _record_preempted(sched, st, victims, n_victims):
    """A schedule row for each request preempted in this iteration (``victims``)."""
    for k in range(n_victims):
        write_sched(sched, st[ST_SCHED], st[ST_STEPS], victims[k], 0, KIND_PREEMPT)
        st[ST_SCHED] += 1


@njit(cache=True, _nrt=False)
def _time_step(steps, st, totals, coef, now, prefill_tokens, decode_seqs, attn_work, cached, sampled, n_scheduled,
               asynchronous, record_steps, usable_blocks):
    """The iteration planned at ``now``, timed by the cost model (``step_cost``) and counted: its row of ``steps``
    (``record_steps``), the iteration, its busy time and its sequence-steps. Returns its duration (s)."""
    dur, _g, _a, _c, _e, _l, _u, flops, nbytes, bound = step_cost(
        coef, decode_seqs + prefill_tokens, attn_work, cached, sampled, n_scheduled, asynchronous)
    if record_steps:
        write_step(steps, st[ST_STEPS], now, dur, prefill_tokens, decode_seqs, st[ST_RUNNING],
                   usable_blocks - st[ST_FREE_BLOCKS], bound, flops, nbytes, st[ST_CACHED_BLOCKS])
    st[ST_STEPS] += 1
    totals[TOTAL_BUSY_S] += dur
    totals[TOTAL_SEQ_STEPS] += st[ST_RUNNING]
    return dur


@njit(cache=True, _nrt=False)
def _park(st, clock, now, last_start, prev_end, busy, first_held):
    """The loop's running values back into the engine (``clock``, ``ST_FIRST_HELD``): the next call resumes there."""
    clock[CLOCK_NOW] = now
    clock[CLOCK_LAST_START] = last_start
    clock[CLOCK_PREV_END] = prev_end
    clock[CLOCK_BUSY] = 1.0 if busy else 0.0
    st[ST_FIRST_HELD] = first_held


@njit(cache=True)
def _run_until(engine, steps, sched, risky, live, req, times, tok_times, config, until_s):
    """:func:`advance`'s loop; returns its status, or ``STATUS_FULL`` when a record has no room for one more
    iteration (the engine's state then is that of a pause: nothing of the next iteration has happened)."""
    st, clock, run, run_t = engine.st, engine.clock, engine.run, engine.run_t
    gap_t, gap_req, events, wait = engine.gap_t, engine.gap_req, engine.events, engine.wait
    skipped, victims, slot_times, pool = engine.skipped, engine.victims, engine.slot_times, engine.pool
    seat_blocks, hit_slots, frontend, done_log = engine.seat_blocks, engine.hit_slots, engine.frontend, engine.done_log
    itl, totals = engine.itl, engine.totals
    coef, chunked, rules, max_num_seqs = config.coef, config.chunked, config.rules, config.max_num_seqs
    budget, threshold, prefill_only_steps = config.budget, config.threshold, config.prefill_only_steps
    usable_blocks, block_size, record = config.usable_blocks, config.block_size, config.record
    prefix_tokens, record_steps = config.prefix_tokens, config.record_steps
    max_blocks, prefix_ids = config.max_blocks, config.prefix_ids
    n_live = live.shape[0]
    asynchronous = chunked and rules & RULE_ASYNC != 0
    now, last_start, prev_end = clock[CLOCK_NOW], clock[CLOCK_LAST_START], clock[CLOCK_PREV_END]
    busy = clock[CLOCK_BUSY] > 0  # a step has just run, so async scheduling planned this one when that step started
    first_held = st[ST_FIRST_HELD]  # the first row async scheduling still holds after it finished
    status, rows = STATUS_OK, run.shape[0]
    while st[ST_FINISHED] < n_live:
        if not _room(st, steps, sched, risky, rows, record, record_steps):
            status = STATUS_FULL
            break
        view_s = last_start if asynchronous and busy else now
        if view_s >= until_s:
            status = STATUS_PAUSED
            break
        next_sent = np.inf
        if st[ST_NEXT] < n_live:  # a call only when a client may send (every array argument costs a little)
            next_sent = times[live[st[ST_NEXT]], TIME_SEEN]
            if next_sent != next_sent or next_sent <= view_s:  # NaN: not sent or not through the API server yet
                next_sent = _send_and_queue(st, times, live, wait, slot_times, view_s, req, coef, frontend)
        if st[ST_RUNNING] == 0 and st[ST_WAIT_LEN] == 0:
            if next_sent == np.inf:  # nothing to send: a bug, unless more requests may be appended
                status = STATUS_STUCK if until_s == np.inf else STATUS_PAUSED
                break
            now = max(now, next_sent)
            busy = False
            continue
        thr = 0 if rules & RULE_THRESHOLD_ALONE and st[ST_RUNNING] + st[ST_WAIT_LEN] <= 1 else threshold  # alone
        if not chunked:  # Orca's admission
            first_new = _admit_whole_prompts(st, run, run_t, wait, req, times, now, budget, max_num_seqs, block_size)
            lo = first_new if (prefill_only_steps and st[ST_RUNNING] > first_new) else 0
            hi = st[ST_RUNNING]
            n_scheduled = hi - lo
            n_victims = n_dropped = 0
        else:  # chunked steps 1 (running requests first, preempting) and 2 (the waiting ones)
            hi, n_scheduled, left, n_victims, n_dropped, lowest = _schedule_running(
                st, run, run_t, wait, req, times, victims, budget, thr, block_size, pool, seat_blocks, prefix_ids,
                prefix_tokens, max_blocks + 1, st[ST_STEPS], prev_end, tok_times)
            first_held = min(first_held, lowest) if st[ST_PENDING] > 0 else first_held  # held rows may move up
            if n_dropped == 0 and st[ST_WAIT_LEN] > 0 and left > 0 and st[ST_RUNNING] < max_num_seqs:  # no preemption
                _admit_waiting(st, run, run_t, wait, skipped, slot_times, pool, seat_blocks, hit_slots, req, times,
                               config, now, left, thr)
                n_scheduled += st[ST_RUNNING] - hi  # the rows admitted (the pass reached every running row)
                hi = st[ST_RUNNING]
            lo = 0
        if record and n_victims > 0:
            _record_preempted(sched, st, victims, n_victims)
        if n_scheduled == 0:
            if asynchronous and busy:
                # The plan made while the last step ran was empty: the engine waits for that step and plans again.
                _release_finished(st, run, run_t, req, 0, -1, False, now, slot_times, pool, seat_blocks)
                first_held = NO_ROW
                busy = False
                continue
            # Only when every waiting request was just rejected or preemption emptied the step; else a bug.
            if n_dropped > 0 or st[ST_FINISHED] == n_live or (st[ST_RUNNING] == 0 and st[ST_WAIT_LEN] == 0):
                continue
            status = STATUS_STUCK
            break
        if record:
            _record_scheduled(sched, st, run, lo, hi)
        step = st[ST_STEPS]
        if lo > 0:  # Orca's prefill-only step leaves the decoders out
            _settle_last(run, run_t, 0, lo, step, prev_end, tok_times)
        prefill_tokens, decode_seqs, attn_work, cached, sampled, first_done, n_next, n_gaps, n_events = _run_scheduled(
            run, run_t, lo, hi, step, prev_end, tok_times, gap_t, gap_req, events)
        if prefill_tokens + decode_seqs == 0:
            # The progress guard: rows were scheduled but not one token computed, so the next iteration would be this
            # one again (a spin). vLLM never schedules a request with nothing to compute (see kvcache.longest_hit).
            status = STATUS_STUCK
            break
        dur = _time_step(steps, st, totals, coef, now, prefill_tokens, decode_seqs, attn_work, cached, sampled,
                         n_scheduled, asynchronous, record_steps, usable_blocks)
        last_start, now, busy = now, now + dur, True
        if n_next > 0:
            add_gaps(itl, totals, now - prev_end, n_next)
        if n_gaps > 0:
            _count_gaps(itl, totals, gap_t, gap_req, n_gaps, now, risky)
        _stamp_events(st, run, events, n_events, now, times, done_log, tok_times)
        prev_end = now
        if first_done >= 0 or st[ST_PENDING] > 0:
            first = first_held if first_done < 0 else min(first_done, first_held)
            first_held = _release_finished(st, run, run_t, req, first, step, asynchronous, now, slot_times, pool,
                                           seat_blocks)
    if status == STATUS_OK and until_s < np.inf:
        status = STATUS_PAUSED  # every request so far finished; the caller may append more
    _park(st, clock, now, last_start, prev_end, busy, first_held)
    return status


@njit(cache=True)
def next_plan_s(st, clock, live, times, chunked, rules):
    """When the engine plans next: the start of the step running (async scheduling) or its end; idle with
    nothing queued, when the next request of ``live`` reaches it (infinity: none known)."""
    asynchronous = chunked and rules & RULE_ASYNC != 0
    if st[ST_RUNNING] == 0 and st[ST_WAIT_LEN] == 0:
        if st[ST_NEXT] >= live.shape[0]:
            return np.inf
        seen = times[live[st[ST_NEXT]], TIME_SEEN]
        view = clock[CLOCK_LAST_START] if asynchronous and clock[CLOCK_BUSY] > 0 else clock[CLOCK_NOW]
        return view if seen != seen else min(view, seen)
    return clock[CLOCK_LAST_START] if asynchronous and clock[CLOCK_BUSY] > 0 else clock[CLOCK_NOW]


@njit(cache=True)
def finish_engine(st, steps, sched, risky, live, req, record_steps, itl, totals):
    """After the last :func:`advance`: gaps set aside, token accounting, and the records cut to length."""
    n_steps = st[ST_STEPS]
    totals[TOTAL_STEPS] = n_steps
    _settle_risky(itl, totals, risky, req)
    _account_tokens(live, req)
    return steps[:n_steps if record_steps else 0], sched[:st[ST_SCHED]]


@njit(cache=True)
def run_iterations(live, req, times, tok_times, stream, knobs, itl, totals):
    """Iteration-level policies: Orca-style ``continuous`` and vLLM ``chunked`` (DESIGN sections 4 and 4c), over
    ``stream`` under ``knobs`` (:class:`.state.Stream`, :class:`.state.Knobs`).

    ``knobs.budget`` <= 0 means no token budget (continuous only). ``knobs.max_concurrency`` > 0 holds at most that
    many requests in flight (closed-loop clients); a request's send time is ``times[:, TIME_SENT]`` (NaN: the
    kernel decides, closed loop). With async scheduling the iteration after the one running is planned when
    that one starts: it sees the requests sent by then, and the ones that finish in it still hold their seat
    and blocks. ``knobs.record_tokens``: keep one row per iteration; ``tok_times`` (empty: no token record) gets
    every emitted token's time, written once (``iterations._run_scheduled``); the slots of tokens never emitted are
    left as they were (``entry.clear_unemitted``). Inter-token gaps go into the histogram ``itl`` and the run's
    totals into ``totals``.
    """
    chunked = knobs.policy == POLICY_CHUNKED
    rules = knobs.rules
    caching = chunked and rules & RULE_PREFIX_CACHE != 0
    max_blocks = prepare_requests(live, req, chunked, rules, knobs.budget, knobs.block_size)
    engine = new_engine(req.shape[0], caching, knobs.max_num_seqs, knobs.usable_blocks, max_blocks,
                        knobs.max_concurrency, itl, totals)
    config = loop_config(knobs, stream, chunked, rules, max_blocks)
    steps, sched, risky = new_records(knobs.record_tokens, knobs.record)
    status, steps, sched, risky = advance(engine, steps, sched, risky, live, req, times, tok_times, config, np.inf)
    st = engine.st
    if status != STATUS_OK:
        return STATUS_STUCK, steps[:0], sched[:st[ST_SCHED]]
    steps, sched = finish_engine(st, steps, sched, risky, live, req, knobs.record_tokens, itl, totals)
    return STATUS_OK, steps, sched
