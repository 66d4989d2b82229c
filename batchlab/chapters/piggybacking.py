"""Chapter 7, piggybacking: iterations that mix prompt chunks with decodes, and what mixing buys.

:func:`step_utilisation` reads each iteration's share of peak compute and bandwidth, :func:`budget_split`
how ``max_num_batched_tokens`` is shared between prompt chunks and decodes over a run, and
:func:`mixing_comparison` the throughput and ITL of three ways to combine prompts with decodes, and
:func:`stall_comparison` (with :func:`prefill_stalls`) why the p99 ITL of prefill-only iterations peaks near
capacity. :func:`kind_table` and :func:`stall_table` format the tables. Inside one iteration, the iteration
picker (:mod:`batchlab.chapters.iteration_picker`, its functions re-exported here): :func:`iteration_rows`,
:func:`iteration_split`, :func:`iteration_apart`, :func:`picker_frames` and :func:`iteration_chart`.
:func:`seats_for` and :func:`batchlab.chapters.scenes.within_context` set runs up as vLLM requires: seats no
more than the token budget, prompts shorter than the model's context.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..sim import simulate
from ..vllm import seats_for, vllm_defaults  # noqa: F401 - seats_for: chapter 7 quotes it
from ..workload import preset
from . import facts, scenes
from .iteration_picker import (  # noqa: F401 - the picker's functions, as chapter 7 calls them
    CONTEXT_BIN, SPLIT_BARS, STEP_KINDS, busiest, iteration_apart, iteration_chart, iteration_rows, iteration_split,
    picker_frames, step_kinds)
MIXING_POLICIES = {  # label -> (policy, knobs): three ways to combine prompts with the decodes of a batch, and
    # vLLM V1's chunked loop also without async scheduling, so that the mixing is compared within one loop
    "chunked: prompt chunks mixed in (vLLM V1)": ("chunked", {}),
    "chunked, synchronous scheduling": ("chunked", {"async_scheduling": False}),
    "whole prompts mixed in (Orca)": ("continuous", {}),
    "prefill-only steps (vLLM V0)": ("continuous", {"prefill_only_steps": True}),
}
KIND_COLORS = {"decode": viz.PALETTE[0], "mixed": viz.PALETTE[2], "prefill": viz.PALETTE[3]}
RUN_SHAPES = ("circle", "triangle-up", "square", "diamond")  # one per run of the utilisation chart, in order
POLICY_DASHES = ([1, 0], [6, 3], [2, 2], [8, 2, 2, 2])  # solid, dashed, dotted: lines that coincide stay visible
POLICY_SHAPES = ("circle", "square", "triangle-up", "diamond")


def step_utilisation(runs: dict, window_s=None) -> pd.DataFrame:
    """Per-iteration compute and bandwidth utilisation of labelled runs. Used in chapter 7.

    Parameters
    ----------
    runs : dict of label -> SimResult
    window_s : (float, float), optional
        Keep steps starting in this interval of seconds (default: every step).

    Returns
    -------
    DataFrame
        ``run``, ``kind`` (:func:`step_kinds`), ``start_s``, ``duration_s``, ``prefill_tokens``, ``decode_seqs``,
        ``compute_util`` and ``bandwidth_util`` (shares of peak FLOP/s and HBM bytes/s over the step),
        ``intensity`` (FLOP per HBM byte) and ``flops_per_s`` (achieved).
    """
    parts = []
    for label, res in runs.items():
        s = res.steps.assign(run=label, kind=step_kinds(res.steps))
        if window_s is not None:
            s = s[(s["start_s"] >= window_s[0]) & (s["start_s"] < window_s[1])]
        parts.append(s.assign(intensity=s["flops"] / s["hbm_bytes"], flops_per_s=s["flops"] / s["duration_s"]))
    cols = ["run", "kind", "start_s", "duration_s", "prefill_tokens", "decode_seqs", "compute_util",
            "bandwidth_util", "intensity", "flops_per_s"]
    return pd.concat(parts, ignore_index=True)[cols]


def roofline_ceiling(cost, intensities) -> pd.DataFrame:
    """The hardware roofline min(F, I BW) at 100 % of peak, F and BW the peak FLOP/s and HBM bytes/s of ``cost``,
    at each arithmetic intensity I of ``intensities`` (FLOP/byte): ``intensity`` and ``flops_per_s`` (FLOP/s).
    Used in chapter 7.
    """
    i = np.asarray(intensities, dtype=float)
    return pd.DataFrame({"intensity": i, "flops_per_s": np.minimum(cost.peak_flops, i * cost.hardware.hbm_bytes_per_s)})


def budget_split(cost, requests, max_num_batched_tokens, *, bin_s: float = 1.0, **knobs) -> pd.DataFrame:
    """How each iteration's token budget goes to prompt chunks and to decodes, over a run.

    Runs ``policy="chunked"`` once per value of ``max_num_batched_tokens`` and averages, in bins of ``bin_s``
    seconds, the prompt tokens and the decode tokens (one per decoding sequence) per step. Unless ``knobs`` set
    ``max_num_seqs``, each run has vLLM's default seats capped at its budget (:func:`seats_for`), as vLLM requires.
    Used in chapter 7.

    Parameters
    ----------
    cost : CostModel
    requests : Requests
    max_num_batched_tokens : sequence of int
        Token budgets per iteration, one run each.
    bin_s : float
        Width of the time bins (seconds).
    **knobs
        Further knobs of :func:`batchlab.simulate`.

    Returns
    -------
    DataFrame
        ``max_num_batched_tokens``, ``log2_tokens`` (its log2), ``time_s`` (bin start, s), ``kind`` ("prefill"
        or "decode"), ``tokens_per_step`` and ``steps`` (iterations in the bin).
    """
    parts = []
    for budget in max_num_batched_tokens:
        seats = {} if "max_num_seqs" in knobs else {"max_num_seqs": seats_for(cost, budget)}
        s = simulate(requests, "chunked", cost, max_num_batched_tokens=int(budget), **seats, **knobs).steps
        b = (s["start_s"] // bin_s) * bin_s
        per_bin = s.groupby(b).agg(prefill=("prefill_tokens", "mean"), decode=("decode_seqs", "mean"),
                                   steps=("duration_s", "size")).rename_axis("time_s").reset_index()
        long = per_bin.melt(id_vars=["time_s", "steps"], value_vars=["prefill", "decode"], var_name="kind",
                            value_name="tokens_per_step")
        parts.append(long.assign(max_num_batched_tokens=int(budget), log2_tokens=float(np.log2(budget))))
    cols = ["max_num_batched_tokens", "log2_tokens", "time_s", "kind", "tokens_per_step", "steps"]
    return pd.concat(parts, ignore_index=True)[cols]


def mixing_comparison(cost, workload: str, n_requests: int, rates_req_s, *, max_num_batched_tokens: int = 2048,
                      seed=0, policies=None) -> pd.DataFrame:
    """Throughput and latency with and without mixed steps, over offered load.

    Every rate replays the same ``n_requests`` request lengths of :func:`batchlab.preset` (one ``seed``:
    lengths are drawn before arrivals), so runs differ only by their arrival rate and policy. Every policy gets
    the requests that fit the model's context (:func:`batchlab.chapters.scenes.within_context`): vLLM rejects
    the others and the ``continuous`` policies, which know no context limit, would otherwise do more work. Used
    in chapters 7 and 12.

    Parameters
    ----------
    cost : CostModel
    workload : str
        A real-trace preset, e.g. ``"azure-conv-2023"``.
    n_requests : int
        Requests per run.
    rates_req_s : sequence of float
        Offered arrival rates (requests/s; ``inf`` = all at time 0).
    max_num_batched_tokens : int
        Token budget per iteration of the chunked policy, whose ``max_num_seqs`` is vLLM's default capped at the
        budget (:func:`seats_for`) unless a policy's knobs set it.
    seed : int
    policies : dict, optional
        Label -> (policy, knobs); default :data:`MIXING_POLICIES`.

    Returns
    -------
    DataFrame
        One row per rate and policy: ``rate_req_s``, ``policy`` (label) and every ``summary()`` key.
    """
    rows = []
    for rate in rates_req_s:
        stream = scenes.within_context(cost, preset(workload, n_requests, rate_req_s=float(rate), seed=seed))
        for label, (policy, knobs) in (policies or MIXING_POLICIES).items():
            if policy == "chunked":  # the policy's own knobs win
                knobs = {"max_num_batched_tokens": max_num_batched_tokens,
                         "max_num_seqs": seats_for(cost, max_num_batched_tokens), **knobs}
            res = simulate(stream, policy, cost, **knobs)
            rows.append({"rate_req_s": float(rate), "policy": label, **res.summary()})
    return pd.DataFrame(rows)


def kind_medians(util: pd.DataFrame) -> pd.DataFrame:
    """Median share of peak compute and bandwidth, intensity and duration of each kind of iteration, per run.

    Used in chapter 7: ``util`` is :func:`step_utilisation`. One row per run and kind (runs in the order they
    appear, kinds in :data:`STEP_KINDS` order): ``run``, ``kind``, ``compute_util``, ``bandwidth_util``,
    ``intensity`` (FLOP/byte), ``duration_s``, ``decode_seqs`` and ``prefill_tokens`` (medians) and
    ``iterations`` (how many).
    """
    cols = ["compute_util", "bandwidth_util", "intensity", "duration_s", "decode_seqs", "prefill_tokens"]
    g = util.groupby(["run", "kind"], sort=False)
    out = g[cols].median().assign(iterations=g.size()).reset_index()
    order = {run: i for i, run in enumerate(dict.fromkeys(util["run"]))}
    return out.sort_values(["run", "kind"], key=lambda c: c.map(order) if c.name == "run" else c.map(
        {k: i for i, k in enumerate(STEP_KINDS)})).reset_index(drop=True)


def steps_table(steps: pd.DataFrame):
    """Rows of ``SimResult.steps`` as the page shows them (a ``Styler``): the iteration's number, its start (s),
    duration (the book's duration rule), prompt tokens, decode rows, TFLOP and GB of HBM traffic. Chapter 7."""
    out = steps.rename_axis("step").reset_index()
    out = out.assign(tflop=out["flops"] / 1e12, hbm_gb=out["hbm_bytes"] / 1e9)
    return viz.display_table(out, {"step": ("iteration", "{:,}".format), "start_s": ("start (s)", "{:.3f}".format),
                                   "duration_s": ("duration", lambda v: viz.format_duration(v, unit="s")),
                                   "prefill_tokens": ("prompt tokens", "{:,}".format),
                                   "decode_seqs": ("decode rows", "{:,}".format),
                                   "tflop": ("compute (TFLOP)", "{:.2f}".format),
                                   "hbm_gb": ("HBM traffic (GB)", "{:.1f}".format)})


def kind_table(util: pd.DataFrame):
    """:func:`kind_medians` as the page shows it, one row per run and kind of iteration (a ``Styler``): the count
    of iterations, then medians (the page says so). Chapter 7."""
    out = kind_medians(util)
    out = out.assign(duration_ms=out["duration_s"] * 1e3)
    pct = "{:.0%}".format
    return viz.display_table(out, {"run": ("run", str), "kind": ("iteration", str),
                                   "iterations": ("iterations", "{:,}".format),
                                   "decode_seqs": ("decode rows", "{:,.0f}".format),
                                   "compute_util": ("compute (% of peak)", pct),
                                   "bandwidth_util": ("bandwidth (% of peak)", pct),
                                   "intensity": ("FLOP per byte", "{:,.0f}".format),
                                   "duration_ms": ("duration (ms)", "{:.1f}".format)})


def prefill_stalls(steps: pd.DataFrame) -> pd.DataFrame:
    """Runs of consecutive prefill-only iterations: the stretches every running decode waits through.

    Used in chapter 7. ``steps`` is ``SimResult.steps``; an iteration is prefill-only if it computes prompt
    tokens and no decode. Returns one row per stall: ``start_s`` (s), ``iterations`` and ``duration_s`` (s).
    """
    only = ((steps["decode_seqs"] == 0) & (steps["prefill_tokens"] > 0)).to_numpy()
    stall = np.cumsum(~only)[only]  # consecutive prefill-only iterations share the count of iterations before
    g = steps[only].groupby(stall)
    return pd.DataFrame({"start_s": g["start_s"].min(), "iterations": g.size(),
                         "duration_s": g["duration_s"].sum()}).reset_index(drop=True)


def stall_comparison(cost, workload: str, n_requests: int, rates_req_s, *, seed=0) -> pd.DataFrame:
    """Why prefill-only iterations give a p99 ITL that peaks near capacity: stalls and the KV cache per rate.

    Runs ``continuous`` with ``prefill_only_steps=True`` (vLLM V0's order) on the stream of
    :func:`mixing_comparison` at each rate. Used in chapter 7.

    Parameters
    ----------
    cost : CostModel
    workload : str
        A real-trace preset.
    n_requests : int
    rates_req_s : sequence of float
        Offered arrival rates (requests/s).
    seed : int

    Returns
    -------
    DataFrame
        One row per rate: ``rate_req_s``, ``n_requests``, ``n_run`` (the requests that fit the context, which
        the run serves), ``p99_itl_ms``, ``p99_ttft_ms`` (ms),
        ``request_throughput`` (req/s), ``preemptions``, ``kv_used`` (median share of the KV pool in use over the
        iterations), ``stalls``, ``chained`` (share of stalls longer than one iteration), ``p99_stall_ms`` (ms).
    """
    rows = []
    for rate in rates_req_s:
        stream = scenes.within_context(cost, preset(workload, n_requests, rate_req_s=float(rate), seed=seed))
        res = simulate(stream, "continuous", cost, prefill_only_steps=True)
        summary, stalls = res.summary(), prefill_stalls(res.steps)
        pool = res.knobs["num_kv_blocks"] - 1  # blocks; one is vLLM's null block
        rows.append({"rate_req_s": float(rate), "n_requests": n_requests, "n_run": len(stream.arrival_s),
                     **{k: summary[k] for k in ("p99_itl_ms", "p99_ttft_ms", "request_throughput", "preemptions")},
                     "kv_used": float(res.steps["kv_blocks_used"].median() / pool), "stalls": len(stalls),
                     "chained": float((stalls["iterations"] > 1).mean()),
                     "p99_stall_ms": float(stalls["duration_s"].quantile(0.99) * 1e3)})
    return pd.DataFrame(rows)


def stall_table(stalls: pd.DataFrame):
    """:func:`stall_comparison` with headers in words and units (a ``Styler``). Used in chapter 7."""
    return viz.display_table(stalls.assign(p99_ttft_ms=stalls["p99_ttft_ms"] / 1e3), {
        "n_run": ("requests run", "{:,}"), "rate_req_s": ("offered (req/s)", "{:.0f}"),
        "request_throughput": ("served (req/s)", "{:.1f}"), "kv_used": ("KV cache in use (median)", "{:.0%}"),
        "chained": ("stalls of 2+ iterations", "{:.0%}"), "p99_stall_ms": ("p99 stall (ms)", "{:,.0f}"),
        "p99_itl_ms": ("p99 ITL (ms)", "{:,.0f}"), "p99_ttft_ms": ("p99 TTFT (s)", "{:,.1f}")}, na_rep=None)


def _kind_color():
    return alt.Color("kind:N", title="step", legend=alt.Legend(orient="top"),
                     scale=alt.Scale(domain=list(KIND_COLORS), range=list(KIND_COLORS.values())))


def utilisation_chart(steps: pd.DataFrame, ceiling: pd.DataFrame):
    """Each iteration's share of peak FLOP/s against its share of HBM bandwidth, and the roofline. Chapter 7.

    Parameters
    ----------
    steps : DataFrame
        :func:`step_utilisation`: ``kind``, ``compute_util``, ``bandwidth_util`` (shares), ``intensity``
        (FLOP/byte), ``flops_per_s`` and ``run``.
    ceiling : DataFrame
        :func:`roofline_ceiling`: ``intensity``, ``flops_per_s``.

    Returns
    -------
    altair chart: utilisation shares on top, achieved TFLOP/s against intensity on log axes below; colour is
    the kind of iteration, shape the run (with a legend for each).
    """
    tips = [viz.tip("run", "run", kind="N"), viz.tip("kind", "iteration", kind="N"),
            viz.tip("prefill_tokens", "prompt tokens in the iteration (tokens)", ",d"),
            viz.tip("decode_seqs", "decode rows (sequences)", ",d"), viz.tip("duration_ms", "step time (ms)", ".1f"),
            viz.tip("compute_util", "share of peak compute (%)", ".0%"),
            viz.tip("bandwidth_util", "share of peak memory bandwidth (%)", ".0%"),
            viz.tip("intensity", "arithmetic intensity (FLOP per byte)", ",.0f"),
            viz.tip("tflops", "achieved compute (TFLOP/s)", ",.0f")]
    share, pct = alt.Scale(domain=[0, 1]), alt.Axis(format="%", values=[0, 0.2, 0.4, 0.6, 0.8, 1.0])
    labels = list(dict.fromkeys(steps["run"]))
    run = alt.Shape("run:N", title="run", scale=alt.Scale(domain=labels, range=list(RUN_SHAPES[:len(labels)])),
                    legend=alt.Legend(orient="top", direction="vertical", labelLimit=0))
    steps = steps.assign(duration_ms=steps["duration_s"] * 1e3, tflops=steps["flops_per_s"] / 1e12)
    utils = alt.Chart(steps).mark_point(size=22, opacity=0.5, filled=True).encode(
        x=alt.X("bandwidth_util:Q", title="share of peak memory bandwidth (%)", scale=share, axis=pct),
        y=alt.Y("compute_util:Q", title="share of peak compute (%)", scale=share, axis=pct),
        color=_kind_color(), shape=run, tooltip=tips).properties(width=440, height=220)
    tflops = "datum.flops_per_s / 1e12"
    ticks = [t for t in (10, 30, 100, 300, 1000, 3000, 10000, 30000) if ceiling["intensity"].min() <= t
             <= ceiling["intensity"].max()]  # 1-3-10: a phone's narrow axis has room for these labels
    x = alt.X("intensity:Q", title="arithmetic intensity (FLOP per byte)", scale=alt.Scale(type="log", nice=False),
              axis=alt.Axis(values=ticks, format=","))
    span = [float(ceiling["flops_per_s"].min() / 1e12), float(ceiling["flops_per_s"].max() / 1e12 * 1.1)]
    ticks = viz.log_ticks(steps["flops_per_s"].tolist() + ceiling["flops_per_s"].tolist(), 1e-12)
    y = alt.Y("tflops:Q", title="achieved compute (TFLOP/s)", scale=alt.Scale(type="log", domain=span),
              axis=alt.Axis(values=ticks, format=","))
    dots = alt.Chart(steps).mark_point(
        size=22, opacity=0.5, filled=True, clip=True).encode(  # clip: a near-empty step sits below the axis
        x=x, y=y, color=_kind_color(), shape=run, tooltip=tips)
    roof = alt.Chart(ceiling).transform_calculate(tflops=tflops).mark_line(color="#333333", strokeWidth=1).encode(
        x=x, y=y, tooltip=[viz.tip("intensity", "arithmetic intensity (FLOP per byte)", ",.0f"),
                           viz.tip("tflops", "roofline ceiling (TFLOP/s)", ",.0f")])
    return alt.vconcat(utils, alt.layer(roof, dots).properties(width=440, height=220))


def budget_split_chart(split: pd.DataFrame, max_num_batched_tokens: int = 2048):
    """Prompt tokens and decode tokens per iteration over a run, stacked, with a token-budget slider. Chapter 7.

    Parameters
    ----------
    split : DataFrame
        :func:`budget_split`: ``max_num_batched_tokens``, ``log2_tokens`` (evenly spaced), ``time_s``,
        ``kind`` ("prefill"/"decode"), ``tokens_per_step``.
    max_num_batched_tokens : int
        Token budget selected at first.

    Returns
    -------
    altair chart; a slider labelled in tokens (parameter ``log2_tokens``, the budget's log2) picks the budget's
    run and moves the dashed budget line.
    """
    param, at = viz.grid_param("log2_tokens", split["log2_tokens"], "max_num_batched_tokens (tokens)",
                               value=float(np.log2(max_num_batched_tokens)),
                               labels=viz.grid_labels(split, "log2_tokens", "max_num_batched_tokens"))
    base = alt.Chart(split).transform_filter(at)
    kinds = alt.Scale(domain=["decode", "prefill"], range=[KIND_COLORS["decode"], KIND_COLORS["prefill"]])
    area = base.mark_area(interpolate="step-after", opacity=0.85).encode(
        x=alt.X("time_s:Q", title="time (s)"),
        y=alt.Y("tokens_per_step:Q", title="tokens per iteration (mean over 1 s)", stack="zero"),
        color=alt.Color("kind:N", title=None, scale=kinds, legend=alt.Legend(orient="top")),
        order=alt.Order("order:Q"), tooltip=[viz.tip("time_s", "second of the run, from (s)", ".0f"),
                                             viz.tip("kind", "tokens: decode / prefill", kind="N"),
                                             viz.tip("tokens_per_step", "tokens per iteration (mean)", ",.0f")]
    ).transform_calculate(order="datum.kind == 'decode' ? 0 : 1")
    budget = base.transform_aggregate(max_num_batched_tokens="max(max_num_batched_tokens)")
    rule = budget.mark_rule(strokeDash=[4, 3], color="#333333").encode(y="max_num_batched_tokens:Q")
    text = budget.transform_calculate(
        label="'budget ' + format(datum.max_num_batched_tokens, ',') + ' tokens'").mark_text(
        align="left", x=4, dy=-7, fontSize=11).encode(y="max_num_batched_tokens:Q", text="label:N")
    return alt.layer(area, rule, text).properties(width=470, height=240).add_params(param)


def mixing_chart(df: pd.DataFrame, rate_req_s: float, capacity_req_s: float | None = None):
    """Output throughput and p99 ITL against offered load, one line per policy, the headline load ruled. Chapter 7.

    Parameters
    ----------
    df : DataFrame
        :func:`mixing_comparison`: ``rate_req_s`` (req/s; infinite rates are left out), ``policy``,
        ``output_throughput`` (tok/s), ``p99_itl_ms`` (ms).
    rate_req_s : float
        The offered load the page reads its numbers at (req/s), a dashed rule.
    capacity_req_s : float, optional
        The scene's capacity (req/s), a grey rule labelled "capacity" on the throughput panel.

    Returns
    -------
    altair chart: throughput on top, p99 ITL (log axis) below; each policy has its colour, dash and marker
    shape, so lines that coincide stay distinguishable.
    """
    policies = list(dict.fromkeys(df["policy"]))
    legend = alt.Legend(orient="bottom", columns=1, labelLimit=0, symbolStrokeWidth=2, symbolSize=60)
    color = alt.Color("policy:N", title=None, legend=legend, scale=alt.Scale(domain=policies))
    dash = alt.StrokeDash("policy:N", title=None, legend=legend,
                          scale=alt.Scale(domain=policies, range=list(POLICY_DASHES[:len(policies)])))
    shape = alt.Shape("policy:N", title=None, legend=legend,
                      scale=alt.Scale(domain=policies, range=list(POLICY_SHAPES[:len(policies)])))
    x = alt.X("rate_req_s:Q", title="offered load (requests/s)", scale=alt.Scale(zero=False))
    tips = [viz.tip("rate_req_s", "offered load (req/s)", ".1f"), viz.tip("policy", "scheduler", kind="N"),
            viz.tip("output_throughput", "output throughput (tok/s)", ",.0f"),
            viz.tip("p99_itl_ms", "p99 inter-token latency (ms)", ",.0f")]
    base = alt.Chart(df[np.isfinite(df["rate_req_s"])]).encode(x=x, color=color, strokeDash=dash, tooltip=tips)
    mark = alt.Chart(pd.DataFrame({"rate_req_s": [rate_req_s]})).mark_rule(strokeDash=[4, 3], color="#777777").encode(
        x=x, tooltip=[viz.tip("rate_req_s", "offered load read in the text (req/s)", ".1f")])
    extra = []
    if capacity_req_s is not None:
        cap = alt.Chart(pd.DataFrame({"capacity_req_s": [capacity_req_s], "label": ["capacity"]})).encode(
            x=alt.X("capacity_req_s:Q", scale=alt.Scale(zero=False)),
            tooltip=[viz.tip("capacity_req_s", "the scene's capacity (req/s)", ".1f")])
        extra = [cap.mark_rule(color="#bbbbbb", strokeWidth=2),
                 cap.mark_text(align="right", dx=-4, y=8, fontSize=10, color="#555555").encode(text="label:N")]

    def lines(y):  # dashed lines under hollow markers of three shapes: where the lines coincide, both show
        return [base.mark_line(strokeWidth=2).encode(y=y),
                base.mark_point(filled=False, size=55, strokeWidth=1.5).encode(y=y, shape=shape)]

    tput = alt.layer(*extra, *lines(alt.Y("output_throughput:Q", title=viz.title("output_throughput"))),
                     mark).properties(width=440, height=200)
    gaps = df.loc[np.isfinite(df["rate_req_s"]), "p99_itl_ms"]
    ticks = [t for t in viz.log_ticks(gaps) if f"{t:g}"[0] in "125"]  # 1-2-5: a few labels, none crowded
    ticks = ticks if len(ticks) <= 6 else [t for t in ticks if f"{t:g}"[0] == "1"] or ticks
    span = [min(ticks[0], gaps.min()) / 1.15, max(ticks[-1], gaps.max()) * 1.15]
    itl = alt.layer(*lines(alt.Y("p99_itl_ms:Q", title="p99 inter-token latency (ms)",
                                 scale=alt.Scale(type="log", domain=span, nice=False),
                                 axis=alt.Axis(values=ticks, format=","))),
                    mark).properties(width=440, height=200)
    return alt.vconcat(tput, itl)


# -- facts other pages glue (batchlab.chapters.facts) ----------------------------------------------------------
MIX_MAX_NUM_BATCHED_TOKENS = 2048  # the chunked policy's budget in the mixing comparison


@facts.memo
def _mixing(cost, workload: str, n_requests: int, rates, budget: int, seed) -> pd.DataFrame:
    return mixing_comparison(cost, workload, n_requests, list(rates), max_num_batched_tokens=budget, seed=seed)


def conv_mixing(rates_req_s) -> pd.DataFrame:
    """:func:`mixing_comparison` on the conv scene at ``rates_req_s`` (cached), the budget
    :data:`MIX_MAX_NUM_BATCHED_TOKENS`."""
    s = scenes.scene("conv")
    return _mixing(s.cost(), s.workload, s.n_requests, tuple(float(r) for r in rates_req_s),
                   MIX_MAX_NUM_BATCHED_TOKENS, s.seed)


def _at_over() -> pd.DataFrame:
    from .two_knobs import conv_rates

    rate = conv_rates()["over"]
    return conv_mixing([rate]).set_index("policy")


_MIX_KEYS = {"v1": "chunked: prompt chunks mixed in (vLLM V1)", "sync": "chunked, synchronous scheduling",
             "orca": "whole prompts mixed in (Orca)",
             "v0": "prefill-only steps (vLLM V0)"}
_MIX_WORDS = {"v1": "chunked prefill, prompt chunks mixed into decode steps (vLLM V1)",
              "sync": "the same chunked prefill without async scheduling (the synchronous loop of the other two)",
              "orca": "whole prompts mixed into the decode step that admits them (Orca)",
              "v0": "prefill-only steps (vLLM V0)"}


def _mix_facts(key: str):
    @facts.fact(f"mix_{key}_tput", scene="conv", unit="tok/s", fmt=",.0f", chapter="piggybacking",
                text=f"output tokens per second with {_MIX_WORDS[key]}, in the conversation scene at its overload "
                     f"rate ({MIX_MAX_NUM_BATCHED_TOKENS:,}-token budget where there is one)")
    def _tput():
        return float(_at_over().loc[_MIX_KEYS[key], "output_throughput"])

    @facts.fact(f"mix_{key}_p99_itl_ms", scene="conv", unit="ms", fmt=".0f", chapter="piggybacking",
                text=f"the p99 inter-token latency with {_MIX_WORDS[key]}, in the same run")
    def _itl():
        return float(_at_over().loc[_MIX_KEYS[key], "p99_itl_ms"])


for _key in _MIX_KEYS:
    _mix_facts(_key)
