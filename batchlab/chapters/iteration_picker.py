"""Chapter 7's iteration picker: what one iteration of a run holds and where its time goes.

:func:`iteration_rows` replays a run's schedule into each iteration's rows (prompt chunks with their new and
cached tokens, decodes with their context), :func:`iteration_split` gives both sides of every roofline of one
iteration and :func:`iteration_apart` what its parts would cost as iterations of their own; :func:`picker_frames`
and :func:`iteration_chart` make the picker, a slider over consecutive iterations. :func:`step_kinds` names each
iteration decode, mixed or prefill. Re-exported by :mod:`batchlab.chapters.piggybacking`, whose notebook uses it.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from .. import viz

STEP_KINDS = ("decode", "mixed", "prefill")


def step_kinds(steps: pd.DataFrame) -> np.ndarray:
    """Kind of each iteration of ``steps`` (``SimResult.steps``: ``prefill_tokens``, ``decode_seqs``), one of
    :data:`STEP_KINDS`: "decode" (no prompt tokens), "prefill" (no decodes) or "mixed" (both). Used in chapter 7.
    """
    prefill, decode = steps["prefill_tokens"].to_numpy() > 0, steps["decode_seqs"].to_numpy() > 0
    return np.where(prefill & decode, "mixed", np.where(prefill, "prefill", "decode"))


def iteration_rows(res, last_step: int | None = None) -> pd.DataFrame:
    """The rows of every iteration of a run (up to ``last_step``): which request, prompt chunk or decode, its new
    and cached tokens. Used in chapter 7 (the iteration picker).

    Replays ``res.schedule`` (``simulate(..., record_schedule=True)``) in order. A request's cached tokens are
    what it has computed so far, prefix-cache hits found at admission included; a preemption drops them (the
    request recomputes). A prompt chunk samples a token when it completes what the request knows (its prompt,
    after a preemption with the output it had streamed); a decode always does. These are the pairs the engine
    timed: :func:`iteration_split` of one step's rows gives that step's duration.

    Returns
    -------
    DataFrame
        ``step``, ``request``, ``kind`` ("prefill" or "decode"), ``new_tokens``, ``cached_tokens`` (tokens of
        the request already in the KV cache; a decode's context) and ``samples`` (bool).
    """
    sched = res.schedule  # AttributeError, saying how to record it, if the run did not
    if last_step is not None:
        sched = sched[sched["step"] <= last_step]
    prompt = res.requests["prompt_tokens"].to_numpy()
    computed, emitted = np.zeros(prompt.size, np.int64), np.zeros(prompt.size, np.int64)
    keep, samples, cached = np.zeros(len(sched), bool), np.zeros(len(sched), bool), np.zeros(len(sched), np.int64)
    kinds, tokens = sched["kind"].astype(str).to_numpy(), sched["tokens"].to_numpy()
    for i, (req, kind) in enumerate(zip(sched["request"].to_numpy(), kinds)):
        if kind in ("cached", "preempt"):  # prefix hits found at admission; a preemption drops the KV cache
            computed[req] = computed[req] + tokens[i] if kind == "cached" else 0
            continue
        keep[i], cached[i] = True, computed[req]
        samples[i] = computed[req] + tokens[i] == prompt[req] + emitted[req]  # the row reaches its next token
        computed[req] += tokens[i]
        emitted[req] += samples[i]
    return pd.DataFrame({"step": sched["step"].to_numpy()[keep], "request": sched["request"].to_numpy()[keep],
                         "kind": kinds[keep], "new_tokens": tokens[keep], "cached_tokens": cached[keep],
                         "samples": samples[keep]})


def _breakdown(cost, rows: pd.DataFrame, asynchronous: bool):
    chunks = rows[rows["kind"] == "prefill"]
    return cost.step_breakdown(list(zip(chunks["new_tokens"], chunks["cached_tokens"])),
                               rows.loc[rows["kind"] == "decode", "cached_tokens"].tolist(),
                               sampled_chunks=int(chunks["samples"].sum()), asynchronous=asynchronous)


def iteration_split(cost, rows: pd.DataFrame, asynchronous: bool = True) -> dict:
    """Where one iteration's time goes, with both sides of every roofline (seconds). Used in chapter 7.

    ``rows`` are one step's rows (:func:`iteration_rows`). Each operator takes the longer of its math and its
    memory traffic (:mod:`batchlab.cost`); this gives both: ``gemm_compute_s`` (2 P' T FLOPs at eta_c F) and
    ``gemm_memory_s`` (streaming the body's weights at the calibrated bandwidth), the same pair for the LM head
    (``lm_head_*``, zero if no row samples), ``attn_compute_s`` and ``attn_memory_s`` (reading the cached keys
    and values, writing the new ones), then ``elementwise_s``, ``comm_s``, ``overhead_s`` (the GPU's kernel
    floors), ``cpu_s`` (the engine's CPU work left after async overlap), its two parts ``cpu_step_s`` (the work
    per iteration, a fixed cost) and ``cpu_seq_s`` (the work per scheduled sequence), and ``total_s``, the step's
    duration. Async scheduling hides the same fraction of both parts, so ``cpu_s`` splits in proportion.
    """
    b = _breakdown(cost, rows, asynchronous)
    m, bw, tp = cost.model, cost.eta_memory * cost.hardware.hbm_bytes_per_s, cost.tp
    chunks, decodes = rows[rows["kind"] == "prefill"], rows[rows["kind"] == "decode"]
    new = int(chunks["new_tokens"].sum()) + len(decodes)
    c, p = chunks["new_tokens"].to_numpy(float), chunks["cached_tokens"].to_numpy(float)
    attn_work = float((c * (2 * p + c)).sum() + 2 * decodes["cached_tokens"].sum())
    sampled = int(rows["samples"].sum())
    per_seq = cost.cpu_seq_s * len(rows)  # every scheduled row is one sequence of the step
    step_share = cost.cpu_step_s / (cost.cpu_step_s + per_seq) if cost.cpu_step_s + per_seq > 0 else 0.0
    lm = (2.0 * m.embedding_params / tp * sampled / (cost.eta_compute * cost.hardware.peak_flops("bf16")),
          cost.lm_head_bytes / bw) if sampled else (0.0, 0.0)
    return {"gemm_compute_s": 2.0 * m.body_params / tp * new / (cost.eta_compute * cost.peak_flops),
            "gemm_memory_s": (cost.streamed_weight_bytes - cost.lm_head_bytes) / bw,
            "lm_head_compute_s": lm[0], "lm_head_memory_s": lm[1],
            "attn_compute_s": 2.0 * m.layers * m.attn_dim / tp * attn_work / (cost.eta_attn * cost.peak_flops),
            "attn_memory_s": cost.kv_bytes_per_token * (p.sum() + decodes["cached_tokens"].sum() + new) / bw,
            "elementwise_s": b.elementwise_s, "comm_s": b.comm_s, "overhead_s": b.overhead_s, "cpu_s": b.cpu_s,
            "cpu_step_s": b.cpu_s * step_share, "cpu_seq_s": b.cpu_s * (1 - step_share), "total_s": b.total_s}


def iteration_apart(cost, rows: pd.DataFrame, asynchronous: bool = True) -> dict:
    """What one iteration's decodes and prompt chunks would take as two iterations of their own, and what mixing
    them saves, by part (seconds). Used in chapter 7.

    Returns ``decodes_s`` and ``prompts_s`` (0 for a part the step does not hold), ``saved_s`` (their sum less the
    step; 0 unless it holds both) and its parts: ``saved_weights_s`` (GEMMs and LM head: one weight stream fewer,
    less the decode rows' own FLOPs), ``saved_attention_s`` (the prompt's attention math beside the decodes' KV
    traffic) and ``saved_fixed_s`` (one fixed step cost fewer: kernel floors and CPU work; norms and all-reduces,
    linear in the tokens, save nothing).
    """
    parts = [iteration_split(cost, rows[rows["kind"] == kind], asynchronous) if (rows["kind"] == kind).any()
             else None for kind in ("decode", "prefill")]
    out = {"decodes_s": parts[0]["total_s"] if parts[0] else 0.0, "prompts_s": parts[1]["total_s"] if parts[1] else 0.0}
    if not all(parts):
        return {**out, "saved_s": 0.0, "saved_weights_s": 0.0, "saved_attention_s": 0.0, "saved_fixed_s": 0.0}
    whole = iteration_split(cost, rows, asynchronous)

    def paid(split, *ops):  # each operator costs the longer of its math and its memory traffic
        return sum(max(split[f"{op}_compute_s"], split[f"{op}_memory_s"]) for op in ops)

    part = {"saved_s": lambda x: x["total_s"], "saved_weights_s": lambda x: paid(x, "gemm", "lm_head"),
            "saved_attention_s": lambda x: paid(x, "attn"),
            "saved_fixed_s": lambda x: x["overhead_s"] + x["cpu_s"] + x["elementwise_s"] + x["comm_s"]}
    return {**out, **{k: fn(parts[0]) + fn(parts[1]) - fn(whole) for k, fn in part.items()}}


SPLIT_BARS = (  # operator, resource, iteration_split key: the bars of the time split, in order
    ("weight GEMMs", "compute (tensor cores)", "gemm_compute_s"), ("weight GEMMs", "memory (HBM)", "gemm_memory_s"),
    ("LM head", "compute (tensor cores)", "lm_head_compute_s"), ("LM head", "memory (HBM)", "lm_head_memory_s"),
    ("attention", "compute (tensor cores)", "attn_compute_s"), ("attention", "memory (HBM)", "attn_memory_s"),
    ("norms, RoPE, SiLU", "memory (HBM)", "elementwise_s"), ("GPU kernel floors", "fixed", "overhead_s"),
    ("CPU per iteration", "fixed", "cpu_step_s"), ("CPU per sequence", "CPU, per sequence", "cpu_seq_s"))
_KIND_WORDS = {"decode": "decodes only", "mixed": "mixed", "prefill": "prompts only"}
CONTEXT_BIN = 512  # tokens: the decode rows' contexts are counted in bins this wide
_PART_WORDS = {"cached": "cached before this iteration", "new": "computed in this iteration"}


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def picker_frames(cost, res, first_step: int, n_steps: int) -> dict:
    """What :func:`iteration_chart` shows of ``n_steps`` iterations of a run from ``first_step``. Chapter 7.

    Returns
    -------
    dict of DataFrame, each with ``position`` (0 .. n_steps - 1, the slider's value):
        ``iterations``: ``step``, ``start_s``, ``duration_s``, ``kind``, ``chunks``, ``prompt_tokens`` (new ones),
        ``decodes``, ``label`` (what the slider shows) and the keys of :func:`iteration_apart` (``decodes_s``,
        ``prompts_s``, ``saved_s``, ...); ``readout``: ``line`` and ``text``, four lines per iteration; ``chunks``
        (one row per bar): ``request``, ``row``, ``part`` ("cached" or "new") and ``part_words``, ``tokens`` (the
        bar's), ``new_tokens`` and ``cached_tokens`` (its chunk's), ``start``, ``end``, ``text``; ``decodes``:
        ``context_lo``,
        ``context_hi`` (tokens), ``decodes``; ``split``: ``operator``, ``resource``, ``ms``, ``paid`` (the
        longer side of its operator, what the step pays) and ``text``.
    """
    steps = res.steps.iloc[first_step:first_step + n_steps]
    if len(steps) < n_steps or first_step < 0:
        raise ValueError(f"first_step and n_steps must lie within the run's {len(res.steps)} iterations")
    rows = iteration_rows(res, steps.index[-1])
    asynchronous = bool(res.knobs.get("async_scheduling", False))
    kinds = dict(zip(steps.index, step_kinds(steps)))
    out = {k: [] for k in ("iterations", "readout", "chunks", "decodes", "split")}
    for pos, (step, one) in enumerate(rows[rows["step"] >= first_step].groupby("step")):
        split, apart = iteration_split(cost, one, asynchronous), iteration_apart(cost, one, asynchronous)
        chunks, contexts = one[one["kind"] == "prefill"], one.loc[one["kind"] == "decode", "cached_tokens"]
        new, saved, both = int(chunks["new_tokens"].sum()), apart["saved_s"], len(chunks) and len(contexts)
        out["iterations"].append({"position": pos, "step": step, "start_s": steps.loc[step, "start_s"],
                                  "duration_s": split["total_s"], "kind": kinds[step], "chunks": len(chunks),
                                  "prompt_tokens": new,
                                  "decodes": len(contexts), "label": f"{step:,} ({_KIND_WORDS[kinds[step]]})",
                                  **apart})
        rows_text = (f"{_plural(len(chunks), 'prompt chunk')} ({new:,} new tokens)" if len(chunks) else
                     "no prompt chunk") + f", {_plural(len(contexts), 'decode')}"
        took = {k: viz.format_duration(v, unit="s") for k, v in  # the book's one rule: "27.1 ms", "213 ms"
                (("total", split["total_s"]), ("decodes", apart["decodes_s"]), ("prompts", apart["prompts_s"]),
                 ("saved", saved))}
        lines = [f"iteration {step:,} at {steps.loc[step, 'start_s']:.2f} s: {took['total']}", rows_text,
                 f"apart: decodes {took['decodes']}, prompt chunks {took['prompts']}" if both
                 else f"{_KIND_WORDS[kinds[step]]}: nothing to mix", f"mixing saves {took['saved']}" if both else ""]
        out["readout"] += [{"position": pos, "line": i, "text": t} for i, t in enumerate(lines)]
        for row, (req, c, p) in enumerate(zip(chunks["request"], chunks["new_tokens"], chunks["cached_tokens"])):
            text = f"{c:,} new + {p:,} cached"
            out["chunks"] += [{"position": pos, "request": f"request {req:,}", "row": row, "part": part, "tokens": n,
                               "part_words": _PART_WORDS[part], "new_tokens": c, "cached_tokens": p,
                               "start": lo, "end": lo + n, "text": text}
                              for part, n, lo in (("cached", p, 0), ("new", c, p)) if n or part == "new"]
        counts = np.bincount(contexts.to_numpy() // CONTEXT_BIN)
        out["decodes"] += [{"position": pos, "context_lo": b * CONTEXT_BIN, "context_hi": (b + 1) * CONTEXT_BIN,
                            "decodes": int(n)} for b, n in enumerate(counts) if n]
        for op, resource, key in SPLIT_BARS:
            pair = [split[k] for o, _, k in SPLIT_BARS if o == op]
            if resource != "fixed" and split[key] == 0 and max(pair) == 0:
                continue  # an LM head that does not run
            out["split"].append({"position": pos, "operator": op, "resource": resource, "ms": split[key] * 1e3,
                                 "paid": resource == "fixed" or split[key] == max(pair),
                                 "text": f"{split[key] * 1e3:.1f}"})
    return {k: pd.DataFrame(v) for k, v in out.items()}


def busiest(frames: dict) -> int:
    """Position of the first iteration of :func:`picker_frames` that computes the most prompt tokens. Chapter 7."""
    it = frames["iterations"]
    return int(it["position"].iloc[int(np.argmax(it["prompt_tokens"].to_numpy()))])


def iteration_chart(frames: dict, position: int | None = None):
    """The iteration picker: a slider over the iterations of :func:`picker_frames`, and the chosen one's readout,
    prompt chunks, decode rows and time split. Used in chapter 7.

    ``position`` is the iteration shown first (default :func:`busiest`, the first that computes the most prompt
    tokens).

    Returns
    -------
    altair chart: four panels (readout; prompt chunks, cached then new tokens, one bar per request; decode rows
    counted by context; the time of each operator, compute and memory side by side, the side the step pays
    opaque). The slider (parameter ``iteration``, the position) is labelled with the iteration's number and kind.
    """
    it = frames["iterations"]
    position = busiest(frames) if position is None else position
    param, at = viz.grid_param("iteration", it["position"], "iteration", field="position", value=position,
                               labels=it["label"].tolist())
    width = 440
    readout = alt.Chart(frames["readout"]).transform_filter(at).mark_text(
        align="left", baseline="top", fontSize=11, x=0).encode(
        y=alt.Y("line:O", axis=None), text="text:N",
        tooltip=[viz.tip("text", "this iteration", kind="N")]).properties(width=width, height=70)
    parts = alt.Scale(domain=["cached", "new"], range=[viz.PALETTE[5], viz.PALETTE[3]])
    span = float(frames["chunks"]["end"].max() * 1.45) if len(frames["chunks"]) else 1.0
    chunk_tips = [viz.tip("request", "prompt chunk of", kind="N"), viz.tip("part_words", "this bar", kind="N"),
                  viz.tip("tokens", "tokens in this bar (tokens)", ",d"),
                  viz.tip("new_tokens", "new tokens of the chunk (tokens)", ",d"),
                  viz.tip("cached_tokens", "its prompt's tokens already cached (tokens)", ",d")]
    chunks = alt.Chart(frames["chunks"]).transform_filter(at)
    y = alt.Y("request:N", title=None, sort=alt.EncodingSortField("row"), axis=alt.Axis(labelLimit=0))
    title = "prompt tokens: cached before, new in this iteration"
    x = alt.X("start:Q", title=title,
              scale=alt.Scale(domain=[0, span]), axis=alt.Axis(format=",d", tickCount=5))
    bars = chunks.mark_bar(height=14).encode(
        x=x, x2="end:Q", y=y, tooltip=chunk_tips,
        color=alt.Color("part:N", title=None, scale=parts, legend=alt.Legend(orient="top")))
    labels = chunks.transform_filter("datum.part == 'new'").mark_text(align="left", dx=4, fontSize=11).encode(
        x=alt.X("end:Q", title=title, scale=alt.Scale(domain=[0, span]), axis=alt.Axis(format=",d", tickCount=5)),
        y=y, text="text:N", tooltip=chunk_tips)
    none = alt.Chart(it).transform_filter(f"{at} && datum.chunks == 0").mark_text(
        fontSize=12, color="#555555", align="left").encode(x=alt.value(8), y=alt.value(45),
                                             text=alt.value("no prompt chunk in this iteration"),
                                             tooltip=[viz.tip("decodes", "decode rows (sequences)", ",d")])
    top = float(frames["decodes"]["decodes"].max() * 1.1) if len(frames["decodes"]) else 1.0
    hi = int(np.ceil(frames["decodes"]["context_hi"].max() / 2048) * 2048) if len(frames["decodes"]) else 2048
    decodes = alt.Chart(frames["decodes"]).transform_filter(at).mark_bar(color=viz.PALETTE[0]).encode(
        x=alt.X("context_lo:Q", title="decode rows by context (tokens)", bin="binned",
                scale=alt.Scale(domain=[0, hi]), axis=alt.Axis(format=",d", values=list(range(0, hi + 1, 2048)))),
        x2="context_hi:Q", y=alt.Y("decodes:Q", title="decode rows (sequences)", scale=alt.Scale(domain=[0, top])),
        tooltip=[viz.tip("context_lo", "context from (tokens)", ",d"),
                 viz.tip("context_hi", "context up to (tokens)", ",d"),
                 viz.tip("decodes", "decode rows with this context (sequences)", ",d")])
    decodes = decodes.properties(width=width, height=90)
    return alt.vconcat(readout, alt.layer(bars, labels, none).properties(width=width, height=90), decodes,
                       _split_panel(frames["split"], at, width)).add_params(param).resolve_scale(
        color="independent").properties(usermeta={"narrow": {"width": 250}})  # room for the rows' labels


def _split_panel(split: pd.DataFrame, at: str, width: int):
    """Lower panel of :func:`iteration_chart`: each operator's compute and memory time, the paid side opaque."""
    resources = alt.Scale(domain=["compute (tensor cores)", "memory (HBM)", "CPU, per sequence", "fixed"],
                          range=[viz.PALETTE[1], viz.PALETTE[0], viz.PALETTE[4], "#999999"])
    tips = [viz.tip("operator", "operator", kind="N"), viz.tip("resource", "resource", kind="N"),
            viz.tip("ms", "time (ms)", ".2f"), viz.tip("paid_text", "the step pays it", kind="N")]
    base = alt.Chart(split).transform_filter(at).transform_calculate(
        paid_text="datum.paid ? 'yes' : 'no: the other side takes longer'",
        slot="datum.resource == 'compute (tensor cores)' ? 0 : 1").encode(  # compute above, memory or fixed below
        y=alt.Y("operator:N", title=None, sort=list(dict.fromkeys(op for op, _, _ in SPLIT_BARS)),
                axis=alt.Axis(labelLimit=0)),  # the two slots named, not read off each layer (Vega-Lite would warn
        yOffset=alt.YOffset("slot:O", scale=alt.Scale(domain=[0, 1])), tooltip=tips)  # of conflicting sorts)
    x = alt.X("ms:Q", title="time in this iteration (ms)", scale=alt.Scale(domain=[0, float(split["ms"].max() * 1.2)]))
    bars = base.mark_bar().encode(x=x, color=alt.Color("resource:N", title=None, scale=resources,
                                                       legend=alt.Legend(orient="top", labelLimit=0)),
                                  opacity=alt.condition("datum.paid", alt.value(1.0), alt.value(0.3)))
    text = base.mark_text(align="left", dx=3, fontSize=10).encode(x=x, text="text:N")
    return alt.layer(bars, text).properties(width=width, height=210)
