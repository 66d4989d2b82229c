"""Chapter 10, prefix caching: how much a prompt's cached prefix saves, and how much KV pool it takes to keep it.

Three workloads carry prefix block ids (``Requests.prefix_blocks``): Mooncake's conversation trace (its
``hash_ids``, 512 tokens each; read offline from ``data/mooncake_conversation_prefix.csv.gz`` by
:func:`mooncake_requests`), shared system prompts (:func:`batchlab.shared_prefix`) and multi-turn chats
(:func:`batchlab.multi_turn`); :func:`chapter_workloads` builds the chapter's three. :func:`pool_sweep` replays
each through ``policy="chunked"`` with prefix caching on and off over KV pools of several sizes;
:func:`cached_bound` is the hit rate a pool that never evicts would give, counted from the ids alone;
:func:`pool_chart` draws the sweep with a workload and a pool-size control; :func:`budget_sweep` and
:func:`budget_chart` redo chapter 6's budget trade with and without the cache (the two charts are drawn in
:mod:`batchlab.chapters.prefix_caching_charts` and re-exported here). The facts other pages quote
(the hit rate of Mooncake's trace at vLLM's pool, the TTFT the cache saves on shared system prompts, ...) are
registered at the end, computed from the chapter's own setting (:data:`SCENE`) through the disk cache, so the
chapter and the pages that quote it share one run.

The simulator caches the blocks of prompts only: a block that a request's answer fills is not found by the next
request (vLLM 0.33 caches those too; issue 26). Of the chapter's workloads only the chats would find more.
"""
from __future__ import annotations

import gzip
import io

import numpy as np
import pandas as pd

from .. import viz
from .._data import DATA_DIR
from ..cost import CostModel
from ..hardware import get_hardware
from ..models import get_model
from ..sim import simulate
from ..workload import Requests, multi_turn, shared_prefix
from . import facts, scenes
from .prefix_caching_charts import (  # noqa: F401 - the chapter's charts, as chapter 10 and its tests call them
    LOG_TICK_MANTISSAS, _POOL_TIPS, _hit_curve, _pool_label, _ttft_bars, budget_chart, log_axis, pool_chart,
    pool_stops)

MOONCAKE_FILE = "mooncake_conversation_prefix.csv.gz"  # written by scripts/make_mooncake_prefix.py
MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id in Mooncake's trace
GIB = 2**30
SUMMARY_KEYS = ("prefix_cache_hit_rate", "median_ttft_ms", "p99_ttft_ms", "p99_itl_ms", "request_throughput",
                "total_token_throughput", "gpu_busy_fraction", "preemptions", "completed", "rejected")
RUN_KEYS = SUMMARY_KEYS + ("recomputed_tokens",)  # and, from the per-request table, tokens recomputed after preemption

# -- the chapter's setting (the notebook's parameter cell repeats it; its hidden asserts check the two agree) ----
SEED = 0  # seeds the synthetic workloads (prompt order, arrivals); the trace is replayed as recorded
GPU = "h100-sxm"
MODEL = "llama-3.1-8b"  # Llama-3-8B's weights and shapes with a 131,072-token context: Mooncake's prompts need it
TRACE_SPEEDUP = 0.2  # Mooncake's arrivals 5 times slower than recorded, a load one GPU can serve
N_REQUESTS = 2000  # requests of the shared-system-prompt workload
SHARED = dict(n_groups=64, prompts_per_group=16, system_prompt_tokens=4096, question_tokens=256,
              output_tokens=64, rate_req_s=4.0)
CHATS = dict(n_conversations=200, turns=8, system_prompt_tokens=2048, user_tokens=512, output_tokens=256,
             rate_req_s=0.4, turn_gap_s=30.0)  # rate: new conversations per second
POOLS_GIB = [16, 32, 64, 128, 256, 512, 1024, 2048]  # KV pool sizes of the sweep (GiB)
N_CLIENTS = 32  # closed-loop clients of the full-load runs (vllm bench serve --max-concurrency)
N_TRACE_FULL_LOAD = 3000  # Mooncake requests in the full-load run, at the recorded rate
MAX_NUM_BATCHED_TOKENS = [256, 512, 1024, 2048, 4096, 8192]  # token budgets of the chunking sweep
MAX_NUM_SEQS = 256  # in the chunking sweep: vLLM requires max_num_batched_tokens >= max_num_seqs
MOONCAKE, SHARED_NAME, CHATS_NAME = "Mooncake conversations", "shared system prompts", "multi-turn chats"

SCENE = "prefix"  # the chapter's scene (batchlab.chapters.scenes.SCENES), in the words its page states it
PREFIX_SCENE = scenes.scene(SCENE)


def chapter_cost() -> CostModel:
    """The chapter's engine: Llama-3.1-8B in BF16 on one H100 SXM, calibrated. Used in chapter 10."""
    return CostModel(get_hardware(GPU), get_model(MODEL))


def chapter_workloads(seed=SEED) -> dict:
    """The chapter's three workloads by name (:data:`MOONCAKE`, :data:`SHARED_NAME`, :data:`CHATS_NAME`), as the
    page builds them. Used in chapter 10 and by its facts."""
    return {MOONCAKE: mooncake_requests(speedup=TRACE_SPEEDUP),
            SHARED_NAME: shared_prefix(N_REQUESTS, **SHARED, seed=seed),
            CHATS_NAME: multi_turn(**CHATS, seed=seed)}


# -- the Mooncake trace, offline -------------------------------------------------------------------------------
def encode_runs(ids) -> str:
    """Block ids as runs of consecutive integers: ``[0, 14, 15, 16]`` -> ``"0 14-16"``. Used by the data script."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size == 0:
        return ""
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    runs = np.split(ids, breaks)
    return " ".join(str(run[0]) if run.size == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def decode_runs(text: str) -> list[int]:
    """The inverse of :func:`encode_runs`."""
    ids: list[int] = []
    for run in str(text).split():
        lo, _, hi = run.partition("-")
        ids.extend(range(int(lo), int(hi or lo) + 1))
    return ids


def trace_table(requests: Requests) -> pd.DataFrame:
    """One row per request: ``arrival_ms`` (integer ms since the first), ``prompt_tokens``, ``output_tokens`` and
    ``hash_id_runs`` (:func:`encode_runs`). Written by ``scripts/make_mooncake_prefix.py``."""
    ids, off = requests.prefix_ids, requests.prefix_offsets
    return pd.DataFrame({"arrival_ms": np.rint(requests.arrival_s * 1e3).astype(np.int64),
                         "prompt_tokens": requests.prompt_tokens, "output_tokens": requests.output_tokens,
                         "hash_id_runs": [encode_runs(ids[off[i]:off[i + 1]]) for i in range(len(requests))]})


def write_trace_table(table: pd.DataFrame, path) -> None:
    """Write :func:`trace_table` gzip-compressed with no name or time in the header: equal tables, equal bytes."""
    text = table.to_csv(index=False, lineterminator="\n").encode()
    with open(path, "wb") as fh, gzip.GzipFile(filename="", fileobj=fh, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(text)


def mooncake_requests(speedup: float = 1.0, limit: int | None = None, path=None) -> Requests:
    """Mooncake's conversation trace with its prefix ids, from the compact table in ``data/`` (no network).

    The same stream as ``batchlab.replay("mooncake-conversation", speedup, limit)`` (a test checks it against the
    raw file): arrivals in seconds (recorded every 3 s or so, so requests come in groups), prompt and output
    tokens, and one hash id per 512-token block of the prompt. Used in chapter 10.
    """
    with gzip.open(path or DATA_DIR / MOONCAKE_FILE, "rb") as fh:
        df = pd.read_csv(io.BytesIO(fh.read()), keep_default_na=False)
    if limit is not None:
        df = df.head(limit)
    arrival_s = df["arrival_ms"].to_numpy(dtype=np.float64) * 1e-3  # as the trace reader converts milliseconds
    reqs = Requests(arrival_s, df["prompt_tokens"].to_numpy(), df["output_tokens"].to_numpy(),
                    [decode_runs(t) for t in df["hash_id_runs"]], MOONCAKE_BLOCK_TOKENS)
    return reqs if speedup == 1 else reqs.scale_time(speedup)


REQUEST_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens", "prefix_ids", "prefix_offsets", "prefix_block_tokens")


def same_requests(a: Requests, b: Requests) -> bool:
    """Whether two request streams hold the same requests, field by field (:data:`REQUEST_FIELDS`; ``Requests``
    compares by identity). The pages' hidden cells check with it that an open cell's literals build the stream
    the page's parameters do. Used in chapters 10 and 11."""
    return len(a) == len(b) and all(np.array_equal(getattr(a, k), getattr(b, k)) for k in REQUEST_FIELDS)


# -- the hit rate a pool that never evicts gives ---------------------------------------------------------------
def cached_bound(requests: Requests, block_size: int = 16, answers_cached: bool = False) -> float:
    """Prompt tokens found cached / prompt tokens, if every block once computed stayed cached.

    Request i hits the longest run of its prefix ids, from the first, that earlier requests filled, in whole
    ``block_size`` blocks and never its last token (vLLM recomputes it). An earlier request fills the ids inside
    its prompt; with ``answers_cached`` also those its output fills. It assumes each request's prompt is computed
    before the next arrives, so it bounds what a replay finds. Used in chapter 10 and its tests.
    """
    ids, off, per_id = requests.prefix_ids, requests.prefix_offsets, requests.prefix_block_tokens
    seen: set[int] = set()
    hit = 0
    for i, prompt in enumerate(requests.prompt_tokens.tolist()):
        seq = ids[off[i]:off[i + 1]].tolist()
        run = next((k for k, x in enumerate(seq) if x not in seen), len(seq))
        hit += min(run * per_id, prompt - 1) // block_size * block_size
        filled = len(seq) if answers_cached else prompt // per_id
        seen.update(seq[:filled])
    return hit / float(requests.prompt_tokens.sum())


def reuse_gaps(requests: Requests, min_ids: int = 2) -> pd.DataFrame:
    """How far back each request reaches for its cached prefix: one row per request whose leading
    ``min_ids`` or more prefix ids were all filled by earlier requests.

    For such a request, the last earlier request that filled the deepest of those ids is the one it continues;
    ``gap_s`` is the time between their arrivals (s), ``tokens_between`` the prompt and output tokens of the
    requests sent in between (the traffic that an LRU pool must hold besides, for the prefix to survive), and
    ``reused_tokens`` the prompt tokens the request could find cached. Mooncake's first block is shared by
    every request, hence ``min_ids=2`` there. Used in chapter 10.
    """
    ids, off = requests.prefix_ids, requests.prefix_offsets
    sent = np.cumsum(requests.prompt_tokens + requests.output_tokens)
    last: dict[int, int] = {}
    rows = []
    for i in range(len(requests)):
        seq = ids[off[i]:off[i + 1]].tolist()
        run = next((k for k, x in enumerate(seq) if x not in last), len(seq))
        if run >= min_ids:
            j = last[seq[run - 1]]
            rows.append((float(requests.arrival_s[i] - requests.arrival_s[j]), int(sent[i - 1] - sent[j]),
                         min(run * requests.prefix_block_tokens, int(requests.prompt_tokens[i]) - 1)))
        last.update(dict.fromkeys(seq, i))
    return pd.DataFrame(rows, columns=["gap_s", "tokens_between", "reused_tokens"])


# -- the sweep -------------------------------------------------------------------------------------------------
def pool_blocks(cost, pool_gib: float, block_size: int = 16) -> int:
    """``num_kv_blocks`` for a KV pool of ``pool_gib`` GiB (vLLM's null block added). Used in chapter 10."""
    if not pool_gib > 0:
        raise ValueError(f"pool_gib must be a size in GiB above 0, got {pool_gib!r}")
    return int(pool_gib * GIB // (block_size * cost.kv_bytes_per_token)) + 1


def run_summary(requests: Requests, cost, **knobs) -> dict:
    """``simulate(requests, "chunked", cost, record_tokens=False, **knobs).summary()``, the keys this chapter
    reads (:data:`SUMMARY_KEYS`), and ``recomputed_tokens``: the prompt and output tokens computed again after
    preemptions, summed over the requests (``SimResult.requests``). Used in chapter 10."""
    res = simulate(requests, "chunked", cost, record_tokens=False, **knobs)
    s = res.summary()
    return {**{k: s[k] for k in SUMMARY_KEYS}, "recomputed_tokens": int(res.requests["recomputed_tokens"].sum())}


@facts.memo
def pool_sweep(cost, workloads: dict, pools_gib, caching=(True, False), **knobs) -> pd.DataFrame:
    """Every workload at every KV pool size, prefix caching on and off (cached on disk: :func:`facts.memo`).

    Used in chapter 10 and by its facts.

    Parameters
    ----------
    cost : CostModel
    workloads : dict
        Name -> ``Requests`` with prefix ids.
    pools_gib : sequence of float or None
        KV pool sizes, GiB (``num_kv_blocks`` by :func:`pool_blocks`); None is vLLM's own pool for the GPU at
        ``gpu_memory_utilization`` (default 0.92).
    caching : sequence of bool
        Values of ``enable_prefix_caching``.
    **knobs
        Passed to :func:`batchlab.simulate` (``gpu_memory_utilization``, ``max_num_batched_tokens``,
        ``max_concurrency``...).

    Returns
    -------
    DataFrame
        One row per run: ``workload``, ``caching``, ``num_kv_blocks``, ``pool_gib`` (the pool without the null
        block), ``pool_tokens``, ``log2_pool_gib``, ``default_pool`` (True for None) and :data:`RUN_KEYS`.
    """
    if not workloads:
        raise ValueError("workloads must name at least one workload")
    rows = []
    for name, reqs in workloads.items():
        for gib in pools_gib:
            blocks = cost.kv_pool_blocks(knobs.get("gpu_memory_utilization", 0.92)) if gib is None else \
                pool_blocks(cost, gib)
            for on in caching:
                s = run_summary(reqs, cost, num_kv_blocks=blocks, enable_prefix_caching=bool(on), **knobs)
                rows.append({"workload": name, "caching": bool(on), "num_kv_blocks": blocks,
                             "default_pool": gib is None, **s})
    df = pd.DataFrame(rows)
    df["pool_tokens"] = (df["num_kv_blocks"] - 1) * 16
    df["pool_gib"] = df["pool_tokens"] * cost.kv_bytes_per_token / GIB
    df["log2_pool_gib"] = np.log2(df["pool_gib"])
    return df


# -- what a sweep says (the page reads these; so do the facts) ---------------------------------------------------
def at_default_pool(sweep: pd.DataFrame) -> pd.DataFrame:
    """The runs on vLLM's own pool, indexed by ``workload`` and ``caching``. Used in chapter 10."""
    rows = sweep[sweep["default_pool"]]
    if rows.empty:
        raise ValueError("sweep has no run on vLLM's own pool (pools_gib needs None)")
    return rows.set_index(["workload", "caching"])


def hit_curve(sweep: pd.DataFrame, workload: str) -> pd.Series:
    """The hit rate with caching on against the pool (GiB), on the grid of pools (vLLM's own left out). Used in
    chapter 10."""
    on = sweep[(sweep["workload"] == workload) & sweep["caching"] & ~sweep["default_pool"]]
    if on.empty:
        raise ValueError(f"workload {workload!r} has no run with caching on in the sweep")
    return on.set_index("pool_gib")["prefix_cache_hit_rate"].sort_index()


def half_bound_pool(sweep: pd.DataFrame, workload: str, bound: float) -> float:
    """The smallest pool of the grid (GiB) whose hit rate reaches half of ``bound`` (:func:`cached_bound`): the
    pool it takes to find half of the tokens that recur. NaN if no pool of the grid does. Used in chapter 10."""
    curve = hit_curve(sweep, workload)
    reached = curve.index[curve.to_numpy() >= bound / 2]
    return float(reached[0]) if len(reached) else float("nan")


def ttft_factor(sweep: pd.DataFrame, workload: str, stat: str = "median_ttft_ms") -> float:
    """How many times lower ``stat`` (a TTFT key of the summary) is with prefix caching on than off, on vLLM's
    own pool. Used in chapter 10."""
    at = at_default_pool(sweep)
    return float(at.loc[(workload, False), stat] / at.loc[(workload, True), stat])


def flat_budget(budgets: pd.DataFrame, caching: bool = True, cols=("p99_itl_ms", "p99_ttft_ms")) -> int:
    """The smallest token budget of :func:`budget_sweep` from which every larger budget gives the same run (the
    same ``cols``): where the budget stops mattering. Used in chapter 10."""
    runs = budgets[budgets["caching"] == caching].set_index("max_num_batched_tokens").sort_index()[list(cols)]
    if runs.empty:
        raise ValueError(f"budgets has no run with caching={caching}")
    same = (runs == runs.iloc[-1]).all(axis=1).to_numpy()
    first = len(same) - int(np.argmin(same[::-1])) if not same.all() else 0  # the run of equal rows at the end
    return int(runs.index[first])


# -- tables ----------------------------------------------------------------------------------------------------
def _on_off(runs: pd.DataFrame, key: str) -> pd.DataFrame:
    """``runs`` one row per ``key`` value and caching setting, caching off first, with a ``cache`` column in words."""
    order = {k: i for i, k in enumerate(dict.fromkeys(runs[key]))}
    df = runs.assign(_k=runs[key].map(order), cache=np.where(runs["caching"], "on", "off"))
    return df.sort_values(["_k", "caching"]).drop(columns="_k")


def duration_cell(ms: float) -> str:
    """A table cell's duration (ms in) by the book's one rule, :func:`batchlab.viz.format_duration` ("130 ms",
    "12.8 s"), its number and unit held together by a no-break space. Used by the tables of chapter 10."""
    return viz.format_duration(ms).replace(" ", "\u00a0")


def gain_table(sweep: pd.DataFrame):
    """Per workload on vLLM's pool, caching off then on: hit rate, TTFT (median, p99) and the GPU's busy share.

    ``sweep`` holds one pool per workload (:func:`pool_sweep` rows with ``default_pool``). The TTFTs stay numbers
    (ms) in the table's data and read by :func:`duration_cell`, the unit in each cell. Used in chapter 10.
    """
    return viz.display_table(_on_off(sweep, "workload"), {
        "workload": ("workload", "{}"), "cache": ("prefix caching", "{}"),
        "prefix_cache_hit_rate": ("hit rate", "{:.1%}"), "median_ttft_ms": ("median TTFT", duration_cell),
        "p99_ttft_ms": ("p99 TTFT", duration_cell), "gpu_busy_fraction": ("GPU busy", "{:.0%}")})


def preemption_table(sweep: pd.DataFrame, workload: str, pools_gib):
    """One workload at the given pools, caching off then on: hit rate, preemptions, tokens computed again after
    them and p99 TTFT (:func:`duration_cell`). Used in chapter 10.
    """
    w = sweep[(sweep["workload"] == workload) & ~sweep["default_pool"]]
    w = w[np.isin(w["pool_gib"].round(6), np.round(pools_gib, 6))]
    if w.empty:
        raise ValueError(f"the sweep has no run of {workload!r} on the pools {list(pools_gib)}")
    df = _on_off(w.sort_values("pool_gib"), "pool_gib")
    return viz.display_table(df, {
        "pool_gib": ("KV pool (GiB)", "{:,.0f}"), "cache": ("prefix caching", "{}"),
        "prefix_cache_hit_rate": ("hit rate", "{:.1%}"), "preemptions": ("preemptions", "{:,d}"),
        "recomputed_tokens": ("tokens recomputed", "{:,d}"), "p99_ttft_ms": ("p99 TTFT", duration_cell)})


def throughput_table(runs: pd.DataFrame):
    """Closed-loop runs (:func:`pool_sweep` with ``max_concurrency``) per workload, caching off then on: hit rate,
    requests and tokens per second. Used in chapter 10."""
    return viz.display_table(_on_off(runs, "workload"), {
        "workload": ("workload", "{}"), "cache": ("prefix caching", "{}"),
        "prefix_cache_hit_rate": ("hit rate", "{:.1%}"), "request_throughput": ("throughput (req/s)", "{:,.2f}"),
        "total_token_throughput": ("throughput (tok/s)", "{:,.0f}")})


def workload_table(workloads: dict, block_size: int = 16) -> pd.DataFrame:
    """Per workload: requests, mean arrival rate, mean prompt and output tokens, and :func:`cached_bound` (prompt
    blocks only, and with answers cached). Used in chapter 10."""
    rows = []
    for name, r in workloads.items():
        span = float(r.arrival_s[-1] - r.arrival_s[0])
        rows.append({"workload": name, "n_requests": len(r), "rate_req_s": (len(r) - 1) / span if span else np.inf,
                     "prompt_tokens": float(r.prompt_tokens.mean()), "output_tokens": float(r.output_tokens.mean()),
                     "bound": cached_bound(r, block_size), "bound_answers": cached_bound(r, block_size, True)})
    return pd.DataFrame(rows)


def workload_display(table: pd.DataFrame):
    """:func:`workload_table` for the page. Used in chapter 10."""
    return viz.display_table(table, {
        "workload": ("workload", "{}"), "n_requests": ("requests", "{:,d}"), "rate_req_s": ("rate (req/s)", "{:.2f}"),
        "prompt_tokens": ("mean prompt (tokens)", "{:,.0f}"), "output_tokens": ("mean output (tokens)", "{:,.0f}"),
        "bound": ("hit rate, pool never full", "{:.1%}"),
        "bound_answers": ("the same, answers cached too", "{:.1%}")})


# -- the budget trade, cached or not ---------------------------------------------------------------------------
@facts.memo
def budget_sweep(cost, requests: Requests, max_num_batched_tokens, caching=(True, False), **knobs) -> pd.DataFrame:
    """One workload at each token budget, prefix caching on and off: TTFT and the decoders' p99 ITL (cached on
    disk: :func:`facts.memo`).

    Used in chapter 10. Returns one row per run: ``caching``, ``max_num_batched_tokens``, ``log2_tokens`` and
    :data:`RUN_KEYS` (ITL percentiles from the streaming summary, ``record_tokens=False``).
    """
    rows = [{"caching": bool(on), "max_num_batched_tokens": int(b), "log2_tokens": float(np.log2(b)),
             **run_summary(requests, cost, max_num_batched_tokens=int(b), enable_prefix_caching=bool(on), **knobs)}
            for on in caching for b in max_num_batched_tokens]
    return pd.DataFrame(rows)


# -- facts other pages glue (batchlab.chapters.facts), from the chapter's own setting ---------------------------
def chapter_sweep() -> pd.DataFrame:
    """:func:`pool_sweep` of :func:`chapter_workloads` on :data:`POOLS_GIB` and vLLM's pool (cached on disk): the
    page's sweep. Used by the facts below."""
    return pool_sweep(chapter_cost(), chapter_workloads(), POOLS_GIB + [None])


def chapter_full_load() -> pd.DataFrame:
    """The page's closed-loop runs on vLLM's pool (cached on disk): the first :data:`N_TRACE_FULL_LOAD` requests
    of Mooncake's trace at its recorded rate and the shared system prompts all at once, :data:`N_CLIENTS`
    clients. Used by the facts below and in chapter 10."""
    loads = {MOONCAKE: mooncake_requests(limit=N_TRACE_FULL_LOAD),
             SHARED_NAME: shared_prefix(N_REQUESTS, **{**SHARED, "rate_req_s": np.inf}, seed=SEED)}
    return pool_sweep(chapter_cost(), loads, [None], max_concurrency=N_CLIENTS)


def chapter_budgets() -> pd.DataFrame:
    """:func:`budget_sweep` of the chats on :data:`MAX_NUM_BATCHED_TOKENS` (cached on disk): the page's."""
    return budget_sweep(chapter_cost(), chapter_workloads()[CHATS_NAME], MAX_NUM_BATCHED_TOKENS,
                        max_num_seqs=MAX_NUM_SEQS)


@facts.fact("prefix_pool_gib", scene=SCENE, unit="GiB", fmt=".1f", chapter="prefix_caching",
            text="the KV pool vLLM 0.33 gives Llama-3.1-8B (or Llama-3-8B) in BF16 on one H100 SXM with its "
                 "defaults, gpu_memory_utilization 0.92, in GiB (the null block left out)")
def _pool_gib():
    cost = chapter_cost()
    return float((cost.kv_pool_blocks() - 1) * 16 * cost.kv_bytes_per_token / GIB)


@facts.fact("prefix_moon_hit", scene=SCENE, fmt=".1%", chapter="prefix_caching",
            text="the prefix-cache hit rate of Mooncake's conversation trace (replayed 5 times slower) on vLLM's "
                 "own KV pool of one H100 SXM, Llama-3.1-8B BF16")
def _moon_hit():
    return float(at_default_pool(chapter_sweep()).loc[(MOONCAKE, True), "prefix_cache_hit_rate"])


@facts.fact("prefix_moon_bound", scene=SCENE, fmt=".1%", chapter="prefix_caching",
            text="the share of Mooncake's conversation-trace prompt tokens a KV pool that never evicts would find "
                 "cached (prompt blocks only, whole 16-token blocks, never a prompt's last token)")
def _moon_bound():
    return float(cached_bound(chapter_workloads()[MOONCAKE]))


@facts.fact("prefix_moon_half_pool_gib", scene=SCENE, unit="GiB", fmt=",.0f", chapter="prefix_caching",
            text="the smallest KV pool of the chapter's grid (powers of two, GiB) on which Mooncake's conversation "
                 "trace finds half of the prompt tokens that recur (half of prefix_moon_bound)")
def _moon_half_pool():
    return half_bound_pool(chapter_sweep(), MOONCAKE, _moon_bound())


@facts.fact("prefix_moon_half_ratio", scene=SCENE, fmt=".0f", chapter="prefix_caching",
            text="prefix_moon_half_pool_gib over the KV pool vLLM gives the cache on one H100 SXM (times)")
def _moon_half_ratio():
    return _moon_half_pool() / _pool_gib()


@facts.fact("prefix_sp_ttft_factor", scene=SCENE, fmt=".1f", chapter="prefix_caching",
            text="how many times lower the median time to first token of 64 shared 4,096-token system prompts "
                 "(2,000 requests, Poisson at 4 req/s) is with prefix caching on, on vLLM's pool of one H100 SXM")
def _sp_ttft_factor():
    return ttft_factor(chapter_sweep(), SHARED_NAME)


@facts.fact("prefix_sp_throughput_factor", scene=SCENE, fmt=".1f", chapter="prefix_caching",
            text="how many times more requests per second a full server (32 closed-loop clients) completes on the "
                 "shared system prompts with prefix caching on, vLLM's pool of one H100 SXM")
def _sp_throughput_factor():
    sat = chapter_full_load().set_index(["workload", "caching"])["request_throughput"]
    return float(sat[(SHARED_NAME, True)] / sat[(SHARED_NAME, False)])


@facts.fact("prefix_chat_flat_budget", scene=SCENE, unit="tokens", fmt=",", chapter="prefix_caching",
            text="the token budget from which every larger max_num_batched_tokens gives the same p99 TTFT and p99 "
                 "ITL on the multi-turn chats with prefix caching on (one H100 SXM, vLLM's pool)")
def _chat_flat_budget():
    return flat_budget(chapter_budgets())
