"""Chapter 9's goodput map: the share of requests within the SLO over the two knobs, per workload, SLO and load.

:func:`goodput_map_chart` draws :func:`batchlab.chapters.tuning.tuning_grid`'s two frames as a heatmap behind
radio buttons for the workload, the SLO and the load, the tuner's pick and vLLM's default marked, and three lines
above it that read the selection (:func:`readout_label`); :func:`_map_data` is the heatmap's rows (the notebook's
hidden asserts read them). :mod:`batchlab.chapters.tuning` re-exports all of it.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from .two_knobs_charts import REFUSED_TEXT  # what a pair vLLM refuses reads, as in chapter 8's readout

MAP_KINDS = ("tuner's pick", "vLLM default", "refused by vLLM")
MAP_SHAPES = ("square", "diamond", "cross")
MAP_WIDTH = 470  # px: fits the book's text column with the axis labels
MAP_SCHEME = "blues"


def _indices(frame: pd.DataFrame, workloads, slos, loads) -> pd.DataFrame:
    return frame.assign(workload_i=frame["workload"].map({w: i for i, w in enumerate(workloads)}),
                        slo_i=frame["slo"].map({s: i for i, s in enumerate(slos)}),
                        load_i=frame["load"].map({float(v): i for i, v in enumerate(loads)}))


def _map_data(grid: pd.DataFrame, picks: pd.DataFrame, workloads, slos, loads) -> pd.DataFrame:
    """The chart's rows: each grid point with the indices the controls select on, and a kind (the pick only
    where some pair holds the SLO)."""
    holds = picks.set_index(["workload", "slo", "load"])["holds_any"]
    data = _indices(grid, workloads, slos, loads)
    data["holds_any"] = holds.loc[list(zip(data["workload"], data["slo"], data["load"]))].to_numpy()
    data["kind"] = np.select([data["best"] & data["holds_any"], data["vllm_default"], data["vllm_refuses"]],
                             MAP_KINDS, "")
    # read before the data is rounded for the page: "412 ms", "315 s", never "315,382 ms"
    for col in ("ttft", "tpot", "longest_itl"):
        data[f"{col}_text"] = [viz.format_duration(v, missing="refused") for v in data[f"p99_{col}_ms"]]
    for col in ("p99_ttft_ms", "p99_tpot_ms", "p99_longest_itl_ms"):
        data[col] = data[col].astype(float).round(2)
    # a refused pair has no goodput (not 0); the rest keep the digits the labels print (viz.rate_text)
    data["request_goodput"] = viz.round_rate(data["request_goodput"].where(~data["vllm_refuses"]))
    data["slo_load"] = data["slo_load"].astype(float).round(3)
    data["share_within"] = data["share_within"].astype(float).round(4)
    data["held"] = np.select([data["vllm_refuses"], data["slo_met"].astype(bool)], ["refused", "yes"], "no")
    # the tooltip's share and SLO load in words: "refused" for a pair vLLM refuses, never "null"
    data["share_text"] = [("refused" if off else f"{v:.1%}") for v, off in zip(data["share_within"],
                                                                          data["vllm_refuses"])]
    data["slo_load_text"] = [("refused" if off else f"{v:.2f}") for v, off in zip(data["slo_load"],
                                                                             data["vllm_refuses"])]
    keep = ["workload_i", "slo_i", "load_i", "max_num_seqs", "max_num_batched_tokens", "request_goodput",
            "share_within", "held", "slo_met", "p99_ttft_ms", "p99_tpot_ms", "p99_longest_itl_ms", "slo_load",
            "kind", "ttft_text", "tpot_text", "longest_itl_text", "share_text", "slo_load_text"]
    return data[keep]


REFUSED_FILL = "#eeeeee"  # the map's cells of pairs vLLM refuses
READOUT_CHARS = 44  # the longest readout line: at 400 px the map's plot area leaves about 300 px for 11 px text


def readout_label(r) -> str:
    """Three lines read above the map for one selection (a row of the picks of
    :func:`batchlab.chapters.tuning.tuning_grid`): the pick (or that no setting holds the SLO there), then its
    goodput (or the largest of any pair) and the default's, then the requests per second the default served, all
    in req/s by the book's one rule (:func:`batchlab.viz.format_rate`, as the table and the map's cells print
    them; its rounding never makes a goodput read larger than what was served). No line is longer than
    :data:`READOUT_CHARS`, so none runs out of the map at 400 px. Used in chapter 9."""
    rate = viz.format_rate
    served = f"(vLLM default served {rate(r.served_req_s)} req/s)"
    if not r.holds_any:
        return (f"no setting holds the p99s at {rate(r.rate_req_s)} req/s\n"
                f"goodput: best {rate(r.top_goodput)}, default {rate(r.default_goodput)} req/s\n{served}")
    same = r.best_max_num_seqs == r.default_max_num_seqs and \
        r.best_max_num_batched_tokens == r.default_max_num_batched_tokens
    pick = "vLLM's default itself" if same else \
        f"{r.best_max_num_seqs:,} sequences, {r.best_max_num_batched_tokens:,} tokens"
    return f"pick: {pick}\ngoodput: pick {rate(r.best_goodput)}, default {rate(r.default_goodput)} req/s\n{served}"


def _holds_expr(picks: pd.DataFrame, workloads, slos, loads) -> str:
    """A Vega expression over the three buttons' signals: true where the selection has a pick (some pair holds
    the SLO's p99s)."""
    rows = _indices(picks, workloads, slos, loads)
    keys = [f"'{r.workload_i},{r.slo_i},{r.load_i}'" for r in rows.itertuples(index=False) if r.holds_any]
    return f"indexof([{', '.join(keys)}], workload_i + ',' + slo_i + ',' + load_i) >= 0"


def _map_readout(picks: pd.DataFrame, workloads, slos, loads) -> pd.DataFrame:
    rows = _indices(picks, workloads, slos, loads)
    rows["label"] = [readout_label(r) for r in rows.itertuples(index=False)]
    return rows[["workload_i", "slo_i", "load_i", "label"]]


def goodput_map_chart(grid: pd.DataFrame, picks: pd.DataFrame, workload_names: dict, slo_names: dict,
                      load_names: dict):
    """The goodput map over ``max_num_seqs`` x ``max_num_batched_tokens``, the pick and vLLM's default marked.

    Used in chapter 9.

    Parameters
    ----------
    grid, picks : DataFrame
        :func:`batchlab.chapters.tuning.tuning_grid`'s two frames.
    workload_names, slo_names, load_names : dict
        The workloads, SLO specs and loads of the grid, in the order of their buttons, each mapped to the label
        a reader sees (``{"ttft:500 tpot:50": "TTFT 500 ms, TPOT 50 ms"}``, ``{0.95: "95% of capacity"}``).

    Returns
    -------
    altair chart: three lines reading the selection (:func:`readout_label`) over a heatmap with the token budget
    across (tokens) and the sequence cap down (sequences), each cell coloured by the share of the requests
    served that met every bound and labelled with its goodput (req/s, :func:`batchlab.viz.rate_text`: the
    strings :func:`batchlab.chapters.tuning.picks_table` prints); the pick is a black square (only where
    some pair holds the SLO's p99s), vLLM's default a diamond, pairs vLLM refuses a cross, and cells whose p99
    latencies hold the SLO are outlined in orange. A row of radio buttons each picks the workload, the SLO
    (labelled in ms) and the load.
    """
    workloads, slos, loads = list(workload_names), list(slo_names), list(load_names)
    data = _map_data(grid, picks, workloads, slos, loads)
    params, preds = [], []
    for name, labels, label in (("workload_i", [workload_names[w] for w in workloads], "workload"),
                                ("slo_i", [slo_names[s] for s in slos], "SLO"),
                                ("load_i", [load_names[v] for v in loads], "load")):
        param, pred = viz.grid_param(name, range(len(labels)), label, labels=labels, control="radio")
        params.append(param)
        preds.append(pred)
    chosen = " && ".join(preds)
    thousands = "format(datum.value, ',')"
    xenc = alt.X("max_num_batched_tokens:O", title="max_num_batched_tokens (tokens)",  # upright: on a phone
                 axis=alt.Axis(labelAngle=-90, labelOverlap=False, labelExpr=thousands))  # none is dropped
    yenc = alt.Y("max_num_seqs:O", title="max_num_seqs (sequences)", sort="descending",
                 axis=alt.Axis(labelExpr=thousands))
    tooltip = [viz.tip("max_num_seqs", "max_num_seqs (sequences)", ","),
               viz.tip("max_num_batched_tokens", "max_num_batched_tokens (tokens)", ","),
               viz.tip("goodput_tip", "goodput (req/s)", kind="N"),
               viz.tip("share_text", "requests within the SLO (share)", kind="N"),
               viz.tip("ttft_text", "p99 TTFT", kind="N"), viz.tip("tpot_text", "p99 TPOT", kind="N"),
               viz.tip("longest_itl_text", "p99 longest gap", kind="N"),
               viz.tip("slo_load_text", "SLO load (largest p99 / bound)", kind="N"),
               viz.tip("held", "p99s within the SLO", kind="N")]
    # a pair vLLM refuses was never run: its knobs and why, not a "refused" in every field
    refused_tip = tooltip[:2] + [viz.tip("refused_text", "this pair", kind="N")]
    ran, refused = 'datum.held != "refused"', 'datum.held == "refused"'
    # each goodput by the book's rule for rates (viz.rate_text, the twin of the tables' viz.format_rate)
    base = alt.Chart(data).transform_filter(chosen).transform_calculate(
        goodput_text=viz.rate_text("request_goodput", missing=""),
        goodput_tip=viz.rate_text("request_goodput", missing="refused"),
        refused_text=f"'{REFUSED_TEXT}'").encode(x=xenc, y=yenc)
    cells = base.transform_filter(ran).mark_rect(stroke="white", strokeWidth=1).encode(
        color=alt.Color("share_within:Q", title="requests within the SLO",
                        scale=alt.Scale(scheme=MAP_SCHEME, domain=[0, 1]),
                        legend=alt.Legend(format=".0%", orient="bottom", gradientLength=200, values=[0, 0.5, 1],
                                          titleLimit=0, labelLimit=0)),
        tooltip=tooltip)
    refused_cells = base.transform_filter(refused).mark_rect(stroke="white", strokeWidth=1, color=REFUSED_FILL) \
        .encode(tooltip=refused_tip)  # never run: no share to colour by, and the cross on it says why
    held = base.transform_filter("datum.slo_met").mark_rect(filled=False, stroke="#e69f00", strokeWidth=2)
    text = base.mark_text(fontSize=8, dy=6).encode(
        text="goodput_text:N",
        color=alt.when("datum.share_within > 0.6").then(alt.value("white")).otherwise(alt.value("black")))
    # The pick has a legend of its own, shown only where a pick is drawn (some pair holds the SLO's p99s): the
    # condition is the selection's, read from the picks as an expression of the three buttons' signals.
    holds = _holds_expr(picks, workloads, slos, loads)
    point = dict(filled=True, size=45, color="black", stroke="white", strokeWidth=1, yOffset=-5)
    others = base.transform_filter(f'datum.kind != "" && datum.kind != "{MAP_KINDS[0]}"')
    other_shape = alt.Shape("kind:N", title=None, legend=alt.Legend(orient="bottom", labelLimit=0),
                            scale=alt.Scale(domain=list(MAP_KINDS[1:]), range=list(MAP_SHAPES[1:])))
    others = alt.layer(others.transform_filter(ran).mark_point(**point).encode(shape=other_shape, tooltip=tooltip),
                       others.transform_filter(refused).mark_point(**point).encode(shape=other_shape,
                                                                                    tooltip=refused_tip))
    pick_legend = alt.Legend(orient="bottom", labelLimit=0, symbolOpacity=alt.ExprRef(f"({holds}) ? 1 : 0"),
                             labelExpr=f"({holds}) ? datum.label : ''")
    pick_mark = base.transform_filter(f'datum.kind == "{MAP_KINDS[0]}"').mark_point(**point).encode(
        shape=alt.Shape("kind:N", title=None, legend=pick_legend,
                        scale=alt.Scale(domain=[MAP_KINDS[0]], range=[MAP_SHAPES[0]])), tooltip=tooltip)
    marks = alt.layer(others, pick_mark).resolve_scale(shape="independent")
    readout = alt.Chart(_map_readout(picks, workloads, slos, loads)).transform_filter(chosen).mark_text(
        align="left", baseline="top", fontSize=11, color="#333333", lineBreak="\n", lineHeight=15).encode(
        x=alt.value(0), y=alt.value(0), text="label:N").properties(width=MAP_WIDTH, height=45)
    heat = alt.layer(cells, refused_cells, held, text, marks).properties(width=MAP_WIDTH, height=330)
    return alt.vconcat(readout, heat, spacing=4).add_params(*params)
