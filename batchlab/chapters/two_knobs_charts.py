"""Chapter 8's chart: every operating point of the two-knob sweep behind a slider per knob and a rate selector.

:func:`knobs_chart` draws what :func:`batchlab.chapters.two_knobs.two_knobs_chart` returns (that function, which
reads the picks off the sweep, is the one the notebook calls): a readout of the chosen pair at each rate, two
latency panels against throughput (log axes fitted to the runs shown, :func:`_log_domain`), the trail of pairs
the sliders have visited (:func:`_trail_push`) and the knob grid with the pairs vLLM refuses crossed out
(:func:`_grid_panel`). The constants are the chart's marks, colours and sizes, which chapter 8's and 9's tests
and chapter 9's tooltips (:data:`REFUSED_TEXT`) read; :mod:`batchlab.chapters.two_knobs` re-exports them.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz

TWO_KNOB_KINDS = ("accepted", "refused by vLLM", "vLLM serve default", "vLLM offline default",
                  "pick (the table below)")  # lowest p99 ITL at the default's throughput and TTFT
TWO_KNOB_SHAPES = ("circle", "cross", "diamond", "square", "triangle-up")
HIGHLIGHT = viz.PALETTE[2]  # green: the point the sliders pick, and the trail of the pairs picked before
# Loads, low to high: blue, orange, reddish purple, black; no two of one hue (sky blue beside blue, vermillion
# beside orange read as pairs) and no green, that is the highlight.
RATE_COLORS = [viz.PALETTE[i] for i in (0, 1, 4, 7, 5, 3)]
FRONTIER_COLOR = "#777777"  # grey: black is a rate
TWO_KNOB_WIDTH = 470  # px: with the axis labels the chart fits the book's text column
TRAIL = "visited"  # the selection holding every pair the sliders have picked
EVERY_LOAD = "every load"  # the rate selector's last choice: all rates together
# Log-axis labels of a latency in ms, in the reader's unit: 1, 2 and 5 times a power of ten, "200 ms", "5 s".
_MANTISSA = "datum.value / pow(10, floor(log(datum.value) / LN10 + 1e-9))"
DURATION_LABEL = (f"(abs({_MANTISSA} - 1) < 1e-6 || abs({_MANTISSA} - 2) < 1e-6 || abs({_MANTISSA} - 5) < 1e-6)"
                  " ? (datum.value < 1000 ? format(datum.value, ',~g') + ' ms' : format(datum.value / 1000, ',~g')"
                  " + ' s') : ''")


def _knob_points(df, defaults, picks, offline_tokens, x, y, y2):
    """The chart's data: every run with the index of each knob and of its rate, and its kind; and the runs of
    the default configurations and of ``picks`` (one pair per rate, or None)."""
    cols = ["rate_req_s", "max_num_seqs", "max_num_batched_tokens", "vllm_refuses", "frontier", x, y, y2]
    cols += [c for c in ("p99_tpot_ms",) if c in df.columns and c not in cols]
    data = df[cols].copy()
    for col, name in (("max_num_seqs", "seqs_i"), ("max_num_batched_tokens", "tokens_i"), ("rate_req_s", "rate_i")):
        data[name] = data[col].map({v: i for i, v in enumerate(np.sort(data[col].unique()))}).astype(int)
    data["kind"] = np.where(data["vllm_refuses"], TWO_KNOB_KINDS[1], TWO_KNOB_KINDS[0])
    data["front"] = data["frontier"].astype(int)  # the grid draws frontier pairs last, on top
    # The page inlines the data with no more digits than a reader sees, rounded once to what the readout and the
    # tooltips print (:func:`batchlab.viz.round_duration`: 249.496 ms is 249, 8,987.2 ms is 8,990, "8.99 s").
    data[x] = data[x].round(0)
    for col in (y, y2):
        data[col] = viz.round_duration(data[col])
    at_seqs = data["max_num_seqs"] == defaults["max_num_seqs"]
    marks = [data[at_seqs & (data["max_num_batched_tokens"] == defaults["max_num_batched_tokens"])].assign(
        kind=TWO_KNOB_KINDS[2])]
    if offline_tokens is not None:
        marks.append(data[at_seqs & (data["max_num_batched_tokens"] == offline_tokens)].assign(kind=TWO_KNOB_KINDS[3]))
    if picks is not None:  # the pick of default_vs_pick at each rate (the page's table), marked at its rate only
        key = pd.MultiIndex.from_frame(picks[["rate_req_s", "pick_max_num_seqs", "pick_max_num_batched_tokens"]])
        at_pick = pd.MultiIndex.from_frame(data[["rate_req_s", "max_num_seqs", "max_num_batched_tokens"]]).isin(key)
        marks.append(data[at_pick].assign(kind=TWO_KNOB_KINDS[4]))
    return data, pd.concat(marks, ignore_index=True)


def _tick_below(v: float) -> float:
    """The largest 1, 2 or 5 times a power of ten at most ``v`` (> 0): where a log axis starts on a label."""
    k = np.floor(np.log10(v))
    return float(max(m * 10.0 ** k for m in (1, 2, 5) if m * 10.0 ** k <= v * (1 + 1e-9)))


def _tick_above(v: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at least ``v`` (> 0): where a log axis ends on a label."""
    k = np.floor(np.log10(v))
    return float(min(m * 10.0 ** k for m in (1, 2, 5, 10) if m * 10.0 ** k >= v * (1 - 1e-9)))


def _log_domain(data, marks, col: str, every: int) -> tuple[dict, dict]:
    """Per shown rate (its index, then every load), the latency axis' ends on labelled ticks around the runs
    shown, as Vega expressions on ``rate_i``: no run sits above the last label (a p99 ITL of 160 ms on an axis
    labelled to 100 ms). The scale's whole domain: one read off the data would make Vega warn of an "Infinite
    extent" for every layer a selection leaves empty (the frontier's line at one rate, the trail before a click)."""
    shown = pd.concat([data.loc[~data["vllm_refuses"], ["rate_i", col]], marks[["rate_i", col]]])
    shown = shown[shown[col] > 0]
    groups = [shown[shown["rate_i"] == i][col] for i in range(every)] + [shown[col]]
    lo = [_tick_below(float(g.min())) if len(g) else 1.0 for g in groups]
    hi = [_tick_above(float(g.max())) if len(g) else 10.0 for g in groups]
    return {"expr": f"{lo!r}[rate_i]"}, {"expr": f"{hi!r}[rate_i]"}


def _knob_param(data, name: str, column: str, label: str, default: int):
    """A slider over one knob's grid, encoded as the index of its value, labelled in the knob's unit."""
    values = np.sort(data[column].unique())
    start = int(np.abs(values - default).argmin())
    return viz.grid_param(name, range(values.size), label, value=start, labels=[f"{int(v):,}" for v in values])


def knobs_chart(df: pd.DataFrame, defaults: dict, picks: pd.DataFrame | None, offline_tokens: int | None = None,
                rate_req_s=None, x: str = "output_throughput", y: str = "p99_ttft_ms", y2: str = "p99_itl_ms"):
    """The chart :func:`batchlab.chapters.two_knobs.two_knobs_chart` returns (its docstring reads it), drawn from
    the sweep ``df`` and the pairs ``picks`` marks (:func:`batchlab.chapters.two_knobs.default_vs_pick` at each
    rate: ``rate_req_s``, ``pick_max_num_seqs``, ``pick_max_num_batched_tokens``; None marks none). Used in
    chapter 8.
    """
    data, marks = _knob_points(df, defaults, picks, offline_tokens, x, y, y2)
    rates = np.sort(data["rate_req_s"].unique())
    every = int(rates.size)  # the index of "every load"
    seqs_p, at_seqs = _knob_param(data, "seqs_i", "max_num_seqs", "max_num_seqs (sequences)",
                                  defaults["max_num_seqs"])
    tok_p, at_tok = _knob_param(data, "tokens_i", "max_num_batched_tokens", "max_num_batched_tokens (tokens)",
                                defaults["max_num_batched_tokens"])
    start = every if rate_req_s is None else int(np.abs(rates - rate_req_s).argmin())
    rate_p, one_rate = viz.grid_param("rate_i", range(every + 1), "request rate (req/s)", value=start,
                                      labels=[f"{r:.1f}" for r in rates] + [EVERY_LOAD], control="radio")
    at_rate = f"(rate_i == {every} || {one_rate})"
    chosen = f"{at_seqs} && {at_tok} && {at_rate}"
    shape = alt.Shape("kind:N", title=None, legend=alt.Legend(orient="bottom", columns=2, labelLimit=0),
                      scale=alt.Scale(domain=list(TWO_KNOB_KINDS), range=list(TWO_KNOB_SHAPES)))
    trail = alt.selection_point(name=TRAIL, fields=["seqs_i", "tokens_i"], on="click", toggle="true",
                                clear=False, empty=False)
    tooltip = [viz.tip("rate_req_s", "request rate (req/s)", ".1f"),
               viz.tip("max_num_seqs", "max_num_seqs (sequences)", ","),
               viz.tip("max_num_batched_tokens", "max_num_batched_tokens (tokens)", ","),
               viz.tip(x, viz.title(x), ",.0f"), viz.tip("y_text", viz.title(y).split(" (")[0], kind="N"),
               viz.tip("y2_text", viz.title(y2).split(" (")[0], kind="N")]
    calc = {"y_text": viz.duration_text(y), "y2_text": viz.duration_text(y2)}
    if "p99_tpot_ms" in data.columns:  # read as the other two durations are: "9.80 ms", the unit in the value
        tooltip.append(viz.tip("tpot_text", viz.title("p99_tpot_ms").split(" (")[0], kind="N"))
        calc["tpot_text"] = viz.duration_text("p99_tpot_ms")
    accepted = data.loc[~data["vllm_refuses"], x]
    xenc = alt.X(f"{x}:Q", title=viz.title(x), axis=alt.Axis(format=",.0f"),
                 scale=alt.Scale(zero=False, nice=False, domain=[float(accepted.min()) * 0.95,
                                                                  float(accepted.max()) * 1.03]))
    kw = dict(xenc=xenc, shape=shape, tooltip=tooltip, at_rate=at_rate, chosen=chosen, trail=trail, calc=calc,
              every=every, rates=[float(r) for r in rates])
    top = _panel(data, marks, y, 300, True, **kw).add_params(trail)
    bottom = _panel(data, marks, y2, 170, False, **kw)
    return alt.vconcat(_readout(data, at_seqs, at_tok, at_rate, every, x, y, y2), top, bottom,
                       _grid_panel(data, marks, shape, at_rate, f"{at_seqs} && {at_tok}", trail),
                       spacing=8).add_params(seqs_p, tok_p, rate_p, _trail_push())


def _trail_push():
    """A parameter whose expression adds the picked pair to the trail each time a slider changes it.

    Vega-Lite has no event for "a bound control changed", but an expression is re-evaluated whenever a parameter
    it reads changes, and Vega's ``modify`` inserts a tuple into a selection's store (as Vega-Lite's own
    selections do); the tuple's fields are the trail selection's.
    """
    fields = ", ".join(f"{{type: 'E', field: '{f}'}}" for f in ("seqs_i", "tokens_i"))
    return alt.param(name=f"{TRAIL}_push", expr=(
        f"modify('{TRAIL}_store', {{unit: '', fields: [{fields}], values: [seqs_i, tokens_i]}}, null, null)"))


def _panel(data, marks, col, height, frontier, *, xenc, shape, tooltip, at_rate, chosen, trail, calc, every, rates):
    """One latency against throughput: the shown rate's runs (or every rate's), the frontier, the defaults, the
    trail, the chosen run. The log axis fits the runs shown, labelled in ms and s."""
    low, high = _log_domain(data, marks, col, every)
    yenc = alt.Y(f"{col}:Q", title=f"{viz.title(col).split(' (')[0]} (log scale)",
                 scale=alt.Scale(type="log", nice=False, padding=PANEL_PADDING_PX, domain=[low, high]),
                 axis=alt.Axis(labelExpr=DURATION_LABEL))
    base = alt.Chart(data).transform_filter("!datum.vllm_refuses").transform_filter(at_rate).transform_calculate(
        **calc).encode(x=xenc, y=yenc)  # refused pairs were never run: no operating point
    layers = [base.mark_point(filled=True, size=40, opacity=0.7).encode(
        color=alt.Color("rate_req_s:N", title="request rate (req/s)",  # "25.0", as the buttons and readout
                        legend=alt.Legend(orient="bottom", labelExpr="format(toNumber(datum.value), '.1f')"),
                        scale=alt.Scale(domain=rates, range=RATE_COLORS[:len(rates)])),  # one colour per rate,
        shape=shape, tooltip=tooltip)]  # whichever rates are shown
    if frontier:  # the frontier runs across rates: its line with every load, its point ringed at one
        on = base.transform_filter("datum.frontier")
        layers += [on.transform_filter(f"rate_i == {every}").mark_line(color=FRONTIER_COLOR, strokeWidth=1.5),
                   on.mark_point(size=130, filled=False, color=FRONTIER_COLOR, strokeWidth=1.5)]
    layers.append(alt.Chart(marks).transform_filter(at_rate).transform_calculate(**calc).mark_point(
        size=170, filled=False, color="black", strokeWidth=1.5).encode(x=xenc, y=yenc, shape=shape, tooltip=tooltip))
    layers.append(base.transform_filter(trail).mark_point(  # where the sliders have been: faded green rings
        filled=False, size=150, color=HIGHLIGHT, strokeWidth=2.5, opacity=0.45).encode(shape=shape, tooltip=tooltip))
    layers.append(base.transform_filter(chosen).mark_point(
        filled=True, size=260, color=HIGHLIGHT, stroke="black", strokeWidth=1.5, opacity=1).encode(
        shape=shape, tooltip=tooltip))
    return alt.layer(*layers).properties(width=TWO_KNOB_WIDTH, height=height)


READOUT_LINE_PX = 15
# What a pair vLLM refuses reads, in chapter 8's readout and chapter 9's tooltips (vllm/config/scheduler.py,
# SchedulerConfig: max_num_batched_tokens must be at least max_num_seqs).
REFUSED_TEXT = "refused by vLLM: fewer tokens than sequences"
PANEL_PADDING_PX = 12  # room above and below the runs: the chosen point (size 260, radius 9 px) stays inside


READOUT_SHOWN, READOUT_OTHER = "#333333", "#8a8a8a"  # the selected rate's line, and the other rates' lines


def _readout(data, at_seqs: str, at_tok: str, at_rate: str, every: int, x: str, y: str, y2: str):
    """Lines above the chart: the chosen pair, then its numbers at every rate, a line per rate, the selected
    rate's dark and the others grey (all dark with every load), durations read by
    :func:`batchlab.viz.duration_text`; a refused pair says so instead. Every line is always drawn, so the
    readout's height is the same whatever the selection, with no blank lines."""
    name, name2 = viz.title(y).split(" (")[0], viz.title(y2).split(" (")[0]
    pair = alt.Chart(data).transform_filter(f"{at_seqs} && {at_tok} && datum.rate_i == 0").transform_calculate(
        label="format(datum.max_num_seqs, ',') + ' sequences, ' + format(datum.max_num_batched_tokens, ',')"
              " + ' tokens'").mark_text(align="left", baseline="top", fontSize=12, fontWeight="bold",
                                        color="#333333").encode(x=alt.value(0), y=alt.value(0), text="label:N")
    shown = "(datum.vllm_refuses ? datum.rate_i == 0 : true)"  # a refused pair: one line, whatever the rate
    lines = alt.Chart(data).transform_filter(f"{at_seqs} && {at_tok} && {shown}").transform_calculate(
        y_text=viz.duration_text(y), y2_text=viz.duration_text(y2),
        line_y=f"(datum.vllm_refuses ? 0 : datum.rate_i) * {READOUT_LINE_PX} + {READOUT_LINE_PX + 3}",
        label=f"datum.vllm_refuses ? '{REFUSED_TEXT}' : format(datum.rate_req_s,"
              f" '.1f') + ' req/s: ' + format(datum['{x}'], ',.0f') + ' tok/s, {name} ' + datum.y_text + ', "
              f"{name2} ' + datum.y2_text").mark_text(align="left", baseline="top", fontSize=11) \
        .encode(x=alt.value(0), y=alt.Y("line_y:Q", scale=None), text="label:N",
                color=alt.when(f"datum.vllm_refuses || {at_rate}").then(alt.value(READOUT_SHOWN)).otherwise(
                    alt.value(READOUT_OTHER)))
    height = READOUT_LINE_PX * (every + 1) + 4
    return alt.layer(pair, lines).properties(width=TWO_KNOB_WIDTH, height=height)


def _grid_panel(data, marks, shape, at_rate: str, at_pair: str, trail):
    """The knob grid itself: one mark per pair at the shown rate(s), refused pairs crossed, the frontier black
    (drawn last, so a pair on the frontier at any shown rate reads black)."""
    thousands = "format(datum.value, ',')"
    # upright labels: on a phone's column of 11 budgets each label keeps its ~25 px, and none is dropped
    xenc = alt.X("max_num_batched_tokens:O", title="max_num_batched_tokens (tokens)",
                 axis=alt.Axis(labelAngle=-90, labelOverlap=False, labelExpr=thousands))
    yenc = alt.Y("max_num_seqs:O", title="max_num_seqs (sequences)", sort="descending",
                 axis=alt.Axis(labelExpr=thousands))
    tooltip = [viz.tip("rate_req_s", "request rate (req/s)", ".1f"),
               viz.tip("max_num_seqs", "max_num_seqs (sequences)", ","),
               viz.tip("max_num_batched_tokens", "max_num_batched_tokens (tokens)", ","),
               viz.tip("kind", "pair", kind="N"), viz.tip("on_frontier", "on the frontier", kind="N")]
    base = alt.Chart(data).transform_filter(at_rate).transform_calculate(
        on_frontier="datum.frontier ? 'yes' : 'no'").encode(x=xenc, y=yenc)
    dots = base.mark_point(filled=True, size=45).encode(
        shape=shape, tooltip=tooltip, order=alt.Order("front:Q"),
        color=alt.when("datum.frontier").then(alt.value("black")).when("datum.vllm_refuses").then(
            alt.value("#555555")).otherwise(alt.value("#bbbbbb")))
    defaults = alt.Chart(marks).transform_filter(at_rate).mark_point(
        size=150, filled=False, color="black", strokeWidth=1.5).encode(x=xenc, y=yenc, shape=shape)
    visited = base.transform_filter(trail).mark_point(filled=False, size=130, color=HIGHLIGHT, strokeWidth=2.5,
                                                      opacity=0.45).encode(shape=shape)
    chosen = base.transform_filter(at_pair).mark_point(filled=True, size=180, color=HIGHLIGHT, stroke="black",
                                                       strokeWidth=1.5, opacity=1).encode(shape=shape)
    return alt.layer(dots, defaults, visited, chosen).properties(width=TWO_KNOB_WIDTH, height=210)
