"""A plain-Python reference of the scheduler loop, written for clarity rather than speed.

It follows DESIGN section 4 (and vLLM V1's ``Scheduler.schedule`` for ``chunked``) step by step with Python
lists and deques, and times each iteration with ``CostModel.step_time``. The tests require the jitted kernel
in ``batchlab._kernels`` (through ``batchlab.simulate``) to agree with it on every request's first-token and
finish time.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Req:
    idx: int
    arrival: float
    prompt: int
    output: int
    computed: int = 0
    emitted: int = 0
    blocks: int = 0
    first: float = math.nan
    finish: float = math.nan
    preemptions: int = 0
    rejected: bool = False
    token_times: list = field(default_factory=list)

    @property
    def known(self) -> int:
        """Tokens whose KV the request needs before it can sample the next one."""
        return self.prompt + self.emitted


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _idle(arrivals: deque, waiting: deque, running: list, now: float) -> bool:
    """Queue every request that has arrived by ``now``; True if nothing is running or waiting."""
    while arrivals and arrivals[0].arrival <= now:
        waiting.append(arrivals.popleft())
    return not running and not waiting


def _emit(r: Req, now: float) -> bool:
    """Sample a token if every known token is computed; True when the request is done."""
    if r.computed != r.known:
        return False
    r.token_times.append(now)
    r.emitted += 1
    if r.emitted == 1:
        r.first = now
    if r.emitted == r.output:
        r.finish = now
        return True
    return False


def reference_simulate(requests, policy, cost, batch_size=32, max_queue_delay_s=0.05, max_num_seqs=256,
                       max_num_batched_tokens=0, long_prefill_token_threshold=0, enable_chunked_prefill=True,
                       prefill_only_steps=False, block_size=16, num_kv_blocks=1000):
    """Returns the list of ``Req`` after the run (first, finish, preemptions, rejected, token_times)."""
    usable = num_kv_blocks - 1
    reqs = [Req(i, float(a), int(p), int(o)) for i, (a, p, o) in
            enumerate(zip(requests.arrival_s, requests.prompt_tokens, requests.output_tokens))]
    live = []
    for r in reqs:
        never_fits = _blocks(r.prompt + r.output - 1, block_size) > usable
        too_long = (max_num_batched_tokens > 0 and r.prompt > max_num_batched_tokens
                    and (policy == "continuous" or (policy == "chunked" and not enable_chunked_prefill)))
        r.rejected = never_fits or too_long
        if not r.rejected:
            live.append(r)
    if policy in ("static", "dynamic"):
        _batched(live, cost, batch_size, max_queue_delay_s if policy == "dynamic" else math.inf, usable,
                 block_size)
    elif policy == "continuous":
        _orca(live, cost, max_num_seqs, max_num_batched_tokens, prefill_only_steps, usable, block_size)
    else:
        _vllm_v1(live, cost, max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold,
                 enable_chunked_prefill, usable, block_size)
    return reqs


def _batched(live, cost, batch_size, delay, usable, block_size):
    now = 0.0
    queue = deque(live)
    while queue:
        pending = list(queue)
        if len(pending) >= batch_size:
            t_count = pending[batch_size - 1].arrival
        else:
            t_count = pending[-1].arrival if delay == math.inf else math.inf
        dispatch = max(now, min(t_count, pending[0].arrival + delay))
        batch, p_max, o_max = [], 0, 0
        for r in pending:
            if len(batch) == batch_size or r.arrival > dispatch:
                break
            p, o = max(p_max, r.prompt), max(o_max, r.output)
            if (len(batch) + 1) * _blocks(p + o - 1, block_size) > usable:
                break
            batch.append(r)
            p_max, o_max = p, o
        for _ in batch:
            queue.popleft()
        b = len(batch)
        t = dispatch + cost.step_time(prefill_chunks=[(p_max, 0)] * b)
        for r in batch:
            r.first = t
            r.token_times.append(t)
        for s in range(1, o_max):
            t += cost.step_time(decode_contexts=[p_max + s - 1] * b)
            for r in batch:
                if s < r.output:
                    r.token_times.append(t)
        for r in batch:
            r.emitted = r.output
            r.finish = r.token_times[-1]
        now = t


def _orca(live, cost, max_num_seqs, budget, prefill_only_steps, usable, block_size):
    now, free = 0.0, usable
    arrivals = deque(live)
    waiting, running = deque(), []
    done = 0
    while done < len(live):
        if _idle(arrivals, waiting, running, now):
            now = arrivals[0].arrival
            continue
        new, prompt_sum = [], 0
        while waiting and len(running) < max_num_seqs:
            r = waiting[0]
            need = _blocks(r.prompt + r.output - 1, block_size)
            if need > free or (budget > 0 and prompt_sum + r.prompt > budget):
                break
            waiting.popleft()
            free -= need
            r.blocks = need
            prompt_sum += r.prompt
            running.append(r)
            new.append(r)
        batch = new if (prefill_only_steps and new) else running
        chunks = [(r.prompt, 0) for r in batch if r in new]
        decodes = [r.computed for r in batch if r not in new]
        now += cost.step_time(prefill_chunks=chunks, decode_contexts=decodes)
        for r in batch:
            r.computed += r.prompt if r in new else 1
            _emit(r, now)
        for r in [r for r in running if r.emitted == r.output]:
            running.remove(r)
            free += r.blocks
            done += 1


def _vllm_v1(live, cost, max_num_seqs, budget, threshold, chunking, usable, block_size):
    now, free = 0.0, usable
    arrivals = deque(live)
    waiting, running = deque(), []
    done = 0

    def allocate(r, n):
        nonlocal free
        need = _blocks(r.computed + n, block_size) - r.blocks
        if need > free:
            return False
        free -= need
        r.blocks += need
        return True

    while done < len(live):
        if _idle(arrivals, waiting, running, now):
            now = arrivals[0].arrival
            continue
        scheduled = []  # (request, tokens)
        left = budget
        preempted = False
        i = 0
        while i < len(running) and left > 0:
            r = running[i]
            n = r.known - r.computed
            if 0 < threshold < n:
                n = threshold
            n = min(n, left)
            while not allocate(r, n):
                victim = running.pop()
                free += victim.blocks
                victim.blocks = 0
                victim.computed = 0
                victim.preemptions += 1
                waiting.appendleft(victim)
                preempted = True
                if victim is r:
                    break
            else:
                scheduled.append((r, n))
                left -= n
                i += 1
                continue
            break
        if not preempted:
            skipped = []
            while waiting and left > 0 and len(running) < max_num_seqs:
                r = waiting[0]
                n = r.known - r.computed
                if 0 < threshold < n:
                    n = threshold
                if not chunking and n > left:
                    waiting.popleft()
                    if n > budget:
                        r.rejected = True
                        done += 1
                    else:
                        skipped.append(r)
                    continue
                n = min(n, left)
                if not allocate(r, n):
                    break
                waiting.popleft()
                running.append(r)
                scheduled.append((r, n))
                left -= n
            waiting.extendleft(reversed(skipped))
        if not scheduled:
            continue
        chunks, decodes = [], []
        for r, n in scheduled:
            if n == 1 and r.emitted > 0 and r.computed == r.known - 1:
                decodes.append(r.computed)
            else:
                chunks.append((n, r.computed))
        now += cost.step_time(prefill_chunks=chunks, decode_contexts=decodes)
        for r, n in scheduled:
            r.computed += n
            _emit(r, now)
        for r in [r for r in running if r.emitted == r.output]:
            running.remove(r)
            free += r.blocks
            r.blocks = 0
            done += 1
