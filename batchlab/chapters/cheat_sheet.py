"""Chapter 12, cheat sheet: each symptom, the knob that treats it, and the number that backs it.

:func:`measure` reruns, with the same parameters, the calls the chapters named in each row make, and returns
every number the sheet quotes; :func:`cheat_sheet` turns them into the table, one row per symptom, and
:func:`styled` formats it for the page. Nothing is copied from another page: if a chapter's result changes, the
sheet's does too.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from .. import CostModel, get_hardware, get_model, preset, simulate, vllm_defaults
from ..sweep import default_vs_best, seqs_plateau, with_frontier
from . import dynamic_batching, fact_check, piggybacking, prefill_spike, scenes, static_batching, two_knobs


class Setup(NamedTuple):
    """The chapters' parameters the sheet reruns with (chapter 12's ``parameters`` cell sets them)."""

    gpu: str = "h100-sxm"
    model: str = "llama-3-8b"  # BF16
    big_model: str = "llama-3-70b"  # FP8: the article's "70 GB of weights"
    workload: str = "azure-conv-2023"  # the real-trace preset of chapters 02, 07 and 08
    seed: int = 0
    contexts: tuple = (1024, 4096)  # tokens of KV cache per sequence for the knee (chapter 04)
    chunked_tokens: tuple = (512, 1024, 2048, 4096, 8192)  # budgets swept on the shared scene (06, 11)
    n_policy: int = 1000  # requests of chapter 02's policy comparison
    batch_size: int = 32  # its static batch
    low: float = 0.01  # its low and high loads, as fractions of saturation
    high: float = 0.9
    delay_s: float = 0.05  # its max queue delay, s
    n_mix: int = 2000  # requests of chapter 07's mixing comparison
    mix_rate_req_s: float = 24.0
    mix_tokens: int = 2048  # its max_num_batched_tokens
    n_knobs: int = 3000  # requests of chapter 08's sweep
    near: float = 0.95  # its near-capacity and overloaded rates, as fractions of capacity
    over: float = 1.2
    max_num_seqs: tuple = (8, 16, 32, 64, 128, 256, 512, 1024)
    max_num_batched_tokens: tuple = (512, 1024, 2048, 4096, 8192, 16384)
    same_throughput: float = 0.01  # chapter 08's tolerances
    plateau: float = 0.05


def _policies(cost, s: Setup) -> dict:
    """Chapters 01 and 02: padding at output CV 0 and 1, saturation throughput and mean e2el at two loads."""
    pad, _ = static_batching.static_padding_sweep(cost, [0.0, 1.0], n_requests=512, batch_size=s.batch_size,
                                                  prompt_tokens=512, output_mean=256, seed=s.seed)
    sat = dynamic_batching.policy_grid(cost, s.workload, s.n_policy, [np.inf], batch_size=s.batch_size,
                                       seed=s.seed).set_index("policy")["request_throughput"]
    c = float(sat["continuous"])  # req/s: iteration-level saturation, the yardstick for load
    loads = dynamic_batching.policy_grid(cost, s.workload, s.n_policy, {"low": s.low * c, "high": s.high * c},
                                         batch_size=s.batch_size, delays_s=[s.delay_s], seed=s.seed)
    return {"pad": pad.set_index("output_cv")["padding_fraction"], "sat": sat,
            "e2el": loads.set_index(["load", "policy"])["mean_e2el_ms"] / 1e3}


def _roofline(cost, big, s: Setup) -> dict:
    """Chapters 04, 05 and 14: knees, batch-1 floors, the 8k prefill, the spike and the 70B gap."""
    ideal, n = cost.ideal(), scenes.PROMPT_TOKENS
    return {"ridge": ideal.knee(0), "knees": {c: ideal.knee(c) for c in s.contexts},
            "floor_ms": ideal.decode_step_time(1, 0) * 1e3, "floor_cal_ms": cost.decode_step_time(1, 0) * 1e3,
            "floor_big_ms": big.ideal().decode_step_time(1, 0) * 1e3,
            "prefill_ms": ideal.prefill_time(n) * 1e3, "prefill_cal_ms": cost.prefill_time(n) * 1e3,
            "spike": prefill_spike.prefill_spike(cost, prompt_tokens=n, context=scenes.CONTEXT).summary,
            "gap_big_ms": fact_check.prefill_gap(big.ideal(), n)["step_s"] * 1e3,
            "decoders": scenes.default_decoders(cost, scenes.CONTEXT)}


def _knobs(cost, hw, s: Setup, decoders: int) -> dict:
    """Chapters 06 to 08: the chunking trade, the mixing comparison and the two-knob sweep near capacity."""
    trade = fact_check.chunking_tradeoff(cost, s.chunked_tokens, n_decoders=decoders, context=scenes.CONTEXT,
                                         prompt_tokens=scenes.PROMPT_TOKENS).set_index("max_num_batched_tokens")
    mix = piggybacking.mixing_comparison(cost, s.workload, s.n_mix, [s.mix_rate_req_s],
                                         max_num_batched_tokens=s.mix_tokens, seed=s.seed).set_index("policy")
    capacity = two_knobs.saturation_rate(cost, s.workload, s.n_knobs, seed=s.seed)
    near, over_rate = np.round(np.array([s.near, s.over]) * capacity, 1)
    knobs = with_frontier(two_knobs.two_knob_sweep(cost, s.workload, [near], list(s.max_num_seqs),
                                                   list(s.max_num_batched_tokens), n_requests=s.n_knobs,
                                                   seed=s.seed), rel_tol=s.same_throughput)
    defaults = vllm_defaults(hw)
    plateau = seqs_plateau(knobs[~knobs["vllm_refuses"]], tol=s.plateau).set_index("max_num_batched_tokens")
    seats = plateau.loc[defaults["max_num_batched_tokens"], "max_num_seqs"]
    over = simulate(preset(s.workload, s.n_knobs, rate_req_s=over_rate, seed=s.seed), "chunked", cost)
    return {"trade": trade, "mix": mix, "near": float(near), "over_rate": float(over_rate), "knobs": knobs,
            "defaults": defaults, "seats": int(seats), "over": over,
            "vs": default_vs_best(knobs, defaults, rel_tol=s.same_throughput, y_rel_tol=s.plateau,
                                  then="p99_itl_ms").iloc[0],
            "kept": knobs[(knobs["max_num_seqs"] >= seats) & ~knobs["vllm_refuses"]]["output_throughput"],
            "kv_tokens": int((over.knobs["num_kv_blocks"] - 1) * over.knobs["block_size"]),
            "gpus": two_knobs.vllm_defaults_table(["h100-sxm", "h200", "a100-80gb"]).set_index("gpu")}


def measure(setup: Setup | None = None) -> dict:
    """Every number the cheat sheet quotes, by name (see :func:`cheat_sheet`), with ``setup`` (default:
    :class:`Setup`'s, the chapters' own parameters). Used in chapter 12."""
    setup = setup or Setup()
    hw = get_hardware(setup.gpu)
    cost = CostModel(hw, get_model(setup.model))  # calibrated efficiencies
    big = CostModel(hw, get_model(setup.big_model), dtype="fp8")
    m = {"setup": setup, "cost": cost, **_policies(cost, setup), **_roofline(cost, big, setup)}
    return {**m, **_knobs(cost, hw, setup, m["decoders"])}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms"


def cheat_sheet(m: dict) -> pd.DataFrame:
    """Symptom -> knob -> effect, one row each, with the number and the chapters that back it.

    ``m`` is :func:`measure`'s. Columns: ``symptom``, ``knob`` (what to change), ``effect`` (what it does, in
    words), ``number`` (the measurement, with units) and ``chapter``.
    """
    s, pad, sat, e2el, trade, mix = m["setup"], m["pad"], m["sat"], m["e2el"], m["trade"], m["mix"]
    v1, _, v0 = (mix.loc[k] for k in piggybacking.MIXING_POLICIES)  # vLLM V1, Orca, vLLM V0
    vs, d, over, gpus, knees = m["vs"], m["defaults"], m["over"], m["gpus"], m["knees"]
    hi, lo = trade.iloc[-1], trade.iloc[0]
    rows = [
        ("throughput far below the GPU's; batches padded and held by their longest member",
         "iteration-level (continuous) batching", "no padding, a finished sequence's slot refills at once",
         f"{sat['continuous']:.1f} vs {sat['static']:.1f} req/s at saturation; static pads {pad[1.0]:.0%} of "
         f"slots at output CV 1", "01, 02"),
        ("at low load, requests wait for a batch to fill", "stop waiting: iteration-level batching (or a short "
         "max queue delay)", "latency at low load drops; nothing changes at high load",
         f"mean e2el {e2el['low', 'static']:.0f} s static vs {e2el['low', 'dynamic']:.1f} s dynamic at "
         f"{s.low:.0%} load; {e2el['high', 'static']:.0f} vs {e2el['high', 'dynamic']:.0f} s at {s.high:.0%}", "02"),
        ("decode step time barely grows with the batch: the GPU is underused", "raise max_num_seqs",
         "more tokens per step at almost the same step time, until the step leaves its floor",
         f"flat up to {knees[s.contexts[0]]:.0f} sequences at {s.contexts[0]:,} tokens of context, "
         f"{knees[s.contexts[1]]:.0f} at {s.contexts[1]:,} ({m['ridge']:.0f} with none); batch 1 takes "
         f"{m['floor_cal_ms']:.1f} ms", "04"),
        ("every decoder stalls when a long prompt arrives (one tall ITL spike)",
         "chunked prefill: lower max_num_batched_tokens", "the spike shrinks; the newcomer's TTFT grows",
         f"{scenes.PROMPT_TOKENS:,}-token prompt beside {m['decoders']} decoders: tallest gap {_ms(hi['itl_max_s'])} "
         f"at {int(trade.index[-1]):,} tokens, {_ms(lo['itl_max_s'])} at {int(trade.index[0])}; TTFT "
         f"{_ms(hi['ttft_s'])} to {_ms(lo['ttft_s'])}", "05, 06"),
        ("decoders idle during prefill-only steps", "mix prefill chunks into decode steps (vLLM's default)",
         "more throughput and a lower p99 ITL", f"{v1['output_throughput']:,.0f} vs {v0['output_throughput']:,.0f} "
         f"output tok/s; p99 ITL {v1['p99_itl_ms']:.0f} vs {v0['p99_itl_ms']:.0f} ms", "07"),
        ("p99 TTFT high near capacity", "raise max_num_seqs up to where p99 TTFT stops improving",
         "shorter queues; beyond the plateau nothing more", f"at {m['near']:.1f} req/s p99 TTFT stops improving at "
         f"{m['seats']} sequences; above it throughput varies by {m['kept'].max() / m['kept'].min() - 1:.1%}", "08"),
        ("p99 ITL high under load with vLLM's defaults", "lower max_num_batched_tokens",
         "shorter steps for decoders, often with no TTFT cost",
         f"({int(vs['best_max_num_seqs'])}, {int(vs['best_max_num_batched_tokens']):,}) vs the default "
         f"({d['max_num_seqs']:,}, {d['max_num_batched_tokens']:,}): p99 ITL {vs['best_p99_itl_ms']:.0f} vs "
         f"{vs['default_p99_itl_ms']:.0f} ms, p99 TTFT {vs['best_p99_ttft_ms']:.0f} vs "
         f"{vs['default_p99_ttft_ms']:.0f} ms", "08"),
        ("fewer sequences run than max_num_seqs allows; preemptions", "KV memory (gpu_memory_utilization, FP8 KV, "
         "more GPUs), not max_num_seqs", "more sequences fit; raising the cap does nothing",
         f"overloaded at {m['over_rate']:.1f} req/s: at most {over.steps['running'].max()} running of "
         f"{d['max_num_seqs']:,} allowed, {over.summary()['preemptions']} preemptions; the pool holds "
         f"{m['kv_tokens']:,} tokens", "08"),
        ("settings copied from another GPU or launcher behave differently", "read vLLM's defaults on this GPU",
         "the defaults follow the GPU and the launcher, not the model",
         f"max_num_seqs {int(gpus.loc['h100-sxm', 'max_num_seqs']):,} on H100 and H200, "
         f"{int(gpus.loc['a100-80gb', 'max_num_seqs'])} on A100 80GB; H100 budget "
         f"{int(gpus.loc['h100-sxm', 'max_num_batched_tokens_serve']):,} (serve), "
         f"{int(gpus.loc['h100-sxm', 'max_num_batched_tokens_offline']):,} (offline)", "08, 11"),
        ("a long prompt's first token is slow even on an idle GPU", "nothing in the scheduler: the prompt's FLOPs "
         "set it (a smaller model, more GPUs)", "chunking only spreads it; it cannot shorten it",
         f"{scenes.PROMPT_TOKENS:,} tokens: {m['prefill_ms']:.0f} ms at full BF16 peak for the 8B model "
         f"({m['prefill_cal_ms']:.0f} calibrated); at least {m['gap_big_ms']:.0f} ms for 70B FP8", "05, 11"),
    ]
    return pd.DataFrame(rows, columns=["symptom", "knob", "effect", "number", "chapter"])


def styled(sheet: pd.DataFrame):
    """The sheet as the page shows it: left-aligned, top-aligned, no index. Used in chapter 12."""
    return (sheet.style.hide(axis="index").set_uuid("cheat-sheet")
            .set_properties(**{"text-align": "left", "vertical-align": "top", "padding": "0.3em 0.5em"})
            .set_table_styles([{"selector": "th", "props": "text-align: left; border-bottom: 2px solid #888"}]))
