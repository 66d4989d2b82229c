"""Chapter 01, static batching: the padding tax and the tail waste of lockstep batches as output lengths spread.

The experiment runs one stream per output-length coefficient of variation under ``policy="static"`` and
measures the share of computed token slots that were padding and the share of batch time spent half
empty (:func:`batchlab.metrics.half_empty_fraction`); the chart draws both against the CV with a slider that
also redraws the first batch, generated tokens beside the padded tail.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..metrics import half_empty_fraction
from ..sim import simulate
from ..workload import synthetic


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


def padding_chart(summary: pd.DataFrame, batches: pd.DataFrame | None = None, cv: str = "output_cv"):
    """Padding tax and tail waste of static batching against output-length CV, with a CV slider.

    Used in chapter 01.

    Parameters
    ----------
    summary : DataFrame
        One row per CV: ``cv`` column, ``padding_fraction`` and ``half_empty_fraction`` (shares in [0, 1]),
        as :func:`static_padding_sweep` returns.
    batches : DataFrame, optional
        Rows of one batch per CV (``row``, ``kind``, ``tokens`` and the ``cv`` column); if given, a second
        panel draws the batch at the selected CV, generated tokens beside the padded tail, on one token
        scale for every CV so the batch visibly stretches as the slider moves.
    cv : str
        Name of the CV column.

    Returns
    -------
    altair chart; the slider ``cv`` moves a marker along both curves and redraws the batch panel.
    """
    param, at_cv = viz.grid_param("cv", summary[cv], "output-length CV", field=cv)
    long = summary.melt(id_vars=[cv], value_vars=["padding_fraction", "half_empty_fraction"], var_name="measure",
                        value_name="share")
    long["measure"] = long["measure"].map({"padding_fraction": "padded token slots",
                                           "half_empty_fraction": "batch time half empty"})
    lo, hi = min(0.0, float(summary[cv].min())), float(summary[cv].max())
    room = [lo, hi + 0.15 * ((hi - lo) or 1.0)]  # value labels stay inside the plot: the layout never shifts
    base = alt.Chart(long).encode(
        x=alt.X(f"{cv}:Q", title=viz.title(cv), axis=alt.Axis(tickCount=5), scale=alt.Scale(domain=room, nice=False)),
        y=alt.Y("share:Q", title="share wasted (%)", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("measure:N", title=None, legend=alt.Legend(orient="top")))
    marker = base.mark_point(size=110).transform_filter(at_cv)
    label = base.mark_text(align="left", dx=8, dy=-8).encode(
        text=alt.Text("share:Q", format=".0%")).transform_filter(at_cv)
    curves = alt.layer(base.mark_line(), marker, label).properties(width=270, height=240)
    if batches is None:
        return curves.add_params(param)
    longest = float(batches.groupby([cv, "row"])["tokens"].sum().max())  # one x scale for every CV
    kinds = alt.Scale(domain=["generated", "padding"], range=[viz.PALETTE[0], "#d9d9d9"])
    rows = alt.Chart(batches).mark_bar().encode(
        x=alt.X("tokens:Q", title="decode tokens per row", stack="zero", scale=alt.Scale(domain=[0, longest])),
        y=alt.Y("row:O", title="rows of the first batch", axis=alt.Axis(labels=False, ticks=False)),
        color=alt.Color("kind:N", title=None, scale=kinds, legend=alt.Legend(orient="top")),
    ).transform_filter(at_cv).properties(width=190, height=240)
    return alt.hconcat(curves, rows).resolve_scale(color="independent").add_params(param)
