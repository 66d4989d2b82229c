"""Chapter 04, the step-time roofline: decode step time against batch size, and where it leaves its floor.

:func:`step_time_grid` prices a decode step over a batch x context grid, pure roofline and calibrated, on
each GPU; the knee is :meth:`batchlab.CostModel.knee`, min(ridge, B_kv) with B_kv from
:meth:`batchlab.CostModel.kv_knee`. :func:`knee_table` compares models; :func:`step_time_roofline_chart`
draws the curves with a control over context.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..hardware import get_hardware
from . import facts, scenes

COST_COLORS = {"roofline": viz.PALETTE[0], "calibrated": viz.PALETTE[1]}
GPU_NAMES = {"h100-sxm": "H100 SXM", "h200": "H200"}  # hardware preset -> the name a reader knows


def gpu_name(hardware: str) -> str:
    """A hardware preset as a reader names the GPU (``"h100-sxm"`` -> "H100 SXM"). Used in chapter 04."""
    return GPU_NAMES.get(hardware, hardware)


def step_time_grid(cost, batches, contexts, hardware=("h100-sxm", "h200")):
    """Decode step time over a batch x context grid, pure roofline and calibrated, on each GPU.

    Used in chapter 04.

    Parameters
    ----------
    cost : CostModel
        The model, dtype and calibrated efficiencies; its hardware is replaced by each of ``hardware``.
    batches : sequence of int
        Decode batch sizes (sequences, >= 1).
    contexts : sequence of int
        Cached tokens per sequence (>= 0); ``context_index`` numbers them in the given order, so a chart
        control can step through an uneven grid.
    hardware : sequence of str
        Presets of :func:`batchlab.get_hardware`.

    Returns
    -------
    curves : DataFrame
        ``hardware``, ``cost`` ("roofline" = ``cost.ideal()``, or "calibrated"), ``context``,
        ``context_index``, ``batch``, ``step_time_s`` (s) and ``kv_fits`` (the batch's KV cache fits the
        pool beside the weights, :meth:`batchlab.CostModel.kv_pool_blocks` at vLLM's default memory utilisation).
    knees : DataFrame
        One row per hardware, cost and context: ``knee`` = ``CostModel.knee(context)`` (sequences),
        ``b_kv`` (``CostModel.kv_knee(context)``, sequences) and ``step_time_s`` at the knee (s).
    """
    b, c = np.meshgrid(np.asarray(batches, dtype=float), np.asarray(contexts, dtype=float))
    index = np.broadcast_to(np.arange(len(contexts))[:, None], b.shape)
    ctx = np.asarray(contexts, dtype=float)
    curves, knees = [], []
    for hw in hardware:
        calibrated = cost.replace(hardware=get_hardware(hw))
        for label, cm in (("roofline", calibrated.ideal()), ("calibrated", calibrated)):
            # blocks of 16 for context + the new token, vLLM's null block kept back
            fits = b.ravel() * np.ceil((c.ravel() + 1) / 16) <= cm.kv_pool_blocks() - 1
            curves.append(pd.DataFrame({"hardware": hw, "cost": label, "context": c.ravel(),
                                        "context_index": index.ravel(), "batch": b.ravel(),
                                        "step_time_s": cm.decode_step_time(b.ravel(), c.ravel()), "kv_fits": fits}))
            k = np.array([cm.knee(x) for x in contexts])
            knees.append(pd.DataFrame({"hardware": hw, "cost": label, "context": ctx,
                                       "context_index": np.arange(len(contexts)), "knee": k,
                                       "b_kv": [cm.kv_knee(x) for x in contexts],
                                       "step_time_s": cm.decode_step_time(k, ctx)}))
    return pd.concat(curves, ignore_index=True), pd.concat(knees, ignore_index=True)


def knee_table(costs: dict, contexts, hardware=("h100-sxm", "h200")) -> pd.DataFrame:
    """Knees of several models at several contexts, pure roofline, on each GPU.

    Used in chapter 04.

    Parameters
    ----------
    costs : dict
        Label -> CostModel (its hardware is replaced by each of ``hardware``; efficiencies set to 1).
    contexts : sequence of int
        Cached tokens per sequence.
    hardware : sequence of str
        Hardware presets, one ``knee_<name>`` column each.

    Returns
    -------
    DataFrame
        One row per label and context: ``model``, ``context`` (tokens), ``b_kv`` (sequences,
        ``CostModel.kv_knee``; inf at 0) and ``knee_<hardware>`` = min(ridge, B_kv) (sequences) per GPU.
    """
    rows = []
    for label, cost in costs.items():
        ideal = {hw: cost.replace(hardware=get_hardware(hw)).ideal() for hw in hardware}
        for x in contexts:
            row = {"model": label, "context": int(x), "b_kv": cost.kv_knee(x)}
            rows.append(row | {f"knee_{hw}": cm.knee(x) for hw, cm in ideal.items()})
    return pd.DataFrame(rows)


def knee_display(table: pd.DataFrame):
    """:func:`knee_table` for the page: KV limit and knee in sequences, "none" where there is no cache.

    Used in chapter 04.
    """
    def sequences(v):
        return "none" if np.isinf(v) else f"{v:,.1f}"

    knees = {c: (f"knee on {gpu_name(c.removeprefix('knee_'))} (sequences)", sequences)
             for c in table.columns if c.startswith("knee_")}
    return viz.display_table(table, {"model": ("model", "{}"), "context": ("context (tokens)", "{:,d}"),
                                 "b_kv": ("KV limit (sequences)", sequences)} | knees)


def step_time_roofline_chart(curves: pd.DataFrame, knees: pd.DataFrame, width: int = 215, height: int = 230):
    """Decode step time against batch on log-log axes, one panel per GPU, a control over context.

    Used in chapter 04.

    Parameters
    ----------
    curves, knees : DataFrame
        From :func:`step_time_grid`: ``hardware``, ``cost`` ("roofline" or "calibrated"), ``context``,
        ``context_index``, ``batch``, ``step_time_s`` (s), ``kv_fits``; and per context the ``knee``
        (sequences) with the ``step_time_s`` there.
    width, height : int
        Pixels of each panel.

    Returns
    -------
    altair chart; buttons labelled with the context in tokens (parameter ``context_step``, which holds
    ``context_index``) redraw the curves and move each knee's rule, marker and label. Curves are dashed and faded
    where the batch's KV cache would not fit in memory.
    """
    param, at = viz.grid_param("context_step", knees["context_index"], "context per sequence (tokens)",
                               field="context_index", labels=viz.grid_labels(knees, "context_index", "context"))
    curves = curves.assign(step_time_ms=curves["step_time_s"] * 1e3)
    knees = knees.assign(step_time_ms=knees["step_time_s"] * 1e3,
                         label_px=np.where(knees["cost"] == "roofline", 4, 18))
    x_title, y_title = viz.title("batch"), viz.title("step_time_ms")
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
        head = f"'{gpu_name(hw)} · context ' + format(datum.context, ',') + ' tokens'"
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


# -- facts other pages glue (batchlab.chapters.facts) ----------------------------------------------------------
# Two batch sizes the book keeps apart, with one name each. The **knee** is where a decode step leaves its floor,
# min(ridge, B_kv) (CostModel.knee): the KV cache pulls it down. The **compute crossover** is the article's own
# definition, the batch at which the whole step's GEMM FLOPs take longer than streaming the weights and the KV
# (verdicts.compute_knee): the KV cache pushes it right, and past a few hundred tokens of context there is none.

def _ideal8():
    return scenes.scene("llama8").cost().ideal()


@facts.fact("ridge", scene="llama8", unit="sequences", fmt=".1f", chapter="step_time_roofline",
            text="the ridge point F b_w / (2 BW): the batch at which a decode step's GEMM math equals its weight "
                 "streaming, any BF16 model on an H100 SXM (pure roofline)")
def _ridge():
    return _ideal8().knee(0)


@facts.fact("ridge_calibrated", scene="llama8", unit="sequences", fmt=".0f", chapter="step_time_roofline",
            text="the ridge point with the calibrated GEMM and bandwidth efficiencies")
def _ridge_calibrated():
    return scenes.scene("llama8").cost().knee(0)


def _knee_fact(context: int):
    @facts.fact(f"knee_{context}", scene="llama8", unit="sequences", fmt=".1f", chapter="step_time_roofline",
                text=f"the knee at {context:,} tokens of context per sequence: the batch where a decode step of "
                     "Llama-3-8B BF16 leaves its floor, min(ridge, B_kv) (pure roofline)")
    def _knee():
        return _ideal8().knee(context)


for _ctx in (512, 1024, 2048, 4096, 16384):
    _knee_fact(_ctx)


@facts.fact("weights_streamed_gb", scene="llama8", unit="GB", fmt=".2f", chapter="step_time_roofline",
            text="the weight bytes one decode step of Llama-3-8B BF16 streams: every weight but the embedding "
                 "table, a row lookup")
def _weights_streamed_gb():
    return _ideal8().streamed_weight_bytes / 1e9


@facts.fact("weight_stream_ms", scene="llama8", unit="ms", fmt=".2f", chapter="step_time_roofline",
            text="the time to stream those weights at the full HBM bandwidth: the batch-1 decode floor")
def _weight_stream_ms():
    c = _ideal8()
    return c.streamed_weight_bytes / c.hardware.hbm_bytes_per_s * 1e3


@facts.fact("weight_stream_cal_ms", scene="llama8", unit="ms", fmt=".1f", chapter="step_time_roofline",
            text="the time to stream those weights at the calibrated share of the HBM bandwidth (eta_m)")
def _weight_stream_cal_ms():
    c = scenes.scene("llama8").cost()
    return c.streamed_weight_bytes / (c.eta_memory * c.hardware.hbm_bytes_per_s) * 1e3


@facts.fact("kv_kib_per_token", scene="llama8", unit="KiB", fmt=".0f", chapter="step_time_roofline",
            text="the KV cache one token of Llama-3-8B takes, 2 L H_kv d_h b_kv")
def _kv_kib():
    return _ideal8().kv_bytes_per_token / 1024


@facts.fact("crossover_128", scene="llama8", unit="sequences", fmt=".0f", chapter="step_time_roofline",
            text="the compute crossover (the article's definition of the knee) at 128 tokens of context: it lies "
                 "right of the ridge")
def _crossover_128():
    from .verdicts import compute_knee

    return compute_knee(_ideal8(), 128)


@facts.fact("crossover_gone_tokens", scene="llama8", unit="tokens", fmt=",.0f", chapter="step_time_roofline",
            text="the context per sequence beyond which a decode step of Llama-3-8B BF16 is never compute-bound: "
                 "the compute crossover no longer exists")
def _crossover_gone():
    from .verdicts import knee_vanishes_at

    return knee_vanishes_at(_ideal8())


@facts.fact("weights70_streamed_gb", scene="llama70", unit="GB", fmt=".1f", chapter="step_time_roofline",
            text="the weight bytes one decode step of Llama-3-70B FP8 streams (its FP8 body and BF16 LM head)")
def _weights70():
    return scenes.scene("llama70").cost().streamed_weight_bytes / 1e9


@facts.fact("floor70_ms", scene="llama70", unit="ms", fmt=".1f", chapter="step_time_roofline",
            text="the batch-1 decode step of Llama-3-70B FP8 at the full HBM bandwidth (pure roofline)")
def _floor70():
    return scenes.scene("llama70").cost().ideal().decode_step_time(1, 0) * 1e3


@facts.fact("decode70_b1_ms", scene="llama70", unit="ms", fmt=".1f", chapter="step_time_roofline",
            text="the batch-1 decode step of Llama-3-70B FP8 with no context, calibrated (vLLM's default async "
                 "engine): the fastest cadence it can keep")
def _decode70_b1():
    return scenes.scene("llama70").cost().decode_step_time(1, 0) * 1e3
