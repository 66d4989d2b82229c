"""Chapter 11, one engine or two kinds of engine: replicas behind a router, and prefill split from decode.

For a fixed number of GPUs, the request rate each configuration sustains with 90% of requests inside a TTFT and a
TPOT bound (goodput, as DistServe defines it), per GPU, on three workloads and three SLOs; the KV transfer a split
pays; and routing over replicas on Mooncake's conversation trace and on shared system prompts. Every run is
:func:`batchlab.simulate_fleet` or :func:`batchlab.simulate_disaggregated`; the grid runs on any
``concurrent.futures`` executor (Dask's included). The experiments the facts at the end read are cached on disk
(:func:`batchlab.chapters.facts.memo`), so the chapter and the pages that quote it share one run.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

import batchlab as bl
from batchlab import viz
from ..fleet import ROUTERS

from . import facts, prefix_caching, scenes

ATTAINMENT = 0.9  # share of requests that must meet both bounds (DistServe's goodput)
WORKLOADS = {  # the chapter's name -> length preset (prompt and output lengths of a public trace)
    "short chat": "sharegpt",
    "long-prompt summarisation": "arxiv-summarization",
    "code": "azure-code-2023",
}
SMALL_BUDGET = 512  # tokens: the colocated setting with a small budget (Sarathi-Serve's regime)
TIE_TOLERANCE = 0.05  # best split and best colocated within 5% of each other: a tie
WHOLE = "colocated, whole prompts"
CHUNKED_DEFAULT = "colocated, chunked (8,192)"  # vLLM's defaults on an H100: chunked prefill, 8,192 tokens
CHUNKED_SMALL = f"colocated, chunked ({SMALL_BUDGET})"
SLOS = (  # (TTFT ms, TPOT ms), tight to loose
    (250.0, 10.0),
    (1000.0, 20.0),
    (5000.0, 50.0),
)

# -- the chapter's setting (the notebook's parameter cell repeats it; its hidden asserts check the two agree) ----
SEED = 0  # seeds the prompt and output lengths and the Poisson arrivals
GPU = "h100-sxm"
MODEL = "llama-3-8b"
N_GPUS = 4  # GPUs every configuration gets, one engine each
DURATION_S = 30.0  # seconds of traffic per run (at least 300 requests)
RATES = {  # request rates of the sweep (req/s, for all the GPUs together), geometric
    "short chat": np.geomspace(10, 400, 14).round(1),
    "long-prompt summarisation": np.geomspace(2, 80, 14).round(1),
    "code": np.geomspace(2, 120, 14).round(1),
}
ROUTING_MODEL = "llama-3.1-8b"  # Llama-3-8B's shapes with a 131,072-token context: Mooncake's prompts need it
N_REPLICAS = 4  # replicas behind the router; Mooncake's trace is replayed at its recorded rate
SHARED = dict(n_requests=6000, n_groups=256, prompts_per_group=4, system_prompt_tokens=4096, question_tokens=256,
              output_tokens=64, rate_req_s=20.0)  # system prompts whose KV outgrows one pool, not four

FLEET, ROUTING = "fleet", "routing"  # the chapter's two scenes (batchlab.chapters.scenes.SCENES)
FLEET_SCENE, ROUTING_SCENE = scenes.scene(FLEET), scenes.scene(ROUTING)


def configs(n_gpus: int) -> dict[str, dict]:
    """The configurations of ``n_gpus`` GPUs (one engine each): colocated replicas with whole prompts
    (vLLM before chunked prefill, DistServe's baseline), colocated with chunked prefill at vLLM's defaults and at a
    :data:`SMALL_BUDGET`-token budget (Sarathi-Serve's regime), and every split xP + yD with x + y = ``n_gpus``."""
    out = {
        WHOLE: {"n_prefill": 0, "knobs": {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192}},
        CHUNKED_DEFAULT: {"n_prefill": 0, "knobs": {}},
        CHUNKED_SMALL: {"n_prefill": 0,
                        "knobs": {"max_num_batched_tokens": SMALL_BUDGET, "max_num_seqs": SMALL_BUDGET}},
    }
    for x in range(1, n_gpus):
        out[f"{x}P + {n_gpus - x}D"] = {"n_prefill": x, "knobs": {}}
    return out


def workload(name: str, n_requests: int, rate_req_s: float, seed=0) -> bl.Requests:
    """``n_requests`` of a chapter workload: prompt and output lengths drawn from its trace's quantiles
    (:func:`batchlab.preset`), Poisson arrivals at ``rate_req_s``, so the workloads differ only in their lengths."""
    lengths = bl.preset(WORKLOADS[name], n_requests, rate_req_s=1.0, seed=seed)  # the arrivals are replaced
    return bl.Requests(bl.arrivals_poisson(n_requests, rate_req_s, seed=seed), lengths.prompt_tokens,
                       lengths.output_tokens)


N_LENGTHS = 5000  # requests drawn per workload to state its mean lengths (chapter 11, and chapter 9 beside its own)


def mean_lengths(name: str, seed=0, n_requests: int = N_LENGTHS) -> tuple[float, float]:
    """Mean prompt and output tokens of ``n_requests`` of a chapter workload (:func:`workload`) at ``seed``: the
    lengths chapter 11 states; chapter 9 sets them beside its own 3,000-request draw of the same code trace."""
    lengths = workload(name, n_requests, 1.0, seed)
    return float(lengths.prompt_tokens.mean()), float(lengths.output_tokens.mean())


def run(cost, requests, config: dict, n_gpus: int, **knobs):
    """One configuration of :func:`configs` on ``requests``: a :class:`batchlab.FleetResult`."""
    merged = {"max_model_len": 8192, **config["knobs"], **knobs}
    if config["n_prefill"] == 0:
        return bl.simulate_fleet(requests, cost, n_gpus, **merged)
    return bl.simulate_disaggregated(requests, cost, config["n_prefill"], n_gpus - config["n_prefill"], **merged)


def attainment(res, ttft_ms: float, tpot_ms: float) -> float:
    """Share of the requests that completed with TTFT <= ``ttft_ms`` and TPOT <= ``tpot_ms`` (a one-token output
    meets any TPOT bound)."""
    df = res.fleet.requests
    tpot = df["tpot_s"].fillna(0.0)
    ok = ~df["rejected"] & (df["ttft_s"] <= ttft_ms / 1e3) & (tpot <= tpot_ms / 1e3)
    return float(ok.mean())


def _grid_point(args) -> dict:
    """One cell of :func:`goodput_grid` (a top-level function, so any executor can ship it)."""
    cost, name, config_name, config, n_gpus, rate, n_requests, seed, slos = args
    res = run(cost, workload(name, n_requests, rate, seed), config, n_gpus)
    s = res.summary()
    row = {"workload": name, "config": config_name, "n_prefill": config["n_prefill"], "rate_req_s": rate,
           "p90_ttft_ms": s["p90_ttft_ms"], "p90_tpot_ms": s["p90_tpot_ms"], "median_ttft_ms": s["median_ttft_ms"],
           "median_tpot_ms": s["median_tpot_ms"], "completed": s["completed"]}
    for k, (ttft_ms, tpot_ms) in enumerate(slos):
        row[f"attained_{k}"] = attainment(res, ttft_ms, tpot_ms)
    return row


@facts.memo
def goodput_grid(cost, rates: dict, n_gpus: int = 4, duration_s: float = 30.0, seed=0, slos=SLOS,
                 executor=None) -> pd.DataFrame:
    """Every configuration of :func:`configs` on every workload at every rate of ``rates[workload]`` (req/s), with
    the share of requests meeting each SLO: one row per run. Each run sends ``duration_s`` seconds of traffic
    (at least 300 requests), so a queue that grows at a rate too high for the configuration has time to show.

    ``executor``: any ``concurrent.futures.Executor`` (a process pool, or Dask's ``client.get_executor()``); its
    ``map`` runs the grid. None runs it here (and caches the result on disk: :func:`facts.memo`). Used in
    chapter 11.
    """
    if not rates or any(len(r) == 0 for r in rates.values()):
        raise ValueError("rates must give each workload at least one rate (req/s)")
    unknown = sorted(set(rates) - set(WORKLOADS))
    if unknown:
        raise ValueError(f"rates: unknown workloads {unknown}; workloads: {list(WORKLOADS)}")
    jobs = [(cost, name, c_name, c, n_gpus, float(rate), max(300, int(rate * duration_s)), seed, tuple(slos))
            for name in rates for (c_name, c) in configs(n_gpus).items() for rate in rates[name]]
    rows = list((executor.map if executor is not None else map)(_grid_point, jobs))
    return pd.DataFrame(rows)


def goodput_table(grid: pd.DataFrame, n_gpus: int = 4, slos=SLOS) -> pd.DataFrame:
    """Per workload, SLO and configuration: the goodput, the rate at which the share of requests inside the SLO
    falls to :data:`ATTAINMENT` (interpolated in log rate between the last grid rate at or above it, counting up
    from the lowest, and the next; 0 if the lowest rate misses it; ``capped`` if the highest still meets it), and
    that rate per GPU. Used in chapter 11."""
    rows = []
    for (name, config), runs in grid.groupby(["workload", "config"], sort=False):
        runs = runs.sort_values("rate_req_s")
        rates = runs["rate_req_s"].to_numpy()
        for k, (ttft_ms, tpot_ms) in enumerate(slos):
            share = runs[f"attained_{k}"].to_numpy()
            ok = share >= ATTAINMENT
            n_ok = int(np.argmin(ok)) if not ok.all() else len(ok)
            best = 0.0
            if 0 < n_ok < len(ok):
                a, b = share[n_ok - 1], share[n_ok]
                frac = (a - ATTAINMENT) / (a - b)
                best = float(np.exp(np.log(rates[n_ok - 1]) + frac * np.log(rates[n_ok] / rates[n_ok - 1])))
            elif n_ok == len(ok):
                best = float(rates[-1])
            rows.append({"workload": name, "config": config, "slo": k, "ttft_ms": ttft_ms, "tpot_ms": tpot_ms,
                         "slo_label": slo_label(ttft_ms, tpot_ms), "goodput_req_s": best,
                         "goodput_per_gpu": best / n_gpus, "capped": n_ok == len(ok)})
    return pd.DataFrame(rows)


def _bound_text(ms: float) -> str:
    """A latency bound as a reader reads it: "250 ms", "1 s", "5 s" (whole seconds from a second on)."""
    return f"{ms / 1e3:,g} s" if ms >= 1e3 else f"{ms:,g} ms"


def slo_label(ttft_ms: float, tpot_ms: float) -> str:
    """An SLO as the page names it: "TTFT 250 ms, TPOT 10 ms", "TTFT 1 s, TPOT 20 ms". Used in chapter 11."""
    return f"TTFT {_bound_text(ttft_ms)}, TPOT {_bound_text(tpot_ms)}"


def winners(table: pd.DataFrame, tolerance: float = TIE_TOLERANCE) -> pd.DataFrame:
    """Per workload and SLO: the best colocated and the best split goodput per GPU, and which kind wins: ``split``
    or ``colocated`` when its best beats the other's by more than ``tolerance`` (a share), else ``tie`` (the rate
    grid and the calibrated step times are not finer than that). ``winner`` names the winning configuration. Used
    in chapter 11."""
    rows = []
    for (name, k), cell in table.groupby(["workload", "slo"], sort=False):
        colo = cell[cell["config"].str.startswith("colocated")]
        split = cell[~cell["config"].str.startswith("colocated")]
        best_colo, best_split = colo["goodput_per_gpu"].max(), split["goodput_per_gpu"].max()
        kind = ("split" if best_split > (1 + tolerance) * best_colo
                else "colocated" if best_colo > (1 + tolerance) * best_split else "tie")
        best = {"split": split, "colocated": colo}.get(kind)
        rows.append({"workload": name, "slo": k, "slo_label": cell["slo_label"].iloc[0], "kind": kind,
                     "winner": f"within {tolerance:.0%}" if best is None
                     else best.loc[best["goodput_per_gpu"].idxmax(), "config"],
                     "best_colocated": best_colo, "best_split": best_split,
                     "best_split_config": split.loc[split["goodput_per_gpu"].idxmax(), "config"],
                     "whole_prompts": float(colo.loc[colo["config"] == WHOLE, "goodput_per_gpu"].iloc[0])})
    return pd.DataFrame(rows)


def goodput_chart(table: pd.DataFrame, workload_name: str | None = None, slo: int = 1, n_gpus: int = 4):
    """Goodput per GPU of every configuration, for the workload and the SLO picked with radio buttons (the SLO
    labelled by its bounds in ms: three named choices, not a scale); ``n_gpus`` names the fleet in the tooltip.
    Used in chapter 11."""
    names = list(dict.fromkeys(table["workload"]))
    if workload_name is not None and workload_name not in names:
        raise ValueError(f"workload_name must be one of {names}, got {workload_name!r}")
    order = list(dict.fromkeys(table["config"]))
    by_slo = table.drop_duplicates("slo").sort_values("slo")
    slo_param, at_slo = viz.grid_param("slo_index", table["slo"], "SLO", field="slo", value=slo, control="radio",
                                       labels=[slo_label(t, p) for t, p in zip(by_slo["ttft_ms"], by_slo["tpot_ms"])])
    at_workload = "datum.workload == workload_pick"
    pick = alt.param(name="workload_pick", value=workload_name or names[0],
                     bind=alt.binding_radio(options=names, name="workload "))
    colour = alt.Color("kind:N", scale=alt.Scale(domain=["colocated", "split"], range=viz.PALETTE[:2]),
                       legend=alt.Legend(orient="bottom", title=None))
    data = table.assign(kind=np.where(table["config"].str.startswith("colocated"), "colocated", "split"))
    total = f"goodput, all {n_gpus:,} GPUs (req/s)"
    tips = [viz.tip("config", "configuration", kind="N"), viz.tip("slo_label", "SLO (90% of requests)", kind="N"),
            viz.tip("goodput_per_gpu", "goodput per GPU (req/s)", ".2f"), viz.tip("goodput_req_s", total, ".2f")]
    return alt.Chart(data).transform_filter(f"{at_slo} && {at_workload}").mark_bar().encode(
        y=alt.Y("config:N", sort=order, title=None, axis=alt.Axis(labelLimit=260)),
        x=alt.X("goodput_per_gpu:Q", title="goodput per GPU (req/s with 90% inside the SLO)"),
        color=colour, tooltip=tips,
    ).properties(width=420, height=200, usermeta={"narrow": {"margin": 200}}  # a phone: room for the names
                 ).add_params(slo_param, pick)


def latency_at(grid: pd.DataFrame, name: str, rate: float) -> pd.DataFrame:
    """The p90 TTFT and TPOT (ms) of every configuration on workload ``name`` at the grid rate nearest ``rate``.
    Used in chapter 11."""
    runs = grid[grid["workload"] == name]
    if runs.empty:
        raise ValueError(f"name: no run of workload {name!r} in the grid")
    near = runs["rate_req_s"].iloc[(runs["rate_req_s"] - rate).abs().argmin()]
    return runs[runs["rate_req_s"] == near][["config", "rate_req_s", "p90_ttft_ms", "p90_tpot_ms"]]


def transfer_table(cost, prompt_tokens=(256, 2048, 8192)) -> pd.DataFrame:
    """KV bytes and transfer time over NVLink and over a network link for a few prompt lengths, beside the
    prompt's prefill time alone on the GPU (:meth:`batchlab.CostModel.prefill_time`). Used in chapter 11."""
    rows = []
    for p in prompt_tokens:
        kv_bytes, nvlink_s = bl.transfer_times(cost, [p], "nvlink")
        _, network_s = bl.transfer_times(cost, [p], "network")
        rows.append({"prompt_tokens": p, "kv_mib": float(kv_bytes[0]) / 2**20, "nvlink_ms": float(nvlink_s[0]) * 1e3,
                     "network_ms": float(network_s[0]) * 1e3, "prefill_ms": float(cost.prefill_time(tokens=p)) * 1e3})
    return pd.DataFrame(rows)


def transfer_display(table: pd.DataFrame, network_gbit_s: float = 400.0):
    """:func:`transfer_table` for the page (``network_gbit_s``: the network link's line rate, for its header),
    every time by the book's duration rule, the unit in the cell (:func:`prefix_caching.duration_cell`: "0.60 ms",
    "213 ms"). Used in chapter 11."""
    cell = prefix_caching.duration_cell
    return viz.display_table(table, {
        "prompt_tokens": ("prompt (tokens)", "{:,}"), "kv_mib": ("KV cache (MiB)", "{:,.0f}"),
        "prefill_ms": ("prefill alone", cell), "nvlink_ms": ("over NVLink", cell),
        "network_ms": (f"over {network_gbit_s:,.0f} Gb/s", cell)})


@facts.memo
def routing_table(cost, workloads: dict, n_replicas: int, routers=ROUTERS, **knobs) -> pd.DataFrame:
    """Each router over ``n_replicas`` replicas on each workload (name -> :class:`batchlab.Requests`): the fleet's
    prefix-cache hit rate, median and p99 TTFT, p99 TPOT and the spread of requests across replicas (largest
    share / fair share). Cached on disk (:func:`facts.memo`). Used in chapter 11."""
    if not workloads:
        raise ValueError("workloads must name at least one workload")
    rows = []
    for name, requests in workloads.items():
        for router in routers:
            res = bl.simulate_fleet(requests, cost, n_replicas, router=router, **knobs)
            s = res.summary()
            counts = np.bincount(res.engine[res.engine >= 0], minlength=n_replicas)
            rows.append({"workload": name, "router": router.replace("_", " "),
                         "prefix_cache_hit_rate": s["prefix_cache_hit_rate"], "median_ttft_ms": s["median_ttft_ms"],
                         "p99_ttft_ms": s["p99_ttft_ms"], "p99_tpot_ms": s["p99_tpot_ms"],
                         "imbalance": counts.max() / counts.mean()})
    return pd.DataFrame(rows)


def routing_display(table: pd.DataFrame):
    """:func:`routing_table` for the page, the latencies by the book's duration rule with the unit in the cell
    (:func:`prefix_caching.duration_cell`: "532 ms", "7.78 s"); they stay numbers (ms) in the table's data. Used
    in chapter 11."""
    cell = prefix_caching.duration_cell
    return viz.display_table(table, {
        "workload": ("workload", "{}"), "router": ("router", "{}"),
        "prefix_cache_hit_rate": ("prefix-cache hit rate", "{:.1%}"),
        "median_ttft_ms": ("median TTFT", cell), "p99_ttft_ms": ("p99 TTFT", cell),
        "p99_tpot_ms": ("p99 TPOT", cell), "imbalance": ("busiest replica / mean (requests)", "{:.2f}")})


def winners_display(table: pd.DataFrame):
    """:func:`winners` for the page: per workload and SLO, which kind wins, the winning configuration ("either"
    for a tie), the best colocated goodput per GPU and the best split's, with which split it was. Used in
    chapter 11."""
    shown = table.assign(
        winner=np.where(table["kind"] == "tie", f"either (within {TIE_TOLERANCE:.0%})", table["winner"]),
        split_text=[f"{g:.2f} ({c})" for g, c in zip(table["best_split"], table["best_split_config"])])
    return viz.display_table(shown, {
        "workload": ("workload", "{}"), "slo_label": ("SLO (90% of requests)", "{}"), "kind": ("wins", "{}"),
        "winner": ("configuration", "{}"),
        "best_colocated": ("best colocated (req/s per GPU)", "{:.2f}"),
        "split_text": ("best split (req/s per GPU)", "{}")})


# -- facts other pages glue (batchlab.chapters.facts), from the chapter's own setting ---------------------------
def chapter_cost():
    """The goodput grid's engine: Llama-3-8B in BF16 on one H100 SXM, calibrated. Used in chapter 11."""
    return bl.CostModel(bl.get_hardware(GPU), bl.get_model(MODEL))


def routing_cost():
    """The routing runs' engine: Llama-3.1-8B (Llama-3-8B's shapes, a long context) on one H100 SXM."""
    return bl.CostModel(bl.get_hardware(GPU), bl.get_model(ROUTING_MODEL))


def routing_workloads(seed=SEED) -> dict:
    """The routing section's two workloads: Mooncake's conversation trace at its recorded rate and the shared
    system prompts of :data:`SHARED`. Used in chapter 11."""
    return {"Mooncake conversations": prefix_caching.mooncake_requests(),
            "shared system prompts": bl.shared_prefix(**SHARED, seed=seed)}


def chapter_winners() -> pd.DataFrame:
    """:func:`winners` of the page's grid (:data:`RATES` on :data:`N_GPUS` GPUs; cached on disk), indexed by
    ``workload`` and ``slo``. Used by the facts below."""
    grid = goodput_grid(chapter_cost(), RATES, n_gpus=N_GPUS, duration_s=DURATION_S, seed=SEED)
    return winners(goodput_table(grid, n_gpus=N_GPUS)).set_index(["workload", "slo"])


def chapter_routing() -> pd.DataFrame:
    """:func:`routing_table` of the page's two workloads on :data:`N_REPLICAS` replicas (cached on disk), indexed
    by ``workload`` and ``router``. Used by the facts below."""
    return routing_table(routing_cost(), routing_workloads(), N_REPLICAS).set_index(["workload", "router"])


@facts.fact("disagg_tight_slo", scene=FLEET, chapter="disaggregation",
            text="the tightest of the chapter's three SLOs, met by 90% of requests (DistServe's goodput)")
def _tight_slo():
    return slo_label(*SLOS[0])


@facts.fact("disagg_code_tight_split", scene=FLEET, chapter="disaggregation",
            text="the split of four GPUs into prefill (P) and decode (D) instances with the most goodput per GPU "
                 "on the code workload under the tightest SLO")
def _code_tight_split():
    return str(chapter_winners().loc[("code", 0), "best_split_config"])


@facts.fact("disagg_code_tight_gain", scene=FLEET, fmt=".2f", chapter="disaggregation",
            text="the best split's goodput per GPU over the best colocated setting's (chunked prefill at either "
                 "budget, or whole prompts), on the code workload (Poisson arrivals) under the tightest SLO")
def _code_tight_gain():
    row = chapter_winners().loc[("code", 0)]
    return float(row["best_split"] / row["best_colocated"])


def _count_fact(kind: str, text: str):
    @facts.fact(f"disagg_{kind}_cells", scene=FLEET, chapter="disaggregation", text=text)
    def _count():
        return int((chapter_winners()["kind"] == kind).sum())


_count_fact("colocated", "of the chapter's workload-and-SLO cells, how many colocated replicas win by more than "
                         "5% (chunked prefill, every time)")
_count_fact("split", "of the chapter's workload-and-SLO cells, how many a prefill/decode split wins by more than 5%")
_count_fact("tie", "of the chapter's workload-and-SLO cells, how many end within 5% (a tie)")


@facts.fact("disagg_cells", scene=FLEET, chapter="disaggregation",
            text="the chapter's workload-and-SLO cells: three workloads under three SLOs")
def _cells():
    return len(chapter_winners())


@facts.fact("disagg_router_sp_ttft_factor", scene=ROUTING, fmt=".1f", chapter="disaggregation",
            text="how many times lower the median TTFT of shared system prompts whose KV cache outgrows one "
                 "replica's pool is with a prefix-aware router than with round robin, four replicas")
def _router_sp_ttft_factor():
    r = chapter_routing()
    return float(r.loc[("shared system prompts", "round robin"), "median_ttft_ms"]
                 / r.loc[("shared system prompts", "prefix aware"), "median_ttft_ms"])


__all__ = ["ATTAINMENT", "CHUNKED_DEFAULT", "CHUNKED_SMALL", "SLOS", "SMALL_BUDGET", "TIE_TOLERANCE", "WHOLE",
           "WORKLOADS", "attainment", "chapter_cost", "chapter_routing", "chapter_winners", "configs",
           "goodput_chart", "goodput_grid", "goodput_table", "latency_at", "routing_cost", "routing_display",
           "routing_table", "routing_workloads", "run", "slo_label", "transfer_display", "transfer_table", "winners",
           "winners_display", "workload"]
