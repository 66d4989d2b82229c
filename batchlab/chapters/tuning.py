"""Chapter 9, tuning for your traffic: the knobs with the largest goodput under an SLO, beside vLLM's defaults.

:func:`tuning_grid` runs :func:`batchlab.tune` for every workload, SLO and load of the chapter, over chapter 8's
grid of the two knobs, and keeps, per combination, the whole grid (:data:`GRID_COLUMNS`) and one line for the
tuner's pick and vLLM's default (:data:`PICK_COLUMNS`). A load is a share of the workload's capacity
(:func:`batchlab.chapters.two_knobs.saturation_rate`), so the conversation scene's loads are chapter 8's.
:func:`headroom` adds the largest rate each of the two sustains under the SLO (:func:`batchlab.max_rate`).
:func:`goodput_map_chart` (:mod:`batchlab.chapters.tuning_charts`, re-exported here) draws the goodput map over
the knob grid, the pick and the default marked, behind radio buttons for the workload, the SLO and the load;
:func:`picks_table` and :func:`headroom_table` format the
readings. Where no setting holds the SLO's p99s at a load, the pages say so rather than name a pick.

The end of the module registers the facts other pages glue (:mod:`batchlab.chapters.facts`): the two SLOs, the
pick under the stall bound and its goodput against the default's, and the largest sustainable rates.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import viz
from ..tune import SLO, max_rate, parse_goodput, tune
from ..workload import preset
from . import facts, scenes, two_knobs
from .tuning_charts import (  # noqa: F401 - the goodput map, as chapter 9 and its tests call it
    MAP_KINDS, MAP_SCHEME, MAP_SHAPES, MAP_WIDTH, READOUT_CHARS, REFUSED_FILL, _holds_expr, _indices, _map_data,
    _map_readout, goodput_map_chart, readout_label)

WORKLOADS = {"azure-conv-2023": "conversation", "azure-code-2023": "code"}  # preset -> name on the page
WORKLOAD_SCENES = {"azure-conv-2023": "conv", "azure-code-2023": "code"}  # preset -> its scene
SLOS = ("ttft:500 tpot:50", "ttft:500 tpot:50 itl:100")  # vLLM's --goodput syntax and batchlab's itl, ms
LOADS = {two_knobs.CONV_LOADS["light"]: "50% of capacity", two_knobs.CONV_LOADS["near"]: "95% of capacity"}
GRID_COLUMNS = ["workload", "slo", "load", "rate_req_s", "max_num_seqs", "max_num_batched_tokens", "vllm_refuses",
                "vllm_default", "best", "request_goodput", "share_of_top", "share_within", "slo_met",
                "p99_ttft_ms", "p99_tpot_ms", "p99_longest_itl_ms", "slo_load"]
PICK_COLUMNS = ["workload", "slo", "load", "rate_req_s", "holds_any", "best_max_num_seqs",
                "best_max_num_batched_tokens", "best_goodput", "best_slo_met", "best_p99_ttft_ms", "best_p99_tpot_ms",
                "best_p99_longest_itl_ms", "best_slo_load", "default_max_num_seqs", "default_max_num_batched_tokens",
                "default_goodput", "default_slo_met", "default_p99_ttft_ms", "default_p99_tpot_ms",
                "default_p99_longest_itl_ms", "default_slo_load", "gain", "top_goodput", "served_req_s"]
_WORDS = {"ttft": "TTFT", "tpot": "TPOT", "e2el": "E2EL", "itl": "longest gap"}  # an SLO's bounds, as read


def slo_label(slo: SLO) -> str:
    """``"TTFT 500 ms, TPOT 50 ms, longest gap 100 ms"``: an SLO's bounds as a reader reads them (ms); the itl
    bound reads as what it bounds, each request's longest gap between two tokens. Used in chapter 9."""
    return ", ".join(f"{_WORDS[key]} {value:,g} ms" for key, value in slo.bounds_ms.items())


def slo_readings(res, specs) -> pd.DataFrame:
    """One run read under several SLOs: throughput, goodput, requests that missed a bound, p99s, SLO held.

    Used in chapter 9, to show that goodput (each request against every bound) and a p99 SLO (the tail of each
    latency against its bound) are different tests, and that a TPOT bound cannot see a stall.

    Parameters
    ----------
    res : SimResult
        A run with its token record (for an ``itl`` bound).
    specs : sequence of str
        SLOs in vLLM's ``--goodput`` syntax (ms), ``itl:`` included.

    Returns
    -------
    DataFrame
        One row per SLO: ``slo``, ``request_throughput`` and ``request_goodput`` (req/s), ``missed`` (completed
        requests that missed at least one bound), ``p99_ttft_ms``, ``p99_tpot_ms``, ``p99_longest_itl_ms``
        (each request's longest gap, NaN without an ``itl`` bound) and ``slo_met``.
    """
    rows = []
    for spec in specs:
        s = res.summary(slo=parse_goodput(spec))
        missed = round((s["request_throughput"] - s["request_goodput"]) * s["duration"])
        rows.append({"slo": spec, "request_throughput": s["request_throughput"],
                     "request_goodput": s["request_goodput"], "missed": int(missed),
                     "p99_ttft_ms": s["p99_ttft_ms"], "p99_tpot_ms": s["p99_tpot_ms"],
                     "p99_longest_itl_ms": s.get("p99_longest_itl_ms", np.nan), "slo_met": s["slo_met"]})
    return pd.DataFrame(rows)


def slo_readings_table(readings: pd.DataFrame, slo_names: dict):
    """:func:`slo_readings` formatted, the SLO by its bounds in ms, rates by the book's rule
    (:func:`batchlab.viz.format_rate`). Used in chapter 9."""
    rate, ms = viz.format_rate, _duration
    longest = readings["p99_longest_itl_ms"].map(lambda v: ms(v) if np.isfinite(v) else "not bounded")
    shown = readings.assign(slo=readings["slo"].map(slo_names), p99_longest_itl_ms=longest,
                            slo_met=readings["slo_met"].map({True: "yes", False: "no"}))
    return viz.display_table(shown, {
        "slo": ("SLO", str), "request_throughput": ("served (req/s)", rate),
        "request_goodput": ("goodput (req/s)", rate), "missed": ("requests missing a bound", "{:,}".format),
        "p99_ttft_ms": ("p99 TTFT", ms), "p99_tpot_ms": ("p99 TPOT", ms),
        "p99_longest_itl_ms": ("p99 longest gap", str),
        "slo_met": ("p99s within the SLO", str)})


def _duration(value) -> str:
    """A table cell's duration by the book's one rule (:func:`batchlab.viz.format_duration`), its number and
    unit on one line."""
    return viz.format_duration(value).replace(" ", "\u00a0")


@facts.memo
def tuning_grid(cost, workloads, slos, loads, n_requests: int, *, seed=0, executor=None,
                goodput_rel_tol: float = 0.01, max_num_seqs=two_knobs.MAX_NUM_SEQS,
                max_num_batched_tokens=two_knobs.MAX_NUM_BATCHED_TOKENS):
    """:func:`batchlab.tune` at every workload, SLO and load: the knob grid and the pick against the default.

    Each workload is ``preset(workload, n_requests, rate_req_s, seed=seed)`` at ``rate_req_s = load x capacity``
    to 0.1 req/s, the capacity being :func:`batchlab.chapters.two_knobs.saturation_rate` of the same stream:
    with one seed the lengths and the shape of the arrivals are the same at every load. Results are cached
    (:func:`batchlab.chapters.facts.memo`). Used in chapter 9.

    Parameters
    ----------
    cost : CostModel
    workloads : sequence of str
        Real-trace presets with arrival times (:func:`batchlab.preset_names`).
    slos : sequence of str
        SLOs in vLLM's ``--goodput`` syntax, ``"ttft:500 tpot:50"`` (ms), ``itl:`` included.
    loads : sequence of float
        Request rates as shares of each workload's capacity (> 0).
    n_requests : int
    seed : int
    executor : concurrent.futures.Executor, optional
        Passed to :func:`batchlab.tune`.
    goodput_rel_tol : float, default 0.01
        Passed to :func:`batchlab.tune`: goodputs this close to the largest tie.
    max_num_seqs, max_num_batched_tokens : sequence of int
        The grid (default: chapter 8's).

    Returns
    -------
    grid : DataFrame
        One row per combination and knob pair (:data:`GRID_COLUMNS`): ``workload``, ``slo`` (the spec string),
        ``load``, ``rate_req_s`` (req/s), the knobs, ``vllm_refuses``, ``vllm_default``, ``best`` (the tuner's
        pick), ``request_goodput`` (req/s), ``share_of_top`` (goodput over the largest goodput of the grid, 0 to
        1; NaN where vLLM refuses the pair, 0 where no pair has goodput), ``share_within`` (goodput over the
        pair's own ``request_throughput``: the share of its requests within the SLO), ``slo_met``, the p99 TTFT,
        TPOT and longest gap (ms; the longest gap from the same run under an SLO with an ``itl`` bound, NaN if
        there is none) and ``slo_load`` (the largest p99 / bound;
        NaN where vLLM refuses the pair). vLLM's default is in the grid.
    picks : DataFrame
        One row per combination (:data:`PICK_COLUMNS`): ``holds_any`` (some pair holds the SLO's p99s), the
        pick's ("best") and the default's knobs, goodput (req/s), ``slo_met``, p99s (ms) and ``slo_load``,
        ``gain`` (best / default goodput), ``top_goodput`` (the largest goodput of the grid, req/s) and
        ``served_req_s`` (the requests per second vLLM's default served: its goodput's ceiling).
    """
    if any(not float(v) > 0 for v in loads):
        raise ValueError(f"loads must be shares of capacity > 0, got {list(loads)!r}")
    grids, picks = [], []
    for workload in workloads:
        capacity = two_knobs.saturation_rate(cost, workload, n_requests, seed=seed)
        for load in loads:
            rate = round(float(load) * capacity, 1)
            stream = preset(workload, n_requests, rate_req_s=rate, seed=seed)
            for spec in slos:
                result = tune(stream, cost, parse_goodput(spec), max_num_seqs=list(max_num_seqs),
                              max_num_batched_tokens=list(max_num_batched_tokens), executor=executor,
                              progress=False, goodput_rel_tol=goodput_rel_tol)
                grids.append(_grid_rows(result, workload, spec, float(load), rate))
                picks.append(_pick_row(result, workload, spec, float(load), rate))
    grid = pd.concat(grids, ignore_index=True)
    same_run = ["workload", "load", "max_num_seqs", "max_num_batched_tokens"]  # one run read under each SLO
    grid["p99_longest_itl_ms"] = grid.groupby(same_run)["p99_longest_itl_ms"].transform("max")
    picks = pd.DataFrame(picks)
    best = grid[grid["best"]].set_index(["workload", "slo", "load"])["p99_longest_itl_ms"]
    default = grid[grid["vllm_default"]].set_index(["workload", "slo", "load"])["p99_longest_itl_ms"]
    keys = list(zip(picks["workload"], picks["slo"], picks["load"]))
    picks["best_p99_longest_itl_ms"] = best.loc[keys].to_numpy()
    picks["default_p99_longest_itl_ms"] = default.loc[keys].to_numpy()
    return grid[GRID_COLUMNS], picks[PICK_COLUMNS]


def _grid_rows(result, workload, spec, load, rate) -> pd.DataFrame:
    table = result.table
    if "p99_longest_itl_ms" not in table.columns:
        table = table.assign(p99_longest_itl_ms=np.nan)
    best = result.best
    is_best = (table["max_num_seqs"] == best["max_num_seqs"]) & (
        table["max_num_batched_tokens"] == best["max_num_batched_tokens"])
    top = table["request_goodput"].max()
    share = table["request_goodput"] / top if top > 0 else table["request_goodput"] * 0.0
    within = (table["request_goodput"] / table["request_throughput"]).where(~table["vllm_refuses"])
    return table.assign(workload=workload, slo=spec, load=load, rate_req_s=rate, best=is_best.to_numpy(),
                        share_of_top=share.where(~table["vllm_refuses"]), share_within=within)


def _pick_row(result, workload, spec, load, rate) -> dict:
    accepted = result.table[~result.table["vllm_refuses"]]
    row = {"workload": workload, "slo": spec, "load": load, "rate_req_s": rate, "gain": result.gain,
           "holds_any": bool(accepted["slo_met"].any())}
    for who, point in (("best", result.best), ("default", result.defaults)):
        row[f"{who}_max_num_seqs"] = point["max_num_seqs"]
        row[f"{who}_max_num_batched_tokens"] = point["max_num_batched_tokens"]
        row[f"{who}_goodput"] = point["request_goodput"]
        for key in ("slo_met", "p99_ttft_ms", "p99_tpot_ms", "slo_load"):
            row[f"{who}_{key}"] = point[key]
    row["top_goodput"] = float(accepted["request_goodput"].max())
    row["served_req_s"] = float(accepted.loc[accepted["vllm_default"], "request_throughput"].iloc[0])
    return row


@facts.memo
def headroom(cost, picks: pd.DataFrame, n_requests: int, *, seed=0, rel_tol: float = 0.02) -> pd.DataFrame:
    """The largest request rate the tuner's pick and vLLM's default sustain under each SLO (:func:`max_rate`).

    Each workload's stream (same preset, count and seed as :func:`tuning_grid`) is scaled in time until the SLO's
    p99 bounds just hold. The search starts from one stream per workload, the one at its highest tuned rate,
    whichever row asks: :func:`max_rate` brackets from the stream's own rate, so starting each row at its own
    load would give one setting under one SLO two answers within ``rel_tol`` of each other. Results are cached.
    Used in chapter 9.

    Returns
    -------
    DataFrame
        ``picks`` with ``best_max_rate_req_s`` and ``default_max_rate_req_s`` (req/s; 0 where no rate holds the
        SLO) and ``rate_ratio`` (best over default, NaN where the default's is 0).
    """
    out = picks.copy()
    start = picks.groupby("workload")["rate_req_s"].max()  # req/s: one starting stream per workload
    for who in ("best", "default"):
        rates = []
        for row in picks.itertuples(index=False):
            stream = preset(row.workload, n_requests, rate_req_s=float(start[row.workload]), seed=seed)
            knobs = {k: int(getattr(row, f"{who}_{k}")) for k in ("max_num_seqs", "max_num_batched_tokens")}
            rates.append(max_rate(stream, cost, parse_goodput(row.slo), rel_tol=rel_tol, **knobs).rate_req_s)
        out[f"{who}_max_rate_req_s"] = rates
    default = out["default_max_rate_req_s"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        out["rate_ratio"] = np.where(default > 0, out["best_max_rate_req_s"].to_numpy() / default, np.nan)
    return out


def write_example_trace(path, requests) -> None:
    """Write ``requests`` as a CSV trace the way users keep theirs: ``timestamp`` (s), ``input_tokens``,
    ``output_tokens``, one row per request. Chapter 9 reads it back with :func:`batchlab.loaders.load_workload`."""
    pd.DataFrame({"timestamp": requests.arrival_s, "input_tokens": requests.prompt_tokens,
                  "output_tokens": requests.output_tokens}).to_csv(path, index=False)


def is_default_pick(frame: pd.DataFrame) -> pd.Series:
    """Whether each row's pick is vLLM's default pair itself (the tuner confirms the default). Used in chapter 9."""
    return ((frame["best_max_num_seqs"] == frame["default_max_num_seqs"])
            & (frame["best_max_num_batched_tokens"] == frame["default_max_num_batched_tokens"]))


def _pick_knob(frame: pd.DataFrame) -> pd.Series:
    """The pick's knobs, ``"1,024 / 3,072"``; ``"1,024 / 8,192 (vLLM default)"`` where the pick is the default;
    ``"none holds the SLO"`` where no pair holds it (the tuner's most-goodput pair is then no recommendation)."""
    knobs = frame["best_max_num_seqs"].map("{:,}".format) + " / " + frame["best_max_num_batched_tokens"].map(
        "{:,}".format) + np.where(is_default_pick(frame), " (vLLM default)", "")
    return knobs.where(frame["holds_any"], "none holds the SLO")


def _scene_at(frame: pd.DataFrame, workload_names: dict, words: str = "") -> pd.Series:
    """``"conversation, 10.4 req/s"``: the scene by its name on the page and the rate of the row."""
    return frame["workload"].map(workload_names) + f", {words}" + frame["rate_req_s"].map(viz.format_rate) + " req/s"


def picks_table(picks: pd.DataFrame, slo_names: dict, workload_names: dict):
    """The tuner's pick against vLLM's default per workload, SLO and load, formatted in five columns (narrow
    enough for the book's column): scene and rate, SLO, the pick's knobs (or that no pair holds the SLO, and
    then no pick's numbers), the goodputs of the pick and the default beside the requests the default served
    (req/s), and the SLO load (largest p99 / bound) of both. Every rate reads by the book's rule
    (:func:`batchlab.viz.format_rate`), as on the map. Used in chapter 9."""
    rate = viz.format_rate

    def goodputs(r):
        best = rate(r.best_goodput) if r.holds_any else "–"
        return f"{best} / {rate(r.default_goodput)} of {rate(r.served_req_s)}"

    def loads(r):
        best = f"{r.best_slo_load:.2f}" if r.holds_any else "–"
        return f"{best} / {r.default_slo_load:.2f}"

    rows = list(picks.itertuples(index=False))
    shown = picks.assign(scene=_scene_at(picks, workload_names), slo=picks["slo"].map(slo_names),
                         best=_pick_knob(picks), goodputs=[goodputs(r) for r in rows], loads=[loads(r) for r in rows])
    return viz.display_table(shown, {
        "scene": ("scene, rate", str), "slo": ("SLO", str),
        "best": ("pick (seqs / tokens)", str),
        "goodputs": ("goodput (req/s): pick / vLLM default, of served", str),
        "loads": ("SLO load: pick / vLLM default", str)})


def headroom_table(rates: pd.DataFrame, slo_names: dict, workload_names: dict):
    """:func:`headroom` formatted in four columns: the scene and the rate it was tuned at, the SLO, the pick (the
    most-goodput pair where none holds) and the largest rate under the SLO of the pick and of the default,
    ``"no rate"`` where the SLO holds at no rate, any other by :func:`batchlab.viz.format_rate`. Used in chapter 9."""
    knobs = rates["best_max_num_seqs"].map("{:,}".format) + " / " + rates["best_max_num_batched_tokens"].map(
        "{:,}".format)

    def largest(v):
        return "no rate" if v == 0 else viz.format_rate(v)

    both = [f"{largest(b)} / {largest(d)}"
            for b, d in zip(rates["best_max_rate_req_s"], rates["default_max_rate_req_s"])]
    shown = rates.assign(scene=_scene_at(rates, workload_names, "tuned at "), slo=rates["slo"].map(slo_names),
                         best=np.where(rates["holds_any"], _pick_knob(rates), knobs + " (most goodput)"), both=both)
    return viz.display_table(shown, {
        "scene": ("scene, tuned at", str), "slo": ("SLO", str),
        "best": ("pick (seqs / tokens)", str),
        "both": ("largest rate (req/s): pick / vLLM default", str)})


def result_table(result):
    """A :func:`batchlab.tune` result as two rows, the pick and vLLM's default: knobs, goodput (req/s), p99s (ms,
    the longest gap where the SLO bounds it; goodput by :func:`batchlab.viz.format_rate`), SLO load and whether
    the p99s hold. Used in chapter 9's
    "your own traffic", so a reader sees the answer in units rather than two dicts."""
    rows = [{"setting": who, **point} for who, point in (("tuner's pick", result.best),
                                                         ("vLLM default", result.defaults))]
    frame = pd.DataFrame(rows).assign(slo_met=lambda f: f["slo_met"].map({True: "yes", False: "no"}))
    frame["knobs"] = frame["max_num_seqs"].map("{:,}".format) + " / " + frame["max_num_batched_tokens"].map(
        "{:,}".format)
    columns = {"setting": ("setting", str), "knobs": ("seqs / tokens", str),
               "request_goodput": ("goodput (req/s)", viz.format_rate), "p99_ttft_ms": ("p99 TTFT", _duration),
               "p99_tpot_ms": ("p99 TPOT", _duration)}
    if "p99_longest_itl_ms" in frame.columns:
        columns["p99_longest_itl_ms"] = ("p99 longest gap", _duration)
    columns |= {"slo_load": ("SLO load", "{:.2f}".format), "slo_met": ("p99s within the SLO", str)}
    return viz.display_table(frame, columns)


# -- the chapter's run, and the facts other pages glue ---------------------------------------------------------
def chapter_grid():
    """:func:`tuning_grid` of the chapter: :data:`WORKLOADS` (the conv and code scenes), :data:`SLOS`,
    :data:`LOADS`, the scenes' requests and seed, on their cost model. Cached."""
    s = scenes.scene("conv")
    return tuning_grid(s.cost(), tuple(WORKLOADS), SLOS, tuple(LOADS), s.n_requests, seed=s.seed)


def chapter_headroom() -> pd.DataFrame:
    """:func:`headroom` of :func:`chapter_grid`'s picks. Cached."""
    s = scenes.scene("conv")
    return headroom(s.cost(), chapter_grid()[1], s.n_requests, seed=s.seed)


def _row(frame: pd.DataFrame, workload: str, spec: str, load: float) -> pd.Series:
    at = frame[(frame["workload"] == workload) & (frame["slo"] == spec) & np.isclose(frame["load"], load)]
    if len(at) != 1:
        raise ValueError(f"no single row for {workload!r}, {spec!r}, load {load!r}")
    return at.iloc[0]


NEAR = two_knobs.CONV_LOADS["near"]
CONV, CODE = WORKLOADS


def _pick(workload: str, spec: str, load: float = NEAR) -> pd.Series:
    return _row(chapter_grid()[1], workload, spec, load)


def _rates(workload: str, spec: str, load: float = NEAR) -> pd.Series:
    return _row(chapter_headroom(), workload, spec, load)


@facts.fact("code_capacity_req_s", scene="code", unit="req/s", fmt=facts.RATE, chapter="tuning",
            text="the capacity of the code scene: requests per second the server completes with every request "
                 "queued at time 0 and vLLM's defaults")
def _code_capacity():
    return two_knobs.scene_capacity("code")


@facts.fact("code_simultaneous_share", scene="code", fmt=".0%", chapter="tuning",
            text="the share of the code scene's requests that arrive at the same instant as the one before: its "
                 "gamma renewal at the trace's inter-arrival CV of about 13 sends them in bursts")
def _code_together():
    return float((np.diff(scenes.scene("code").requests().arrival_s) == 0).mean())


@facts.fact("tuning_usual_slo", scene="conv", chapter="tuning",
            text="the usual SLO of chapter 9, in words (bounds on TTFT and TPOT, as vllm bench serve --goodput)")
def _usual_slo():
    return slo_label(parse_goodput(SLOS[0]))


@facts.fact("tuning_itl_slo", scene="conv", chapter="tuning",
            text="chapter 9's SLO with a stall bound, in words: the usual bounds and each request's longest gap")
def _itl_slo():
    return slo_label(parse_goodput(SLOS[1]))


@facts.fact("tuning_itl_bound_ms", scene="conv", unit="ms", fmt=",.0f", chapter="tuning",
            text="the bound chapter 9 puts on each request's longest gap between two tokens (itl:)")
def _itl_bound():
    return int(parse_goodput(SLOS[1]).itl_ms)


def _tuning_fact(name, unit, fmt, text, compute):
    facts.fact(f"tuning_{name}", scene="conv", unit=unit, fmt=fmt, chapter="tuning",
               text=f"{text}, on the conversation scene at its near load (95% of capacity)")(compute)


_tuning_fact("itl_pick_max_num_seqs", "sequences", ",.0f", "max_num_seqs the tuner picks under the stall-bound SLO",
             lambda: int(_pick(CONV, SLOS[1])["best_max_num_seqs"]))
_tuning_fact("itl_pick_max_num_batched_tokens", "tokens", ",.0f",
             "max_num_batched_tokens the tuner picks under the stall-bound SLO",
             lambda: int(_pick(CONV, SLOS[1])["best_max_num_batched_tokens"]))
_tuning_fact("itl_pick_goodput_req_s", "req/s", facts.RATE, "goodput of the tuner's pick under the stall-bound SLO",
             lambda: float(_pick(CONV, SLOS[1])["best_goodput"]))
_tuning_fact("itl_default_goodput_req_s", "req/s", facts.RATE, "goodput of vLLM's default under the stall-bound SLO",
             lambda: float(_pick(CONV, SLOS[1])["default_goodput"]))
_tuning_fact("served_req_s", "req/s", facts.RATE, "requests per second vLLM's default serves (its goodput's ceiling)",
             lambda: float(_pick(CONV, SLOS[1])["served_req_s"]))
_tuning_fact("itl_pick_p99_longest_ms", "ms", ",.0f", "p99 of each request's longest gap with the stall-bound pick",
             lambda: float(_pick(CONV, SLOS[1])["best_p99_longest_itl_ms"]))
_tuning_fact("default_p99_longest_ms", "ms", ",.0f", "p99 of each request's longest gap with vLLM's default",
             lambda: float(_pick(CONV, SLOS[1])["default_p99_longest_itl_ms"]))
_tuning_fact("itl_pick_max_rate_req_s", "req/s", facts.RATE,
             "the largest rate the stall-bound pick sustains under that SLO (bl.max_rate)",
             lambda: float(_rates(CONV, SLOS[1])["best_max_rate_req_s"]))
_tuning_fact("itl_default_max_rate_req_s", "req/s", facts.RATE,
             "the largest rate vLLM's default sustains under the stall-bound SLO (bl.max_rate)",
             lambda: float(_rates(CONV, SLOS[1])["default_max_rate_req_s"]))


@facts.fact("tuning_usual_gain_max", scene="conv", fmt=".2f", chapter="tuning",
            text="on the conversation scene under the usual SLO (TTFT and TPOT), the largest goodput of the tuner's "
                 "pick over vLLM's default's, at either load (50% and 95% of capacity)")
def _usual_gain():
    picks = chapter_grid()[1]
    return float(picks.loc[(picks["workload"] == CONV) & (picks["slo"] == SLOS[0]), "gain"].max())


def _code_fact(who: str):
    words = {"best": "the tuner's most-goodput pair", "default": "vLLM's default"}[who]

    @facts.fact(f"tuning_code_{who}_max_rate_req_s", scene="code", unit="req/s", fmt=facts.RATE, chapter="tuning",
                text=f"the largest rate at which {words} holds the usual SLO's p99s on the code scene (tuned at 95% "
                     f"of its capacity; 0: no rate)")
    def _code():
        return float(_rates(CODE, SLOS[0])[f"{who}_max_rate_req_s"])


for _who in ("best", "default"):
    _code_fact(_who)
