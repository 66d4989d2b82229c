"""Chapter 12, the cheat sheet: the book's advice as one index, symptom -> knob -> effect -> its number -> its chart.

Every number comes from the facts layer (:mod:`batchlab.chapters.facts`), printed as the chapter that shows it in
full prints it, so the sheet says what those chapters say and moves with them; every row links to the chart that
shows the effect, at a label of that chapter. :data:`ROWS` holds the advice, :func:`cheat_sheet` the table,
:func:`styled` the page's rendering.
"""
from __future__ import annotations

import html
import re
from typing import NamedTuple

import pandas as pd

from .. import get_hardware, vllm_defaults
from . import facts, link, scenes


class Row(NamedTuple):
    """One line of advice: what a reader sees, what to turn, what happens, the number and where it is shown.

    Every fact of a row comes from one scene (a cost-model scene of the same model and GPU as the row's traffic
    scene counts as that scene: its numbers hold there), so the setting cell names one setting, or ``setting``
    says in words what the row's numbers hold for.
    """

    symptom: str
    knob: str
    effect: str
    number: str  # a template: {fact_name} is replaced by the fact as its chapter prints it
    where: tuple  # (chapter slug, label on its page), the first the main one
    setting: str = ""  # the setting cell in words, for a row whose numbers are not one scene's (vLLM's code)


ROWS = (
    Row("throughput far below the GPU's: requests wait in lockstep batches", "iteration-level (continuous) batching",
        "a finished sequence's slot refills at the next iteration",
        "every request queued at once: {orca_capacity_req_s} with whole-prompt (Orca) iteration-level batching "
        "against {lockstep_capacity_req_s} with lockstep batches of 32",
        (("dynamic_batching", "dynamic-capacity"),)),
    Row("static batches compute padding, and finished rows wait for the longest output",
        "iteration-level (continuous) batching", "no padding; a finished row's slot is reused at once",
        "lockstep batches of 32 at output CV 1: {pad_cv1} of the token slots are padding, and {half_empty_cv1} of "
        "the batches' time passes with half their rows or more finished",
        (("static_batching", "static-padding"),)),
    Row("at low load, requests wait for a batch to fill", "a max queue delay (dynamic batching), or iteration-level "
        "batching", "latency at low load falls; at high load nothing changes",
        "mean end-to-end latency at {low_load_req_s}: {low_e2el_static_s} static, {low_e2el_dynamic_s} dynamic "
        "(a {dynamic_timer_ms} timer), {low_e2el_orca_s} iteration-level",
        (("dynamic_batching", "dynamic-delay"),)),
    Row("the decode step barely grows with the batch: the GPU is underused", "raise max_num_seqs",
        "more tokens per step, each sequence for a fraction of a step, up to the knee",
        "pure roofline: with no cache the step stays at {weight_stream_ms} up to the ridge, {ridge} "
        "({ridge_calibrated:bare} on the calibrated model); with a cache it grows from the first sequence and has "
        "doubled at the knee, {knee_1024} at 1,024 tokens of context, {knee_4096:bare} at 4,096",
        (("step_time_roofline", "roofline-chart"),)),
    Row("every decoding sequence stalls when a long prompt arrives", "chunked prefill: lower max_num_batched_tokens",
        "the stall shrinks; the newcomer's first token comes later",
        "an 8,000-token prompt beside {spike_decoders} decoding: tallest gap {spike_gap_ms} unchunked, "
        "{chunk_2048_gap_ms} at 2,048 tokens, {chunk_512_gap_ms} at 512; its TTFT {chunk_off_ttft_ms}, "
        "{chunk_2048_ttft_ms} and {chunk_512_ttft_ms}",
        (("chunked_prefill", "chunking-hyperbola"), ("prefill_spike", "spike-chart"))),
    Row("decoding stops while prompts are prefilled (prefill-only steps)",
        "mix prompt chunks into decode steps (vLLM V1's default)",
        "a far lower tail inter-token latency and a few per cent more throughput",
        "at {rate_over_req_s}, in one synchronous loop: p99 ITL {mix_sync_p99_itl_ms:bare} against "
        "{mix_v0_p99_itl_ms}, output {mix_sync_tput:bare} against {mix_v0_tput}; with async scheduling "
        "{mix_v1_p99_itl_ms} and {mix_v1_tput}",
        (("piggybacking", "piggyback-mixing"),)),
    Row("p99 TTFT high near capacity", "raise max_num_seqs until p99 TTFT stops improving",
        "shorter queues; past the plateau, nothing",
        "at {rate_near_req_s} p99 TTFT stops improving at {knobs_plateau_seqs}",
        (("two_knobs", "two-knobs-frontier"),)),
    Row("long stalls between tokens under load, with vLLM's defaults",
        "lower max_num_batched_tokens; tune with an itl bound on the longest gap",
        "shorter iterations for everyone decoding, at a p99 TTFT within a few per cent of the default's",
        "at {rate_near_req_s}: {knobs_pick_max_num_batched_tokens} give a p99 ITL (over all token gaps) of "
        "{knobs_pick_p99_itl_ms} against the default's {knobs_default_p99_itl_ms}, p99 TTFT "
        "{knobs_pick_p99_ttft_ms} against {knobs_default_p99_ttft_ms}; per request, the p99 of each one's longest "
        "gap is {tuning_itl_pick_p99_longest_ms} against {tuning_default_p99_longest_ms}, and with that gap bound at "
        "{tuning_itl_bound_ms}, goodput {tuning_itl_pick_goodput_req_s} against {tuning_itl_default_goodput_req_s}",
        (("two_knobs", "two-knobs-itl"), ("tuning", "tuning-map"))),
    Row("fewer sequences run than max_num_seqs allows; preemptions",
        "KV memory (gpu_memory_utilization, an FP8 KV cache, more GPUs), not max_num_seqs",
        "more sequences fit; raising the cap does nothing",
        "overloaded at {rate_over_req_s}: at most {over_peak_running:bare} of {vllm_default_max_num_seqs} run, "
        "{over_preemptions}; the pool holds {kv_pool_tokens}",
        (("two_knobs", "two-knobs-kv"),)),
    Row("settings copied from another GPU or launcher behave differently", "read vLLM's defaults on this GPU",
        "they follow the GPU and the launcher, not the model",
        "H100 and H200: max_num_seqs {vllm_default_max_num_seqs:bare}, max_num_batched_tokens "
        "{vllm_default_max_num_batched_tokens:bare} (vllm serve) or {vllm_offline_max_num_batched_tokens:bare} "
        "(offline); A100 80GB: max_num_seqs {a100_seqs}",
        (("two_knobs", "two-knobs-defaults"),), setting="vLLM's code, any model"),
    Row("a long prompt's first token is slow even on an idle GPU",
        "nothing in the scheduler: the prompt's FLOPs set it (prefix caching, a smaller model, more GPUs)",
        "chunking spreads the prefill over steps; it cannot shorten it",
        "8,000 tokens: {prefill8_ideal_ms} at the full BF16 peak, {prefill8_ms} calibrated",
        (("prefill_spike", "spike-arithmetic"),)),
    Row("a 70B model on one GPU: a long prompt takes more than half a second alone",
        "more GPUs (tensor parallelism) or prefix caching; no token budget shortens a prefill",
        "the prompt's FLOPs are the floor of its first token",
        "8,000 tokens: at least {prefill70_ideal_ms} at the full FP8 peak; the article's 400 ms would need "
        "{mfu400_70} of that peak",
        (("prefill_spike", "spike-arithmetic"),)),
    Row("prompts repeat a long system prompt or a conversation's history",
        "prefix caching (on by default) and a KV pool that holds the prefixes",
        "the first token comes sooner; a full server completes more",
        "shared system prompts: median TTFT {prefix_sp_ttft_factor} times lower, a full server's throughput "
        "{prefix_sp_throughput_factor} times higher; Mooncake's trace: {prefix_moon_hit} of prompt tokens found "
        "at one H100's pool, of {prefix_moon_bound} that recur",
        (("prefix_caching", "prefix-pool"), ("prefix_caching", "prefix-gain"))),
    Row("several GPUs: replicas or prefill and decode apart?",
        "replicas with chunked prefill; a prefill/decode split only for a tight TPOT bound on prompt-heavy traffic",
        "every GPU busy with both kinds of work; a split strands GPUs unless the traffic's mix matches it",
        "colocated replicas win {disagg_colocated_cells} and tie {disagg_tie_cells} of {disagg_cells} cells; a split "
        "serves {disagg_code_tight_gain} times the goodput per GPU on code under {disagg_tight_slo}",
        (("disaggregation", "disagg-goodput"),)),
    Row("replicas behind a router, and shared prefixes outgrow one replica's KV pool", "prefix-aware routing",
        "each request lands on the replica that holds its prefix",
        "shared system prompts: median TTFT {disagg_router_sp_ttft_factor} times lower than with round robin",
        (("disaggregation", "disagg-routing"),)),
    Row("which settings for my own traffic and SLO?", "bl.tune, or python -m batchlab tune with --goodput",
        "the pair with the most goodput under the SLO, and each pair's largest sustainable rate",
        "on conversation traffic under TTFT and TPOT bounds the best pair's goodput is {tuning_usual_gain_max} "
        "times the default's",
        (("tuning", "tuning-map"), ("tuning", "tuning-headroom"))),
)
COST_MODEL_SCENES = ("llama8", "llama70")  # scenes of the cost model alone, no traffic
COLUMNS = ["symptom", "knob", "effect", "number", "setting", "where"]
_FIELD = re.compile(r"\{([a-z0-9_]+)(:bare)?\}")  # {fact}: value and unit; {fact:bare}: the value alone
EXTRA = {"a100_seqs": lambda: str(vllm_defaults(get_hardware("a100-80gb"))["max_num_seqs"])}  # vLLM's rule


def fact_names(rows=ROWS) -> list[str]:
    """Every fact the sheet quotes, in order of first use."""
    names = []
    for row in rows:
        names += [n for n, _ in _FIELD.findall(row.number) if n not in names and n not in EXTRA]
    return names


def row_settings(row: Row) -> list[str]:
    """The scenes the row's facts come from, each once, as a table cell names them (or the row's own words).

    A cost-model scene (no traffic) of the same model, weight type and GPU as another scene of the row is that
    scene's cost model, so it is not named again.
    """
    if row.setting:
        return [row.setting]
    keys = []
    for name in fact_names([row]):
        if (key := facts.get(name).scene) not in keys:
            keys.append(key)
    found = [scenes.scene(k) for k in keys]
    shown = [s for s in found if s.name not in COST_MODEL_SCENES or not any(
        o is not s and (o.model, o.dtype, o.gpu) == (s.model, s.dtype, s.gpu) for o in found)]
    return [s.short or s.text for s in shown]


def _shown(name: str, bare: bool) -> str:
    if name in EXTRA:
        return EXTRA[name]()
    return facts.formatted(name) if bare else facts.rendered(name)


def _number(template: str) -> str:
    return _FIELD.sub(lambda m: _shown(m.group(1), bool(m.group(2))), template)


_NTH = ("a second", "a third", "a fourth")
WORDS = {("tuning", "tuning-headroom"): "its headroom table"}  # a second link that lands on a table, not a chart


def _links(where) -> list[str]:
    """One link per (chapter, label): "chapter N" for a chapter's first chart, "a second chart" for its next ones,
    so two charts of one chapter do not read "chapter 9, chapter 9"."""
    out, seen = [], {}
    for slug, label in where:
        n = seen.get(slug, 0)
        words = WORDS.get((slug, label), f"{_NTH[min(n, len(_NTH)) - 1]} chart")
        out.append(link(slug, label, None if n == 0 else words))
        seen[slug] = n + 1
    return out


def cheat_sheet(rows=ROWS, html_links: bool = True) -> pd.DataFrame:
    """The sheet: one row per piece of advice, columns :data:`COLUMNS`.

    ``number`` is the row's measurement with every fact printed as its chapter prints it, ``setting`` the scenes its
    facts come from (the load is in the number), ``where`` the links to the charts that show it (HTML ``<a>`` to
    ``notebooks/NN_slug.html#label``; with ``html_links`` False, "slug#label"). Used in chapter 12.
    """
    out = []
    for row in rows:
        where = _links(row.where) if html_links else [f"{slug}#{label}" for slug, label in row.where]
        out.append({"symptom": row.symptom, "knob": row.knob, "effect": row.effect, "number": _number(row.number),
                    "setting": "; ".join(row_settings(row)), "where": ", ".join(where)})
    return pd.DataFrame(out, columns=COLUMNS)


def styled(sheet: pd.DataFrame):
    """The sheet as the page shows it, in four columns that fit the page's width: the symptom, the knob with what
    it does, the measured number with the setting it was measured in right under it, and the charts. Headers in
    words, left- and top-aligned, links live. Used in chapter 12."""
    shown = pd.DataFrame({
        "symptom": sheet["symptom"],
        "what to turn, and what it does": [f"{k}<br>&rarr; {e}" for k, e in zip(sheet["knob"], sheet["effect"])],
        "how much (measured), and in which setting": [
            f"{n}<br><small><em>setting:</em> {html.escape(s)}</small>" for n, s in zip(sheet["number"],
                                                                                    sheet["setting"])],
        "chart": sheet["where"]})
    return (shown.style.hide(axis="index").set_uuid("cheat-sheet")
            .set_properties(**{"text-align": "left", "vertical-align": "top", "padding": "0.3em 0.5em"})
            .set_table_styles([{"selector": "th", "props": "text-align: left; border-bottom: 2px solid #888"}]))


def roofline_rules(cost, contexts=(1024, 4096), prompt_tokens: int = scenes.PROMPT_TOKENS) -> pd.DataFrame:
    """The roofline numbers of the sheet for any cost model (its pure roofline): the knee at no context and at each
    of ``contexts``, the batch-1 decode step and the ``prompt_tokens`` prefill. Chapter 12's explore cell."""
    ideal = cost.ideal()
    return pd.DataFrame({"context (tokens)": [0, *contexts],
                         "knee (sequences)": [ideal.knee(0), *(ideal.knee(c) for c in contexts)]}).assign(
        **{"batch-1 decode (ms)": ideal.decode_step_time(1, 0) * 1e3,
           f"{prompt_tokens:,}-token prefill (ms)": ideal.prefill_time(prompt_tokens) * 1e3}).round(1)
