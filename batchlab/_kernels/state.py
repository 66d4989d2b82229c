"""What crosses the kernels' calls, by name: NamedTuples of arrays and scalars, no jitted code.

Numba compiles a NamedTuple as a struct of its fields (``cache=True`` and ``numba.typed.List`` included), so
jitted code reads ``engine.run`` or ``config.budget`` at no cost, and a helper compiled with ``_nrt=False`` takes
one as it takes its arrays, borrowed. A call passes it flattened, field by field (an array is 7 words, an
:class:`Engine` about 160), so the iteration loop (``engine._run_until``) reads the fields it needs once, at its
top, and calls its per-iteration helpers with those: an Engine passed on every iteration cost the loop 5-10 %.
The columns of the arrays inside are the integer slots of :mod:`.layout`.

- :class:`Stream` and :class:`Knobs`: the inputs of one run (``entry.simulate_kernel``, ``fleet.fleet_kernel``).
- :class:`LoopConfig`: what one engine's loop reads and never changes (``engine.loop_config``).
- :class:`Engine`: one engine's state and scratch arrays (``engine.new_engine``), resumable.
- :class:`KernelOutput` and :class:`FleetOutput`: what the kernels return to Python.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Stream(NamedTuple):
    """A request stream, one entry a request, in arrival order (``batchlab.Requests``)."""

    arrival: np.ndarray  # s, float64
    prompt: np.ndarray  # tokens, int64
    output: np.ndarray  # tokens, int64 (clipped to max_model_len)
    prefix_ids: np.ndarray  # int64, every request's prefix block ids, request after request
    prefix_off: np.ndarray  # int64, request r's ids are prefix_ids[prefix_off[r]:prefix_off[r + 1]]
    prefix_tokens: int  # tokens per prefix block


class Knobs(NamedTuple):
    """A run's settings, as the kernels take them (``batchlab.simulate`` resolves them from vLLM's names)."""

    policy: int  # POLICY_*
    coef: np.ndarray  # the cost model's coefficients, slots COEF_*
    batch_size: int  # static, dynamic
    max_queue_delay_s: float  # dynamic
    max_num_seqs: int
    budget: int  # max_num_batched_tokens (<= 0: none, continuous only)
    threshold: int  # long_prefill_token_threshold (0: none)
    rules: int  # RULE_* bits (chunked)
    prefill_only_steps: bool  # continuous: vLLM V0's prefill-only iterations
    usable_blocks: int  # KV blocks, the null block left out
    block_size: int  # tokens per KV block
    record: bool  # record_schedule
    max_concurrency: int  # > 0: closed-loop clients, at most that many requests in flight
    max_model_len: int  # > 0: a prompt that leaves no room for one output token is rejected
    record_tokens: bool  # keep every token's time and one row per iteration


class LoopConfig(NamedTuple):
    """What one engine's iteration loop reads and never changes (:func:`.engine.loop_config`)."""

    coef: np.ndarray
    chunked: bool  # chunked, else continuous
    rules: int
    max_num_seqs: int
    budget: int
    threshold: int
    prefill_only_steps: bool
    usable_blocks: int
    block_size: int
    record: bool  # schedule rows
    prefix_tokens: int
    record_steps: bool  # one row per iteration
    max_blocks: int  # the most blocks one request of the stream can hold
    prefix_ids: np.ndarray  # the stream's prefix block ids (Stream.prefix_ids)


class Engine(NamedTuple):
    """One engine's state (``st``, ``clock``: slots ST_* and CLOCK_*), its tables and scratch arrays, and where its
    metrics go (:func:`.engine.new_engine`). The arrays are updated in place; the tuple itself never changes."""

    st: np.ndarray  # int64, slots ST_*
    clock: np.ndarray  # float64, slots CLOCK_*
    run: np.ndarray  # the running table, int64, one row per running request, columns RUN_*
    run_t: np.ndarray  # s, when each row's last token came, if before the step just before
    gap_t: np.ndarray  # scratch: the times of the last tokens of the gaps a step closes
    gap_req: np.ndarray  # scratch: their requests, if they may yet be rejected (else -1)
    events: np.ndarray  # scratch: rows whose first or last token a step emits
    wait: np.ndarray  # the waiting queue: a ring buffer, since preempted requests go back to its front
    skipped: np.ndarray  # scratch: waiting requests set aside in one admission pass
    victims: np.ndarray  # scratch: the requests one pass preempted
    slot_times: np.ndarray  # s, when each free client slot freed (closed loop)
    pool: np.ndarray  # the block pool and prefix cache (kvcache.py), one entry when not caching
    seat_blocks: np.ndarray  # the block table: each seat's physical blocks (prefix caching)
    hit_slots: np.ndarray  # scratch: the blocks of one prefix hit
    frontend: np.ndarray  # one entry: when the API server is free
    done_log: np.ndarray  # requests in the order they emitted their last token
    itl: np.ndarray  # the inter-token-gap histogram, ITL_BINS rows of (count, sum, min, max s)
    totals: np.ndarray  # run totals, slots TOTAL_*


class KernelOutput(NamedTuple):
    """What :func:`batchlab._kernels.simulate_kernel` returns, by name (per-request arrays: one entry a request)."""

    status: int  # STATUS_OK, or STATUS_STUCK if the loop made no progress (PROGRESS_GUARD; a bug)
    first_token_s: np.ndarray  # s, emission of the first output token (NaN: never)
    finish_s: np.ndarray  # s, emission of the last output token
    scheduled_s: np.ndarray  # s, first time the request was scheduled
    release_s: np.ndarray  # s, when its KV blocks and seat were freed
    preemptions: np.ndarray  # times preempted
    reject_code: np.ndarray  # 0 served, else REJECT_KV, REJECT_BUDGET or REJECT_RECOMPUTE
    padded_tokens: np.ndarray  # padding rows computed for it (static, dynamic)
    computed_tokens: np.ndarray  # token positions computed, recomputation included
    recomputed_tokens: np.ndarray  # positions computed again after preemption
    cached_tokens: np.ndarray  # prompt tokens found in the prefix cache at the first admission
    sent_s: np.ndarray  # s, when the client sent the request (its arrival, or later under max_concurrency)
    seen_s: np.ndarray  # s, when the engine saw it, through the API server (NaN: rejected before the loop)
    token_offsets: np.ndarray  # index of each request's first token in token_times_s (length n + 1)
    token_times_s: np.ndarray  # s, every output token's emission time, request after request (record_tokens)
    steps: np.ndarray  # one row per iteration, columns STEP_COLUMNS (record_tokens)
    schedule: np.ndarray  # one row per request per iteration (record_schedule), columns SCHED_COLUMNS
    itl: np.ndarray  # histogram of inter-token gaps, ITL_BINS rows of (count, sum, min, max s); see layout.ITL_SUB
    totals: np.ndarray  # run totals, slots TOTAL_*


class FleetOutput(NamedTuple):
    """What :func:`batchlab._kernels.fleet_kernel` returns: the tables of the front engines (replicas, or prefill
    instances) and of the back ones (decode instances; the same arrays without disaggregation), and the records of
    every engine, one after another."""

    status: int  # STATUS_OK or STATUS_STUCK
    req: np.ndarray  # the front per-request table, columns REQ_*
    times: np.ndarray  # the front per-request times, columns TIME_*
    req_d: np.ndarray  # the back per-request table
    times_d: np.ndarray  # the back per-request times
    token_offsets: np.ndarray  # index of each request's first token in token_times_s (length n + 1)
    token_times_s: np.ndarray  # s, every output token's time (record_tokens)
    front_of: np.ndarray  # per request, the engine that served it or computed its prompt (-1: none)
    back_of: np.ndarray  # per request, the engine that decoded it (-1: none)
    ready_s: np.ndarray  # s, when its KV landed on a decode instance (NaN: never sent)
    steps: np.ndarray  # every engine's steps, engine after engine
    step_off: np.ndarray  # each engine's first row of steps (length engines + 1)
    schedule: np.ndarray  # every engine's schedule rows
    sched_off: np.ndarray  # each engine's first row of schedule
    itl: np.ndarray  # one ITL histogram per engine
    totals: np.ndarray  # one row of totals per engine
