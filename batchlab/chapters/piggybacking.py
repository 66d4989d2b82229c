"""Chapter 7, piggybacking: iterations that mix prompt chunks with decodes, and what mixing buys.

:func:`step_utilisation` reads each iteration's share of peak compute and bandwidth, :func:`budget_split`
how ``max_num_batched_tokens`` is shared between prompt chunks and decodes over a run, and
:func:`mixing_comparison` the throughput and ITL of three ways to combine prompts with decodes, and
:func:`stall_comparison` (with :func:`prefill_stalls`) why the p99 ITL of prefill-only iterations peaks near
capacity. :func:`kind_table` and :func:`stall_table` format the tables. Inside one iteration,
:func:`iteration_rows` replays a run's schedule into each iteration's rows (prompt chunks with their new and
cached tokens, decodes with their context), :func:`iteration_split` gives both sides of every roofline of one
iteration and :func:`iteration_apart` what its parts would cost as iterations of their own; :func:`picker_frames`
and :func:`iteration_chart` make the iteration picker.
:func:`seats_for` and :func:`batchlab.chapters.scenes.within_context` set runs up as vLLM requires: seats no
more than the token budget, prompts shorter than the model's context.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..sim import seats_for, simulate, vllm_defaults  # noqa: F401 - seats_for: chapter 7 quotes it
from ..workload import preset
from . import facts, scenes

STEP_KINDS = ("decode", "mixed", "prefill")
MIXING_POLICIES = {  # label -> (policy, knobs): three ways to combine prompts with the decodes of a batch
    "chunked: prompt chunks mixed in (vLLM V1)": ("chunked", {}),
    "whole prompts mixed in (Orca)": ("continuous", {}),
    "prefill-only steps (vLLM V0)": ("continuous", {"prefill_only_steps": True}),
}
KIND_COLORS = {"decode": viz.PALETTE[0], "mixed": viz.PALETTE[2], "prefill": viz.PALETTE[3]}
RUN_SHAPES = ("circle", "triangle-up", "square", "diamond")  # one per run of the utilisation chart, in order
POLICY_DASHES = ([1, 0], [6, 3], [2, 2], [8, 2, 2, 2])  # solid, dashed, dotted: lines that coincide stay visible
POLICY_SHAPES = ("circle", "square", "triangle-up", "diamond")


def step_kinds(steps: pd.DataFrame) -> np.ndarray:
    """Kind of each iteration of ``steps`` (``SimResult.steps``: ``prefill_tokens``, ``decode_seqs``), one of
    :data:`STEP_KINDS`: "decode" (no prompt tokens), "prefill" (no decodes) or "mixed" (both). Used in chapter 7.
    """
    prefill, decode = steps["prefill_tokens"].to_numpy() > 0, steps["decode_seqs"].to_numpy() > 0
    return np.where(prefill & decode, "mixed", np.where(prefill, "prefill", "decode"))


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


def kind_table(util: pd.DataFrame):
    """Median share of peak compute and bandwidth, intensity and duration of each kind of iteration (a ``Styler``).

    Used in chapter 7: ``util`` is :func:`step_utilisation`; one row per kind, with the number of iterations.
    """
    out = util.groupby("kind")[["compute_util", "bandwidth_util", "intensity", "duration_s"]].median()
    out = out.assign(duration_ms=out["duration_s"] * 1e3, iterations=util.groupby("kind").size()).reset_index()
    pct = "{:.0%}".format
    return viz.display_table(out, {"kind": ("iteration", str), "compute_util": ("median compute (% of peak)", pct),
                                   "bandwidth_util": ("median bandwidth (% of peak)", pct),
                                   "intensity": ("median intensity (FLOP/byte)", "{:,.0f}".format),
                                   "duration_ms": ("median duration (ms)", "{:.1f}".format),
                                   "iterations": ("iterations", "{:,}".format)})


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
        One row per rate: ``rate_req_s``, ``n_requests``, ``p99_itl_ms``, ``p99_ttft_ms`` (ms),
        ``request_throughput`` (req/s), ``preemptions``, ``kv_used`` (median share of the KV pool in use over the
        iterations), ``stalls``, ``chained`` (share of stalls longer than one iteration), ``p99_stall_ms`` (ms).
    """
    rows = []
    for rate in rates_req_s:
        stream = scenes.within_context(cost, preset(workload, n_requests, rate_req_s=float(rate), seed=seed))
        res = simulate(stream, "continuous", cost, prefill_only_steps=True)
        summary, stalls = res.summary(), prefill_stalls(res.steps)
        pool = res.knobs["num_kv_blocks"] - 1  # blocks; one is vLLM's null block
        rows.append({"rate_req_s": float(rate), "n_requests": n_requests, **{k: summary[k] for k in (
            "p99_itl_ms", "p99_ttft_ms", "request_throughput", "preemptions")},
            "kv_used": float(res.steps["kv_blocks_used"].median() / pool), "stalls": len(stalls),
            "chained": float((stalls["iterations"] > 1).mean()),
            "p99_stall_ms": float(stalls["duration_s"].quantile(0.99) * 1e3)})
    return pd.DataFrame(rows)


def stall_table(stalls: pd.DataFrame):
    """:func:`stall_comparison` with headers in words and units (a ``Styler``). Used in chapter 7."""
    return viz.display_table(stalls.assign(p99_ttft_ms=stalls["p99_ttft_ms"] / 1e3), {
        "n_requests": ("requests", "{:,}"), "rate_req_s": ("offered (req/s)", "{:.0f}"),
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
            viz.tip("bandwidth_util", "share of peak memory bandwidth (%)", ".0%")]
    share, pct = alt.Scale(domain=[0, 1]), alt.Axis(format="%", values=[0, 0.2, 0.4, 0.6, 0.8, 1.0])
    labels = list(dict.fromkeys(steps["run"]))
    run = alt.Shape("run:N", title="run", scale=alt.Scale(domain=labels, range=list(RUN_SHAPES[:len(labels)])),
                    legend=alt.Legend(orient="top", direction="vertical", labelLimit=0))
    steps = steps.assign(duration_ms=steps["duration_s"] * 1e3)
    utils = alt.Chart(steps).mark_point(size=22, opacity=0.5, filled=True).encode(
        x=alt.X("bandwidth_util:Q", title="share of peak memory bandwidth (%)", scale=share, axis=pct),
        y=alt.Y("compute_util:Q", title="share of peak compute (%)", scale=share, axis=pct),
        color=_kind_color(), shape=run, tooltip=tips).properties(width=440, height=220)
    tflops = "datum.flops_per_s / 1e12"
    ticks = [t for t in (10, 30, 100, 300, 1000, 3000, 10000, 30000) if ceiling["intensity"].min() <= t
             <= ceiling["intensity"].max()]  # 1-3-10: a phone's narrow axis has room for these labels
    x = alt.X("intensity:Q", title="arithmetic intensity (flop per byte)", scale=alt.Scale(type="log", nice=False),
              axis=alt.Axis(values=ticks, format=","))
    span = [float(ceiling["flops_per_s"].min() / 1e12), float(ceiling["flops_per_s"].max() / 1e12 * 1.1)]
    ticks = viz.log_ticks(steps["flops_per_s"].tolist() + ceiling["flops_per_s"].tolist(), 1e-12)
    y = alt.Y("tflops:Q", title="achieved compute (tflop/s)", scale=alt.Scale(type="log", domain=span),
              axis=alt.Axis(values=ticks, format=","))
    dots = alt.Chart(steps).transform_calculate(tflops=tflops).mark_point(
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
                                             viz.tip("kind", "tokens", kind="N"),
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
    itl = alt.layer(*lines(alt.Y("p99_itl_ms:Q", title="p99 inter-token latency (ms)", scale=alt.Scale(type="log"))),
                    mark).properties(width=440, height=200)
    return alt.vconcat(tput, itl)


# -- inside one iteration: the iteration picker -------------------------------------------------------------------
def iteration_rows(res, last_step: int | None = None) -> pd.DataFrame:
    """The rows of every iteration of a run (up to ``last_step``): which request, prompt chunk or decode, its new
    and cached tokens. Used in chapter 7 (the iteration picker).

    Replays ``res.schedule`` (``simulate(..., record_schedule=True)``) in order. A request's cached tokens are
    what it has computed so far, prefix-cache hits found at admission included; a preemption drops them (the
    request recomputes). A prompt chunk samples a token when it completes what the request knows (its prompt,
    after a preemption with the output it had streamed); a decode always does. These are the pairs the engine
    timed: :func:`iteration_split` of one step's rows gives that step's duration.

    Returns
    -------
    DataFrame
        ``step``, ``request``, ``kind`` ("prefill" or "decode"), ``new_tokens``, ``cached_tokens`` (tokens of
        the request already in the KV cache; a decode's context) and ``samples`` (bool).
    """
    sched = res.schedule  # AttributeError, saying how to record it, if the run did not
    if last_step is not None:
        sched = sched[sched["step"] <= last_step]
    prompt = res.requests["prompt_tokens"].to_numpy()
    computed, emitted = np.zeros(prompt.size, np.int64), np.zeros(prompt.size, np.int64)
    keep, samples, cached = np.zeros(len(sched), bool), np.zeros(len(sched), bool), np.zeros(len(sched), np.int64)
    kinds, tokens = sched["kind"].astype(str).to_numpy(), sched["tokens"].to_numpy()
    for i, (req, kind) in enumerate(zip(sched["request"].to_numpy(), kinds)):
        if kind in ("cached", "preempt"):  # prefix hits found at admission; a preemption drops the KV cache
            computed[req] = computed[req] + tokens[i] if kind == "cached" else 0
            continue
        keep[i], cached[i] = True, computed[req]
        samples[i] = computed[req] + tokens[i] == prompt[req] + emitted[req]  # the row reaches its next token
        computed[req] += tokens[i]
        emitted[req] += samples[i]
    return pd.DataFrame({"step": sched["step"].to_numpy()[keep], "request": sched["request"].to_numpy()[keep],
                         "kind": kinds[keep], "new_tokens": tokens[keep], "cached_tokens": cached[keep],
                         "samples": samples[keep]})


def _breakdown(cost, rows: pd.DataFrame, asynchronous: bool):
    chunks = rows[rows["kind"] == "prefill"]
    return cost.step_breakdown(list(zip(chunks["new_tokens"], chunks["cached_tokens"])),
                               rows.loc[rows["kind"] == "decode", "cached_tokens"].tolist(),
                               sampled_chunks=int(chunks["samples"].sum()), asynchronous=asynchronous)


def iteration_split(cost, rows: pd.DataFrame, asynchronous: bool = True) -> dict:
    """Where one iteration's time goes, with both sides of every roofline (seconds). Used in chapter 7.

    ``rows`` are one step's rows (:func:`iteration_rows`). Each operator takes the longer of its math and its
    memory traffic (:mod:`batchlab.cost`); this gives both: ``gemm_compute_s`` (2 P' T FLOPs at eta_c F) and
    ``gemm_memory_s`` (streaming the body's weights at the calibrated bandwidth), the same pair for the LM head
    (``lm_head_*``, zero if no row samples), ``attn_compute_s`` and ``attn_memory_s`` (reading the cached keys
    and values, writing the new ones), then ``elementwise_s``, ``comm_s``, ``overhead_s`` (the GPU's kernel
    floors), ``cpu_s`` (the engine's CPU work left after async overlap) and ``total_s``, the step's duration.
    """
    b = _breakdown(cost, rows, asynchronous)
    m, bw, tp = cost.model, cost.eta_memory * cost.hardware.hbm_bytes_per_s, cost.tp
    chunks, decodes = rows[rows["kind"] == "prefill"], rows[rows["kind"] == "decode"]
    new = int(chunks["new_tokens"].sum()) + len(decodes)
    c, p = chunks["new_tokens"].to_numpy(float), chunks["cached_tokens"].to_numpy(float)
    attn_work = float((c * (2 * p + c)).sum() + 2 * decodes["cached_tokens"].sum())
    sampled = int(rows["samples"].sum())
    lm = (2.0 * m.embedding_params / tp * sampled / (cost.eta_compute * cost.hardware.peak_flops("bf16")),
          cost.lm_head_bytes / bw) if sampled else (0.0, 0.0)
    return {"gemm_compute_s": 2.0 * m.body_params / tp * new / (cost.eta_compute * cost.peak_flops),
            "gemm_memory_s": (cost.streamed_weight_bytes - cost.lm_head_bytes) / bw,
            "lm_head_compute_s": lm[0], "lm_head_memory_s": lm[1],
            "attn_compute_s": 2.0 * m.layers * m.attn_dim / tp * attn_work / (cost.eta_attn * cost.peak_flops),
            "attn_memory_s": cost.kv_bytes_per_token * (p.sum() + decodes["cached_tokens"].sum() + new) / bw,
            "elementwise_s": b.elementwise_s, "comm_s": b.comm_s, "overhead_s": b.overhead_s, "cpu_s": b.cpu_s,
            "total_s": b.total_s}


def iteration_apart(cost, rows: pd.DataFrame, asynchronous: bool = True) -> dict:
    """What one iteration's decodes and prompt chunks would take as two iterations of their own, and what mixing
    them saves, by part (seconds). Used in chapter 7.

    Returns ``decodes_s`` and ``prompts_s`` (0 for a part the step does not hold), ``saved_s`` (their sum less the
    step; 0 unless it holds both) and its parts: ``saved_weights_s`` (GEMMs and LM head: one weight stream fewer,
    less the decode rows' own FLOPs), ``saved_attention_s`` (the prompt's attention math beside the decodes' KV
    traffic) and ``saved_fixed_s`` (one fixed step cost fewer: kernel floors and CPU work; norms and all-reduces,
    linear in the tokens, save nothing).
    """
    parts = [iteration_split(cost, rows[rows["kind"] == kind], asynchronous) if (rows["kind"] == kind).any()
             else None for kind in ("decode", "prefill")]
    out = {"decodes_s": parts[0]["total_s"] if parts[0] else 0.0, "prompts_s": parts[1]["total_s"] if parts[1] else 0.0}
    if not all(parts):
        return {**out, "saved_s": 0.0, "saved_weights_s": 0.0, "saved_attention_s": 0.0, "saved_fixed_s": 0.0}
    whole = iteration_split(cost, rows, asynchronous)

    def paid(split, *ops):  # each operator costs the longer of its math and its memory traffic
        return sum(max(split[f"{op}_compute_s"], split[f"{op}_memory_s"]) for op in ops)

    part = {"saved_s": lambda x: x["total_s"], "saved_weights_s": lambda x: paid(x, "gemm", "lm_head"),
            "saved_attention_s": lambda x: paid(x, "attn"),
            "saved_fixed_s": lambda x: x["overhead_s"] + x["cpu_s"] + x["elementwise_s"] + x["comm_s"]}
    return {**out, **{k: fn(parts[0]) + fn(parts[1]) - fn(whole) for k, fn in part.items()}}


SPLIT_BARS = (  # operator, resource, iteration_split key: the bars of the time split, in order
    ("weight GEMMs", "compute (tensor cores)", "gemm_compute_s"), ("weight GEMMs", "memory (HBM)", "gemm_memory_s"),
    ("LM head", "compute (tensor cores)", "lm_head_compute_s"), ("LM head", "memory (HBM)", "lm_head_memory_s"),
    ("attention", "compute (tensor cores)", "attn_compute_s"), ("attention", "memory (HBM)", "attn_memory_s"),
    ("norms, RoPE, SiLU", "memory (HBM)", "elementwise_s"), ("GPU kernel floors", "fixed", "overhead_s"),
    ("engine CPU work", "fixed", "cpu_s"))
_KIND_WORDS = {"decode": "decodes only", "mixed": "mixed", "prefill": "prompts only"}
CONTEXT_BIN = 512  # tokens: the decode rows' contexts are counted in bins this wide


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def picker_frames(cost, res, first_step: int, n_steps: int) -> dict:
    """What :func:`iteration_chart` shows of ``n_steps`` iterations of a run from ``first_step``. Chapter 7.

    Returns
    -------
    dict of DataFrame, each with ``position`` (0 .. n_steps - 1, the slider's value):
        ``iterations``: ``step``, ``start_s``, ``duration_s``, ``kind``, ``chunks``, ``prompt_tokens`` (new ones),
        ``decodes``, ``label`` (what
        the slider shows) and the keys of :func:`iteration_apart` (``decodes_s``, ``prompts_s``, ``saved_s``, ...);
        ``readout``: ``line`` and ``text``, four lines per iteration; ``chunks``: ``request``, ``row``, ``part``
        ("cached" or "new"), ``tokens``, ``start``, ``end``, ``text``; ``decodes``: ``context_lo``,
        ``context_hi`` (tokens), ``decodes``; ``split``: ``operator``, ``resource``, ``ms``, ``paid`` (the
        longer side of its operator, what the step pays) and ``text``.
    """
    steps = res.steps.iloc[first_step:first_step + n_steps]
    if len(steps) < n_steps or first_step < 0:
        raise ValueError(f"first_step and n_steps must lie within the run's {len(res.steps)} iterations")
    rows = iteration_rows(res, steps.index[-1])
    asynchronous = bool(res.knobs.get("async_scheduling", False))
    kinds = dict(zip(steps.index, step_kinds(steps)))
    out = {k: [] for k in ("iterations", "readout", "chunks", "decodes", "split")}
    for pos, (step, one) in enumerate(rows[rows["step"] >= first_step].groupby("step")):
        split, apart = iteration_split(cost, one, asynchronous), iteration_apart(cost, one, asynchronous)
        chunks, contexts = one[one["kind"] == "prefill"], one.loc[one["kind"] == "decode", "cached_tokens"]
        new, saved, both = int(chunks["new_tokens"].sum()), apart["saved_s"], len(chunks) and len(contexts)
        out["iterations"].append({"position": pos, "step": step, "start_s": steps.loc[step, "start_s"],
                                  "duration_s": split["total_s"], "kind": kinds[step], "chunks": len(chunks),
                                  "prompt_tokens": new,
                                  "decodes": len(contexts), "label": f"{step:,} ({_KIND_WORDS[kinds[step]]})",
                                  **apart})
        rows_text = (f"{_plural(len(chunks), 'prompt chunk')} ({new:,} new tokens)" if len(chunks) else
                     "no prompt chunk") + f", {_plural(len(contexts), 'decode')}"
        lines = [f"iteration {step:,} at {steps.loc[step, 'start_s']:.2f} s: {split['total_s'] * 1e3:.1f} ms",
                 rows_text, f"apart: decodes {apart['decodes_s'] * 1e3:.1f} ms, prompt chunks "
                 f"{apart['prompts_s'] * 1e3:.1f} ms" if both else f"{_KIND_WORDS[kinds[step]]}: nothing to mix",
                 f"mixing saves {saved * 1e3:.1f} ms" if both else ""]
        out["readout"] += [{"position": pos, "line": i, "text": t} for i, t in enumerate(lines)]
        for row, (req, c, p) in enumerate(zip(chunks["request"], chunks["new_tokens"], chunks["cached_tokens"])):
            text = f"{c:,} new + {p:,} cached"
            out["chunks"] += [{"position": pos, "request": f"request {req:,}", "row": row, "part": part, "tokens": n,
                               "start": lo, "end": lo + n, "text": text}
                              for part, n, lo in (("cached", p, 0), ("new", c, p)) if n or part == "new"]
        counts = np.bincount(contexts.to_numpy() // CONTEXT_BIN)
        out["decodes"] += [{"position": pos, "context_lo": b * CONTEXT_BIN, "context_hi": (b + 1) * CONTEXT_BIN,
                            "decodes": int(n)} for b, n in enumerate(counts) if n]
        for op, resource, key in SPLIT_BARS:
            pair = [split[k] for o, _, k in SPLIT_BARS if o == op]
            if resource != "fixed" and split[key] == 0 and max(pair) == 0:
                continue  # an LM head that does not run
            out["split"].append({"position": pos, "operator": op, "resource": resource, "ms": split[key] * 1e3,
                                 "paid": resource == "fixed" or split[key] == max(pair),
                                 "text": f"{split[key] * 1e3:.1f}"})
    return {k: pd.DataFrame(v) for k, v in out.items()}


def busiest(frames: dict) -> int:
    """Position of the first iteration of :func:`picker_frames` that computes the most prompt tokens. Chapter 7."""
    it = frames["iterations"]
    return int(it["position"].iloc[int(np.argmax(it["prompt_tokens"].to_numpy()))])


def iteration_chart(frames: dict, position: int | None = None):
    """The iteration picker: a slider over the iterations of :func:`picker_frames`, and the chosen one's readout,
    prompt chunks, decode rows and time split. Used in chapter 7.

    ``position`` is the iteration shown first (default :func:`busiest`, the first that computes the most prompt
    tokens).

    Returns
    -------
    altair chart: four panels (readout; prompt chunks, cached then new tokens, one bar per request; decode rows
    counted by context; the time of each operator, compute and memory side by side, the side the step pays
    opaque). The slider (parameter ``iteration``, the position) is labelled with the iteration's number and kind.
    """
    it = frames["iterations"]
    position = busiest(frames) if position is None else position
    param, at = viz.grid_param("iteration", it["position"], "iteration", field="position", value=position,
                               labels=it["label"].tolist())
    width = 440
    readout = alt.Chart(frames["readout"]).transform_filter(at).mark_text(
        align="left", baseline="top", fontSize=11, x=0).encode(
        y=alt.Y("line:O", axis=None), text="text:N",
        tooltip=[viz.tip("text", "this iteration", kind="N")]).properties(width=width, height=70)
    parts = alt.Scale(domain=["cached", "new"], range=[viz.PALETTE[5], viz.PALETTE[3]])
    span = float(frames["chunks"]["end"].max() * 1.45) if len(frames["chunks"]) else 1.0
    chunk_tips = [viz.tip("request", "request", kind="N"), viz.tip("part", "tokens", kind="N"),
                  viz.tip("tokens", "tokens", ",d")]
    chunks = alt.Chart(frames["chunks"]).transform_filter(at)
    y = alt.Y("request:N", title=None, sort=alt.EncodingSortField("row"), axis=alt.Axis(labelLimit=0))
    title = "prompt tokens: cached before, new in this iteration"
    x = alt.X("start:Q", title=title,
              scale=alt.Scale(domain=[0, span]), axis=alt.Axis(format=",d", tickCount=5))
    bars = chunks.mark_bar(height=14).encode(
        x=x, x2="end:Q", y=y, tooltip=chunk_tips,
        color=alt.Color("part:N", title=None, scale=parts, legend=alt.Legend(orient="top")))
    labels = chunks.transform_filter("datum.part == 'new'").mark_text(align="left", dx=4, fontSize=11).encode(
        x=alt.X("end:Q", title=title, scale=alt.Scale(domain=[0, span]), axis=alt.Axis(format=",d", tickCount=5)),
        y=y, text="text:N", tooltip=chunk_tips)
    none = alt.Chart(it).transform_filter(f"{at} && datum.chunks == 0").mark_text(
        fontSize=12, color="#555555", align="left").encode(x=alt.value(8), y=alt.value(45),
                                             text=alt.value("no prompt chunk in this iteration"),
                                             tooltip=[viz.tip("decodes", "decode rows", ",d")])
    top = float(frames["decodes"]["decodes"].max() * 1.1) if len(frames["decodes"]) else 1.0
    hi = int(np.ceil(frames["decodes"]["context_hi"].max() / 2048) * 2048) if len(frames["decodes"]) else 2048
    decodes = alt.Chart(frames["decodes"]).transform_filter(at).mark_bar(color=viz.PALETTE[0]).encode(
        x=alt.X("context_lo:Q", title="decode rows by context (tokens)", bin="binned",
                scale=alt.Scale(domain=[0, hi]), axis=alt.Axis(format=",d", values=list(range(0, hi + 1, 2048)))),
        x2="context_hi:Q", y=alt.Y("decodes:Q", title="decode rows", scale=alt.Scale(domain=[0, top])),
        tooltip=[viz.tip("context_lo", "context from (tokens)", ",d"), viz.tip("context_hi", "to (tokens)", ",d"),
                 viz.tip("decodes", "decode rows", ",d")]).properties(width=width, height=90)
    return alt.vconcat(readout, alt.layer(bars, labels, none).properties(width=width, height=90), decodes,
                       _split_panel(frames["split"], at, width)).add_params(param).resolve_scale(
        color="independent").properties(usermeta={"narrow": {"width": 250}})  # room for the rows' labels


def _split_panel(split: pd.DataFrame, at: str, width: int):
    """Lower panel of :func:`iteration_chart`: each operator's compute and memory time, the paid side opaque."""
    resources = alt.Scale(domain=["compute (tensor cores)", "memory (HBM)", "fixed"],
                          range=[viz.PALETTE[1], viz.PALETTE[0], "#999999"])
    tips = [viz.tip("operator", "operator", kind="N"), viz.tip("resource", "resource", kind="N"),
            viz.tip("ms", "time (ms)", ".2f"), viz.tip("paid_text", "the step pays it", kind="N")]
    base = alt.Chart(split).transform_filter(at).transform_calculate(
        paid_text="datum.paid ? 'yes' : 'no: the other side takes longer'",
        slot="datum.resource == 'compute (tensor cores)' ? 0 : 1").encode(  # compute above, memory or fixed below
        y=alt.Y("operator:N", title=None, sort=list(dict.fromkeys(op for op, _, _ in SPLIT_BARS)),
                axis=alt.Axis(labelLimit=0)), yOffset=alt.YOffset("slot:O"), tooltip=tips)
    x = alt.X("ms:Q", title="time in this iteration (ms)", scale=alt.Scale(domain=[0, float(split["ms"].max() * 1.2)]))
    bars = base.mark_bar().encode(x=x, color=alt.Color("resource:N", title=None, scale=resources,
                                                       legend=alt.Legend(orient="top", labelLimit=0)),
                                  opacity=alt.condition("datum.paid", alt.value(1.0), alt.value(0.3)))
    text = base.mark_text(align="left", dx=3, fontSize=10).encode(x=x, text="text:N")
    return alt.layer(bars, text).properties(width=width, height=210)


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


_MIX_KEYS = {"v1": "chunked: prompt chunks mixed in (vLLM V1)", "orca": "whole prompts mixed in (Orca)",
             "v0": "prefill-only steps (vLLM V0)"}
_MIX_WORDS = {"v1": "chunked prefill, prompt chunks mixed into decode steps (vLLM V1)",
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
