"""Charts for the book: one Altair theme, an offline renderer, tidy-frame helpers and controls the chapters share.

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

import decimal
import functools
import itertools
import json
import math
import os
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd

THEME = "batchlab"
CHART_ID_PREFIX = "batchlab-chart-"
CHART_CLASS = "batchlab-chart"  # the book's CSS (book/_ext/vega_offline.py) shrinks these to the text column
# Altair's own "application/vnd.vegalite.v6.json" is not a JSON mimetype to nbformat (no "+json"): a dict under
# it makes the notebook invalid, so only the "+json" spelling is sent.
VEGALITE_MIME = "application/vnd.vegalite.v6+json"
BOOK_ENV = "BATCHLAB_BOOK"  # "1" while the book builds: its pages load the library themselves
EMBED_OPTIONS = {"actions": False, "renderer": "svg", "mode": "vega-lite"}
MAX_ROWS = 50_000  # data is inlined in the page; the ITL timelines are the largest tables
MAX_RADIO_OPTIONS = 8  # a labelled grid control: radio buttons up to this many values, a select box beyond

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
    "start_s": "start (s)",
    "end_s": "end (s)",
    "running": "running sequences",
    "itl_ms": "inter-token latency (ms)",
    "rate_req_s": "request rate (req/s)",
    "decode_seqs": "decode sequences",
    "prefill_tokens": "prompt tokens in the step",
    "duration_s": "step time (s)",
    "pool_gib": "KV pool (GiB)",
    "output_throughput": "output throughput (tok/s)",
    "total_token_throughput": "total throughput (tok/s)",
    "request_throughput": "request throughput (req/s)",
    "max_num_seqs": "max_num_seqs (sequences)",
    "max_num_batched_tokens": "max_num_batched_tokens (tokens)",
}


# The presets' names as a reader writes them (tables and legends); code keeps the preset keys.
GPU_NAMES = {"h100-sxm": "H100 SXM", "h100-pcie": "H100 PCIe", "h200": "H200", "a100-80gb": "A100 80GB"}
MODEL_NAMES = {"llama-3-8b": "Llama-3-8B", "llama-3-70b": "Llama-3-70B", "llama-2-7b": "Llama-2-7B",
               "llama-2-70b": "Llama-2-70B", "mistral-7b": "Mistral-7B", "llama-3.1-8b": "Llama-3.1-8B",
               "llama-3.1-70b": "Llama-3.1-70B", "codellama-34b": "CodeLlama-34B", "qwen3-32b": "Qwen3-32B"}


_ACRONYMS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "end-to-end latency", "kv": "KV", "gpu": "GPU",
             "gib": "GiB", "req": "req", "p99": "p99", "p90": "p90", "mfu": "MFU", "slo": "SLO", "cv": "CV"}
_UNITS = (("_req_s", "req/s"), ("_tok_s", "tok/s"), ("_ms", "ms"), ("_us", "µs"), ("_s", "s"), ("_tokens", "tokens"),
          ("_gib", "GiB"), ("_gb", "GB"))


def title(column: str) -> str:
    """A column as a reader reads it, in words with its unit: from :data:`TITLES`, else spelt out from its name
    (``p99_ttft_ms`` -> "p99 TTFT (ms)", ``rate_req_s`` -> "rate (req/s)"). Axis titles and tooltips use it."""
    if column in TITLES:
        return TITLES[column]
    for suffix, unit in _UNITS:
        if column.endswith(suffix) and len(column) > len(suffix):
            return f"{_words(column[: -len(suffix)])} ({unit})"
    return _words(column)


def _words(name: str) -> str:
    return " ".join(_ACRONYMS.get(w, w) for w in name.split("_"))


def tip(field: str, title_: str | None = None, fmt: str | None = None, kind: str = "Q"):
    """A tooltip field titled in words with its unit (:func:`title` unless ``title_``), formatted (``fmt``: d3)."""
    kw = {"title": title_ or title(field)}
    if fmt is not None:
        kw["format"] = fmt
    return alt.Tooltip(f"{field}:{kind}", **kw)


# -- durations: one rule for the whole book, a Python twin and a Vega twin --------------------------------------
# Three significant digits, milliseconds below one second, seconds from one second: "0.42 ms", "4.48 ms",
# "36.4 ms", "412 ms", "1.87 s", "11.1 s", "468 s", "1,107 s". The unit follows the value as printed: anything that
# rounds to 1,000 ms (from 999.5 ms) reads "1.00 s", and from 999.5 s the seconds are whole and thousands
# separated ("1,000 s"), never "1.00e+3". Below one millisecond two decimals ("0.42 ms", not "0.420 ms": ten
# microseconds is finer than any duration the book reads). Zero reads "0 ms"; a missing value (None, NaN, ±inf)
# reads ``missing``. Ties round half away from zero on the exact binary value, as d3-format (Vega's ``format``)
# does through ``toExponential``/``toFixed``, so both twins print the same string for the same double.
DURATION_MISSING = "–"


def _decimal_text(value: float, spec: str) -> str:
    """``format(value, spec)`` on the exact binary value, ties away from zero (as JavaScript's ``toFixed``)."""
    with decimal.localcontext() as ctx:
        ctx.rounding = decimal.ROUND_HALF_UP
        return format(decimal.Decimal(value), spec)


def _three_digits(value: float) -> str:
    """d3-format's ``.3r``: three significant digits, trailing zeros kept, never an exponent (|value| >= 1)."""
    exponent = int(_decimal_text(value, ".2e").rsplit("e", 1)[1])  # after rounding: 9.9996 -> 1.00e+1
    return _decimal_text(value, f".{max(0, 2 - exponent)}f")


def format_duration(value, unit: str = "ms", missing: str = DURATION_MISSING) -> str:
    """A duration as the book prints it everywhere: ``"412 ms"``, ``"1.87 s"``, ``"1,107 s"`` (the rule above).

    The Python twin of :func:`duration_text`: both print the same string for the same value
    (``tests/test_durations.py`` checks them against each other in Chromium). For tables, verdicts and glued
    text of every chapter.

    Parameters
    ----------
    value : float or None
        The duration, in ``unit``.
    unit : {"ms", "s"}
        The unit of ``value``.
    missing : str
        Printed for None, NaN and ±inf (chapter 8's tables pass ``"refused"``).
    """
    if unit not in ("ms", "s"):
        raise ValueError(f"format_duration: unit must be 'ms' or 's', not {unit!r}")
    try:
        ms = float(value) * 1000 if unit == "s" else float(value)
    except (TypeError, ValueError):
        return missing
    if not math.isfinite(ms):
        return missing
    if ms == 0:
        return "0 ms"
    if abs(ms) < 1:
        text = _decimal_text(ms, ".2f") + " ms"
    elif abs(ms) < 999.5:
        text = _three_digits(ms) + " ms"
    elif abs(ms / 1000) < 999.5:
        text = _three_digits(ms / 1000) + " s"
    else:
        text = _decimal_text(ms / 1000, ",.0f") + " s"
    return text.replace("-", "\u2212")  # d3-format's minus sign


def duration_text(field: str, unit: str = "ms", missing: str = DURATION_MISSING) -> str:
    """A Vega expression reading a duration field (in ``unit``: "ms" or "s") as :func:`format_duration` prints
    it: ``"4.48 ms"``, ``"213 ms"``, ``"1.87 s"``, ``"470 s"``; ``missing`` where there is none. For tooltips,
    readouts and labels of every chapter (not for axis ticks, whose unit is in the axis title)."""
    if unit not in ("ms", "s"):
        raise ValueError(f"duration_text: unit must be 'ms' or 's', not {unit!r}")
    ms = f"datum['{field}']" + (" * 1000" if unit == "s" else "")
    return (f"!isFinite({ms}) ? {json.dumps(missing, ensure_ascii=False)} : {ms} == 0 ? '0 ms' : "
            f"abs({ms}) < 1 ? format({ms}, '.2f') + ' ms' : abs({ms}) < 999.5 ? format({ms}, '.3r') + ' ms' : "
            f"abs({ms} / 1000) < 999.5 ? format({ms} / 1000, '.3r') + ' s' : format({ms} / 1000, ',.0f') + ' s'")


def round_duration(values, unit: str = "ms") -> np.ndarray:
    """Durations (in ``unit``) rounded to the digits :func:`format_duration` and :func:`duration_text` print, in
    the same unit (249.496 ms -> 249, 8,987.2 ms -> 8,990, 468,317 ms -> 468,000); missing values become NaN.

    For chart data inlined in a page: a chart whose data holds no more digits than its readout prints, and whose
    readout then prints what the table beside it says. Used by chapter 8's chart."""
    out = []
    for v in np.asarray(values, dtype=float).ravel():
        text = format_duration(v, unit, missing="")
        if not text:
            out.append(np.nan)
            continue
        number, shown = text.replace("\u2212", "-").replace(",", "").split(" ")
        ms = decimal.Decimal(number) * (1000 if shown == "s" else 1)  # exact: "1.87 s" is 1,870 ms, not 1,870.0000002
        out.append(float(ms / 1000 if unit == "s" else ms))
    return np.array(out).reshape(np.shape(values))


# -- request rates: one rule, a Python twin and a Vega twin -----------------------------------------------------
# Two significant digits below 1 req/s ("0.050", "0.17", "0.0032"), one decimal from 1 up to 100 ("1.2", "8.3",
# "18.5"), whole and thousands separated from there ("120", "1,107"). The switch follows the value as printed:
# 0.996 reads "1.0" (as 1.0 does) and 99.96 reads "100", never "100.0". A rate of exactly zero reads "0", never
# "0.0" or "0.00", so no rate reads like a small positive one. A missing value (None, NaN, ±inf) reads ``missing``.
# The number carries no unit: headers and tooltip titles say "(req/s)". Ties round half away from zero on the
# exact binary value, as d3-format does (``toExponential``/``toFixed``), so both twins print the same string.
RATE_MISSING = "–"


def format_rate(value, missing: str = RATE_MISSING) -> str:
    """A request rate (req/s) as the book prints it: ``"0.050"``, ``"0.17"``, ``"8.3"``, ``"18.5"``, ``"0"``.

    The Python twin of :func:`rate_text` (``tests/test_rates.py`` checks them against each other in Chromium).
    For the tables, readouts and glued text of chapter 9 (goodputs, served and sustainable rates).

    Parameters
    ----------
    value : float or None
        The rate, in req/s.
    missing : str
        Printed for None, NaN and ±inf.
    """
    try:
        v = float(value)
    except (TypeError, ValueError):
        return missing
    if not math.isfinite(v):
        return missing
    if v == 0:
        return "0"
    if abs(v) < 1:
        exponent = int(_decimal_text(v, ".1e").rsplit("e", 1)[1])  # after rounding: 0.0996 -> 1.0e-1
        text = _decimal_text(v, f".{1 - exponent}f")
    elif abs(v) < 99.95:
        text = _decimal_text(v, ".1f")
    else:
        text = _decimal_text(v, ",.0f")
    return text.replace("-", "\u2212")  # d3-format's minus sign


def rate_text(field: str, missing: str = RATE_MISSING) -> str:
    """A Vega expression reading a request-rate field (req/s) as :func:`format_rate` prints it: ``"0.050"``,
    ``"8.3"``, ``"18.5"``, ``"0"``; ``missing`` where there is none. For tooltips, readouts and labels."""
    v = f"datum['{field}']"
    return (f"!isFinite({v}) ? {json.dumps(missing, ensure_ascii=False)} : {v} == 0 ? '0' : "
            f"abs({v}) < 1 ? format({v}, '.2r') : abs({v}) < 99.95 ? format({v}, '.1f') : format({v}, ',.0f')")


def round_rate(values) -> np.ndarray:
    """Request rates (req/s) rounded to the digits :func:`format_rate` and :func:`rate_text` print (0.04965 ->
    0.05, 18.466 -> 18.5, 0.0032 stays 0.0032); missing values become NaN. For chart data inlined in a page, so
    that its labels and tooltips print what the table beside it says."""
    out = []
    for v in np.asarray(values, dtype=float).ravel():
        text = format_rate(v, missing="")
        out.append(float(decimal.Decimal(text.replace("\u2212", "-").replace(",", ""))) if text else np.nan)
    return np.array(out).reshape(np.shape(values))


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
""" + (Path(__file__).with_name("viz.js")).read_text() + """
var waiting = window.batchlabCharts;
window.batchlabCharts = {push: function (draw) { draw(); }};
if (Array.isArray(waiting)) { waiting.forEach(function (draw) { draw(); }); }
"""

_DRAW = """(function () {
  var el = document.currentScript && document.currentScript.previousElementSibling;
  if (!el || el.id !== "%(id)s") { el = document.getElementById("%(id)s"); }
  var spec = %(spec)s;
  var draw = function () { window.batchlabDraw(el, spec, %(opts)s); };
  var queue = window.batchlabCharts;
  if (!queue && window.batchlabDraw) { draw(); } else { (window.batchlabCharts = queue || []).push(draw); }
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
    sliders = _slider_labels(spec)
    if sliders:
        spec = {**spec, "usermeta": {**spec.get("usermeta", {}), "sliderLabels": sliders}}
    html = (f'<div id="{chart_id}" class="{CHART_CLASS}"></div>\n<script type="text/javascript">'
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


# -- grids behind controls ----------------------------------------------------------------------------------
_SLIDER_LABELS: dict[tuple, dict] = {}  # (param, min, step, n) -> what its slider shows at each position


def grid_param(name: str, values, label: str | None = None, field: str | None = None, value=None, labels=None,
               control: str | None = None):
    """A parameter bound to a control over precomputed ``values``, and the filter that selects them.

    Parameters
    ----------
    name : str
        Parameter name (a JavaScript identifier).
    values : array-like of float
        The grid the data was computed on.
    label : str, optional
        Text beside the control, in words with the unit (defaults to ``name``).
    field : str, optional
        Column holding the grid value in the chart's data (defaults to ``name``).
    value : float, optional
        Initial value (defaults to the smallest; the grid value nearest it).
    labels : list of str or callable, optional
        What the reader sees for each grid value when the grid is an encoding (log2 of a budget, an index):
        one string per distinct value in ascending order of value, or a function from a value to its string.
        :func:`grid_labels` reads them from a frame. The parameter's value stays the grid value, so predicates
        on it are unchanged.
    control : {"slider", "radio", "select"}, optional
        Default: a slider wherever the grid is evenly spaced (in its encoding: log2 grids are), so that moving
        it feels continuous, its value shown in the reader's units (the labels: the page's runtime,
        ``batchlab/viz.js``, writes them beside the slider); otherwise radio buttons up to
        :data:`MAX_RADIO_OPTIONS` labelled values and a select box beyond. A single value gets no control.

    Returns
    -------
    param : altair.Parameter
        Add it with ``chart.add_params(param)``.
    predicate : str
        Vega expression true for rows at the selected grid value; use in ``transform_filter`` or ``alt.when``.
    """
    grid = np.unique(np.asarray(values, dtype=float))
    gaps = np.diff(grid)
    start = float(grid[0] if value is None else value)
    start = float(grid[np.abs(grid - start).argmin()])  # a control can only sit on a grid value
    shown = None
    if labels is not None and grid.size > 1:
        shown = [str(labels(v)) for v in grid.tolist()] if callable(labels) else [str(t) for t in labels]
        if len(shown) != grid.size:
            raise ValueError(f"labels: {len(shown)} given for {grid.size} grid values {grid.tolist()}")
    even = grid.size > 1 and bool(np.allclose(gaps, gaps[0]))
    if control is None:
        control = "slider" if even else "radio" if shown is not None and grid.size <= MAX_RADIO_OPTIONS else "select"
    if control not in ("slider", "radio", "select"):
        raise ValueError(f"control must be 'slider', 'radio' or 'select', got {control!r}")
    if grid.size <= 1:
        bind = alt.Undefined  # one value (a live explore cell): nothing to choose
    elif control == "slider":
        if not even:
            raise ValueError(f"a slider needs an evenly spaced grid (encode it as log2 or an index): {grid.tolist()}")
        bind = alt.binding_range(min=float(grid[0]), max=float(grid[-1]), step=float(gaps[0]), name=label or name)
        if shown is not None:
            _SLIDER_LABELS[(name, float(grid[0]), float(gaps[0]), grid.size)] = {
                "min": float(grid[0]), "step": float(gaps[0]), "labels": shown}
    elif control == "radio":
        bind = alt.binding_radio(options=grid.tolist(), labels=shown, name=label or name) if shown is not None \
            else alt.binding_radio(options=grid.tolist(), name=label or name)
    else:
        bind = alt.binding_select(options=grid.tolist(), labels=shown, name=label or name) if shown is not None \
            else alt.binding_select(options=grid.tolist(), name=label or name)
    tolerance = float(gaps.min() / 2) if grid.size > 1 else 0.5
    param = alt.param(name=name, value=start, bind=bind)
    return param, f"abs(datum['{field or name}'] - {name}) < {tolerance!r}"


def _slider_labels(spec: dict) -> dict:
    """The labels of every labelled slider bound in ``spec`` (:func:`grid_param`), for ``usermeta.sliderLabels``."""
    out = {}

    def walk(v):
        if isinstance(v, dict):
            bind = v.get("bind")
            if isinstance(bind, dict) and bind.get("input") == "range" and "name" in v:
                n = round((bind["max"] - bind["min"]) / bind["step"]) + 1
                found = _SLIDER_LABELS.get((v["name"], float(bind["min"]), float(bind["step"]), n))
                if found:
                    out[v["name"]] = found
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(spec.get("params", []))
    for key in ("vconcat", "hconcat", "concat", "layer"):
        walk([sub.get("params", []) for sub in spec.get(key, [])])
    return out


def disable_when(chart, param: str, expr: str, shown: str | None = None):
    """``chart`` with the control bound to ``param`` disabled (greyed, not movable) while the Vega expression
    ``expr`` is true, e.g. ``disable_when(chart, "log2_tokens", "!chunking")``: a control that does nothing in some
    state is disabled there. ``shown``, if given, replaces a labelled slider's value while it is disabled (say
    what the chart uses instead: "16,384, chunking off"), so the greyed slider never reads a setting the chart
    does not show. Returns the chart, with a parameter ``<param>_disabled`` and ``usermeta.disabledBy`` (and
    ``usermeta.disabledShown``), read by the page's runtime, ``batchlab/viz.js``."""
    flag = f"{param}_disabled"
    meta = chart.usermeta if isinstance(chart.usermeta, dict) else {}
    meta = {**meta, "disabledBy": {**meta.get("disabledBy", {}), param: flag}}
    if shown is not None:
        meta["disabledShown"] = {**meta.get("disabledShown", {}), param: str(shown)}
    return chart.add_params(alt.param(name=flag, expr=expr)).properties(usermeta=meta)


def grid_labels(frame: pd.DataFrame, grid: str, shown: str, fmt: str = "{:,}") -> list[str]:
    """Labels for :func:`grid_param`: ``frame[shown]`` formatted at each distinct ``frame[grid]``, ascending.

    For a grid that encodes a reader's value (``log2_tokens`` for ``max_num_batched_tokens``, ``context_index``
    for ``context``), so a control shows ``"2,048"`` rather than ``11``. Raises ``ValueError`` if one grid value
    maps to several shown values. Used by the charts of chapters 04, 06, 07, 08 and 14.
    """
    pairs = frame[[grid, shown]].drop_duplicates()
    if pairs[grid].duplicated().any():
        raise ValueError(f"grid_labels: some {grid} values map to several {shown} values")
    values = pairs.sort_values(grid)[shown].tolist()
    return [fmt.format(int(v) if isinstance(v, float) and v.is_integer() else v) for v in values]


# -- tables ---------------------------------------------------------------------------------------------------
def display_table(frame: pd.DataFrame, columns: dict, na_rep: str | None = "–"):
    """``frame``'s ``columns`` renamed and formatted for the page, the index hidden.

    Used by the tables of chapters 01 to 04, 06, 07 and 08.

    Parameters
    ----------
    frame : DataFrame
    columns : dict
        Column of ``frame`` -> (header the reader sees, with its unit; format string or callable), in display order.
    na_rep : str or None
        Shown for missing values (None: each column's format decides).

    Returns
    -------
    pandas.io.formats.style.Styler
    """
    shown = frame[list(columns)].rename(columns={c: header for c, (header, _) in columns.items()})
    formats = dict(columns.values())
    return shown.style.format(formats, na_rep=na_rep).hide(axis="index")


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


# -- controls and axes shared by chapters -------------------------------------------------------------------
def choice_param(name: str, options, label: str | None = None, field: str | None = None, value=None):
    """A parameter bound to a select box over string ``options``, and the filter for rows that match.

    Returns ``(param, predicate)`` like :func:`grid_param`; ``field`` defaults to ``name``.
    """
    options = [str(o) for o in options]
    param = alt.param(name=name, value=options[0] if value is None else value,
                      bind=alt.binding_select(options=options, name=label or name))
    return param, f"datum['{field or name}'] == {name}"


def log_ticks(values, scale: float = 1.0) -> list[float]:
    """Tick values 1, 2, 3, 5 x 10^k spanning ``values * scale``: log axes otherwise crowd their labels."""
    v = np.asarray(values, dtype=float) * scale
    v = v[np.isfinite(v) & (v > 0)]
    lo, hi = np.floor(np.log10(v.min())), np.ceil(np.log10(v.max()))
    ticks = [m * 10.0 ** k for k in np.arange(lo, hi + 1) for m in (1, 2, 3, 5)]
    inside = [t for t in ticks if v.min() / 1.5 <= t <= v.max() * 1.5]
    return [int(round(t)) if t >= 1 else float(f"{t:.12g}") for t in inside]


# Log axes spanning one to eight decades: label 1, 2 and 5 times a power of ten ("0.02", "5", "1e-4" below 0.001)
# and let the axis drop labels that would overlap.
_DECADE = "log(datum.value) / LN10"
_MANTISSA = f"datum.value / pow(10, floor({_DECADE} + 1e-9))"
LOG125_LABEL = (f"(abs({_MANTISSA} - 1) < 1e-6 || abs({_MANTISSA} - 2) < 1e-6 || abs({_MANTISSA} - 5) < 1e-6) ? "
                "(datum.value >= 0.001 ? format(datum.value, ',~g') : format(datum.value, '.0e')) : ''")


# -- a chart shared by chapters ------------------------------------------------------------------------------
def itl_timeline_chart(df: pd.DataFrame, color: str = "request"):
    """Every inter-token gap against the time its token was emitted (notebooks 05 and 06).

    Parameters
    ----------
    df : DataFrame
        ``time_s`` (s, each gap's later token), ``itl_ms`` (ms), ``request`` (chapter 6 passes
        :func:`batchlab.chapters.scenes.decoder_gaps`); extra columns go to the tooltip.
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
