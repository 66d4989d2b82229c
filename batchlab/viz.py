"""Charts for the book: one Altair theme, an offline renderer, tidy-frame helpers and one builder per figure.

Importing this module registers and enables the Altair theme ``batchlab`` and the renderer ``batchlab``.

The renderer never loads anything from another host. It emits a ``<div id="batchlab-chart-N">`` and a short
script that hands the spec to ``vegaEmbed``; N counts the charts a kernel has shown, so a notebook run from
the top always produces the same ids. The library itself (vega, vega-lite and vega-embed, about 0.9 MB, from
``vl_convert.javascript_bundle``) comes from one of two places:

* in the built book, ``book/_ext/vega_offline.py`` writes :func:`offline_bundle` into ``_static`` and loads it
  on every page; it sets the environment variable ``BATCHLAB_BOOK=1``, which the kernels that execute the
  notebooks inherit, and then charts carry no copy of the library;
* in a live kernel (JupyterLab, VS Code, nbval), the first chart of the kernel carries the library inline
  once, and every later chart of the page uses it.

Charts drawn before the library has loaded wait in ``window.batchlabCharts`` and are drawn when it arrives.
Outside the book build the mimebundle also holds the spec under the Vega-Lite mimetype, for front ends that
draw it natively; the book uses ``text/html`` (``nb_mime_priority_overrides`` in ``_config.yml``).

Builders take tidy DataFrames (one row per observation, SI units in column names: ``_s`` seconds) and
return Altair charts. Axis titles are lowercase and carry units; builders set no chart titles (the caption
belongs to the page). Interactivity that must work in the static book uses parameters bound to sliders over
data precomputed on a grid (:func:`grid_param`), never a kernel.
"""
from __future__ import annotations

import functools
import itertools
import json
import os

import altair as alt
import numpy as np
import pandas as pd

THEME = "batchlab"
CHART_ID_PREFIX = "batchlab-chart-"
# Altair's own "application/vnd.vegalite.v6.json" is not a JSON mimetype to nbformat (no "+json"): a dict under
# it makes the notebook invalid, so only the "+json" spelling is sent.
VEGALITE_MIME = "application/vnd.vegalite.v6+json"
BOOK_ENV = "BATCHLAB_BOOK"  # "1" while the book builds: its pages load the library themselves
EMBED_OPTIONS = {"actions": False, "renderer": "svg", "mode": "vega-lite"}
MAX_ROWS = 50_000  # data is inlined in the page; the ITL timelines are the largest tables

# Okabe-Ito: distinguishable under the common colour-vision deficiencies.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
PHASES = ("waiting", "prefill", "decode", "held")
PHASE_COLORS = ("#d9d9d9", "#D55E00", "#0072B2", "#CC79A7")

TITLES = {  # column -> axis title; lowercase, with units
    "output_cv": "output-length coefficient of variation",
    "batch": "batch size (sequences)",
    "context": "context per sequence (tokens)",
    "step_time_ms": "step time (ms)",
    "time_s": "time (s)",
    "start_s": "time (s)",
    "running": "running sequences",
    "itl_ms": "inter-token latency (ms)",
    "output_throughput": "output throughput (tok/s)",
    "total_token_throughput": "total throughput (tok/s)",
    "request_throughput": "request throughput (req/s)",
    "max_num_seqs": "max_num_seqs (sequences)",
    "max_num_batched_tokens": "max_num_batched_tokens (tokens)",
}


def title(column: str) -> str:
    """Axis title of a column: from :data:`TITLES`, else a vLLM summary name (``p99_ttft_ms`` -> "p99 ttft (ms)")."""
    if column in TITLES:
        return TITLES[column]
    for suffix, unit in (("_ms", "ms"), ("_s", "s"), ("_tokens", "tokens")):
        if column.endswith(suffix):
            return f"{column[: -len(suffix)].replace('_', ' ')} ({unit})"
    return column.replace("_", " ")


# -- theme -------------------------------------------------------------------------------------------------
@alt.theme.register(THEME, enable=True)
def _theme() -> alt.theme.ThemeConfig:
    axis = {"titleFontWeight": "normal", "titleFontSize": 12, "labelFontSize": 11, "labelOverlap": "greedy",
            "gridColor": "#ececec",
            "domainColor": "#888888", "tickColor": "#888888", "titleColor": "#333333"}
    return {"config": {
        "font": "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif",
        "view": {"continuousWidth": 420, "continuousHeight": 260, "stroke": None},
        "axis": axis,
        "legend": {"titleFontWeight": "normal", "titleFontSize": 12, "labelFontSize": 11},
        "header": {"titleFontWeight": "normal", "labelFontSize": 12, "titleFontSize": 12},
        "range": {"category": PALETTE},
        "line": {"strokeWidth": 2},
        "point": {"filled": True, "size": 36},
    }}


# -- offline renderer ----------------------------------------------------------------------------------------
_BUNDLE_SNIPPET = """
window.vegaEmbed = vegaEmbed; window.vega = vega; window.vegaLite = vegaLite;
var waiting = window.batchlabCharts;
window.batchlabCharts = {push: function (draw) { draw(); }};
if (Array.isArray(waiting)) { waiting.forEach(function (draw) { draw(); }); }
"""

_DRAW = """(function () {
  var el = document.currentScript && document.currentScript.previousElementSibling;
  if (!el || el.id !== "%(id)s") { el = document.getElementById("%(id)s"); }
  var spec = %(spec)s;
  var draw = function () {
    window.vegaEmbed(el, spec, %(opts)s).catch(function (err) { console.error("vega: " + err); });
  };
  var queue = window.batchlabCharts;
  if (!queue && window.vegaEmbed) { draw(); } else { (window.batchlabCharts = queue || []).push(draw); }
})();"""
# currentScript: two notebooks open in one JupyterLab window can both hold a "batchlab-chart-1".

_chart_ids = itertools.count(1)
_library_sent = False


@functools.lru_cache(maxsize=1)
def offline_bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one classic script that defines ``window.vegaEmbed``.

    vl-convert bundles them as an ES module with no imports; wrapping it in a strict function keeps its
    top-level names out of the page's global scope, and a classic script (unlike a module) also loads from
    ``file://`` when a reader opens the built book straight from disk. The script then draws every chart
    queued in ``window.batchlabCharts``.
    """
    import vl_convert

    js = vl_convert.javascript_bundle(_BUNDLE_SNIPPET)
    return '(function () {\n"use strict";\n' + js.replace("</script", "<\\/script") + "\n})();\n"


def _script_json(obj) -> str:
    """JSON that is also safe inside an HTML <script> element."""
    text = json.dumps(obj, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _library_html() -> str:
    return f'<script type="text/javascript" data-batchlab-library="1">{offline_bundle()}</script>'


def ensure_library() -> None:
    """In a live kernel, show the chart library once, as an ordinary output, unless a chart already carried it.

    Call it before drawing charts inside an ipywidgets ``Output`` (``widgets.explore`` does): a 0.9 MB script
    carried through a widget's state stalls nbclient (``jupyter execute``, nbconvert) until its timeout.
    """
    global _library_sent
    if os.environ.get(BOOK_ENV) == "1" or _library_sent:
        return
    _library_sent = True
    from IPython.display import display

    display({"text/html": _library_html(), "text/plain": ""}, raw=True)


def render(spec: dict, **metadata) -> dict:
    """Altair renderer ``batchlab``: a div, a vegaEmbed call and, once per live kernel, the library.

    Returns a mimebundle with ``text/html`` (what the book and JupyterLab show), ``text/plain`` and, outside
    the book build, the spec under the Vega-Lite v6 mimetype for front ends that draw it natively.
    """
    global _library_sent
    chart_id = f"{CHART_ID_PREFIX}{next(_chart_ids)}"
    html = (f'<div id="{chart_id}" class="batchlab-chart"></div>\n<script type="text/javascript">'
            + _DRAW % {"id": chart_id, "spec": _script_json(spec), "opts": _script_json(EMBED_OPTIONS)}
            + "</script>")
    if os.environ.get(BOOK_ENV) != "1" and not _library_sent:
        _library_sent = True
        html = f"{_library_html()}\n{html}"
    bundle = {"text/html": html, "text/plain": f"<batchlab chart {chart_id}>"}
    if os.environ.get(BOOK_ENV) != "1":  # myst-nb warns about (and cannot draw) the Vega-Lite mimetype
        bundle[VEGALITE_MIME] = spec
    return bundle


alt.renderers.register(THEME, render)
alt.renderers.enable(THEME)
alt.data_transformers.enable("default", max_rows=MAX_ROWS)


# -- grids behind sliders ----------------------------------------------------------------------------------
def grid_param(name: str, values, label: str | None = None, field: str | None = None, value=None):
    """A parameter bound to a slider over precomputed ``values``, and the filter that selects them.

    Parameters
    ----------
    name : str
        Parameter name (a JavaScript identifier).
    values : array-like of float
        The grid the data was computed on. Evenly spaced values get a range slider, others a select box,
        a single value no control.
    label : str, optional
        Text beside the control (defaults to ``name``).
    field : str, optional
        Column holding the grid value in the chart's data (defaults to ``name``).
    value : float, optional
        Initial value (defaults to the smallest).

    Returns
    -------
    param : altair.Parameter
        Add it with ``chart.add_params(param)``.
    predicate : str
        Vega expression true for rows at the selected grid value; use in ``transform_filter`` or ``alt.when``.
    """
    grid = np.unique(np.asarray(values, dtype=float))
    gaps = np.diff(grid)
    if grid.size > 1 and np.allclose(gaps, gaps[0]):
        bind = alt.binding_range(min=float(grid[0]), max=float(grid[-1]), step=float(gaps[0]), name=label or name)
    elif grid.size > 1:
        bind = alt.binding_select(options=grid.tolist(), name=label or name)
    else:
        bind = alt.Undefined  # one value (a live explore cell): nothing to choose
    tolerance = float(gaps.min() / 2) if grid.size > 1 else 0.5
    param = alt.param(name=name, value=float(grid[0] if value is None else value), bind=bind)
    return param, f"abs(datum['{field or name}'] - {name}) < {tolerance!r}"


# -- tidy frames from a SimResult ---------------------------------------------------------------------------
def gantt_frame(res, label: str | None = None) -> pd.DataFrame:
    """One row per request and phase: ``request``, ``phase``, ``start_s``, ``end_s``, ``policy``.

    Phases: waiting (arrival to first schedule), prefill (to the first token), decode (to the last token)
    and held (a lockstep row that finished but keeps its slot until the batch ends). Rejected requests and
    empty phases are left out. ``label`` names the run (default: its policy).
    """
    req = res.requests[~res.requests["rejected"]]
    first = np.array([res.token_times[i][0] for i in req.index])  # emission time (s) of each first token
    edges = [req["arrival_s"], req["scheduled_s"], first, req["finish_s"], req["release_s"]]
    parts = [pd.DataFrame({"request": req.index, "phase": phase, "start_s": np.asarray(lo), "end_s": np.asarray(hi)})
             for phase, lo, hi in zip(PHASES, edges[:-1], edges[1:])]
    df = pd.concat(parts, ignore_index=True)
    df = df[df["end_s"] > df["start_s"]].sort_values(["request", "start_s"], kind="stable")
    return df.assign(policy=label or res.policy).reset_index(drop=True)


def steps_frame(res, label: str | None = None) -> pd.DataFrame:
    """``res.steps`` with ``step``, ``end_s``, ``step_time_ms`` and a ``policy`` column, for occupancy charts."""
    df = res.steps.reset_index()
    df["end_s"] = df["start_s"] + df["duration_s"]
    df["step_time_ms"] = df["duration_s"] * 1e3
    return df.assign(policy=label or res.policy)


def itl_frame(res, requests=None) -> pd.DataFrame:
    """Every inter-token gap: ``request``, ``token`` (index of the later token), ``time_s`` (its emission),
    ``itl_ms``. ``requests`` picks some request indices (default: all completed)."""
    keep = ~res.requests["rejected"].to_numpy()
    chosen = np.flatnonzero(keep) if requests is None else np.asarray(requests)
    parts = [pd.DataFrame({"request": i, "token": np.arange(1, t.size), "time_s": t[1:], "itl_ms": np.diff(t) * 1e3})
             for i in chosen if (t := res.token_times[i]).size > 1]
    cols = ["request", "token", "time_s", "itl_ms"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


# -- chart builders ------------------------------------------------------------------------------------------
def padding_chart(summary: pd.DataFrame, batches: pd.DataFrame | None = None, cv: str = "output_cv"):
    """Padding tax and tail waste of static batching against output-length CV, with a CV slider (notebook 01).

    Parameters
    ----------
    summary : DataFrame
        One row per CV: ``cv`` column, ``padding_fraction`` and ``half_empty_fraction`` (shares in [0, 1]),
        as :func:`batchlab.experiments.static_padding_sweep` returns.
    batches : DataFrame, optional
        Rows of one batch per CV (``row``, ``kind``, ``tokens`` and the ``cv`` column); if given, a second
        panel draws the batch at the selected CV, generated tokens beside the padded tail, on one token
        scale for every CV so the batch visibly stretches as the slider moves.
    cv : str
        Name of the CV column.

    Returns
    -------
    altair chart; the slider ``cv`` moves a marker along both curves and redraws the batch panel.
    """
    param, at_cv = grid_param("cv", summary[cv], "output-length CV", field=cv)
    long = summary.melt(id_vars=[cv], value_vars=["padding_fraction", "half_empty_fraction"], var_name="measure",
                        value_name="share")
    long["measure"] = long["measure"].map({"padding_fraction": "padded token slots",
                                           "half_empty_fraction": "batch time half empty"})
    lo, hi = min(0.0, float(summary[cv].min())), float(summary[cv].max())
    room = [lo, hi + 0.15 * ((hi - lo) or 1.0)]  # value labels stay inside the plot: the layout never shifts
    base = alt.Chart(long).encode(
        x=alt.X(f"{cv}:Q", title=title(cv), axis=alt.Axis(tickCount=5), scale=alt.Scale(domain=room, nice=False)),
        y=alt.Y("share:Q", title="share wasted (%)", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("measure:N", title=None, legend=alt.Legend(orient="top")))
    marker = base.mark_point(size=110).transform_filter(at_cv)
    label = base.mark_text(align="left", dx=8, dy=-8).encode(text=alt.Text("share:Q", format=".0%")).transform_filter(at_cv)
    curves = alt.layer(base.mark_line(), marker, label).properties(width=270, height=240)
    if batches is None:
        return curves.add_params(param)
    longest = float(batches.groupby([cv, "row"])["tokens"].sum().max())  # one x scale for every CV
    rows = alt.Chart(batches).mark_bar().encode(
        x=alt.X("tokens:Q", title="decode tokens per row", stack="zero", scale=alt.Scale(domain=[0, longest])),
        y=alt.Y("row:O", title="rows of the first batch", axis=alt.Axis(labels=False, ticks=False)),
        color=alt.Color("kind:N", title=None, scale=alt.Scale(domain=["generated", "padding"], range=[PALETTE[0], "#d9d9d9"]),
                        legend=alt.Legend(orient="top"))).transform_filter(at_cv).properties(width=190, height=240)
    return alt.hconcat(curves, rows).resolve_scale(color="independent").add_params(param)


def gantt_chart(df: pd.DataFrame, facet: str = "policy", highlight: bool = False, last_end: bool = False):
    """One row per request, bars for its waiting, prefill, decode and held phases; one panel per ``facet``.

    Parameters
    ----------
    df : DataFrame
        :func:`gantt_frame` of one or more runs (concatenate them): ``request``, ``phase``, ``start_s``,
        ``end_s`` (seconds) and the ``facet`` column.
    facet : str
        Column that splits the panels (one per policy); ignored when absent.
    highlight : bool
        Add a slider over the request ids that dims every other request (-1: none dimmed).
    last_end : bool
        Mark when each panel's last request ends (a rule and its time), the panels sharing the time axis.
    """
    if highlight or last_end:
        return _gantt_layers(df, facet, highlight, last_end)
    bars = alt.Chart(df).mark_bar().encode(
        x=alt.X("start_s:Q", title="time (s)"), x2="end_s:Q",
        y=alt.Y("request:O", title="request"),
        color=alt.Color("phase:N", title=None, scale=alt.Scale(domain=list(PHASES), range=list(PHASE_COLORS)),
                        legend=alt.Legend(orient="top")),
        tooltip=["request:O", "phase:N", alt.Tooltip("start_s:Q", format=".3f"), alt.Tooltip("end_s:Q", format=".3f")])
    if facet not in df.columns:
        return bars
    return bars.properties(width=520, height=alt.Step(12)).facet(row=alt.Row(f"{facet}:N", title=None))


def occupancy_chart(steps: pd.DataFrame, y: str = "running", color: str = "policy"):
    """Batch occupancy over time: ``y`` (default running sequences) per iteration as a step line.

    Parameters
    ----------
    steps : DataFrame
        :func:`steps_frame` of one or more runs: ``start_s`` (s), ``y`` and optionally ``color``.
    y, color : str
        Columns for the height and for the series.
    """
    enc = {"color": alt.Color(f"{color}:N", title=None, legend=alt.Legend(orient="top"))} if color in steps else {}
    return alt.Chart(steps).mark_line(interpolate="step-after").encode(
        x=alt.X("start_s:Q", title=title("start_s")), y=alt.Y(f"{y}:Q", title=title(y)), **enc)


def roofline_chart(df: pd.DataFrame, knees: pd.DataFrame, color: str | None = None):
    """Decode step time against batch size on log-log axes, a slider over context, the knee marked (notebook 04).

    Parameters
    ----------
    df : DataFrame
        ``batch`` (sequences), ``context`` (tokens per sequence), ``step_time_s`` (s), precomputed on a
        grid of contexts; evenly spaced contexts get a slider, others a select box.
    knees : DataFrame
        ``context`` and ``knee`` (sequences) for each context on the grid (and the ``color`` column).
    color : str, optional
        Column that separates series, e.g. ``hardware`` or ``model``.

    Returns
    -------
    altair chart; the slider ``context`` picks the curve and moves the knee rule and its label.
    """
    param, at_ctx = grid_param("context", df["context"], "context per sequence (tokens)")
    enc = {"color": alt.Color(f"{color}:N", title=None, legend=alt.Legend(orient="top"))} if color else {}
    lines = alt.Chart(df).transform_filter(at_ctx).transform_calculate(step_time_ms="datum.step_time_s * 1000").mark_line(
    ).encode(x=alt.X("batch:Q", title=title("batch"), scale=alt.Scale(type="log", nice=False), axis=alt.Axis(format="~s")),
             y=alt.Y("step_time_ms:Q", title=title("step_time_ms"), scale=alt.Scale(type="log")), **enc)
    rule = alt.Chart(knees).transform_filter(at_ctx).mark_rule(strokeDash=[4, 3]).encode(x="knee:Q", **enc)
    text = alt.Chart(knees).transform_filter(at_ctx).transform_calculate(label="'knee ' + format(datum.knee, '.0f')").mark_text(
        align="left", dx=4, baseline="top", y=4).encode(x="knee:Q", text="label:N", **enc)
    return alt.layer(lines, rule, text).add_params(param)


def itl_timeline_chart(df: pd.DataFrame, color: str = "request"):
    """Every inter-token gap against the time its token was emitted (notebooks 05 and 06).

    Parameters
    ----------
    df : DataFrame
        :func:`itl_frame`: ``time_s`` (s), ``itl_ms`` (ms), ``request``; extra columns go to the tooltip.
    color : str
        Column coloring the points (no legend past ten values); ignored when absent.
    """
    enc = {}
    if color in df.columns:
        legend = alt.Legend(orient="top") if df[color].nunique() <= 10 else None
        enc["color"] = alt.Color(f"{color}:N", title=None, legend=legend)
    return alt.Chart(df).mark_circle(size=14, opacity=0.8).encode(
        x=alt.X("time_s:Q", title=title("time_s")), y=alt.Y("itl_ms:Q", title=title("itl_ms")),
        tooltip=list(df.columns), **enc)


def frontier_chart(df: pd.DataFrame, x: str = "output_throughput", y: str = "p99_ttft_ms",
                   color: str = "max_num_batched_tokens", order: str = "max_num_seqs",
                   frontier: str | None = None, select: str | None = None):
    """Latency against throughput over a sweep: one line per ``color``, the Pareto frontier on top (notebook 08).

    Parameters
    ----------
    df : DataFrame
        One row per configuration, e.g. from ``batchlab.sweep``: columns ``x``, ``y``, ``color``, ``order``.
    x, y : str
        Throughput and latency columns (``_ms`` latencies, tok/s throughputs).
    color, order : str
        Column naming each line and column ordering points along it.
    frontier : str, optional
        Boolean column marking Pareto-optimal rows; they are joined by a black line.
    select : str, optional
        Grid column bound to a slider that highlights the chosen line (defaults to none).
    """
    enc = dict(x=alt.X(f"{x}:Q", title=title(x)), y=alt.Y(f"{y}:Q", title=title(y)),
               color=alt.Color(f"{color}:O", title=color, legend=alt.Legend(orient="top")),
               order=alt.Order(f"{order}:Q"), tooltip=list(df.columns))
    param = None
    if select:
        param, at = grid_param(select, df[select], title(select), field=select)
        enc["opacity"] = alt.when(at).then(alt.value(1.0)).otherwise(alt.value(0.15))
    layers = [alt.Chart(df).mark_line(point=True).encode(**enc)]
    if frontier:
        front = df[df[frontier]].sort_values(x)
        layers.append(alt.Chart(front).mark_line(color="black", strokeDash=[2, 2]).encode(x=f"{x}:Q", y=f"{y}:Q"))
    chart = alt.layer(*layers)
    return chart.add_params(param) if param is not None else chart


# --- 02_dynamic_batching ---
POLICY_COLORS = {"static": "#D55E00", "dynamic": "#0072B2", "continuous": "#009E73", "chunked": "#CC79A7"}
LATENCY_LABELS = {"mean_e2el_ms": "mean e2el", "p99_e2el_ms": "p99 e2el", "mean_ttft_ms": "mean ttft",
                  "p99_ttft_ms": "p99 ttft"}


def _policy_color(policies):
    domain = [p for p in POLICY_COLORS if p in set(policies)]
    return alt.Color("policy:N", title=None, sort=domain, legend=alt.Legend(orient="top"),
                     scale=alt.Scale(domain=domain, range=[POLICY_COLORS[p] for p in domain]))


def latency_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`batchlab.experiments.policy_grid` rows as one row per run and latency metric.

    Columns: the run's ``load`` (if any), ``rate_req_s``, ``policy``, ``max_queue_delay_ms`` (NaN except
    dynamic), ``metric`` (a :data:`LATENCY_LABELS` value such as "p99 e2el") and ``latency_s`` (s).
    """
    ids = [c for c in ("load", "rate_req_s", "policy", "max_queue_delay_s") if c in runs]
    long = runs.melt(id_vars=ids, value_vars=list(LATENCY_LABELS), var_name="metric", value_name="latency_ms")
    long["metric"] = long["metric"].map(LATENCY_LABELS)
    long["latency_s"] = long.pop("latency_ms") / 1e3
    long["max_queue_delay_ms"] = long.pop("max_queue_delay_s") * 1e3
    return long


def queue_delay_chart(runs: pd.DataFrame, facet: str = "load"):
    """Latency against dynamic batching's max queue delay, other policies as reference lines (notebook 02).

    Parameters
    ----------
    runs : DataFrame
        :func:`batchlab.experiments.policy_grid` with dynamic runs on an evenly spaced delay grid and a
        ``facet`` column (one panel per load, ordered by ``rate_req_s``).
    facet : str
        Column splitting the panels.

    Returns
    -------
    altair chart; a slider over the delay marks and labels the dynamic point in every panel, a select box
    picks the latency metric (mean or p99, e2el or ttft). Latency is on a log axis.
    """
    long = latency_frame(runs)
    delay, at_delay = grid_param("delay", long["max_queue_delay_ms"].dropna(), "max queue delay (ms)",
                                 field="max_queue_delay_ms")
    metric = alt.param(name="metric", value=LATENCY_LABELS["mean_e2el_ms"],
                       bind=alt.binding_select(options=list(LATENCY_LABELS.values()), name="latency "))
    x = alt.X("max_queue_delay_ms:Q", title="max queue delay (ms)")
    # Fixed label room and 16 px of padding: switching the metric changes the tick labels and moves the lowest
    # line's label (drawn under it) to the bottom; neither may grow the chart past its container.
    y = alt.Y("latency_s:Q", title="latency (s)", scale=alt.Scale(type="log", padding=16),
              axis=alt.Axis(minExtent=40, maxExtent=40))
    color = _policy_color(long["policy"])
    base = alt.Chart().transform_filter("datum.metric == metric")
    dyn = base.transform_filter("datum.policy == 'dynamic'")
    ref = base.transform_filter("datum.policy != 'dynamic'")
    xmax = float(long["max_queue_delay_ms"].max())
    picked = dyn.transform_filter(at_delay).transform_calculate(label="format(datum.latency_s, '.3~s') + ' s'")
    layers = [dyn.mark_line(point=True).encode(x=x, y=y, color=color),
              ref.mark_rule(strokeDash=[5, 3]).encode(y=y, color=color),
              # continuous and chunked often coincide: one label under its line on the left, the others above
              ref.transform_filter("datum.policy == 'continuous'").mark_text(align="left", baseline="top", dy=3)
              .encode(x=alt.datum(0.0), y=y, color=color, text="policy:N"),
              ref.transform_filter("datum.policy != 'continuous'").mark_text(align="right", baseline="bottom", dy=-2)
              .encode(x=alt.datum(xmax), y=y, color=color, text="policy:N"),
              picked.mark_point(size=180, color="black", filled=False).encode(x=x, y=y),
              picked.transform_filter(f"datum.max_queue_delay_ms <= {xmax / 2}").mark_text(
                  align="left", dx=9, dy=-9, fontWeight="bold").encode(x=x, y=y, text="label:N"),
              # higher up than the left-hand label: the reference lines' names sit just above them on the right
              picked.transform_filter(f"datum.max_queue_delay_ms > {xmax / 2}").mark_text(
                  align="right", dx=-6, dy=-20, fontWeight="bold").encode(x=x, y=y, text="label:N")]
    panels = alt.layer(*layers, data=long).properties(width=235, height=260)
    order = runs.groupby(facet)["rate_req_s"].min().sort_values().index.tolist()
    return panels.facet(column=alt.Column(f"{facet}:N", title=None, sort=order)).resolve_scale(
        y="independent").add_params(delay, metric)


def load_sweep_chart(runs: pd.DataFrame, capacities: pd.DataFrame, metric: str = "mean_e2el_ms"):
    """Latency against offered load per policy on log-log axes, saturation throughputs as rules (notebook 02).

    Parameters
    ----------
    runs : DataFrame
        :func:`batchlab.experiments.policy_grid` over several rates (at most one delay for dynamic).
    capacities : DataFrame
        ``rate_req_s`` (req/s) and ``label`` of each vertical rule, e.g. each policy's saturation throughput.
    metric : str
        A latency column of ``runs`` (ms); plotted in seconds.
    """
    df = runs.assign(latency_s=runs[metric] / 1e3)
    lo, hi = df["rate_req_s"].min(), max(df["rate_req_s"].max(), capacities["rate_req_s"].max())
    x = alt.X("rate_req_s:Q", title="offered load (req/s)",
              scale=alt.Scale(type="log", nice=False, domain=[0.8 * lo, 1.3 * hi]))
    lines = alt.Chart(df).mark_line(point=True).encode(
        x=x, y=alt.Y("latency_s:Q", title=f"{LATENCY_LABELS.get(metric, title(metric))} (s)",
                     scale=alt.Scale(type="log")),
        color=_policy_color(df["policy"]), tooltip=["policy:N", alt.Tooltip("rate_req_s:Q", format=".3~g"),
                                                    alt.Tooltip("latency_s:Q", format=".3~g")])
    rules = alt.Chart(capacities).mark_rule(color="#888888", strokeDash=[2, 2]).encode(x="rate_req_s:Q")
    text = alt.Chart(capacities).mark_text(align="right", angle=270, baseline="bottom", dx=-4, color="#555555",
                                           y=0).encode(x="rate_req_s:Q", text="label:N")
    return alt.layer(lines, rules, text).properties(width=460, height=280)


# --- 03_continuous_batching ---
def _gantt_layers(df: pd.DataFrame, facet: str, highlight: bool, last_end: bool):
    """:func:`gantt_chart` with a request-highlight slider and/or the last end of each panel marked."""
    enc = dict(x=alt.X("start_s:Q", title="time (s)"), x2="end_s:Q", y=alt.Y("request:O", title="request"),
               color=alt.Color("phase:N", title=None, legend=alt.Legend(orient="top"),
                               scale=alt.Scale(domain=list(PHASES), range=list(PHASE_COLORS))),
               tooltip=["request:O", "phase:N", alt.Tooltip("start_s:Q", format=".3f"),
                        alt.Tooltip("end_s:Q", format=".3f")])
    params = []
    if highlight:
        ids = np.unique(df["request"])
        param, _ = grid_param("request", np.arange(-1, ids.max() + 1), "highlight request (-1: none)", value=-1)
        enc["opacity"] = alt.when("request < 0 || datum.request == request").then(alt.value(1.0)).otherwise(
            alt.value(0.2))
        params.append(param)
    layers = [alt.Chart().mark_bar().encode(**enc)]
    if last_end:
        last = alt.Chart().transform_aggregate(last_s="max(end_s)")
        layers += [last.mark_rule(color="black", strokeDash=[4, 3]).encode(x="last_s:Q"),
                   last.transform_calculate(label="'last request ends at ' + format(datum.last_s, '.2f') + ' s'")
                   .mark_text(align="right", baseline="top", dx=-4, y=2).encode(x="last_s:Q", text="label:N")]
    chart = alt.layer(*layers, data=df)
    if facet in df.columns:
        chart = chart.properties(width=520, height=alt.Step(12)).facet(row=alt.Row(f"{facet}:N", title=None,
                                                                                   sort=list(pd.unique(df[facet]))))
    return chart.add_params(*params) if params else chart


def occupancy_frame(res, label: str | None = None) -> pd.DataFrame:
    """Batch occupancy over time as step functions: slots held and rows that produced a token.

    One row per change: ``time_s`` (s), ``measure`` ("slots held": ``steps.running``, rows of a lockstep
    batch that finished included; "rows generating": rows whose token came out of that iteration) and
    ``rows``, and ``policy`` (``label``, default the run's policy). Idle gaps between iterations are zeros.
    """
    from .experiments import tokens_per_step

    steps = res.steps
    start = steps["start_s"].to_numpy()
    end = start + steps["duration_s"].to_numpy()
    held, gen = steps["running"].to_numpy(), tokens_per_step(res)
    gap = np.append(start[1:] > end[:-1], True)  # idle after this iteration (and after the last one)
    t = np.concatenate([start, end[gap]])
    h = np.concatenate([held, np.zeros(gap.sum(), held.dtype)])
    g = np.concatenate([gen, np.zeros(gap.sum(), gen.dtype)])
    order = np.argsort(t, kind="stable")
    t, h, g = t[order], h[order], g[order]
    change = np.ones(t.size, bool)
    change[1:] = (h[1:] != h[:-1]) | (g[1:] != g[:-1])
    change[-1] = True
    wide = pd.DataFrame({"time_s": t[change], "slots held": h[change], "rows generating": g[change]})
    long = wide.melt(id_vars="time_s", var_name="measure", value_name="rows")
    return long.assign(policy=label or res.policy)


def occupancy_panels_chart(df: pd.DataFrame, facet: str = "policy"):
    """Slots held (line) and rows generating a token (area) over time, one panel per ``facet`` (notebook 03).

    Parameters
    ----------
    df : DataFrame
        :func:`occupancy_frame` of one or more runs, concatenated.
    facet : str
        Column splitting the panels.
    """
    x = alt.X("time_s:Q", title="time (s)")
    color = alt.Color("measure:N", title=None, legend=alt.Legend(orient="top"),
                      scale=alt.Scale(domain=["slots held", "rows generating"], range=["#CC79A7", "#0072B2"]))
    area = alt.Chart().transform_filter("datum.measure == 'rows generating'").mark_area(
        interpolate="step-after", opacity=0.45).encode(x=x, y=alt.Y("rows:Q", title="sequences"), color=color)
    line = alt.Chart().transform_filter("datum.measure == 'slots held'").mark_line(
        interpolate="step-after", strokeWidth=1.5).encode(x=x, y="rows:Q", color=color)
    return alt.layer(area, line, data=df).properties(width=520, height=70).facet(
        row=alt.Row(f"{facet}:N", title=None, sort=list(pd.unique(df[facet]))))


# --- 04_step_time_roofline ---
COST_COLORS = {"roofline": PALETTE[0], "calibrated": PALETTE[1]}


def step_time_roofline_chart(curves: pd.DataFrame, knees: pd.DataFrame, width: int = 215, height: int = 230):
    """Decode step time against batch on log-log axes, one panel per GPU, a slider over context (notebook 04).

    Parameters
    ----------
    curves, knees : DataFrame
        From :func:`batchlab.experiments.step_time_grid`: ``hardware``, ``cost`` ("roofline" or
        "calibrated"), ``context``, ``context_index``, ``batch``, ``step_time_s`` (s), ``kv_fits``; and per
        context the ``knee`` (sequences) with the ``step_time_s`` there.
    width, height : int
        Pixels of each panel.

    Returns
    -------
    altair chart; the slider ``context_step`` walks ``context_index`` (an uneven grid such as 0 to 16k
    tokens), redraws the curves and moves each knee's rule, marker and label. Curves are dashed and faded
    where the batch's KV cache would not fit in memory.
    """
    param, at = grid_param("context_step", knees["context_index"], "context per sequence (0, 512, 1k ... 16k)",
                           field="context_index")
    curves = curves.assign(step_time_ms=curves["step_time_s"] * 1e3)
    knees = knees.assign(step_time_ms=knees["step_time_s"] * 1e3, label_px=np.where(knees["cost"] == "roofline", 4, 18))
    x_title, y_title = title("batch"), title("step_time_ms")
    ms = curves["step_time_ms"]
    x = alt.X("batch:Q", title=x_title, axis=alt.Axis(values=[1, 4, 16, 64, 256, 1024]),
              scale=alt.Scale(type="log", nice=False, domain=[curves["batch"].min(), curves["batch"].max()]))
    y = alt.Y("step_time_ms:Q", title=y_title, axis=alt.Axis(values=[1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]),
              scale=alt.Scale(type="log", nice=False, domain=[ms.min() * 0.9, ms.max() * 1.1]))
    color = alt.Color("cost:N", title=None, legend=alt.Legend(orient="top"),
                      scale=alt.Scale(domain=list(COST_COLORS), range=list(COST_COLORS.values())))
    kx = alt.X("knee:Q", title=x_title)
    panels = []
    for hw in curves["hardware"].unique():
        line = alt.Chart(curves[curves["hardware"] == hw]).transform_filter(at)
        knee = alt.Chart(knees[knees["hardware"] == hw]).transform_filter(at)
        head = f"'{hw} · context ' + format(datum.context, ',') + ' tokens'"
        panels.append(alt.layer(
            line.transform_filter("datum.kv_fits").mark_line().encode(x=x, y=y, color=color),
            line.mark_line(opacity=0.35, strokeDash=[2, 2]).encode(x=x, y=y, color=color),
            knee.mark_rule(strokeDash=[4, 3]).encode(x=kx, color=color),
            knee.mark_point(size=70, filled=True).encode(x=kx, y=alt.Y("step_time_ms:Q", title=y_title), color=color,
                                                         tooltip=["cost:N", alt.Tooltip("knee:Q", format=".1f")]),
            knee.transform_calculate(text="'knee ' + format(datum.knee, '.1f')").mark_text(
                align="left", baseline="top", dx=4).encode(x=kx, y=alt.Y("label_px:Q", scale=None, axis=None),
                                                           text="text:N", color=color),
            knee.transform_filter("datum.cost == 'roofline'").transform_calculate(text=head).mark_text(
                align="left", baseline="bottom", dy=-8).encode(x=alt.value(0), y=alt.value(0), text="text:N"),
        ).properties(width=width, height=height))
    return alt.hconcat(*panels).add_params(param)


# --- 05_prefill_spike ---
def choice_param(name: str, options, label: str | None = None, field: str | None = None, value=None):
    """A parameter bound to a select box over string ``options``, and the filter for rows that match.

    Returns ``(param, predicate)`` like :func:`grid_param`; ``field`` defaults to ``name``.
    """
    options = [str(o) for o in options]
    param = alt.param(name=name, value=options[0] if value is None else value,
                      bind=alt.binding_select(options=options, name=label or name))
    return param, f"datum['{field or name}'] == {name}"


def spike_chart(itl: pd.DataFrame, behind: pd.DataFrame, reference_ms: float | None = None,
                reference_label: str = "", width: int = 520, height: int = 230):
    """The decoders' inter-token gaps around a long unchunked prompt, and the TTFT of requests behind it (notebook 05).

    Parameters
    ----------
    itl : DataFrame
        ``model``, ``order``, ``time_s`` (s since the long prompt arrived), ``itl_ms``, ``sequences``
        (:func:`batchlab.experiments.spike_scenarios`).
    behind : DataFrame
        ``model``, ``order``, ``arrival_ms``, ``run`` and ``ttft_ms`` of the requests queued behind it.
    reference_ms : float, optional
        A gap to draw as a dashed horizontal rule (e.g. a published number), labelled ``reference_label``.
    width, height : int
        Pixels of the timeline panel; the TTFT panel below it is as wide and shorter.

    Returns
    -------
    altair chart with two select boxes, ``model`` and ``order``, that pick the run both panels show; the
    largest gap is labelled with its value. The panels are stacked so the chart fits the text column.
    """
    model, at_model = choice_param("model", itl["model"].unique(), "model")
    order, at_order = choice_param("order", itl["order"].unique(), "scheduler order")
    pick = f"{at_model} && {at_order}"
    x = alt.X("time_s:Q", title="time since the long prompt arrived (s)")
    y = alt.Y("itl_ms:Q", title=title("itl_ms"))
    base = alt.Chart(itl).transform_filter(pick)
    layers = [
        base.mark_circle(size=30, opacity=0.85, color=PALETTE[0]).encode(
            x=x, y=y, tooltip=[alt.Tooltip("time_s:Q", format=".3f"), alt.Tooltip("itl_ms:Q", format=".1f"),
                               "sequences:Q"]),
        base.transform_joinaggregate(top="max(itl_ms)").transform_filter("datum.itl_ms == datum.top").transform_calculate(
            text="'one gap of ' + format(datum.itl_ms, ',.0f') + ' ms'").mark_text(align="left", dx=8).encode(
            x=x, y=y, text="text:N"),
    ]
    if reference_ms is not None:
        ref = alt.Chart(pd.DataFrame({"itl_ms": [reference_ms], "text": [reference_label]}))
        layers += [ref.mark_rule(color="#888888", strokeDash=[4, 3]).encode(y=y),
                   ref.mark_text(align="right", baseline="bottom", dy=-3, color="#555555").encode(
                       x=alt.value(width), y=y, text="text:N")]
    ttft = alt.Chart(behind).transform_filter(pick).mark_line(point=True).encode(
        x=alt.X("arrival_ms:Q", title="arrival after the long prompt (ms)"), y=alt.Y("ttft_ms:Q", title="ttft (ms)"),
        color=alt.Color("run:N", title=None, legend=alt.Legend(orient="top"),
                        scale=alt.Scale(domain=sorted(behind["run"].unique()), range=[PALETTE[3], PALETTE[2]])),
        tooltip=["run:N", alt.Tooltip("arrival_ms:Q", format=".1f"), alt.Tooltip("ttft_ms:Q", format=".1f")])
    return alt.vconcat(alt.layer(*layers).properties(width=width, height=height),
                       ttft.properties(width=width, height=int(height * 0.6))).resolve_legend(
        color="independent").add_params(model, order)  # the legend sits with the panel it belongs to


# --- 06_chunked_prefill ---
def log_ticks(values, scale: float = 1.0) -> list[float]:
    """Tick values 1, 2, 3, 5 x 10^k spanning ``values * scale``: log axes otherwise crowd their labels."""
    v = np.asarray(values, dtype=float) * scale
    v = v[np.isfinite(v) & (v > 0)]
    lo, hi = np.floor(np.log10(v.min())), np.ceil(np.log10(v.max()))
    ticks = [m * 10.0 ** k for k in np.arange(lo, hi + 1) for m in (1, 2, 3, 5)]
    inside = [t for t in ticks if v.min() / 1.5 <= t <= v.max() * 1.5]
    return [int(round(t)) if t >= 1 else float(f"{t:.12g}") for t in inside]


def chunking_chart(points: pd.DataFrame, timeline: pd.DataFrame, curve: pd.DataFrame, value: int = 2048):
    """The chunked-prefill trade: worst decoder ITL against the newcomer's TTFT, and the ITL timeline (notebook 06).

    Parameters
    ----------
    points : DataFrame
        :func:`batchlab.experiments.chunk_budget_sweep` points: ``config`` ("chunked"/"unchunked"), ``budget``
        (tokens), ``log2_budget`` (evenly spaced over the chunked rows), ``itl_max_s``, ``ttft_s`` (s).
    timeline : DataFrame
        Its timelines: ``config``, ``budget``, ``log2_budget``, ``time_s`` (s since the arrival), ``itl_s``.
    curve : DataFrame
        ``itl_max_s`` and ``ttft_s`` along the fitted hyperbola (``HyperbolaFit.curve``).
    value : int
        Budget selected at first.

    Returns
    -------
    altair chart; the slider picks the budget (as log2) and the checkbox turns chunking off, which moves the
    ring on the trade-off curve and redraws the timeline.
    """
    chunked = points[points["config"] == "chunked"]
    budget, at_budget = grid_param("log2_budget", chunked["log2_budget"], "max_num_batched_tokens = 2^",
                                   value=float(np.log2(value)))
    toggle = alt.param(name="chunking", value=True, bind=alt.binding_checkbox(name="chunked prefill "))
    chosen = f"chunking ? (datum.config == 'chunked' && {at_budget}) : datum.config == 'unchunked'"
    ms = {"itl_ms": "datum.itl_max_s * 1000", "ttft_ms": "datum.ttft_s * 1000"}
    x = alt.X("ttft_ms:Q", title="newcomer's time to first token (ms)", scale=alt.Scale(type="log", nice=False),
              axis=alt.Axis(values=log_ticks(points["ttft_s"] * 1e3), format=","))
    y = alt.Y("itl_ms:Q", title="decoders' worst inter-token latency (ms)", scale=alt.Scale(type="log", nice=False),
              axis=alt.Axis(values=log_ticks(points["itl_max_s"] * 1e3), format=","))
    tips = ["config:N", "budget:Q", alt.Tooltip("itl_ms:Q", format=".1f"), alt.Tooltip("ttft_ms:Q", format=".0f")]
    fit = alt.Chart(curve).transform_calculate(**ms).mark_line(color="#999999", strokeDash=[5, 3], strokeWidth=1.5)
    base = alt.Chart(points).transform_calculate(**ms).encode(x=x, y=y, tooltip=tips)
    trade = base.transform_filter("datum.config == 'chunked'").mark_line(point=True, color=PALETTE[0])
    off = base.transform_filter("datum.config == 'unchunked'").mark_point(shape="square", size=90, color=PALETTE[3])
    names = base.transform_filter("datum.config == 'chunked'").mark_text(align="left", dx=8, dy=-8, fontSize=10
                                                                         ).encode(text="budget:Q")
    ring = base.transform_filter(chosen).mark_point(size=300, filled=False, strokeWidth=2, color="black")
    left = alt.layer(fit.encode(x=x, y=y), trade.encode(order="budget:Q"), off, names, ring).properties(
        width=440, height=250)
    return alt.vconcat(left, _chunking_timeline(points, timeline, chosen)).add_params(budget, toggle)


def _chunking_timeline(points, timeline, chosen):
    """Lower panel of :func:`chunking_chart`: the decoders' gaps at the chosen run, the first token ruled."""
    lo, hi = float(timeline["time_s"].min()), float(timeline["time_s"].max())
    x = alt.X("time_s:Q", title="time since the long prompt arrived (s)", scale=alt.Scale(domain=[lo, hi]))
    top = float(timeline["itl_s"].max() * 1e3 * 1.08)
    bars = alt.Chart(timeline).transform_filter(chosen).transform_calculate(itl_ms="datum.itl_s * 1000").mark_bar(
        width=2.5, color=PALETTE[0]).encode(x=x, y=alt.Y("itl_ms:Q", title="decoders' inter-token latency (ms)",
                                                         scale=alt.Scale(domain=[0, top])))
    first = alt.Chart(points).transform_filter(chosen).transform_calculate(
        label="(datum.config == 'chunked' ? 'budget ' + format(datum.budget, ',') + ' tokens' : 'chunking off')"
              " + ': first token after ' + format(datum.ttft_s * 1000, ',.0f') + ' ms'")
    rule = first.mark_rule(color=PALETTE[3], strokeDash=[4, 3]).encode(x="ttft_s:Q")
    text = first.mark_text(align="right", baseline="top", y=2, color=PALETTE[3], fontSize=11).encode(
        x=alt.value(440), text="label:N")
    return alt.layer(bars, rule, text).properties(width=440, height=180)


# --- 07_piggybacking ---
KIND_COLORS = {"decode": PALETTE[0], "mixed": PALETTE[2], "prefill": PALETTE[3]}  # step kinds of notebook 07


def _kind_color():
    return alt.Color("kind:N", title="step", scale=alt.Scale(domain=list(KIND_COLORS), range=list(KIND_COLORS.values())),
                     legend=alt.Legend(orient="top"))


def utilisation_chart(steps: pd.DataFrame, ceiling: pd.DataFrame):
    """Each iteration's share of peak FLOP/s against its share of HBM bandwidth, and the roofline (notebook 07).

    Parameters
    ----------
    steps : DataFrame
        :func:`batchlab.experiments.step_utilisation`: ``kind``, ``compute_util``, ``bandwidth_util`` (shares),
        ``intensity`` (FLOP/byte), ``flops_per_s`` and ``run``.
    ceiling : DataFrame
        :func:`batchlab.experiments.roofline_ceiling`: ``intensity``, ``flops_per_s``.
    """
    tips = ["run:N", "kind:N", "prefill_tokens:Q", "decode_seqs:Q", alt.Tooltip("compute_util:Q", format=".0%"),
            alt.Tooltip("bandwidth_util:Q", format=".0%")]
    share, pct = alt.Scale(domain=[0, 1]), alt.Axis(format="%", values=[0, 0.2, 0.4, 0.6, 0.8, 1.0])
    utils = alt.Chart(steps).mark_circle(size=18, opacity=0.5).encode(
        x=alt.X("bandwidth_util:Q", title="share of peak memory bandwidth (%)", scale=share, axis=pct),
        y=alt.Y("compute_util:Q", title="share of peak compute (%)", scale=share, axis=pct),
        color=_kind_color(), tooltip=tips).properties(width=440, height=220)
    tflops = "datum.flops_per_s / 1e12"
    x = alt.X("intensity:Q", title="arithmetic intensity (flop per byte)", scale=alt.Scale(type="log", nice=False),
              axis=alt.Axis(values=log_ticks(ceiling["intensity"]), format=","))
    span = [float(ceiling["flops_per_s"].min() / 1e12), float(ceiling["flops_per_s"].max() / 1e12 * 1.1)]
    y = alt.Y("tflops:Q", title="achieved compute (tflop/s)", scale=alt.Scale(type="log", domain=span),
              axis=alt.Axis(values=log_ticks(steps["flops_per_s"].tolist() + ceiling["flops_per_s"].tolist(), 1e-12),
                            format=","))
    dots = alt.Chart(steps).transform_calculate(tflops=tflops).mark_circle(size=18, opacity=0.5).encode(
        x=x, y=y, color=_kind_color(), tooltip=tips)
    roof = alt.Chart(ceiling).transform_calculate(tflops=tflops).mark_line(color="#333333", strokeWidth=1).encode(x=x, y=y)
    return alt.vconcat(utils, alt.layer(roof, dots).properties(width=440, height=220))


def budget_split_chart(split: pd.DataFrame, value: int = 2048):
    """Prompt tokens and decode tokens per iteration over a run, stacked, with a budget slider (notebook 07).

    Parameters
    ----------
    split : DataFrame
        :func:`batchlab.experiments.budget_split`: ``budget``, ``log2_budget`` (evenly spaced), ``time_s``, ``kind``
        ("prefill"/"decode"), ``tokens_per_step``.
    value : int
        Budget selected at first.
    """
    param, at = grid_param("log2_budget", split["log2_budget"], "max_num_batched_tokens = 2^",
                           value=float(np.log2(value)))
    base = alt.Chart(split).transform_filter(at)
    area = base.mark_area(interpolate="step-after", opacity=0.85).encode(
        x=alt.X("time_s:Q", title="time (s)"),
        y=alt.Y("tokens_per_step:Q", title="tokens per iteration (mean over 1 s)", stack="zero"),
        color=alt.Color("kind:N", title=None, scale=alt.Scale(domain=["decode", "prefill"],
                                                              range=[KIND_COLORS["decode"], KIND_COLORS["prefill"]]),
                        legend=alt.Legend(orient="top")),
        order=alt.Order("order:Q"), tooltip=["time_s:Q", "kind:N", alt.Tooltip("tokens_per_step:Q", format=".0f")]
    ).transform_calculate(order="datum.kind == 'decode' ? 0 : 1")
    rule = base.transform_aggregate(budget="max(budget)").mark_rule(strokeDash=[4, 3], color="#333333").encode(
        y="budget:Q")
    text = base.transform_aggregate(budget="max(budget)").transform_calculate(
        label="'budget ' + format(datum.budget, ',') + ' tokens'").mark_text(
        align="left", x=4, dy=-7, fontSize=11).encode(y="budget:Q", text="label:N")
    return alt.layer(area, rule, text).properties(width=470, height=240).add_params(param)


def mixing_chart(df: pd.DataFrame, rate: float):
    """Output throughput and p99 ITL against offered load, one line per policy, the headline load ruled (notebook 07).

    Parameters
    ----------
    df : DataFrame
        :func:`batchlab.experiments.mixing_comparison`: ``rate`` (req/s, finite), ``policy``,
        ``output_throughput`` (tok/s), ``p99_itl_ms`` (ms).
    rate : float
        The offered load the page reads its numbers at (req/s).
    """
    color = alt.Color("policy:N", title=None, legend=alt.Legend(orient="bottom", columns=1, labelLimit=0))
    x = alt.X("rate:Q", title="offered load (requests/s)")
    base = alt.Chart(df[np.isfinite(df["rate"])]).encode(x=x, color=color, tooltip=list(df.columns[:2]))
    mark = alt.Chart(pd.DataFrame({"rate": [rate]})).mark_rule(strokeDash=[4, 3], color="#777777").encode(x=x)
    tput = alt.layer(base.mark_line(point=True).encode(y=alt.Y("output_throughput:Q", title=title("output_throughput"))),
                     mark).properties(width=440, height=200)
    itl = alt.layer(base.mark_line(point=True).encode(y=alt.Y("p99_itl_ms:Q", title="p99 inter-token latency (ms)",
                                                              scale=alt.Scale(type="log"))),
                    mark).properties(width=440, height=200)
    return alt.vconcat(tput, itl)


# --- 08_two_knobs ---
TWO_KNOB_KINDS = ("accepted", "refused by vLLM", "vLLM serve default", "vLLM offline default")
TWO_KNOB_SHAPES = ("circle", "cross", "diamond", "square")
HIGHLIGHT = PALETTE[2]  # green: the point the sliders pick
RATE_COLORS = [PALETTE[i] for i in (5, 0, 1, 3, 4, 7)]  # loads, low to high; no green, that is the highlight
TWO_KNOB_WIDTH = 470  # px: with the axis labels the chart fits the book's text column


def two_knobs_chart(df: pd.DataFrame, defaults: dict, offline_tokens: int | None = None, rate_value=None,
                    x: str = "output_throughput", y: str = "p99_ttft_ms", y2: str = "p99_itl_ms"):
    """Every operating point of a two-knob sweep, its frontier, vLLM's defaults and the chosen point (notebook 08).

    Parameters
    ----------
    df : DataFrame
        :func:`batchlab.experiments.two_knob_sweep` with a boolean ``frontier`` column: ``rate`` (req/s),
        ``max_num_seqs``, ``max_num_batched_tokens`` (powers of two), ``vllm_refuses``, ``x``, ``y``, ``y2``.
    defaults : dict
        vLLM's ``vllm serve`` defaults (:func:`batchlab.vllm_defaults`): the slider start and a marked point.
    offline_tokens : int, optional
        ``max_num_batched_tokens`` of the offline default (same ``max_num_seqs``), marked too.
    rate_value : float, optional
        The rate selected at first (default: the second highest).
    x, y, y2 : str
        Throughput (tok/s) and the two latencies (ms): ``y`` in the top panel with the frontier, ``y2`` below.

    Returns
    -------
    altair chart: two sliders (log2 of each knob; a select box if a knob's grid is not evenly spaced in log2)
    and radio buttons for the rate pick the green point; the points of the
    selected rate are drawn stronger than the rest, and the text above reads the chosen configuration.
    """
    data = df[["rate", "max_num_seqs", "max_num_batched_tokens", "vllm_refuses", "frontier", x, y, y2]].copy()
    data["log2_seqs"] = np.log2(data["max_num_seqs"]).round().astype(int)
    data["log2_tokens"] = np.log2(data["max_num_batched_tokens"]).round().astype(int)
    data["kind"] = np.where(data["vllm_refuses"], TWO_KNOB_KINDS[1], TWO_KNOB_KINDS[0])
    rates = np.sort(data["rate"].unique())
    seqs_p, at_seqs = grid_param("log2_seqs", data["log2_seqs"], "max_num_seqs = 2^",
                                 value=int(np.log2(defaults["max_num_seqs"])))
    tok_p, at_tok = grid_param("log2_tokens", data["log2_tokens"], "max_num_batched_tokens = 2^",
                               value=int(np.log2(defaults["max_num_batched_tokens"])))
    rate_value = rates[max(rates.size - 2, 0)] if rate_value is None else rate_value
    # Radio buttons, not grid_param: a handful of loads reads better as named choices than as a slider.
    rate_p = alt.param(name="rate", value=float(rate_value),
                       bind=alt.binding_radio(options=rates.tolist(), name="request rate (req/s) "))
    at_rate = f"abs(datum['rate'] - rate) < {float(np.diff(rates).min() / 2) if rates.size > 1 else 0.5!r}"
    marks = [data[(data["max_num_seqs"] == defaults["max_num_seqs"])
                  & (data["max_num_batched_tokens"] == defaults["max_num_batched_tokens"])].assign(kind=TWO_KNOB_KINDS[2])]
    if offline_tokens is not None:
        marks.append(data[(data["max_num_seqs"] == defaults["max_num_seqs"])
                          & (data["max_num_batched_tokens"] == offline_tokens)].assign(kind=TWO_KNOB_KINDS[3]))
    marks = pd.concat(marks, ignore_index=True)
    chosen = f"{at_seqs} && {at_tok} && {at_rate}"
    tooltip = [alt.Tooltip("rate:Q", title="rate (req/s)"), "max_num_seqs:Q", "max_num_batched_tokens:Q",
               alt.Tooltip(f"{x}:Q", format=",.0f", title=title(x)), alt.Tooltip(f"{y}:Q", format=",.0f", title=title(y)),
               alt.Tooltip(f"{y2}:Q", format=",.0f", title=title(y2))]
    shape = alt.Shape("kind:N", title=None, scale=alt.Scale(domain=list(TWO_KNOB_KINDS), range=list(TWO_KNOB_SHAPES)),
                      legend=alt.Legend(orient="bottom", columns=2))
    xenc = alt.X(f"{x}:Q", title=title(x), scale=alt.Scale(zero=False))

    def panel(col, height, frontier):
        yenc = alt.Y(f"{col}:Q", title=title(col), scale=alt.Scale(type="log"))
        base = alt.Chart(data).encode(x=xenc, y=yenc)
        layers = [base.mark_point(filled=True, size=40).encode(
            color=alt.Color("rate:N", title="request rate (req/s)", scale=alt.Scale(range=RATE_COLORS),
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
        f" + ' at ' + datum.rate + ' req/s' + (datum.vllm_refuses ? ' (vLLM refuses this pair)' : '') + '\\n'"
        f" + format(datum['{x}'], ',.0f') + ' tok/s, {title(y).split(' (')[0]} ' + format(datum['{y}'], ',.0f')"
        f" + ' ms, {title(y2).split(' (')[0]} ' + format(datum['{y2}'], ',.0f') + ' ms'")
    ).mark_text(align="left", baseline="top", fontSize=12, fontWeight="bold", color="#333333", lineBreak="\n",
                lineHeight=16).encode(x=alt.value(0), y=alt.value(0), text="label:N").properties(
        width=TWO_KNOB_WIDTH, height=30)
    return alt.vconcat(readout, panel(y, 300, True), panel(y2, 170, False), spacing=6).add_params(seqs_p, tok_p, rate_p)


# --- 10_validation ---
STAGE_LABELS = {"before": "before calibration", "after": "after calibration"}
GROUP_COLORS = {"fit": PALETTE[0], "ridge": PALETTE[1], "held out": PALETTE[3]}
# Log axes spanning one to eight decades: label 1, 2 and 5 times a power of ten ("0.02", "5", "1e-4" below 0.001)
# and let the axis drop labels that would overlap.
_DECADE = "log(datum.value) / LN10"
_MANTISSA = f"datum.value / pow(10, floor({_DECADE} + 1e-9))"
LOG125_LABEL = (f"(abs({_MANTISSA} - 1) < 1e-6 || abs({_MANTISSA} - 2) < 1e-6 || abs({_MANTISSA} - 5) < 1e-6) ? "
                "(datum.value >= 0.001 ? format(datum.value, '~g') : format(datum.value, '.0e')) : ''")


def parity_frame(sample: pd.DataFrame, band: float = 0.15) -> pd.DataFrame:
    """Parity points plus, per set and stage, the lines y = x and y = (1 +- ``band``) x spanning the set's range.

    ``sample`` is :func:`batchlab.experiments.parity_sample`. Adds ``kind`` ("case" or the line's label) and
    ``panel`` (the stage as "before calibration" / "after calibration"). Cases predicted at 0 (a term the
    starting model does not have) cannot sit on a log axis and are left out.
    """
    sample = sample[sample["predicted_ms"] > 0]
    rows = []
    for name, per in sample.groupby("set", sort=False):
        lo = min(per["measured_ms"].min(), per["predicted_ms"].min()) / (1 + band)
        hi = max(per["measured_ms"].max(), per["predicted_ms"].max()) * (1 + band)
        for stage in per["stage"].unique():
            for label, k in (("y = x", 1.0), (f"±{band:.0%}", 1 + band), (f"±{band:.0%}", 1 - band)):
                rows.append({"set": name, "stage": stage, "kind": label, "line": f"{label} {k}",
                             "measured_ms": [lo, hi], "predicted_ms": [lo * k, hi * k]})
    lines = pd.DataFrame(rows).explode(["measured_ms", "predicted_ms"]).astype({"measured_ms": float, "predicted_ms": float})
    out = pd.concat([sample.assign(kind="case", line=""), lines], ignore_index=True)
    out["panel"] = out.pop("stage").map(STAGE_LABELS)
    for col in ("measured_ms", "predicted_ms", "rel_err"):  # four digits are plenty on a log axis, and a smaller page
        out[col] = [float(f"{v:.4g}") for v in out[col]]
    return out.drop(columns=[c for c in ("case_id",) if c in out])


def parity_chart(sample: pd.DataFrame, value: str | None = None, band: float = 0.15, size: int = 260):
    """Predicted against measured time on log-log axes, before and after calibration side by side (notebook 10).

    Parameters
    ----------
    sample : DataFrame
        :func:`batchlab.experiments.parity_sample`: ``set``, ``stage`` (before, after), ``group`` (fit,
        ridge, held out), ``case``, ``measured_ms``, ``predicted_ms`` (ms), ``rel_err``.
    value : str, optional
        The set shown first (default: the first in ``sample``).
    band : float
        Relative error drawn as dashed lines around y = x (the calibration target, 15 %).
    size : int
        Pixels of each square panel.

    Returns
    -------
    altair chart; a select box picks the measured set, both panels redraw with their axes fitted to it.
    """
    data = parity_frame(sample, band)
    sets = list(dict.fromkeys(sample["set"]))
    param = alt.param(name="measured_set", value=value or sets[0],
                      bind=alt.binding_select(options=sets, name="measured set "))
    axis = {"scale": alt.Scale(type="log", nice=False), "axis": alt.Axis(labelExpr=LOG125_LABEL, labelOverlap="greedy")}
    x = alt.X("measured_ms:Q", title="measured time (ms)", **axis)
    y = alt.Y("predicted_ms:Q", title="predicted time (ms)", **axis)
    base = alt.Chart().transform_filter("datum.set == measured_set")
    points = base.transform_filter("datum.kind == 'case'").mark_circle(size=22, opacity=0.7).encode(
        x=x, y=y, color=alt.Color("group:N", title=None, legend=alt.Legend(orient="top"),
                                  scale=alt.Scale(domain=list(GROUP_COLORS), range=list(GROUP_COLORS.values()))),
        tooltip=["case:N", alt.Tooltip("measured_ms:Q", format=".4~g"), alt.Tooltip("predicted_ms:Q", format=".4~g"),
                 alt.Tooltip("rel_err:Q", format=".1%", title="relative error")])
    lines = base.transform_filter("datum.kind != 'case'").mark_line(color="#555555", strokeWidth=1).encode(
        x=x, y=y, detail="line:N", strokeDash=alt.StrokeDash("kind:N", title=None, legend=alt.Legend(orient="top"),
                                                             scale=alt.Scale(range=[[1, 0], [4, 3]])))
    panels = alt.layer(lines, points, data=data).properties(width=size, height=size)
    return panels.facet(column=alt.Column("panel:N", title=None, sort=list(STAGE_LABELS.values()))).add_params(param)


def published_chart(runs: pd.DataFrame, published: dict, width: int = 250, height: int = 220):
    """Mean TTFT and mean TPOT against arrival rate, simulated, beside the published vLLM figures (notebook 10).

    Parameters
    ----------
    runs : DataFrame
        :func:`batchlab.experiments.vllm_v060_runs` (one or more ``lengths``) at finite rates: ``rate``
        (req/s), ``lengths``, ``mean_ttft_ms``, ``mean_tpot_ms``.
    published : dict
        :data:`batchlab.experiments.PUBLISHED_VLLM_V060`: the TTFT ceiling over ``ttft_qps`` is drawn as a
        dashed segment, the TPOT at ``tpot_qps`` as a black diamond.
    """
    finite = runs[np.isfinite(runs["rate"])]
    x = alt.X("rate:Q", title="arrival rate (req/s)")
    blog = f"rescaled to the blog's {published['prompt_tokens_mean']:g} / {published['output_tokens_mean']:g} tokens"
    color = alt.Color("lengths:N", title="prompt / output lengths", legend=alt.Legend(
        orient="top", direction="vertical", labelLimit=0, labelExpr=f"datum.label == 'blog' ? \"{blog}\" : 'the ShareGPT file\\'s own'"))
    lo, hi = published["ttft_qps"]
    ceiling = pd.DataFrame({"rate": [lo, hi], "mean_ttft_ms": published["mean_ttft_ms_ceiling"], "what": "published ceiling"})
    tpot = pd.DataFrame({"rate": [published["tpot_qps"]], "mean_tpot_ms": [published["mean_tpot_ms"]],
                         "what": ["published"]})
    panels = []
    for col, ref in (("mean_ttft_ms", ceiling), ("mean_tpot_ms", tpot)):
        y = alt.Y(f"{col}:Q", title=title(col), scale=alt.Scale(zero=True))
        sim = alt.Chart(finite).mark_line(point=True).encode(
            x=x, y=y, color=color, tooltip=["lengths:N", "rate:Q", alt.Tooltip(f"{col}:Q", format=".1f")])
        if len(ref) > 1:
            mark = alt.Chart(ref).mark_line(color="black", strokeDash=[4, 3])
        else:
            mark = alt.Chart(ref).mark_point(shape="diamond", size=120, filled=True, color="black")
        text = alt.Chart(ref.tail(1)).mark_text(align="right", dx=-8, dy=-10).encode(x=x, y=y, text="what:N")
        panels.append(alt.layer(sim, mark.encode(x=x, y=y), text).properties(width=width, height=height))
    return alt.hconcat(*panels)


# --- 11_fact_check ---
def tradeoff_chart(trade: pd.DataFrame, width: int = 420, height: int = 260):
    """The newcomer's TTFT against the decoders' tallest gap, one point per token budget (notebook 11).

    Parameters
    ----------
    trade : DataFrame
        :func:`batchlab.experiments.chunking_tradeoff`: ``max_num_batched_tokens``, ``log2_budget`` (an
        evenly spaced grid), ``ttft_ms``, ``max_itl_ms``, ``base_itl_ms`` (ms), ``chunks``.

    Returns
    -------
    altair chart; a slider over log2 of the budget rings the chosen point and reads its numbers; the decoders'
    cadence before the prompt arrived is a dashed rule.
    """
    param, at = grid_param("log2_budget", trade["log2_budget"], "max_num_batched_tokens = 2^",
                           value=float(trade["log2_budget"].max()))
    x = alt.X("ttft_ms:Q", title="newcomer's ttft (ms)", scale=alt.Scale(zero=False))
    y = alt.Y("max_itl_ms:Q", title="tallest decoder gap (ms)", scale=alt.Scale(zero=True))
    base = alt.Chart(trade).encode(x=x, y=y)
    tooltip = ["max_num_batched_tokens:Q", "chunks:Q", alt.Tooltip("ttft_ms:Q", format=".0f"),
               alt.Tooltip("max_itl_ms:Q", format=".0f")]
    cadence = alt.Chart(pd.DataFrame({"max_itl_ms": [float(trade["base_itl_ms"].median())],
                                      "text": ["decode cadence before the prompt arrived"]}))
    picked = base.transform_filter(at).transform_calculate(label=(
        "format(datum.max_num_batched_tokens, ',') + ' tokens: ' + datum.chunks + ' chunk(s), ttft '"
        " + format(datum.ttft_ms, ',.0f') + ' ms, gap ' + format(datum.max_itl_ms, ',.0f') + ' ms'"))
    return alt.layer(
        base.mark_line(point=True, color=PALETTE[0]).encode(order="max_num_batched_tokens:Q", tooltip=tooltip),
        base.mark_text(align="left", dx=7, dy=-7, color="#555555").encode(text=alt.Text("max_num_batched_tokens:Q", format=",")),
        cadence.mark_rule(color="#888888", strokeDash=[4, 3]).encode(y="max_itl_ms:Q"),
        cadence.mark_text(align="left", baseline="bottom", dy=-3, color="#555555").encode(
            x=alt.value(4), y="max_itl_ms:Q", text="text:N"),
        picked.mark_point(size=260, filled=False, color="black", strokeWidth=2),
        picked.mark_text(align="right", baseline="top", fontWeight="bold").encode(
            x=alt.value(width), y=alt.value(4), text="label:N"),
    ).properties(width=width, height=height).add_params(param)
