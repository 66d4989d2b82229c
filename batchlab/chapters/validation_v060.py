"""Chapter 13, validation, against vLLM v0.6.0: the ShareGPT preset replayed at the blog's arrival rates beside
the three figures vLLM's performance update published. :mod:`batchlab.chapters.validation` re-exports all of it.

:data:`PUBLISHED_VLLM_V060` holds the published figures; :func:`vllm_v060_runs` replays the preset (its lengths
rescaled to the blog's means by :func:`match_means`, or the file's own), :func:`published_comparison` sets the
predicted beside the published, :func:`published_chart` draws mean TTFT and TPOT against the rate with the
published marks, and :func:`comparison_style` and :func:`runs_table` format the two tables.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..sim import simulate
from ..workload import Requests, preset

# vLLM v0.6.0 performance update (vLLM blog, 2024-09-05, https://blog.vllm.ai/2024/09/05/perf-update.html):
# Llama-3-8B BF16 on one H100, 500 ShareGPT prompts.
PUBLISHED_VLLM_V060 = {
    "prompt_tokens_mean": 202.0,  # tokens, the blog's ShareGPT sample
    "output_tokens_mean": 179.0,  # tokens
    "n_requests": 500,
    "request_throughput": 36.9,  # req/s, every request sent at once
    "mean_tpot_ms": 13.4,  # ms, at 32 QPS
    "tpot_rate_req_s": 32.0,  # req/s
    "mean_ttft_ms_ceiling": 120.0,  # ms, mean TTFT stays under it from 2 to 32 QPS
    "ttft_rates_req_s": (2.0, 32.0),  # req/s
    "gpu_busy_before_v060": 0.38,  # share of time the GPU was busy before v0.6 (8B on H100), same post
}
V060_COLUMNS = ("request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                "p99_tpot_ms", "gpu_busy_fraction", "preemptions")


def match_means(requests, prompt_mean: float, output_mean: float):
    """The same stream with every prompt and output length scaled so their means are the given ones.

    Lengths are rounded and kept >= 1 token; arrivals are unchanged, and so is the shape of each
    distribution (its coefficient of variation) up to the rounding. Used in chapter 13.
    """

    def scale(tokens, mean):
        return np.maximum(np.rint(tokens * (mean / tokens.mean())), 1).astype(np.int64)

    return Requests(requests.arrival_s, scale(requests.prompt_tokens, prompt_mean),
                    scale(requests.output_tokens, output_mean))


def vllm_v060_runs(cost, rates_req_s, *, n_requests: int = 500, seed=0, lengths: str = "blog",
                   **knobs) -> pd.DataFrame:
    """The ShareGPT preset through the ``chunked`` policy at each arrival rate.

    Used in chapter 13.

    Parameters
    ----------
    cost : CostModel
    rates_req_s : sequence of float
        Mean arrival rates in requests/s; ``inf`` sends every request at time 0 (the throughput run).
    n_requests : int
        Requests per run (the blog used 500).
    seed : int
        Seed of :func:`batchlab.preset` (lengths and arrivals); the same for every rate.
    lengths : {"blog", "trace"}
        "blog" rescales the sampled lengths to the blog's means (:data:`PUBLISHED_VLLM_V060`, with
        :func:`match_means`); "trace" keeps the ShareGPT file's own.
    **knobs
        Passed to :func:`batchlab.simulate` (default: vLLM's defaults for the GPU).

    Returns
    -------
    DataFrame, one row per rate: ``rate_req_s``, ``lengths``, ``prompt_tokens_mean``, ``output_tokens_mean`` and
    the summary keys of :data:`V060_COLUMNS`.
    """
    if lengths not in ("blog", "trace"):
        raise ValueError(f"lengths must be 'blog' or 'trace', got {lengths!r}")
    rows = []
    for rate in rates_req_s:
        stream = preset("sharegpt", n_requests, rate_req_s=float(rate), seed=seed)
        if lengths == "blog":
            stream = match_means(stream, PUBLISHED_VLLM_V060["prompt_tokens_mean"],
                                 PUBLISHED_VLLM_V060["output_tokens_mean"])
        summ = simulate(stream, "chunked", cost, **knobs).summary()
        rows.append({"rate_req_s": float(rate), "lengths": lengths,
                     "prompt_tokens_mean": float(stream.prompt_tokens.mean()),
                     "output_tokens_mean": float(stream.output_tokens.mean()), **{k: summ[k] for k in V060_COLUMNS}})
    return pd.DataFrame(rows)


def published_comparison(runs: pd.DataFrame, published: dict = PUBLISHED_VLLM_V060) -> pd.DataFrame:
    """Predicted beside published for the three figures of the vLLM v0.6.0 post, ``ratio`` = predicted / published.

    ``runs`` is :func:`vllm_v060_runs` of one ``lengths`` over rates including ``inf``, ``tpot_rate_req_s``
    and the TTFT range. The TTFT figure is a ceiling: its row compares the highest predicted mean TTFT in the
    range. Used in chapter 13.
    """
    at = runs.set_index("rate_req_s")
    lo, hi = published["ttft_rates_req_s"]
    in_range = at[(at.index >= lo) & (at.index <= hi)]
    rows = [("request throughput (req/s)", "all 500 requests at once", published["request_throughput"],
             at.loc[np.inf, "request_throughput"]),
            ("mean TPOT (ms)", f"{published['tpot_rate_req_s']:g} QPS", published["mean_tpot_ms"],
             at.loc[published["tpot_rate_req_s"], "mean_tpot_ms"]),
            ("mean TTFT (ms), highest", f"{lo:g} to {hi:g} QPS", published["mean_ttft_ms_ceiling"],
             in_range["mean_ttft_ms"].max())]
    out = pd.DataFrame(rows, columns=["figure", "condition", "published", "predicted"])
    out["ratio"] = out["predicted"] / out["published"]
    return out


def published_chart(runs: pd.DataFrame, published: dict = PUBLISHED_VLLM_V060, width: int = 250, height: int = 220):
    """Mean TTFT and mean TPOT against arrival rate, simulated, beside the published vLLM figures.

    Used in chapter 13.

    Parameters
    ----------
    runs : DataFrame
        :func:`vllm_v060_runs` (one or more ``lengths``): ``rate_req_s`` (req/s; the ``inf`` run is not drawn),
        ``lengths``, ``mean_ttft_ms``, ``mean_tpot_ms``.
    published : dict
        :data:`PUBLISHED_VLLM_V060`: the TTFT ceiling over ``ttft_rates_req_s`` is drawn as a dashed segment,
        the TPOT at ``tpot_rate_req_s`` as a black diamond.
    """
    blog = f"rescaled to the blog's {published['prompt_tokens_mean']:g} / {published['output_tokens_mean']:g} tokens"
    finite = runs[np.isfinite(runs["rate_req_s"])]
    finite = finite[["rate_req_s", "lengths", "mean_ttft_ms", "mean_tpot_ms"]].assign(
        lengths_text=finite["lengths"].map({"blog": blog, "trace": "the ShareGPT file's own"}))
    x = alt.X("rate_req_s:Q", title="arrival rate (req/s)")
    color = alt.Color("lengths:N", title="prompt / output lengths", legend=alt.Legend(
        orient="top", direction="vertical", labelLimit=0,
        labelExpr=f"datum.label == 'blog' ? \"{blog}\" : 'the ShareGPT file\\'s own'"))
    lo, hi = published["ttft_rates_req_s"]
    ceiling = pd.DataFrame({"rate_req_s": [lo, hi], "mean_ttft_ms": published["mean_ttft_ms_ceiling"],
                            "what": "published ceiling"})
    tpot = pd.DataFrame({"rate_req_s": [published["tpot_rate_req_s"]], "mean_tpot_ms": [published["mean_tpot_ms"]],
                         "what": ["published"]})
    panels = []
    for col, ref in (("mean_ttft_ms", ceiling), ("mean_tpot_ms", tpot)):
        y = alt.Y(f"{col}:Q", title=viz.title(col), scale=alt.Scale(zero=True))
        rate = viz.tip("rate_req_s", "arrival rate (req/s)", ",.0f")
        value = viz.tip("value_text", viz.title(col).replace(" (ms)", ""), kind="N")  # "75.8 ms", "1.28 s"
        sim = alt.Chart(finite).transform_calculate(value_text=viz.duration_text(col)).mark_line(point=True).encode(
            x=x, y=y, color=color, tooltip=[viz.tip("lengths_text", "prompt / output lengths", kind="N"), rate,
                                            value])
        if len(ref) > 1:
            mark = alt.Chart(ref).mark_line(color="black", strokeDash=[4, 3])
        else:
            mark = alt.Chart(ref).mark_point(shape="diamond", size=120, filled=True, color="black")
        mark = mark.transform_calculate(value_text=viz.duration_text(col)).encode(
            x=x, y=y, tooltip=[viz.tip("what", "vLLM's post", kind="N"), rate, value])
        text = alt.Chart(ref.tail(1)).mark_text(align="right", dx=-8, dy=-10).encode(x=x, y=y, text="what:N")
        panels.append(alt.layer(sim, mark, text).properties(width=width, height=height))
    return alt.hconcat(*panels)


def comparison_style(compare: pd.DataFrame):
    """:func:`published_comparison` as the page shows it (a ``Styler``). Used in chapter 13."""
    one = "{:,.1f}".format
    return viz.display_table(compare, {"figure": ("figure", str), "condition": ("condition", str),
                                       "published": ("published", one), "predicted": ("predicted", one),
                                       "ratio": ("predicted / published", "{:.2f}".format)})


def runs_table(runs: pd.DataFrame):
    """:func:`vllm_v060_runs`' runs as the page shows them (a ``Styler``): the lengths, the rate and the three
    figures the post publishes, with units in the headers. Used in chapter 13; an infinite rate reads "all at
    once"."""
    rate = runs["rate_req_s"].map(lambda r: "all at once" if np.isinf(r) else f"{r:g}")
    one = "{:,.1f}".format
    return viz.display_table(runs.assign(rate=rate), {
        "lengths": ("lengths", str), "rate": ("rate (req/s)", str), "request_throughput": ("throughput (req/s)", one),
        "mean_ttft_ms": ("mean TTFT (ms)", one), "mean_tpot_ms": ("mean TPOT (ms)", one),
        "preemptions": ("preemptions", "{:,}".format)})
