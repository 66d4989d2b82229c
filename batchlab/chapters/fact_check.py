"""Chapter 14, fact check: the article's quantitative claims, each recomputed from the cost model, vLLM's
defaults or the simulator.

:func:`prefill_gap` and :func:`implied_mfu` price the unchunked long prefill (claim 5),
:func:`max_num_seqs_table` applies vLLM's default rule (claim 6), and :func:`chunking_tradeoff` runs the shared
scene of :mod:`batchlab.chapters.scenes` under each token budget (claim 7), drawn by :func:`tradeoff_chart`.
The cadence of claim 4 is :meth:`batchlab.CostModel.batch_for_step_time`.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..hardware import GiB
from ..vllm import vllm_defaults
from . import scenes


def prefill_gap(cost, prompt_tokens: int, decoders: int = 0, context: int = 0, asynchronous: bool = False) -> dict:
    """The one iteration that prefills a whole ``prompt_tokens`` prompt beside ``decoders`` decodes at ``context``.

    ``context`` is each decoder's cached tokens, as in the shared scene's admitting iteration. The engine is the
    synchronous one the scene runs (its CPU work all on the step) unless ``asynchronous``. Used in chapters 12
    and 14.

    Returns
    -------
    dict
        ``step_s`` (seconds: the gap every decoder sees), ``flops`` (FLOP in the step), ``mfu`` (the share of
        the dtype's peak FLOP/s the step runs at, flops / (step_s * peak)) and ``bound``.
    """
    ctx = [context] * decoders
    br = cost.step_breakdown(prefill_chunks=[(prompt_tokens, 0)], decode_contexts=ctx, asynchronous=asynchronous)
    return {"step_s": br.total_s, "flops": br.flops, "mfu": br.flops / (br.total_s * cost.peak_flops),
            "bound": br.bound}


def prefill_arithmetic(cost, prompt_tokens: int) -> dict:
    """The shortest a whole-prompt prefill can take on ``cost``'s GPU, term by term (the pure roofline).

    Used in chapters 05 and 14. The GEMMs do 2 P' N FLOPs (every parameter a token multiplies, the embedding
    table and LM head aside), causal attention adds the rest of the step's FLOPs but the LM head's, which runs on
    the one row that samples and is charged by streaming its weights.

    Returns
    -------
    dict
        ``gemm_flop``, ``attn_flop`` (FLOP), ``lm_head_s``, ``gemm_s`` (the GEMMs alone at the dtype's peak),
        ``ideal_s`` (the whole prefill at 100 % of peak and bandwidth: ``cost.ideal().prefill_time``), ``flops``
        (the step's FLOP) and ``peak_flops`` (FLOP/s).
    """
    ideal = cost.ideal()
    br = ideal.step_breakdown(prefill_chunks=[(prompt_tokens, 0)])
    gemm = 2 * cost.model.body_params * prompt_tokens
    lm = 2 * cost.model.embedding_params  # the LM head's FLOP on the one sampled row
    return {"gemm_flop": gemm, "attn_flop": br.flops - gemm - lm, "lm_head_s": br.lm_head_s,
            "gemm_s": gemm / cost.peak_flops, "ideal_s": ideal.prefill_time(prompt_tokens), "flops": br.flops,
            "peak_flops": cost.peak_flops}


def implied_mfu(cost, prompt_tokens: int, gap_s: float, decoders: int = 0, context: int = 0) -> float:
    """The model FLOPs utilisation at which that prefill step would take exactly ``gap_s`` seconds.

    Used in chapters 12 and 14.
    """
    return prefill_gap(cost, prompt_tokens, decoders, context)["flops"] / (gap_s * cost.peak_flops)


def max_num_seqs_table(hardware_list, models, tp: int = 1) -> pd.DataFrame:
    """vLLM's default ``max_num_seqs`` for each GPU and model, beside the article's size rule.

    Used in chapter 14.

    The article says 1,024 for small models and 256 for large ones; vLLM decides from the GPU alone
    (:func:`batchlab.vllm_defaults`). One row per (GPU, model): ``gpu``, ``hbm_gib`` (memory the driver
    reports, GiB), ``model``, ``params_b`` (billions), ``max_num_seqs`` and ``max_num_batched_tokens``
    (``vllm serve``), ``offline_tokens`` (``LLM``), ``article_rule`` (1024 if under 20 B parameters, else
    256) and ``agrees``.
    """
    rows = []
    for hw in hardware_list:
        serve, offline = vllm_defaults(hw, "serve"), vllm_defaults(hw, "offline")
        for m in models:
            rule = 1024 if m.params < 20e9 else 256
            rows.append({"gpu": hw.name, "hbm_gib": hw.hbm_bytes / GiB, "model": m.name, "params_b": m.params / 1e9,
                         "max_num_seqs": serve["max_num_seqs"],
                         "max_num_batched_tokens": serve["max_num_batched_tokens"],
                         "offline_tokens": offline["max_num_batched_tokens"], "article_rule": rule,
                         "agrees": serve["max_num_seqs"] == rule})
    return pd.DataFrame(rows)


def chunking_tradeoff(cost, max_num_batched_tokens, **scene) -> pd.DataFrame:
    """The shared scene under each token budget: the newcomer's TTFT against the decoders' tallest gap.

    Every budget replays :mod:`batchlab.chapters.scenes`' scene (by default the 20 ms batch of decoders at
    2,048 tokens of KV cache, one 8,000-token prompt arriving) through the ``chunked`` policy. Used in
    chapters 12 and 14.

    Parameters
    ----------
    cost : CostModel
    max_num_batched_tokens : sequence of int
        Token budgets (each above the number of decoders); the rows come out in increasing order.
    **scene
        Passed to :func:`batchlab.chapters.scenes.run` (``n_decoders``, ``context``, ``prompt_tokens``, ...).

    Returns
    -------
    DataFrame, one row per budget: ``max_num_batched_tokens``, ``log2_tokens``, and the scene's ``itl_max_s``
    (the tallest gap of any decoder during the newcomer's prefill), ``ttft_s`` (the newcomer's), ``cadence_s``
    (the decoders' step before it arrived) and ``chunks`` (iterations its prompt was computed in), in seconds.
    """
    tokens = sorted(int(b) for b in max_num_batched_tokens)
    runs = scenes.budget_sweep(cost, tokens, **scene)
    keep = ("itl_max_s", "ttft_s", "cadence_s", "chunks")
    return pd.DataFrame([{"max_num_batched_tokens": b, "log2_tokens": float(np.log2(b)),
                          **{k: r.measures[k] for k in keep}} for b, r in zip(tokens, runs)])


def tradeoff_chart(trade: pd.DataFrame, width: int = 420, height: int = 260):
    """The newcomer's TTFT against the decoders' tallest gap, one point per token budget.

    Used in chapter 14.

    Parameters
    ----------
    trade : DataFrame
        :func:`chunking_tradeoff`: ``max_num_batched_tokens``, ``log2_tokens`` (an evenly spaced grid),
        ``ttft_s``, ``itl_max_s``, ``cadence_s`` (s), ``chunks``.

    Returns
    -------
    altair chart; a slider over the budget, shown in tokens (the parameter holds its log2), rings the chosen
    point (the one point without a budget label) and reads its numbers; the decoders' cadence before the prompt
    arrived is a dashed rule.
    """
    param, at = viz.grid_param("log2_tokens", trade["log2_tokens"], "max_num_batched_tokens (tokens)",
                               value=float(trade["log2_tokens"].max()),
                               labels=viz.grid_labels(trade, "log2_tokens", "max_num_batched_tokens"))
    ms = trade.assign(ttft_ms=trade["ttft_s"] * 1e3, itl_max_ms=trade["itl_max_s"] * 1e3)
    thousands = alt.Axis(format=",.0f")
    x = alt.X("ttft_ms:Q", title="newcomer's TTFT (ms)", scale=alt.Scale(zero=False),
              axis=alt.Axis(format=",.0f", tickCount=5))  # every 100 ms: at 400 px, 50 ms apart they crowd
    top = float(trade["itl_max_s"].max() * 1e3 * 1.15)  # room above the tallest point for its label
    y = alt.Y("itl_max_ms:Q", title="tallest decoder gap (ms)", scale=alt.Scale(domain=[0, top], nice=True),
              axis=thousands)
    base = alt.Chart(ms[["max_num_batched_tokens", "log2_tokens", "ttft_ms", "itl_max_ms", "chunks"]]).encode(x=x, y=y)
    # durations as the readout and the prose print them (viz.duration_text: "27.3 ms", "568 ms")
    tooltip = [viz.tip("max_num_batched_tokens", "max_num_batched_tokens (tokens)", fmt=","),
               viz.tip("chunks", "iterations that compute the prompt", ","),
               viz.tip("ttft_text", "newcomer's TTFT", kind="N"),
               viz.tip("gap_text", "tallest decoder gap", kind="N")]
    cadence = alt.Chart(pd.DataFrame({"itl_max_ms": [float(trade["cadence_s"].median() * 1e3)],
                                      "text": ["decode cadence before the prompt arrived"]}))
    picked = base.transform_filter(at).transform_calculate(label=(  # two lines: room beside the top-left point
        "format(datum.max_num_batched_tokens, ',') + ' tokens, ' + datum.chunks"
        " + (datum.chunks == 1 ? ' chunk' : ' chunks') + '\\nTTFT ' + (" + viz.duration_text("ttft_ms") + ") + ', gap '"
        " + (" + viz.duration_text("itl_max_ms") + ")"))
    return alt.layer(
        base.transform_calculate(ttft_text=viz.duration_text("ttft_ms"), gap_text=viz.duration_text("itl_max_ms"))
        .mark_line(point=True, color=viz.PALETTE[0]).encode(order="max_num_batched_tokens:Q", tooltip=tooltip),
        # Every budget but the chosen one labels its point: the chosen one's ring would cross its label, and the
        # bold readout names it.
        base.transform_filter(f"!({at})").mark_text(align="left", dx=7, dy=-7, color="#555555").encode(
            text=alt.Text("max_num_batched_tokens:Q", format=",")),
        cadence.mark_rule(color="#888888", strokeDash=[4, 3]).encode(y="itl_max_ms:Q"),
        cadence.mark_text(align="left", baseline="top", dy=3, color="#555555").encode(  # under the line
            x=alt.value(4), y="itl_max_ms:Q", text="text:N"),
        picked.transform_calculate(ttft_text=viz.duration_text("ttft_ms"), gap_text=viz.duration_text("itl_max_ms"))
        .mark_point(size=260, filled=False, color="black", strokeWidth=2).encode(tooltip=tooltip),  # on top of it
        picked.mark_text(align="right", baseline="top", fontWeight="bold", lineBreak="\n").encode(
            x=alt.value({"expr": "width"}), y=alt.value(4), text="label:N"),  # the plot's right edge, at any width
    ).properties(width=width, height=height).add_params(param)


VERDICT_COLOURS = {"holds": "#d9f0d3", "holds under stated conditions": "#fff2cc", "does not hold": "#f8d0c8"}


def styled_verdicts(table: pd.DataFrame):
    """The claim table of :func:`batchlab.chapters.verdicts.claim_table` as the page shows it: numbered claims,
    readable headers, the verdict cell coloured by its category. Used in chapter 14.

    Returns a pandas Styler with the columns ``claim``, ``the article says``, ``about`` (model and GPU),
    ``verdict`` and ``computed here``.
    """
    shown = pd.DataFrame({"claim": range(1, len(table) + 1), "the article says": table["claim"],
                          "about": table["scope"], "verdict": table["verdict"], "computed here": table["numbers"]})
    return (shown.style.hide(axis="index").set_uuid("fact-check")
            .map(lambda v: f"background-color: {VERDICT_COLOURS[v]}", subset=["verdict"])
            .set_properties(**{"text-align": "left", "vertical-align": "top", "padding": "0.35em 0.6em"})
            .set_table_styles([{"selector": "th",
                                "props": "text-align: left; padding: 0.35em 0.6em; border-bottom: 2px solid #888"},
                               {"selector": "td", "props": "border-bottom: 1px solid #ddd"},
                               {"selector": "td.col1, td.col2", "props": "overflow-wrap: anywhere"},  # code names
                               # the column's width shared out: the claim's number narrow, the numbers a verdict
                               # rests on (the longest text) widest; a phone stacks the rows and ignores this
                               {"selector": "", "props": "width: 100%; table-layout: fixed"},
                               *({"selector": f"th.col{i}", "props": f"width: {w}%"}
                                 for i, w in enumerate((6, 22, 24, 15, 33)))]))


def defaults_view(defaults: pd.DataFrame):
    """:func:`max_num_seqs_table` as the page shows it (a ``Styler``): the GPU and model by name, memory and size
    to one decimal, vLLM's ``max_num_seqs`` beside the article's rule and whether they agree. Used in chapter 14
    (the token budgets are chapter 08's table)."""
    shown = defaults.assign(gpu=defaults["gpu"].map(lambda g: viz.GPU_NAMES.get(g, g)),
                            model=defaults["model"].map(lambda m: viz.MODEL_NAMES.get(m, m)),
                            agrees=np.where(defaults["agrees"], "yes", "no"))
    one, count = "{:.1f}".format, "{:,}".format
    return viz.display_table(shown, {"gpu": ("GPU", str), "hbm_gib": ("memory (GiB)", one), "model": ("model", str),
                                     "params_b": ("parameters (billions)", one),
                                     "max_num_seqs": ("vLLM's max_num_seqs", count),
                                     "article_rule": ("the article's rule", count), "agrees": ("agree", str)})
