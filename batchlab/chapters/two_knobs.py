"""Chapter 8, the two knobs: ``max_num_seqs`` and ``max_num_batched_tokens`` swept together.

:func:`two_knob_sweep` runs every pair under ``chunked`` at several request rates, expressed against the
server's capacity (:func:`saturation_rate`), except the pairs vLLM refuses to start with, which it keeps as
rows without numbers. The frontier comes from :func:`batchlab.sweep.with_frontier`, where p99 TTFT stops
improving from :func:`batchlab.sweep.seqs_plateau`. :func:`default_vs_pick` reads the sweep per rate: vLLM's
default beside the pair with the lowest p99 ITL at as good a p99 TTFT and the same throughput.
:func:`two_knobs_chart` draws every operating point behind two sliders (one per knob) and a rate selector that
shows one rate's runs alone or every load together, the trail of pairs the sliders have visited, and the grid
of pairs with the refused ones crossed out (drawn by :mod:`batchlab.chapters.two_knobs_charts`, whose marks
and colours are re-exported here). :func:`runs_table` and :func:`vllm_defaults_style` format the
tables (durations through :func:`batchlab.viz.format_duration`, the book's one rule).

The end of the module registers the facts other pages glue (:mod:`batchlab.chapters.facts`): the conversation
scene's capacity, its four loads, its mean lengths, vLLM's KV pool and default knobs, the plateau of
``max_num_seqs``, the default and the pick at the near load, and what the overloaded default run holds.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import viz
from ..hardware import get_hardware
from ..sim import simulate
from ..vllm import vllm_defaults
from ..sweep import seqs_plateau, sweep, with_frontier
from ..workload import preset
from . import facts, scenes, two_knobs_charts
from .two_knobs_charts import (  # noqa: F401 - the chart's marks and colours, as chapters 8 and 9 read them
    DURATION_LABEL, EVERY_LOAD, FRONTIER_COLOR, HIGHLIGHT, PANEL_PADDING_PX, RATE_COLORS, READOUT_LINE_PX,
    READOUT_OTHER, READOUT_SHOWN, REFUSED_TEXT, TRAIL, TWO_KNOB_KINDS, TWO_KNOB_SHAPES, TWO_KNOB_WIDTH)

# The chapter's grid: powers of two and the halfway steps between them (1.5 x a power of two), so that each
# slider moves through 15 and 11 positions; encoded as their index, an evenly spaced grid for a slider.
MAX_NUM_SEQS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
MAX_NUM_BATCHED_TOKENS = (512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
SAME_THROUGHPUT = 0.01  # throughputs (and p99 ITLs) within 1% count as equal
PLATEAU = 0.05  # a p99 TTFT within 5% of another counts as as good
CONV_LOADS = {"light": 0.5, "moderate": 0.8, "near": 0.95, "over": 1.2}  # the conv scene's rates, x capacity


def saturation_rate(cost, workload: str, n_requests: int, *, seed=0, **knobs) -> float:
    """Requests/s the server completes when every request of a real-trace preset is queued at time 0.

    The capacity that request rates are expressed against: ``request_throughput`` of one ``chunked`` run of
    ``preset(workload, n_requests, rate_req_s=inf, seed=seed)`` with ``knobs`` (vLLM's defaults for the GPU if
    none). The drain at the end of the run, when fewer requests are left than the batch holds, is included,
    so this is slightly below the steady-state capacity. Used in chapters 8, 9 and 12.

    Parameters
    ----------
    cost : CostModel
    workload : str
        A real-trace preset (:func:`batchlab.preset_names`).
    n_requests : int
    seed : int
    **knobs
        Knobs of :func:`batchlab.simulate`.

    Returns
    -------
    float
        Requests per second.
    """
    stream = preset(workload, n_requests, rate_req_s=np.inf, seed=seed)
    return float(simulate(stream, "chunked", cost, **knobs).summary()["request_throughput"])


@facts.memo
def two_knob_sweep(cost, workload: str, rates_req_s, max_num_seqs, max_num_batched_tokens, *,
                   n_requests: int = 3000, seed=0, executor=None) -> pd.DataFrame:
    """Every (``max_num_seqs``, ``max_num_batched_tokens``) pair under ``chunked`` at every request rate.

    Each rate replays ``preset(workload, n_requests, rate_req_s, seed)``; with one seed the prompt and output
    lengths are the same at every rate and the arrival gaps only scale (common random numbers). A pair with
    ``max_num_batched_tokens < max_num_seqs`` is not simulated: vLLM's ``SchedulerConfig`` refuses to start with
    it (and :func:`batchlab.simulate` raises), so its row has no numbers. Results are cached
    (:func:`batchlab.chapters.facts.memo`). Used in chapters 8 and 12.

    Parameters
    ----------
    cost : CostModel
    workload : str
        A real-trace preset (:func:`batchlab.preset_names`).
    rates_req_s : sequence of float
        Mean arrival rates (requests/s).
    max_num_seqs, max_num_batched_tokens : sequence of int
        The grid (sequences, tokens per iteration).
    n_requests : int
    seed : int
    executor : concurrent.futures.Executor, optional
        Passed to :func:`batchlab.sweep`; the frame is the same with any executor.

    Returns
    -------
    DataFrame
        One row per rate and pair, rates outermost, pairs in grid order: ``policy``, the knobs, the
        ``summary()`` columns (NaN where vLLM refuses the pair), ``rate_req_s`` (req/s) and ``vllm_refuses``
        (True where ``max_num_batched_tokens < max_num_seqs``).
    """
    pairs = pd.DataFrame([{"max_num_seqs": int(s), "max_num_batched_tokens": int(t)}
                          for s in max_num_seqs for t in max_num_batched_tokens])
    refused = pairs["max_num_batched_tokens"] < pairs["max_num_seqs"]
    if refused.all():
        raise ValueError("vLLM refuses every pair of the grid (max_num_batched_tokens < max_num_seqs)")
    accepted = pairs[~refused].to_dict("records")
    knobs = list(pairs.columns)
    parts = []
    for rate in rates_req_s:
        runs = sweep(preset(workload, n_requests, rate_req_s=float(rate), seed=seed), accepted, cost,
                     policy="chunked", executor=executor, progress=False)
        parts.append(pairs.merge(runs, on=knobs, how="left")[runs.columns].assign(
            policy="chunked", rate_req_s=float(rate), vllm_refuses=refused.to_numpy()))
    return pd.concat(parts, ignore_index=True)


def default_vs_pick(df: pd.DataFrame, defaults: dict, *, same: float = SAME_THROUGHPUT, ttft_tol: float = PLATEAU,
                    x: str = "output_throughput", ttft: str = "p99_ttft_ms", itl: str = "p99_itl_ms",
                    also=("p99_tpot_ms",)) -> pd.DataFrame:
    """Per rate, vLLM's default beside the pair we would pick instead, read at that rate alone.

    The pick is, among the pairs vLLM accepts at the same rate that deliver the default's throughput (at least
    ``1 - same`` of it) with as good a p99 TTFT (at most ``1 + ttft_tol`` times the default's), the one with
    the lowest p99 ITL; p99 ITLs within ``same`` of the lowest tie, and of tied pairs the one nearest vLLM's
    default wins (the fewest halvings or doublings of the two knobs), so a knob the traffic never presses stays
    where vLLM puts it. The default is always a candidate, so the pick's p99 ITL is never above the default's.
    Used in chapter 8 (and its facts, which chapter 9, the cheat sheet and the intro glue).

    Parameters
    ----------
    df : DataFrame
        A two-knob sweep (:func:`two_knob_sweep`).
    defaults : dict
        ``max_num_seqs`` and ``max_num_batched_tokens`` of vLLM's default (:func:`batchlab.vllm_defaults`).
    same, ttft_tol : float
        Relative tolerances (0 to 1) on throughput and p99 ITL, and on p99 TTFT.
    x, ttft, itl : str
        Throughput (tok/s) and the two latencies (ms).
    also : sequence of str
        Further columns reported for both.

    Returns
    -------
    DataFrame
        One row per rate: ``rate_req_s``; ``default_<col>`` and ``pick_<col>`` for ``x``, ``ttft``, ``itl`` and
        ``also``; ``pick_max_num_seqs``, ``pick_max_num_batched_tokens``; ``lowest_<ttft>`` (the lowest p99 TTFT
        at the default's throughput and rate) and ``itl_ratio`` (the default's p99 ITL over the pick's).
    """
    if not (0 <= same < 1 and 0 <= ttft_tol < 1):
        raise ValueError(f"same and ttft_tol must be in [0, 1), got {same!r} and {ttft_tol!r}")
    ok = df[~df["vllm_refuses"]]
    cols = list(dict.fromkeys([x, ttft, itl, *also]))
    steps = sum(np.abs(np.log2(ok[k] / defaults[k])) for k in ("max_num_seqs", "max_num_batched_tokens"))
    rows = []
    for rate, g in ok.groupby("rate_req_s", sort=True):
        dflt = g[(g["max_num_seqs"] == defaults["max_num_seqs"])
                 & (g["max_num_batched_tokens"] == defaults["max_num_batched_tokens"])].iloc[0]
        peers = g[g[x] >= dflt[x] * (1 - same)]
        close = peers[peers[ttft] <= dflt[ttft] * (1 + ttft_tol)]
        tied = close[close[itl] <= close[itl].min() * (1 + same)]
        pick = tied.loc[steps[tied.index].idxmin()]
        rows.append({"rate_req_s": rate} | {f"default_{c}": float(dflt[c]) for c in cols}
                    | {f"pick_{k}": int(pick[k]) for k in ("max_num_seqs", "max_num_batched_tokens")}
                    | {f"pick_{c}": float(pick[c]) for c in cols} | {f"lowest_{ttft}": float(peers[ttft].min()),
                                                                      "itl_ratio": float(dflt[itl] / pick[itl])})
    return pd.DataFrame(rows)


def rates_phrase(rates, where) -> str:
    """Where a reading holds, in words: ``"at each of the three loads below capacity"``, ``"from 16.7 req/s on"``,
    ``"at 10.4 and 19.8 req/s"`` or ``"at none of the loads below capacity"``.

    ``rates`` are the loads considered (req/s), ``where`` a boolean per rate. Used in chapter 8, so that a
    sentence says exactly the loads at which it holds.
    """
    rates, where = np.asarray(rates, dtype=float), np.asarray(where, dtype=bool)
    if rates.shape != where.shape or rates.size == 0:
        raise ValueError(f"rates and where must be non-empty and of one length, got {rates.size} and {where.size}")
    order = np.argsort(rates)
    rates, where = rates[order], where[order]
    if where.all():
        count = {2: "both", 3: "each of the three", 4: "each of the four"}.get(rates.size, f"each of the {rates.size}")
        return f"at {count} loads below capacity" if rates.size > 1 else f"at {rates[0]:.1f} req/s"
    if not where.any():
        return "at none of the loads below capacity"
    first = int(np.argmax(where))
    if where[first:].all() and rates.size - first > 1:
        return f"from {rates[first]:.1f} req/s on"
    shown = [f"{r:.1f}" for r in rates[where]]
    return f"at {shown[0]} req/s" if len(shown) == 1 else f"at {', '.join(shown[:-1])} and {shown[-1]} req/s"


def vllm_defaults_table(gpus=("h100-sxm", "h200", "a100-80gb")) -> pd.DataFrame:
    """vLLM's default knobs per GPU (:func:`batchlab.vllm_defaults`): they depend on the GPU, not on the model.

    Used in chapters 8 and 12.

    Parameters
    ----------
    gpus : sequence of str
        Hardware presets.

    Returns
    -------
    DataFrame
        One row per GPU: ``gpu``, ``hbm_gib`` (GiB), ``max_num_seqs``, ``max_num_batched_tokens_serve``
        (``vllm serve``) and ``max_num_batched_tokens_offline`` (the ``LLM`` class).
    """
    rows = []
    for name in gpus:
        hw = get_hardware(name)
        serve, offline = vllm_defaults(hw, "serve"), vllm_defaults(hw, "offline")
        rows.append({"gpu": name, "hbm_gib": hw.hbm_bytes / 2**30, "max_num_seqs": serve["max_num_seqs"],
                     "max_num_batched_tokens_serve": serve["max_num_batched_tokens"],
                     "max_num_batched_tokens_offline": offline["max_num_batched_tokens"]})
    return pd.DataFrame(rows)


def runs_table(df: pd.DataFrame, columns: dict):
    """Rows of a sweep or of :func:`default_vs_pick`, with readable headers and units.

    ``columns`` maps a column to its header; columns ending in ``_knobs`` are text already, those ending in
    ``_ms`` read through :func:`batchlab.viz.format_duration` (``"refused"`` for a pair never run), rates
    with one decimal, ratios (``_ratio``) with one decimal and a ×, shares (``load``) as percentages, throughputs
    and knobs with thousands separators. Used in chapter 8. Returns a ``Styler`` without the index.
    """
    def fmt(col):
        if col.endswith("_knobs"):  # already words: "1,024 / 3,072"
            return str
        if col.endswith("_ms"):  # a number and its unit never split over two lines of a narrow column
            return lambda v: viz.format_duration(v, missing="refused").replace(" ", "\u00a0")
        if col.endswith("_ratio"):
            return "×{:.1f}".format
        return "{:.0%}".format if col == "load" else "{:.1f}".format if "rate_req_s" in col else "{:,.0f}".format

    return viz.display_table(df, {col: (header, fmt(col)) for col, header in columns.items()}, na_rep=None)


def knobs_text(max_num_seqs, max_num_batched_tokens) -> pd.Series:
    """Pairs as a reader reads them, ``"1,024 / 3,072"`` (sequences / tokens). Used in chapter 8's table."""
    seqs, tokens = pd.Series(max_num_seqs).astype(int), pd.Series(max_num_batched_tokens).astype(int)
    return seqs.map("{:,}".format) + " / " + tokens.map("{:,}".format).to_numpy()


def vllm_defaults_style(table: pd.DataFrame):
    """:func:`vllm_defaults_table` with the GPUs' names and headers in words and units (a ``Styler``).

    Used in chapter 8. ``table`` may be indexed by ``gpu``.
    """
    table = table if "gpu" in table.columns else table.reset_index()
    shown = table.assign(gpu=table["gpu"].map(lambda g: viz.GPU_NAMES.get(g, g)))
    count = "{:,.0f}".format
    # one column per knob, so the long knob names sit in two headers and the table fits the book's column
    shown["budgets"] = [f"{serve:,} / {offline:,}" for serve, offline in zip(
        table["max_num_batched_tokens_serve"], table["max_num_batched_tokens_offline"])]
    return viz.display_table(shown, {
        "gpu": ("GPU", str), "hbm_gib": ("HBM (GiB)", "{:.0f}".format),
        "max_num_seqs": ("max_num_seqs (sequences)", count),
        "budgets": ("max_num_batched_tokens (tokens): vllm serve / offline LLM", str)})


# -- the chart (drawn by batchlab.chapters.two_knobs_charts) ----------------------------------------------------------
def two_knobs_chart(df: pd.DataFrame, defaults: dict, offline_tokens: int | None = None, rate_req_s=None,
                    x: str = "output_throughput", y: str = "p99_ttft_ms", y2: str = "p99_itl_ms"):
    """Every operating point of a two-knob sweep, vLLM's defaults, the chosen pair and its trail, per rate or all.

    Used in chapter 8.

    Parameters
    ----------
    df : DataFrame
        :func:`two_knob_sweep` with a boolean ``frontier`` column (:func:`batchlab.sweep.with_frontier`):
        ``rate_req_s`` (req/s), ``max_num_seqs``, ``max_num_batched_tokens``, ``vllm_refuses``, ``x``, ``y``,
        ``y2`` (and ``p99_tpot_ms``, for the tooltip, if present).
    defaults : dict
        vLLM's ``vllm serve`` defaults (:func:`batchlab.vllm_defaults`): the knobs selected at first and a
        marked point.
    offline_tokens : int, optional
        ``max_num_batched_tokens`` of the offline default (same ``max_num_seqs``), marked too.
    rate_req_s : float, optional
        The rate selected at first (req/s; default: every load together).
    x, y, y2 : str
        Throughput (tok/s) and the two latencies (ms): ``y`` in the top panel with the frontier, ``y2`` below.

    Returns
    -------
    altair chart: a slider per knob (its positions the grid's values, shown in sequences and tokens) and radio
    buttons for the rate, one per rate and one for every load. One rate shows that rate's runs alone, on a
    latency axis fitted to them (log, labelled in ms and s); every load shows all of them with the frontier
    through them. The throughput axis is the same in both, so at one rate below capacity the runs that keep up
    stand in one column and the sliders move the green point up and down. The readout above reads the chosen
    pair at the selected rate (or at each rate), durations in ms below a second and in s from there
    (:func:`batchlab.viz.duration_text`); every pair picked before stays as a faded green ring (the selection
    ``visited``; clicking a run adds or removes it). The grid at the bottom shows every pair at the selected
    rate(s): black where it is on the frontier, a cross where vLLM refuses it; a triangle marks the pick of
    :func:`default_vs_pick` at each rate (the lowest p99 ITL at as good a p99 TTFT as the default), in every
    panel. Each latency axis starts and ends on a labelled tick around the runs shown.
    """
    picks = None
    if all(c in df.columns for c in (x, y, y2)) and (~df["vllm_refuses"]).any():
        picks = default_vs_pick(df, defaults, x=x, ttft=y, itl=y2, also=())
    return two_knobs_charts.knobs_chart(df, defaults, picks, offline_tokens, rate_req_s, x, y, y2)


# -- the conversation scene's sweep, and the facts other pages glue (batchlab.chapters.facts) ------------------
@facts.memo
def _capacity(cost, workload: str, n_requests: int, seed) -> float:
    return saturation_rate(cost, workload, n_requests, seed=seed)


def scene_capacity(name: str) -> float:
    """A scene's capacity (req/s): every request queued at time 0, vLLM's defaults (:func:`saturation_rate`).
    Used in chapters 8 and 9."""
    s = scenes.scene(name)
    return _capacity(s.cost(), s.workload, s.n_requests, s.seed)


def conv_capacity() -> float:
    """The conv scene's capacity (req/s), :func:`scene_capacity`."""
    return scene_capacity("conv")


def conv_rates() -> dict:
    """The conv scene's request rates by name (:data:`CONV_LOADS` times its capacity, to 0.1 req/s)."""
    cap = conv_capacity()
    return {name: round(share * cap, 1) for name, share in CONV_LOADS.items()}


def conv_sweep() -> pd.DataFrame:
    """The chapter's sweep: the conv scene at its four loads over :data:`MAX_NUM_SEQS` x
    :data:`MAX_NUM_BATCHED_TOKENS`, with the frontier (throughputs within :data:`SAME_THROUGHPUT` equal). Cached."""
    s = scenes.scene("conv")
    df = two_knob_sweep(s.cost(), s.workload, list(conv_rates().values()), list(MAX_NUM_SEQS),
                        list(MAX_NUM_BATCHED_TOKENS), n_requests=s.n_requests, seed=s.seed)
    return with_frontier(df, rel_tol=SAME_THROUGHPUT)


def conv_picks() -> pd.DataFrame:
    """:func:`default_vs_pick` of :func:`conv_sweep` against vLLM's defaults on the scene's GPU, by rate."""
    s = scenes.scene("conv")
    return default_vs_pick(conv_sweep(), vllm_defaults(get_hardware(s.gpu))).set_index("rate_req_s")


def conv_plateau() -> pd.Series:
    """Per rate (req/s), the smallest ``max_num_seqs`` whose p99 TTFT is within :data:`PLATEAU` of the best at
    vLLM's default budget (:func:`batchlab.sweep.seqs_plateau` of :func:`conv_sweep`)."""
    df = conv_sweep()
    budget = vllm_defaults(get_hardware(scenes.scene("conv").gpu))["max_num_batched_tokens"]
    plateau = seqs_plateau(df[~df["vllm_refuses"]], tol=PLATEAU)
    return plateau[plateau["max_num_batched_tokens"] == budget].set_index("rate_req_s")["max_num_seqs"]


@facts.memo
def _overload_run(cost, workload: str, n_requests: int, rate_req_s: float, seed) -> dict:
    res = simulate(preset(workload, n_requests, rate_req_s=rate_req_s, seed=seed), "chunked", cost)
    return {"peak_running": int(res.steps["running"].max()), "preemptions": int(res.summary()["preemptions"]),
            "kv_tokens": int((res.knobs["num_kv_blocks"] - 1) * res.knobs["block_size"])}


def conv_overload() -> dict:
    """The conv scene at its overload rate with vLLM's defaults: ``peak_running`` (sequences), ``preemptions``
    and ``kv_tokens`` (the KV pool less vLLM's null block, tokens)."""
    s = scenes.scene("conv")
    return _overload_run(s.cost(), s.workload, s.n_requests, conv_rates()["over"], s.seed)


@facts.fact("capacity_req_s", scene="conv", unit="req/s", fmt=".1f", chapter="two_knobs",
            text="the capacity of the conversation scene: requests per second the server completes with every "
                 "request queued at time 0 and vLLM's defaults (what vllm bench throughput measures)")
def _capacity_fact():
    return conv_capacity()


def _rate_fact(name: str, share: float):
    @facts.fact(f"rate_{name}_req_s", scene="conv", unit="req/s", fmt=".1f", chapter="two_knobs",
                text=f"the conversation scene's {name} load: {share:.0%} of its capacity")
    def _rate():
        return conv_rates()[name]


for _name, _share in CONV_LOADS.items():
    _rate_fact(_name, _share)


@facts.fact("conv_prompt_mean", scene="conv", unit="tokens", fmt=",.0f", chapter="two_knobs",
            text="the mean prompt of the conversation scene's 3,000 requests")
def _prompt_mean():
    return float(scenes.scene("conv").requests().prompt_tokens.mean())


@facts.fact("conv_over_context", scene="conv", unit="requests", fmt=",d", chapter="two_knobs",
            text="the conversation scene's requests whose prompt does not fit Llama-3-8B's 8,192-token context: "
                 "vLLM rejects them")
def _over_context():
    return int(scenes.scene("conv").n_requests - len(scenes.scene("conv").requests(fit_context=True).arrival_s))


@facts.fact("conv_fit_prompt_mean", scene="conv", unit="tokens", fmt=",.0f", chapter="two_knobs",
            text="the mean prompt of the conversation scene's requests that fit the context, the stream every "
                 "policy gets where Orca's policies are compared with vLLM's")
def _fit_prompt_mean():
    return float(scenes.scene("conv").requests(fit_context=True).prompt_tokens.mean())


@facts.fact("conv_output_mean", scene="conv", unit="tokens", fmt=",.0f", chapter="two_knobs",
            text="the mean output the conversation scene's requests ask for")
def _output_mean():
    return float(scenes.scene("conv").requests().output_tokens.mean())


@facts.fact("kv_pool_tokens", scene="llama8", unit="tokens", fmt=",.0f", chapter="two_knobs",
            text="the KV pool vLLM gives Llama-3-8B BF16 on one H100 SXM with its defaults, in tokens (the null "
                 "block left out)")
def _kv_pool_tokens():
    return int((scenes.scene("llama8").cost().kv_pool_blocks() - 1) * 16)


def _h100_default(key: str, usage: str = "serve") -> int:
    return int(vllm_defaults(get_hardware(scenes.scene("llama8").gpu), usage)[key])


@facts.fact("vllm_default_max_num_seqs", scene="llama8", unit="sequences", fmt=",.0f", chapter="two_knobs",
            text="vLLM's default max_num_seqs for vllm serve on an H100 SXM (any model)")
def _default_seqs():
    return _h100_default("max_num_seqs")


@facts.fact("vllm_default_max_num_batched_tokens", scene="llama8", unit="tokens", fmt=",.0f", chapter="two_knobs",
            text="vLLM's default max_num_batched_tokens for vllm serve on an H100 SXM (any model)")
def _default_tokens():
    return _h100_default("max_num_batched_tokens")


@facts.fact("vllm_offline_max_num_batched_tokens", scene="llama8", unit="tokens", fmt=",.0f", chapter="two_knobs",
            text="vLLM's default max_num_batched_tokens for the offline LLM class on an H100 SXM")
def _offline_tokens():
    return _h100_default("max_num_batched_tokens", "offline")


@facts.fact("knobs_plateau_seqs", scene="conv", unit="sequences", fmt=",.0f", chapter="two_knobs",
            text="at the conversation scene's near load and vLLM's default budget, the smallest max_num_seqs of "
                 "the sweep whose p99 TTFT is within 5% of the best: where raising the cap stops paying")
def _plateau_seqs():
    return int(conv_plateau().loc[conv_rates()["near"]])


def _near_fact(name: str, column: str, unit: str, fmt: str, text: str):
    @facts.fact(f"knobs_{name}", scene="conv", unit=unit, fmt=fmt, chapter="two_knobs",
                text=f"{text}, at the conversation scene's near load (95% of capacity)")
    def _near():
        value = conv_picks().loc[conv_rates()["near"], column]
        return int(value) if column.endswith(("_seqs", "_tokens")) else float(value)


for _args in (("default_p99_ttft_ms", "default_p99_ttft_ms", "ms", ",.0f", "p99 TTFT of vLLM's default knobs"),
              ("default_p99_itl_ms", "default_p99_itl_ms", "ms", ",.0f", "p99 ITL of vLLM's default knobs"),
              ("default_p99_tpot_ms", "default_p99_tpot_ms", "ms", ".1f", "p99 TPOT of vLLM's default knobs"),
              ("pick_max_num_seqs", "pick_max_num_seqs", "sequences", ",.0f",
               "max_num_seqs of the pair chapter 8 picks: the lowest p99 ITL at as good a p99 TTFT as the default's"),
              ("pick_max_num_batched_tokens", "pick_max_num_batched_tokens", "tokens", ",.0f",
               "max_num_batched_tokens of the pair chapter 8 picks"),
              ("pick_p99_ttft_ms", "pick_p99_ttft_ms", "ms", ",.0f", "p99 TTFT of the pair chapter 8 picks"),
              ("pick_p99_itl_ms", "pick_p99_itl_ms", "ms", ",.0f", "p99 ITL of the pair chapter 8 picks"),
              ("pick_p99_tpot_ms", "pick_p99_tpot_ms", "ms", ".1f", "p99 TPOT of the pair chapter 8 picks"),
              ("itl_ratio", "itl_ratio", "", ".1f", "the default's p99 ITL over that of the pair chapter 8 picks")):
    _near_fact(*_args)


@facts.fact("knobs_over_default_p99_itl_ms", scene="conv", unit="ms", fmt=",.0f", chapter="two_knobs",
            text="p99 ITL of vLLM's default knobs at the conversation scene's overload rate (120% of capacity)")
def _over_default_itl():
    return float(conv_picks().loc[conv_rates()["over"], "default_p99_itl_ms"])


@facts.fact("over_peak_running", scene="conv", unit="sequences", fmt=",.0f", chapter="two_knobs",
            text="the most sequences running at once with vLLM's defaults at the conversation scene's overload "
                 "rate (120% of capacity): the KV pool, not max_num_seqs, caps the batch")
def _peak_running():
    return conv_overload()["peak_running"]


@facts.fact("over_preemptions", scene="conv", unit="preemptions", fmt=",.0f", chapter="two_knobs",
            text="preemptions in the run of vLLM's defaults at the conversation scene's overload rate")
def _preemptions():
    return conv_overload()["preemptions"]
