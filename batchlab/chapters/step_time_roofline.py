"""Chapter 4, the step-time roofline: decode step time against batch size, and the two batch sizes that matter.

:func:`step_time_grid` prices a decode step over a batch x context grid, pure roofline and calibrated, on each
GPU; the **knee** is :meth:`batchlab.CostModel.knee`, min(ridge, B_kv) with B_kv from
:meth:`batchlab.CostModel.kv_knee`, and the **compute crossover** is
:func:`batchlab.chapters.verdicts.compute_knee`. :func:`knee_table` compares models;
:func:`step_time_roofline_chart` draws the curves with a slider over batch, one over context, a readout of the
step time at the chosen pair and the knee marked.
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
    """A hardware preset as a reader names the GPU (``"h100-sxm"`` -> "H100 SXM"). Used in chapter 4."""
    return GPU_NAMES.get(hardware, hardware)


def batch_grid(top: int = 2048, per_octave: int = 6) -> np.ndarray:
    """Decode batch sizes from 1 to ``top``, about ``per_octave`` a doubling, rounded to whole sequences.

    Used in chapter 4: the grid behind its batch slider (the slider steps through the grid's positions, so it
    moves one sequence at a time at small batches and a few per cent at a time at large ones).
    """
    if top < 1 or per_octave < 1:
        raise ValueError(f"top and per_octave must be >= 1, got top={top!r}, per_octave={per_octave!r}")
    steps = np.arange(0, int(np.ceil(np.log2(top) * per_octave)) + 1) / per_octave
    return np.unique(np.minimum(np.round(2.0 ** steps), top)).astype(int)


def context_grid(top: int = 16384, first: int = 64) -> np.ndarray:
    """Contexts per sequence (tokens): 0, then ``first`` and every half-doubling after it (64, 96, 128, 192,
    256, ...), up to ``top``. Used in chapter 4: the grid behind its context slider."""
    if first < 1 or top < first:
        raise ValueError(f"first must be >= 1 and top >= first, got first={first!r}, top={top!r}")
    values = [0]
    while first <= top:
        values += [v for v in (first, first * 3 // 2) if v <= top]
        first *= 2
    return np.unique(values).astype(int)


def step_time_grid(cost, batches, contexts, hardware=("h100-sxm", "h200")):
    """Decode step time over a batch x context grid, pure roofline and calibrated, on each GPU.

    Used in chapter 4.

    Parameters
    ----------
    cost : CostModel
        The model, dtype and calibrated efficiencies; its hardware is replaced by each of ``hardware``.
    batches : sequence of int
        Decode batch sizes (sequences, >= 1); ``batch_index`` numbers the distinct ones in ascending order, so
        a slider can step through an uneven grid.
    contexts : sequence of int
        Cached tokens per sequence (>= 0); ``context_index`` numbers them in the given order.
    hardware : sequence of str
        Presets of :func:`batchlab.get_hardware`.

    Returns
    -------
    curves : DataFrame
        ``hardware``, ``cost`` ("roofline" = ``cost.ideal()``, or "calibrated"), ``context``,
        ``context_index``, ``batch``, ``batch_index``, ``step_time_s`` (s) and ``kv_fits`` (the batch's KV cache
        fits the pool beside the weights, :meth:`batchlab.CostModel.kv_pool_blocks` at vLLM's default memory
        utilisation).
    knees : DataFrame
        One row per hardware, cost and context: ``knee`` = ``CostModel.knee(context)`` (sequences),
        ``b_kv`` (``CostModel.kv_knee(context)``, sequences) and ``step_time_s`` at the knee (s).
    """
    batches = np.unique(np.asarray(batches, dtype=float))
    if batches.size == 0 or batches[0] < 1:
        raise ValueError(f"batches must be >= 1, got {batches.tolist()}")
    if len(contexts) == 0 or min(contexts) < 0:
        raise ValueError(f"contexts must be >= 0, got {list(contexts)}")
    b, c = np.meshgrid(batches, np.asarray(contexts, dtype=float))
    index = np.broadcast_to(np.arange(len(contexts))[:, None], b.shape)
    b_index = np.broadcast_to(np.arange(batches.size)[None, :], b.shape)
    ctx = np.asarray(contexts, dtype=float)
    curves, knees = [], []
    for hw in hardware:
        calibrated = cost.replace(hardware=get_hardware(hw))
        for label, cm in (("roofline", calibrated.ideal()), ("calibrated", calibrated)):
            # blocks of 16 for context + the new token, vLLM's null block kept back
            fits = b.ravel() * np.ceil((c.ravel() + 1) / 16) <= cm.kv_pool_blocks() - 1
            curves.append(pd.DataFrame({"hardware": hw, "cost": label, "context": c.ravel(),
                                        "context_index": index.ravel(), "batch": b.ravel(),
                                        "batch_index": b_index.ravel(),
                                        "step_time_s": cm.decode_step_time(b.ravel(), c.ravel()), "kv_fits": fits}))
            k = np.array([cm.knee(x) for x in contexts])
            knees.append(pd.DataFrame({"hardware": hw, "cost": label, "context": ctx,
                                       "context_index": np.arange(len(contexts)), "knee": k,
                                       "b_kv": [cm.kv_knee(x) for x in contexts],
                                       "step_time_s": cm.decode_step_time(k, ctx)}))
    return pd.concat(curves, ignore_index=True), pd.concat(knees, ignore_index=True)


def knee_table(costs: dict, contexts, hardware=("h100-sxm", "h200")) -> pd.DataFrame:
    """Knees and compute crossovers of several models at several contexts, pure roofline, on each GPU.

    Used in chapter 4.

    Parameters
    ----------
    costs : dict
        Label -> CostModel (its hardware is replaced by each of ``hardware``; efficiencies set to 1).
    contexts : sequence of int
        Cached tokens per sequence.
    hardware : sequence of str
        Hardware presets, one ``knee_<name>`` and one ``crossover_<name>`` column each.

    Returns
    -------
    DataFrame
        One row per label and context: ``model``, ``context`` (tokens), ``b_kv`` (sequences,
        ``CostModel.kv_knee``; inf at 0), then per GPU ``knee_<hardware>`` = min(ridge, B_kv) (sequences), and
        ``crossover_<hardware>`` (sequences; inf where there is none), the batch at which the step's GEMM math
        outlasts streaming the weights and every sequence's KV (:func:`batchlab.chapters.verdicts.compute_knee`).
    """
    from .verdicts import compute_knee

    rows = []
    for label, cost in costs.items():
        ideal = {hw: cost.replace(hardware=get_hardware(hw)).ideal() for hw in hardware}
        for x in contexts:
            row = {"model": label, "context": int(x), "b_kv": cost.kv_knee(x)}
            row |= {f"knee_{hw}": cm.knee(x) for hw, cm in ideal.items()}
            rows.append(row | {f"crossover_{hw}": compute_knee(cm, x) for hw, cm in ideal.items()})
    return pd.DataFrame(rows)


def knee_display(table: pd.DataFrame):
    """:func:`knee_table` for the page: batch sizes in sequences, "none" where the limit does not exist, and the
    GPUs of each limit side by side in one cell ("295.3 / 206.1"), so the table has five columns and fits the
    text column.

    Used in chapter 4.
    """
    def sequences(v):
        return "none" if np.isinf(v) else f"{v:,.1f}"

    gpus = [c.removeprefix("knee_") for c in table.columns if c.startswith("knee_")]
    names = " / ".join(gpu_name(g) for g in gpus)
    shown = table.assign(**{f"{what}_all": [" / ".join(sequences(v) for v in row)
                                            for row in table[[f"{what}_{g}" for g in gpus]].to_numpy()]
                            for what in ("knee", "crossover")})
    return viz.display_table(shown, {"model": ("model", "{}"), "context": ("context (tokens)", "{:,d}"),
                                     "b_kv": ("KV limit (sequences)", sequences),
                                     "knee_all": (f"knee on {names} (sequences)", "{}"),
                                     "crossover_all": (f"compute crossover on {names} (sequences)", "{}")})


def step_time_roofline_chart(curves: pd.DataFrame, knees: pd.DataFrame, batch: float = 64, context: float = 1024,
                             width: int = 250, height: int = 230):
    """Decode step time against batch on log-log axes, one panel per GPU, sliders over batch and context.

    Used in chapter 4.

    Parameters
    ----------
    curves, knees : DataFrame
        From :func:`step_time_grid`: ``hardware``, ``cost`` ("roofline" or "calibrated"), ``context``,
        ``context_index``, ``batch``, ``batch_index``, ``step_time_s`` (s), ``kv_fits``; and per context the
        ``knee`` (sequences) with the ``step_time_s`` there.
    batch, context : float
        The batch (sequences) and context (tokens) selected at first (the grid values nearest them).
    width, height : int
        Pixels of each panel's plot.

    Returns
    -------
    altair chart. Two sliders, labelled in sequences (parameter ``batch_step``, which holds ``batch_index``) and
    in tokens (``context_step``, holding ``context_index``), pick the batch and the context. Above each panel a
    readout gives, per cost model (pure roofline and calibrated), the step time at that pair as
    :func:`batchlab.viz.duration_text` prints it ("8.06 ms", "1.34 s") and the knee at that context in
    sequences; in the panel a grey rule and rings mark the batch on the curves, and a dashed rule
    and a dot mark each curve's knee (no text in the plot: the readout names the values, so no rule crosses a
    label). Curves are dotted and faded where the batch's KV cache would not fit vLLM's KV pool
    (:meth:`batchlab.CostModel.kv_pool_blocks`); every point of a curve and every knee dot has a tooltip.
    """
    b_start = curves.loc[(curves["batch"] - batch).abs().idxmin(), "batch_index"]
    c_start = knees.loc[(knees["context"] - context).abs().idxmin(), "context_index"]
    b_param, at_batch = viz.grid_param("batch_step", curves["batch_index"], "batch size (sequences)",
                                       field="batch_index", value=b_start,
                                       labels=viz.grid_labels(curves, "batch_index", "batch"))
    c_param, at_ctx = viz.grid_param("context_step", knees["context_index"], "context per sequence (tokens)",
                                     field="context_index", value=c_start,
                                     labels=viz.grid_labels(knees, "context_index", "context"))
    data, marks = _chart_frames(curves, knees)
    ms = data["step_time_ms"]
    ticks = [m * 10**e for e in range(-1, 6) for m in (1, 2, 5) if ms.min() * 0.9 <= m * 10**e <= ms.max() * 1.1]
    axes = {
        "x": alt.X("batch:Q", title=viz.title("batch"), axis=alt.Axis(values=[1, 4, 16, 64, 256, 1024], format=","),
                   scale=alt.Scale(type="log", nice=False, domain=[data["batch"].min(), data["batch"].max()])),
        "y": alt.Y("step_time_ms:Q", title=viz.title("step_time_ms"), axis=alt.Axis(values=ticks, format=","),
                   scale=alt.Scale(type="log", nice=False, domain=[ms.min() * 0.9, ms.max() * 1.1])),
        "color": alt.Color("cost:N", title=None, legend=alt.Legend(orient="top"),
                           scale=alt.Scale(domain=list(COST_COLORS), range=list(COST_COLORS.values())))}
    columns = []
    for hw in curves["hardware"].unique():
        one, kn = data[data["hardware"] == hw].drop(columns="hardware"), marks[marks["hardware"] == hw]
        columns.append(alt.vconcat(_readout(one, kn, at_batch, at_ctx, gpu_name(hw), width),
                                   _panel(one, kn, gpu_name(hw), at_batch, at_ctx, axes,
                                          width, height), spacing=2))
    return alt.hconcat(*columns, spacing=24).add_params(b_param, c_param)


def _chart_frames(curves: pd.DataFrame, knees: pd.DataFrame):
    """What :func:`step_time_roofline_chart` draws: times in ms (to 0.1 µs), whole numbers as integers (the data
    is inlined in the page: kept light), and each knee's KV limit in words for its tooltip."""
    data = curves.assign(step_time_ms=(curves["step_time_s"] * 1e3).round(4)).drop(columns="step_time_s")
    data = data.astype(dict.fromkeys(("context", "context_index", "batch", "batch_index"), int))
    marks = knees.assign(step_time_ms=knees["step_time_s"] * 1e3,
                         kv_limit=[("none" if np.isinf(v) else f"{v:,.1f}") for v in knees["b_kv"]])
    return data, marks.drop(columns=["step_time_s", "b_kv"])


def _readout(data: pd.DataFrame, knees: pd.DataFrame, at_batch: str, at_ctx: str, gpu: str, width: int):
    """The lines above a panel: the GPU; the chosen batch and context; per cost model (one column each, in its
    colour) the step time there and the knee at that context; and a note where their KV cache would not fit
    vLLM's KV pool."""
    sel = alt.Chart(data).transform_filter(f"{at_batch} && {at_ctx}")
    knee = alt.Chart(knees).transform_filter(at_ctx)
    # "step at 2,048 sequences × 16,384 tokens": the longest fits a 250 px panel ("step time at" ran past it)
    where = ("'step at ' + format(datum.batch, ',') + (datum.batch == 1 ? ' sequence' : ' sequences') + "
             "(datum.context == 0 ? ', no cache' : ' × ' + format(datum.context, ',') + ' tokens')")
    text = {"align": "left", "baseline": "top", "fontSize": 11}
    layers = [
        alt.Chart(pd.DataFrame({"text": [gpu]})).mark_text(**text, fontWeight="bold", color="#333333").encode(
            x=alt.value(0), y=alt.value(0), text="text:N"),
        sel.transform_filter("datum.cost == 'roofline'").transform_calculate(text=where).mark_text(
            **text, color="#333333").encode(x=alt.value(0), y=alt.value(15), text="text:N"),
    ]
    for i, cost in enumerate(COST_COLORS):  # one column per cost model: its step time, then its knee
        layers += [
            sel.transform_filter(f"datum.cost == '{cost}'").transform_calculate(
                text=f"'{cost} ' + ({viz.duration_text('step_time_ms')})").mark_text(
                **text, fontWeight="bold", color=COST_COLORS[cost]).encode(
                x=alt.value(i * width / 2), y=alt.value(30), text="text:N"),
            knee.transform_filter(f"datum.cost == '{cost}'").transform_calculate(
                text="'knee ' + format(datum.knee, ',.1f')").mark_text(  # sequences, as on the x axis
                **text, color=COST_COLORS[cost]).encode(x=alt.value(i * width / 2), y=alt.value(45),
                                                        text="text:N")]
    layers.append(sel.transform_filter("datum.cost == 'roofline' && !datum.kv_fits").mark_text(
        **text, color="#777777").encode(x=alt.value(0), y=alt.value(60),
                                        text=alt.value("their KV cache would not fit vLLM's KV pool")))
    return alt.layer(*layers).properties(width=width, height=72)


def _panel(data: pd.DataFrame, knees: pd.DataFrame, gpu: str, at_batch: str, at_ctx: str, axes: dict, width: int,
           height: int):
    """One GPU's plot: the two curves at the chosen context, the chosen batch on them, and each curve's knee."""
    x, y, color = axes["x"], axes["y"], axes["color"]
    words = {"gpu": f"'{gpu}'", "memory": "datum.kv_fits ? 'fits' : 'does not fit'",  # in vLLM's KV pool
             "step_time": viz.duration_text("step_time_ms")}  # "8.06 ms", "1.34 s": the readout's rule
    line = alt.Chart(data).transform_filter(at_ctx).transform_calculate(**words)
    here = line.transform_filter(at_batch)
    knee = alt.Chart(knees).transform_filter(at_ctx).transform_calculate(gpu=words["gpu"], step_time=words["step_time"])
    kx = alt.X("knee:Q", title=viz.title("batch"))
    tips = [viz.tip("gpu", "GPU", kind="N"), viz.tip("cost", "cost model", kind="N"), viz.tip("batch", fmt=","),
            viz.tip("context", fmt=","), viz.tip("step_time", "step time", kind="N"),
            viz.tip("memory", "KV cache in vLLM's KV pool", kind="N")]
    knee_tips = [viz.tip("gpu", "GPU", kind="N"), viz.tip("cost", "cost model", kind="N"),
                 viz.tip("context", fmt=","), viz.tip("knee", "knee (sequences)", fmt=",.1f"),
                 viz.tip("kv_limit", "KV limit (sequences)", kind="N"),
                 viz.tip("step_time", "step time at the knee", kind="N")]
    return alt.layer(
        line.transform_filter("datum.kv_fits").mark_line().encode(x=x, y=y, color=color),
        line.mark_line(opacity=0.35, strokeDash=[2, 2]).encode(x=x, y=y, color=color),
        here.transform_filter("datum.cost == 'roofline'").mark_rule(color="#999999").encode(x=x),
        knee.mark_rule(strokeDash=[4, 3]).encode(x=kx, color=color),
        line.mark_point(size=90, opacity=0).encode(x=x, y=y, tooltip=tips),  # hover anywhere on a curve
        here.mark_point(size=110, filled=False, strokeWidth=2).encode(x=x, y=y, color=color, tooltip=tips),
        knee.mark_point(size=70, filled=True).encode(x=kx, y=y, color=color, tooltip=knee_tips),
    ).properties(width=width, height=height)


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
