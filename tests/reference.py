"""A plain-Python reference of the scheduler loop, written for clarity rather than speed.

It follows DESIGN section 4 (and vLLM V1's ``Scheduler.schedule`` for ``chunked``) step by step with Python
lists and deques, and times each iteration with ``CostModel.step_time``. The tests require the jitted kernel
in ``batchlab._kernels`` (through ``batchlab.simulate``) to agree with it on every request's first-token and
finish time.
"""
from __future__ import annotations

import math
from collections import OrderedDict, deque
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
    sent: float = math.nan
    cached: int = 0  # prompt tokens found cached at the first admission
    hit: int = 0  # tokens found cached at the current admission
    block_ids: list = field(default_factory=list)  # physical blocks held (prefix caching)
    n_cached_blocks: int = 0  # of those, how many are full and cached
    scheduled: bool = False

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
                       prefill_only_steps=False, block_size=16, num_kv_blocks=1000, async_scheduling=False,
                       enable_prefix_caching=False, scheduler_reserve_full_isl=False, max_model_len=0,
                       max_concurrency=0, vllm_033=False):
    """Returns the list of ``Req`` after the run (first, finish, preemptions, rejected, token_times).

    ``vllm_033`` turns on the two rules vLLM 0.33 changed (the threshold ignored for a request alone; with
    chunking off, a prompt that does not fit stops admission); the other 0.33 rules are their own switches.
    """
    usable = num_kv_blocks - 1
    reqs = [Req(i, float(a), int(p), int(o)) for i, (a, p, o) in
            enumerate(zip(requests.arrival_s, requests.prompt_tokens, requests.output_tokens))]
    if max_model_len:
        for r in reqs:
            if r.prompt < max_model_len:
                r.output = min(r.output, max_model_len - r.prompt)
    live = []
    for r in reqs:
        if max_model_len and r.prompt >= max_model_len:
            r.rejected = True
            continue
        never_fits = _blocks(r.prompt + r.output - 1, block_size) > usable
        too_long = (max_num_batched_tokens > 0 and r.prompt > max_num_batched_tokens
                    and (policy == "continuous" or (policy == "chunked" and not enable_chunked_prefill)))
        r.rejected = never_fits or too_long
        if not r.rejected:
            live.append(r)
    lat = cost.request_latency_s  # the engine sees a request this long after it is sent (a serving term)
    shifted = policy != "chunked" or not (vllm_033 or async_scheduling or enable_prefix_caching
                                          or scheduler_reserve_full_isl or max_concurrency)
    client_arrival = {r.idx: r.arrival for r in live}
    if shifted:  # open loop, first rules: the engine's arrival is when the API server passes the request on
        free = -math.inf
        for r in live:
            free = max(r.arrival, free) + cost.frontend_s_per_token * r.prompt
            r.arrival = free + lat
    if policy in ("static", "dynamic"):
        _batched(live, cost, batch_size, max_queue_delay_s if policy == "dynamic" else math.inf, usable,
                 block_size)
    elif policy == "continuous":
        _orca(live, cost, max_num_seqs, max_num_batched_tokens, prefill_only_steps, usable, block_size)
    elif not (vllm_033 or async_scheduling or enable_prefix_caching or scheduler_reserve_full_isl
              or max_concurrency):
        _vllm_v1(live, cost, max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold,
                 enable_chunked_prefill, usable, block_size)
    else:
        rules = Rules(enable_chunked_prefill, async_scheduling, enable_prefix_caching, scheduler_reserve_full_isl,
                      max_concurrency, requests.prefix_blocks, requests.prefix_block_tokens)
        _vllm_033(live, cost, max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold, rules, usable,
                  block_size)
    for r in live:
        r.arrival = client_arrival[r.idx]
    for r in reqs:
        if math.isnan(r.sent):
            r.sent = r.arrival
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
        t = dispatch + cost.step_time(prefill_chunks=[(p_max, 0)] * b, asynchronous=False)
        for r in batch:
            r.first = t
            r.token_times.append(t)
        for s in range(1, o_max):
            t += cost.step_time(decode_contexts=[p_max + s - 1] * b, asynchronous=False)
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
        now += cost.step_time(prefill_chunks=chunks, decode_contexts=decodes, asynchronous=False)
        for r in batch:
            r.computed += r.prompt if r in new else 1
            _emit(r, now)
        for r in [r for r in running if r.emitted == r.output]:
            running.remove(r)
            free += r.blocks
            done += 1


def _step_time(cost, scheduled, asynchronous=False) -> float:
    """Seconds of one iteration of ``scheduled`` (request, tokens) pairs: a decode or a prompt chunk each (a
    chunk that reaches every known token samples one, so runs the LM head)."""
    chunks, decodes, sampled = [], [], 0
    for r, n in scheduled:
        if n == 1 and r.emitted > 0 and r.computed == r.known - 1:
            decodes.append(r.computed)
        else:
            chunks.append((n, r.computed))
            sampled += r.computed + n == r.known
    return cost.step_time(prefill_chunks=chunks, decode_contexts=decodes, sampled_chunks=sampled,
                          asynchronous=asynchronous)


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
        now += _step_time(cost, scheduled)
        for r, n in scheduled:
            r.computed += n
            _emit(r, now)
        for r in [r for r in running if r.emitted == r.output]:
            running.remove(r)
            free += r.blocks
            r.blocks = 0
            done += 1


# -- vLLM 0.33 -----------------------------------------------------------------------------------------------

@dataclass
class Rules:
    chunking: bool
    asynchronous: bool
    caching: bool
    reserve_full: bool
    max_concurrency: int
    prefix_blocks: object  # tuple of id arrays, or None
    prefix_tokens: int


class BlockPool:
    """vLLM's block pool with prefix caching, in Python: an LRU queue of free blocks and a dict of cached keys."""

    def __init__(self, n):
        self.free = OrderedDict((s, None) for s in range(n))  # evicted from the front
        self.key = [None] * n
        self.ref = [0] * n
        self.table = {}

    def hits(self, keys):
        out = []
        for k in keys:
            if k not in self.table:
                break
            out.append(self.table[k])
        return out

    def take(self, slots):
        for s in slots:
            if self.ref[s] == 0:
                del self.free[s]
            self.ref[s] += 1

    def allocate(self, n):
        out = []
        for _ in range(n):
            s = next(iter(self.free))
            del self.free[s]
            if self.key[s] is not None:
                del self.table[self.key[s]]
                self.key[s] = None
            self.ref[s] = 1
            out.append(s)
        return out

    def cache(self, slot, key):
        if self.key[slot] is None and key not in self.table:
            self.table[key] = slot
            self.key[slot] = key

    def release(self, slots):
        for s in reversed(slots):
            self.ref[s] -= 1
            if self.ref[s] == 0:
                self.free[s] = None
                if self.key[s] is None:
                    self.free.move_to_end(s, last=False)


def _key(r, b, block_size, rules):
    """Block b of request r: named by its prefix ids where they cover it, else its own."""
    end = (b + 1) * block_size
    ids = () if rules.prefix_blocks is None else rules.prefix_blocks[r.idx]
    if end <= min(len(ids) * rules.prefix_tokens, r.prompt):
        j = (end - 1) // rules.prefix_tokens
        return ("prefix", int(ids[j]), end - j * rules.prefix_tokens)
    return ("own", r.idx, b)


def choose_victim(running) -> int:
    """Index of the running request to preempt: vLLM 0.33's FCFS ``self.running.pop()``, the last admitted."""
    return len(running) - 1


def next_waiting(waiting):
    """The waiting request tried next: vLLM 0.33's FCFS ``self.waiting.peek_request()``, the front."""
    return waiting[0]


def _vllm_033(live, cost, max_num_seqs, budget, threshold, rules, usable, block_size):
    now = last_start = 0.0
    busy = False
    pool = BlockPool(usable)
    unsent = deque(live)
    slots = deque([0.0] * rules.max_concurrency)  # times the free client slots freed
    seen, frontend = {}, -math.inf  # when the engine sees each request; when the API server is free
    waiting, running = deque(), []
    done = 0

    def grow(r, n_new, known):
        if rules.caching:
            r.block_ids += pool.allocate(n_new)
            full = min(r.computed + n_new_tokens[r.idx], known) // block_size
            for b in range(r.n_cached_blocks, full):
                pool.cache(r.block_ids[b], _key(r, b, block_size, rules))
            r.n_cached_blocks = max(r.n_cached_blocks, full)
        else:
            r.block_ids += [None] * n_new  # counted only

    def n_free():
        return len(pool.free) if rules.caching else usable - sum(len(x.block_ids) for x in running)

    def drop(r):
        if rules.caching:
            pool.release(list(r.block_ids))
        r.block_ids = []
        r.n_cached_blocks = 0

    n_new_tokens = {}
    while done < len(live):
        view = last_start if rules.asynchronous and busy else now
        while unsent:
            r = unsent[0]
            if r.idx not in seen:
                if math.isnan(r.sent):
                    if rules.max_concurrency and not slots:
                        break
                    r.sent = max(r.arrival, slots.popleft()) if rules.max_concurrency else r.arrival
                frontend = max(r.sent, frontend) + cost.frontend_s_per_token * r.prompt  # one request at a time
                seen[r.idx] = frontend + cost.request_latency_s
            if seen[r.idx] > view:
                break
            waiting.append(unsent.popleft())
        if not running and not waiting:
            now = max(now, seen[unsent[0].idx])
            busy = False
            continue
        thr = threshold if len(running) + len(waiting) > 1 else 0
        scheduled, left, dropped = [], budget, False
        i = 0
        while i < len(running) and left > 0:
            r = running[i]
            if r.emitted == r.output:
                i += 1
                continue
            n = min(r.known - r.computed, thr if thr > 0 else math.inf, left)
            need = _blocks(r.computed + n, block_size) - len(r.block_ids)
            ok = True
            while need > n_free():
                v = choose_victim(running)
                victim = running.pop(v)
                if v < i:  # already scheduled in this step: its tokens come back, the rows after it move up
                    i -= 1
                    if victim.emitted != victim.output:
                        k = next(k for k, (s, _) in enumerate(scheduled) if s is victim)
                        left += scheduled.pop(k)[1]
                dropped = True
                drop(victim)
                if victim.emitted == victim.output:
                    done += 1
                else:
                    victim.computed = 0
                    victim.preemptions += 1
                    waiting.appendleft(victim)
                if victim is r:
                    ok = False
                    break
            if not ok:
                break
            n_new_tokens[r.idx] = n
            grow(r, max(need, 0), r.known)
            scheduled.append((r, n))
            left -= n
            i += 1
        while not dropped and waiting and left > 0 and len(running) < max_num_seqs:
            r = next_waiting(waiting)
            hits = pool.hits([_key(r, b, block_size, rules) for b in range((r.known - 1) // block_size)]) \
                if rules.caching else []
            computed = len(hits) * block_size
            n = r.known - computed
            if 0 < thr < n:
                n = thr
            if not rules.chunking and n > left:
                if n > budget:
                    waiting.popleft()
                    r.rejected = True
                    done += 1
                    if rules.max_concurrency:
                        slots.append(now)
                    continue
                break
            n = min(n, left)
            idle = sum(pool.ref[s] == 0 for s in hits)
            need = _blocks(computed + n, block_size) - len(hits) + idle
            need_full = _blocks(r.known, block_size) - len(hits) + idle
            if need > n_free() or (rules.reserve_full and need_full > n_free()):
                break
            waiting.popleft()
            if not r.scheduled:
                r.scheduled = True
                r.cached = computed
            r.hit = computed
            r.computed = computed
            if rules.caching:
                pool.take(hits)
                r.block_ids = list(hits)
                r.n_cached_blocks = len(hits)
            n_new_tokens[r.idx] = n
            grow(r, _blocks(computed + n, block_size) - len(hits), r.known)
            running.append(r)
            scheduled.append((r, n))
            left -= n
        if not scheduled:
            if rules.asynchronous and busy:
                for r in [r for r in running if r.emitted == r.output]:
                    running.remove(r)
                    drop(r)
                    done += 1
                busy = False
            continue
        last_start = now
        now += _step_time(cost, scheduled, rules.asynchronous)
        busy = True
        finished_now = []
        for r, n in scheduled:
            r.computed += n
            if _emit(r, now):
                finished_now.append(r)
                if rules.max_concurrency:
                    slots.append(now)
        for r in [r for r in running if r.emitted == r.output]:
            if rules.asynchronous and r in finished_now:
                continue  # async scheduling planned the next step before this one's outputs came back
            running.remove(r)
            drop(r)
            done += 1
