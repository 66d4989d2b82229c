"""Chapter 6, chunked prefill: the token budget trades the decoders' worst gap against the newcomer's TTFT.

The scene is :mod:`batchlab.chapters.scenes`' (``SCENES["spike"]``: decoders at 2,048 tokens of KV cache, one
8,000-token prompt arriving) under ``policy="chunked"``, once per ``max_num_batched_tokens`` and once with chunking
off. :func:`fit_chunk_hyperbola` fits (ITL_max - t_d)(TTFT - L - N alpha) = N alpha t_d to the chunked runs (L the
request latency every TTFT includes, known from the cost model), and :func:`chunking_chart` draws the trade with a
budget slider, a chunking checkbox (which disables the slider) and the decoders' gaps at the chosen setting.
The facts at the end (``chunk_off_ttft_ms``, ``chunk_<budget>_gap_ms``, ``chunk_<budget>_ttft_ms``) are the
trade at the budgets the book quotes.
"""
from __future__ import annotations

from typing import NamedTuple

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from . import facts, scenes


def chunk_budget_sweep(cost, max_num_batched_tokens, *, unchunked_max_num_batched_tokens: int = 16384,
                       window_s: float = 0.1, **scene):
    """The decoders' worst ITL and the newcomer's TTFT at each token budget, and with chunking off.

    Used in chapter 6.

    Chunking off is vLLM V1's own switch: ``policy="chunked"`` with ``enable_chunked_prefill=False`` and a
    budget of ``unchunked_max_num_batched_tokens``, large enough for the whole prompt and the decodes in one
    iteration (and, as vLLM requires with chunking off, for ``max_model_len``: 8,192 tokens for Llama-3 by
    default). The scene's own settings apply (:func:`batchlab.chapters.scenes.run`: the synchronous scheduler,
    ``max_num_seqs`` capped at the budget) unless ``**scene`` overrides them.

    Parameters
    ----------
    cost : CostModel
    max_num_batched_tokens : sequence of int
        Token budgets with chunking on (each above the number of decoders).
    unchunked_max_num_batched_tokens : int
        Budget of the unchunked run; must hold the prompt and the decodes, and be at least ``max_model_len``.
    window_s : float
        Seconds of timeline kept before the newcomer's arrival and after the latest first token of all the runs:
        every run's timeline spans the same interval, the one the page's shared time axis shows.
    **scene
        Passed to :func:`batchlab.chapters.scenes.run` (``n_decoders``, ``context``, ``prompt_tokens``, ...).

    Returns
    -------
    points : DataFrame
        One row per run: ``config`` ("chunked" or "unchunked"), ``max_num_batched_tokens``, ``log2_tokens``,
        the scene's measures (:func:`batchlab.chapters.scenes.measures`, seconds), ``arrival_s`` (the newcomer's
        send) and ``seen_s`` (when the engine saw it).
    timeline : DataFrame
        The decoders' gaps around the newcomer (:func:`batchlab.chapters.scenes.decoder_gaps`, time since its
        arrival) from ``window_s`` before its arrival to ``window_s`` after the latest TTFT of the runs, with
        ``config``, ``max_num_batched_tokens`` and ``log2_tokens`` columns.
    """
    n = scene.get("n_decoders") or scenes.default_decoders(cost, scene.get("context", scenes.CONTEXT))
    need = scene.get("prompt_tokens", scenes.PROMPT_TOKENS) + n
    if unchunked_max_num_batched_tokens < need:
        raise ValueError(f"unchunked_max_num_batched_tokens must hold the prompt and the decodes ({need} tokens)")
    runs = [("chunked", int(b), run) for b, run in
            zip(max_num_batched_tokens, scenes.budget_sweep(cost, max_num_batched_tokens, **scene))]
    off = scenes.run(cost, "chunked", max_num_batched_tokens=int(unchunked_max_num_batched_tokens),
                     enable_chunked_prefill=False, **scene)
    runs.append(("unchunked", int(unchunked_max_num_batched_tokens), off))
    points, lines = [], []
    last_ttft_s = max(run.measures["ttft_s"] for _, _, run in runs)  # one end for every run's timeline
    for config, tokens, run in runs:
        # Sliders walk powers of two in log2.
        label = {"config": config, "max_num_batched_tokens": tokens, "log2_tokens": float(np.log2(tokens))}
        points.append({**label, **run.measures, "arrival_s": run.arrival_s, "seen_s": run.seen_s})
        after_s = last_ttft_s - run.measures["ttft_s"] + window_s
        lines.append(scenes.decoder_gaps(run, window_s, after_s).assign(**label))
    return pd.DataFrame(points), pd.concat(lines, ignore_index=True)


def _budget_label(config: str, tokens: int) -> str:
    """A run's budget as the reader reads it: "2,048", or "16,384, chunking off"."""
    return f"{tokens:,}" + (", chunking off" if config == "unchunked" else "")


def budget_table(points: pd.DataFrame):
    """:func:`chunk_budget_sweep`'s points for the page: per budget the slices, the worst gap and the TTFT.

    Used in chapter 6. The data is in ms; each duration reads as :func:`batchlab.viz.format_duration` prints it
    ("21.5 ms", "1.22 s"), the unit in the cell.
    """
    df = points.assign(budget=[_budget_label(c, int(t)) for c, t in zip(points["config"],
                                                                      points["max_num_batched_tokens"])],
                       itl_max_ms=points["itl_max_s"] * 1e3, ttft_ms=points["ttft_s"] * 1e3)
    return viz.display_table(df, {
        "budget": ("max_num_batched_tokens (tokens)", "{}"), "largest_chunk_tokens": ("largest slice (tokens)",
                                                                                      "{:,d}"),
        "chunks": ("slices", "{:d}"), "itl_max_ms": ("decoders' worst gap", viz.format_duration),
        "ttft_ms": ("newcomer's TTFT", viz.format_duration)})


def async_change(points: pd.DataFrame, late: pd.DataFrame) -> pd.DataFrame:
    """What async scheduling changes: ``late`` (async) minus ``points`` (synchronous), both from
    :func:`chunk_budget_sweep` over the same budgets. Used in chapter 6.

    Returns
    -------
    DataFrame
        Indexed by ``config`` and ``max_num_batched_tokens``: ``itl_max_s`` and ``ttft_s``, the change in
        seconds (negative: earlier or shorter with async scheduling).
    """
    key, cols = ["config", "max_num_batched_tokens"], ["itl_max_s", "ttft_s"]
    return late.set_index(key)[cols] - points.set_index(key)[cols]


def async_change_table(change: pd.DataFrame):
    """:func:`async_change` for the page, in ms with a sign. Used in chapter 6."""
    configs, tokens = change.index.get_level_values(0), change.index.get_level_values(1)
    df = pd.DataFrame({"budget": [_budget_label(c, int(t)) for c, t in zip(configs, tokens)],
                       "itl_ms": change["itl_max_s"].to_numpy() * 1e3, "ttft_ms": change["ttft_s"].to_numpy() * 1e3})
    return viz.display_table(df, {
        "budget": ("max_num_batched_tokens (tokens)", "{}"),
        "itl_ms": ("change of the decoders' worst gap (ms)", "{:+.2f}"),
        "ttft_ms": ("change of the newcomer's TTFT (ms)", "{:+.1f}")})


class HyperbolaFit(NamedTuple):
    """(ITL_max - t_d)(TTFT - L - N alpha) = N alpha t_d, fitted to chunked-prefill runs. Used in chapter 6."""

    alpha_s: float  # s per prompt token: the marginal prefill time
    t_d_s: float  # s: the decode step the chunks ride on
    prompt_tokens: int  # N
    max_residual: float  # largest |N alpha / (TTFT - L) + t_d / ITL_max - 1| over the fitted points
    max_ttft_error: float  # largest |TTFT from the hyperbola at a point's ITL_max / its TTFT - 1|
    latency_s: float = 0.0  # L, s: the request latency every TTFT includes before the engine sees the prompt

    def ttft_s(self, itl_max_s):
        """TTFT (s) the hyperbola gives for a worst ITL (s) above t_d, the request latency included."""
        n_alpha = self.prompt_tokens * self.alpha_s
        return self.latency_s + n_alpha * np.asarray(itl_max_s) / (np.asarray(itl_max_s) - self.t_d_s)

    def curve(self, itl_lo_s: float, itl_hi_s: float, n: int = 60) -> pd.DataFrame:
        """``itl_max_s`` and ``ttft_s`` along the hyperbola, log-spaced ITLs from lo to hi (lo > t_d)."""
        itl = np.geomspace(itl_lo_s, itl_hi_s, n)
        return pd.DataFrame({"itl_max_s": itl, "ttft_s": self.ttft_s(itl)})


def fit_chunk_hyperbola(itl_max_s, ttft_s, prompt_tokens: int, latency_s: float = 0.0) -> HyperbolaFit:
    """Least-squares fit of alpha and t_d to (ITL_max, TTFT) pairs (seconds) of one prompt of N tokens.

    With chunks of c tokens each step takes t_d + c alpha, so ITL_max = t_d + c alpha and
    TTFT = L + (N / c)(t_d + c alpha), L the request latency (s, ``CostModel.request_latency_s``: the client
    sends the prompt that long before the engine sees it). Then N alpha / (TTFT - L) + t_d / ITL_max =
    c alpha / step + t_d / step = 1 for every c: an equation linear in (N alpha, t_d), solved by ordinary least
    squares over the points. L is known, not fitted. Used in chapter 6.
    """
    u, v = np.asarray(itl_max_s, dtype=float), np.asarray(ttft_s, dtype=float)
    if not (np.isfinite(latency_s) and latency_s >= 0):
        raise ValueError(f"latency_s must be a finite number of seconds >= 0, got {latency_s!r}")
    if u.shape != v.shape or u.size < 2 or (u <= 0).any() or (v <= latency_s).any():
        raise ValueError("need at least two (itl_max_s, ttft_s) pairs of one shape, itl_max_s > 0 and "
                         "ttft_s > latency_s")
    design = np.column_stack([1 / (v - latency_s), 1 / u])
    (n_alpha, t_d), *_ = np.linalg.lstsq(design, np.ones(u.size), rcond=None)
    residual = float(np.abs(design @ np.array([n_alpha, t_d]) - 1).max())
    fit = HyperbolaFit(float(n_alpha / prompt_tokens), float(t_d), int(prompt_tokens), residual, np.nan,
                       float(latency_s))
    return fit._replace(max_ttft_error=float(np.abs(fit.ttft_s(u) / v - 1).max()))


SENT_TITLE = "time since the long prompt was sent (s)"  # the timeline's clock: zero at its client's send, as TTFT's
_SETTING = ("datum.config == 'chunked' ? 'chunked, budget ' + format(datum.max_num_batched_tokens, ',') + ' tokens'"
            " : 'chunking off'")  # a run as the reader names it (tooltips, the first-token label)
_TEXTS = {"itl_text": viz.duration_text("itl_ms"), "ttft_text": viz.duration_text("ttft_ms")}  # "1.22 s"
_POINT_TIPS = [viz.tip("setting", "setting", kind="N"), viz.tip("itl_text", "decoders' worst gap", kind="N"),
               viz.tip("ttft_text", "newcomer's time to first token", kind="N"),
               viz.tip("chunks", "iterations carrying part of the prompt", "d")]


def chunking_chart(points: pd.DataFrame, timeline: pd.DataFrame, curve: pd.DataFrame,
                   max_num_batched_tokens: int = 2048):
    """The chunked-prefill trade: worst decoder ITL against the newcomer's TTFT, and the ITL timeline.

    Used in chapter 6.

    Parameters
    ----------
    points : DataFrame
        :func:`chunk_budget_sweep` points: ``config`` ("chunked"/"unchunked"), ``max_num_batched_tokens``,
        ``log2_tokens`` (evenly spaced over the chunked rows), ``itl_max_s``, ``ttft_s`` (s), ``chunks``.
    timeline : DataFrame
        Its timelines: ``config``, ``max_num_batched_tokens``, ``log2_tokens``, ``time_s`` (s since the
        newcomer's arrival, the clock its ``ttft_s`` is on), ``itl_s``, ``sequences``.
    curve : DataFrame
        ``itl_max_s`` and ``ttft_s`` along the fitted hyperbola (``HyperbolaFit.curve``).
    max_num_batched_tokens : int
        Budget selected at first.

    Returns
    -------
    altair chart; a slider labelled in tokens picks the budget (the parameter ``log2_tokens`` holds its log2) and
    the checkbox ``chunking`` turns chunking off, which moves the ring on the trade-off curve and redraws the
    timeline. While chunking is off the slider is disabled (:func:`batchlab.viz.disable_when`): the budget then
    changes nothing, and the slider reads the unchunked run's budget ("16,384, chunking off").
    """
    chunked = points[points["config"] == "chunked"]
    budget, at_budget = viz.grid_param("log2_tokens", chunked["log2_tokens"], "max_num_batched_tokens (tokens)",
                                       value=float(np.log2(max_num_batched_tokens)),
                                       labels=viz.grid_labels(chunked, "log2_tokens", "max_num_batched_tokens"))
    toggle = alt.param(name="chunking", value=True, bind=alt.binding_checkbox(name="chunked prefill "))
    chosen = f"chunking ? (datum.config == 'chunked' && {at_budget}) : datum.config == 'unchunked'"
    ms = {"itl_ms": "datum.itl_max_s * 1000", "ttft_ms": "datum.ttft_s * 1000"}
    # 14 px of padding: the end points (chunking off, the smallest budget) are drawn whole, not on the axes
    x = alt.X("ttft_ms:Q", title="newcomer's time to first token (ms)",
              scale=alt.Scale(type="log", nice=False, padding=14),
              axis=alt.Axis(values=viz.log_ticks(points["ttft_s"] * 1e3), format=","))
    y = alt.Y("itl_ms:Q", title="decoders' worst inter-token latency (ms)",
              scale=alt.Scale(type="log", nice=False, padding=14),
              axis=alt.Axis(values=viz.log_ticks(points["itl_max_s"] * 1e3), format=","))
    fit = alt.Chart(curve).transform_calculate(**ms).transform_calculate(**_TEXTS).mark_line(
        color="#999999", strokeDash=[5, 3], strokeWidth=1.5).encode(x=x, y=y, tooltip=[
            viz.tip("itl_text", "worst gap on the fitted hyperbola", kind="N"),
            viz.tip("ttft_text", "time to first token on the fitted hyperbola", kind="N")])
    base = alt.Chart(points).transform_calculate(setting=_SETTING, **ms).transform_calculate(**_TEXTS).encode(
        x=x, y=y, tooltip=_POINT_TIPS)
    trade = base.transform_filter("datum.config == 'chunked'").mark_line(point=True, color=viz.PALETTE[0])
    off = base.transform_filter("datum.config == 'unchunked'").mark_point(shape="square", size=90,
                                                                          color=viz.PALETTE[3], filled=True)
    names = base.transform_filter("datum.config == 'chunked'").mark_text(  # up and right, clear of the ring
        align="left", dx=12, dy=-9, fontSize=10).encode(text=alt.Text("max_num_batched_tokens:Q", format=","))
    off_name = base.transform_filter("datum.config == 'unchunked'").mark_text(
        align="left", dx=8, dy=10, fontSize=10, color=viz.PALETTE[3]).encode(text=alt.value("chunking off"))
    ring = base.transform_filter(chosen).mark_point(size=300, filled=False, strokeWidth=2, color="black")
    top = alt.layer(fit, trade.encode(order="max_num_batched_tokens:Q"), off, names, off_name, ring
                    ).properties(width=440, height=250)
    chart = alt.vconcat(top, _chunking_timeline(points, timeline, chosen)).add_params(budget, toggle)
    off_budget = int(points.loc[points["config"] == "unchunked", "max_num_batched_tokens"].iloc[0])
    return viz.disable_when(chart, "log2_tokens", "!chunking", shown=_budget_label("unchunked", off_budget))


def _chunking_timeline(points, timeline, chosen):
    """Lower panel of :func:`chunking_chart`: the decoders' gaps at the chosen run, the first token ruled."""
    lo, hi = float(timeline["time_s"].min()), float(timeline["time_s"].max())
    x = alt.X("time_s:Q", title=SENT_TITLE, scale=alt.Scale(domain=[lo, hi]))
    top = float(timeline["itl_s"].max() * 1e3 * 1.08)
    tips = [viz.tip("time_s", SENT_TITLE, ".3f"),
            viz.tip("itl_text", "decoders' gap between two tokens", kind="N"),
            viz.tip("sequences", "decoders with this gap (sequences)", ",d")]
    bars = alt.Chart(timeline).transform_filter(chosen).transform_calculate(
        itl_ms="datum.itl_s * 1000", itl_text=_TEXTS["itl_text"]).mark_bar(
        width=2.5, color=viz.PALETTE[0]).encode(x=x, y=alt.Y("itl_ms:Q", title="decoders' inter-token latency (ms)",
                                                             scale=alt.Scale(domain=[0, top])), tooltip=tips)
    first = alt.Chart(points).transform_filter(chosen).transform_calculate(
        setting=_SETTING, ttft_ms="datum.ttft_s * 1000", ttft_text=_TEXTS["ttft_text"],
        label="'first token after ' + (" + viz.duration_text("ttft_s", unit="s") + ")")
    rule = first.mark_rule(color=viz.PALETTE[3], strokeDash=[4, 3]).encode(
        x="ttft_s:Q", tooltip=[viz.tip("setting", "setting", kind="N"),
                               viz.tip("ttft_text", "newcomer's time to first token", kind="N")])
    # The label stands beside its rule, on the side with room (the rule never runs through it): right of a
    # rule in the left half of the panel, left of one in the right half.
    mid = (lo + hi) / 2
    label = {"baseline": "top", "y": 2, "color": viz.PALETTE[3], "fontSize": 11}
    text = [first.transform_filter(f"datum.ttft_s <= {mid!r}").mark_text(align="left", dx=5, **label).encode(
                x="ttft_s:Q", text="label:N"),
            first.transform_filter(f"datum.ttft_s > {mid!r}").mark_text(align="right", dx=-5, **label).encode(
                x="ttft_s:Q", text="label:N")]
    return alt.layer(bars, rule, *text).properties(width=440, height=180)


# -- facts other pages glue (batchlab.chapters.facts) ----------------------------------------------------------
FACT_BUDGETS = (512, 2048)  # the budgets whose trade the book quotes (cheat sheet, intro, chapter 14)
UNCHUNKED_MAX_NUM_BATCHED_TOKENS = 16384  # chunking off: holds the prompt and the decodes, and max_model_len


@facts.memo
def _spike_trade(cost, budgets: tuple, unchunked: int) -> pd.DataFrame:
    return chunk_budget_sweep(cost, list(budgets), unchunked_max_num_batched_tokens=unchunked)[0]


def spike_trade(budgets=FACT_BUDGETS) -> pd.DataFrame:
    """:func:`chunk_budget_sweep`'s points on the spike scene (its defaults: the synchronous scheduler) at
    ``budgets`` and with chunking off, indexed by ``config`` and ``max_num_batched_tokens`` (cached on disk).

    Used by the facts below, which chapter 6 shows in full and the cheat sheet, the intro and chapter 14 quote.
    """
    points = _spike_trade(scenes.scene("spike").cost(), tuple(int(b) for b in budgets),
                          UNCHUNKED_MAX_NUM_BATCHED_TOKENS)
    return points.set_index(["config", "max_num_batched_tokens"])


@facts.fact("chunk_off_ttft_ms", scene="spike", unit="ms", fmt=".0f", chapter="chunked_prefill",
            text="the newcomer's time to first token with chunking off (its client's, the request latency "
                 "included): the whole 8,000-token prompt in one iteration beside the decodes")
def _off_ttft():
    return float(spike_trade().loc[("unchunked", UNCHUNKED_MAX_NUM_BATCHED_TOKENS), "ttft_s"] * 1e3)


_GAP_FMT = {512: ".1f", 2048: ".0f"}  # a few tens of ms to a tenth, over fifty to the ms (the page's table: .1f)


def _budget_facts(budget: int):
    @facts.fact(f"chunk_{budget}_gap_ms", scene="spike", unit="ms", fmt=_GAP_FMT[budget], chapter="chunked_prefill",
                text=f"the decoders' tallest gap between two tokens while the 8,000-token prompt is computed in "
                     f"slices, max_num_batched_tokens = {budget:,}")
    def _gap():
        return float(spike_trade().loc[("chunked", budget), "itl_max_s"] * 1e3)

    @facts.fact(f"chunk_{budget}_ttft_ms", scene="spike", unit="ms", fmt=".0f", chapter="chunked_prefill",
                text=f"the newcomer's time to first token (its client's) with max_num_batched_tokens = {budget:,}")
    def _ttft():
        return float(spike_trade().loc[("chunked", budget), "ttft_s"] * 1e3)


for _budget in FACT_BUDGETS:
    _budget_facts(_budget)
