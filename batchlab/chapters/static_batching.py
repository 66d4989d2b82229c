"""Chapter 01, static batching: the padding tax and the tail waste of lockstep batches as output lengths spread.

The experiment runs one stream per output-length coefficient of variation under ``policy="static"`` and
measures the share of computed token slots that were padding and the share of batch time spent half
empty (:func:`batchlab.metrics.half_empty_fraction`); the chart draws both against the CV with a slider that
also redraws the first batch, generated tokens beside the padded tail.

The chapter's setting (:data:`PADDING_STREAM`, :data:`CV_GRID`) is also where its facts come from
(:func:`chapter_sweep`, ``pad_cv1`` and ``half_empty_cv1``), so the page and every page that quotes them agree.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..metrics import half_empty_fraction
from ..sim import simulate
from ..workload import synthetic
from . import facts, scenes

# The chapter's stream (keyword arguments of static_padding_sweep): every request present at time 0, equal
# prompts, lognormal outputs of one mean whose spread the chapter varies; lockstep batches of 32 rows.
PADDING_STREAM = {"n_requests": 512, "batch_size": 32, "prompt_tokens": 512, "output_mean": 256.0, "seed": 0}
CV_GRID = tuple(np.round(np.arange(0.0, 2.0 + 1e-9, 0.05), 2).tolist())  # output-length CVs: a slider step of 0.05
CV_SHOWN = 1.0  # the CV the page reads, and where its slider starts
MEASURES = {"padding_fraction": "padded token slots", "half_empty_fraction": "batch time half empty"}
MEASURE_COLORS = {"padded token slots": "#666666", "batch time half empty": "#D55E00"}


def first_batch_table(requests: pd.DataFrame, batch_size: int, n: int = 8):
    """The first ``n`` requests of the first static batch: own output, padded tail, last token and release.

    Used in chapter 01.

    Parameters
    ----------
    requests : DataFrame
        ``SimResult.requests`` of a ``static`` run (seconds, tokens).
    batch_size : int
        Rows of the batch.
    n : int
        Rows shown.
    """
    first = requests.iloc[:min(n, batch_size)].rename_axis("request").reset_index()
    return viz.display_table(first, {
        "request": ("request", "{:d}"), "output_tokens": ("its output (tokens)", "{:,d}"),
        "padded_tokens": ("padded steps after it ends (tokens)", "{:,d}"),
        "finish_s": ("its last token (s)", "{:.2f}"), "release_s": ("slot released (s)", "{:.2f}")})


def sweep_table(summary: pd.DataFrame):
    """:func:`static_padding_sweep`'s summary for the page: one row per output-length CV. Used in chapter 01."""
    return viz.display_table(summary, {
        "output_cv": ("output-length CV", "{:.2f}"), "padding_fraction": ("padded token slots", "{:.0%}"),
        "half_empty_fraction": ("batch time half empty", "{:.0%}"),
        "max_output_tokens": ("longest output (tokens)", "{:,d}"), "duration_s": ("run time (s)", "{:,.0f}"),
        "output_throughput": ("output throughput (tok/s)", "{:,.0f}")})


def first_batch_rows(requests: pd.DataFrame) -> pd.DataFrame:
    """The rows of the first lockstep batch, shortest output first, as generated and padded decode tokens.

    Padding here is the decode tail a row sits through after its own output ended. Used in chapter 01.

    Parameters
    ----------
    requests : DataFrame
        ``SimResult.requests`` of a ``static`` or ``dynamic`` run (``release_s`` in seconds, ``output_tokens``).

    Returns
    -------
    DataFrame
        Long frame: ``row`` (1 = shortest output), ``kind`` ("generated" or "padding") and ``tokens``.
    """
    first = requests[requests["release_s"] == requests["release_s"].min()]
    rows = first.sort_values(["output_tokens"], kind="stable").reset_index(drop=True)
    longest = int(rows["output_tokens"].max())
    wide = pd.DataFrame({"row": np.arange(1, len(rows) + 1), "generated": rows["output_tokens"].to_numpy(),
                         "padding": longest - rows["output_tokens"].to_numpy()})
    return wide.melt(id_vars="row", var_name="kind", value_name="tokens")


def static_padding_sweep(cost, output_cvs, *, n_requests: int = 512, batch_size: int = 32,
                         prompt_tokens: int = 512, output_mean: float = 256.0, seed=0):
    """Padding tax and tail waste of static batching as the output-length variance grows.

    Every stream has the same prompt length (so prompt padding is zero and all padding is decode tail) and
    lognormal outputs of mean ``output_mean`` and coefficient of variation ``cv``. The same ``seed`` is used
    for every CV, so the streams differ only by their spread (common random numbers). Used in chapters 01
    and 12.

    Parameters
    ----------
    cost : CostModel
        Times each iteration.
    output_cvs : sequence of float
        Coefficients of variation of the output length (dimensionless, >= 0).
    n_requests, batch_size : int
        Requests in each stream (all arriving at time 0) and rows per lockstep batch.
    prompt_tokens : int
        Tokens in every prompt.
    output_mean : float
        Mean output tokens.
    seed : int or numpy.random.Generator

    Returns
    -------
    summary : DataFrame
        One row per CV: ``output_cv``, ``padding_fraction`` (share of computed token slots that were
        padding), ``half_empty_fraction`` (:func:`batchlab.metrics.half_empty_fraction`), ``padded_tokens``,
        ``max_output_tokens``, ``duration_s`` (s) and ``output_throughput`` (tok/s).
    batches : DataFrame
        :func:`first_batch_rows` of each CV, with an ``output_cv`` column.
    """
    rows, batches = [], []
    for cv in output_cvs:
        stream = synthetic(n_requests, prompt_tokens, output_mean, prompt_cv=0.0, output_cv=float(cv), seed=seed)
        res = simulate(stream, "static", cost, batch_size=batch_size)
        summ, req = res.summary(), res.requests
        rows.append({"output_cv": float(cv), "padding_fraction": summ["padding_fraction"],
                     "half_empty_fraction": half_empty_fraction(req),
                     "padded_tokens": int(req["padded_tokens"].sum()),
                     "max_output_tokens": int(req["output_tokens"].max()),
                     "duration_s": summ["duration"], "output_throughput": summ["output_throughput"]})
        batches.append(first_batch_rows(req).assign(output_cv=float(cv)))
    return pd.DataFrame(rows), pd.concat(batches, ignore_index=True)


def padding_chart(summary: pd.DataFrame, batches: pd.DataFrame | None = None, cv: str = "output_cv",
                  value: float = CV_SHOWN):
    """Padding tax and tail waste of static batching against output-length CV, with a CV slider.

    Used in chapter 01.

    Parameters
    ----------
    summary : DataFrame
        One row per CV: ``cv`` column, ``padding_fraction`` and ``half_empty_fraction`` (shares in [0, 1]),
        ``max_output_tokens`` and ``output_throughput`` (tok/s), as :func:`static_padding_sweep` returns.
    batches : DataFrame, optional
        Rows of one batch per CV (``row``, ``kind``, ``tokens`` and the ``cv`` column); if given, a second
        panel draws the batch at the selected CV, generated tokens beside the padded tail, on one token
        scale for every CV so the batch visibly stretches as the slider moves.
    cv : str
        Name of the CV column.
    value : float
        The CV the slider starts at (the grid value nearest it).

    Returns
    -------
    altair chart; the slider ``cv`` moves a marker along both curves, rewrites the readout above them (both
    shares at the selected CV) and redraws the batch panel. Every point and bar has a tooltip.
    """
    labels = [f"{v:.2f}" for v in np.unique(summary[cv].to_numpy(dtype=float))]
    param, at_cv = viz.grid_param("cv", summary[cv], "output-length CV", field=cv, value=value, labels=labels)
    long = summary.melt(id_vars=[c for c in (cv, "max_output_tokens", "output_throughput") if c in summary],
                        value_vars=list(MEASURES), var_name="measure", value_name="share")
    long["measure"] = long["measure"].map(MEASURES)
    hi = float(summary[cv].max())
    color = alt.Color("measure:N", title=None, legend=alt.Legend(orient="top", labelLimit=300),
                      scale=alt.Scale(domain=list(MEASURE_COLORS), range=list(MEASURE_COLORS.values())))
    base = alt.Chart(long).encode(
        x=alt.X(f"{cv}:Q", title=viz.title(cv), axis=alt.Axis(tickCount=5), scale=alt.Scale(domain=[0, hi],
                                                                                          nice=False)),
        y=alt.Y("share:Q", title="share wasted (%)", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=color)
    tips = [viz.tip(cv, "output-length CV", ".2f"), viz.tip("measure", "measure", kind="N"),
            viz.tip("share", "share wasted", ".0%")]  # as the readout, the table and the prose: "50%"
    tips += [viz.tip(c, title_, fmt=",.0f") for c, title_ in (("max_output_tokens", "longest output (tokens)"),
                                                              ("output_throughput", None)) if c in long]
    points = base.mark_point(size=22, filled=True, opacity=0.8).encode(tooltip=tips)
    marker = base.mark_point(size=150, strokeWidth=2).encode(tooltip=tips).transform_filter(at_cv)
    # The readout sits in the bottom-right corner, one line per measure, right-aligned: both curves and the
    # markers stay above 40 % wherever they reach past CV 0.6, and the readout spans CV 0.7 to 2 and 0 to 15 %.
    # (Labels beside the markers would collide where the curves run close; the top-left corner touches the
    # upper curve near CV 1.3.)
    readout = []
    width, height = 270, 240
    for i, m in enumerate(MEASURES.values()):
        line = alt.Chart(long).transform_filter(at_cv).transform_filter(f"datum.measure == '{m}'")
        readout.append(line.transform_calculate(readout="datum.measure + ': ' + format(datum.share, '.0%')")
                       .mark_text(align="right", baseline="bottom", fontWeight="bold")
                       .encode(x=alt.value(width - 6), y=alt.value(height - 22 + 16 * i), text="readout:N",
                               color=color))
    curves = alt.layer(base.mark_line(), points, marker, *readout).properties(width=width, height=height)
    if batches is None:
        return curves.add_params(param)
    longest = float(batches.groupby([cv, "row"])["tokens"].sum().max())  # one x scale for every CV
    kinds = alt.Scale(domain=["generated", "padding"], range=[viz.PALETTE[0], "#c8c8c8"])
    rows = alt.Chart(batches).mark_bar().encode(
        x=alt.X("tokens:Q", title="decode tokens per row", stack="zero", scale=alt.Scale(domain=[0, longest]),
                axis=alt.Axis(format=",.0f", tickCount=4)),
        y=alt.Y("row:O", title="rows of the first batch", axis=alt.Axis(labels=False, ticks=False)),
        color=alt.Color("kind:N", title=None, scale=kinds, legend=alt.Legend(orient="top")),
        tooltip=[viz.tip("row", "row (1 = shortest output)", kind="O"),
                 viz.tip("kind", "part: generated / padding", kind="N"),
                 viz.tip("tokens", "decode tokens (one per step)", ",.0f"), viz.tip(cv, "output-length CV", ".2f")],
    ).transform_filter(at_cv).properties(width=190, height=240)
    return alt.hconcat(curves, rows).resolve_scale(color="independent").add_params(param)


# -- facts other pages glue (batchlab.chapters.facts) ----------------------------------------------------------
@facts.memo
def _sweep(cost, output_cvs: tuple, stream: tuple):
    return static_padding_sweep(cost, list(output_cvs), **dict(stream))


def chapter_sweep():
    """:func:`static_padding_sweep` of the page: :data:`PADDING_STREAM` over :data:`CV_GRID`, Llama-3-8B BF16 on
    one H100 SXM (scene ``padding``), cached. Returns ``(summary, batches)``. Used in chapters 01 and 12."""
    return _sweep(scenes.scene("padding").cost(), CV_GRID, tuple(sorted(PADDING_STREAM.items())))


def _at(measure: str, output_cv: float = CV_SHOWN) -> float:
    summary = chapter_sweep()[0].set_index("output_cv")
    return float(summary.loc[output_cv, measure])


_STREAM_TEXT = ("{n_requests} requests queued at once, equal {prompt_tokens}-token prompts, lognormal outputs of "
                "mean {output_mean:.0f} tokens at CV 1, lockstep batches of {batch_size} rows").format(**PADDING_STREAM)


@facts.fact("pad_cv1", scene="padding", fmt=".0%", chapter="static_batching",
            text=f"share of the token slots static batching computes that are padding ({_STREAM_TEXT})")
def _pad_cv1():
    return _at("padding_fraction")


@facts.fact("half_empty_cv1", scene="padding", fmt=".0%", chapter="static_batching",
            text=f"share of the batches' time static batching spends with at least half its rows finished "
                 f"({_STREAM_TEXT})")
def _half_empty_cv1():
    return _at("half_empty_fraction")
