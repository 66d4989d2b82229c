"""Chapter 02, dynamic batching: static, dynamic and iteration-level batching on one real-trace workload.

:func:`policy_grid` runs the three at a few arrival rates (and dynamic batching at each max queue delay);
the charts read latency against the queue delay (:func:`queue_delay_chart`) and against offered load
(:func:`load_sweep_chart`). :func:`engine_arrival_s` says when the engine sees each request, after the serving
terms of the cost model (the API server's tokenising and the request latency), so that an idle GPU can be told
apart from a request still on its way (:func:`idle_while_queued_fraction`).
"""
from __future__ import annotations

from types import SimpleNamespace

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from .._kernels import REJECT_RECOMPUTE
from .._kernels.cost import serve_time
from ..metrics import full_batch_fraction, idle_while_waiting_fraction
from ..sim import simulate, vllm_defaults
from ..workload import preset
from . import facts, scenes

LATENCY_COLUMNS = ("mean_e2el_ms", "p99_e2el_ms", "mean_ttft_ms", "p99_ttft_ms")
POLICY_COLORS = {"static": "#D55E00", "dynamic": "#0072B2", "continuous": "#009E73", "chunked": "#CC79A7"}
POLICY_SHAPES = {"static": "square", "dynamic": "circle", "continuous": "triangle-up", "chunked": "diamond"}
LATENCY_LABELS = {"mean_e2el_ms": "mean e2el", "p99_e2el_ms": "p99 e2el", "mean_ttft_ms": "mean ttft",
                  "p99_ttft_ms": "p99 ttft"}
LATENCY_HEADERS = {"mean_e2el_ms": "mean end-to-end latency (s)", "p99_e2el_ms": "p99 end-to-end latency (s)",
                   "mean_ttft_ms": "mean time to first token (s)", "p99_ttft_ms": "p99 time to first token (s)"}
USAGE_HEADERS = {"gpu_busy_fraction": "GPU busy", "idle_while_waiting_fraction": "GPU idle, a request sent",
                 "idle_while_queued_fraction": "GPU idle, a request at the engine",
                 "padding_fraction": "padded token slots", "full_batch_fraction": "batches leaving full"}


def engine_arrival_s(res) -> np.ndarray:
    """When the engine sees each request of a run (s): the API server tokenises them one at a time, in order,
    ``frontend_s_per_token`` per prompt token, then ``request_latency_s`` passes (the serving terms of
    :class:`batchlab.CostModel`; the same ``serve_time`` the simulator runs). Used in chapters 02 and 03.

    Parameters
    ----------
    res : SimResult

    Returns
    -------
    ndarray
        Seconds, one per request; NaN for a request rejected before the loop (it never reaches the engine).
    """
    req, code = res.requests, res.raw.reject_code
    sent, prompt = req["sent_s"].to_numpy(), req["prompt_tokens"].to_numpy()
    coef = res.cost.coefficients()
    seen = np.full(len(req), np.nan)
    free = -np.inf  # when the API server is free
    for r in np.flatnonzero((code == 0) | (code == REJECT_RECOMPUTE)):  # those rejected later did enter the loop
        seen[r], free = serve_time(free, sent[r], prompt[r], coef)
    return seen


def idle_while_queued_fraction(res) -> float:
    """:func:`batchlab.metrics.idle_while_waiting_fraction` as the engine sees it: the GPU ran nothing although
    a request had reached the engine (:func:`engine_arrival_s`) and was not yet scheduled.

    The time a request spends on its way (tokenising, ``request_latency_s``) is left out: no scheduler can
    run a request it has not seen. Dimensionless, over the run from the engine's first sight of a request to
    the last finish. Used in chapter 02.
    """
    # idle_while_waiting_fraction reads only these two frames
    seen = SimpleNamespace(requests=res.requests.assign(arrival_s=engine_arrival_s(res)), steps=res.steps)
    return idle_while_waiting_fraction(seen)


def policy_grid(cost, workload: str, n_requests: int, rates_req_s, *, batch_size: int = 32, delays_s=(), seed=0,
                iteration=("continuous", "chunked")) -> pd.DataFrame:
    """One real-trace workload under static, dynamic (each delay) and iteration-level batching, at each rate.

    At every rate the stream is ``preset(workload, n_requests, rate_req_s, seed)``: the same lengths and the
    same arrival pattern, compressed or stretched in time (common random numbers), so the rates differ only
    by load. Iteration-level policies run with vLLM's default ``max_num_seqs`` and ``max_num_batched_tokens``
    for the GPU (:func:`batchlab.vllm_defaults`); a rate of ``inf`` puts every request at time 0, which
    measures a policy's saturation throughput as ``vllm bench throughput`` does. Used in chapters 02 and 12.

    Parameters
    ----------
    cost : CostModel
    workload : str
        A :func:`batchlab.preset` name, e.g. ``"azure-conv-2023"``.
    n_requests : int
        Requests per stream.
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
        ``max_queue_delay_s`` (NaN except dynamic), :data:`LATENCY_COLUMNS` (ms), ``request_throughput``
        (req/s), ``output_throughput`` (tok/s), ``gpu_busy_fraction``, ``padding_fraction``,
        :func:`~batchlab.metrics.idle_while_waiting_fraction` (from each client's send),
        :func:`idle_while_queued_fraction` (from the engine's sight of each request) and
        :func:`~batchlab.metrics.full_batch_fraction`.
    """
    labelled = list(rates_req_s.items()) if hasattr(rates_req_s, "items") else [(None, r) for r in rates_req_s]
    runs = ([("static", float("nan"), {"batch_size": batch_size})]
            + [("dynamic", float(d), {"batch_size": batch_size, "max_queue_delay_s": float(d)}) for d in delays_s]
            + [(p, float("nan"), vllm_defaults(cost.hardware)) for p in iteration])
    columns = LATENCY_COLUMNS + ("request_throughput", "output_throughput", "gpu_busy_fraction", "padding_fraction")
    rows = []
    for label, rate in labelled:
        stream = preset(workload, n_requests, rate_req_s=float(rate), seed=seed)
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


def capacity_table(capacity: pd.DataFrame):
    """Saturation throughput of each policy (:func:`policy_grid` at an infinite rate), for the page.

    Used in chapter 02.
    """
    return viz.display_table(capacity, {
        "policy": ("policy", "{}"), "request_throughput": ("saturation throughput (req/s)", "{:.2f}"),
        "output_throughput": ("output throughput (tok/s)", "{:,.0f}"),
        "padding_fraction": ("padded token slots", "{:.0%}")})


def _seconds(v: float) -> str:
    """Three significant digits, thousands separated from 100 s up: 0.0365, 1.78, 88.4, 1,204."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:#.3g}"


def latency_table(runs: pd.DataFrame):
    """Latency and throughput of each run of :func:`policy_grid` (a ``load`` column), in seconds, for the page.

    Used in chapter 02.
    """
    df = runs.assign(**{c: runs[c] / 1e3 for c in LATENCY_COLUMNS})
    columns = {"load": ("offered load", "{}"), "policy": ("policy", "{}")}
    columns |= {c: (LATENCY_HEADERS[c], _seconds) for c in LATENCY_COLUMNS}
    return viz.display_table(df, columns | {"request_throughput": ("throughput (req/s)", "{:.2f}")})


def usage_table(runs: pd.DataFrame):
    """Where the GPU's time goes in each run of :func:`policy_grid` (a ``load`` column): :data:`USAGE_HEADERS`
    as percentages, "–" where a measure does not apply (iteration-level batches never "leave full").

    Used in chapter 02.
    """
    columns = {"load": ("offered load", "{}"), "policy": ("policy", "{}")}
    return viz.display_table(runs, columns | {c: (h, "{:.1%}") for c, h in USAGE_HEADERS.items()})


def _policy_color(policies):
    domain = [p for p in POLICY_COLORS if p in set(policies)]
    return alt.Color("policy:N", title=None, sort=domain, legend=alt.Legend(orient="top"),
                     scale=alt.Scale(domain=domain, range=[POLICY_COLORS[p] for p in domain]))


def _policy_shape(policies):
    """A marker shape per policy, so lines that overlap (static and dynamic past saturation) stay apart."""
    domain = [p for p in POLICY_SHAPES if p in set(policies)]
    return alt.Shape("policy:N", title=None, sort=domain, legend=alt.Legend(orient="top"),
                     scale=alt.Scale(domain=domain, range=[POLICY_SHAPES[p] for p in domain]))


def latency_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`policy_grid` rows as one row per run and latency metric, for :func:`queue_delay_chart`.

    Used in chapter 02.

    Parameters
    ----------
    runs : DataFrame
        :func:`policy_grid`.

    Returns
    -------
    DataFrame
        The run's ``load`` (if any), ``rate_req_s``, ``policy``, ``max_queue_delay_ms`` (ms, NaN except
        dynamic), ``metric`` (a :data:`LATENCY_LABELS` value such as "p99 e2el") and ``latency_s`` (s).
    """
    ids = [c for c in ("load", "rate_req_s", "policy", "max_queue_delay_s") if c in runs]
    long = runs.melt(id_vars=ids, value_vars=list(LATENCY_LABELS), var_name="metric", value_name="latency_ms")
    long["metric"] = long["metric"].map(LATENCY_LABELS)
    long["latency_s"] = long.pop("latency_ms") / 1e3
    long["max_queue_delay_ms"] = long.pop("max_queue_delay_s") * 1e3
    return long


def queue_delay_chart(runs: pd.DataFrame, facet: str = "load"):
    """Latency against dynamic batching's max queue delay, other policies as reference lines.

    Used in chapter 02.

    Parameters
    ----------
    runs : DataFrame
        :func:`policy_grid` with dynamic runs on an evenly spaced delay grid and a ``facet`` column (one
        panel per load, ordered by ``rate_req_s``).
    facet : str
        Column splitting the panels.

    Returns
    -------
    altair chart; a slider over the delay marks and labels the dynamic point in every panel, a select box
    picks the latency metric (mean or p99, e2el or ttft). Latency is on a log axis.
    """
    long = latency_frame(runs)
    delay, at_delay = viz.grid_param("delay", long["max_queue_delay_ms"].dropna(), "max queue delay (ms)",
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
              # continuous and chunked often coincide: one label under its line on the left, the others past the
              # right end of the plot, where the dynamic curve cannot run through them
              ref.transform_filter("datum.policy == 'continuous'").mark_text(align="left", baseline="top", dy=3)
              .encode(x=alt.datum(0.0), y=y, color=color, text="policy:N"),
              ref.transform_filter("datum.policy != 'continuous'").mark_text(align="left", baseline="middle", dx=4)
              .encode(x=alt.datum(xmax), y=y, color=color, text="policy:N"),
              picked.mark_point(size=180, color="black", filled=False).encode(x=x, y=y),
              picked.transform_filter(f"datum.max_queue_delay_ms <= {xmax / 2}").mark_text(
                  align="left", dx=9, dy=-9, fontWeight="bold").encode(x=x, y=y, text="label:N"),
              # higher up than the left-hand label: the reference lines' names sit just above them on the right
              picked.transform_filter(f"datum.max_queue_delay_ms > {xmax / 2}").mark_text(
                  align="right", dx=-6, dy=-20, fontWeight="bold").encode(x=x, y=y, text="label:N")]
    panels = alt.layer(*layers, data=long).properties(width=210, height=260)
    order = runs.groupby(facet)["rate_req_s"].min().sort_values().index.tolist()
    return panels.facet(column=alt.Column(f"{facet}:N", title=None, sort=order)).resolve_scale(
        y="independent").add_params(delay, metric)


def saturation_rules(capacity: pd.DataFrame) -> pd.DataFrame:
    """The two vertical rules of :func:`load_sweep_chart`: lockstep (``static``) and iteration-level
    (``continuous``) saturation throughputs (req/s) from :func:`policy_grid`'s run with every request at time 0.

    Used in chapter 02.
    """
    sat = capacity.set_index("policy")["request_throughput"]
    return pd.DataFrame({"rate_req_s": [float(sat["static"]), float(sat["continuous"])],
                         "label": ["lockstep saturation", "iteration-level saturation"]})


def load_sweep_chart(runs: pd.DataFrame, capacities: pd.DataFrame, metric: str = "mean_e2el_ms"):
    """Latency against offered load per policy on log-log axes, saturation throughputs as rules.

    Used in chapter 02.

    Parameters
    ----------
    runs : DataFrame
        :func:`policy_grid` over several rates (at most one delay for dynamic).
    capacities : DataFrame
        ``rate_req_s`` (req/s) and ``label`` of each vertical rule, e.g. each policy's saturation throughput.
    metric : str
        A latency column of ``runs`` (ms); plotted in seconds.

    Returns
    -------
    altair chart.
    """
    df = runs.assign(latency_s=runs[metric] / 1e3)
    lo, hi = df["rate_req_s"].min(), max(df["rate_req_s"].max(), capacities["rate_req_s"].max())
    x = alt.X("rate_req_s:Q", title="offered load (req/s)",
              scale=alt.Scale(type="log", nice=False, domain=[0.8 * lo, 1.3 * hi]))
    y_title = LATENCY_HEADERS.get(metric, f"{viz.title(metric)} (s)")
    enc = dict(x=x, y=alt.Y("latency_s:Q", title=y_title, scale=alt.Scale(type="log")),
               color=_policy_color(df["policy"]))
    tips = ["policy:N", alt.Tooltip("rate_req_s:Q", format=".3~g"), alt.Tooltip("latency_s:Q", format=".3~g")]
    lines = alt.layer(alt.Chart(df).mark_line().encode(**enc),
                      alt.Chart(df).mark_point(size=45).encode(shape=_policy_shape(df["policy"]), tooltip=tips, **enc))
    rules = alt.Chart(capacities).mark_rule(color="#888888", strokeDash=[2, 2]).encode(x="rate_req_s:Q")
    text = alt.Chart(capacities).mark_text(align="right", angle=270, baseline="bottom", dx=-4, color="#555555",
                                           y=0).encode(x="rate_req_s:Q", text="label:N")
    return alt.layer(lines, rules, text).properties(width=460, height=280)


# -- facts other pages glue (batchlab.chapters.facts) ----------------------------------------------------------
LOCKSTEP_BATCH = 32  # rows of the static and dynamic batches the book compares


@facts.memo
def _saturation(cost, workload: str, n_requests: int, batch_size: int, seed) -> pd.DataFrame:
    return policy_grid(cost, workload, n_requests, [np.inf], batch_size=batch_size, seed=seed)


def conv_saturation() -> pd.Series:
    """Each policy's requests per second on the conv scene with every request queued at time 0 (cached)."""
    s = scenes.scene("conv")
    return _saturation(s.cost(), s.workload, s.n_requests, LOCKSTEP_BATCH, s.seed).set_index("policy")[
        "request_throughput"]


@facts.fact("lockstep_capacity_req_s", scene="conv", unit="req/s", fmt=".2f", chapter="dynamic_batching",
            text=f"requests per second static batching of {LOCKSTEP_BATCH} rows completes on the conversation scene "
                 "with every request queued (its saturation throughput)")
def _lockstep():
    return float(conv_saturation()["static"])


@facts.fact("orca_capacity_req_s", scene="conv", unit="req/s", fmt=".1f", chapter="dynamic_batching",
            text="the same for iteration-level batching with whole prompts (Orca's continuous batching, vLLM's "
                 "default max_num_seqs)")
def _orca():
    return float(conv_saturation()["continuous"])
