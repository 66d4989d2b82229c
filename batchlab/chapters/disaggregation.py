"""Chapter 11, one engine or two kinds of engine: replicas behind a router, and prefill split from decode.

For a fixed number of GPUs, the request rate each configuration sustains with 90 % of requests inside a TTFT and a
TPOT bound (goodput, as DistServe defines it), per GPU, on three workloads and three SLOs; the KV transfer a split
pays; and routing over replicas on Mooncake's conversation trace. Every run is :func:`batchlab.simulate_fleet` or
:func:`batchlab.simulate_disaggregated`; the grid runs on any ``concurrent.futures`` executor (Dask's included).
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

import batchlab as bl
from batchlab import viz
from batchlab._kernels import ROUTERS

ATTAINMENT = 0.9  # share of requests that must meet both bounds (DistServe's goodput)
WORKLOADS = {  # the chapter's name -> length preset (prompt and output lengths of a public trace)
    "short chat": "sharegpt",
    "long-prompt summarisation": "arxiv-summarization",
    "code": "azure-code-2023",
}
TIE_TOLERANCE = 0.05  # best split and best colocated within 5 % of each other: a tie
WHOLE = "colocated, whole prompts"
SLOS = (  # (TTFT ms, TPOT ms), tight to loose
    (250.0, 10.0),
    (1000.0, 20.0),
    (5000.0, 50.0),
)


def configs(n_gpus: int) -> dict[str, dict]:
    """The configurations of ``n_gpus`` GPUs (one engine each): colocated replicas with whole prompts
    (vLLM before chunked prefill, DistServe's baseline), colocated with chunked prefill at vLLM's defaults and at a
    512-token budget (Sarathi-Serve's regime), and every split xP + yD with x + y = ``n_gpus``."""
    out = {
        WHOLE: {"n_prefill": 0, "knobs": {"enable_chunked_prefill": False,
                                                                "max_num_batched_tokens": 8192}},
        "colocated, chunked (8,192)": {"n_prefill": 0, "knobs": {}},
        "colocated, chunked (512)": {"n_prefill": 0, "knobs": {"max_num_batched_tokens": 512, "max_num_seqs": 512}},
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


def goodput_grid(cost, rates: dict, n_gpus: int = 4, duration_s: float = 30.0, seed=0, slos=SLOS,
                 executor=None) -> pd.DataFrame:
    """Every configuration of :func:`configs` on every workload at every rate of ``rates[workload]`` (req/s), with
    the share of requests meeting each SLO: one row per run. Each run sends ``duration_s`` seconds of traffic
    (at least 300 requests), so a queue that grows at a rate too high for the configuration has time to show.

    ``executor``: any ``concurrent.futures.Executor`` (a process pool, or Dask's ``client.get_executor()``); its
    ``map`` runs the grid. None runs it here. Used in chapter 11.
    """
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


def slo_label(ttft_ms: float, tpot_ms: float) -> str:
    return f"TTFT {ttft_ms:,.0f} ms, TPOT {tpot_ms:,.0f} ms"


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


def goodput_chart(table: pd.DataFrame, workload_name: str | None = None, slo: int = 1):
    """Goodput per GPU of every configuration, for the workload and the SLO picked with radio buttons (the SLO
    labelled by its bounds in ms). Used in chapter 11."""
    names = list(dict.fromkeys(table["workload"]))
    order = list(dict.fromkeys(table["config"]))
    by_slo = table.drop_duplicates("slo").sort_values("slo")
    slo_param, at_slo = viz.grid_param("slo_index", table["slo"], "SLO", field="slo", value=slo,
                                       labels=[slo_label(t, p) for t, p in zip(by_slo["ttft_ms"], by_slo["tpot_ms"])])
    at_workload = "datum.workload == workload_pick"
    pick = alt.param(name="workload_pick", value=workload_name or names[0],
                     bind=alt.binding_radio(options=names, name="workload "))
    colour = alt.Color("kind:N", scale=alt.Scale(domain=["colocated", "split"], range=viz.PALETTE[:2]),
                       legend=alt.Legend(orient="bottom", title=None))
    data = table.assign(kind=np.where(table["config"].str.startswith("colocated"), "colocated", "split"))
    return alt.Chart(data).transform_filter(f"{at_slo} && {at_workload}").mark_bar().encode(
        y=alt.Y("config:N", sort=order, title=None),
        x=alt.X("goodput_per_gpu:Q", title="goodput per GPU (req/s with 90 % inside the SLO)"),
        color=colour,
        tooltip=["config:N", alt.Tooltip("goodput_per_gpu:Q", format=".2f"),
                 alt.Tooltip("goodput_req_s:Q", format=".1f")],
    ).properties(width=420, height=200).add_params(slo_param, pick)


def latency_at(grid: pd.DataFrame, name: str, rate: float) -> pd.DataFrame:
    """The P90 TTFT and TPOT (ms) of every configuration on workload ``name`` at the grid rate nearest ``rate``."""
    runs = grid[grid["workload"] == name]
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


def transfer_display(table: pd.DataFrame):
    return viz.display_table(table, {
        "prompt_tokens": ("prompt (tokens)", "{:,}"), "kv_mib": ("KV cache (MiB)", "{:,.0f}"),
        "prefill_ms": ("prefill alone (ms)", "{:,.1f}"), "nvlink_ms": ("over NVLink (ms)", "{:,.2f}"),
        "network_ms": ("over 400 Gb/s (ms)", "{:,.2f}")})


def routing_table(cost, workloads: dict, n_replicas: int, routers=ROUTERS, **knobs) -> pd.DataFrame:
    """Each router over ``n_replicas`` replicas on each workload (name -> :class:`batchlab.Requests`): the fleet's
    prefix-cache hit rate, median and P99 TTFT, P99 TPOT and the spread of requests across replicas (largest
    share / fair share). Used in chapter 11."""
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
    return viz.display_table(table, {
        "workload": ("workload", "{}"), "router": ("router", "{}"),
        "prefix_cache_hit_rate": ("prefix-cache hit rate", "{:.1%}"),
        "median_ttft_ms": ("median TTFT (ms)", "{:,.0f}"), "p99_ttft_ms": ("P99 TTFT (ms)", "{:,.0f}"),
        "p99_tpot_ms": ("P99 TPOT (ms)", "{:,.1f}"), "imbalance": ("busiest replica / mean (requests)", "{:.2f}")})


def winners_display(table: pd.DataFrame):
    return viz.display_table(table, {
        "workload": ("workload", "{}"), "slo_label": ("SLO (90 % of requests)", "{}"), "kind": ("wins", "{}"),
        "winner": ("configuration", "{}"),
        "best_colocated": ("best colocated (req/s per GPU)", "{:.2f}"),
        "best_split": ("best split (req/s per GPU)", "{:.2f}"), "best_split_config": ("best split", "{}")})


__all__ = ["ATTAINMENT", "SLOS", "TIE_TOLERANCE", "WHOLE", "WORKLOADS", "attainment", "configs", "goodput_chart",
           "goodput_grid", "goodput_table", "latency_at", "routing_display", "routing_table", "run",
           "slo_label", "transfer_display", "transfer_table", "winners", "winners_display", "workload"]
