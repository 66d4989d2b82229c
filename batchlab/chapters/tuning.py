"""Chapter 09, tuning for your traffic: the knobs with the largest goodput under an SLO, beside vLLM's defaults.

:func:`tuning_grid` runs :func:`batchlab.tune` for every workload, SLO and load of the chapter and keeps, per
combination, the whole knob grid (:data:`GRID_COLUMNS`) and one line for the tuner's pick and vLLM's default
(:data:`PICK_COLUMNS`); the pick is :func:`batchlab.tune`'s: of the goodputs within 1 % of the largest (and at
least the default's), those with the most SLO headroom, the smallest ``slo_load`` (largest p99 / bound; loads
within 1 % of the smallest tie too), and of those the one nearest vLLM's default, the smallest sum of
``|log2(knob / default)|``, so a knob the traffic never presses stays where vLLM puts it.
:func:`headroom` adds the largest rate each of the two sustains under the SLO (:func:`batchlab.max_rate`).
:func:`goodput_map_chart` draws the goodput map over the knob grid, the pick and the default marked, behind
buttons for the workload, the SLO and the load; :func:`picks_table` and :func:`headroom_table` format the
readings.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..tune import SLO, max_rate, parse_goodput, tune
from ..workload import preset, trace_stats

GRID_COLUMNS = ["workload", "slo", "load", "rate_req_s", "max_num_seqs", "max_num_batched_tokens", "vllm_refuses",
                "vllm_default", "best", "request_goodput", "share_of_top", "slo_met", "p99_ttft_ms", "p99_tpot_ms",
                "slo_load"]
PICK_COLUMNS = ["workload", "slo", "load", "rate_req_s", "best_max_num_seqs", "best_max_num_batched_tokens",
                "best_goodput", "best_slo_met", "best_p99_ttft_ms", "best_p99_tpot_ms", "best_slo_load",
                "default_max_num_seqs", "default_max_num_batched_tokens", "default_goodput", "default_slo_met",
                "default_p99_ttft_ms", "default_p99_tpot_ms", "default_slo_load", "gain", "top_goodput",
                "offered_req_s"]
MAP_KINDS = ("tuner's pick", "vLLM default", "refused by vLLM")
MAP_SHAPES = ("square", "diamond", "cross")
MAP_WIDTH = 470  # px: fits the book's text column with the axis labels
MAP_SCHEME = "blues"
TIE_TOL = 1e-4  # a gain within this of 1: the pick ties the default to rounding (a few parts per million)


def slo_label(slo: SLO) -> str:
    """``"TTFT 500 ms, TPOT 50 ms"``: an SLO's bounds as a reader reads them (ms)."""
    return ", ".join(f"{key.upper()} {value:,g} ms" for key, value in slo.bounds_ms.items())


def slo_readings(res, specs) -> pd.DataFrame:
    """One run read under several SLOs: throughput, goodput, requests that missed a bound, p99s, SLO held.

    Used in chapter 09, to show that goodput (each request against every bound) and a p99 SLO (the tail of each
    latency against its bound) are different tests.

    Parameters
    ----------
    res : SimResult
    specs : sequence of str
        SLOs in vLLM's ``--goodput`` syntax (ms).

    Returns
    -------
    DataFrame
        One row per SLO: ``slo``, ``request_throughput`` and ``request_goodput`` (req/s), ``missed`` (completed
        requests that missed at least one bound), ``p99_ttft_ms``, ``p99_tpot_ms`` and ``slo_met``.
    """
    rows = []
    for spec in specs:
        s = res.summary(slo=parse_goodput(spec))
        missed = round((s["request_throughput"] - s["request_goodput"]) * s["duration"])
        rows.append({"slo": spec, "request_throughput": s["request_throughput"],
                     "request_goodput": s["request_goodput"], "missed": int(missed),
                     "p99_ttft_ms": s["p99_ttft_ms"], "p99_tpot_ms": s["p99_tpot_ms"], "slo_met": s["slo_met"]})
    return pd.DataFrame(rows)


def slo_readings_table(readings: pd.DataFrame, slo_names: dict):
    """:func:`slo_readings` formatted, the SLO by its bounds in ms. Used in chapter 09."""
    shown = readings.assign(slo=readings["slo"].map(slo_names),
                            slo_met=readings["slo_met"].map({True: "yes", False: "no"}))
    rate, ms = "{:.2f}".format, "{:,.0f}".format
    return viz.display_table(shown, {
        "slo": ("SLO", str), "request_throughput": ("throughput (req/s)", rate),
        "request_goodput": ("goodput (req/s)", rate), "missed": ("requests missing a bound", "{:,}".format),
        "p99_ttft_ms": ("p99 TTFT (ms)", ms), "p99_tpot_ms": ("p99 TPOT (ms)", "{:,.1f}".format),
        "slo_met": ("p99s within the SLO", str)})


def tuning_grid(cost, workloads, slos, loads, n_requests: int, *, seed=0, executor=None,
                goodput_rel_tol: float = 0.01):
    """:func:`batchlab.tune` at every workload, SLO and load: the knob grid and the best against the default.

    Each workload is ``preset(workload, n_requests, rate_req_s=load * trace rate, seed=seed)``: with one seed the
    lengths and the shape of the arrivals are the same at every load. Used in chapter 09.

    Parameters
    ----------
    cost : CostModel
    workloads : sequence of str
        Real-trace presets with arrival times (:func:`batchlab.preset_names`).
    slos : sequence of str
        SLOs in vLLM's ``--goodput`` syntax, ``"ttft:500 tpot:50"`` (ms).
    loads : sequence of float
        Request rates as multiples of each trace's own rate.
    n_requests : int
    seed : int
    executor : concurrent.futures.Executor, optional
        Passed to :func:`batchlab.tune`.
    goodput_rel_tol : float, default 0.01
        Passed to :func:`batchlab.tune`: goodputs this close to the largest tie.

    Returns
    -------
    grid : DataFrame
        One row per combination and knob pair (:data:`GRID_COLUMNS`): ``workload``, ``slo`` (the spec string),
        ``load``, ``rate_req_s`` (req/s), the knobs, ``vllm_refuses``, ``vllm_default``, ``best`` (the tuner's
        pick), ``request_goodput`` (req/s), ``share_of_top`` (goodput over the largest goodput of the grid, 0 to
        1; NaN where vLLM refuses the pair, 0 where no pair has goodput), ``slo_met``, the p99 TTFT and TPOT (ms)
        and ``slo_load`` (the largest p99 / bound; these three NaN where vLLM refuses the pair). vLLM's default is
        in the grid.
    picks : DataFrame
        One row per combination (:data:`PICK_COLUMNS`): the pick's ("best") and the default's knobs, goodput
        (req/s), ``slo_met``, p99s (ms) and ``slo_load``, ``gain`` (best / default goodput), ``top_goodput`` (the
        largest goodput of the grid, req/s; the pick's is within ``goodput_rel_tol`` of it) and
        ``offered_req_s`` (requests served over the run's duration with any SLO: the goodput ceiling).
    """
    grids, picks = [], []
    for workload in workloads:
        for load in loads:
            rate = float(load) * trace_stats(workload)["rate_req_per_s"]
            stream = preset(workload, n_requests, rate_req_s=rate, seed=seed)
            for spec in slos:
                result = tune(stream, cost, parse_goodput(spec), executor=executor, progress=False,
                              goodput_rel_tol=goodput_rel_tol)
                grids.append(_grid_rows(result, workload, spec, float(load), rate))
                picks.append(_pick_row(result, workload, spec, float(load), rate))
    return pd.concat(grids, ignore_index=True)[GRID_COLUMNS], pd.DataFrame(picks)[PICK_COLUMNS]


def _grid_rows(result, workload, spec, load, rate) -> pd.DataFrame:
    table = result.table
    best = result.best
    is_best = (table["max_num_seqs"] == best["max_num_seqs"]) & (
        table["max_num_batched_tokens"] == best["max_num_batched_tokens"])
    top = table["request_goodput"].max()
    share = table["request_goodput"] / top if top > 0 else table["request_goodput"] * 0.0
    share = share.where(~table["vllm_refuses"])  # never run: no goodput to compare
    return table.assign(workload=workload, slo=spec, load=load, rate_req_s=rate, best=is_best.to_numpy(),
                        share_of_top=share)


def _pick_row(result, workload, spec, load, rate) -> dict:
    row = {"workload": workload, "slo": spec, "load": load, "rate_req_s": rate, "gain": result.gain}
    for who, point in (("best", result.best), ("default", result.defaults)):
        row[f"{who}_max_num_seqs"] = point["max_num_seqs"]
        row[f"{who}_max_num_batched_tokens"] = point["max_num_batched_tokens"]
        row[f"{who}_goodput"] = point["request_goodput"]
        for key in ("slo_met", "p99_ttft_ms", "p99_tpot_ms", "slo_load"):
            row[f"{who}_{key}"] = point[key]
    accepted = result.table[~result.table["vllm_refuses"]]
    row["top_goodput"] = float(accepted["request_goodput"].max())
    row["offered_req_s"] = float(accepted["request_throughput"].max())
    return row


def headroom(cost, picks: pd.DataFrame, n_requests: int, *, seed=0, rel_tol: float = 0.02) -> pd.DataFrame:
    """The largest request rate the best setting and vLLM's default sustain under each SLO (:func:`max_rate`).

    The stream of each row of ``picks`` (same preset, count and seed as :func:`tuning_grid`) is scaled in time
    until the SLO's p99 bounds just hold. Used in chapter 09.

    Returns
    -------
    DataFrame
        ``picks`` with ``best_max_rate_req_s`` and ``default_max_rate_req_s`` (req/s; 0 where no rate holds the
        SLO) and ``rate_ratio`` (best over default, NaN where the default's is 0).
    """
    out = picks.copy()
    for who in ("best", "default"):
        rates = []
        for row in picks.itertuples(index=False):
            stream = preset(row.workload, n_requests, rate_req_s=row.rate_req_s, seed=seed)
            knobs = {k: int(getattr(row, f"{who}_{k}")) for k in ("max_num_seqs", "max_num_batched_tokens")}
            rates.append(max_rate(stream, cost, parse_goodput(row.slo), rel_tol=rel_tol, **knobs).rate_req_s)
        out[f"{who}_max_rate_req_s"] = rates
    default = out["default_max_rate_req_s"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        out["rate_ratio"] = np.where(default > 0, out["best_max_rate_req_s"].to_numpy() / default, np.nan)
    return out


def write_example_trace(path, requests) -> None:
    """Write ``requests`` as a CSV trace the way users keep theirs: ``timestamp`` (s), ``input_tokens``,
    ``output_tokens``, one row per request. Chapter 09 reads it back with :func:`batchlab.loaders.load_workload`."""
    pd.DataFrame({"timestamp": requests.arrival_s, "input_tokens": requests.prompt_tokens,
                  "output_tokens": requests.output_tokens}).to_csv(path, index=False)


def _knob(frame: pd.DataFrame, who: str) -> pd.Series:
    seqs, tokens = frame[f"{who}_max_num_seqs"], frame[f"{who}_max_num_batched_tokens"]
    return seqs.map("{:,}".format) + " / " + tokens.map("{:,}".format)


def is_default_pick(frame: pd.DataFrame) -> pd.Series:
    """Whether each row's pick is vLLM's default pair itself (the tuner confirms the default). Used in chapter 09."""
    return ((frame["best_max_num_seqs"] == frame["default_max_num_seqs"])
            & (frame["best_max_num_batched_tokens"] == frame["default_max_num_batched_tokens"]))


def is_tie(frame: pd.DataFrame) -> pd.Series:
    """Whether each row's pick is another pair whose goodput ties the default's to rounding: ``gain`` within
    :data:`TIE_TOL` of 1 (the two runs all but the same). Used in chapter 09."""
    return ~is_default_pick(frame) & ((frame["gain"] - 1).abs() < TIE_TOL)


def _pick_knob(frame: pd.DataFrame) -> pd.Series:
    """The pick's knobs, ``"1,024 / 8,192 (vLLM default)"`` where the pick is the default."""
    return _knob(frame, "best") + np.where(is_default_pick(frame), " (vLLM default)", "")


def picks_table(picks: pd.DataFrame, slo_names: dict, workload_names: dict):
    """The tuner's pick against vLLM's default per workload, SLO and load, formatted: knobs (marked where the pick
    is the default), goodput, the gain and the SLO load (largest p99 / bound) the pick was chosen by. Used in
    chapter 09."""
    shown = picks.assign(workload=picks["workload"].map(workload_names), slo=picks["slo"].map(slo_names),
                         best=_pick_knob(picks))
    rate, share = "{:.1f}".format, "{:.2f}".format
    return viz.display_table(shown, {
        "workload": ("workload", str), "slo": ("SLO", str), "rate_req_s": ("rate (req/s)", rate),
        "best": ("best: max_num_seqs / max_num_batched_tokens", str), "best_goodput": ("best: goodput (req/s)", rate),
        "default_goodput": ("vLLM default: goodput (req/s)", rate), "gain": ("gain", "×{:.2f}".format),
        "best_slo_load": ("best: p99 / bound", share), "default_slo_load": ("vLLM default: p99 / bound", share)})


def headroom_table(rates: pd.DataFrame, slo_names: dict, workload_names: dict):
    """:func:`headroom` formatted: the largest rate under each SLO, best against default, and best as a share of
    the default's (100 % or more where the pick sustains at least the default's rate; a dash where no rate holds
    for the default). Used in chapter 09."""
    shown = rates.assign(workload=rates["workload"].map(workload_names), slo=rates["slo"].map(slo_names),
                         best=_pick_knob(rates))
    rate = "{:.1f}".format

    def largest(v):
        return "none holds" if v == 0 else f"{v:.1f}"

    def share(v):
        return "–" if not np.isfinite(v) else f"{v:.0%}"

    return viz.display_table(shown, {
        "workload": ("workload", str), "slo": ("SLO", str), "rate_req_s": ("tuned at (req/s)", rate),
        "best": ("best: max_num_seqs / max_num_batched_tokens", str),
        "best_max_rate_req_s": ("best: largest rate (req/s)", largest),
        "default_max_rate_req_s": ("vLLM default: largest rate (req/s)", largest),
        "rate_ratio": ("best / default (largest rate)", share)})


def _map_data(grid: pd.DataFrame, workloads, slos, loads) -> pd.DataFrame:
    """The chart's rows: each grid point with the indices the buttons select on, log2 knobs and a kind."""
    data = grid.copy()
    data["workload_i"] = data["workload"].map({w: i for i, w in enumerate(workloads)})
    data["slo_i"] = data["slo"].map({s: i for i, s in enumerate(slos)})
    data["load_i"] = data["load"].map({float(v): i for i, v in enumerate(loads)})
    data["kind"] = np.select([data["best"], data["vllm_default"], data["vllm_refuses"]], MAP_KINDS, "")
    data["goodput_text"] = np.where(data["vllm_refuses"], "", data["request_goodput"].map("{:.2g}".format))
    for col in ("p99_ttft_ms", "p99_tpot_ms"):
        data[col] = data[col].astype(float).round(1)
    data["slo_load"] = data["slo_load"].astype(float).round(3)
    keep = ["workload_i", "slo_i", "load_i", "max_num_seqs", "max_num_batched_tokens", "request_goodput",
            "share_of_top", "slo_met", "p99_ttft_ms", "p99_tpot_ms", "slo_load", "kind", "goodput_text"]
    return data[keep]


def _map_readout(picks: pd.DataFrame, workloads, slos, loads) -> pd.DataFrame:
    """Two lines per combination, read above the map: the pick, then the default and the gain (to six decimals
    where the two tie to rounding, :func:`is_tie`; where the pick is the default, that it is)."""
    rows = picks.assign(workload_i=picks["workload"].map({w: i for i, w in enumerate(workloads)}),
                        slo_i=picks["slo"].map({s: i for i, s in enumerate(slos)}),
                        load_i=picks["load"].map({float(v): i for i, v in enumerate(loads)}))

    def label(r, same, tie):
        pick = (f"pick: {r.best_max_num_seqs:,} sequences, {r.best_max_num_batched_tokens:,} tokens, goodput "
                f"{r.best_goodput:.2f} req/s, p99/bound {r.best_slo_load:.2f}")
        if same:
            return f"{pick}\nthe pick is the vLLM default itself (×{r.gain:.2f}); offered {r.rate_req_s:.1f} req/s"
        gain = f"a tie, pick ×{r.gain:.6f}" if tie else f"pick ×{r.gain:.2f}"
        return (f"{pick}\nvLLM default: {r.default_goodput:.2f} req/s, p99/bound {r.default_slo_load:.2f}; "
                f"{gain}; offered {r.rate_req_s:.1f} req/s")

    rows["label"] = [label(r, same, tie) for r, same, tie in
                     zip(rows.itertuples(index=False), is_default_pick(rows), is_tie(rows))]
    return rows[["workload_i", "slo_i", "load_i", "label"]]


def goodput_map_chart(grid: pd.DataFrame, picks: pd.DataFrame, workload_names: dict, slo_names: dict,
                      load_names: dict):
    """The goodput map over ``max_num_seqs`` x ``max_num_batched_tokens``, the best and vLLM's default marked.

    Used in chapter 09.

    Parameters
    ----------
    grid, picks : DataFrame
        :func:`tuning_grid`'s two frames.
    workload_names, slo_names, load_names : dict
        The workloads, SLO specs and loads of the grid, in the order of their buttons, each mapped to the label
        a reader sees (``{"ttft:500 tpot:50": "TTFT 500 ms, TPOT 50 ms"}``, ``{1.0: "trace's rate"}``).

    Returns
    -------
    altair chart: two lines reading the selection (the tuner's pick, its goodput and p99 / bound, the
    default's, the gain, to six decimals and called a tie where it is within :data:`TIE_TOL` of 1, the offered
    rate; where the pick is the default, that it is), over a heatmap with the
    token budget across (tokens, powers of two: a log-2 axis) and the sequence cap down (sequences), each cell
    coloured by its goodput as a share of the largest at that selection and labelled with its goodput (req/s); the
    pick is a black square, vLLM's default a diamond, pairs vLLM refuses a cross, and cells whose p99 latencies
    hold the SLO are outlined. Three rows of radio buttons pick the workload, the SLO (labelled in ms) and the
    load.
    """
    workloads, slos, loads = list(workload_names), list(slo_names), list(load_names)
    data = _map_data(grid, workloads, slos, loads)
    params, preds = [], []
    for name, field, labels, label in (("workload_i", "workload_i", [workload_names[w] for w in workloads], "workload"),
                                       ("slo_i", "slo_i", [slo_names[s] for s in slos], "SLO"),
                                       ("load_i", "load_i", [load_names[v] for v in loads], "load")):
        param, pred = viz.grid_param(name, range(len(labels)), label, field=field, labels=labels)
        params.append(param)
        preds.append(pred)
    chosen = " && ".join(preds)
    thousands = "format(datum.value, ',')"
    xenc = alt.X("max_num_batched_tokens:O", title="max_num_batched_tokens (tokens)",
                 axis=alt.Axis(labelAngle=-45, labelExpr=thousands))
    yenc = alt.Y("max_num_seqs:O", title="max_num_seqs (sequences)", sort="descending",
                 axis=alt.Axis(labelExpr=thousands))
    tooltip = ["max_num_seqs:Q", "max_num_batched_tokens:Q",
               alt.Tooltip("request_goodput:Q", format=".3f", title="goodput (req/s)"),
               alt.Tooltip("p99_ttft_ms:Q", format=",.0f", title="p99 TTFT (ms)"),
               alt.Tooltip("p99_tpot_ms:Q", format=",.1f", title="p99 TPOT (ms)"),
               alt.Tooltip("slo_load:Q", format=".3f", title="SLO load (largest p99 / bound)"),
               alt.Tooltip("slo_met:N", title="p99 within the SLO")]
    base = alt.Chart(data).transform_filter(chosen).encode(x=xenc, y=yenc)
    cells = base.mark_rect(stroke="white", strokeWidth=1).encode(
        color=alt.Color("share_of_top:Q", title="goodput (share of the largest)",
                        scale=alt.Scale(scheme=MAP_SCHEME, domain=[0, 1]),
                        legend=alt.Legend(format=".0%", orient="bottom", gradientLength=200, values=[0, 0.5, 1])),
        tooltip=tooltip)
    held = base.transform_filter("datum.slo_met").mark_rect(filled=False, stroke="#e69f00", strokeWidth=2.5)
    text = base.mark_text(fontSize=9, dy=8).encode(
        text="goodput_text:N",
        color=alt.when("datum.share_of_top > 0.6").then(alt.value("white")).otherwise(alt.value("black")))
    shape = alt.Shape("kind:N", title=None, scale=alt.Scale(domain=list(MAP_KINDS), range=list(MAP_SHAPES)),
                      legend=alt.Legend(orient="bottom"))
    marks = base.transform_filter("datum.kind != ''").mark_point(
        filled=True, size=70, color="black", stroke="white", strokeWidth=1, yOffset=-7).encode(
        shape=shape, tooltip=tooltip)
    readout = alt.Chart(_map_readout(picks, workloads, slos, loads)).transform_filter(chosen).mark_text(
        align="left", baseline="top", fontSize=12, fontWeight="bold", color="#333333", lineBreak="\n",
        lineHeight=16).encode(x=alt.value(0), y=alt.value(0), text="label:N").properties(width=MAP_WIDTH, height=30)
    heat = alt.layer(cells, held, text, marks).properties(width=MAP_WIDTH, height=300)
    return alt.vconcat(readout, heat, spacing=4).add_params(*params)
