"""Several engines in one simulation: replicas behind a router, or prefill and decode instances (disaggregated).

Requests are taken in arrival order. For each, every front engine (a replica, or a prefill instance) is advanced
to the moment it is sent (:func:`.engine.advance` stops before planning at or after it), the router scores the
engines as they stand then, and the request joins one engine's ``live`` list. With disaggregation, a request's
first token ends its prefill; its KV then travels to a decode instance (``transfer_s``, given per request), and
when it lands the decode instances are advanced to that moment and the least loaded takes it: it joins their
waiting queue with its prompt's KV present (``REQ_PRELOADED``), admitted under their ``max_num_seqs`` and KV pool.
Engines are never advanced past a moment before everything sent to them by then is known, so with one replica
the run is :func:`batchlab.simulate`'s, bit for bit.
"""
from __future__ import annotations

import heapq

import numpy as np
from numba import njit
from numba.typed import List

from . import kvcache as kv
from .engine import advance, finish_engine, loop_config, new_engine, new_records, next_plan_s, prepare_requests
from .entry import _tables, _token_offsets, clear_unemitted, reject_up_front
from .layout import (ITL_BINS, MAX_COUNT, N_TOTALS, REQ_EMITTED, REQ_OUTPUT, REQ_PRELOADED, REQ_PROMPT,
                     ROUTE_LEAST_OUTSTANDING, ROUTE_PREFIX, ROUTE_ROUND_ROBIN, RULE_CHUNKING, RULE_PREFIX_CACHE,
                     SCHED_COLUMNS, ST_DONE, ST_FINISHED, STATUS_OK, STATUS_STUCK, STEP_COLUMNS, TIME_ARRIVAL,
                     TIME_FIRST, TIME_LAST, TIME_SEEN, TIME_SENT)
from .state import FleetOutput


@njit(cache=True)
def _route(router, engines, counts, lo, hi, turn, req, r, block_size, prefix_ids, prefix_tokens, unique_stride,
           hit_slots):
    """The engine in ``[lo, hi)`` that takes request ``r``.

    Round robin: the next in turn. Least outstanding requests: the fewest sent to it and not yet released (as
    the engine counts them when it last planned), ties to the lowest index. Prefix-aware (llm-d's prefix-cache
    scorer, reading the pools themselves): the longest run of ``r``'s prefix blocks cached in its pool, ties by
    least outstanding."""
    if router == ROUTE_ROUND_ROBIN:
        return lo + turn % (hi - lo)
    best = lo
    best_hits = -1
    best_out = MAX_COUNT
    for i in range(lo, hi):
        engine = engines[i]
        outstanding = counts[i] - engine.st[ST_FINISHED]
        hits = 0
        if router == ROUTE_PREFIX:
            hits, _idle = kv.longest_hit(req, r, req[r, REQ_PROMPT], block_size, prefix_ids, prefix_tokens,
                                         unique_stride, engine.pool, hit_slots)
        if hits > best_hits or (hits == best_hits and outstanding < best_out):
            best, best_hits, best_out = i, hits, outstanding
    return best


@njit(cache=True)
def _advance_to(engines, records, lives, counts, next_plan, lo, hi, req, times, tok_times, config, until_s):
    """Advance engines ``[lo, hi)`` to ``until_s``; returns False if one is stuck (a bug)."""
    for i in range(lo, hi):
        if next_plan[i] >= until_s:
            continue
        steps, sched, risky = records[i]
        live = lives[i, :counts[i]]
        status, steps, sched, risky = advance(engines[i], steps, sched, risky, live, req, times, tok_times, config,
                                              until_s)
        records[i] = (steps, sched, risky)
        if status == STATUS_STUCK:
            return False
        next_plan[i] = next_plan_s(engines[i].st, engines[i].clock, live, times, config.chunked, config.rules)
    return True


@njit(cache=True)
def _hand_over(engines, harvested, n_front, req_d, times, transfer_s, ready_s, landing):
    """Prompts that prefill instances finished: their KV leaves for the decode side, landing ``transfer_s`` later."""
    for i in range(n_front):
        log = engines[i].done_log
        for m in range(harvested[i], engines[i].st[ST_DONE]):
            r = log[m]
            if req_d[r, REQ_OUTPUT] > 1:
                ready_s[r] = times[r, TIME_FIRST] + transfer_s[r]
                heapq.heappush(landing, (ready_s[r], r))
        harvested[i] = engines[i].st[ST_DONE]


@njit(cache=True)
def _run_fleet(engines, records, live, req, times, req_d, times_d, tok_times, config, config_d, n_front, router,
               transfer_s, front_of, back_of, ready_s):
    """The fleet's loop over arrivals and KV landings, in time order (module docstring); returns a status."""
    n_engines = len(engines)
    n = req.shape[0]
    disagg = n_front < n_engines
    arrival = times[:, TIME_ARRIVAL]
    block_size, prefix_tokens, prefix_ids = config.block_size, config.prefix_tokens, config.prefix_ids
    max_blocks, max_blocks_d = config.max_blocks, config_d.max_blocks
    lives = np.empty((n_engines, n), np.int64)
    counts = np.zeros(n_engines, np.int64)
    next_plan = np.full(n_engines, np.inf)
    harvested = np.zeros(n_engines, np.int64)
    hit_slots = np.empty(max_blocks, np.int64)
    router_d = ROUTE_ROUND_ROBIN if router == ROUTE_ROUND_ROBIN else ROUTE_LEAST_OUTSTANDING
    landing = [(np.inf, -1)]  # KV transfers under way: (when it lands, request), a heap
    landing.pop()
    turn = 0
    turn_d = 0
    i_live = 0
    n_live = live.shape[0]
    while True:
        t_next = arrival[live[i_live]] if i_live < n_live else np.inf
        if not _advance_to(engines, records, lives, counts, next_plan, 0, n_front, req, times, tok_times, config,
                           t_next):
            return STATUS_STUCK
        if disagg:
            # Every prompt finished before t_next is known now, so every landing up to t_next is too.
            _hand_over(engines, harvested, n_front, req_d, times, transfer_s, ready_s, landing)
            while len(landing) > 0 and landing[0][0] <= t_next:
                d, r = heapq.heappop(landing)
                if not _advance_to(engines, records, lives, counts, next_plan, n_front, n_engines, req_d, times_d,
                                   tok_times, config_d, d):
                    return STATUS_STUCK
                j = _route(router_d, engines, counts, n_front, n_engines, turn_d, req_d, r, block_size, prefix_ids,
                           prefix_tokens, max_blocks_d + 1, hit_slots)
                turn_d += 1
                times_d[r, TIME_SENT] = d
                times_d[r, TIME_SEEN] = d  # handed over engine to engine: no API server on the way
                times_d[r, TIME_LAST] = times[r, TIME_FIRST]
                back_of[r] = j
                lives[j, counts[j]] = r
                counts[j] += 1
                next_plan[j] = min(next_plan[j], d)
        if i_live == n_live:
            break
        r = live[i_live]
        i = _route(router, engines, counts, 0, n_front, turn, req, r, block_size, prefix_ids, prefix_tokens,
                   max_blocks + 1, hit_slots)
        turn += 1
        front_of[r] = i
        if not disagg:
            back_of[r] = i
        lives[i, counts[i]] = r
        counts[i] += 1
        next_plan[i] = min(next_plan[i], arrival[r])
        i_live += 1
    for i in range(n_engines):
        front = i < n_front
        t_req, t_times = (req, times) if front else (req_d, times_d)
        steps, sched, risky = records[i]
        live_i = lives[i, :counts[i]]
        engine = engines[i]
        status, steps, sched, risky = advance(engine, steps, sched, risky, live_i, t_req, t_times, tok_times,
                                              config if front else config_d, np.inf)
        if status != STATUS_OK:
            return STATUS_STUCK
        steps, sched = finish_engine(engine.st, steps, sched, risky, live_i, t_req, config.record_steps, engine.itl,
                                     engine.totals)
        records[i] = (steps, sched, risky)
    return STATUS_OK


@njit(cache=True)
def _concat(records, which, n_cols, dtype_like):
    """Engine after engine, the rows of one kind of record (0 steps, 1 schedule), and each engine's first row."""
    off = np.zeros(len(records) + 1, np.int64)
    for i in range(len(records)):
        off[i + 1] = off[i] + records[i][which].shape[0]
    out = np.empty((off[-1], n_cols), dtype_like.dtype)
    for i in range(len(records)):
        out[off[i]:off[i + 1]] = records[i][which]
    return out, off


@njit(cache=True)
def fleet_kernel(stream, knobs, n_engines, n_prefill, router, transfer_s):
    """Simulate ``n_engines`` engines of vLLM's ``chunked`` policy fed by one request stream (:class:`.state.Stream`,
    :class:`.state.Knobs`: its policy, batch size, queue delay, prefill-only steps and concurrency are not read).

    ``n_prefill`` = 0: every engine is a replica serving whole requests, chosen by ``router`` (``ROUTE_*``).
    ``n_prefill`` > 0: engines ``[0, n_prefill)`` compute prompts and first tokens (chosen by ``router``), the
    others decode (the least outstanding takes each request when its KV lands, ``transfer_s`` after its first
    token; round robin if ``router`` is round robin); decode instances do not cache prefixes. Returns a
    :class:`.state.FleetOutput`.
    """
    arrival, prompt, output = stream.arrival, stream.prompt, stream.output
    rules, budget, block_size, record_tokens = knobs.rules, knobs.budget, knobs.block_size, knobs.record_tokens
    n = arrival.shape[0]
    disagg = n_prefill > 0
    n_front = n_prefill if disagg else n_engines
    req, times = _tables(arrival, prompt, output, stream.prefix_off, 0)
    live = reject_up_front(req, prompt, output, knobs.usable_blocks, block_size, budget, rules & RULE_CHUNKING == 0,
                           knobs.max_model_len)
    tok_off = np.zeros(n + 1, np.int64)
    _token_offsets(req, tok_off)
    n_tokens = tok_off[n] if record_tokens else 0
    tok_times = np.empty(n_tokens)  # every engine writes the times of the tokens it emits
    # Prefill instances see each request with an output of one token; decode instances see it whole, its first
    # token already out and its prompt's KV present.
    req_d, times_d = req, times
    if disagg:
        req_d, times_d = req.copy(), times.copy()
        for r in range(n):
            req[r, REQ_OUTPUT] = 1
            req_d[r, REQ_EMITTED] = 1
            req_d[r, REQ_PRELOADED] = 1
            times_d[r, TIME_SENT] = np.nan
    max_blocks = prepare_requests(live, req, True, rules, budget, block_size)
    max_blocks_d = prepare_requests(live, req_d, True, rules, budget, block_size) if disagg else max_blocks
    config = loop_config(knobs, stream, True, rules, max_blocks)
    config_d = loop_config(knobs, stream, True, rules & ~RULE_PREFIX_CACHE, max_blocks_d)
    itl = np.zeros((n_engines, ITL_BINS, 4))
    totals = np.zeros((n_engines, N_TOTALS))
    engines = List()
    records = List()
    for i in range(n_engines):
        front = i < n_front
        caching = rules & RULE_PREFIX_CACHE != 0 and front
        engines.append(new_engine(n, caching, knobs.max_num_seqs, knobs.usable_blocks,
                                  max_blocks if front else max_blocks_d, 0, itl[i], totals[i]))
        records.append(new_records(record_tokens, knobs.record))
    front_of = np.full(n, -1, np.int64)
    back_of = np.full(n, -1, np.int64)
    ready_s = np.full(n, np.nan)
    status = _run_fleet(engines, records, live, req, times, req_d, times_d, tok_times, config, config_d, n_front,
                        router, transfer_s, front_of, back_of, ready_s)
    steps, step_off = _concat(records, 0, len(STEP_COLUMNS), np.empty(0))
    sched, sched_off = _concat(records, 1, len(SCHED_COLUMNS), np.empty(0, np.int64))
    if n_tokens > 0 and status == STATUS_OK:
        clear_unemitted(req_d[:, REQ_EMITTED], tok_off, tok_times)  # the decode side counts them all
    return FleetOutput(status, req, times, req_d, times_d, tok_off, tok_times, front_of, back_of, ready_s, steps,
                       step_off, sched, sched_off, itl, totals)
