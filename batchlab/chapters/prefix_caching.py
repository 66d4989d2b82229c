"""Chapter 10, prefix caching: how much a prompt's cached prefix saves, and how much KV pool it takes to keep it.

Three workloads carry prefix block ids (``Requests.prefix_blocks``): Mooncake's conversation trace (its
``hash_ids``, 512 tokens each; read offline from ``data/mooncake_conversation_prefix.csv.gz`` by
:func:`mooncake_requests`), shared system prompts (:func:`batchlab.shared_prefix`) and multi-turn chats
(:func:`batchlab.multi_turn`). :func:`pool_sweep` replays each through ``policy="chunked"`` with prefix caching on
and off over KV pools of several sizes; :func:`cached_bound` is the hit rate a pool that never evicts would give,
counted from the ids alone; :func:`pool_chart` draws the sweep with a workload and a pool-size control;
:func:`budget_sweep` and :func:`budget_chart` redo chapter 06's budget trade with and without the cache.
"""
from __future__ import annotations

import gzip
import io

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from .._data import DATA_DIR
from ..sim import simulate
from ..workload import Requests

MOONCAKE_FILE = "mooncake_conversation_prefix.csv.gz"  # written by scripts/make_mooncake_prefix.py
MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id in Mooncake's trace
GIB = 2**30
SUMMARY_KEYS = ("prefix_cache_hit_rate", "median_ttft_ms", "p99_ttft_ms", "p99_itl_ms", "request_throughput",
                "total_token_throughput", "gpu_busy_fraction", "preemptions", "completed", "rejected")
RUN_KEYS = SUMMARY_KEYS + ("recomputed_tokens",)  # and, from the per-request table, tokens recomputed after preemption


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
    return int(pool_gib * GIB // (block_size * cost.kv_bytes_per_token)) + 1


def run_summary(requests: Requests, cost, **knobs) -> dict:
    """``simulate(requests, "chunked", cost, record_tokens=False, **knobs).summary()``, the keys this chapter
    reads (:data:`SUMMARY_KEYS`), and ``recomputed_tokens``: the prompt and output tokens computed again after
    preemptions, summed over the requests (``SimResult.requests``)."""
    res = simulate(requests, "chunked", cost, record_tokens=False, **knobs)
    s = res.summary()
    return {**{k: s[k] for k in SUMMARY_KEYS}, "recomputed_tokens": int(res.requests["recomputed_tokens"].sum())}


def pool_sweep(cost, workloads: dict, pools_gib, caching=(True, False), **knobs) -> pd.DataFrame:
    """Every workload at every KV pool size, prefix caching on and off.

    Used in chapter 10.

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
        Passed to :func:`batchlab.simulate` (``gpu_memory_utilization``, ``max_num_batched_tokens``...).

    Returns
    -------
    DataFrame
        One row per run: ``workload``, ``caching``, ``num_kv_blocks``, ``pool_gib`` (the pool without the null
        block), ``pool_tokens``, ``log2_pool_gib``, ``default_pool`` (True for None) and :data:`RUN_KEYS`.
    """
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


def gain_table(sweep: pd.DataFrame):
    """Per workload at one pool: hit rate, TTFT (p50, p99) and GPU busy share with caching on and off.

    ``sweep`` holds one pool per workload (:func:`pool_sweep` with one pool). Used in chapter 10.
    """
    on = sweep[sweep["caching"]].set_index("workload")
    off = sweep[~sweep["caching"]].set_index("workload").loc[on.index]
    df = pd.DataFrame({"workload": on.index, "pool": on["pool_gib"].to_numpy(),
                       "hit": on["prefix_cache_hit_rate"].to_numpy(),
                       "p50_off": off["median_ttft_ms"].to_numpy(), "p50_on": on["median_ttft_ms"].to_numpy(),
                       "p99_off": off["p99_ttft_ms"].to_numpy(), "p99_on": on["p99_ttft_ms"].to_numpy(),
                       "busy_off": off["gpu_busy_fraction"].to_numpy(), "busy_on": on["gpu_busy_fraction"].to_numpy(),
                       "tput": on["total_token_throughput"].to_numpy()})
    return viz.display_table(df, {
        "workload": ("workload", "{}"), "pool": ("KV pool (GiB)", "{:,.1f}"), "hit": ("hit rate", "{:.1%}"),
        "p50_off": ("median TTFT, off (ms)", "{:,.0f}"), "p50_on": ("median TTFT, on (ms)", "{:,.0f}"),
        "p99_off": ("P99 TTFT, off (ms)", "{:,.0f}"), "p99_on": ("P99 TTFT, on (ms)", "{:,.0f}"),
        "busy_off": ("GPU busy, off", "{:.0%}"), "busy_on": ("GPU busy, on", "{:.0%}"),
        "tput": ("throughput (tok/s)", "{:,.0f}")})


def preemption_table(sweep: pd.DataFrame, workload: str, pools_gib):
    """One workload at the given pools: hit rate, preemptions, tokens recomputed and P99 TTFT, caching on and off.

    Used in chapter 10.
    """
    w = sweep[(sweep["workload"] == workload) & ~sweep["default_pool"]]
    w = w[np.isin(w["pool_gib"].round(6), np.round(pools_gib, 6))]
    on, off = (w[w["caching"] == c].set_index("pool_gib").sort_index() for c in (True, False))
    df = pd.DataFrame({"pool": on.index, "hit": on["prefix_cache_hit_rate"].to_numpy(),
                       "pre_off": off["preemptions"].to_numpy(), "pre_on": on["preemptions"].to_numpy(),
                       "re_off": off["recomputed_tokens"].to_numpy(), "re_on": on["recomputed_tokens"].to_numpy(),
                       "p99_off": off["p99_ttft_ms"].to_numpy() / 1e3, "p99_on": on["p99_ttft_ms"].to_numpy() / 1e3})
    return viz.display_table(df, {
        "pool": ("KV pool (GiB)", "{:,.0f}"), "hit": ("hit rate", "{:.1%}"),
        "pre_off": ("preemptions, off", "{:,d}"), "pre_on": ("preemptions, on", "{:,d}"),
        "re_off": ("tokens recomputed, off", "{:,d}"), "re_on": ("tokens recomputed, on", "{:,d}"),
        "p99_off": ("P99 TTFT, off (s)", "{:,.1f}"), "p99_on": ("P99 TTFT, on (s)", "{:,.1f}")})


def throughput_table(runs: pd.DataFrame):
    """Closed-loop runs (:func:`pool_sweep` with ``max_concurrency``) per workload: request and token throughput
    with caching off and on, and their ratio. Used in chapter 10."""
    on = runs[runs["caching"]].set_index("workload")
    off = runs[~runs["caching"]].set_index("workload").loc[on.index]
    df = pd.DataFrame({"workload": on.index, "hit": on["prefix_cache_hit_rate"].to_numpy(),
                       "req_off": off["request_throughput"].to_numpy(), "req_on": on["request_throughput"].to_numpy(),
                       "tok_off": off["total_token_throughput"].to_numpy(),
                       "tok_on": on["total_token_throughput"].to_numpy()})
    df["ratio"] = df["req_on"] / df["req_off"]
    return viz.display_table(df, {
        "workload": ("workload", "{}"), "hit": ("hit rate", "{:.1%}"),
        "req_off": ("requests/s, off", "{:,.2f}"), "req_on": ("requests/s, on", "{:,.2f}"),
        "ratio": ("on / off", "{:.2f}x"), "tok_off": ("tokens/s, off", "{:,.0f}"),
        "tok_on": ("tokens/s, on", "{:,.0f}")})


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


def _pool_label(gib: float) -> str:
    """A pool as the reader reads it: "16 GiB", "1 TiB"."""
    return f"{gib / 1024:g} TiB" if gib >= 1024 else f"{gib:g} GiB"


def pool_chart(sweep: pd.DataFrame, default_pool_gib: float, workload: str | None = None,
               pool_gib: float | None = None):
    """Hit rate against KV pool size for every workload, and TTFT with caching on and off at the chosen one.

    Used in chapter 10.

    Parameters
    ----------
    sweep : DataFrame
        :func:`pool_sweep` rows on a grid of pools (``default_pool`` False), caching on and off.
    default_pool_gib : float
        vLLM's own pool on the chapter's GPU (GiB), drawn as a rule.
    workload, pool_gib
        Selected when the page opens (defaults: the first workload, the pool nearest ``default_pool_gib``).

    Returns
    -------
    altair chart; radio buttons pick the workload and the pool (labelled in GiB), which rings the point on the
    hit-rate curve and redraws the TTFT bars.
    """
    grid = sweep[~sweep["default_pool"]]
    names = list(dict.fromkeys(grid["workload"]))
    gibs = sorted(grid["pool_gib"].unique())
    near = min(gibs, key=lambda g: abs(np.log2(g / (pool_gib or default_pool_gib))))
    pool, at_pool = viz.grid_param("log2_pool_gib", grid["log2_pool_gib"], "KV pool", value=float(np.log2(near)),
                                   labels=[_pool_label(round(g)) for g in gibs])
    pick = alt.param(name="workload_pick", value=workload or names[0],
                     bind=alt.binding_radio(options=names, name="workload "))
    return alt.hconcat(_hit_curve(grid, names, default_pool_gib, at_pool), _ttft_bars(grid, at_pool)
                       ).resolve_scale(color="independent").add_params(pool, pick)


def _hit_curve(grid, names, default_pool_gib, at_pool):
    """Left panel of :func:`pool_chart`: hit rate against pool size, one line per workload."""
    on = grid[grid["caching"]]
    x = alt.X("pool_gib:Q", title="KV pool (log scale)", scale=alt.Scale(type="log", base=2),
              axis=alt.Axis(values=sorted(on["pool_gib"].round(6).unique().tolist()),
                            labelExpr="datum.value >= 1024 ? datum.value / 1024 + ' TiB' : datum.value + ' GiB'"))
    y = alt.Y("prefix_cache_hit_rate:Q", title="prefix-cache hit rate", axis=alt.Axis(format="%"),
              scale=alt.Scale(domain=[0, 1]))
    color = alt.Color("workload:N", scale=alt.Scale(domain=names, range=viz.PALETTE[:len(names)]),
                      legend=alt.Legend(orient="bottom", title=None, columns=1))
    chosen = "datum.workload == workload_pick"
    tips = ["workload:N", alt.Tooltip("pool_gib:Q", format=",.0f"),
            alt.Tooltip("prefix_cache_hit_rate:Q", format=".1%"), "preemptions:Q"]
    base = alt.Chart(on).encode(x=x, y=y, color=color, tooltip=tips)
    lines = base.mark_line(point=True).encode(opacity=alt.condition(chosen, alt.value(1.0), alt.value(0.3)))
    ring = base.transform_filter(f"{chosen} && {at_pool}").mark_point(size=260, filled=False, strokeWidth=2,
                                                                       color="black")
    rule = alt.Chart(pd.DataFrame({"pool_gib": [default_pool_gib], "label": ["one H100: vLLM's pool"]}))
    mark = rule.mark_rule(color="#999999", strokeDash=[4, 3]).encode(x="pool_gib:Q")
    text = rule.mark_text(align="left", dx=4, y=6, baseline="top", fontSize=10, color="#666666").encode(
        x="pool_gib:Q", text="label:N")
    return alt.layer(lines, ring, mark, text).properties(width=300, height=230)


def _ttft_bars(grid, at_pool):
    """Right panel of :func:`pool_chart`: median and P99 TTFT, caching on and off, at the chosen workload and pool."""
    long = grid.melt(id_vars=["workload", "caching", "log2_pool_gib", "pool_gib", "prefix_cache_hit_rate"],
                     value_vars=["median_ttft_ms", "p99_ttft_ms"], var_name="stat", value_name="ttft_ms")
    long["stat"] = long["stat"].map({"median_ttft_ms": "median", "p99_ttft_ms": "P99"})
    long["cache"] = np.where(long["caching"], "caching on", "caching off")
    chosen = alt.Chart(long).transform_filter(f"datum.workload == workload_pick && {at_pool}")
    x = alt.X("stat:N", title=None, sort=["median", "P99"], axis=alt.Axis(labelAngle=0))
    y = alt.Y("ttft_ms:Q", title="time to first token (ms)")
    order = ["caching off", "caching on"]
    bars = chosen.mark_bar().encode(
        x=x, y=y, xOffset=alt.XOffset("cache:N", sort=order),
        color=alt.Color("cache:N", title=None, sort=order, legend=alt.Legend(orient="bottom"),
                        scale=alt.Scale(domain=order, range=["#bbbbbb", "#555555"])),
        tooltip=["cache:N", "stat:N", alt.Tooltip("ttft_ms:Q", format=",.0f"),
                 alt.Tooltip("prefix_cache_hit_rate:Q", format=".1%")])
    text = chosen.mark_text(dy=-4, baseline="bottom", fontSize=9).encode(
        x=x, xOffset=alt.XOffset("cache:N", sort=order), y=y, text=alt.Text("ttft_ms:Q", format=",.0f"))
    return alt.layer(bars, text).properties(width=190, height=230)


# -- the budget trade, cached or not ---------------------------------------------------------------------------
def budget_sweep(cost, requests: Requests, max_num_batched_tokens, caching=(True, False), **knobs) -> pd.DataFrame:
    """One workload at each token budget, prefix caching on and off: TTFT and the decoders' P99 ITL.

    Used in chapter 10. Returns one row per run: ``caching``, ``max_num_batched_tokens``, ``log2_tokens`` and
    :data:`RUN_KEYS` (ITL percentiles from the streaming summary, ``record_tokens=False``).
    """
    rows = [{"caching": bool(on), "max_num_batched_tokens": int(b), "log2_tokens": float(np.log2(b)),
             **run_summary(requests, cost, max_num_batched_tokens=int(b), enable_prefix_caching=bool(on), **knobs)}
            for on in caching for b in max_num_batched_tokens]
    return pd.DataFrame(rows)


def budget_chart(points: pd.DataFrame):
    """Chapter 06's trade on a loaded server: P99 ITL against P99 TTFT, one line per caching setting, one point per
    budget (labelled in tokens). Used in chapter 10."""
    df = points.assign(cache=np.where(points["caching"], "caching on", "caching off"))
    # Budgets whose points coincide on the chart (within 1 % on both axes) share one label ("2,048 to 8,192").
    df["_x"], df["_y"] = np.round(np.log10(df["p99_ttft_ms"]) * 230), np.round(np.log10(df["p99_itl_ms"]) * 230)
    same = df.groupby(["cache", "_x", "_y"])["max_num_batched_tokens"]
    lo, hi = same.transform("min"), same.transform("max")
    df["budgets"] = [f"{a:,}" if a == b else f"{a:,} to {b:,}" for a, b in zip(lo, hi)]
    df["first"] = df["max_num_batched_tokens"] == lo
    df = df.drop(columns=["_x", "_y"])
    x = alt.X("p99_ttft_ms:Q", title="P99 time to first token (ms, log scale)",
              scale=alt.Scale(type="log", nice=False, padding=14),
              axis=alt.Axis(values=viz.log_ticks(df["p99_ttft_ms"]), format=","))
    y = alt.Y("p99_itl_ms:Q", title="P99 inter-token latency (ms, log scale)",
              scale=alt.Scale(type="log", nice=False, padding=14),
              axis=alt.Axis(values=viz.log_ticks(df["p99_itl_ms"]), format=","))
    color = alt.Color("cache:N", title=None, scale=alt.Scale(domain=["caching off", "caching on"],
                                                            range=[viz.PALETTE[3], viz.PALETTE[0]]),
                      legend=alt.Legend(orient="bottom"))
    tips = ["cache:N", "max_num_batched_tokens:Q", alt.Tooltip("p99_ttft_ms:Q", format=",.0f"),
            alt.Tooltip("p99_itl_ms:Q", format=".1f"), alt.Tooltip("prefix_cache_hit_rate:Q", format=".1%")]
    base = alt.Chart(df).encode(x=x, y=y, color=color, tooltip=tips)
    line = base.mark_line(point=True).encode(order="max_num_batched_tokens:Q")
    text = base.transform_filter("datum.first").mark_text(align="left", dx=7, dy=-7, fontSize=10).encode(
        text="budgets:N")
    return alt.layer(line, text).properties(width=440, height=260)
