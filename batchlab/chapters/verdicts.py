"""One verdict per claim of the article, computed once: every chapter that states a verdict reads it from here.

:func:`claim_numbers` recomputes the numbers each verdict rests on (cost model, vLLM's default rule, the
shared scene and one near-capacity sweep of the two knobs), :func:`claim_table` turns them into one row per
claim (what the article says, the model and GPU the verdict is about, the verdict, the numbers), and
:func:`verdict` gives the one string a chapter glues. Used in chapters 05, 12 and 14; the tests check that the
three notebooks glue these strings and spell no verdict of their own.
"""
from __future__ import annotations

import functools
import math

import pandas as pd

from .. import CostModel, get_hardware, get_model, hardware_names, viz, vllm_defaults
from . import fact_check, facts, scenes, two_knobs

HOLDS, CONDITIONAL, FAILS = "holds", "holds under stated conditions", "does not hold"
CATEGORIES = (HOLDS, CONDITIONAL, FAILS)
GPU_NAME = {"h100-sxm": "one H100 SXM", "h100-pcie": "one H100 PCIe", "h200": "one H200",
            "a100-80gb": "one A100 80GB"}
SMALL, LARGE = "llama-3-8b", "llama-3-70b"  # the article's "8B model" and its "70 GB of weights" (70B in FP8)
CONTEXTS = (1024, 4096)  # tokens of KV cache per sequence for the knee claim
KV_CONTEXT_SMALL = 128  # a short context, at which the article's knee has already moved right
BUDGETS = (512, 1024, 2048, 4096, 8192)  # max_num_batched_tokens swept on the shared scene
ARTICLE = {"knee": 295, "weights_gb": 70, "cadence_ms": 20, "gap_ms": 400, "seqs_small": 1024, "seqs_large": 256}
WORKLOAD, N_REQUESTS, NEAR = "azure-conv-2023", 3000, 0.95  # chapter 08's trace, requests, near-capacity load
KNOB_SEQS, KNOB_TOKENS = (256, 1024), (1024, 2048, 4096, 8192, 16384)  # the part of chapter 08's grid checked
CAPS_BUDGET = 2048  # max_num_batched_tokens of the run that shows what the budget caps


def compute_knee(cost, context: float = 0.0) -> float:
    """The article's knee: the batch at which the GEMMs' time passes the time to stream the weights plus the KV.

    A step streams W bytes of weights and, per sequence, ℓ·k bytes of KV; its GEMMs take as long as streaming
    the weights at the ridge point R (:meth:`batchlab.CostModel.knee` at no context). So the knee is
    R / (1 − ℓ·k·R / W): it moves right as ℓ grows, and there is none (``inf``) once a sequence's KV takes
    longer to read than its FLOPs to compute. Sequences.
    """
    ridge = cost.knee(0)
    left = 1 - context * cost.kv_bytes_per_token * ridge / cost.streamed_weight_bytes
    return math.inf if left <= 0 else ridge / left


def knee_vanishes_at(cost) -> float:
    """Tokens of context per sequence beyond which :func:`compute_knee` has no knee: W / (k·R)."""
    return cost.streamed_weight_bytes / (cost.kv_bytes_per_token * cost.knee(0))


def attention_share(cost, prompt_tokens: int) -> dict:
    """The causal attention's share of one whole prefill's FLOP, and the length where it equals the GEMMs'.

    Attention is 2·L·d·N² (d = heads × head size), the GEMMs 2·P′·N, so the two are equal at N = P′ / (L·d).
    Returns ``share`` (0-1), ``flops`` (FLOP) and ``crossover_tokens``.
    """
    m = cost.model
    attn = 2 * m.layers * m.attn_dim * prompt_tokens**2
    flops = cost.ideal().step_breakdown(prefill_chunks=[(prompt_tokens, 0)]).flops
    return {"share": attn / flops, "flops": flops, "crossover_tokens": m.body_params / (m.layers * m.attn_dim)}


def budget_caps(cost, max_num_batched_tokens: int = CAPS_BUDGET) -> dict:
    """What the token budget caps, read from the steps of the shared scene under ``chunked``.

    Returns ``most_tokens`` (the largest prefill + decode tokens of any step), ``most_prefill`` (the largest
    prefill tokens of any step) and ``decodes`` (the decode tokens of the step with the most prefill tokens).
    """
    steps = scenes.run(cost, "chunked", max_num_batched_tokens=max_num_batched_tokens).res.steps
    total = steps["prefill_tokens"] + steps["decode_seqs"]
    busiest = steps.loc[steps["prefill_tokens"].idxmax()]
    return {"budget": max_num_batched_tokens, "most_tokens": int(total.max()),
            "most_prefill": int(busiest["prefill_tokens"]), "decodes": int(busiest["decode_seqs"])}


def fixed_step_cost(cost, prompt_tokens: int, max_num_batched_tokens: int) -> dict:
    """A prompt prefilled alone in chunks of ``max_num_batched_tokens``: its steps, time and fixed per-step cost.

    The fixed cost is what the cost model charges every step whatever it holds: the kernel floors
    (``overhead_s``) and the engine's CPU work per step (``cpu_step_s``). Seconds.
    """
    chunks = [(min(max_num_batched_tokens, prompt_tokens - p), p) for p in range(0, prompt_tokens,
                                                                                  max_num_batched_tokens)]
    total = sum(cost.step_time(prefill_chunks=[c], asynchronous=False) for c in chunks)
    fixed = len(chunks) * (cost.overhead_s + cost.cpu_step_s)
    return {"budget": max_num_batched_tokens, "steps": len(chunks), "total_s": total, "fixed_s": fixed,
            "fixed_share": fixed / total}


def both_better(sweep: pd.DataFrame, defaults: dict) -> pd.DataFrame:
    """The accepted pairs of a two-knob sweep that beat vLLM's default pair on p99 TTFT and on p99 ITL at once."""
    at = sweep.set_index(["max_num_seqs", "max_num_batched_tokens"])
    base = at.loc[(defaults["max_num_seqs"], defaults["max_num_batched_tokens"])]
    wins = at[(at["p99_ttft_ms"] < base["p99_ttft_ms"]) & (at["p99_itl_ms"] < base["p99_itl_ms"]) & ~at["vllm_refuses"]]
    return wins.reset_index().assign(default_p99_ttft_ms=base["p99_ttft_ms"], default_p99_itl_ms=base["p99_itl_ms"])


def _costs(gpu: str):
    hw = get_hardware(gpu)
    return hw, CostModel(hw, get_model(SMALL)), CostModel(hw, get_model(LARGE), dtype="fp8")


@functools.lru_cache(maxsize=4)
def claim_numbers(gpu: str = "h100-sxm") -> dict:
    """Every number the verdicts rest on, for Llama-3-8B BF16 and Llama-3-70B FP8 on ``gpu``. Seconds, bytes,
    sequences, tokens and shares (0-1); ``trade`` and ``wins`` are frames. Computed once per process."""
    hw, small, large = _costs(gpu)
    n = {"ridge": small.ideal().knee(), "ridge_calibrated": small.knee(),
         "compute_knee_128": compute_knee(small.ideal(), KV_CONTEXT_SMALL),
         "knee_vanishes_at": knee_vanishes_at(small.ideal()),
         **{f"floor_knee_{c}": small.ideal().knee(c) for c in CONTEXTS},
         "weights_fp8_gb": large.streamed_weight_bytes / 1e9, "floor_large_s": large.ideal().decode_step_time(1, 0)}
    n["decoders"] = decoders = scenes.default_decoders(small, scenes.CONTEXT)
    n["cadence_s"] = small.decode_step_time(decoders, scenes.CONTEXT - 1, asynchronous=False)
    n["gap_large_s"] = fact_check.prefill_gap(large.ideal(), scenes.PROMPT_TOKENS)["step_s"]
    n["gap_small_s"] = fact_check.prefill_gap(small, scenes.PROMPT_TOKENS, decoders, scenes.CONTEXT)["step_s"]
    n["mfu_large"] = fact_check.implied_mfu(large, scenes.PROMPT_TOKENS, ARTICLE["gap_ms"] / 1e3)
    n["mfu_small"] = fact_check.implied_mfu(small, scenes.PROMPT_TOKENS, ARTICLE["gap_ms"] / 1e3, decoders,
                                            scenes.CONTEXT)
    defaults = fact_check.max_num_seqs_table([get_hardware(g) for g in hardware_names()],
                                             [get_model(SMALL), get_model(LARGE)])
    n["seqs_large_here"] = int(defaults.set_index(["gpu", "model"]).loc[(gpu, LARGE), "max_num_seqs"])
    n["n_disagree"], n["n_pairs"] = int((~defaults["agrees"]).sum()), len(defaults)
    n["trade"] = fact_check.chunking_tradeoff(small, BUDGETS, n_decoders=decoders, context=scenes.CONTEXT,
                                              prompt_tokens=scenes.PROMPT_TOKENS)
    n["near_rate"] = near = round(NEAR * two_knobs.saturation_rate(small, WORKLOAD, N_REQUESTS, seed=0), 1)
    sweep = two_knobs.two_knob_sweep(small, WORKLOAD, [near], list(KNOB_SEQS), list(KNOB_TOKENS),
                                     n_requests=N_REQUESTS, seed=0)
    n["wins"] = both_better(sweep, vllm_defaults(hw))
    n["attention"] = attention_share(small, scenes.PROMPT_TOKENS)
    n["caps"] = budget_caps(small)
    n["fixed_small"] = fixed_step_cost(small, scenes.PROMPT_TOKENS, min(BUDGETS))
    n["fixed_large"] = fixed_step_cost(small, scenes.PROMPT_TOKENS, max(BUDGETS))
    return n


def _gpus_text() -> str:
    """Every GPU preset, as a reader lists them: "H100 SXM, H100 PCIe, H200 and A100 80GB"."""
    names = [GPU_NAME.get(g, g).removeprefix("one ") for g in hardware_names()]
    return ", ".join(names[:-1]) + " and " + names[-1]


def _rows(n: dict, gpu: str) -> list:
    """(id, the article's claim, scope: model and GPU, verdict, the numbers) for every claim."""
    on, trade, w = GPU_NAME.get(gpu, gpu), n["trade"], n["wins"]
    lo, hi = trade.iloc[0], trade.iloc[-1]
    knee_ok = abs(n["ridge"] / ARTICLE["knee"] - 1) < 0.01
    best = w.sort_values("p99_itl_ms", kind="stable").iloc[0] if len(w) else None  # best_pair()
    a, caps, f_lo, f_hi = n["attention"], n["caps"], n["fixed_small"], n["fixed_large"]
    # every duration as the book prints it (batchlab.viz.format_duration): "412 ms", "1.87 s"
    t = {k: viz.format_duration(n[k], unit="s") for k in ("floor_large_s", "cadence_s", "gap_small_s", "gap_large_s")}
    t |= {f"{k}_{end}": viz.format_duration(row[k], unit="s") for end, row in (("hi", hi), ("lo", lo))
          for k in ("itl_max_s", "ttft_s")}
    t["fixed_s"] = viz.format_duration(f_lo["fixed_s"], unit="s")
    if best is not None:
        t |= {k: viz.format_duration(best[k]) for k in ("p99_ttft_ms", "default_p99_ttft_ms", "p99_itl_ms",
                                                        "default_p99_itl_ms")}
    return [
        ("knee", f"the decode knee of an 8B model sits near batch {ARTICLE['knee']}", f"Llama-3-8B BF16, {on}",
         HOLDS if knee_ok else FAILS, f"ridge point F / BW = {n['ridge']:.1f} sequences"),
        ("kv_knee", "the KV cache drags that knee down", f"Llama-3-8B BF16, {on}, for the knee, where a decode "
         "step leaves its floor; not for the compute crossover, the article's own definition, which moves the "
         "other way",
         CONDITIONAL if n["compute_knee_128"] > n["ridge"] > n[f"floor_knee_{CONTEXTS[0]}"] else
         FAILS if n["compute_knee_128"] > n["ridge"] else HOLDS,
         f"the knee falls to {n[f'floor_knee_{CONTEXTS[0]}']:.1f} sequences at {CONTEXTS[0]:,} tokens of context "
         f"and {n[f'floor_knee_{CONTEXTS[1]}']:.1f} at {CONTEXTS[1]:,}; the compute crossover rises "
         f"({n['compute_knee_128']:.0f} sequences at {KV_CONTEXT_SMALL} tokens) and is gone past "
         f"{n['knee_vanishes_at']:.0f} tokens"),
        ("weights", f"{ARTICLE['weights_gb']} GB of weights stream every decode step", f"Llama-3-70B FP8, {on}",
         HOLDS if abs(n["weights_fp8_gb"] / ARTICLE["weights_gb"] - 1) < 0.02 else FAILS,
         f"{n['weights_fp8_gb']:.1f} GB streamed, {t['floor_large_s']} at full bandwidth"),
        ("cadence", f"decoding runs at a {ARTICLE['cadence_ms']} ms cadence",
         f"Llama-3-8B BF16 with a loaded batch, {on}; not Llama-3-70B FP8",
         CONDITIONAL if abs(n["cadence_s"] * 1e3 / ARTICLE["cadence_ms"] - 1) < 0.05
         and n["floor_large_s"] * 1e3 > ARTICLE["cadence_ms"] else FAILS,
         f"8B: {t['cadence_s']} with {n['decoders']} decoders at {scenes.CONTEXT:,} tokens; "
         f"70B FP8: at least {t['floor_large_s']} at batch 1"),
        ("gap", f"an unchunked {scenes.PROMPT_TOKENS:,}-token prefill is a {ARTICLE['gap_ms']} ms gap",
         f"the number, on {on}: Llama-3-8B BF16 at the {ARTICLE['cadence_ms']} ms cadence stalls "
         f"{t['gap_small_s']}, and Llama-3-70B FP8 cannot come under {t['gap_large_s']}; that the gap "
         "is the whole prefill holds",
         HOLDS if abs(n["gap_small_s"] * 1e3 / ARTICLE["gap_ms"] - 1) < 0.15 else FAILS,
         f"8B: {t['gap_small_s']} calibrated ({ARTICLE['gap_ms']} ms would mean {n['mfu_small']:.0%} MFU); "
         f"70B FP8: at least {t['gap_large_s']} at full FP8 peak ({n['mfu_large']:.0%} MFU needed)"),
        ("max_num_seqs", f"vLLM defaults max_num_seqs to {ARTICLE['seqs_small']:,} for small models and "
         f"{ARTICLE['seqs_large']} for large ones", f"any model, on {_gpus_text()}",
         FAILS if n["n_disagree"] else HOLDS,
         f"the default follows the GPU: Llama-3-70B gets {n['seqs_large_here']:,} on {on}; the rule is wrong for "
         f"{n['n_disagree']} of {n['n_pairs']} GPU and model pairs"),
        ("chunking", "chunking trades the decoders' ITL for the newcomer's TTFT; no budget improves both",
         f"Llama-3-8B BF16, {on}: one long prompt beside a steady batch, not a loaded server",
         CONDITIONAL if best is not None else HOLDS,
         f"one prompt: budget {int(hi['max_num_batched_tokens']):,} to {int(lo['max_num_batched_tokens'])} takes the "
         f"tallest gap from {t['itl_max_s_hi']} to {t['itl_max_s_lo']} and TTFT from {t['ttft_s_hi']} to "
         f"{t['ttft_s_lo']}" + ("" if best is None else
                                    f"; at {n['near_rate']} req/s ({int(best['max_num_seqs'])}, "
                                    f"{int(best['max_num_batched_tokens']):,}) beats the default on p99 TTFT "
                                    f"({t['p99_ttft_ms']} vs {t['default_p99_ttft_ms']}) and p99 "
                                    f"ITL ({t['p99_itl_ms']} vs {t['default_p99_itl_ms']})")),
        ("quadratic", "prefill cost is quadratic in prompt length",
         f"Llama-3-8B BF16 at {scenes.PROMPT_TOKENS:,} tokens, any GPU", FAILS if a["share"] < 0.5 else HOLDS,
         f"attention is {a['share']:.1%} of the prefill's FLOPs; it matches the linear GEMMs only at "
         f"{a['crossover_tokens']:,.0f} tokens"),
        ("budget_caps", "max_num_batched_tokens caps the prefill tokens of an iteration",
         f"vLLM's chunked scheduler, Llama-3-8B BF16, {on}; the cap counts decode tokens too, which take theirs "
         "first",
         # Prefill is capped, at the budget less the running decodes: the claim with a condition, not a miss.
         FAILS if caps["most_prefill"] > caps["budget"] or caps["most_tokens"] > caps["budget"]
         else CONDITIONAL if caps["decodes"] > 0 and caps["most_prefill"] == caps["budget"] - caps["decodes"]
         else HOLDS,
         f"budget {caps['budget']:,}: the fullest step holds {caps['most_prefill']:,} prefill tokens beside "
         f"{caps['decodes']} decode tokens, {caps['most_tokens']:,} in all"),
        ("launch_overhead", "a small budget with a high max_num_seqs means many tiny iterations and high launch "
         "overhead", f"Llama-3-8B BF16, {on}, with the budget at least max_num_seqs, as vLLM requires",
         CONDITIONAL if f_lo["fixed_share"] > 2 * f_hi["fixed_share"] else FAILS,
         f"vLLM refuses a budget below max_num_seqs; an {scenes.PROMPT_TOKENS:,}-token prompt takes "
         f"{f_lo['steps']} steps at {f_lo['budget']} tokens, paying the fixed step cost (kernel floors and CPU work) "
         f"{f_lo['steps']} times: {t['fixed_s']}, {f_lo['fixed_share']:.0%} of its prefill, against "
         f"{f_hi['fixed_share']:.0%} in {f_hi['steps']} step at {f_hi['budget']:,}"),
    ]


@functools.lru_cache(maxsize=4)
def claim_table(gpu: str = "h100-sxm") -> pd.DataFrame:
    """One row per claim: ``id``, ``claim`` (the article's, in our words), ``scope`` (model and GPU),
    ``verdict`` (one of :data:`CATEGORIES`), ``numbers`` (what the verdict rests on) and ``text``
    (:func:`verdict`'s string). Used in chapters 05, 12 and 14."""
    table = pd.DataFrame(_rows(claim_numbers(gpu), gpu), columns=["id", "claim", "scope", "verdict", "numbers"])
    return table.assign(text=table["verdict"] + " (" + table["scope"] + ")")


def verdict(claim_id: str, gpu: str = "h100-sxm") -> str:
    """The one verdict string for a claim, category and scope: what every chapter glues as ``verdict_<id>``."""
    return str(claim_table(gpu).set_index("id").loc[claim_id, "text"])


def glue_verdicts(glue, gpu: str = "h100-sxm") -> dict:
    """Glue every claim's :func:`verdict` as ``verdict_<id>`` and the claim as ``claim_<id>`` (``glue`` is
    myst_nb's); return the verdicts by id."""
    table = claim_table(gpu)
    for claim_id, claim, text in zip(table["id"], table["claim"], table["text"]):
        glue(f"verdict_{claim_id}", text, display=False)
        glue(f"claim_{claim_id}", claim, display=False)
    return dict(zip(table["id"], table["text"]))


# -- the verdicts as facts (batchlab.chapters.facts): every page glues these strings -----------------------------
CLAIM_IDS = ("knee", "kv_knee", "weights", "cadence", "gap", "max_num_seqs", "chunking", "quadratic", "budget_caps",
             "launch_overhead")


def _verdict_facts(claim_id: str):
    @facts.fact(f"verdict_{claim_id}", scene="llama8", chapter="fact_check",
                text=f"the book's verdict on the article's claim {claim_id!r}, with the model and GPU it is about")
    def _verdict():
        return verdict(claim_id)

    @facts.fact(f"claim_{claim_id}", scene="llama8", chapter="fact_check",
                text=f"the article's claim {claim_id!r}, in the book's words")
    def _claim():
        return str(claim_table().set_index("id").loc[claim_id, "claim"])


for _id in CLAIM_IDS:
    _verdict_facts(_id)


# -- the pair of chapter 8's grid that beats vLLM's default on both tails (claim 7): facts chapter 14 glues --------
def best_pair(gpu: str = "h100-sxm") -> pd.Series:
    """Of the pairs that beat vLLM's default on p99 TTFT and p99 ITL at once (:func:`both_better`, at
    :data:`NEAR` of capacity on chapter 8's trace), the one with the lowest p99 ITL; the row claim 7 quotes."""
    return claim_numbers(gpu)["wins"].sort_values("p99_itl_ms", kind="stable").iloc[0]


@facts.fact("chunking_win_max_num_seqs", scene="conv", unit="sequences", fmt=",", chapter="fact_check",
            text="max_num_seqs of the pair that beats vLLM's default on p99 TTFT and p99 ITL at once with the "
                 "lowest p99 ITL, near capacity on the conversation scene (claim 7)")
def _win_seqs():
    return int(best_pair()["max_num_seqs"])


@facts.fact("chunking_win_max_num_batched_tokens", scene="conv", unit="tokens", fmt=",",
            chapter="fact_check", text="max_num_batched_tokens of that pair (claim 7)")
def _win_tokens():
    return int(best_pair()["max_num_batched_tokens"])


@facts.fact("chunking_win_p99_ttft_ms", scene="conv", unit="ms", fmt=",.0f", chapter="fact_check",
            text="that pair's p99 TTFT near capacity on the conversation scene (claim 7)")
def _win_ttft():
    return float(best_pair()["p99_ttft_ms"])


@facts.fact("chunking_win_p99_itl_ms", scene="conv", unit="ms", fmt=",.0f", chapter="fact_check",
            text="that pair's p99 ITL near capacity on the conversation scene (claim 7)")
def _win_itl():
    return float(best_pair()["p99_itl_ms"])
