"""Chapter 10's charts: the hit rate against the KV pool's size with the TTFT it buys, and the budget trade.

:func:`pool_chart` draws :func:`batchlab.chapters.prefix_caching.pool_sweep` as two panels behind a pool slider
(its stops from :func:`pool_stops`) and a workload selector: the hit-rate curves and the median and p99 TTFT with
caching on and off. :func:`budget_chart` draws :func:`batchlab.chapters.prefix_caching.budget_sweep` against the
token budget on log axes whose ticks label the whole range (:func:`log_axis`). :mod:`batchlab.chapters.prefix_caching`
re-exports all of it.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz


def _pool_label(gib: float) -> str:
    """A pool as the reader reads it: "16 GiB", "1 TiB"."""
    return f"{gib / 1024:g} TiB" if gib >= 1024 else f"{gib:g} GiB"


def pool_chart(sweep: pd.DataFrame, default_pool_gib: float, workload: str | None = None,
               pool_gib: float | None = None):
    """Hit rate against KV pool size for every workload, and TTFT with caching on and off at the chosen one.

    Used in chapter 10.

    Parameters
    ----------
    sweep : DataFrame
        :func:`batchlab.chapters.prefix_caching.pool_sweep` rows on a grid of pools (``default_pool`` False)
        and, if run, on vLLM's own pool (``default_pool`` True), caching on and off.
    default_pool_gib : float
        vLLM's own pool on the chapter's GPU (GiB), drawn as a rule.
    workload, pool_gib
        Selected when the page opens (defaults: the first workload, vLLM's own pool if the sweep ran it, else the
        grid pool nearest ``default_pool_gib``).

    Returns
    -------
    altair chart; a slider picks the pool (one stop per pool, in ascending size: the doublings and vLLM's own,
    labelled in words) and radio buttons the workload, which rings the point on the hit-rate curve and redraws
    the TTFT bars.
    """
    if sweep[~sweep["default_pool"]].empty:
        raise ValueError("sweep has no run on a grid pool (pools_gib other than None)")
    names = list(dict.fromkeys(sweep["workload"]))
    if workload is not None and workload not in names:
        raise ValueError(f"workload must be one of {names}, got {workload!r}")
    stops = pool_stops(sweep)
    first = stops[stops["default_pool"]] if pool_gib is None and stops["default_pool"].any() else \
        stops.iloc[[int(np.abs(np.log2(stops["pool_gib"] / (pool_gib or default_pool_gib))).argmin())]]
    labels = stops.drop_duplicates("pool_step").sort_values("pool_step")["pool_label"].tolist()
    pool, at_pool = viz.grid_param("pool_step", stops["pool_step"], "KV pool", value=float(first["pool_step"].iloc[0]),
                                   labels=labels)
    pick = alt.param(name="workload_pick", value=workload or names[0],
                     bind=alt.binding_radio(options=names, name="workload "))
    return alt.hconcat(_hit_curve(stops, names, default_pool_gib, at_pool), _ttft_bars(stops, at_pool)
                       ).resolve_scale(color="independent").add_params(pool, pick)


def pool_stops(sweep: pd.DataFrame) -> pd.DataFrame:
    """The sweep's runs with the pool as a slider stop: ``pool_step`` (0, 1, ... in ascending pool size, so the
    doublings and vLLM's own pool are evenly spaced stops) and ``pool_label`` ("16 GiB", "1 TiB", "vLLM's pool,
    55.8 GiB"). Used by :func:`pool_chart`."""
    gib = sweep["pool_gib"].round(6)
    step = {g: i for i, g in enumerate(sorted(gib.unique()))}
    own = sweep["default_pool"].astype(bool)
    label = [f"vLLM's pool, {g:.1f} GiB" if d else _pool_label(round(g)) for g, d in zip(sweep["pool_gib"], own)]
    return sweep.assign(pool_step=gib.map(step).astype(float), pool_label=label, default_pool=own)


_POOL_TIPS = [viz.tip("workload", "workload", kind="N"), viz.tip("pool_label", "KV pool", kind="N"),  # "55.8 GiB"
              viz.tip("prefix_cache_hit_rate", "prefix-cache hit rate", ".1%"),
              viz.tip("preemptions", "preemptions", ",d")]


def _hit_curve(grid, names, default_pool_gib, at_pool):
    """Left panel of :func:`pool_chart`: hit rate against pool size, one line per workload."""
    on = grid[grid["caching"]]
    pools = sorted(on.loc[~on["default_pool"], "pool_gib"].round(6).unique().tolist())  # the doublings
    ticks = pools[::2] if len(pools) > 5 else pools  # every other doubling: labels of neighbours would touch
    x = alt.X("pool_gib:Q", title="KV pool (log scale)", scale=alt.Scale(type="log", base=2),
              axis=alt.Axis(values=ticks,
                            labelExpr="datum.value >= 1024 ? datum.value / 1024 + ' TiB' : datum.value + ' GiB'"))
    y = alt.Y("prefix_cache_hit_rate:Q", title="prefix-cache hit rate", axis=alt.Axis(format="%"),
              scale=alt.Scale(domain=[0, 1]))
    color = alt.Color("workload:N", scale=alt.Scale(domain=names, range=viz.PALETTE[:len(names)]),
                      legend=alt.Legend(orient="bottom", title=None, columns=1))
    chosen = "datum.workload == workload_pick"
    base = alt.Chart(on).encode(x=x, y=y, color=color, tooltip=_POOL_TIPS)
    lines = base.mark_line(point=True).encode(opacity=alt.condition(chosen, alt.value(1.0), alt.value(0.3)))
    ring = base.transform_filter(f"{chosen} && {at_pool}").mark_point(size=260, filled=False, strokeWidth=2,
                                                                       color="black")
    rule = alt.Chart(pd.DataFrame({"pool_gib": [default_pool_gib], "label": ["one H100: vLLM's pool"]}))
    rule_tips = [viz.tip("label", "pool", kind="N"), viz.tip("pool_gib", "KV pool (GiB)", ",.1f")]
    mark = rule.mark_rule(color="#999999", strokeDash=[4, 3]).encode(x="pool_gib:Q", tooltip=rule_tips)
    # The label sits at a 70 % hit rate, clear of the curves: the synthetic ones run above it right of the rule,
    # Mooncake's far below.
    text = rule.mark_text(align="left", dx=4, baseline="middle", fontSize=10, color="#666666").encode(
        x="pool_gib:Q", y=alt.datum(0.7), text="label:N")
    return alt.layer(lines, ring, mark, text).properties(width=300, height=230)


def _ttft_bars(grid, at_pool):
    """Right panel of :func:`pool_chart`: median and p99 TTFT, caching on and off, at the chosen workload and pool.
    Bars and ticks read by the book's duration rule (:func:`batchlab.viz.duration_text`): ms below 1 s, s above."""
    long = grid.melt(id_vars=["workload", "caching", "pool_step", "pool_gib", "prefix_cache_hit_rate"],
                     value_vars=["median_ttft_ms", "p99_ttft_ms"], var_name="stat", value_name="ttft_ms")
    long["stat"] = long["stat"].map({"median_ttft_ms": "median", "p99_ttft_ms": "p99"})
    long["cache"] = np.where(long["caching"], "caching on", "caching off")
    chosen = alt.Chart(long).transform_filter(f"datum.workload == workload_pick && {at_pool}").transform_calculate(
        ttft_text=viz.duration_text("ttft_ms"))
    x = alt.X("stat:N", title=None, sort=["median", "p99"], axis=alt.Axis(labelAngle=0))
    # In ms, each tick with its unit by the bars' own rule ("500 ms", "1.5 s"), so the axis reads as the labels;
    # a fixed extent keeps the panel inside the svg when another workload's ticks are wider (Vega sizes it once).
    y = alt.Y("ttft_ms:Q", title="time to first token", axis=alt.Axis(
        labelExpr="datum.value == 0 ? '0' : datum.value < 1000 ? format(datum.value, ',~g') + ' ms' : "
                  "format(datum.value / 1000, ',~g') + ' s'", minExtent=52, maxExtent=52))
    order = ["caching off", "caching on"]
    offset = alt.XOffset("cache:N", sort=order)
    tips = [viz.tip("cache", "prefix caching", kind="N"), viz.tip("stat", "statistic", kind="N"),
            viz.tip("ttft_text", "time to first token", kind="N"),
            viz.tip("prefix_cache_hit_rate", "prefix-cache hit rate", ".1%")]
    bars = chosen.mark_bar().encode(
        x=x, y=y, xOffset=offset, tooltip=tips,
        color=alt.Color("cache:N", title=None, sort=order, legend=alt.Legend(orient="bottom"),
                        scale=alt.Scale(domain=order, range=["#bbbbbb", "#555555"])))
    text = chosen.mark_text(dy=-4, baseline="bottom", fontSize=9).encode(x=x, xOffset=offset, y=y,
                                                                          text="ttft_text:N")
    return alt.layer(bars, text).properties(width=240, height=230)


LOG_TICK_MANTISSAS = (1, 2, 3, 5)  # ticks of the budget chart's log axes: 10, 20, 30, 50, 100, ...


def log_axis(values, room: float = 1.1) -> tuple[list[float], list[float]]:
    """A log axis for ``values`` (> 0) whose ticks label the whole range: ``(domain, ticks)``.

    The domain runs from the tick at or below the smallest value (1, 2, 3 or 5 times a power of ten), less
    ``room``, to the largest value times ``room``; the ticks are those of that series inside it. So the lowest
    values sit above a labelled tick, never below the last one (a line at 64-85 ms on an axis whose ticks begin
    at 100 ms). Used by :func:`budget_chart`.
    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size == 0:
        raise ValueError("log_axis needs at least one finite value above 0")
    decades = np.arange(np.floor(np.log10(v.min())) - 1, np.ceil(np.log10(v.max())) + 1)
    series = sorted(float(f"{m * 10.0 ** k:.12g}") for k in decades for m in LOG_TICK_MANTISSAS)
    lowest = max(t for t in series if t <= v.min() * (1 + 1e-12))
    domain = [lowest / room, float(v.max()) * room]
    ticks = [int(t) if t >= 1 else t for t in series if lowest <= t <= domain[1]]
    return domain, ticks


def budget_chart(points: pd.DataFrame):
    """Chapter 6's trade on a loaded server, with and without the cache: the p99 inter-token latency (left) and
    the p99 time to first token (right) against the token budget, one line per caching setting. Budgets sit on
    the x axis, so no point needs a label; each log axis has a labelled tick below its lowest point
    (:func:`log_axis`), and the tooltips read the latencies by the book's duration rule
    (:func:`batchlab.viz.duration_text`: "64.3 ms", "1.10 s"). Used in chapter 10."""
    df = points.assign(cache=np.where(points["caching"], "caching on", "caching off"))
    budgets = sorted(df["max_num_batched_tokens"].unique().tolist())
    x = alt.X("max_num_batched_tokens:Q", title="max_num_batched_tokens (tokens, log scale)",
              scale=alt.Scale(type="log", base=2, nice=False, padding=10),
              axis=alt.Axis(values=budgets, format=",", labelAngle=0))
    color = alt.Color("cache:N", title=None, scale=alt.Scale(domain=["caching off", "caching on"],
                                                            range=[viz.PALETTE[3], viz.PALETTE[0]]),
                      legend=alt.Legend(orient="bottom"))
    tips = [viz.tip("cache", "prefix caching", kind="N"),
            viz.tip("max_num_batched_tokens", "max_num_batched_tokens (tokens)", ","),
            viz.tip("p99_itl_text", "p99 inter-token latency", kind="N"),
            viz.tip("p99_ttft_text", "p99 time to first token", kind="N"),
            viz.tip("prefix_cache_hit_rate", "prefix-cache hit rate", ".1%")]
    base = alt.Chart(df).transform_calculate(
        p99_itl_text=viz.duration_text("p99_itl_ms"), p99_ttft_text=viz.duration_text("p99_ttft_ms")
    ).encode(x=x, color=color, tooltip=tips)

    def panel(field: str, title: str):
        domain, ticks = log_axis(df[field])
        y = alt.Y(f"{field}:Q", title=title, scale=alt.Scale(type="log", nice=False, domain=domain),
                  axis=alt.Axis(values=ticks, format=","))
        return base.mark_line(point=True).encode(y=y, order="max_num_batched_tokens:Q").properties(
            width=250, height=220)

    return alt.hconcat(panel("p99_itl_ms", "p99 inter-token latency (ms, log scale)"),
                       panel("p99_ttft_ms", "p99 time to first token (ms, log scale)"))
