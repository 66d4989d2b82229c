"""Chapter 8, the two knobs: ``max_num_seqs`` and ``max_num_batched_tokens`` swept together.

:func:`two_knob_sweep` runs every pair under ``chunked`` at several request rates, expressed against the
server's capacity (:func:`saturation_rate`), except the pairs vLLM refuses to start with, which it keeps as
rows without numbers. The frontier comes from :func:`batchlab.sweep.with_frontier`, where p99 TTFT stops
improving from :func:`batchlab.sweep.seqs_plateau`. :func:`default_vs_pick` reads the sweep per rate: vLLM's
default beside the pair with the lowest p99 ITL at as good a p99 TTFT and the same throughput.
:func:`two_knobs_chart` draws every operating point behind two sliders (one per knob) and a rate selector that
shows one rate's runs alone or every load together, the trail of pairs the sliders have visited, and the grid
of pairs with the refused ones crossed out. :func:`runs_table` and :func:`vllm_defaults_style` format the
tables (durations through :func:`batchlab.viz.format_duration`, the book's one rule).

The end of the module registers the facts other pages glue (:mod:`batchlab.chapters.facts`): the conversation
scene's capacity, its four loads, its mean lengths, vLLM's KV pool and default knobs, the plateau of
``max_num_seqs``, the default and the pick at the near load, and what the overloaded default run holds.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..hardware import get_hardware
from ..sim import simulate
from ..vllm import vllm_defaults
from ..sweep import seqs_plateau, sweep, with_frontier
from ..workload import preset
from . import facts, scenes

# The chapter's grid: powers of two and the halfway steps between them (1.5 x a power of two), so that each
# slider moves through 15 and 11 positions; encoded as their index, an evenly spaced grid for a slider.
MAX_NUM_SEQS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
MAX_NUM_BATCHED_TOKENS = (512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
SAME_THROUGHPUT = 0.01  # throughputs (and p99 ITLs) within 1% count as equal
PLATEAU = 0.05  # a p99 TTFT within 5% of another counts as as good
CONV_LOADS = {"light": 0.5, "moderate": 0.8, "near": 0.95, "over": 1.2}  # the conv scene's rates, x capacity

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


def saturation_rate(cost, workload: str, n_requests: int, *, seed=0, **knobs) -> float:
    """Requests/s the server completes when every request of a real-trace preset is queued at time 0.

    The capacity that request rates are expressed against: ``request_throughput`` of one ``chunked`` run of
    ``preset(workload, n_requests, rate_req_s=inf, seed=seed)`` with ``knobs`` (vLLM's defaults for the GPU if
    none). The drain at the end of the run, when fewer requests are left than the batch holds, is included,
    so this is slightly below the steady-state capacity. Used in chapters 8, 9 and 12.

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


@facts.memo
def two_knob_sweep(cost, workload: str, rates_req_s, max_num_seqs, max_num_batched_tokens, *,
                   n_requests: int = 3000, seed=0, executor=None) -> pd.DataFrame:
    """Every (``max_num_seqs``, ``max_num_batched_tokens``) pair under ``chunked`` at every request rate.

    Each rate replays ``preset(workload, n_requests, rate_req_s, seed)``; with one seed the prompt and output
    lengths are the same at every rate and the arrival gaps only scale (common random numbers). A pair with
    ``max_num_batched_tokens < max_num_seqs`` is not simulated: vLLM's ``SchedulerConfig`` refuses to start with
    it (and :func:`batchlab.simulate` raises), so its row has no numbers. Results are cached
    (:func:`batchlab.chapters.facts.memo`). Used in chapters 8 and 12.

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


def default_vs_pick(df: pd.DataFrame, defaults: dict, *, same: float = SAME_THROUGHPUT, ttft_tol: float = PLATEAU,
                    x: str = "output_throughput", ttft: str = "p99_ttft_ms", itl: str = "p99_itl_ms",
                    also=("p99_tpot_ms",)) -> pd.DataFrame:
    """Per rate, vLLM's default beside the pair we would pick instead, read at that rate alone.

    The pick is, among the pairs vLLM accepts at the same rate that deliver the default's throughput (at least
    ``1 - same`` of it) with as good a p99 TTFT (at most ``1 + ttft_tol`` times the default's), the one with
    the lowest p99 ITL; p99 ITLs within ``same`` of the lowest tie, and of tied pairs the one nearest vLLM's
    default wins (the fewest halvings or doublings of the two knobs), so a knob the traffic never presses stays
    where vLLM puts it. The default is always a candidate, so the pick's p99 ITL is never above the default's.
    Used in chapter 8 (and its facts, which chapter 9, the cheat sheet and the intro glue).

    Parameters
    ----------
    df : DataFrame
        A two-knob sweep (:func:`two_knob_sweep`).
    defaults : dict
        ``max_num_seqs`` and ``max_num_batched_tokens`` of vLLM's default (:func:`batchlab.vllm_defaults`).
    same, ttft_tol : float
        Relative tolerances (0 to 1) on throughput and p99 ITL, and on p99 TTFT.
    x, ttft, itl : str
        Throughput (tok/s) and the two latencies (ms).
    also : sequence of str
        Further columns reported for both.

    Returns
    -------
    DataFrame
        One row per rate: ``rate_req_s``; ``default_<col>`` and ``pick_<col>`` for ``x``, ``ttft``, ``itl`` and
        ``also``; ``pick_max_num_seqs``, ``pick_max_num_batched_tokens``; ``lowest_<ttft>`` (the lowest p99 TTFT
        at the default's throughput and rate) and ``itl_ratio`` (the default's p99 ITL over the pick's).
    """
    if not (0 <= same < 1 and 0 <= ttft_tol < 1):
        raise ValueError(f"same and ttft_tol must be in [0, 1), got {same!r} and {ttft_tol!r}")
    ok = df[~df["vllm_refuses"]]
    cols = list(dict.fromkeys([x, ttft, itl, *also]))
    steps = sum(np.abs(np.log2(ok[k] / defaults[k])) for k in ("max_num_seqs", "max_num_batched_tokens"))
    rows = []
    for rate, g in ok.groupby("rate_req_s", sort=True):
        dflt = g[(g["max_num_seqs"] == defaults["max_num_seqs"])
                 & (g["max_num_batched_tokens"] == defaults["max_num_batched_tokens"])].iloc[0]
        peers = g[g[x] >= dflt[x] * (1 - same)]
        close = peers[peers[ttft] <= dflt[ttft] * (1 + ttft_tol)]
        tied = close[close[itl] <= close[itl].min() * (1 + same)]
        pick = tied.loc[steps[tied.index].idxmin()]
        rows.append({"rate_req_s": rate} | {f"default_{c}": float(dflt[c]) for c in cols}
                    | {f"pick_{k}": int(pick[k]) for k in ("max_num_seqs", "max_num_batched_tokens")}
                    | {f"pick_{c}": float(pick[c]) for c in cols} | {f"lowest_{ttft}": float(peers[ttft].min()),
                                                                      "itl_ratio": float(dflt[itl] / pick[itl])})
    return pd.DataFrame(rows)


def rates_phrase(rates, where) -> str:
    """Where a reading holds, in words: ``"at each of the three loads below capacity"``, ``"from 16.7 req/s on"``,
    ``"at 10.4 and 19.8 req/s"`` or ``"at none of the loads below capacity"``.

    ``rates`` are the loads considered (req/s), ``where`` a boolean per rate. Used in chapter 8, so that a
    sentence says exactly the loads at which it holds.
    """
    rates, where = np.asarray(rates, dtype=float), np.asarray(where, dtype=bool)
    if rates.shape != where.shape or rates.size == 0:
        raise ValueError(f"rates and where must be non-empty and of one length, got {rates.size} and {where.size}")
    order = np.argsort(rates)
    rates, where = rates[order], where[order]
    if where.all():
        count = {2: "both", 3: "each of the three", 4: "each of the four"}.get(rates.size, f"each of the {rates.size}")
        return f"at {count} loads below capacity" if rates.size > 1 else f"at {rates[0]:.1f} req/s"
    if not where.any():
        return "at none of the loads below capacity"
    first = int(np.argmax(where))
    if where[first:].all() and rates.size - first > 1:
        return f"from {rates[first]:.1f} req/s on"
    shown = [f"{r:.1f}" for r in rates[where]]
    return f"at {shown[0]} req/s" if len(shown) == 1 else f"at {', '.join(shown[:-1])} and {shown[-1]} req/s"


def vllm_defaults_table(gpus=("h100-sxm", "h200", "a100-80gb")) -> pd.DataFrame:
    """vLLM's default knobs per GPU (:func:`batchlab.vllm_defaults`): they depend on the GPU, not on the model.

    Used in chapters 8 and 12.

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


def runs_table(df: pd.DataFrame, columns: dict):
    """Rows of a sweep or of :func:`default_vs_pick`, with readable headers and units.

    ``columns`` maps a column to its header; columns ending in ``_knobs`` are text already, those ending in
    ``_ms`` read through :func:`batchlab.viz.format_duration` (``"refused"`` for a pair never run), rates
    with one decimal, ratios (``_ratio``) with one decimal and a ×, shares (``load``) as percentages, throughputs
    and knobs with thousands separators. Used in chapter 8. Returns a ``Styler`` without the index.
    """
    def fmt(col):
        if col.endswith("_knobs"):  # already words: "1,024 / 3,072"
            return str
        if col.endswith("_ms"):  # a number and its unit never split over two lines of a narrow column
            return lambda v: viz.format_duration(v, missing="refused").replace(" ", "\u00a0")
        if col.endswith("_ratio"):
            return "×{:.1f}".format
        return "{:.0%}".format if col == "load" else "{:.1f}".format if "rate_req_s" in col else "{:,.0f}".format

    return viz.display_table(df, {col: (header, fmt(col)) for col, header in columns.items()}, na_rep=None)


def knobs_text(max_num_seqs, max_num_batched_tokens) -> pd.Series:
    """Pairs as a reader reads them, ``"1,024 / 3,072"`` (sequences / tokens). Used in chapter 8's table."""
    seqs, tokens = pd.Series(max_num_seqs).astype(int), pd.Series(max_num_batched_tokens).astype(int)
    return seqs.map("{:,}".format) + " / " + tokens.map("{:,}".format).to_numpy()


def vllm_defaults_style(table: pd.DataFrame):
    """:func:`vllm_defaults_table` with the GPUs' names and headers in words and units (a ``Styler``).

    Used in chapter 8. ``table`` may be indexed by ``gpu``.
    """
    table = table if "gpu" in table.columns else table.reset_index()
    shown = table.assign(gpu=table["gpu"].map(lambda g: viz.GPU_NAMES.get(g, g)))
    count = "{:,.0f}".format
    # one column per knob, so the long knob names sit in two headers and the table fits the book's column
    shown["budgets"] = [f"{serve:,} / {offline:,}" for serve, offline in zip(
        table["max_num_batched_tokens_serve"], table["max_num_batched_tokens_offline"])]
    return viz.display_table(shown, {
        "gpu": ("GPU", str), "hbm_gib": ("HBM (GiB)", "{:.0f}".format),
        "max_num_seqs": ("max_num_seqs (sequences)", count),
        "budgets": ("max_num_batched_tokens (tokens): vllm serve / offline LLM", str)})


# -- the chart ----------------------------------------------------------------------------------------------
def _knob_points(df, defaults, offline_tokens, x, y, y2):
    """The chart's data: every run with the index of each knob and of its rate, and its kind; and the default
    configurations' runs."""
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
    if all(c in df.columns for c in (x, y, y2)) and (~df["vllm_refuses"]).any():
        # The pick of default_vs_pick at each rate (the page's table): its pair, marked at its rate only.
        picks = default_vs_pick(df, defaults, x=x, ttft=y, itl=y2, also=())
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


def two_knobs_chart(df: pd.DataFrame, defaults: dict, offline_tokens: int | None = None, rate_req_s=None,
                    x: str = "output_throughput", y: str = "p99_ttft_ms", y2: str = "p99_itl_ms"):
    """Every operating point of a two-knob sweep, vLLM's defaults, the chosen pair and its trail, per rate or all.

    Used in chapter 8.

    Parameters
    ----------
    df : DataFrame
        :func:`two_knob_sweep` with a boolean ``frontier`` column (:func:`batchlab.sweep.with_frontier`):
        ``rate_req_s`` (req/s), ``max_num_seqs``, ``max_num_batched_tokens``, ``vllm_refuses``, ``x``, ``y``,
        ``y2`` (and ``p99_tpot_ms``, for the tooltip, if present).
    defaults : dict
        vLLM's ``vllm serve`` defaults (:func:`batchlab.vllm_defaults`): the knobs selected at first and a
        marked point.
    offline_tokens : int, optional
        ``max_num_batched_tokens`` of the offline default (same ``max_num_seqs``), marked too.
    rate_req_s : float, optional
        The rate selected at first (req/s; default: every load together).
    x, y, y2 : str
        Throughput (tok/s) and the two latencies (ms): ``y`` in the top panel with the frontier, ``y2`` below.

    Returns
    -------
    altair chart: a slider per knob (its positions the grid's values, shown in sequences and tokens) and radio
    buttons for the rate, one per rate and one for every load. One rate shows that rate's runs alone, on a
    latency axis fitted to them (log, labelled in ms and s); every load shows all of them with the frontier
    through them. The throughput axis is the same in both, so at one rate below capacity the runs that keep up
    stand in one column and the sliders move the green point up and down. The readout above reads the chosen
    pair at the selected rate (or at each rate), durations in ms below a second and in s from there
    (:func:`batchlab.viz.duration_text`); every pair picked before stays as a faded green ring (the selection
    ``visited``; clicking a run adds or removes it). The grid at the bottom shows every pair at the selected
    rate(s): black where it is on the frontier, a cross where vLLM refuses it; a triangle marks the pick of
    :func:`default_vs_pick` at each rate (the lowest p99 ITL at as good a p99 TTFT as the default), in every
    panel. Each latency axis starts and ends on a labelled tick around the runs shown.
    """
    data, marks = _knob_points(df, defaults, offline_tokens, x, y, y2)
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


# -- the conversation scene's sweep, and the facts other pages glue (batchlab.chapters.facts) ------------------
@facts.memo
def _capacity(cost, workload: str, n_requests: int, seed) -> float:
    return saturation_rate(cost, workload, n_requests, seed=seed)


def scene_capacity(name: str) -> float:
    """A scene's capacity (req/s): every request queued at time 0, vLLM's defaults (:func:`saturation_rate`).
    Used in chapters 8 and 9."""
    s = scenes.scene(name)
    return _capacity(s.cost(), s.workload, s.n_requests, s.seed)


def conv_capacity() -> float:
    """The conv scene's capacity (req/s), :func:`scene_capacity`."""
    return scene_capacity("conv")


def conv_rates() -> dict:
    """The conv scene's request rates by name (:data:`CONV_LOADS` times its capacity, to 0.1 req/s)."""
    cap = conv_capacity()
    return {name: round(share * cap, 1) for name, share in CONV_LOADS.items()}


def conv_sweep() -> pd.DataFrame:
    """The chapter's sweep: the conv scene at its four loads over :data:`MAX_NUM_SEQS` x
    :data:`MAX_NUM_BATCHED_TOKENS`, with the frontier (throughputs within :data:`SAME_THROUGHPUT` equal). Cached."""
    s = scenes.scene("conv")
    df = two_knob_sweep(s.cost(), s.workload, list(conv_rates().values()), list(MAX_NUM_SEQS),
                        list(MAX_NUM_BATCHED_TOKENS), n_requests=s.n_requests, seed=s.seed)
    return with_frontier(df, rel_tol=SAME_THROUGHPUT)


def conv_picks() -> pd.DataFrame:
    """:func:`default_vs_pick` of :func:`conv_sweep` against vLLM's defaults on the scene's GPU, by rate."""
    s = scenes.scene("conv")
    return default_vs_pick(conv_sweep(), vllm_defaults(get_hardware(s.gpu))).set_index("rate_req_s")


def conv_plateau() -> pd.Series:
    """Per rate (req/s), the smallest ``max_num_seqs`` whose p99 TTFT is within :data:`PLATEAU` of the best at
    vLLM's default budget (:func:`batchlab.sweep.seqs_plateau` of :func:`conv_sweep`)."""
    df = conv_sweep()
    budget = vllm_defaults(get_hardware(scenes.scene("conv").gpu))["max_num_batched_tokens"]
    plateau = seqs_plateau(df[~df["vllm_refuses"]], tol=PLATEAU)
    return plateau[plateau["max_num_batched_tokens"] == budget].set_index("rate_req_s")["max_num_seqs"]


@facts.memo
def _overload_run(cost, workload: str, n_requests: int, rate_req_s: float, seed) -> dict:
    res = simulate(preset(workload, n_requests, rate_req_s=rate_req_s, seed=seed), "chunked", cost)
    return {"peak_running": int(res.steps["running"].max()), "preemptions": int(res.summary()["preemptions"]),
            "kv_tokens": int((res.knobs["num_kv_blocks"] - 1) * res.knobs["block_size"])}


def conv_overload() -> dict:
    """The conv scene at its overload rate with vLLM's defaults: ``peak_running`` (sequences), ``preemptions``
    and ``kv_tokens`` (the KV pool less vLLM's null block, tokens)."""
    s = scenes.scene("conv")
    return _overload_run(s.cost(), s.workload, s.n_requests, conv_rates()["over"], s.seed)


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


@facts.fact("conv_over_context", scene="conv", unit="requests", fmt=",d", chapter="two_knobs",
            text="the conversation scene's requests whose prompt does not fit Llama-3-8B's 8,192-token context: "
                 "vLLM rejects them")
def _over_context():
    return int(scenes.scene("conv").n_requests - len(scenes.scene("conv").requests(fit_context=True).arrival_s))


@facts.fact("conv_fit_prompt_mean", scene="conv", unit="tokens", fmt=",.0f", chapter="two_knobs",
            text="the mean prompt of the conversation scene's requests that fit the context, the stream every "
                 "policy gets where Orca's policies are compared with vLLM's")
def _fit_prompt_mean():
    return float(scenes.scene("conv").requests(fit_context=True).prompt_tokens.mean())


@facts.fact("conv_output_mean", scene="conv", unit="tokens", fmt=",.0f", chapter="two_knobs",
            text="the mean output the conversation scene's requests ask for")
def _output_mean():
    return float(scenes.scene("conv").requests().output_tokens.mean())


@facts.fact("kv_pool_tokens", scene="llama8", unit="tokens", fmt=",.0f", chapter="two_knobs",
            text="the KV pool vLLM gives Llama-3-8B BF16 on one H100 SXM with its defaults, in tokens (the null "
                 "block left out)")
def _kv_pool_tokens():
    return int((scenes.scene("llama8").cost().kv_pool_blocks() - 1) * 16)


def _h100_default(key: str, usage: str = "serve") -> int:
    return int(vllm_defaults(get_hardware(scenes.scene("llama8").gpu), usage)[key])


@facts.fact("vllm_default_max_num_seqs", scene="llama8", unit="sequences", fmt=",.0f", chapter="two_knobs",
            text="vLLM's default max_num_seqs for vllm serve on an H100 SXM (any model)")
def _default_seqs():
    return _h100_default("max_num_seqs")


@facts.fact("vllm_default_max_num_batched_tokens", scene="llama8", unit="tokens", fmt=",.0f", chapter="two_knobs",
            text="vLLM's default max_num_batched_tokens for vllm serve on an H100 SXM (any model)")
def _default_tokens():
    return _h100_default("max_num_batched_tokens")


@facts.fact("vllm_offline_max_num_batched_tokens", scene="llama8", unit="tokens", fmt=",.0f", chapter="two_knobs",
            text="vLLM's default max_num_batched_tokens for the offline LLM class on an H100 SXM")
def _offline_tokens():
    return _h100_default("max_num_batched_tokens", "offline")


@facts.fact("knobs_plateau_seqs", scene="conv", unit="sequences", fmt=",.0f", chapter="two_knobs",
            text="at the conversation scene's near load and vLLM's default budget, the smallest max_num_seqs of "
                 "the sweep whose p99 TTFT is within 5% of the best: where raising the cap stops paying")
def _plateau_seqs():
    return int(conv_plateau().loc[conv_rates()["near"]])


def _near_fact(name: str, column: str, unit: str, fmt: str, text: str):
    @facts.fact(f"knobs_{name}", scene="conv", unit=unit, fmt=fmt, chapter="two_knobs",
                text=f"{text}, at the conversation scene's near load (95% of capacity)")
    def _near():
        value = conv_picks().loc[conv_rates()["near"], column]
        return int(value) if column.endswith(("_seqs", "_tokens")) else float(value)


for _args in (("default_p99_ttft_ms", "default_p99_ttft_ms", "ms", ",.0f", "p99 TTFT of vLLM's default knobs"),
              ("default_p99_itl_ms", "default_p99_itl_ms", "ms", ",.0f", "p99 ITL of vLLM's default knobs"),
              ("default_p99_tpot_ms", "default_p99_tpot_ms", "ms", ".1f", "p99 TPOT of vLLM's default knobs"),
              ("pick_max_num_seqs", "pick_max_num_seqs", "sequences", ",.0f",
               "max_num_seqs of the pair chapter 8 picks: the lowest p99 ITL at as good a p99 TTFT as the default's"),
              ("pick_max_num_batched_tokens", "pick_max_num_batched_tokens", "tokens", ",.0f",
               "max_num_batched_tokens of the pair chapter 8 picks"),
              ("pick_p99_ttft_ms", "pick_p99_ttft_ms", "ms", ",.0f", "p99 TTFT of the pair chapter 8 picks"),
              ("pick_p99_itl_ms", "pick_p99_itl_ms", "ms", ",.0f", "p99 ITL of the pair chapter 8 picks"),
              ("pick_p99_tpot_ms", "pick_p99_tpot_ms", "ms", ".1f", "p99 TPOT of the pair chapter 8 picks"),
              ("itl_ratio", "itl_ratio", "", ".1f", "the default's p99 ITL over that of the pair chapter 8 picks")):
    _near_fact(*_args)


@facts.fact("knobs_over_default_p99_itl_ms", scene="conv", unit="ms", fmt=",.0f", chapter="two_knobs",
            text="p99 ITL of vLLM's default knobs at the conversation scene's overload rate (120% of capacity)")
def _over_default_itl():
    return float(conv_picks().loc[conv_rates()["over"], "default_p99_itl_ms"])


@facts.fact("over_peak_running", scene="conv", unit="sequences", fmt=",.0f", chapter="two_knobs",
            text="the most sequences running at once with vLLM's defaults at the conversation scene's overload "
                 "rate (120% of capacity): the KV pool, not max_num_seqs, caps the batch")
def _peak_running():
    return conv_overload()["peak_running"]


@facts.fact("over_preemptions", scene="conv", unit="preemptions", fmt=",.0f", chapter="two_knobs",
            text="preemptions in the run of vLLM's defaults at the conversation scene's overload rate")
def _preemptions():
    return conv_overload()["preemptions"]
