"""Chapter 08, the two knobs: ``max_num_seqs`` and ``max_num_batched_tokens`` swept together.

:func:`two_knob_sweep` runs every pair under ``chunked`` at several request rates, expressed against the
server's capacity (:func:`saturation_rate`), except the pairs vLLM refuses to start with, which it keeps as
rows without numbers; the frontier and the readings of the sweep live in :mod:`batchlab.sweep`
(:func:`~batchlab.sweep.with_frontier`, :func:`~batchlab.sweep.seqs_plateau`,
:func:`~batchlab.sweep.default_vs_best`). :func:`two_knobs_chart` draws every operating point with buttons
over both knobs, and the grid of pairs with the refused ones crossed out.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..hardware import get_hardware
from ..sim import simulate, vllm_defaults
from ..sweep import sweep
from ..workload import preset

TWO_KNOB_KINDS = ("accepted", "refused by vLLM", "vLLM serve default", "vLLM offline default")
TWO_KNOB_SHAPES = ("circle", "cross", "diamond", "square")
HIGHLIGHT = viz.PALETTE[2]  # green: the point the buttons pick
RATE_COLORS = [viz.PALETTE[i] for i in (5, 0, 1, 3, 4, 7)]  # loads, low to high; no green, that is the highlight
TWO_KNOB_WIDTH = 470  # px: with the axis labels the chart fits the book's text column


def saturation_rate(cost, workload: str, n_requests: int, *, seed=0, **knobs) -> float:
    """Requests/s the server completes when every request of a real-trace preset is queued at time 0.

    The capacity that request rates are expressed against: ``request_throughput`` of one ``chunked`` run of
    ``preset(workload, n_requests, rate_req_s=inf, seed=seed)`` with ``knobs`` (vLLM's defaults for the GPU if
    none). The drain at the end of the run, when fewer requests are left than the batch holds, is included,
    so this is slightly below the steady-state capacity. Used in chapters 08 and 09.

    Parameters
    ----------
    cost : CostModel
    workload : str
        A real-trace preset (:func:`batchlab.preset_names`).
    n_requests : int
    seed : int
    **knobs
        Knobs of :func:`batchlab.simulate`.

    Returns
    -------
    float
        Requests per second.
    """
    stream = preset(workload, n_requests, rate_req_s=np.inf, seed=seed)
    return float(simulate(stream, "chunked", cost, **knobs).summary()["request_throughput"])


def two_knob_sweep(cost, workload: str, rates_req_s, max_num_seqs, max_num_batched_tokens, *,
                   n_requests: int = 3000, seed=0, executor=None) -> pd.DataFrame:
    """Every (``max_num_seqs``, ``max_num_batched_tokens``) pair under ``chunked`` at every request rate.

    Each rate replays ``preset(workload, n_requests, rate_req_s, seed)``; with one seed the prompt and output
    lengths are the same at every rate and the arrival gaps only scale (common random numbers). A pair with
    ``max_num_batched_tokens < max_num_seqs`` is not simulated: vLLM's ``SchedulerConfig`` refuses to start with
    it (and :func:`batchlab.simulate` raises), so its row has no numbers. Used in chapters 08 and 09.

    Parameters
    ----------
    cost : CostModel
    workload : str
        A real-trace preset (:func:`batchlab.preset_names`).
    rates_req_s : sequence of float
        Mean arrival rates (requests/s).
    max_num_seqs, max_num_batched_tokens : sequence of int
        The grid (sequences, tokens per iteration).
    n_requests : int
    seed : int
    executor : concurrent.futures.Executor, optional
        Passed to :func:`batchlab.sweep`; the frame is the same with any executor.

    Returns
    -------
    DataFrame
        One row per rate and pair, rates outermost, pairs in grid order: ``policy``, the knobs, the
        ``summary()`` columns (NaN where vLLM refuses the pair), ``rate_req_s`` (req/s) and ``vllm_refuses``
        (True where ``max_num_batched_tokens < max_num_seqs``).
    """
    pairs = pd.DataFrame([{"max_num_seqs": int(s), "max_num_batched_tokens": int(t)}
                          for s in max_num_seqs for t in max_num_batched_tokens])
    refused = pairs["max_num_batched_tokens"] < pairs["max_num_seqs"]
    if refused.all():
        raise ValueError("vLLM refuses every pair of the grid (max_num_batched_tokens < max_num_seqs)")
    accepted = pairs[~refused].to_dict("records")
    knobs = list(pairs.columns)
    parts = []
    for rate in rates_req_s:
        runs = sweep(preset(workload, n_requests, rate_req_s=float(rate), seed=seed), accepted, cost,
                     policy="chunked", executor=executor, progress=False)
        parts.append(pairs.merge(runs, on=knobs, how="left")[runs.columns].assign(
            policy="chunked", rate_req_s=float(rate), vllm_refuses=refused.to_numpy()))
    return pd.concat(parts, ignore_index=True)


def vllm_defaults_table(gpus=("h100-sxm", "h200", "a100-80gb")) -> pd.DataFrame:
    """vLLM's default knobs per GPU (:func:`batchlab.vllm_defaults`): they depend on the GPU, not on the model.

    Used in chapters 08 and 09.

    Parameters
    ----------
    gpus : sequence of str
        Hardware presets.

    Returns
    -------
    DataFrame
        One row per GPU: ``gpu``, ``hbm_gib`` (GiB), ``max_num_seqs``, ``max_num_batched_tokens_serve``
        (``vllm serve``) and ``max_num_batched_tokens_offline`` (the ``LLM`` class).
    """
    rows = []
    for name in gpus:
        hw = get_hardware(name)
        serve, offline = vllm_defaults(hw, "serve"), vllm_defaults(hw, "offline")
        rows.append({"gpu": name, "hbm_gib": hw.hbm_bytes / 2**30, "max_num_seqs": serve["max_num_seqs"],
                     "max_num_batched_tokens_serve": serve["max_num_batched_tokens"],
                     "max_num_batched_tokens_offline": offline["max_num_batched_tokens"]})
    return pd.DataFrame(rows)


def _knob_points(df, defaults, offline_tokens, x, y, y2):
    """The chart's data: every run with its log2 knobs and kind, and the default configurations' runs."""
    cols = ["rate_req_s", "max_num_seqs", "max_num_batched_tokens", "vllm_refuses", "frontier", x, y, y2]
    data = df[cols].copy()
    data["log2_seqs"] = np.log2(data["max_num_seqs"]).round().astype(int)
    data["log2_tokens"] = np.log2(data["max_num_batched_tokens"]).round().astype(int)
    data["kind"] = np.where(data["vllm_refuses"], TWO_KNOB_KINDS[1], TWO_KNOB_KINDS[0])
    at_seqs = data["max_num_seqs"] == defaults["max_num_seqs"]
    marks = [data[at_seqs & (data["max_num_batched_tokens"] == defaults["max_num_batched_tokens"])].assign(
        kind=TWO_KNOB_KINDS[2])]
    if offline_tokens is not None:
        marks.append(data[at_seqs & (data["max_num_batched_tokens"] == offline_tokens)].assign(kind=TWO_KNOB_KINDS[3]))
    return data, pd.concat(marks, ignore_index=True)


def two_knobs_chart(df: pd.DataFrame, defaults: dict, offline_tokens: int | None = None, rate_req_s=None,
                    x: str = "output_throughput", y: str = "p99_ttft_ms", y2: str = "p99_itl_ms"):
    """Every operating point of a two-knob sweep, its frontier, vLLM's defaults and the chosen point.

    Used in chapter 08.

    Parameters
    ----------
    df : DataFrame
        :func:`two_knob_sweep` with a boolean ``frontier`` column (:func:`batchlab.sweep.with_frontier`):
        ``rate_req_s`` (req/s), ``max_num_seqs``, ``max_num_batched_tokens`` (powers of two), ``vllm_refuses``,
        ``x``, ``y``, ``y2``.
    defaults : dict
        vLLM's ``vllm serve`` defaults (:func:`batchlab.vllm_defaults`): the knobs selected at first and a
        marked point.
    offline_tokens : int, optional
        ``max_num_batched_tokens`` of the offline default (same ``max_num_seqs``), marked too.
    rate_req_s : float, optional
        The rate selected at first (req/s; default: the second highest).
    x, y, y2 : str
        Throughput (tok/s) and the two latencies (ms): ``y`` in the top panel with the frontier, ``y2`` below.

    Returns
    -------
    altair chart: a row of radio buttons per knob, labelled in sequences and tokens (a select box for a grid of
    more than eight values; the parameters hold each knob's log2), and one for the rate pick the green point;
    the points of the selected rate are drawn stronger than the rest, and the text above reads the chosen
    configuration. Pairs vLLM refuses have no operating point: the grid at the bottom draws them as crosses
    beside the accepted pairs (black on the frontier at the selected rate), and the text says so when the
    buttons pick one.
    """
    data, marks = _knob_points(df, defaults, offline_tokens, x, y, y2)
    rates = np.sort(data["rate_req_s"].unique())
    seqs_p, at_seqs = viz.grid_param("log2_seqs", data["log2_seqs"], "max_num_seqs (sequences)",
                                     value=int(np.log2(defaults["max_num_seqs"])),
                                     labels=viz.grid_labels(data, "log2_seqs", "max_num_seqs"))
    tok_p, at_tok = viz.grid_param("log2_tokens", data["log2_tokens"], "max_num_batched_tokens (tokens)",
                                   value=int(np.log2(defaults["max_num_batched_tokens"])),
                                   labels=viz.grid_labels(data, "log2_tokens", "max_num_batched_tokens"))
    rate_value = rates[max(rates.size - 2, 0)] if rate_req_s is None else rate_req_s
    # Radio buttons, not grid_param: a handful of loads reads better as named choices than as a slider.
    rate_p = alt.param(name="rate_req_s", value=float(rate_value),
                       bind=alt.binding_radio(options=rates.tolist(), name="request rate (req/s) "))
    tol = float(np.diff(rates).min() / 2) if rates.size > 1 else 0.5
    at_rate = f"abs(datum['rate_req_s'] - rate_req_s) < {tol!r}"
    chosen = f"{at_seqs} && {at_tok} && {at_rate}"
    tooltip = [alt.Tooltip("rate_req_s:Q", title="rate (req/s)"), "max_num_seqs:Q", "max_num_batched_tokens:Q",
               alt.Tooltip(f"{x}:Q", format=",.0f", title=viz.title(x)),
               alt.Tooltip(f"{y}:Q", format=",.0f", title=viz.title(y)),
               alt.Tooltip(f"{y2}:Q", format=",.0f", title=viz.title(y2))]
    shape = alt.Shape("kind:N", title=None, scale=alt.Scale(domain=list(TWO_KNOB_KINDS), range=list(TWO_KNOB_SHAPES)),
                      legend=alt.Legend(orient="bottom", columns=2))
    xenc = alt.X(f"{x}:Q", title=viz.title(x), scale=alt.Scale(zero=False))

    def panel(col, height, frontier):
        yenc = alt.Y(f"{col}:Q", title=viz.title(col), scale=alt.Scale(type="log"))
        base = alt.Chart(data).transform_filter("!datum.vllm_refuses").encode(x=xenc, y=yenc)  # refused: no run
        layers = [base.mark_point(filled=True, size=40).encode(
            color=alt.Color("rate_req_s:N", title="request rate (req/s)", scale=alt.Scale(range=RATE_COLORS),
                            legend=alt.Legend(orient="bottom")), shape=shape,
            opacity=alt.when(at_rate).then(alt.value(0.6)).otherwise(alt.value(0.12)), tooltip=tooltip)]
        if frontier:
            layers.append(base.transform_filter("datum.frontier").mark_line(color="black", point=True, strokeWidth=1.5))
        layers.append(alt.Chart(marks).mark_point(size=170, filled=False, color="black", strokeWidth=1.5).encode(
            x=xenc, y=yenc, shape=shape, opacity=alt.when(at_rate).then(alt.value(1.0)).otherwise(alt.value(0.25)),
            tooltip=tooltip))
        layers.append(base.transform_filter(chosen).mark_point(
            filled=True, size=260, color=HIGHLIGHT, stroke="black", strokeWidth=1.5, opacity=1).encode(tooltip=tooltip))
        return alt.layer(*layers).properties(width=TWO_KNOB_WIDTH, height=height)

    readout = alt.Chart(data).transform_filter(chosen).transform_calculate(label=(  # two lines: knobs, results
        "'max_num_seqs ' + datum.max_num_seqs + ', max_num_batched_tokens ' + datum.max_num_batched_tokens"
        " + ' at ' + datum.rate_req_s + ' req/s\\n' + (datum.vllm_refuses"
        " ? 'vLLM refuses to start with it: fewer tokens per iteration than sequences' : ("
        f"format(datum['{x}'], ',.0f') + ' tok/s, {viz.title(y).split(' (')[0]} ' + format(datum['{y}'], ',.0f')"
        f" + ' ms, {viz.title(y2).split(' (')[0]} ' + format(datum['{y2}'], ',.0f') + ' ms'))")
    ).mark_text(align="left", baseline="top", fontSize=12, fontWeight="bold", color="#333333", lineBreak="\n",
                lineHeight=16).encode(x=alt.value(0), y=alt.value(0), text="label:N").properties(
        width=TWO_KNOB_WIDTH, height=30)
    grid = _grid_panel(data, marks, shape, at_rate, f"{at_seqs} && {at_tok}")
    return alt.vconcat(readout, panel(y, 300, True), panel(y2, 170, False), grid, spacing=6).add_params(
        seqs_p, tok_p, rate_p)


def _grid_panel(data, marks, shape, at_rate: str, at_pair: str):
    """The knob grid itself: one mark per pair at the selected rate, refused pairs crossed, the frontier black."""
    xenc = alt.X("max_num_batched_tokens:O", title="max_num_batched_tokens (tokens)", axis=alt.Axis(labelAngle=0))
    yenc = alt.Y("max_num_seqs:O", title="max_num_seqs (sequences)", sort="descending")
    tooltip = ["max_num_seqs:Q", "max_num_batched_tokens:Q", "kind:N", alt.Tooltip("frontier:N", title="frontier")]
    base = alt.Chart(data).transform_filter(at_rate).encode(x=xenc, y=yenc)
    dots = base.mark_point(filled=True, size=60).encode(
        shape=shape, tooltip=tooltip,
        color=alt.when("datum.frontier").then(alt.value("black")).when("datum.vllm_refuses").then(
            alt.value("#555555")).otherwise(alt.value("#bbbbbb")))
    defaults = alt.Chart(marks).transform_filter(at_rate).mark_point(
        size=170, filled=False, color="black", strokeWidth=1.5).encode(x=xenc, y=yenc, shape=shape)
    chosen = base.transform_filter(at_pair).mark_point(filled=True, size=200, color=HIGHLIGHT, stroke="black",
                                                       strokeWidth=1.5, opacity=1).encode(shape=shape)
    return alt.layer(dots, defaults, chosen).properties(width=TWO_KNOB_WIDTH, height=150)
