"""Chapter 07, piggybacking: iterations that mix prompt chunks with decodes, and what mixing buys.

:func:`step_utilisation` reads each iteration's share of peak compute and bandwidth, :func:`budget_split`
how ``max_num_batched_tokens`` is shared between prompt chunks and decodes over a run, and
:func:`mixing_comparison` the throughput and ITL of three ways to combine prompts with decodes.
:func:`seats_for` and :func:`within_context` set runs up as vLLM requires: seats no more than the token budget,
prompts shorter than the model's context.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..sim import seats_for, simulate, vllm_defaults  # noqa: F401 - seats_for: chapter 07 quotes it
from ..workload import Requests, preset

STEP_KINDS = ("decode", "mixed", "prefill")
MIXING_POLICIES = {  # label -> (policy, knobs): three ways to combine prompts with the decodes of a batch
    "chunked: prompt chunks mixed in (vLLM V1)": ("chunked", {}),
    "whole prompts mixed in (Orca)": ("continuous", {}),
    "prefill-only steps (vLLM V0)": ("continuous", {"prefill_only_steps": True}),
}
KIND_COLORS = {"decode": viz.PALETTE[0], "mixed": viz.PALETTE[2], "prefill": viz.PALETTE[3]}


def within_context(cost, requests):
    """The requests that fit the model's context, each as vLLM serves it.

    A prompt is kept if it is shorter than ``max_model_len`` (vLLM's default: the model's context), and its output
    is clipped to the room the prompt leaves, as vLLM clips ``max_tokens``. vLLM rejects a longer prompt;
    ``continuous`` (Orca, vLLM V0) knows no context limit and would serve it, so a comparison of the policies
    gives all of them this stream and they do the same work. Used in chapters 07 and 09.

    Parameters
    ----------
    cost : CostModel
        Its model's ``max_position_embeddings`` (tokens) is the context.
    requests : Requests
        A stream without ``prefix_blocks``.

    Returns
    -------
    Requests
        The kept requests, in arrival order, with their arrival times.
    """
    if requests.prefix_blocks is not None:
        raise ValueError("within_context takes a stream without prefix_blocks")
    context = cost.model.max_position_embeddings
    keep = requests.prompt_tokens < context
    prompt = requests.prompt_tokens[keep]
    return Requests(arrival_s=requests.arrival_s[keep], prompt_tokens=prompt,
                    output_tokens=np.minimum(requests.output_tokens[keep], context - prompt))


def step_kinds(steps: pd.DataFrame) -> np.ndarray:
    """Kind of each iteration: "decode" (no prompt tokens), "prefill" (no decodes) or "mixed" (both).

    Used in chapter 07.

    Parameters
    ----------
    steps : DataFrame
        ``SimResult.steps`` (``prefill_tokens``, ``decode_seqs``).

    Returns
    -------
    numpy.ndarray of str
        One of :data:`STEP_KINDS` per iteration.
    """
    prefill, decode = steps["prefill_tokens"].to_numpy() > 0, steps["decode_seqs"].to_numpy() > 0
    return np.where(prefill & decode, "mixed", np.where(prefill, "prefill", "decode"))


def step_utilisation(runs: dict, window_s=None) -> pd.DataFrame:
    """Per-iteration compute and bandwidth utilisation of labelled runs.

    Used in chapter 07.

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
    """The hardware roofline min(F, I * BW) at 100 % of peak.

    Used in chapter 07.

    Parameters
    ----------
    cost : CostModel
        Gives the peak FLOP/s (F) and HBM bytes/s (BW).
    intensities : array-like of float
        Arithmetic intensities (FLOP per byte).

    Returns
    -------
    DataFrame
        ``intensity`` (FLOP/byte) and ``flops_per_s`` (FLOP/s).
    """
    i = np.asarray(intensities, dtype=float)
    return pd.DataFrame({"intensity": i, "flops_per_s": np.minimum(cost.peak_flops, i * cost.hardware.hbm_bytes_per_s)})


def budget_split(cost, requests, max_num_batched_tokens, *, bin_s: float = 1.0, **knobs) -> pd.DataFrame:
    """How each iteration's token budget goes to prompt chunks and to decodes, over a run.

    Runs ``policy="chunked"`` once per value of ``max_num_batched_tokens`` and averages, in bins of ``bin_s``
    seconds, the prompt tokens and the decode tokens (one per decoding sequence) per step. Unless ``knobs`` set
    ``max_num_seqs``, each run has vLLM's default seats capped at its budget (:func:`seats_for`), as vLLM requires.
    Used in chapter 07.

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
    the requests that fit the model's context (:func:`within_context`): vLLM rejects the others and the
    ``continuous`` policies, which know no context limit, would otherwise do more work. Used in chapters 07
    and 09.

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
        stream = within_context(cost, preset(workload, n_requests, rate_req_s=float(rate), seed=seed))
        for label, (policy, knobs) in (policies or MIXING_POLICIES).items():
            if policy == "chunked":  # the policy's own knobs win
                knobs = {"max_num_batched_tokens": max_num_batched_tokens,
                         "max_num_seqs": seats_for(cost, max_num_batched_tokens), **knobs}
            res = simulate(stream, policy, cost, **knobs)
            rows.append({"rate_req_s": float(rate), "policy": label, **res.summary()})
    return pd.DataFrame(rows)


def _kind_color():
    return alt.Color("kind:N", title="step", legend=alt.Legend(orient="top"),
                     scale=alt.Scale(domain=list(KIND_COLORS), range=list(KIND_COLORS.values())))


def utilisation_chart(steps: pd.DataFrame, ceiling: pd.DataFrame):
    """Each iteration's share of peak FLOP/s against its share of HBM bandwidth, and the roofline.

    Used in chapter 07.

    Parameters
    ----------
    steps : DataFrame
        :func:`step_utilisation`: ``kind``, ``compute_util``, ``bandwidth_util`` (shares), ``intensity``
        (FLOP/byte), ``flops_per_s`` and ``run``.
    ceiling : DataFrame
        :func:`roofline_ceiling`: ``intensity``, ``flops_per_s``.

    Returns
    -------
    altair chart: utilisation shares on top, achieved TFLOP/s against intensity on log axes below.
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
              axis=alt.Axis(values=viz.log_ticks(ceiling["intensity"]), format=","))
    span = [float(ceiling["flops_per_s"].min() / 1e12), float(ceiling["flops_per_s"].max() / 1e12 * 1.1)]
    ticks = viz.log_ticks(steps["flops_per_s"].tolist() + ceiling["flops_per_s"].tolist(), 1e-12)
    y = alt.Y("tflops:Q", title="achieved compute (tflop/s)", scale=alt.Scale(type="log", domain=span),
              axis=alt.Axis(values=ticks, format=","))
    dots = alt.Chart(steps).transform_calculate(tflops=tflops).mark_circle(size=18, opacity=0.5).encode(
        x=x, y=y, color=_kind_color(), tooltip=tips)
    roof = alt.Chart(ceiling).transform_calculate(tflops=tflops).mark_line(color="#333333", strokeWidth=1).encode(
        x=x, y=y)
    return alt.vconcat(utils, alt.layer(roof, dots).properties(width=440, height=220))


def budget_split_chart(split: pd.DataFrame, max_num_batched_tokens: int = 2048):
    """Prompt tokens and decode tokens per iteration over a run, stacked, with a token-budget control.

    Used in chapter 07.

    Parameters
    ----------
    split : DataFrame
        :func:`budget_split`: ``max_num_batched_tokens``, ``log2_tokens`` (evenly spaced), ``time_s``,
        ``kind`` ("prefill"/"decode"), ``tokens_per_step``.
    max_num_batched_tokens : int
        Token budget selected at first.

    Returns
    -------
    altair chart; buttons labelled in tokens (parameter ``log2_tokens``, the budget's log2) pick the budget's
    run and move the dashed budget line.
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
        order=alt.Order("order:Q"), tooltip=["time_s:Q", "kind:N", alt.Tooltip("tokens_per_step:Q", format=".0f")]
    ).transform_calculate(order="datum.kind == 'decode' ? 0 : 1")
    budget = base.transform_aggregate(max_num_batched_tokens="max(max_num_batched_tokens)")
    rule = budget.mark_rule(strokeDash=[4, 3], color="#333333").encode(y="max_num_batched_tokens:Q")
    text = budget.transform_calculate(
        label="'budget ' + format(datum.max_num_batched_tokens, ',') + ' tokens'").mark_text(
        align="left", x=4, dy=-7, fontSize=11).encode(y="max_num_batched_tokens:Q", text="label:N")
    return alt.layer(area, rule, text).properties(width=470, height=240).add_params(param)


def mixing_chart(df: pd.DataFrame, rate_req_s: float):
    """Output throughput and p99 ITL against offered load, one line per policy, the headline load ruled.

    Used in chapter 07.

    Parameters
    ----------
    df : DataFrame
        :func:`mixing_comparison`: ``rate_req_s`` (req/s; infinite rates are left out), ``policy``,
        ``output_throughput`` (tok/s), ``p99_itl_ms`` (ms).
    rate_req_s : float
        The offered load the page reads its numbers at (req/s).

    Returns
    -------
    altair chart: throughput on top, p99 ITL (log axis) below.
    """
    color = alt.Color("policy:N", title=None, legend=alt.Legend(orient="bottom", columns=1, labelLimit=0))
    x = alt.X("rate_req_s:Q", title="offered load (requests/s)")
    base = alt.Chart(df[np.isfinite(df["rate_req_s"])]).encode(x=x, color=color, tooltip=list(df.columns[:2]))
    mark = alt.Chart(pd.DataFrame({"rate_req_s": [rate_req_s]})).mark_rule(strokeDash=[4, 3], color="#777777").encode(
        x=x)
    tput = alt.layer(base.mark_line(point=True).encode(
        y=alt.Y("output_throughput:Q", title=viz.title("output_throughput"))), mark).properties(width=440, height=200)
    itl = alt.layer(base.mark_line(point=True).encode(y=alt.Y("p99_itl_ms:Q", title="p99 inter-token latency (ms)",
                                                              scale=alt.Scale(type="log"))),
                    mark).properties(width=440, height=200)
    return alt.vconcat(tput, itl)
