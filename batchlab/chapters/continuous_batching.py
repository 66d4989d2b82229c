"""Chapter 03, continuous batching: one request stream under static, dynamic and iteration-level batching.

:func:`timeline_runs` gives the three policies the same number of slots, so they differ only in when a slot
can change hands; :func:`gantt_chart` draws every request's phases and :func:`occupancy_panels_chart` the
slots held against the rows that produced a token (:func:`batchlab.metrics.tokens_per_step`).
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..metrics import tokens_per_step
from ..sim import simulate
from ..workload import preset

# Times of day on the timelines, in seconds, as the page's prose states them ("ends at 12.03 s"): the tooltips'
# "from" and "to" and the last-end labels (a d3 and a Python format both).
SECONDS = ",.2f"
OCCUPANCY_COLORS = {"slots held": "#CC79A7", "rows generating": "#0072B2"}  # line, bars of the occupancy panels


def timeline_runs(cost, requests, *, slots: int = 4, max_queue_delay_s: float = 0.05) -> dict:
    """One request stream under static, dynamic and continuous batching with the same number of slots.

    ``slots`` is the batch size of the lockstep policies and ``max_num_seqs`` of continuous batching, so
    the three differ only in when a slot can change hands. Used in chapter 03.

    Parameters
    ----------
    cost : CostModel
    requests : Requests
    slots : int
        Sequences a batch holds at once.
    max_queue_delay_s : float
        Dynamic batching's timer (seconds).

    Returns
    -------
    dict
        ``{policy: SimResult}`` for "static", "dynamic" and "continuous", in that order.
    """
    knobs = {"static": {"batch_size": slots},
             "dynamic": {"batch_size": slots, "max_queue_delay_s": max_queue_delay_s},
             "continuous": {"max_num_seqs": slots}}
    return {policy: simulate(requests, policy, cost, **kw) for policy, kw in knobs.items()}


def timeline_summary(runs: dict) -> pd.DataFrame:
    """Per run of :func:`timeline_runs`: when the stream ends and how well the slots were used.

    Used in chapter 03.

    Parameters
    ----------
    runs : dict of label -> SimResult

    Returns
    -------
    DataFrame
        ``policy``, ``last_finish_s`` (s, the last request's last token), ``mean_e2el_s`` and ``mean_ttft_s``
        (s), ``mean_generating`` (rows producing a token, averaged over the time from the first arrival, a
        client's send, to the last finish, idle time counting as zero, the way to the engine included),
        ``held_share`` (share of occupied slot-time held by rows that had already finished) and ``iterations``.
    """
    rows = []
    for policy, res in runs.items():
        req, steps = res.requests, res.steps
        span = req["finish_s"].max() - req["arrival_s"].min()
        gen = tokens_per_step(res)
        slot_time = float((steps["running"] * steps["duration_s"]).sum())
        rows.append({"policy": policy, "last_finish_s": float(req["finish_s"].max()),
                     "mean_e2el_s": float(req["e2el_s"].mean()), "mean_ttft_s": float(req["ttft_s"].mean()),
                     "mean_generating": float((gen * steps["duration_s"]).sum() / span),
                     "held_share": 1.0 - float((gen * steps["duration_s"]).sum()) / slot_time,
                     "iterations": len(steps)})
    return pd.DataFrame(rows)


def last_finish_by_seed(cost, workload: str, n_requests: int, rate_req_s: float, seeds, *, slots: int = 4,
                        max_queue_delay_s: float = 0.05) -> pd.DataFrame:
    """When the last request of ``preset(workload, n_requests, rate_req_s, seed)`` ends under each policy.

    Checks that one stream's picture is not a lucky draw. Used in chapter 03.

    Parameters
    ----------
    cost : CostModel
    workload : str
        A :func:`batchlab.preset` name.
    n_requests : int
    rate_req_s : float
        Mean arrival rate (requests/s).
    seeds : iterable of int
    slots, max_queue_delay_s
        As :func:`timeline_runs`.

    Returns
    -------
    DataFrame
        Indexed by ``seed``; one column per policy of :func:`timeline_runs`: the last finish (s).
    """
    rows = {}
    for seed in seeds:
        runs = timeline_runs(cost, preset(workload, n_requests, rate_req_s=rate_req_s, seed=int(seed)), slots=slots,
                             max_queue_delay_s=max_queue_delay_s)
        rows[int(seed)] = {p: float(r.requests["finish_s"].max()) for p, r in runs.items()}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("seed")


def stream_table(requests):
    """The requests of a stream for the page, one row each: when its client sends it, prompt and output tokens.

    Used in chapter 03.

    Parameters
    ----------
    requests : Requests
    """
    df = requests.to_frame().rename_axis("request").reset_index()
    return viz.display_table(df, {"request": ("request", "{:d}"), "arrival_s": ("sent at (s)", "{:.2f}"),
                              "prompt_tokens": ("prompt (tokens)", "{:,d}"),
                              "output_tokens": ("output (tokens)", "{:,d}")})


def seed_check_table(check: pd.DataFrame):
    """:func:`last_finish_by_seed` summarised for the page: when the last request ends (s) under each policy,
    mean, fastest, median and slowest stream. Used in chapter 03.
    """
    stats = check.agg(["mean", "min", "median", "max"]).set_axis(
        ["mean", "fastest stream", "median", "slowest stream"]).rename_axis("last request ends (s)").reset_index()
    return viz.display_table(stats, {"last request ends (s)": ("last request ends (s)", "{}")}
                         | {p: (p, "{:.2f}") for p in check.columns})


def gantt_chart(df: pd.DataFrame, facet: str = "policy", highlight: bool = False, last_end: bool = False):
    """One row per request, bars for its waiting, prefill, decode and held phases; one panel per ``facet``.

    Used in chapter 03.

    Parameters
    ----------
    df : DataFrame
        :func:`batchlab.viz.gantt_frame` of one or more runs (concatenate them): ``request``, ``phase``,
        ``start_s``, ``end_s`` (seconds) and the ``facet`` column.
    facet : str
        Column that splits the panels (one per policy); ignored when absent.
    highlight : bool
        Add a slider over the request ids that dims every other request (-1: none dimmed).
    last_end : bool
        Mark when each panel's last request ends: a dashed rule, and its time in the panel's title above the bars
        ("static: the last request ends at 12.03 s"; without panels, in the time axis's title), where no bar
        can run into it whatever the chart's width. The panels share the time axis.

    Returns
    -------
    altair chart.
    """
    if highlight or last_end:
        return _gantt_layers(df, facet, highlight, last_end)
    bars = _gantt_bars(df).encode(**_gantt_encoding(facet if facet in df.columns else None))
    if facet not in df.columns:
        return bars
    return bars.properties(width=520, height=alt.Step(12)).facet(row=alt.Row(f"{facet}:N", title=None))


def _gantt_encoding(facet: str | None = None) -> dict:
    """The bars' channels; with panels, the tooltip names the bar's panel first (which policy's request 3)."""
    panel = [viz.tip(facet, facet, kind="N")] if facet else []
    return dict(x=alt.X("start_s:Q", title="time (s)"), x2="end_s:Q", y=alt.Y("request:O", title="request"),
                color=alt.Color("phase:N", title=None, legend=alt.Legend(orient="top"),
                                scale=alt.Scale(domain=list(viz.PHASES), range=list(viz.PHASE_COLORS))),
                tooltip=panel + [viz.tip("request", "request", kind="O"), viz.tip("phase", "phase", kind="N"),
                         viz.tip("start_s", "from (s)", SECONDS), viz.tip("end_s", "to (s)", SECONDS),
                         viz.tip("lasts", "lasts", kind="N")])


def _gantt_bars(df: pd.DataFrame | None = None):
    """The bars of :func:`gantt_chart`, each with how long its phase lasts for the tooltip, in words with its unit
    (ms below a second, seconds from there: :func:`batchlab.viz.duration_text`)."""
    chart = alt.Chart() if df is None else alt.Chart(df)
    return chart.transform_calculate(phase_s="datum.end_s - datum.start_s",
                                     lasts=viz.duration_text("phase_s", unit="s")).mark_bar()


def _gantt_layers(df: pd.DataFrame, facet: str, highlight: bool, last_end: bool):
    """:func:`gantt_chart` with a request-highlight select box (no request, or request 0, 1, ...) and/or the
    last end of each panel marked."""
    enc = _gantt_encoding(facet if facet in df.columns else None)
    params = []
    if highlight:
        ids = np.unique(df["request"])
        param, _ = viz.grid_param("request", np.arange(-1, ids.max() + 1), "highlight", value=-1,
                                  labels=lambda r: "no request" if r < 0 else f"request {r:.0f}")
        enc["opacity"] = alt.when("request < 0 || datum.request == request").then(alt.value(1.0)).otherwise(
            alt.value(0.2))
        params.append(param)
    faceted = facet in df.columns
    if last_end and not faceted:
        enc["x"] = alt.X("start_s:Q", title=f"time (s); the last request ends at {df['end_s'].max():{SECONDS}} s")
    layers = [_gantt_bars().encode(**enc)]
    if last_end:
        last = alt.Chart().transform_aggregate(last_s="max(end_s)")
        layers.append(last.mark_rule(color="black", strokeDash=[4, 3]).encode(x="last_s:Q"))
    chart = alt.layer(*layers, data=df)
    if faceted:
        order = list(pd.unique(df[facet]))
        header = alt.Header(labelOrient="top", labelAngle=0, labelAlign="left", labelAnchor="start",
                            labelFontSize=12, labelPadding=0)
        if last_end:
            ends = df.groupby(facet)["end_s"].max()
            words = "".join(f"datum.value == '{k}' ? ': the last request ends at {ends[k]:{SECONDS}} s' : "
                            for k in order)
            header = alt.Header(labelExpr=f"datum.value + ({words}'')", **header.to_dict())
        chart = chart.properties(width=520, height=alt.Step(12)).facet(
            row=alt.Row(f"{facet}:N", title=None, sort=order, header=header))
    return chart.add_params(*params) if params else chart


def occupancy_frame(res, label: str | None = None) -> pd.DataFrame:
    """Batch occupancy over time as step functions: slots held and rows that produced a token.

    Idle gaps between iterations are zeros. Used in chapter 03.

    Parameters
    ----------
    res : SimResult
    label : str, optional
        Names the run (default: its policy).

    Returns
    -------
    DataFrame
        One row per change: ``time_s`` (s), ``measure`` ("slots held": ``steps.running``, rows of a lockstep
        batch that finished included; "rows generating": rows whose token came out of that iteration),
        ``rows`` and ``policy``.
    """
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
    """Slots held (line) and rows generating a token (bars) over time, one panel per ``facet``.

    Used in chapter 03.

    Parameters
    ----------
    df : DataFrame
        :func:`occupancy_frame` of one or more runs, concatenated.
    facet : str
        Column splitting the panels.

    Returns
    -------
    altair chart; hovering anywhere in a panel shows that interval: when it starts and ends, the slots held and
    the rows generating.
    """
    wide = df.pivot_table(index=[facet, "time_s"], columns="measure", values="rows").reset_index()
    # each interval ends at the next change; a run's last change (everything released) has no length
    wide["end_s"] = wide.groupby(facet)["time_s"].shift(-1).fillna(wide["time_s"])
    x = alt.X("time_s:Q", title="time (s)")
    y = alt.Y("rows:Q", title="sequences", axis=alt.Axis(tickMinStep=1))
    color = alt.Color("measure:N", title=None, legend=alt.Legend(orient="top"),
                      scale=alt.Scale(domain=list(OCCUPANCY_COLORS), range=list(OCCUPANCY_COLORS.values())))
    tips = [viz.tip(facet, facet, kind="N"), viz.tip("time_s", "from (s)", SECONDS),
            viz.tip("end_s", "to (s)", SECONDS), viz.tip("held", "slots held (sequences)", "d"),
            viz.tip("generating", "rows generating (sequences)", "d")]
    base = alt.Chart().transform_calculate(held="datum['slots held']", generating="datum['rows generating']")
    long = base.transform_fold(list(OCCUPANCY_COLORS), as_=["measure", "rows"])
    generating = long.transform_filter("datum.measure == 'rows generating'").mark_rect(opacity=0.45).encode(
        x=x, x2="end_s:Q", y=y, y2=alt.datum(0), color=color)
    held = long.transform_filter("datum.measure == 'slots held'").mark_line(
        interpolate="step-after", strokeWidth=1.5).encode(x=x, y=y, color=color)
    # One invisible rect per interval, the height of the panel, on top: a hover anywhere reads the interval.
    hover = base.mark_rect(opacity=0).encode(x=x, x2="end_s:Q", y=alt.datum(0), y2=alt.value(0), tooltip=tips)
    return alt.layer(generating, held, hover, data=wide).properties(width=520, height=70).facet(
        row=alt.Row(f"{facet}:N", title=None, sort=list(pd.unique(df[facet]))))
