"""Chapter 02, dynamic batching: static, dynamic and iteration-level batching on one real-trace workload.

Every policy gets the same stream, the requests that fit the model's context
(:func:`batchlab.chapters.scenes.within_context`), so their capacities compare equal work.

:func:`policy_grid` runs the policies at a few arrival rates (and dynamic batching at each max queue delay);
:func:`load_delay_grid` does it over the page's grid of loads, shares of the scene's capacity, and
:func:`delay_load_chart` draws latency against the load and against the delay at the selected load.
:func:`engine_arrival_s` says when the engine sees each request, after the serving terms of the cost model (the
API server's tokenising and the request latency), so that an idle GPU can be told apart from a request still on
its way (:func:`batchlab.metrics.idle_while_queued_fraction`). The facts at the end (saturation throughputs, the
low-load comparison) come from the same cached runs as the page.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..metrics import full_batch_fraction, idle_while_queued_fraction, idle_while_waiting_fraction
from ..sim import simulate
from ..vllm import vllm_defaults
from ..workload import preset
from . import facts, scenes

LOCKSTEP_BATCH = 32  # rows of the static and dynamic batches the book compares
LOADS = (0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6,
         0.7, 0.8, 0.9)  # offered loads of the page, as shares of the conv scene's capacity (capacity_req_s)
DELAYS_MS = tuple(range(0, 1001, 50))  # dynamic batching's max queue delay grid (ms): the page's slider
TIMER_MS = 50  # the page's timer: the dynamic batching its tables and facts quote
LOW_LOAD, HIGH_LOAD = 0.01, 0.5  # the loads its table compares the four policies at (shares of capacity)
LATENCY_COLUMNS = ("mean_e2el_ms", "p99_e2el_ms", "mean_ttft_ms", "p99_ttft_ms")
POLICY_COLORS = {"static": "#D55E00", "dynamic": "#0072B2", "continuous": "#009E73", "chunked": "#CC79A7"}
POLICY_SHAPES = {"static": "square", "dynamic": "circle", "continuous": "triangle-up", "chunked": "diamond"}
POLICY_DASHES = {"static": [7, 3], "dynamic": [1, 0], "continuous": [1, 0], "chunked": [3, 3]}
LATENCY_LABELS = {"mean_e2el_ms": "mean end-to-end latency", "p99_e2el_ms": "p99 end-to-end latency",
                  "mean_ttft_ms": "mean TTFT", "p99_ttft_ms": "p99 TTFT"}
LATENCY_HEADERS = {"mean_e2el_ms": "mean end-to-end", "p99_e2el_ms": "p99 end-to-end",  # each cell has its unit
                   "mean_ttft_ms": "mean TTFT", "p99_ttft_ms": "p99 TTFT"}
USAGE_HEADERS = {"gpu_busy_fraction": "GPU busy", "idle_while_waiting_fraction": "GPU idle, a request sent",
                 "idle_while_queued_fraction": "GPU idle, a request at the engine",
                 "padding_fraction": "padded token slots", "full_batch_fraction": "batches leaving full"}


def engine_arrival_s(res) -> np.ndarray:
    """When the engine sees each request of a run (s): the API server tokenises them one at a time, in order,
    ``frontend_s_per_token`` per prompt token, then ``request_latency_s`` passes (the serving terms of
    :class:`batchlab.CostModel`), as the simulator timed it (``SimResult.requests["seen_s"]``). Used in chapters
    02 and 03.

    Parameters
    ----------
    res : SimResult

    Returns
    -------
    ndarray
        Seconds, one per request; NaN for a request rejected before the loop (it never reaches the engine).
    """
    return res.requests["seen_s"].to_numpy(dtype=float, copy=True)


def policy_grid(cost, workload: str, n_requests: int, rates_req_s, *, batch_size: int = 32, delays_s=(), seed=0,
                iteration=("continuous", "chunked")) -> pd.DataFrame:
    """One real-trace workload under static, dynamic (each delay) and iteration-level batching, at each rate.

    At every rate the stream is ``preset(workload, n_requests, rate_req_s, seed)`` cut to the requests that fit
    the model's context (:func:`batchlab.chapters.scenes.within_context`, what ``Scene.requests(rate,
    fit_context=True)`` gives): vLLM rejects a longer prompt, Orca's ``continuous`` would serve it and lockstep
    batches would pad every row to it, so without the cut the policies would not do the same work. Each rate
    has the same lengths and the same arrival pattern, compressed or stretched in time (common random numbers),
    so the rates differ only by load. Iteration-level policies run with vLLM's default ``max_num_seqs`` and
    ``max_num_batched_tokens`` for the GPU (:func:`batchlab.vllm_defaults`); a rate of ``inf`` puts every request
    at time 0, which measures a policy's saturation throughput as ``vllm bench throughput`` does. Used in
    chapters 02 and 12.

    Parameters
    ----------
    cost : CostModel
    workload : str
        A :func:`batchlab.preset` name, e.g. ``"azure-conv-2023"``.
    n_requests : int
        Requests drawn per stream, before the cut to the context.
    rates_req_s : sequence of float, or mapping of label -> float
        Mean arrival rates (requests/s; ``inf`` allowed). A mapping also fills a ``load`` column.
    batch_size : int
        Rows per lockstep batch (static, dynamic).
    delays_s : sequence of float
        ``max_queue_delay_s`` values for ``dynamic`` (seconds); empty: no dynamic runs.
    seed : int
    iteration : sequence of str
        Iteration-level policies to run (``continuous``, ``chunked``).

    Returns
    -------
    DataFrame
        One row per (rate, policy, delay): ``load`` (with a mapping), ``rate_req_s``, ``policy``,
        ``max_queue_delay_s`` (NaN except dynamic), :data:`LATENCY_COLUMNS` (ms), ``completed`` and
        ``rejected`` (requests), ``request_throughput``
        (req/s), ``output_throughput`` (tok/s), ``gpu_busy_fraction``, ``padding_fraction``,
        :func:`~batchlab.metrics.idle_while_waiting_fraction` (from each client's send),
        :func:`idle_while_queued_fraction` (from the engine's sight of each request) and
        :func:`~batchlab.metrics.full_batch_fraction`.
    """
    labelled = list(rates_req_s.items()) if hasattr(rates_req_s, "items") else [(None, r) for r in rates_req_s]
    runs = ([("static", float("nan"), {"batch_size": batch_size})]
            + [("dynamic", float(d), {"batch_size": batch_size, "max_queue_delay_s": float(d)}) for d in delays_s]
            + [(p, float("nan"), vllm_defaults(cost.hardware)) for p in iteration])
    columns = LATENCY_COLUMNS + ("completed", "rejected", "request_throughput", "output_throughput",
                                 "gpu_busy_fraction", "padding_fraction")
    rows = []
    for label, rate in labelled:
        stream = scenes.within_context(cost, preset(workload, n_requests, rate_req_s=float(rate), seed=seed))
        for policy, delay, knobs in runs:
            res = simulate(stream, policy, cost, **knobs)
            summ = res.summary()
            row = {"load": label} if label is not None else {}
            rows.append(row | {"rate_req_s": float(rate), "policy": policy, "max_queue_delay_s": delay}
                        | {k: summ[k] for k in columns}
                        | {"idle_while_waiting_fraction": idle_while_waiting_fraction(res),
                           "idle_while_queued_fraction": idle_while_queued_fraction(res),
                           "full_batch_fraction": full_batch_fraction(res)})
    return pd.DataFrame(rows)


POLICY_WORDS = {"static": "static", "dynamic": "dynamic", "continuous": "continuous (Orca)",
                "chunked": "chunked (vLLM)"}


def capacity_table(capacity: pd.DataFrame, capacity_req_s: float):
    """Saturation throughput of each policy (:func:`policy_grid` at an infinite rate) and its share of the
    scene's capacity ``capacity_req_s`` (req/s), for the page. Used in chapter 02.
    """
    df = capacity.assign(words=capacity["policy"].map(POLICY_WORDS),
                         share=capacity["request_throughput"] / capacity_req_s)
    return viz.display_table(df, {  # three significant digits: as the page's facts print them (2.35, 19.9, 20.8)
        "words": ("policy", "{}"), "request_throughput": ("saturation throughput (req/s)", "{:.3g}"),
        "share": ("share of capacity", "{:.0%}"), "output_throughput": ("output throughput (tok/s)", "{:,.0f}"),
        "padding_fraction": ("padded token slots", "{:.0%}")})


def _with_words(runs: pd.DataFrame) -> pd.DataFrame:
    return runs.assign(load_words=[f"{100 * float(x):g}%" for x in runs["load"]],
                       words=runs["policy"].map(POLICY_WORDS))


def latency_table(runs: pd.DataFrame):
    """Latency and throughput of each run of :func:`policy_grid` with a ``load`` column (shares of capacity), for
    the page, each latency with its unit (:func:`batchlab.viz.format_duration`: "36.5 ms", "1.78 s"). Used in
    chapter 02.
    """
    df = _with_words(runs)
    columns = {"load_words": ("load (share of capacity)", "{}"), "words": ("policy", "{}")}
    columns |= {c: (LATENCY_HEADERS[c], viz.format_duration) for c in LATENCY_COLUMNS}
    return viz.display_table(df, columns | {"request_throughput": ("throughput (req/s)", "{:.2f}")})


def usage_table(runs: pd.DataFrame):
    """Where the GPU's time goes in each run of :func:`policy_grid` with a ``load`` column: :data:`USAGE_HEADERS`
    as percentages, "–" where a measure does not apply (iteration-level batches never "leave full").

    Used in chapter 02.
    """
    columns = {"load_words": ("load (share of capacity)", "{}"), "words": ("policy", "{}")}
    return viz.display_table(_with_words(runs), columns | {c: (h, "{:.1%}") for c, h in USAGE_HEADERS.items()})


def _policy_scales(policies) -> dict:
    """Colour, marker and dash per policy (:data:`POLICY_COLORS`, :data:`POLICY_SHAPES`, :data:`POLICY_DASHES`):
    lines that run together (static and dynamic past lockstep saturation, continuous and chunked below
    capacity) stay apart by their dash and marker."""
    domain = [p for p in POLICY_COLORS if p in set(policies)]
    legend = alt.Legend(orient="top", title=None, symbolStrokeWidth=2)
    return {"color": alt.Color("policy:N", sort=domain, legend=legend,
                               scale=alt.Scale(domain=domain, range=[POLICY_COLORS[p] for p in domain])),
            "shape": alt.Shape("policy:N", sort=domain, legend=legend,
                               scale=alt.Scale(domain=domain, range=[POLICY_SHAPES[p] for p in domain])),
            "strokeDash": alt.StrokeDash("policy:N", sort=domain, legend=legend,
                                         scale=alt.Scale(domain=domain, range=[POLICY_DASHES[p] for p in domain]))}


def latency_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`policy_grid` rows (with a ``load`` column) as one row per run and latency metric.

    Used in chapter 02 (:func:`delay_load_chart`).

    Returns
    -------
    DataFrame
        ``load`` (share of capacity), ``load_index`` (its rank among the loads: the slider's position),
        ``rate_req_s``, ``policy``, ``max_queue_delay_ms`` (ms, NaN except dynamic), ``metric`` (a
        :data:`LATENCY_LABELS` value) and ``latency_s`` (s).
    """
    ids = ["load", "rate_req_s", "policy", "max_queue_delay_s"]
    long = runs.melt(id_vars=ids, value_vars=list(LATENCY_LABELS), var_name="metric", value_name="latency_ms")
    long["metric"] = long["metric"].map(LATENCY_LABELS)
    long["latency_s"] = long.pop("latency_ms") / 1e3
    long["max_queue_delay_ms"] = long.pop("max_queue_delay_s") * 1e3
    loads = np.unique(long["load"].astype(float))
    long["load_index"] = np.searchsorted(loads, long["load"].astype(float))
    return long


def load_labels(long: pd.DataFrame) -> list[str]:
    """What the load slider shows at each position: the rate and its share of capacity. Used in chapter 02."""
    at = long.groupby("load_index")[["rate_req_s", "load"]].first()
    return [f"{r:.{2 if r < 1 else 1}f} req/s, {100 * share:g}% of capacity"
            for r, share in zip(at["rate_req_s"], at["load"])]


def delay_panel_marks(long: pd.DataFrame) -> pd.DataFrame:
    """The delay panel's reference lines, per load and metric: where the non-dynamic policies sit against dynamic
    batching's curve. Static latency more than 1.5 times everything else is not drawn (it would flatten the curve
    the panel is about); an "above" row says so, and the readout reads it (:func:`delay_load_chart`).

    The lines carry no text labels: a label inside the panel would sit on dynamic batching's curve in some state
    of the controls (the curve moves with the load and the metric); the legend and the readout name them.

    Used in chapter 02 (:func:`delay_load_chart`).

    Returns
    -------
    DataFrame
        ``load_index``, ``metric``, ``kind`` ("rule": a reference line at ``latency_s``; "above": static is above
        the axis, ``latency_s`` its value), ``policy``.
    """
    rows = []
    for (i, metric), g in long.groupby(["load_index", "metric"]):
        dyn = g[g["policy"] == "dynamic"].sort_values("max_queue_delay_ms")
        ref = g[g["policy"] != "dynamic"].set_index("policy")["latency_s"]
        shown = ref.drop("static", errors="ignore")
        top = 1.12 * max(float(dyn["latency_s"].max()), float(shown.max()) if len(shown) else 0.0)
        static_on = "static" in ref and ref["static"] <= 1.5 * top / 1.12
        if static_on:
            shown = ref
        elif "static" in ref:
            rows.append({"load_index": i, "metric": metric, "kind": "above", "policy": "static",
                         "latency_s": float(ref["static"])})
        rows += [{"load_index": i, "metric": metric, "kind": "rule", "policy": p, "latency_s": float(v)}
                 for p, v in shown.items()]
    return pd.DataFrame(rows)


def _readout(long: pd.DataFrame, load, delay, metric):
    """Lines under the panels: the selected metric, load and delay, then each policy's value there."""
    at = f"datum.load_index == {load.name} && datum.metric == {metric.name}"
    picked = f"{at} && (datum.policy != 'dynamic' || abs(datum.max_queue_delay_ms - {delay.name}) < 1e-6)"
    where = ("'at ' + format(datum.rate_req_s, datum.rate_req_s < 1 ? '.2f' : '.1f') + ' req/s, '"
             " + format(100 * datum.load, '~g') + '% of capacity'")
    timer = f"'max queue delay ' + format({delay.name}, ',.0f') + ' ms'"
    line = ("datum.policy + ': ' + (" + viz.duration_text("latency_s", unit="s") + ") + (datum.off_axis ? "
            f"'{OFF_AXIS}' : '')")
    base = alt.Chart(long).transform_filter(picked)
    first = base.transform_filter("datum.policy == 'dynamic'")
    header = [first.transform_calculate(text=text).mark_text(align="left", baseline="top", fontWeight=weight)
              .encode(x=alt.value(0), y=alt.value(15 * i), text="text:N")
              for i, (text, weight) in enumerate([(metric.name, "bold"), (where, "normal"), (timer, "normal")])]
    order = list(POLICY_COLORS)
    values = base.transform_calculate(text=line, y_px=f"49 + 15 * indexof({order}, datum.policy)").mark_text(
        align="left", baseline="top").encode(x=alt.value(0), y=alt.Y("y_px:Q", scale=None), text="text:N",
                                             color=_policy_scales(order)["color"])
    return alt.layer(*header, values).properties(width=280, height=49 + 15 * len(order))


def delay_load_chart(runs: pd.DataFrame, rules: pd.DataFrame, delay_ms: float = TIMER_MS, load: float = LOW_LOAD):
    """Latency against offered load (left, every policy) and against dynamic batching's max queue delay at the
    selected load (right), with sliders for the load and the delay and a select box for the metric.

    Used in chapter 02.

    Parameters
    ----------
    runs : DataFrame
        :func:`policy_grid` with a ``load`` column (shares of capacity) and dynamic runs on an evenly spaced
        delay grid, as :func:`conv_grid` returns.
    rules : DataFrame
        ``rate_req_s`` and ``label`` of the vertical rules of the load panel (saturation throughputs).
    delay_ms, load : float
        Where the sliders start (the nearest grid values).

    Returns
    -------
    altair chart: the two panels, then a readout (the selected metric, load and delay, and each policy's value
    there, with a note where static batching is above the delay panel's axis), right above the controls.
    The load panel has log axes, a rule at the selected load and a ring on each policy there; the delay panel a
    linear axis from zero on which dynamic batching's curve is drawn against the other policies' lines (static's
    only where it fits, :func:`delay_panel_marks`). The legend names the lines; no text sits among them. Both y
    axes keep one width (:data:`Y_EXTENT`), so every state of the controls fits the width the chart was drawn
    at. Every point and line answers a hover, each value with its unit.
    """
    long = latency_frame(runs)
    marks = delay_panel_marks(long)
    above = marks.loc[marks["kind"] == "above", ["load_index", "metric"]].assign(off_axis=True)
    long = long.merge(above.assign(policy="static"), how="left", on=["load_index", "metric", "policy"])
    long["off_axis"] = long["off_axis"].eq(True)
    loads = np.unique(long["load"].astype(float))
    load_p, at_load = viz.grid_param("load_index", long["load_index"], "offered load", labels=load_labels(long),
                                     value=float(np.abs(loads - load).argmin()))
    delays = long["max_queue_delay_ms"].dropna()
    delay_p, at_delay = viz.grid_param("delay", delays, "max queue delay", field="max_queue_delay_ms",
                                       value=delay_ms, labels=lambda d: f"{d:,.0f} ms")
    options = list(LATENCY_LABELS.values())
    metric = alt.param(name="metric", value=options[0], bind=alt.binding_select(options=options, name="latency "))
    scales = _policy_scales(long["policy"])
    on_metric = f"datum.metric == {metric.name}"
    shown = f"{on_metric} && (datum.policy != 'dynamic' || {at_delay})"
    tips = [viz.tip("policy", "policy", kind="N"), viz.tip("rate_text", "offered load (req/s)", kind="N"),
            viz.tip("load", "share of capacity", ".1%"), viz.tip("timer_text", "max queue delay", kind="N"),
            viz.tip("latency_text", "latency", kind="N")]
    base = alt.Chart(long).transform_filter(shown).transform_calculate(
        latency_text=viz.duration_text("latency_s", unit="s"), timer_text=TIMER_TEXT,
        rate_text=viz.rate_text("rate_req_s"))  # as the readout and the tables print a rate: "18.8"
    x = alt.X("rate_req_s:Q", title="offered load (req/s)", scale=alt.Scale(type="log", nice=False, domain=[
        0.8 * float(long["rate_req_s"].min()), 1.25 * max(float(long["rate_req_s"].max()), rules["rate_req_s"].max())]),
        axis=alt.Axis(values=_ticks125(long["rate_req_s"]), format="~g"))
    y = alt.Y("latency_s:Q", title="latency (s)", scale=alt.Scale(type="log", nice=False, padding=6),
              axis=alt.Axis(labelExpr=viz.LOG125_LABEL, **Y_EXTENT))
    load_panel = alt.layer(
        base.mark_line(strokeWidth=1.8).encode(x=x, y=y, color=scales["color"], strokeDash=scales["strokeDash"]),
        base.mark_point(size=40, filled=True).encode(x=x, y=y, color=scales["color"], shape=scales["shape"],
                                                    tooltip=tips),
        base.transform_filter(at_load).mark_point(size=190, filled=False, color="black").encode(x=x, y=y),
        alt.Chart(long).transform_filter(at_load).transform_aggregate(rate_req_s="max(rate_req_s)").mark_rule(
            color="black", strokeWidth=0.8).encode(x="rate_req_s:Q"),
        alt.Chart(rules).mark_rule(color="#888888", strokeDash=[2, 2]).encode(x="rate_req_s:Q"),
        alt.Chart(rules).mark_text(align="right", baseline="bottom", dx=2, dy=-3, color="#555555", y=0)
        .encode(x="rate_req_s:Q", text="label:N"),  # above the plot, each ending at its rule
    ).properties(width=270, height=260)
    # The readout goes last, right above the controls vega-embed draws under the chart: in a narrow column the
    # panels stack and the chart is taller than a phone's screen, but the lines a control changes stay beside it.
    return alt.vconcat(alt.hconcat(
        load_panel, _delay_panel(long, marks, on_metric, at_load, at_delay, scales, tips)),
        _readout(long, load_p, delay_p, metric)).add_params(
        load_p, delay_p, metric).properties(usermeta={"narrow": {"margin": 70}})


# The y axes keep one width whatever the controls select ("5" to "2,000"), so the chart never outgrows the width
# it was first drawn at (Vega sizes the svg once): every state of the controls fits the column.
Y_EXTENT = {"minExtent": 40, "maxExtent": 40}
HEADROOM_PX = 10  # above the delay panel: a ring (size 190) reaches 7.8 px past the point it marks
# The readout's note on static batching where the delay panel leaves it out (delay_panel_marks).
OFF_AXIS = ", above the axis of the delay panel"
# The tooltips' max queue delay: dynamic batching's timer, words where a policy has none.
TIMER_TEXT = ("datum.policy == 'dynamic' ? format(datum.max_queue_delay_ms, ',.0f') + ' ms' : "
              "datum.policy == 'static' ? 'no timer: waits for a full batch' : 'no timer: iteration-level'")


def _ticks125(values) -> list[float]:
    """:func:`batchlab.viz.log_ticks` at 1, 2 and 5 times a power of ten only: 0.2 and 0.3 would touch."""
    return [t for t in viz.log_ticks(values) if f"{t:.0e}"[0] in "125"]


def _delay_panel(long: pd.DataFrame, marks: pd.DataFrame, on_metric: str, at_load: str, at_delay: str,
                 scales: dict, tips: list):
    """Latency against the max queue delay at the selected load, on a linear axis from zero; ``marks`` are
    :func:`delay_panel_marks`."""
    x = alt.X("max_queue_delay_ms:Q", title="max queue delay (ms)", axis=alt.Axis(format=",.0f", tickCount=5),
              scale=alt.Scale(domain=[0, float(long["max_queue_delay_ms"].max())]))
    y = alt.Y("latency_s:Q", title="latency (s)", scale=alt.Scale(zero=True),
              axis=alt.Axis(format=",~f", labelFlush=True, **Y_EXTENT))
    dyn = alt.Chart(long).transform_filter(f"{on_metric} && {at_load} && datum.policy == 'dynamic'")
    dyn = dyn.transform_calculate(latency_text=viz.duration_text("latency_s", unit="s"), timer_text=TIMER_TEXT,
                                  rate_text=viz.rate_text("rate_req_s"))  # the fields of the shared tooltip
    here = alt.Chart(marks).transform_filter(f"{on_metric} && {at_load}").transform_calculate(
        latency_text=viz.duration_text("latency_s", unit="s"))
    color = scales["color"]
    return alt.layer(
        here.transform_filter("datum.kind == 'rule'").mark_rule(strokeWidth=1.8).encode(
            y=y, color=color, strokeDash=scales["strokeDash"],
            tooltip=[viz.tip("policy", "policy", kind="N"), viz.tip("latency_text", "latency", kind="N")]),
        dyn.mark_line(strokeWidth=1.8).encode(x=x, y=y, color=color),
        dyn.mark_point(size=40, filled=True).encode(x=x, y=y, color=color, shape=scales["shape"],
                                                   tooltip=tips),
        dyn.transform_filter(at_delay).mark_point(size=190, filled=False, color="black").encode(x=x, y=y),
        # Room above the plot, drawn or not, for a ring at its top: stacked under the load panel (a narrow
        # column), the panel would otherwise grow by a ring's height in some states and push the legend out of
        # the svg, which Vega sized once.
        alt.Chart(pd.DataFrame({"y": [0]})).mark_rule(opacity=0).encode(y=alt.value(-HEADROOM_PX)),
    ).properties(width=230, height=260)


# -- the chapter's grid and the facts other pages glue (batchlab.chapters.facts) ------------------------------


@facts.memo
def _saturation(cost, workload: str, n_requests: int, batch_size: int, seed) -> pd.DataFrame:
    return policy_grid(cost, workload, n_requests, [np.inf], batch_size=batch_size, seed=seed)


@facts.memo
def _grid(cost, workload: str, n_requests: int, rates: tuple, delays_s: tuple, batch_size: int, seed) -> pd.DataFrame:
    return policy_grid(cost, workload, n_requests, dict(rates), batch_size=batch_size, delays_s=list(delays_s),
                       seed=seed)


def conv_saturation() -> pd.DataFrame:
    """:func:`policy_grid` on the conv scene with every request that fits the context queued at time 0 (cached):
    each policy's saturation throughput. Used in chapters 02 and 12."""
    s = scenes.scene("conv")
    return _saturation(s.cost(), s.workload, s.n_requests, LOCKSTEP_BATCH, s.seed)


def load_delay_grid(cost, workload: str, n_requests: int, capacity_req_s: float, loads=LOADS, delays_ms=DELAYS_MS,
                    *, batch_size: int = LOCKSTEP_BATCH, seed=0) -> pd.DataFrame:
    """:func:`policy_grid` at each load, a share of ``capacity_req_s``, with dynamic batching at each delay (cached
    on disk, :func:`batchlab.chapters.facts.memo`: one run per build for the page and its facts).

    Used in chapters 02 and 12.

    Parameters
    ----------
    cost : CostModel
    workload : str
        A :func:`batchlab.preset` name.
    n_requests : int
    capacity_req_s : float
        The yardstick of the loads (req/s): the scene's capacity.
    loads : sequence of float
        Offered loads, shares of ``capacity_req_s`` (> 0).
    delays_ms : sequence of float
        Dynamic batching's ``max_queue_delay_s``, in milliseconds.
    batch_size : int
        Rows per lockstep batch.
    seed : int

    Returns
    -------
    DataFrame
        :func:`policy_grid`'s rows, ``load`` holding the share.
    """
    if capacity_req_s <= 0 or min(loads) <= 0:
        raise ValueError(f"capacity_req_s ({capacity_req_s}) and every load ({min(loads)}) must be > 0")
    rates = tuple((float(x), float(x) * float(capacity_req_s)) for x in loads)
    return _grid(cost, workload, int(n_requests), rates, tuple(float(d) / 1e3 for d in delays_ms), int(batch_size),
                 seed)


def conv_grid() -> pd.DataFrame:
    """:func:`load_delay_grid` of the page: the conv scene at every load of :data:`LOADS` (shares of the fact
    ``capacity_req_s``), dynamic batching at every delay of :data:`DELAYS_MS`. Used in chapters 02 and 12."""
    s = scenes.scene("conv")
    return load_delay_grid(s.cost(), s.workload, s.n_requests, facts.value("capacity_req_s"), seed=s.seed)


def saturation_rules() -> pd.DataFrame:
    """The load panel's vertical rules (:func:`delay_load_chart`): lockstep batching's saturation throughput and
    the conv scene's capacity (req/s, the facts ``lockstep_capacity_req_s`` and ``capacity_req_s``).

    Used in chapter 02.
    """
    return pd.DataFrame({"rate_req_s": [facts.value("lockstep_capacity_req_s"), facts.value("capacity_req_s")],
                         "label": ["lockstep saturation", "capacity"]})


def pick(runs: pd.DataFrame, load: float, policy: str, column: str = "mean_e2el_ms", delay_ms: float | None = None):
    """One value of a :func:`policy_grid` frame with a ``load`` column: ``column`` of ``policy`` at ``load`` (and,
    for dynamic batching, at ``delay_ms``, default :data:`TIMER_MS`). ValueError if no run matches.

    Used in chapter 02.
    """
    rows = runs[np.isclose(runs["load"].astype(float), load) & (runs["policy"] == policy)]
    if policy == "dynamic":
        delay_ms = TIMER_MS if delay_ms is None else delay_ms
        rows = rows[np.isclose(rows["max_queue_delay_s"] * 1e3, delay_ms)]
    if len(rows) != 1:
        raise ValueError(f"load={load}, policy={policy!r}, delay_ms={delay_ms}: {len(rows)} runs match, not one")
    return float(rows[column].iloc[0])


_CONV = "on the conversation scene"


@facts.fact("lockstep_capacity_req_s", scene="conv", unit="req/s", fmt=".2f", chapter="dynamic_batching",
            text=f"the saturation throughput of static batching in batches of {LOCKSTEP_BATCH} rows {_CONV}: "
                 "requests per second it completes with every request that fits the context queued at once "
                 "(dynamic batching's too)")
def _lockstep():
    return float(conv_saturation().set_index("policy").loc["static", "request_throughput"])


@facts.fact("orca_capacity_req_s", scene="conv", unit="req/s", fmt=".1f", chapter="dynamic_batching",
            text="the same for iteration-level batching with whole prompts (Orca's continuous batching, vLLM's "
                 "default max_num_seqs and the scene's KV pool)")
def _orca():
    return float(conv_saturation().set_index("policy").loc["continuous", "request_throughput"])


@facts.fact("orca_over_lockstep", scene="conv", fmt=".1f", chapter="dynamic_batching",
            text="how many times lockstep batching's saturation throughput iteration-level batching with whole "
                 f"prompts (Orca's) completes {_CONV}")
def _orca_over_lockstep():
    return facts.value("orca_capacity_req_s") / facts.value("lockstep_capacity_req_s")


@facts.fact("lockstep_share_of_capacity", scene="conv", fmt=".0%", chapter="dynamic_batching",
            text=f"lockstep batching's saturation throughput as a share of the scene's capacity {_CONV}")
def _lockstep_share():
    return facts.value("lockstep_capacity_req_s") / facts.value("capacity_req_s")


@facts.fact("dynamic_timer_ms", scene="conv", unit="ms", fmt=".0f", chapter="dynamic_batching",
            text="the max queue delay of the dynamic batching the book quotes")
def _timer():
    return float(TIMER_MS)


@facts.fact("low_load_req_s", scene="conv", unit="req/s", fmt=".2f", chapter="dynamic_batching",
            text=f"the low load at which the book compares the four policies {_CONV}: {LOW_LOAD:.0%} of its capacity")
def _low_rate():
    return LOW_LOAD * facts.value("capacity_req_s")


def _low(policy: str) -> float:
    return pick(conv_grid(), LOW_LOAD, policy) / 1e3


@facts.fact("low_e2el_static_s", scene="conv", unit="s", fmt=".1f", chapter="dynamic_batching",
            text=f"mean end-to-end latency of static batching ({LOCKSTEP_BATCH} rows) at the low load")
def _low_static():
    return _low("static")


@facts.fact("low_e2el_dynamic_s", scene="conv", unit="s", fmt=".2f", chapter="dynamic_batching",
            text=f"the same for dynamic batching with a {TIMER_MS} ms max queue delay")
def _low_dynamic():
    return _low("dynamic")


@facts.fact("low_e2el_orca_s", scene="conv", unit="s", fmt=".2f", chapter="dynamic_batching",
            text="the same for iteration-level batching with whole prompts (Orca's)")
def _low_orca():
    return _low("continuous")
