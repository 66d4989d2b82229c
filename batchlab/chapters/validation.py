"""Chapter 13, validation: the calibrated cost model against measured H100 timings, the simulator end to end
against the figures vLLM published for v0.6.0 and against measured runs of today's vLLM, and the book's own
setup beside the measured runs closest to it.

:func:`validation_frames` predicts every measured case twice (DESIGN's starting efficiencies, the calibrated
ones) from :mod:`batchlab.calibrate`'s public loaders, which read the compact table shipped in ``data/``;
:func:`parity_chart` draws a sample of them (:func:`parity_sample`). :func:`vllm_v060_runs` replays the
ShareGPT preset at the blog's arrival rates and :func:`published_chart` draws it beside the published figures
(both in :mod:`batchlab.chapters.validation_v060`, re-exported here, as the whole-server part is from
:mod:`batchlab.chapters.validation_e2e`).
:func:`e2e_parity_chart` draws every replayed end-to-end run (:func:`batchlab.validate.replay_all`);
:func:`closest_runs` picks the runs nearest the book's setup and :func:`setup_frame` sets them beside the same
traffic run on the book's setup. The serving terms other pages quote are facts registered at the end.
"""
from __future__ import annotations

import json

import altair as alt
import numpy as np
import pandas as pd

from .. import calibrate, viz
from ..models import get_model
from . import facts, scenes
from .validation_e2e import (  # noqa: F401 - the whole-server part of the chapter, re-exported for its notebook
    BOOK_SCENE, CLASS_PARAMS, E2E_METRICS, E2E_SETS, LOG_LABEL, SET_COLORS, _band_lines, ablation_style,
    kernel_time_text, time_axis, time_label,
    ablation_table, book_setup, book_setup_replay, closest_runs, e2e_error_table, e2e_headline, e2e_parity_chart,
    e2e_parity_frame, prefill_share_needed, run_text, setup_error_table, setup_frame, setup_headline, setup_table,
    ttft_misses, overloaded_names, within_sentence)
from .validation_v060 import (  # noqa: F401 - the comparison with vLLM v0.6.0's figures, for the notebook
    PUBLISHED_VLLM_V060, V060_COLUMNS, comparison_style, match_means, published_chart, published_comparison,
    runs_table, vllm_v060_runs)

# What each measured set is, as the page names it (the code names stay the keys of data/calibration_errors.csv).
SET_NAMES = {
    "vidur_gemm": "layer GEMMs (vidur)",
    "vidur_elementwise": "norms, RoPE, SiLU, add (vidur)",
    "gemm_kernels_fp8": "FP8 GEMMs (DeepGEMM)",
    "gemm_kernels_fp8_bf16_eta": "FP8 GEMMs at BF16 efficiencies",
    "decode_attn": "decode attention (FlashInfer)",
    "prefill_attn": "prefill attention (FlashAttention-3)",
    "llmservingsim_gemm": "GEMMs (LLMServingSim, eager)",
    "llmservingsim_attn": "attention (LLMServingSim, eager)",
    "llmservingsim_elementwise": "norms, RoPE, SiLU (LLMServingSim, eager)",
    "llmservingsim_attn_vllm_eta": "eager attention at vLLM's efficiency",
    "llmservingsim_elementwise_vllm_eta": "eager norms, RoPE, SiLU at vLLM's efficiency",
    "llmservingsim_step": "whole forward pass (LLMServingSim)",
    "allreduce": "all-reduce (NCCL)",
}
# The calibrated quantities, as the page names them, with the factor that puts each in its unit.
EFFICIENCY_NAMES = {
    "eta_compute": ("GEMM share of peak FLOP/s", 1.0),
    "eta_memory": ("share of HBM bandwidth", 1.0),
    "eta_attn": ("attention share of peak FLOP/s", 1.0),
    "eta_elementwise": ("elementwise share of HBM bandwidth", 1.0),
    "overhead_s": ("GPU's kernel floors per step (ms)", 1e3),
    "allreduce_latency_s": ("all-reduce latency (ms)", 1e3),
}


def set_name(code: str) -> str:
    """The page's name for a measured set (its code name if it has none). Used in chapter 13."""
    return SET_NAMES.get(code, code)


def efficiency_table(before, after):
    """The calibrated quantities of two cost models side by side, named and in the page's units (a ``Styler``).

    Used in chapter 13: ``before`` has the starting values (:data:`batchlab.calibrate.START`), ``after`` the
    calibrated ones; times in ms. A quantity the starting model leaves out (the elementwise term) reads "none".
    """
    def shown(model, field, scale):
        value = getattr(model, field)
        return "none" if value is None or np.isnan(value) else f"{value * scale:.3g}"

    rows = [{"quantity": name, "starting": shown(before, field, scale), "calibrated": shown(after, field, scale)}
            for field, (name, scale) in EFFICIENCY_NAMES.items()]
    return viz.display_table(pd.DataFrame(rows), {c: (c, str) for c in ("quantity", "starting", "calibrated")})


def case_counts(cases: pd.DataFrame):
    """Cases per measured set and by how the calibration used them (fitted, ridge, held out), a ``Styler``.

    Used in chapter 13.
    """
    after = cases[cases["stage"] == "after"]
    table = after.groupby(["set", "group"], sort=False).size().unstack(fill_value=0)
    groups = [g for g in ("fit", "ridge", "held out") if g in table.columns]
    table = table[groups].reset_index()
    table["set"] = table["set"].map(set_name)
    return viz.display_table(table, {"set": ("measured set", str), **{g: (g, "{:,}".format) for g in groups}})


PARITY_DESCRIPTORS = ("model", "op", "geometry", "tp", "workers", "tokens", "batch", "kv_len", "m", "k", "n",
                      "size_bytes")  # the columns that name a measured case
# The measured models (vidur's folders) and LLMServingSim's operators, as a reader names them.
VIDUR_MODELS = {"Llama-2-7b-hf": "Llama-2-7B", "Llama-2-70b-hf": "Llama-2-70B", "CodeLlama-34b-Instruct-hf":
                "CodeLlama-34B", "internlm-20b": "InternLM-20B", "Qwen-72B": "Qwen-72B", "phi-2": "Phi-2"}
OP_NAMES = {"q_proj": "query projection", "k_proj": "key projection", "v_proj": "value projection",
            "o_proj": "output projection", "gate_proj": "gate projection", "up_proj": "up projection",
            "down_proj": "down projection", "lm_head": "LM head", "attn": "attention",
            "norms+rope+act": "norms, RoPE and SiLU", "forward": "whole forward pass"}


def _bytes_text(size: float) -> str:
    """A message size as a reader writes it: "2 KiB", "64 MiB"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:,.3g} {unit}"
    return f"{size:,.0f} B"


def case_text(case) -> str:
    """One measured case in words, for a tooltip: what ran, at which shape (chapter 13).

    ``case`` is a row of :func:`validation_frames`' cases (a Series or a dict with ``set`` and its descriptors).
    """
    c = {k: v for k, v in dict(case).items() if not (isinstance(v, float) and np.isnan(v)) and v is not None}
    code = str(c["set"]).removesuffix("_bf16_eta").removesuffix("_vllm_eta")
    n = lambda key: f"{int(c[key]):,}"  # noqa: E731 - a count with separators
    tokens = f"{n('tokens')} token{'' if c.get('tokens') == 1 else 's'}" if "tokens" in c else ""
    heads = ""
    if "geometry" in c:
        q, kv, d = str(c["geometry"]).split("-")
        heads = f"{q} query and {kv} KV heads of {d}"
    tp = f", TP {n('tp')}" if "tp" in c and int(c["tp"]) > 1 else ""
    if code in ("vidur_gemm", "vidur_elementwise"):
        what = "four GEMMs" if code == "vidur_gemm" else "norms, RoPE, SiLU and add"
        return f"{VIDUR_MODELS.get(c['model'], c['model'])}{tp}: one layer's {what}, {tokens}"
    if code == "gemm_kernels_fp8":
        return f"FP8 GEMM: {n('m')} tokens through a {n('k')} × {n('n')} weight"
    if code == "decode_attn":
        seqs = f"{n('batch')} sequence{'' if c['batch'] == 1 else 's'}"
        return f"decode attention, {heads}{tp}: {seqs} at {n('kv_len')} cached tokens"
    if code == "prefill_attn":
        return f"prefill attention, {heads}: a {n('tokens')}-token prompt"
    if code == "allreduce":
        return f"all-reduce of {_bytes_text(float(c['size_bytes']))} over {n('workers')} GPUs"
    if code.startswith("llmservingsim"):
        return f"Llama-3.1-8B, eager: {OP_NAMES.get(c['op'], c['op'])}, {tokens}"
    return set_name(str(c["set"]))


STAGE_LABELS = {"before": "before calibration", "after": "after calibration"}
GROUP_COLORS = {"fit": viz.PALETTE[0], "ridge": viz.PALETTE[1], "held out": viz.PALETTE[3]}

def _stage_group(split: pd.Series) -> pd.Series:
    """fit / ridge / held out: how a measured case was used by the calibration."""
    return split.where(split.isin(["fit", "ridge"]), "held out")


def validation_frames(before, after, floors=None, own=None, root=None):
    """Every measured case predicted twice, before and after calibration, and the error table.

    Used in chapter 13.

    Parameters
    ----------
    before, after : CostModel
        H100 SXM cost models: DESIGN's starting efficiencies (``cost.replace(**calibrate.START)``) and the
        calibrated defaults. Their model and TP are replaced by each measured case's own; ``after``'s all-reduce
        latency by the per-operator stage's (:func:`batchlab.calibrate.shipped_kernels_only`).
    floors : KernelFloors, optional
        Seconds per kernel added to the per-operator sets after calibration (default
        :func:`batchlab.calibrate.shipped_floors`); the "before" predictions have none, as in
        ``data/calibration_errors.csv``.
    own : OwnKernels, optional
        FP8's and eager PyTorch's efficiencies after calibration (default
        :func:`batchlab.calibrate.shipped_own_kernels`); the "before" predictions use ``before``'s everywhere.
    root : path, optional
        A folder of the raw measured timings; default the compact table in ``data/``, which gives the same.

    Returns
    -------
    cases : DataFrame
        One row per case and stage: ``case_id`` (same case in both stages), ``set``, ``split``, ``group``
        (fit, ridge, held out), ``stage`` (before, after), ``measured_s``, ``predicted_s``, ``rel_err``
        (|predicted / measured - 1|) and the case descriptors.
    errors : DataFrame
        One row per set: ``cases``, ``median_rel_err_before``, ``worst_rel_err_before``,
        ``median_rel_err_after``, ``worst_rel_err_after``, ``diagnostic`` (a set timed under efficiencies
        that are not its kernels', :data:`batchlab.calibrate.DIAGNOSTIC_SETS`), as in the ``all`` rows of
        ``data/calibration_errors.csv``.
    """
    floors = calibrate.shipped_floors() if floors is None else floors
    own = calibrate.shipped_own_kernels() if own is None else own
    # The per-operator stage's all-reduce latency (NCCL's), not the whole-server refit the CostModel carries.
    after = after.replace(allreduce_latency_s=calibrate.shipped_kernels_only()["allreduce_latency_s"])
    stages = {"before": calibrate.load_all(before, root), "after": calibrate.load_all(after, root, floors, own)}
    tables, frames = [], []
    for stage, frame in stages.items():
        frame = frame.assign(case_id=np.arange(len(frame)), stage=stage, group=_stage_group(frame["split"]),
                             rel_err=(frame["predicted_s"] / frame["measured_s"] - 1.0).abs())
        frames.append(frame)
        err = calibrate.relative_errors(frame)
        err = err[err["split"] == "all"].set_index("set")
        tables.append(err[["cases", "median_rel_err", "worst_rel_err"]].add_suffix(f"_{stage}"))
    errors = tables[0].join(tables[1].drop(columns="cases_after")).rename(columns={"cases_before": "cases"})
    errors["diagnostic"] = errors.index.isin(list(calibrate.DIAGNOSTIC_SETS.values()))
    return pd.concat(frames, ignore_index=True), errors.reset_index()


def parity_sample(cases: pd.DataFrame, per_set: int = 100) -> pd.DataFrame:
    """A few hundred cases per set for a parity chart: evenly spaced in measured time, plus each stage's worst.

    The same cases are kept in both stages, so the before and after panels show the same points. Adds
    ``measured_ms``, ``predicted_ms`` and a ``case`` label (:func:`case_text`: the case in words). Used in
    chapter 13.
    """
    keep = []
    for _, per in cases.groupby("set", sort=False):
        first = per[per["stage"] == per["stage"].iloc[0]].sort_values("measured_s", kind="stable")
        pick = np.unique(np.linspace(0, len(first) - 1, min(per_set, len(first))).round().astype(int))
        worst = per.loc[per.groupby("stage")["rel_err"].idxmax(), "case_id"]
        keep += [*first["case_id"].iloc[pick], *worst]
    out = cases[cases["case_id"].isin(keep)].copy()
    out["measured_ms"], out["predicted_ms"] = out["measured_s"] * 1e3, out["predicted_s"] * 1e3
    cols = ["set", *(c for c in PARITY_DESCRIPTORS if c in out.columns)]
    out["case"] = [case_text(dict(zip(cols, row))) for row in out[cols].itertuples(index=False)]
    columns = ["case_id", "set", "group", "stage", "case", "measured_ms", "predicted_ms", "rel_err"]
    return out[columns].reset_index(drop=True)


def llmservingsim_forward(cost, root=None) -> pd.DataFrame:
    """LLMServingSim's eager forward pass of Llama-3.1-8B against ``cost.prefill_time``, elementwise part apart.

    Used in chapter 13.

    Returns
    -------
    DataFrame, per prompt length (``tokens``): ``measured_s`` (the whole pass), ``measured_elementwise_s`` (its
    norms, RoPE and SiLU kernels in 32 layers plus the final norm), ``predicted_s`` (``cost.prefill_time``),
    ``predicted_elementwise_s`` (the part of it that is the elementwise term) and
    ``predicted_without_elementwise_s`` (DESIGN's formula, ``eta_elementwise=None``).
    """
    layers = calibrate.llmservingsim_layers(root)
    measured = calibrate.llmservingsim_forward_s(root)
    model = get_model(calibrate.REFERENCE_MODEL)
    small = layers[list(calibrate.LLMSERVINGSIM_SMALL_OPS)].sum(axis=1)
    measured_elem = model.layers * small + layers["final_layernorm"]
    cost = cost.replace(model=model, dtype="bf16", kv_dtype="bf16", tp=1)
    parts = [cost.step_breakdown([(int(t), 0)]) for t in measured.index]
    predicted = np.array([p.total_s for p in parts])
    elementwise = np.array([p.elementwise_s for p in parts])
    return pd.DataFrame({
        "tokens": measured.index.to_numpy(dtype=np.float64), "measured_s": measured.to_numpy(),
        "measured_elementwise_s": measured_elem.reindex(measured.index).to_numpy(),
        "predicted_s": predicted, "predicted_elementwise_s": elementwise,
        "predicted_without_elementwise_s": predicted - elementwise,
    })


def eager_holdout_error(cost, max_tokens: int, root=None) -> pd.Series:
    """Median error of eager PyTorch's kernels on prompts longer than ``max_tokens``, fitted up to it.

    Refits eager attention's and elementwise efficiencies and floors (:func:`batchlab.calibrate.fit_eager`)
    on LLMServingSim's prompts of at most ``max_tokens`` tokens, with ``cost``'s other efficiencies, and
    returns the median relative error per set (``llmservingsim_attn``, ``llmservingsim_elementwise``) on the
    longer prompts: how far the fitted shape carries. Used in chapter 13.
    """
    etas, floors = calibrate.fit_eager(root, max_tokens, cost)
    own = calibrate.shipped_own_kernels()._replace(eager_eta_attn=etas["eta_attn"],
                                                   eager_eta_elementwise=etas["eta_elementwise"])
    frame = calibrate.load_llmservingsim(cost, root, floors, own)
    eager = frame["set"].isin(["llmservingsim_attn", "llmservingsim_elementwise"]) & (frame["tokens"] > max_tokens)
    frame = frame[eager]
    return (frame["predicted_s"] / frame["measured_s"] - 1).abs().groupby(frame["set"]).median()


def parity_frame(sample: pd.DataFrame, band: float = 0.15) -> pd.DataFrame:
    """Parity points plus, per set and stage, the lines y = x and y = (1 +- ``band``) x spanning the set's range.

    ``sample`` is :func:`parity_sample`. Adds ``kind`` ("case" or the line's label) and ``panel`` (the stage as
    "before calibration" / "after calibration"). Cases predicted at 0 (a term the starting model does not have)
    cannot sit on a log axis and are left out. Used in chapter 13.
    """
    sample = sample[sample["predicted_ms"] > 0]
    lines = _band_lines(sample, ["set", "stage"], "set", band)
    out = pd.concat([sample.assign(kind="case", line=""), lines], ignore_index=True)
    out["panel"] = out.pop("stage").map(STAGE_LABELS)
    for col in ("measured_ms", "predicted_ms", "rel_err"):  # four digits are plenty on a log axis, and a smaller page
        out[col] = [float(f"{v:.4g}") for v in out[col]]
    return out.drop(columns=[c for c in ("case_id",) if c in out])


WIDE_DECADES = 2.0  # a set whose times span more decades than this gets a label per decade only


def wide_sets(frame: pd.DataFrame, decades: float = WIDE_DECADES) -> list[str]:
    """The sets of :func:`parity_frame` whose measured and predicted times (both panels, lines included) span
    more than ``decades`` powers of ten: their axes label powers of ten only, the others 1, 2 and 5 times them."""
    times = pd.concat([frame[["set", "measured_ms"]].rename(columns={"measured_ms": "ms"}),
                       frame[["set", "predicted_ms"]].rename(columns={"predicted_ms": "ms"})])
    times = times[times["ms"] > 0].groupby("set", sort=False)["ms"]
    span = np.log10(times.max() / times.min())
    return [str(name) for name in span.index[span > decades]]


def parity_chart(sample: pd.DataFrame, value: str | None = None, band: float = 0.15, size: int = 260):
    """Predicted against measured time on log-log axes, before and after calibration side by side.

    Used in chapter 13.

    Parameters
    ----------
    sample : DataFrame
        :func:`parity_sample`: ``set``, ``stage`` (before, after), ``group`` (fit, ridge, held out), ``case``,
        ``measured_ms``, ``predicted_ms`` (ms), ``rel_err``.
    value : str, optional
        The set shown first (default: the first in ``sample``).
    band : float
        Relative error drawn as dashed lines around y = x (the calibration target, 15 %).
    size : int
        Pixels of each square panel.

    Returns
    -------
    altair chart; a select box picks the measured set, both panels redraw with their axes fitted to it.
    """
    data = parity_frame(sample, band)
    sets = list(dict.fromkeys(sample["set"]))
    param = alt.param(name="measured_set", value=value or sets[0],
                      bind=alt.binding_select(options=sets, labels=[set_name(x) for x in sets],
                                              name="measured set "))
    axis = time_axis(f"indexof({json.dumps(wide_sets(data))}, measured_set) >= 0")
    x = alt.X("measured_ms:Q", title="measured time", **axis)
    y = alt.Y("predicted_ms:Q", title="predicted time", **axis)
    base = alt.Chart().transform_filter("datum.set == measured_set")
    points = base.transform_filter("datum.kind == 'case'").transform_calculate(
        measured_text=kernel_time_text("measured_ms"), predicted_text=kernel_time_text("predicted_ms")
    ).mark_circle(size=22, opacity=0.7).encode(
        x=x, y=y, color=alt.Color("group:N", title=None, legend=alt.Legend(orient="top"),
                                  scale=alt.Scale(domain=list(GROUP_COLORS), range=list(GROUP_COLORS.values()))),
        tooltip=[viz.tip("case", "measured case", kind="N"), viz.tip("group", "used by the fit as", kind="N"),
                 viz.tip("measured_text", "measured time", kind="N"),
                 viz.tip("predicted_text", "predicted time", kind="N"),
                 viz.tip("rel_err", "relative error", ".1%")])
    lines = base.transform_filter("datum.kind != 'case'").mark_line(color="#555555", strokeWidth=1).encode(
        x=x, y=y, detail="line:N", strokeDash=alt.StrokeDash("kind:N", title=None, legend=alt.Legend(orient="top"),
                                                             scale=alt.Scale(range=[[1, 0], [4, 3]])))
    panels = alt.layer(lines, points, data=data).properties(width=size, height=size)
    return panels.facet(column=alt.Column("panel:N", title=None, sort=list(STAGE_LABELS.values()))).add_params(param)


SHORT_FIT_MAX_TOKENS = 1024  # eager attention refitted on prompts up to this: how far a short fit carries


def case_scope(cases: pd.DataFrame) -> dict:
    """What the per-operator sets span, by glue name: vidur's models (GEMMs, elementwise), its largest token
    count and TP degree, the floors fitted per kernel (µs, least and largest). Used in chapter 13."""
    vidur = cases[cases["set"] == "vidur_gemm"]
    floors = [v * 1e6 for v in calibrate.shipped_floors()]
    return {"vidur_models": int(vidur["model"].nunique()),
            "elem_models": int(cases.loc[cases["set"] == "vidur_elementwise", "model"].nunique()),
            "vidur_tokens_hi": int(vidur["tokens"].max()), "vidur_tp_hi": int(vidur["tp"].max()),
            "floor_us_lo": min(floors), "floor_us_hi": max(floors)}


def book_kernel_errors(cases: pd.DataFrame, model) -> dict:
    """Median error after calibration of the attention kernels timed at ``model``'s own geometry (its query heads,
    KV heads and head size; decode on one GPU), by glue name ``book_decode_attn``, ``book_prefill_attn``, with
    the geometry's case counts. Used in chapter 13 for the book's model (Llama-3-8B: 32 / 8 / 128)."""
    geometry = f"{model.heads}-{model.kv_heads}-{model.head_dim}"
    after = cases[(cases["stage"] == "after") & (cases["geometry"] == geometry)]
    decode = after[(after["set"] == "decode_attn") & (after["tp"] == 1)]["rel_err"]
    prefill = after[after["set"] == "prefill_attn"]["rel_err"]
    if decode.empty or prefill.empty:
        raise ValueError(f"model: no measured attention case at geometry {geometry} (heads-kv_heads-head_dim)")
    return {"book_decode_attn": float(decode.median()), "book_decode_cases": len(decode),
            "book_prefill_attn": float(prefill.median()), "book_prefill_cases": len(prefill),
            "book_heads": model.heads, "book_kv_heads": model.kv_heads}


def kernel_headline(err: pd.DataFrame, after, cases: pd.DataFrame) -> tuple[dict, pd.Series]:
    """The numbers the per-kernel part of the chapter quotes, by glue name, and each set's median error on its
    held-out split (after the fit).

    ``err``: the per-set error table of :func:`validation_frames`; ``after``: the calibrated cost model; ``cases``:
    every measured case with its prediction before and after.
    """
    own = calibrate.shipped_own_kernels()
    held = cases[(cases["stage"] == "after") & (cases["group"] == "held out")].groupby("set")["rel_err"].median()
    forward = llmservingsim_forward(after)
    longest = forward.iloc[-1]
    elementwise_share = forward["measured_elementwise_s"] / forward["measured_s"]
    diag = calibrate.DIAGNOSTIC_SETS
    fp8 = type(after)(after.hardware, after.model, dtype="fp8")
    numbers = {
        "fp8_diag": err.loc[diag["gemm_kernels_fp8"], "median_rel_err_after"],
        "eta_c_fp8": own.eta_compute_fp8, "eta_m_fp8": own.eta_memory_fp8,  # the per-kernel fit (DeepGEMM)
        # What ``CostModel(..., dtype="fp8")`` takes: the whole-server re-fit, not the per-kernel pair above.
        "eta_c_fp8_default": fp8.eta_compute, "eta_m_fp8_default": fp8.eta_memory,
        "eta_c_bf16": after.eta_compute, "eta_m_bf16": after.eta_memory,
        "attn_diag": err.loc[diag["llmservingsim_attn"], "median_rel_err_after"],
        "eager_eta_attn": own.eager_eta_attn, "eta_attn": after.eta_attn,
        "eager_attn_floor_us": calibrate.shipped_floors().eager_attn_s * 1e6,
        "attn_held": held["llmservingsim_attn"],
        "attn_held_short_fit": eager_holdout_error(after, SHORT_FIT_MAX_TOKENS)["llmservingsim_attn"],
        "eager_fit_max": calibrate.EAGER_FIT_MAX_TOKENS,
        "elem_diag": err.loc[diag["llmservingsim_elementwise"], "median_rel_err_after"],
        "eager_eta_elem": own.eager_eta_elementwise, "eta_elem": after.eta_elementwise,
        "elem_held": held["llmservingsim_elementwise"],
        "step_without": (forward["predicted_without_elementwise_s"] / forward["measured_s"] - 1).abs().median(),
        "elem_share_lo": elementwise_share.min(), "elem_share_hi": elementwise_share.max(),
        "elem_pred_share": longest["predicted_elementwise_s"] / longest["predicted_s"],
        "elem_slowdown": longest["measured_elementwise_s"] / longest["predicted_elementwise_s"],
        "longest_tokens": int(longest["tokens"]),
        "short_fit_max": SHORT_FIT_MAX_TOKENS,
        **case_scope(cases),
    }
    return {name: float(value) for name, value in numbers.items()}, held


def error_table(errors: pd.DataFrame):
    """:func:`validation_frames`' error table as the page shows it (a ``Styler``): five narrow columns, errors in %.

    Used in chapter 13. One row per measured set: ``measured set``, ``cases``, ``median, starting (%)``,
    ``median, calibrated (%)``, ``worst, calibrated (%)``; diagnostic sets (kernels vLLM does not run, priced
    with the BF16 defaults) are marked with "(diagnostic)" after their name.
    """
    name = errors["set"].map(set_name) + np.where(errors["diagnostic"], " (diagnostic)", "")
    table = pd.DataFrame({"name": name, "cases": errors["cases"], "before": errors["median_rel_err_before"] * 100,
                          "after": errors["median_rel_err_after"] * 100,
                          "worst": errors["worst_rel_err_after"] * 100})
    pct = "{:.1f}".format
    return viz.display_table(table, {"name": ("measured set", str), "cases": ("cases", "{:,}".format),
                                     "before": ("median, starting (%)", pct),
                                     "after": ("median, calibrated (%)", pct), "worst": ("worst, calibrated (%)", pct)})


# -- facts other pages glue (batchlab.chapters.facts) ----------------------------------------------------------
# The serving terms are fitted once for every model and GPU; the scene names the model whose cost model the
# book reads them from.
def _llama8():
    return scenes.scene("llama8").cost()


@facts.fact("request_latency_ms", scene="llama8", unit="ms", fmt=".1f", chapter="validation",
            text="the request latency: from the API server's tokenising to the engine seeing a request (HTTP, the "
                 "hop to the engine core, streaming back), fitted on the measured vLLM runs")
def _request_latency():
    return _llama8().request_latency_s * 1e3


@facts.fact("step_overhead_ms", scene="llama8", unit="ms", fmt=".2f", chapter="validation",
            text="the GPU's fixed cost of one iteration, whatever it holds: the kernels' floors, fitted on the "
                 "measured kernels")
def _step_overhead():
    return _llama8().overhead_s * 1e3


@facts.fact("cpu_step_ms", scene="llama8", unit="ms", fmt=".2f", chapter="validation",
            text="the engine's CPU work per iteration (input preparation, scheduling, output processing), before "
                 "async scheduling hides part of it")
def _cpu_step():
    return _llama8().cpu_step_s * 1e3


@facts.fact("cpu_seq_us", scene="llama8", unit="µs", fmt=".1f", chapter="validation",
            text="the engine's CPU work per scheduled sequence and iteration")
def _cpu_seq():
    return _llama8().cpu_seq_s * 1e6


@facts.fact("cpu_hidden_share", scene="llama8", unit="", fmt=".0%", chapter="validation",
            text="the share of the engine's CPU work per iteration that async scheduling overlaps with the GPU")
def _cpu_hidden():
    return float(_llama8().cpu_hidden_fraction)


@facts.fact("fixed_step_sync_ms", scene="llama8", unit="ms", fmt=".2f", chapter="validation",
            text="what every iteration costs whatever it holds on the synchronous engine: the GPU's fixed cost "
                 "plus the CPU work per iteration")
def _fixed_sync():
    c = _llama8()
    return (c.overhead_s + c.cpu_step_s) * 1e3


@facts.fact("fixed_step_async_ms", scene="llama8", unit="ms", fmt=".2f", chapter="validation",
            text="the same under vLLM's default async scheduling, which hides its share of the CPU work behind a "
                 "long enough GPU step")
def _fixed_async():
    c = _llama8()
    return (c.overhead_s + c.cpu_step_s * (1 - c.cpu_hidden_fraction)) * 1e3
