"""Chapter 13, validation, the whole server: every measured end-to-end vLLM run replayed, and the book's own
setup beside the measured runs closest to it. :mod:`batchlab.chapters.validation` re-exports all of it.

:func:`e2e_parity_chart` draws every replayed run (:func:`batchlab.validate.replay_all`, named in words by
:func:`run_text`), :func:`e2e_error_table` and :func:`ablation_style` their errors; :func:`closest_runs` picks the
runs nearest the book's setup, :func:`book_setup_replay` sends the same traffic to the book's setup and
:func:`setup_frame` sets the three side by side.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz
from ..models import get_model
from ..vllm import vllm_defaults
from ..validate import calibration_runs, replay_all
from . import scenes

# Log axes labelled at 1, 2 and 5 per decade, with thousands separators ("50,000", not "50000").
LOG_LABEL = viz.LOG125_LABEL  # 1, 2 and 5 times a power of ten, thousands separated
_MANTISSA = "datum.value / pow(10, floor(log(datum.value) / LN10 + 1e-9))"


def time_label(decades_only: str = "true") -> str:
    """A Vega ``labelExpr`` for a log time axis whose values are in ms: each label carries its unit, µs below
    1 ms (as :func:`kernel_time_text`), ms below 1 s, s from 1 s ("5 µs", "100 µs", "500 ms", "10 s"), so an
    axis spanning nanoseconds to seconds never prints an exponent. Only powers of ten are labelled where
    ``decades_only`` (a Vega expression) is true, else 1, 2 and 5 times them; the axis' greedy overlap drops the
    rest. Used in chapter 13.
    """
    keep = (f"abs({_MANTISSA} - 1) < 1e-6 || (!({decades_only}) && "
            f"(abs({_MANTISSA} - 2) < 1e-6 || abs({_MANTISSA} - 5) < 1e-6))")
    text = ("datum.value < 1 ? format(datum.value * 1000, ',~g') + ' µs' : datum.value < 1000 ? "
            "format(datum.value, ',~g') + ' ms' : format(datum.value / 1000, ',~g') + ' s'")
    return f"({keep}) ? ({text}) : ''"


def time_axis(decades_only: str = "true") -> dict:
    """A log time scale and axis (values in ms) labelled by :func:`time_label`, labels at least 6 px apart."""
    return {"scale": alt.Scale(type="log", nice=False),
            "axis": alt.Axis(labelExpr=time_label(decades_only), labelOverlap="greedy", labelSeparation=6)}


def kernel_time_text(field: str) -> str:
    """A Vega expression printing a kernel time (``field`` in ms) for a tooltip: three significant digits in µs
    below 1 ms ("196 µs", "0.196 µs"), the book's duration rule (:func:`batchlab.viz.duration_text`) above, whose
    two decimals of a millisecond would print a kernel of a few microseconds as "0.00 ms"."""
    ms = f"datum['{field}']"
    return f"isFinite({ms}) && {ms} > 0 && {ms} < 1 ? format({ms} * 1000, '.3r') + ' µs' : " + viz.duration_text(field)


def _band_lines(points: pd.DataFrame, keys: list, span_by: str, band: float) -> pd.DataFrame:
    """The lines y = x and y = (1 +- ``band``) x for each group of ``keys``, spanning the measured and predicted
    range of each ``span_by`` group (two points per line, ``kind`` and ``line`` naming it)."""
    rows = []
    for _, per in points.groupby(span_by, sort=False):
        lo = min(per["measured_ms"].min(), per["predicted_ms"].min()) / (1 + band)
        hi = max(per["measured_ms"].max(), per["predicted_ms"].max()) * (1 + band)
        for key, _part in per.groupby(keys, sort=False):
            for label, k in (("y = x", 1.0), (f"±{band:.0%}", 1 + band), (f"±{band:.0%}", 1 - band)):
                rows.append({**dict(zip(keys, key)), "kind": label, "line": f"{label} {k}",
                             "measured_ms": [lo, hi], "predicted_ms": [lo * k, hi * k]})
    return pd.DataFrame(rows).explode(["measured_ms", "predicted_ms"]).astype(
        {"measured_ms": float, "predicted_ms": float})



E2E_METRICS = {"ttft": "time to first token", "tpot": "time per output token",
               "e2e": "end-to-end latency"}  # each panel's title; its ticks carry their unit (time_label)
E2E_SETS = {"inference-perf": "open loop (inference-perf)", "aiconfigurator": "closed loop (AIConfigurator)",
            "all": "all runs"}
SET_COLORS = {E2E_SETS["inference-perf"]: viz.PALETTE[0], E2E_SETS["aiconfigurator"]: viz.PALETTE[1]}


def _profile(run) -> str:
    """An open-loop (inference-perf) run's prompt profile, the last word of its experiment's name ("long")."""
    return str(run["experiment"]).rsplit("-", 1)[-1]


def run_text(run) -> str:
    """One end-to-end calibration run in words (chapter 13's tooltips and tables): the model and its weights, the
    GPUs, and the load (an open-loop rate and its prompts, or a closed loop's clients and labelled lengths).

    ``run`` is a row of :func:`batchlab.validate.calibration_runs` (or of :func:`batchlab.validate.replay_all`,
    with those columns joined).
    """
    model = viz.MODEL_NAMES.get(run["model"], run["model"])
    tp, gpu = int(run["tp"]), viz.GPU_NAMES.get(run["hardware"], run["hardware"])
    where = f"{model} {str(run['dtype']).upper()} on {'one' if tp == 1 else tp} {gpu}{'' if tp == 1 else 's'}"
    if run["set"] == "inference-perf":
        return f"{where}, {float(run['rate_req_s']):g} req/s open loop ({_profile(run)} prompts)"
    client = ", InferenceX's client" if run.get("client") == "inferencex" else ""
    return (f"{where}, {int(run['concurrency'])} clients, {int(run['isl']):,}-token prompts and "
            f"{int(run['osl']):,}-token outputs{client}")


def e2e_parity_frame(table: pd.DataFrame, band: float = 0.15) -> pd.DataFrame:
    """Every usable calibration run's predicted against measured value per metric, plus the lines y = x and
    y = (1 +- ``band``) x per metric panel. ``table`` is :func:`batchlab.validate.replay_all`. Used in chapter 13.

    ``measured`` and ``predicted`` are in ms (the axes label each tick with its unit, :func:`time_label`);
    ``run`` names the run in words (:func:`run_text`), ``source`` its set (:data:`E2E_SETS`);
    ``measured_text`` and ``predicted_text`` are the two values as the book prints a duration
    (:func:`batchlab.viz.format_duration`: "412 ms", "1.28 s"), for the tooltips.
    """
    used = table[table["representable"].astype(bool) & (table["status"] == "ok")]
    runs = calibration_runs().set_index("run_id")
    points = pd.DataFrame({"run_id": used["run_id"], "metric": used["metric"],
                           "source": used["set"].map(E2E_SETS),
                           "run": [run_text(runs.loc[r]) for r in used["run_id"]],
                           "measured_ms": used["measured_ms"], "predicted_ms": used["predicted_ms"],
                           "rel_error": used["rel_error"], "kind": "run", "line": ""})
    out = pd.concat([points, _band_lines(points, ["metric"], "metric", band)], ignore_index=True)
    out = out.rename(columns={"measured_ms": "measured", "predicted_ms": "predicted"})
    out["panel"] = out["metric"].map(E2E_METRICS)
    for col in ("measured", "predicted", "rel_error"):
        out[col] = [float(f"{v:.4g}") for v in out[col]]
    for col in ("measured", "predicted"):
        out[f"{col}_text"] = [viz.format_duration(v) if k == "run" else "" for v, k in zip(out[col], out["kind"])]
    return out.drop(columns=["run_id"])


def e2e_parity_chart(table: pd.DataFrame, band: float = 0.15, size: int = 150):
    """Predicted against measured TTFT, TPOT and E2E of every end-to-end calibration run, log-log, one panel each
    (each tick with its unit), coloured by source; dashed lines at ±``band``. Used in chapter 13."""
    data = e2e_parity_frame(table, band)
    axis = time_axis()  # every panel spans one to four decades of ms: powers of ten, each with its unit
    x = alt.X("measured:Q", title="measured", **axis)
    y = alt.Y("predicted:Q", title="predicted", **axis)
    points = alt.Chart().transform_filter("datum.kind == 'run'").mark_circle(size=28, opacity=0.75).encode(
        x=x, y=y, color=alt.Color("source:N", title=None, legend=alt.Legend(orient="top", labelLimit=0),
                                  scale=alt.Scale(domain=list(SET_COLORS), range=list(SET_COLORS.values()))),
        tooltip=[viz.tip("run", "run", kind="N"), viz.tip("panel", "metric", kind="N"),
                 viz.tip("measured_text", "measured", kind="N"), viz.tip("predicted_text", "predicted", kind="N"),
                 viz.tip("rel_error", "error (predicted / measured - 1)", "+.1%")])
    lines = alt.Chart().transform_filter("datum.kind != 'run'").mark_line(color="#555555", strokeWidth=1).encode(
        x=x, y=y, detail="line:N", strokeDash=alt.StrokeDash("kind:N", title=None, legend=alt.Legend(orient="top"),
                                                             scale=alt.Scale(range=[[1, 0], [4, 3]])))
    panels = alt.layer(lines, points, data=data).properties(width=size, height=size)
    return panels.facet(column=alt.Column("panel:N", title=None, sort=list(E2E_METRICS.values()))).resolve_scale(
        x="independent", y="independent")


def e2e_error_table(errors: pd.DataFrame):
    """:func:`batchlab.validate.error_summary` as the reader reads it (a ``Styler``): one row per set and metric,
    errors in %. Used in chapter 13; the worst run of each row is named in the prose, not here."""
    shown = errors.assign(metric=errors["metric"].map({"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}),
                          set=errors["set"].map(lambda s: E2E_SETS.get(s, s)))
    pct = "{:.1%}".format
    return viz.display_table(shown, {"set": ("runs", str), "metric": ("metric", str),
                                     "runs": ("count", "{:,}".format), "median_abs_error": ("median |error|", pct),
                                     "worst_abs_error": ("worst |error|", pct),
                                     "median_error": ("median error (signed)", "{:+.1%}".format)})


def ablation_table(ablations: pd.DataFrame) -> pd.DataFrame:
    """Median |error| per metric (columns) with each mechanism off in turn (rows; "none" is the full model)."""
    table = ablations.pivot(index="mechanism", columns="metric", values="median_abs_error")
    table = table.reindex(index=list(dict.fromkeys(ablations["mechanism"])), columns=["ttft", "tpot", "e2e"])
    table.columns = ["TTFT", "TPOT", "E2E"]
    table.index = ["nothing (the full model)" if m == "none" else m for m in table.index]
    table.index.name = "switched off"
    return table


def ablation_style(ablations: pd.DataFrame):
    """:func:`ablation_table` as the page shows it (a ``Styler``): the mechanism switched off, then the median
    |error| of TTFT, TPOT and E2E in %. Used in chapter 13."""
    table = ablation_table(ablations).reset_index()
    pct = "{:.1%}".format
    return viz.display_table(table, {"switched off": ("switched off", str),
                                     **{m: (f"{m} median |error|", pct) for m in ("TTFT", "TPOT", "E2E")}})



QWEN_FEW_CLIENTS, LLAMA70_MANY_CLIENTS = 16, 32  # the closed-loop loads the prose reads TTFT at
QWEN_PROMPTS = (1024, 4096)  # Qwen3-32B's labelled prompt lengths whose TTFT shortfall the prose compares


def e2e_headline(e2e: pd.DataFrame, errors: pd.DataFrame) -> dict:
    """The numbers chapter 13's end-to-end prose quotes, by glue name.

    Run counts (``e2e_measured``: every measured run; ``e2e_runs``: those scored, the overloaded ones left out, and
    ``e2e_overloaded_names`` naming those) and the sets' scope (models' TP degrees, clients, the open-loop prompts
    and InferenceX's range ratio and requests per client); median, worst and signed errors per metric over all
    usable runs; TTFT per set and per closed-loop model (``e2e_ttft_<model>``: the InferenceX Llama-3.1-70B rows,
    Qwen3-32B); the closed-loop TTFT ratio (predicted / measured) of Llama-3.1-70B at :data:`LLAMA70_MANY_CLIENTS`
    clients or more and of Qwen3-32B at :data:`QWEN_FEW_CLIENTS` or fewer; Qwen3-32B's TTFT shortfall there
    (measured minus predicted, ms, median) for the prompts of :data:`QWEN_PROMPTS`; the Llama-3.1-8B FP8 rows' TPOT
    and their fewest and most GPUs (``e2e_8b_tp_lo``, ``e2e_8b_tp_hi``), and for the one of them that asks most of
    its GPUs, the share of their dense peak its prompts alone would need (:func:`prefill_share_needed`) with its
    clients, lengths and measured TPOT.
    """
    overall = errors[errors["set"] == "all"].set_index("metric")
    by_set = errors.set_index(["set", "metric"])["median_abs_error"]
    per_run = e2e.drop_duplicates("run_id")
    runs = calibration_runs().set_index("run_id")
    out = {"e2e_runs": int(overall.loc["ttft", "runs"]), "e2e_closed": int((per_run["set"] == "aiconfigurator").sum()),
           "e2e_overloaded": int((per_run["status"] == "overloaded").sum()),
           "e2e_ip_ttft": float(by_set[("inference-perf", "ttft")]),
           "e2e_ac_ttft": float(by_set[("aiconfigurator", "ttft")])}
    out["e2e_measured"] = len(per_run)  # every measured run, the overloaded ones included
    out["e2e_open"] = int((per_run["set"] == "inference-perf").sum())  # load stages, the overloaded ones included
    out["e2e_overloaded_names"] = overloaded_names(per_run)
    for name, rows in (("ip", runs[runs["set"] == "inference-perf"]), ("ac", runs[runs["set"] == "aiconfigurator"])):
        out[f"{name}_tp_lo"], out[f"{name}_tp_hi"] = int(rows["tp"].min()), int(rows["tp"].max())
    closed = runs[runs["set"] == "aiconfigurator"]
    out["ac_clients_lo"], out["ac_clients_hi"] = int(closed["concurrency"].min()), int(closed["concurrency"].max())
    open_ = runs[runs["set"] == "inference-perf"]
    out["ip_prompts"] = int((open_["num_groups"] * open_["prompts_per_group"]).max())
    ix = closed[closed["client"] == "inferencex"]
    out["ix_range_ratio"] = float(ix["range_ratio"].iloc[0])
    out["ix_mean_share"] = (1 + out["ix_range_ratio"]) / 2  # uniform between the ratio and 1 of the label
    out["ix_requests_per_client"] = int((ix["n_requests"] / ix["concurrency"]).median())
    for metric in ("ttft", "tpot", "e2e"):
        out[f"e2e_med_{metric}"] = float(overall.loc[metric, "median_abs_error"])
        out[f"e2e_worst_{metric}"] = float(overall.loc[metric, "worst_abs_error"])
        out[f"e2e_signed_{metric}"] = float(overall.loc[metric, "median_error"])
    ttft = e2e[(e2e["set"] == "aiconfigurator") & (e2e["metric"] == "ttft")]
    ratio = ttft["predicted_ms"] / ttft["measured_ms"]
    clients, isl = ttft["run_id"].map(runs["concurrency"]), ttft["run_id"].map(runs["isl"])
    out["e2e_ttft_70b"] = float(ttft.loc[ttft["model"] == "llama-3.1-70b", "rel_error"].abs().median())
    out["e2e_ttft_qwen"] = float(ttft.loc[ttft["model"] == "qwen3-32b", "rel_error"].abs().median())
    out["e2e_70b_runs"] = int((ttft["model"] == "llama-3.1-70b").sum())
    out["many_clients"], out["few_clients"] = LLAMA70_MANY_CLIENTS, QWEN_FEW_CLIENTS
    out["ttft_70b_high"] = float(ratio[(ttft["model"] == "llama-3.1-70b") & (clients >= LLAMA70_MANY_CLIENTS)].median())
    low_qwen = (ttft["model"] == "qwen3-32b") & (clients <= QWEN_FEW_CLIENTS)
    out["ttft_qwen_low"] = float(ratio[low_qwen].median())
    gap = ttft["measured_ms"] - ttft["predicted_ms"]
    out["qwen_isl_lo"], out["qwen_isl_hi"] = QWEN_PROMPTS
    out["qwen_gap_1k_ms"] = float(gap[low_qwen & (isl == QWEN_PROMPTS[0])].median())
    out["qwen_gap_4k_ms"] = float(gap[low_qwen & (isl == QWEN_PROMPTS[1])].median())
    fp8_8b = e2e[(e2e["model"] == "llama-3.1-8b") & (e2e["metric"] == "tpot")]
    out["e2e_8b_tpot"], out["e2e_8b_runs"] = float(fp8_8b["rel_error"].median()), len(fp8_8b)
    tp_8b = fp8_8b["run_id"].map(runs["tp"])
    out["e2e_8b_tp_lo"], out["e2e_8b_tp_hi"] = (int(tp_8b.min()), int(tp_8b.max())) if len(tp_8b) else (0, 0)
    shares = {r: prefill_share_needed(runs.loc[r]) for r in fp8_8b["run_id"]}
    if shares:  # (a subset of the runs may have none of these rows)
        worst = runs.loc[max(shares, key=shares.get)]
        out.update({"e2e_8b_share": shares[worst.name], "e2e_8b_clients": int(worst["concurrency"]),
                    "e2e_8b_isl": int(worst["isl"]), "e2e_8b_osl": int(worst["osl"]),
                    "e2e_8b_tpot_ms": float(worst["tpot_ms"])})
    return out


def prefill_share_needed(run) -> float:
    """The share of a closed-loop run's dense peak (all its GPUs) that computing its prompts alone takes.

    Every client sends one prompt per measured cycle (its mean end-to-end latency), so the GPUs must compute
    ``concurrency`` prompts of ``isl`` tokens, with no prefix-cache hits, every cycle: that FLOP over the cycle
    and the GPUs' peak (the pure roofline's prefill FLOP). Used in chapter 13 for the implausible rows.
    """
    from ..validate import cost_for

    cost = cost_for(run).replace(tp=1).ideal()
    flop = cost.step_breakdown(prefill_chunks=[(int(run["isl"]), 0)]).flops
    return float(run["concurrency"] * flop / (run["e2e_ms"] / 1e3 * run["tp"] * cost.peak_flops))


# -- the book's own setup beside the measured runs closest to it ------------------------------------------------
BOOK_SCENE = "llama8"  # chapters 2 to 9: Llama-3-8B in BF16 on one H100 SXM, vLLM's defaults
CLASS_PARAMS = (6e9, 10e9)  # parameters of a "7B-class" model: the runs set beside the book's 8B


def book_setup() -> dict:
    """The setup of chapters 2 to 9: ``model``, ``hardware``, ``tp``, ``dtype``, vLLM's default ``max_num_seqs``
    and ``max_num_batched_tokens`` for the GPU, ``kv_kib_per_token`` (KiB) and the CostModel (``cost``).
    Used in chapter 13."""
    cost = scenes.scene(BOOK_SCENE).cost()
    return {"model": cost.model.name, "hardware": cost.hardware.name, "tp": cost.tp, "dtype": cost.dtype,
            **vllm_defaults(cost.hardware), "kv_kib_per_token": cost.kv_bytes_per_token / 1024, "cost": cost}


def closest_runs(runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """The measured end-to-end runs closest to the book's setup: on its GPU, on one GPU, in its weight type, with
    a 7B-class model (:data:`CLASS_PARAMS`). Used in chapter 13.

    Returns the rows of ``runs`` (default :func:`batchlab.validate.calibration_runs`) with the knobs they were
    replayed with (``max_num_seqs``, ``max_num_batched_tokens``: recorded, else vLLM's defaults),
    ``kv_kib_per_token`` (KiB), ``run`` (:func:`run_text`) and ``load`` (its rate and prompts, in words).
    """
    from ..validate import knobs_for

    runs = calibration_runs() if runs is None else runs
    book = book_setup()
    params = runs["model"].map(lambda m: get_model(m).params)
    near = runs[(runs["hardware"] == book["hardware"]) & (runs["tp"] == book["tp"]) & (runs["dtype"] == book["dtype"])
                & params.between(*CLASS_PARAMS)].copy()
    knobs = [knobs_for(run) for _, run in near.iterrows()]
    near["max_num_seqs"] = [k["max_num_seqs"] for k in knobs]
    near["max_num_batched_tokens"] = [k["max_num_batched_tokens"] for k in knobs]
    near["kv_kib_per_token"] = [get_model(m).kv_bytes_per_token("bf16") / 1024 for m in near["model"]]
    near["run"] = [run_text(run) for _, run in near.iterrows()]
    near["load"] = [f"{float(run['rate_req_s']):g} req/s, {_profile(run)} prompts" for _, run in near.iterrows()]
    return near.reset_index(drop=True)


def _listed(values, fmt: str = "{:,}") -> str:
    """Distinct values in order, as a reader lists them: "128", "4, 6, 8 and 20"."""
    return _join([fmt.format(v) for v in sorted(set(values))])


def setup_table(close: pd.DataFrame, hit_rate: float, book_traffic: str):
    """The book's setup beside the closest measured runs, one row per part of a setup (a ``Styler``): model, GPU,
    weights, KV per token, the two knobs, client, prompts, load. ``hit_rate`` is the least share of prompt tokens
    found in the prefix cache (simulated) of the runs that kept up; ``book_traffic`` says what the book's chapters
    send. Used in chapter 13."""
    book = book_setup()
    names = lambda col, table: _listed(close[col].map(lambda v: table.get(v, v)), "{}")  # noqa: E731
    rows = [("model", viz.MODEL_NAMES[book["model"]], names("model", viz.MODEL_NAMES)),
            ("GPU", f"one {viz.GPU_NAMES[book['hardware']]}", "one " + names("hardware", viz.GPU_NAMES)),
            ("weights", book["dtype"].upper(), _listed(close["dtype"].str.upper(), "{}")),
            ("KV cache per token", f"{book['kv_kib_per_token']:,.0f} KiB", _listed(close["kv_kib_per_token"],
                                                                                      "{:,.0f} KiB")),
            ("max_num_seqs", f"{book['max_num_seqs']:,} (vLLM's default)", _listed(close["max_num_seqs"])),
            ("max_num_batched_tokens", f"{book['max_num_batched_tokens']:,} (vLLM's default)",
             _listed(close["max_num_batched_tokens"])),
            ("client", "none: the simulator's own requests", "inference-perf, open loop"),
            ("prompts", book_traffic, f"{_listed(close['prompt_tokens_mean'].round(), '{:,.0f}')} tokens on "
                                      f"average, with shared prefixes: at least {hit_rate:.0%} of their tokens found "
                                      "in the prefix cache where the server kept up (simulated)"),
            ("load", "from one request to past capacity", f"{_listed(close['rate_req_s'], '{:g}')} req/s")]
    return viz.display_table(pd.DataFrame(rows, columns=["part", "book", "runs"]), {
        "part": ("", str), "book": ("the book's setup", str),
        "runs": (f"the {len(close)} closest measured runs", str)})


def book_setup_replay(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs``' request streams replayed on the book's setup instead of their own: the book's cost model
    (:data:`BOOK_SCENE`), vLLM's default knobs for its GPU and the KV pool vLLM gives it. Same columns as
    :func:`batchlab.validate.replay_all` (its ``measured_ms`` are still the run's). Used in chapter 13."""
    book = book_setup()
    cost = book["cost"]
    return replay_all(runs, cost=lambda run: cost, max_num_seqs=book["max_num_seqs"],
                      max_num_batched_tokens=book["max_num_batched_tokens"], num_kv_blocks=cost.kv_pool_blocks(),
                      max_model_len=cost.model.max_position_embeddings)


def setup_frame(served: pd.DataFrame, book: pd.DataFrame) -> pd.DataFrame:
    """Per closest run and metric: measured, predicted as the run was served, and predicted on the book's setup.

    ``served`` is :func:`batchlab.validate.replay_all` of the runs, ``book`` :func:`book_setup_replay` of the
    same runs. Columns ``run_id``, ``metric``, ``status`` ("ok" or "overloaded"), ``measured_ms``,
    ``predicted_ms``, ``rel_error`` (NaN for an overloaded run: its means describe the client),
    ``book_ms``, ``book_overloaded`` (whether the book's setup falls behind on that traffic too) and
    ``hit_rate`` (prompt tokens found in the prefix cache, simulated). Used in chapter 13.
    """
    key = ["run_id", "metric"]
    out = served[[*key, "status", "measured_ms", "predicted_ms", "rel_error", "prefix_cache_hit_rate"]].merge(
        book[[*key, "predicted_ms", "overloaded"]].rename(columns={"predicted_ms": "book_ms",
                                                                   "overloaded": "book_overloaded"}), on=key)
    out.loc[out["status"] != "ok", "rel_error"] = np.nan
    return out.rename(columns={"prefix_cache_hit_rate": "hit_rate"})


def setup_error_table(frame: pd.DataFrame, close: pd.DataFrame):
    """:func:`setup_frame` as the page shows it (a ``Styler``): one row per run and metric, each time with its unit
    (:func:`batchlab.viz.format_duration`: ms below a second, seconds from there), the error in %. Used in
    chapter 13."""
    names = close.set_index("run_id")["load"]  # the setup is the same for all: the table beside it says which
    metric_names = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E latency"}
    rows = []
    for r in frame.itertuples(index=False):
        late = " (overloaded: the client gave up)" if r.status != "ok" else ""
        rows.append({"run": names[r.run_id] + late, "metric": metric_names[r.metric],
                     "measured": viz.format_duration(r.measured_ms), "predicted": viz.format_duration(r.predicted_ms),
                     "error": "–" if np.isnan(r.rel_error) else f"{r.rel_error:+.1%}",
                     "book": viz.format_duration(r.book_ms) + (" (falls behind)" if r.book_overloaded else "")})
    return viz.display_table(pd.DataFrame(rows), {
        "run": ("run (load, prompts)", str), "metric": ("mean of", str), "measured": ("measured", str),
        "predicted": ("predicted, as served", str), "error": ("error", str),
        "book": ("predicted, the book's setup", str)})


def setup_headline(frame: pd.DataFrame, close: pd.DataFrame) -> dict:
    """The numbers the setup section's prose quotes, by glue name: the runs (``close_runs``, ``close_ok``), the
    largest |error| per metric over the runs that kept up (``close_worst_<metric>``), the largest at their lightest
    and busiest rates (``close_light_worst``, ``close_busy_<metric>`` signed, ``close_busy_rate``), their knobs
    and KV per token, the least simulated prefix-cache hit rate (``close_hit_lo``), and the busiest run's TPOT
    as served and on the book's setup (ms). Used in chapter 13."""
    ok = frame[frame["status"] == "ok"]
    rate = ok["run_id"].map(close.set_index("run_id")["rate_req_s"])
    busy = ok[rate == rate.max()].set_index("metric")
    out = {"close_runs": int(close["run_id"].nunique()), "close_ok": int(ok["run_id"].nunique()),
           "close_light_worst": float(ok.loc[rate < rate.max(), "rel_error"].abs().max()),
           "close_busy_rate": float(rate.max()), "close_hit_lo": float(ok["hit_rate"].min()),
           "close_seqs": int(close["max_num_seqs"].iloc[0]),
           "close_tokens": int(close["max_num_batched_tokens"].iloc[0]),
           "close_kv_kib": float(close["kv_kib_per_token"].iloc[0]),
           "close_busy_tpot_ms": float(busy.loc["tpot", "predicted_ms"]),
           "book_busy_tpot_ms": float(busy.loc["tpot", "book_ms"]),
           "book_keeps_up": bool(not frame["book_overloaded"].any())}
    for metric in ("ttft", "tpot", "e2e"):
        out[f"close_worst_{metric}"] = float(ok.loc[ok["metric"] == metric, "rel_error"].abs().max())
        out[f"close_busy_{metric}"] = float(busy.loc[metric, "rel_error"])
    return out


def overloaded_names(per_run: pd.DataFrame) -> str:
    """The overloaded runs of :func:`batchlab.validate.replay_all` (one row per run) in words, "the 4 req/s stages of
    Llama-2-7B, Llama-2-70B and CodeLlama-34B's reasoning runs" when their rate and prompts agree, each run by
    :func:`run_text` otherwise. Used in chapter 13, which leaves these runs out of its scores."""
    late = per_run[per_run["status"] == "overloaded"]
    if late.empty:
        return "none"
    runs = calibration_runs().set_index("run_id").loc[late["run_id"]].reset_index()
    models = [viz.MODEL_NAMES.get(m, m) for m in runs["model"]]
    rates = runs["rate_req_s"].to_numpy(dtype=float)
    profiles = {_profile(run) for _, run in runs.iterrows()}
    if (runs["set"] == "inference-perf").all() and np.allclose(rates, rates[0]) and len(profiles) == 1:
        return f"the {rates[0]:g} req/s stages of {_join(models)}'s {profiles.pop()} runs"
    return _join([run_text(run) for _, run in runs.iterrows()])


def _join(names: list) -> str:
    """Names as a reader lists them: "a", "a and b", "a, b and c"."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def ttft_misses(headline: dict, target: float) -> str:
    """The subsets whose median TTFT error misses ``target`` while the pooled median may not, as a clause the page
    appends to :func:`within_sentence`'s ("; TTFT misses it on the closed-loop sweeps (15.5%) and on Qwen3-32B
    (36.7%)"), or that none does. ``headline``: :func:`e2e_headline`'s numbers. Used in chapter 13."""
    parts = {"the open-loop stages": headline["e2e_ip_ttft"], "the closed-loop sweeps": headline["e2e_ac_ttft"],
             "InferenceX's Llama-3.1-70B": headline["e2e_ttft_70b"], "Qwen3-32B": headline["e2e_ttft_qwen"]}
    missed = [f"on {name} ({value:.1%})" for name, value in parts.items() if value > target]
    if not missed:
        return "; no set or model misses it on TTFT"
    return "; by set and model, TTFT misses it " + _join(missed)


def within_sentence(medians: dict, target: float) -> str:
    """How the end-to-end medians read against the target, in words that follow from the numbers: the metrics
    within ``target`` and, if any, those not yet (a clause the page completes: "against today's vLLM, its ...").
    ``medians``: metric (``ttft``, ``tpot``, ``e2e``) -> median |error|. Used in chapter 13."""
    words = {"tpot": "token times", "e2e": "end-to-end latencies", "ttft": "times to first token"}
    inside = [words[m] for m in words if medians[m] <= target]
    outside = [words[m] for m in words if medians[m] > target]


    band = f"{target:.0%}"
    if not outside:
        return f"{_join(inside)} all land within {band} in the median"
    if not inside:
        return f"{_join(outside)} all miss {band} in the median"
    return f"{_join(inside)} land within {band} in the median, {_join(outside)} not yet"
