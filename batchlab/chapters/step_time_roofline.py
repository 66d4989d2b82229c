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
