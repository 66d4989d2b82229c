"""Chapter 5, the prefill spike: one long prompt computed unchunked stalls every decoder for one whole step.

The scene is :mod:`batchlab.chapters.scenes`' (decoders at 2,048 tokens of KV cache, one 8,000-token prompt
arriving) under ``policy="continuous"``, Orca's scheduler, in two orders: the prompt computed beside every
decoder's token (mixed step) or alone (vLLM V0's prefill-only step). Short requests arriving during the
prefill, and the same stream without the long prompt, show who else waits. The chart draws the decoders' gaps
around the long prompt's arrival and the short requests' TTFT, with radio buttons for the model and the order.
"""
from __future__ import annotations

from typing import NamedTuple

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..workload import _rng
from . import facts, scenes

SPIKE_ORDERS = {"mixed step (Orca)": False, "prefill-only step (vLLM V0)": True}  # label -> prefill_only_steps
N_BEHIND = 6  # short requests sent while the long prompt is being prefilled (the facts spike_behind_*)
BEHIND_TOKENS = 256  # their prompt tokens
SENT_TITLE = "time since the long prompt was sent (s)"  # the chart's clock: zero at its client's send
RIGHT_PAD_PX = 14  # half the widest x tick label ("1.2", centred on the axis's last tick) and a margin


class Spike(NamedTuple):
    """One prefill-spike run, from :func:`prefill_spike`. Used in chapters 5 and 12."""

    itl: pd.DataFrame  # scenes.decoder_gaps: time_s since the long prompt was sent, itl_s, sequences
    behind: pd.DataFrame  # short requests: arrival_s (after the long prompt's), ttft_s with, ttft_baseline_s without
    summary: dict  # the numbers the page reads (seconds unless named otherwise)
    run: object  # SimResult with the long prompt
    baseline: object  # SimResult of the same stream without it


def prefill_spike(cost, *, n_decoders: int | None = None, context: int = scenes.CONTEXT,
                  prompt_tokens: int = scenes.PROMPT_TOKENS, n_behind: int = N_BEHIND,
                  behind_tokens: int = BEHIND_TOKENS,
                  prefill_only_steps: bool = False, lead_s: float = 0.2, tail_steps: int = 40, seed=0,
                  **knobs) -> Spike:
    """The shared scene with the long prompt joining unchunked (policy ``continuous``). Used in chapters 5 and 12.

    ``n_behind`` short requests arrive at times drawn uniformly within ``cost.prefill_time(prompt_tokens)``
    after the long prompt; the engine sees each of them, as the long prompt, ``cost.request_latency_s`` after
    its arrival, so all of them reach it while the long prompt is being computed. The same stream without the
    long prompt is the counterfactual for their TTFT. ``max_num_seqs`` and the KV pool are the GPU's own unless
    ``knobs`` set them.

    Parameters
    ----------
    cost : CostModel
    n_decoders, context, prompt_tokens : int
        The scene's batch (default :func:`batchlab.chapters.scenes.default_decoders`), the decoders' cached
        tokens when the long prompt can first be admitted, and the long prompt's tokens.
    n_behind, behind_tokens : int
        Short requests queued behind the long prompt, and their prompt tokens.
    prefill_only_steps : bool
        vLLM V0's order: an iteration that admits prompts runs only them, and the decodes wait.
    lead_s : float
        Seconds of the decoders' gaps kept before the arrival in ``itl``.
    tail_steps : int
        Decode steps every decoder has left after the long prompt's prefill.
    seed : int or numpy.random.Generator
        Draws the short requests' arrival times.
    **knobs
        Passed to :func:`batchlab.simulate` through :func:`batchlab.chapters.scenes.run`
        (``gpu_memory_utilization``, ``num_kv_blocks``, ``max_num_seqs``, ...).

    Returns
    -------
    Spike
        ``summary``: the scene's measures (:func:`batchlab.chapters.scenes.measures`: ``itl_max_s``, the spike;
        ``ttft_s``, the long prompt's; ``cadence_s``; ``admit_step`` and ``admit_step_s``, ...), and
        ``prefill_s`` (``cost.prefill_time``), ``ideal_prefill_s`` (``cost.ideal().prefill_time``),
        ``behind_ttft_s`` and ``behind_ttft_baseline_s`` (means over the short requests),
        ``behind_kv_waits`` (short requests first scheduled after the iteration that computed the long prompt:
        they waited for KV blocks, not for the prefill), ``n_decoders``, ``context`` and ``kv_pool_tokens``.
    """
    behind = np.sort(_rng(seed).uniform(0.0, cost.prefill_time(prompt_tokens), n_behind))
    kw = dict(n_decoders=n_decoders, context=context, prompt_tokens=prompt_tokens, behind_after_s=behind,
              behind_tokens=behind_tokens, tail_steps=tail_steps, prefill_only_steps=prefill_only_steps, **knobs)
    scene = scenes.run(cost, "continuous", **kw)
    base = scenes.run(cost, "continuous", newcomer=False, **kw)
    n = scene.n_decoders
    admit = scene.res.steps.iloc[scene.measures["admit_step"]]
    scheduled = scene.res.requests["scheduled_s"].to_numpy()[n + 1:]
    ttft = pd.DataFrame({"arrival_s": behind, "ttft_s": scene.res.requests["ttft_s"].to_numpy()[n + 1:],
                         "ttft_baseline_s": base.res.requests["ttft_s"].to_numpy()[n:]})
    summary = {**scene.measures, "prefill_s": cost.prefill_time(prompt_tokens),
               "ideal_prefill_s": cost.ideal().prefill_time(prompt_tokens),
               "behind_ttft_s": float(ttft["ttft_s"].mean()),
               "behind_ttft_baseline_s": float(ttft["ttft_baseline_s"].mean()),
               "behind_kv_waits": int((scheduled > admit["start_s"] + admit["duration_s"] + scenes._EPS_S).sum()),
               "n_decoders": n, "context": context,
               "kv_pool_tokens": (scene.res.knobs["num_kv_blocks"] - 1) * scene.res.knobs["block_size"]}
    return Spike(scenes.decoder_gaps(scene, before_s=lead_s), ttft, summary, scene.res, base.res)


def spike_scenarios(scenarios: dict, orders: dict = SPIKE_ORDERS, **kw):
    """:func:`prefill_spike` for several models and scheduler orders, as tidy frames for one chart.

    Used in chapter 5.

    Parameters
    ----------
    scenarios : dict
        Label -> (CostModel, n_decoders) or (CostModel, n_decoders, dict of :func:`prefill_spike` keywords for
        this model alone, e.g. its ``gpu_memory_utilization``); ``n_decoders`` None takes the scene's default
        batch.
    orders : dict
        Label -> ``prefill_only_steps``.
    **kw
        Passed to :func:`prefill_spike` (context, prompt_tokens, seed, ...).

    Returns
    -------
    itl : DataFrame
        Decoder gaps with ``model`` and ``order`` columns, ``time_s`` (s, since the long prompt was sent),
        ``itl_ms`` and ``sequences``.
    behind : DataFrame
        The short requests: ``model``, ``order``, ``arrival_ms`` (after the long prompt), ``run`` ("with the
        long prompt" or "without it") and ``ttft_ms``.
    summary : DataFrame
        One row per model and order: the ``Spike.summary`` keys.
    spikes : dict
        (model, order) -> Spike, for anything else a page reads.
    """
    spikes = {}
    for m, (cost, n, *own) in scenarios.items():
        for o, v0 in orders.items():
            spikes[m, o] = prefill_spike(cost, n_decoders=n, prefill_only_steps=v0, **{**kw, **(own[0] if own else {})})
    itl = pd.concat([s.itl.assign(model=m, order=o, itl_ms=s.itl["itl_s"] * 1e3) for (m, o), s in spikes.items()],
                    ignore_index=True)
    behind = pd.concat([s.behind.assign(model=m, order=o) for (m, o), s in spikes.items()], ignore_index=True)
    behind = behind.rename(columns={"ttft_s": "with the long prompt", "ttft_baseline_s": "without it"}).melt(
        id_vars=["model", "order", "arrival_s"], var_name="run", value_name="ttft_s")
    behind = behind.assign(arrival_ms=behind["arrival_s"] * 1e3, ttft_ms=behind["ttft_s"] * 1e3)
    summary = pd.DataFrame([{"model": m, "order": o, **s.summary} for (m, o), s in spikes.items()])
    return itl.drop(columns="itl_s"), behind.drop(columns=["arrival_s", "ttft_s"]), summary, spikes


def admission_table(spike: Spike, before: int = 2, after: int = 2):
    """The iterations around the one that computes the long prompt, as the page shows them (a ``Styler``).

    Used in chapter 5. One row per iteration, ``before`` and ``after`` rows either side of the admitting one
    (``spike.summary["admit_step"]``). Its start is in ms since the long prompt's client sent it, the zero of
    the chart's time axis (negative: before the send; the engine sees the prompt ``request_latency_s`` after
    it); its duration in ms; and a note saying what the iteration computes besides the decodes: nothing
    ("decodes only"), the long prompt, or the short requests' prompts (how many, of how many tokens each).
    """
    at = spike.summary["admit_step"]
    steps, req = spike.run.steps, spike.run.requests
    n = int(spike.summary["n_decoders"])
    long_tokens, sent = int(req["prompt_tokens"].iloc[n]), float(req["arrival_s"].iloc[n])
    rows = steps.iloc[max(at - before, 0): at + after + 1]
    short = req.iloc[n + 1:]
    notes = []
    for i, row in rows.iterrows():
        if row["prefill_tokens"] == 0:
            notes.append("decodes only")
        elif i == at:
            notes.append(f"the long prompt, all {long_tokens:,} tokens")
        else:  # the short requests first scheduled in this iteration
            end = row["start_s"] + row["duration_s"]
            joined = short[(short["scheduled_s"] >= row["start_s"] - scenes._EPS_S)
                           & (short["scheduled_s"] < end - scenes._EPS_S)]
            sizes = sorted(set(joined["prompt_tokens"]))
            each = f" of {sizes[0]:,} tokens" if len(sizes) == 1 else ""
            notes.append(f"{len(joined)} short prompts{each}")
    shown = rows.assign(start_ms=(rows["start_s"] - sent) * 1e3, duration_ms=rows["duration_s"] * 1e3, note=notes)
    count = "{:,.0f}".format
    return viz.display_table(shown, {
        "start_ms": ("start (ms)", "{:,.1f}".format),  # since the long prompt's send
        "duration_ms": ("duration (ms)", "{:.1f}".format), "prefill_tokens": ("prompt tokens", count),
        "decode_seqs": ("decoding sequences", count), "running": ("running", count), "bound": ("bound by", str),
        "note": ("besides the decodes", str)})


SCENARIO_ROWS = {"cadence_s": "decode cadence", "itl_max_s": "longest gap", "admit_step_s": "admitting iteration",
                 "prefill_s": "prefill alone", "ttft_s": "long prompt's TTFT",
                 "behind_ttft_s": "short requests' TTFT (mean)",
                 "behind_ttft_baseline_s": "same, without the long prompt"}


def scenario_table(summary: pd.DataFrame):
    """:func:`spike_scenarios`' summary as the page shows it: one row per quantity, one column per model and
    scheduler order, so four runs fit the text column side by side. The data is in ms; each cell reads as
    :func:`batchlab.viz.format_duration` prints it ("20.0 ms", "1.10 s"), the unit in the cell.

    Used in chapter 5.
    """
    runs = [f"{m}, {o}" for m, o in zip(summary["model"], summary["order"])]
    shown = (summary[list(SCENARIO_ROWS)] * 1e3).T.set_axis(runs, axis=1)
    shown.insert(0, "quantity", list(SCENARIO_ROWS.values()))
    return viz.display_table(shown, {"quantity": ("time", str), **{r: (r, viz.format_duration) for r in runs}})


def _radio(name: str, options, label: str):
    """A parameter bound to radio buttons over a few named ``options``, and the filter on the column ``name``."""
    options = [str(o) for o in options]
    param = alt.param(name=name, value=options[0], bind=alt.binding_radio(options=options, name=label))
    return param, f"datum['{name}'] == {name}"


def spike_chart(itl: pd.DataFrame, behind: pd.DataFrame, reference_ms: float | None = None,
                reference_label: str = "", width: int = 520, height: int = 230):
    """The decoders' inter-token gaps around a long unchunked prompt, and the TTFT of requests behind it.

    Used in chapter 5.

    Parameters
    ----------
    itl : DataFrame
        ``model``, ``order``, ``time_s`` (s since the long prompt was sent), ``itl_ms``, ``sequences``
        (:func:`spike_scenarios`).
    behind : DataFrame
        ``model``, ``order``, ``arrival_ms``, ``run`` and ``ttft_ms`` of the requests queued behind it.
    reference_ms : float, optional
        A gap to draw as a dashed horizontal rule (e.g. a published number), labelled ``reference_label`` at the
        panel's right edge.
    width, height : int
        Pixels of the timeline panel; the TTFT panel below it is as wide and shorter.

    Returns
    -------
    altair chart with two groups of radio buttons, ``model`` and ``order``, that pick the run both panels show;
    the largest gap is labelled with its value, on the side of its dot that has room. The panels are stacked so
    the chart fits the text column; every mark has a tooltip.
    """
    model, at_model = _radio("model", itl["model"].unique(), "model")
    order, at_order = _radio("order", itl["order"].unique(), "scheduler order")
    pick = f"{at_model} && {at_order}"
    # Both y axes reserve room for the widest label of any selection (the 70B model's gaps run to thousands of
    # ms), so choosing another run never pushes an axis title past the chart's left edge.
    widest = label_extent(itl["itl_ms"], behind["ttft_ms"], reference_ms or 0)
    y_axis = alt.Axis(minExtent=widest, titlePadding=8, format=",.0f")
    ms_axis = alt.Axis(tickCount=6, labelSeparation=8, format=",.0f")  # no two labels touching ("1,0001,100")
    # zero is the long prompt's send, as in admission_table; no two labels touching
    x = alt.X("time_s:Q", title=SENT_TITLE, axis=alt.Axis(tickCount=6, labelSeparation=8, labelFlush=False))
    y = alt.Y("itl_ms:Q", title=viz.title("itl_ms"), axis=y_axis)
    base = alt.Chart(itl).transform_filter(pick).transform_calculate(gap=viz.duration_text("itl_ms"))
    gap_tips = [viz.tip("time_s", SENT_TITLE, ".3f"), viz.tip("gap", "inter-token latency", kind="N"),
                viz.tip("sequences", "decoders with this gap (sequences)", ",")]
    # The largest gap's label, on the side with room: two text layers over the same dot, one of them drawing an
    # empty string (a layer filtered to nothing would make Vega warn of an infinite extent).
    top = base.transform_joinaggregate(top="max(itl_ms)", lo="min(time_s)", hi="max(time_s)").transform_filter(
        "datum.itl_ms == datum.top").transform_calculate(
        text="'one gap of ' + (" + viz.duration_text("itl_ms") + ")", left="datum.time_s > (datum.lo + datum.hi) / 2",
        right_text="datum.left ? '' : datum.text", left_text="datum.left ? datum.text : ''")
    layers = [
        base.mark_circle(size=30, opacity=0.85, color=viz.PALETTE[0]).encode(x=x, y=y, tooltip=gap_tips),
        top.mark_text(align="left", dx=8).encode(x=x, y=y, text="right_text:N"),
        top.mark_text(align="right", dx=-8).encode(x=x, y=y, text="left_text:N"),
    ]
    if reference_ms is not None:
        ref = alt.Chart(pd.DataFrame({"itl_ms": [reference_ms], "text": [reference_label]}))
        layers += [ref.mark_rule(color="#888888", strokeDash=[4, 3]).encode(
                       y=y, tooltip=[viz.tip("text", "reference", kind="N"), viz.tip("itl_ms", fmt=",.0f")]),
                   ref.mark_text(align="right", baseline="bottom", dy=-3, color="#555555").encode(
                       x=alt.value("width"), y=y, text="text:N")]
    ttft = alt.Chart(behind).transform_filter(pick).transform_calculate(
        ttft=viz.duration_text("ttft_ms")).mark_line(point=True).encode(
        x=alt.X("arrival_ms:Q", title="arrival after the long prompt (ms)", axis=ms_axis),
        y=alt.Y("ttft_ms:Q", title=viz.title("ttft_ms"), axis=y_axis),
        color=alt.Color("run:N", title=None, legend=alt.Legend(orient="top"),
                        scale=alt.Scale(domain=sorted(behind["run"].unique()), range=[viz.PALETTE[3], viz.PALETTE[2]])),
        tooltip=[viz.tip("run", "run", kind="N"), viz.tip("arrival_ms", "arrival after the long prompt (ms)", ",.1f"),
                 viz.tip("ttft", "TTFT", kind="N")])  # durations as the book prints them: "1.29 s"
    return alt.vconcat(alt.layer(*layers).properties(width=width, height=height),
                       ttft.properties(width=width, height=int(height * 0.6))).resolve_legend(
        color="independent").add_params(model, order).properties(  # the legend sits with its panel
        padding={"left": 12, "top": 5, "right": RIGHT_PAD_PX, "bottom": 5})


def label_extent(*values, px_per_char: int = 7) -> int:
    """Pixels a y axis's labels need for the largest of ``values`` printed as ``1,234``, plus the tick.

    Used by :func:`spike_chart` (chapter 5) so every selection draws its axes at the same width.
    """
    top = max(float(np.nanmax(np.asarray(v, dtype=float))) for v in values)
    return px_per_char * len(f"{top:,.0f}") + 10


# -- facts other pages glue (batchlab.chapters.facts) ----------------------------------------------------------
def _spike8() -> dict:
    """The shared scene unchunked (Orca's mixed step) for Llama-3-8B BF16: the run every page quotes."""
    return _spike_summary(scenes.scene("spike").cost())


@facts.memo
def _spike_summary(cost) -> dict:
    return prefill_spike(cost).summary


@facts.fact("spike_decoders", scene="spike", unit="sequences", fmt="d", chapter="prefill_spike",
            text="the scene's batch: the decoders whose step at 2,048 tokens of context is closest to the article's "
                 "20 ms (Llama-3-8B BF16, synchronous engine)")
def _decoders():
    return int(_spike8()["n_decoders"])


@facts.fact("spike_cadence_ms", scene="spike", unit="ms", fmt=".1f", chapter="prefill_spike",
            text="the decoders' step, and so their gap between two tokens, just before the long prompt arrives")
def _cadence():
    return _spike8()["cadence_s"] * 1e3


@facts.fact("spike_gap_ms", scene="spike", unit="ms", fmt=".0f", chapter="prefill_spike",
            text="the gap every decoder sees when the 8,000-token prompt is computed unchunked in one iteration "
                 "beside their tokens (calibrated)")
def _gap():
    return _spike8()["itl_max_s"] * 1e3


@facts.fact("spike_ratio", scene="spike", unit="times", fmt=".1f", chapter="prefill_spike",
            text="the unchunked gap over the decoders' cadence just before the long prompt: how many usual steps "
                 "every decoder waits for its next token")
def _ratio():
    s = _spike8()
    return s["itl_max_s"] / s["cadence_s"]


@facts.fact("spike_behind_requests", scene="spike", unit="requests", fmt="d", chapter="prefill_spike",
            text="the short requests chapter 5 sends while the long prompt is being prefilled (chapter 6's runs "
                 "leave them out)")
def _behind_requests():
    return N_BEHIND


@facts.fact("spike_behind_tokens", scene="spike", unit="tokens", fmt="d", chapter="prefill_spike",
            text="the prompt tokens of each of those short requests")
def _behind_tokens():
    return BEHIND_TOKENS


@facts.fact("prefill8_ideal_ms", scene="llama8", unit="ms", fmt=".0f", chapter="prefill_spike",
            text="the 8,000-token prefill of Llama-3-8B BF16 alone at 100% of the H100's dense BF16 peak")
def _prefill8():
    return scenes.scene("llama8").cost().ideal().prefill_time(scenes.PROMPT_TOKENS) * 1e3


@facts.fact("prefill8_ms", scene="llama8", unit="ms", fmt=".0f", chapter="prefill_spike",
            text="the same prefill alone, calibrated")
def _prefill8_cal():
    return scenes.scene("llama8").cost().prefill_time(scenes.PROMPT_TOKENS) * 1e3


@facts.fact("prefill70_ideal_ms", scene="llama70", unit="ms", fmt=".0f", chapter="prefill_spike",
            text="the 8,000-token prefill of Llama-3-70B FP8 alone at 100% of the H100's dense FP8 peak")
def _prefill70():
    return scenes.scene("llama70").cost().ideal().prefill_time(scenes.PROMPT_TOKENS) * 1e3


@facts.fact("gemm70_ms", scene="llama70", unit="ms", fmt=".0f", chapter="prefill_spike",
            text="the GEMMs alone of that prefill, 2 P' N FLOPs at the dense FP8 peak")
def _gemm70():
    from .fact_check import prefill_arithmetic

    return prefill_arithmetic(scenes.scene("llama70").cost(), scenes.PROMPT_TOKENS)["gemm_s"] * 1e3


@facts.fact("mfu400_8", scene="spike", unit="", fmt=".0%", chapter="prefill_spike",
            text="the model FLOPs utilisation at which the unchunked step of the scene (prompt and decoders) would "
                 "take the article's 400 ms")
def _mfu400_8():
    from .fact_check import implied_mfu

    return implied_mfu(scenes.scene("spike").cost(), scenes.PROMPT_TOKENS, 0.400, _decoders(), scenes.CONTEXT)


@facts.fact("mfu400_70", scene="llama70", unit="", fmt=".0%", chapter="prefill_spike",
            text="the MFU at which the 8,000-token prefill of Llama-3-70B FP8 alone would take 400 ms")
def _mfu400_70():
    from .fact_check import implied_mfu

    return implied_mfu(scenes.scene("llama70").cost(), scenes.PROMPT_TOKENS, 0.400)
