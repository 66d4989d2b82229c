"""vLLM's KV block pool with automatic prefix caching, over one array (``vllm/v1/core/block_pool.py``).

Physical blocks are slots ``0 .. n - 1``. A slot holds a reference count and, once full of computed tokens, the
key of the block it holds (``NO_KEY`` otherwise). Free slots sit in one doubly linked queue (sentinel ``n``):
allocation pops from its head, evicting the cached key the slot held; a freed slot with a key joins the tail
(least recently used is evicted first), one without a key the head. A hash table (open addressing, linear
probing, backward-shift deletion) maps keys to slots. Cached slots nobody references count as free.

Everything lives in one int64 array, ``pool`` (one argument per call, see ``layout``): a header (n, the table
size T, the seats S), then slot keys [n], reference counts [n], the free queue's links [n + 1] twice, the table's
keys [T] and slots [T], and the stack of free seats (rows of the block table) [S].

Block keys stand for vLLM's hash chain: the key of block ``b`` of request ``r`` (tokens ``[b B, (b + 1) B)``)
is built from the request's prefix ids when the block lies inside them, so requests sharing a prefix share
keys; any other block gets a key of its own (negative), found again only by the same request after preemption.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .layout import (NO_KEY, POOL_HEADER, POOL_SEATS, POOL_SLOTS, POOL_TABLE, REQ_PREFIX_END, REQ_PREFIX_START,
                     REQ_PROMPT, ST_CACHED_BLOCKS, ST_FREE_BLOCKS, ST_SEATS, UNINDEXED)
from .records import blocks_for

_HASH_MULTIPLIER = -7046029254386353131  # 0x9E3779B97F4A7C15 (Fibonacci hashing) as a signed 64-bit integer


@njit(cache=True)
def new_pool(n_slots, n_seats):
    """A pool of ``n_slots`` free blocks, an empty table and ``n_seats`` free seats."""
    size = 2
    while size < 2 * n_slots:
        size *= 2
    pool = np.empty(POOL_HEADER + 4 * n_slots + 2 + 2 * size + n_seats, np.int64)
    pool[POOL_SLOTS], pool[POOL_TABLE], pool[POOL_SEATS] = n_slots, size, n_seats
    key, ref, prev, nxt, tkey, tslot, seats = _sections(pool)
    pool[key:ref] = NO_KEY
    pool[ref:prev] = 0
    for s in range(n_slots + 1):  # every slot free, in order; the sentinel is n
        pool[nxt + s] = (s + 1) % (n_slots + 1)
        pool[prev + s] = (s + n_slots) % (n_slots + 1)
    pool[tkey:tslot] = NO_KEY
    for i in range(n_seats):
        pool[seats + i] = n_seats - 1 - i
    return pool


@njit(cache=True, _nrt=False)
def _sections(pool):
    """Offsets of the slot keys, reference counts, previous and next links, table keys and slots, and seats."""
    n = pool[POOL_SLOTS]
    key = POOL_HEADER
    ref = key + n
    prev = ref + n
    nxt = prev + n + 1
    tkey = nxt + n + 1
    tslot = tkey + pool[POOL_TABLE]
    return key, ref, prev, nxt, tkey, tslot, tslot + pool[POOL_TABLE]


@njit(cache=True, _nrt=False)
def block_key(req, r, b, block_size, prefix_ids, prefix_tokens, unique_stride):
    """The cache key of block ``b`` of request ``r``: shared inside its prefix ids, its own elsewhere."""
    end = (b + 1) * block_size
    start = req[r, REQ_PREFIX_START]
    covered = min((req[r, REQ_PREFIX_END] - start) * prefix_tokens, req[r, REQ_PROMPT])
    if end <= covered:
        j = (end - 1) // prefix_tokens
        return prefix_ids[start + j] * (prefix_tokens + 1) + (end - j * prefix_tokens)
    return -1 - (r * unique_stride + b)


@njit(cache=True, _nrt=False)
def _home(key, mask):
    h = key * _HASH_MULTIPLIER
    return (h ^ (h >> 29)) & mask


@njit(cache=True, _nrt=False)
def _probe(pool, key):
    """The table index holding ``key``, or the empty index that ends its probe run (linear probing)."""
    tkey = _sections(pool)[4]
    mask = pool[POOL_TABLE] - 1
    i = _home(key, mask)
    while pool[tkey + i] != NO_KEY and pool[tkey + i] != key:
        i = (i + 1) & mask
    return i


@njit(cache=True, _nrt=False)
def table_find(pool, key):
    """The slot caching ``key``, or -1."""
    _k, _r, _p, _n, tkey, tslot, _s = _sections(pool)
    i = _probe(pool, key)
    return pool[tslot + i] if pool[tkey + i] == key else -1


@njit(cache=True, _nrt=False)
def _table_insert(pool, key, slot):
    _k, _r, _p, _n, tkey, tslot, _s = _sections(pool)
    i = _probe(pool, key)  # the key is absent: an empty index
    pool[tkey + i] = key
    pool[tslot + i] = slot


@njit(cache=True, _nrt=False)
def _table_delete(pool, key):
    """Remove ``key`` (present) and shift back the run behind it so every key stays reachable from its home."""
    _k, _r, _p, _n, tkey, tslot, _s = _sections(pool)
    mask = pool[POOL_TABLE] - 1
    i = _probe(pool, key)  # the key is present
    j = i
    while True:
        j = (j + 1) & mask
        if pool[tkey + j] == NO_KEY:
            break
        home = _home(pool[tkey + j], mask)
        # Move j into the hole at i unless its home lies cyclically in (i, j].
        if (i < j and (home <= i or home > j)) or (i > j and home <= i and home > j):
            pool[tkey + i] = pool[tkey + j]
            pool[tslot + i] = pool[tslot + j]
            i = j
    pool[tkey + i] = NO_KEY


@njit(cache=True, _nrt=False)
def _unlink(pool, prev, nxt, s):
    pool[nxt + pool[prev + s]] = pool[nxt + s]
    pool[prev + pool[nxt + s]] = pool[prev + s]


@njit(cache=True, _nrt=False)
def _link_after(pool, prev, nxt, s, after):
    pool[nxt + s] = pool[nxt + after]
    pool[prev + s] = after
    pool[prev + pool[nxt + after]] = s
    pool[nxt + after] = s


@njit(cache=True, _nrt=False)
def longest_hit(req, r, n_tokens, block_size, prefix_ids, prefix_tokens, unique_stride, pool, hit_slots):
    """Cached blocks from the start of request ``r`` (never its last token: a full hit recomputes it).

    Writes their slots to ``hit_slots``; returns (blocks hit, how many of them nobody references).
    """
    _k, ref, _p, _n, _t, _ts, _s = _sections(pool)
    n = 0
    idle = 0
    max_blocks = (n_tokens - 1) // block_size
    while n < max_blocks:
        s = table_find(pool, block_key(req, r, n, block_size, prefix_ids, prefix_tokens, unique_stride))
        if s < 0:
            break
        hit_slots[n] = s
        if pool[ref + s] == 0:
            idle += 1
        n += 1
    return n, idle


@njit(cache=True, _nrt=False)
def take_seat(st, pool):
    """A free row of the block table."""
    st[ST_SEATS] -= 1
    return pool[_sections(pool)[6] + st[ST_SEATS]]


@njit(cache=True, _nrt=False)
def take_hits(st, pool, seat_blocks, seat, n_hits, hit_slots):
    """The request in row ``seat`` of the block table takes the cached blocks it hit: a reference each, out of
    the free queue if idle."""
    _k, ref, prev, nxt, _t, _ts, _s = _sections(pool)
    for i in range(n_hits):
        s = hit_slots[i]
        if pool[ref + s] == 0:
            _unlink(pool, prev, nxt, s)
            st[ST_FREE_BLOCKS] -= 1
        pool[ref + s] += 1
        seat_blocks[seat, i] = s


@njit(cache=True, _nrt=False)
def allocate(st, pool, seat_blocks, seat, held, n_new):
    """Pop ``n_new`` slots from the head of the free queue into ``seat_blocks[seat, held:]``, evicting their keys.
    (A row of the block table is passed as table and row: a view would cost reference counting.)"""
    key, ref, prev, nxt, _t, _ts, _s = _sections(pool)
    sentinel = pool[POOL_SLOTS]
    for i in range(n_new):
        s = pool[nxt + sentinel]
        _unlink(pool, prev, nxt, s)
        if pool[key + s] != NO_KEY:
            if pool[key + s] != UNINDEXED:
                _table_delete(pool, pool[key + s])
            pool[key + s] = NO_KEY
            st[ST_CACHED_BLOCKS] -= 1
        pool[ref + s] = 1
        seat_blocks[seat, held + i] = s
    st[ST_FREE_BLOCKS] -= n_new


@njit(cache=True, _nrt=False)
def register_full(st, pool, req, r, seat_blocks, seat, first, last, block_size, prefix_ids, prefix_tokens,
                  unique_stride):
    """Cache blocks ``first .. last - 1`` of request ``r``, now full of known tokens (a key cached already by
    another block stays with that block, as vLLM keeps the first)."""
    key = _sections(pool)[0]
    for b in range(first, last):
        s = seat_blocks[seat, b]
        if pool[key + s] != NO_KEY:
            continue
        k = block_key(req, r, b, block_size, prefix_ids, prefix_tokens, unique_stride)
        if k < 0:  # the request's own block: cached, indexed only if the request is preempted
            pool[key + s] = UNINDEXED
            st[ST_CACHED_BLOCKS] += 1
        elif table_find(pool, k) < 0:
            _table_insert(pool, k, s)
            pool[key + s] = k
            st[ST_CACHED_BLOCKS] += 1


@njit(cache=True, _nrt=False)
def index_own_blocks(pool, req, r, seat_blocks, seat, held, block_size, prefix_ids, prefix_tokens, unique_stride):
    """Before a preempted request lets go of its blocks, index its own cached ones so it can find them again."""
    key = _sections(pool)[0]
    for b in range(held):
        s = seat_blocks[seat, b]
        if pool[key + s] == UNINDEXED:
            k = block_key(req, r, b, block_size, prefix_ids, prefix_tokens, unique_stride)
            _table_insert(pool, k, s)
            pool[key + s] = k


@njit(cache=True, _nrt=False)
def release(st, pool, seat_blocks, seat, held):
    """Drop a request's references, last block first: idle cached blocks join the free queue's tail (the
    request's tail is evicted before its head), idle uncached ones its head. Its seat is free again."""
    key, ref, prev, nxt, _t, _ts, seats = _sections(pool)
    sentinel = pool[POOL_SLOTS]
    for i in range(held - 1, -1, -1):
        s = seat_blocks[seat, i]
        pool[ref + s] -= 1
        if pool[ref + s] == 0:
            after = pool[prev + sentinel] if pool[key + s] != NO_KEY else sentinel
            _link_after(pool, prev, nxt, s, after)
            st[ST_FREE_BLOCKS] += 1
    pool[seats + st[ST_SEATS]] = seat
    st[ST_SEATS] += 1


@njit(cache=True, _nrt=False)
def blocks_to_admit(n_tokens, computed, want, n_hits, idle_hits, block_size):
    """Blocks a waiting request needs from the free pool: for its first chunk and for its whole sequence."""
    chunk = blocks_for(computed + want, block_size) - n_hits + idle_hits
    full = blocks_for(n_tokens, block_size) - n_hits + idle_hits
    return chunk, full
