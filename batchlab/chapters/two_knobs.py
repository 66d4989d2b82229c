"""Chapter 08, the two knobs: ``max_num_seqs`` and ``max_num_batched_tokens`` swept together.

:func:`two_knob_sweep` runs every pair under ``chunked`` at several request rates, expressed against the
server's capacity (:func:`saturation_rate`), except the pairs vLLM refuses to start with, which it keeps as
rows without numbers; the frontier and the readings of the sweep live in :mod:`batchlab.sweep`
(:func:`~batchlab.sweep.with_frontier`, :func:`~batchlab.sweep.seqs_plateau`,
:func:`~batchlab.sweep.default_vs_best`). :func:`two_knobs_chart` draws every operating point with buttons
over both knobs, the p99 TTFT axis clamped to the band that matters (:func:`carrying_domain`; slower runs sit on
its edge), the trail of configurations the buttons have picked, and the grid of pairs with the refused ones
crossed out. :func:`ttft_grid_table`, :func:`runs_table` and :func:`vllm_defaults_style` format the tables
(:func:`format_ms`: milliseconds below a second, seconds above).
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
from . import facts, scenes

TWO_KNOB_KINDS = ("accepted", "refused by vLLM", "vLLM serve default", "vLLM offline default")
TWO_KNOB_SHAPES = ("circle", "cross", "diamond", "square")
OFF_AXIS_KINDS = {"above": ("above the axis (true value in the tooltip)", "triangle-up"),
                  "below": ("below the axis (true value in the tooltip)", "triangle-down")}
HIGHLIGHT = viz.PALETTE[2]  # green: the point the buttons pick, and the trail of the ones picked before
# Loads, low to high: blue, orange, reddish purple, black; no two of one hue (sky blue beside blue, vermillion
# beside orange read as pairs) and no green, that is the highlight.
RATE_COLORS = [viz.PALETTE[i] for i in (0, 1, 4, 7, 5, 3)]
FRONTIER_COLOR = "#777777"  # grey: black is a rate
TWO_KNOB_WIDTH = 470  # px: with the axis labels the chart fits the book's text column
TRAIL = "visited"  # the selection holding every configuration the buttons have picked
_STEPS_125 = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)  # round bounds for a log axis


def saturation_rate(cost, workload: str, n_requests: int, *, seed=0, **knobs) -> float:
    """Requests/s the server completes when every request of a real-trace preset is queued at time 0.

    The capacity that request rates are expressed against: ``request_throughput`` of one ``chunked`` run of
    ``preset(workload, n_requests, rate_req_s=inf, seed=seed)`` with ``knobs`` (vLLM's defaults for the GPU if
    none). The drain at the end of the run, when fewer requests are left than the batch holds, is included,
    so this is slightly below the steady-state capacity. Used in chapters 08 and 12.

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
    it (and :func:`batchlab.simulate` raises), so its row has no numbers. Used in chapters 08 and 12.

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

    Used in chapters 08 and 12.

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


def compared_ttft(df: pd.DataFrame, defaults: dict, capacity: float) -> pd.Series:
    """p99 TTFT (ms) of the runs a reader compares: the frontier's and the default pair's below ``capacity``
    (req/s). Used in chapter 08."""
    under = df[df["rate_req_s"] < capacity]
    at_default = ((under["max_num_seqs"] == defaults["max_num_seqs"])
                  & (under["max_num_batched_tokens"] == defaults["max_num_batched_tokens"]))
    return under.loc[under["frontier"] | at_default, "p99_ttft_ms"]


def ttft_axis(df: pd.DataFrame, defaults: dict, capacity: float) -> list[float]:
    """The p99 TTFT axis (ms) of :func:`two_knobs_chart`: :func:`carrying_domain` of :func:`compared_ttft`.
    Used in chapter 08."""
    return carrying_domain(compared_ttft(df, defaults, capacity))


def carrying_domain(values, pad: float = 1.5) -> list[float]:
    """A log axis's domain that carries ``values``: their span widened by ``pad`` and rounded outward.

    Bounds come from 1, 1.5, 2, 3, 5, 7 times a power of ten. Used in chapter 08 to clamp the p99 TTFT axis to
    the frontier and the defaults below capacity, so that a 300 ms difference is not squeezed by runs that
    queue for minutes (those are drawn at the edge, :func:`two_knobs_chart`).

    Parameters
    ----------
    values : array-like of float
        Positive values (e.g. ms).
    pad : float
        Factor (>= 1) by which the span is widened at each end before rounding.

    Returns
    -------
    list of float
        ``[lo, hi]`` with ``lo <= min(values) / pad`` and ``hi >= max(values) * pad``.
    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size == 0 or pad < 1:
        raise ValueError(f"carrying_domain needs positive values and pad >= 1, got {v.size} values, pad {pad!r}")
    grid = np.array([m * 10.0 ** k for k in range(-6, 10) for m in _STEPS_125])
    lo, hi = v.min() / pad, v.max() * pad
    return [float(grid[grid <= lo * (1 + 1e-12)].max()), float(grid[grid >= hi * (1 - 1e-12)].min())]


def format_ms(ms: float) -> str:
    """A latency as a reader reads it: ``"412 ms"`` below a second, ``"11.1 s"`` below a minute, ``"468 s"`` above.

    NaN (a pair vLLM refuses, never run) reads ``"refused"``. Used in chapter 08's tables.
    """
    if not np.isfinite(ms):
        return "refused"
    if ms < 1e3:
        return f"{ms:,.0f} ms"
    return f"{ms / 1e3:,.1f} s" if ms < 60e3 else f"{ms / 1e3:,.0f} s"


def ttft_grid_table(df: pd.DataFrame, rate_req_s: float, col: str = "p99_ttft_ms"):
    """The grid of pairs at one rate, ``col`` (ms) formatted by :func:`format_ms`; refused pairs say so.

    Used in chapter 08. Returns a pandas ``Styler``: rows ``max_num_seqs`` (sequences), columns
    ``max_num_batched_tokens`` (tokens).
    """
    at = df[np.isclose(df["rate_req_s"], rate_req_s)]
    table = at.pivot(index="max_num_seqs", columns="max_num_batched_tokens", values=col)
    table.index.name, table.columns.name = "max_num_seqs (sequences)", "max_num_batched_tokens (tokens)"
    return table.style.format(format_ms).format_index("{:,}", axis=0).format_index("{:,}", axis=1)


def runs_table(df: pd.DataFrame, columns: dict):
    """Rows of a sweep or of :func:`batchlab.sweep.default_vs_best`, with readable headers and units.

    ``columns`` maps a column to its header; columns ending in ``_ms`` read through :func:`format_ms`, rates
    with one decimal, throughputs and knobs with thousands separators. Used in chapter 08. Returns a ``Styler``
    without the index.
    """
    def fmt(col):
        return format_ms if col.endswith("_ms") else "{:.1f}" if "rate_req_s" in col else "{:,.0f}"

    return viz.display_table(df, {col: (header, fmt(col)) for col, header in columns.items()}, na_rep=None)


def vllm_defaults_style(table: pd.DataFrame):
    """:func:`vllm_defaults_table` with the GPUs' names and headers in words and units (a ``Styler``).

    Used in chapter 08. ``table`` may be indexed by ``gpu``.
    """
    table = table if "gpu" in table.columns else table.reset_index()
    shown = table.assign(gpu=table["gpu"].map(lambda g: viz.GPU_NAMES.get(g, g)))
    count = "{:,.0f}".format
    return viz.display_table(shown, {
        "gpu": ("GPU", str), "hbm_gib": ("HBM (GiB)", "{:.0f}".format),
        "max_num_seqs": ("max_num_seqs (sequences)", count),
        "max_num_batched_tokens_serve": ("max_num_batched_tokens, vllm serve (tokens)", count),
        "max_num_batched_tokens_offline": ("max_num_batched_tokens, offline LLM (tokens)", count)})


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
                    x: str = "output_throughput", y: str = "p99_ttft_ms", y2: str = "p99_itl_ms",
                    y_domain=None):
    """Every operating point of a two-knob sweep, its frontier, vLLM's defaults, the chosen point and its trail.

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
    y_domain : (float, float), optional
        The top panel's log axis (ms), e.g. :func:`carrying_domain` of the points that matter. Runs beyond it
        are drawn on its edge as triangles, their true value in the tooltip. Default: every accepted run.

    Returns
    -------
    altair chart: a row of radio buttons per knob, labelled in sequences and tokens (a select box for a grid of
    more than eight values; the parameters hold each knob's log2), and one for the rate, colours distinct per
    rate. The buttons pick the green point; every configuration picked before stays as a faded green ring (the
    trail: the selection ``visited``, which each change of the buttons adds to; clicking a run adds or removes
    it too). The points of the selected rate are drawn stronger than the rest, and the text above reads the
    chosen configuration. Pairs vLLM refuses have no operating point: the grid at the bottom draws them as
    crosses beside the accepted pairs (black on the frontier at the selected rate), a picked one as a green
    cross, and the text says so.
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
    accepted = data.loc[~data["vllm_refuses"], y]
    lo, hi = (float(accepted.min()), float(accepted.max())) if y_domain is None else map(float, y_domain)
    off = [k for k, hit in (("above", (accepted > hi).any()), ("below", (accepted < lo).any())) if hit]
    shape = alt.Shape("kind:N", title=None, legend=alt.Legend(orient="bottom", columns=2, labelLimit=0),
                      scale=alt.Scale(domain=[*TWO_KNOB_KINDS, *(OFF_AXIS_KINDS[k][0] for k in off)],
                                      range=[*TWO_KNOB_SHAPES, *(OFF_AXIS_KINDS[k][1] for k in off)]))
    trail = alt.selection_point(name=TRAIL, fields=["log2_seqs", "log2_tokens", "rate_req_s"], on="click",
                                toggle="true", clear=False, empty=False)
    tooltip = [alt.Tooltip("rate_req_s:Q", title="rate (req/s)"), "max_num_seqs:Q", "max_num_batched_tokens:Q",
               alt.Tooltip(f"{x}:Q", format=",.0f", title=viz.title(x)),
               alt.Tooltip(f"{y}:Q", format=",.0f", title=viz.title(y)),
               alt.Tooltip(f"{y2}:Q", format=",.0f", title=viz.title(y2))]
    xenc = alt.X(f"{x}:Q", title=viz.title(x), scale=alt.Scale(zero=False))
    kw = dict(xenc=xenc, shape=shape, tooltip=tooltip, at_rate=at_rate, chosen=chosen, trail=trail)
    top = _panel(data, marks, y, (lo, hi), 300, True, **kw).add_params(trail)
    bottom = _panel(data, marks, y2, None, 170, False, **kw)
    return alt.vconcat(_readout(data, chosen, x, y, y2), top, bottom,
                       _grid_panel(data, marks, shape, at_rate, f"{at_seqs} && {at_tok}", trail),
                       spacing=6).add_params(seqs_p, tok_p, rate_p, _trail_push())


def _trail_push():
    """A parameter whose expression adds the picked configuration to the trail each time a button changes it.

    Vega-Lite has no event for "a bound control changed", but an expression is re-evaluated whenever a parameter
    it reads changes, and Vega's ``modify`` inserts a tuple into a selection's store (as Vega-Lite's own
    selections do); the tuple's fields are the trail selection's.
    """
    fields = ", ".join(f"{{type: 'E', field: '{f}'}}" for f in ("log2_seqs", "log2_tokens", "rate_req_s"))
    return alt.param(name=f"{TRAIL}_push", expr=(
        f"modify('{TRAIL}_store', {{unit: '', fields: [{fields}], values: [log2_seqs, log2_tokens, rate_req_s]}},"
        " null, null)"))


def _clamped(y: str, domain) -> dict:
    """Vega expressions that put ``y`` on the axis: the value clamped to ``domain``, and the off-axis kind."""
    lo, hi = domain
    above, below = OFF_AXIS_KINDS["above"][0], OFF_AXIS_KINDS["below"][0]
    return {"y_shown": f"clamp(datum['{y}'], {lo!r}, {hi!r})",
            "kind_shown": f"datum['{y}'] > {hi!r} ? '{above}' : datum['{y}'] < {lo!r} ? '{below}' : datum.kind"}


def _panel(data, marks, col, domain, height, frontier, *, xenc, shape, tooltip, at_rate, chosen, trail):
    """One latency against throughput: every run, the frontier, the defaults, the trail, the chosen run."""
    if domain is None:
        yenc = alt.Y("y_shown:Q", title=viz.title(col), scale=alt.Scale(type="log"))
        calc = {"y_shown": f"datum['{col}']", "kind_shown": "datum.kind"}
    else:  # clamped: what lies beyond is drawn on the edge, as a triangle, with its true value in the tooltip
        yenc = alt.Y("y_shown:Q", title=viz.title(col), scale=alt.Scale(type="log", domain=list(domain), nice=False),
                     axis=alt.Axis(values=[t for t in viz.log_ticks(domain) if domain[0] <= t <= domain[1]]))
        calc = _clamped(col, domain)
    shown = shape.to_dict() | {"field": "kind_shown"}
    base = alt.Chart(data).transform_filter("!datum.vllm_refuses").transform_calculate(**calc).encode(
        x=xenc, y=yenc)  # refused pairs were never run: no operating point
    layers = [base.mark_point(filled=True, size=40).encode(
        color=alt.Color("rate_req_s:N", title="request rate (req/s)", scale=alt.Scale(range=RATE_COLORS),
                        legend=alt.Legend(orient="bottom")), shape=shown,
        opacity=alt.when(at_rate).then(alt.value(0.7)).otherwise(alt.value(0.15)), tooltip=tooltip)]
    if frontier:
        layers.append(base.transform_filter("datum.frontier").mark_line(color=FRONTIER_COLOR, strokeWidth=1.5))
    layers.append(alt.Chart(marks).transform_calculate(**calc).mark_point(
        size=170, filled=False, color="black", strokeWidth=1.5).encode(
        x=xenc, y=yenc, shape=shape, opacity=alt.when(at_rate).then(alt.value(1.0)).otherwise(alt.value(0.25)),
        tooltip=tooltip))
    layers.append(base.transform_filter(trail).mark_point(  # where the buttons have been: faded green rings
        filled=False, size=150, color=HIGHLIGHT, strokeWidth=2.5, opacity=0.45).encode(shape=shown, tooltip=tooltip))
    layers.append(base.transform_filter(chosen).mark_point(
        filled=True, size=260, color=HIGHLIGHT, stroke="black", strokeWidth=1.5, opacity=1).encode(
        shape=shown, tooltip=tooltip))
    return alt.layer(*layers).properties(width=TWO_KNOB_WIDTH, height=height)


def _readout(data, chosen: str, x: str, y: str, y2: str):
    """Two short lines above the chart: the chosen knobs and rate, then its numbers (or that vLLM refuses it)."""
    name, name2 = viz.title(y).split(" (")[0], viz.title(y2).split(" (")[0]
    label = (
        "format(datum.max_num_seqs, ',') + ' sequences, ' + format(datum.max_num_batched_tokens, ',')"
        " + ' tokens, ' + datum.rate_req_s + ' req/s\\n' + (datum.vllm_refuses"
        " ? 'refused by vLLM: fewer tokens than sequences' : ("
        f"format(datum['{x}'], ',.0f') + ' tok/s, {name} ' + format(datum['{y}'], ',.0f')"
        f" + ' ms, {name2} ' + format(datum['{y2}'], ',.0f') + ' ms'))")
    return alt.Chart(data).transform_filter(chosen).transform_calculate(label=label).mark_text(
        align="left", baseline="top", fontSize=12, fontWeight="bold", color="#333333", lineBreak="\n",
        lineHeight=16).encode(x=alt.value(0), y=alt.value(0), text="label:N").properties(
        width=TWO_KNOB_WIDTH, height=30)


def _grid_panel(data, marks, shape, at_rate: str, at_pair: str, trail):
    """The knob grid itself: one mark per pair at the selected rate, refused pairs crossed, the frontier black."""
    thousands = "format(datum.value, ',')"
    xenc = alt.X("max_num_batched_tokens:O", title="max_num_batched_tokens (tokens)",
                 axis=alt.Axis(labelAngle=0, labelExpr=thousands))
    yenc = alt.Y("max_num_seqs:O", title="max_num_seqs (sequences)", sort="descending",
                 axis=alt.Axis(labelExpr=thousands))
    tooltip = ["max_num_seqs:Q", "max_num_batched_tokens:Q", "kind:N", alt.Tooltip("frontier:N", title="frontier")]
    base = alt.Chart(data).transform_filter(at_rate).encode(x=xenc, y=yenc)
    dots = base.mark_point(filled=True, size=60).encode(
        shape=shape, tooltip=tooltip,
        color=alt.when("datum.frontier").then(alt.value("black")).when("datum.vllm_refuses").then(
            alt.value("#555555")).otherwise(alt.value("#bbbbbb")))
    defaults = alt.Chart(marks).transform_filter(at_rate).mark_point(
        size=170, filled=False, color="black", strokeWidth=1.5).encode(x=xenc, y=yenc, shape=shape)
    visited = base.transform_filter(trail).mark_point(filled=False, size=150, color=HIGHLIGHT, strokeWidth=2.5,
                                                      opacity=0.45).encode(shape=shape)
    chosen = base.transform_filter(at_pair).mark_point(filled=True, size=200, color=HIGHLIGHT, stroke="black",
                                                       strokeWidth=1.5, opacity=1).encode(shape=shape)
    return alt.layer(dots, defaults, visited, chosen).properties(width=TWO_KNOB_WIDTH, height=150)


# -- facts other pages glue (batchlab.chapters.facts) ----------------------------------------------------------
CONV_LOADS = {"light": 0.5, "moderate": 0.8, "near": 0.95, "over": 1.2}  # the conv scene's rates, x capacity


@facts.memo
def _capacity(cost, workload: str, n_requests: int, seed) -> float:
    return saturation_rate(cost, workload, n_requests, seed=seed)


def conv_capacity() -> float:
    """The conv scene's capacity (req/s): every request queued at time 0, vLLM's defaults (:func:`saturation_rate`)."""
    s = scenes.scene("conv")
    return _capacity(s.cost(), s.workload, s.n_requests, s.seed)


def conv_rates() -> dict:
    """The conv scene's request rates by name (:data:`CONV_LOADS` times its capacity, to 0.1 req/s)."""
    cap = conv_capacity()
    return {name: round(share * cap, 1) for name, share in CONV_LOADS.items()}


@facts.fact("capacity_req_s", scene="conv", unit="req/s", fmt=".1f", chapter="two_knobs",
            text="the capacity of the conversation scene: requests per second the server completes with every "
                 "request queued at time 0 and vLLM's defaults (what vllm bench throughput measures)")
def _capacity_fact():
    return conv_capacity()


def _rate_fact(name: str, share: float):
    @facts.fact(f"rate_{name}_req_s", scene="conv", unit="req/s", fmt=".1f", chapter="two_knobs",
                text=f"the conversation scene's {name} load: {share:.0%} of its capacity")
    def _rate():
        return conv_rates()[name]


for _name, _share in CONV_LOADS.items():
    _rate_fact(_name, _share)


@facts.fact("conv_prompt_mean", scene="conv", unit="tokens", fmt=",.0f", chapter="two_knobs",
            text="the mean prompt of the conversation scene's 3,000 requests")
def _prompt_mean():
    return float(scenes.scene("conv").requests().prompt_tokens.mean())


@facts.fact("conv_output_mean", scene="conv", unit="tokens", fmt=",.0f", chapter="two_knobs",
            text="the mean output the conversation scene's requests ask for")
def _output_mean():
    return float(scenes.scene("conv").requests().output_tokens.mean())


@facts.fact("kv_pool_tokens", scene="llama8", unit="tokens", fmt=",.0f", chapter="two_knobs",
            text="the KV pool vLLM gives Llama-3-8B BF16 on one H100 SXM with its defaults, in tokens (the null "
                 "block left out)")
def _kv_pool_tokens():
    return int((scenes.scene("llama8").cost().kv_pool_blocks() - 1) * 16)
