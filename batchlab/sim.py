"""``simulate``: replay a request stream through one batching policy, one iteration at a time.

This module validates the knobs, fills in vLLM's defaults and calls the jitted loop in
:mod:`batchlab._kernels`; the semantics of every policy are stated there and in DESIGN section 4.
"""
from __future__ import annotations

import math

import numpy as np

from ._kernels import POLICIES, STATUS_OK, simulate_kernel
from .cost import CostModel
from .hardware import GiB
from .result import KernelOutput, SimResult
from .workload import Requests

POLICY_CODE = {name: i for i, name in enumerate(POLICIES)}


def vllm_defaults(hardware, usage: str = "serve") -> dict[str, int]:
    """vLLM V1's default ``max_num_seqs`` and ``max_num_batched_tokens`` for a GPU.

    They depend on the GPU, not the model: GPUs with at least 70 GiB other than the A100 get 1024
    sequences and 8192 tokens (``vllm serve``) or 16384 (offline ``LLM``); every other GPU 256 sequences and
    2048 / 8192 tokens (vLLM ``EngineArgs._set_default_args``).
    """
    if usage not in ("serve", "offline"):
        raise ValueError(f"usage must be 'serve' or 'offline', got {usage!r}")
    large = hardware.hbm_bytes >= 70 * GiB and "a100" not in hardware.name
    if large:
        return {"max_num_seqs": 1024, "max_num_batched_tokens": 8192 if usage == "serve" else 16384}
    return {"max_num_seqs": 256, "max_num_batched_tokens": 2048 if usage == "serve" else 8192}


_KNOB_POLICIES = {
    "batch_size": ("static", "dynamic"),
    "max_queue_delay_s": ("dynamic",),
    "max_num_seqs": ("continuous", "chunked"),
    "max_num_batched_tokens": ("continuous", "chunked"),
    "prefill_only_steps": ("continuous",),
    "long_prefill_token_threshold": ("chunked",),
    "enable_chunked_prefill": ("chunked",),
}


def _int_knob(name, value, low):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _resolve_knobs(cost, policy, given, block_size, gpu_memory_utilization, num_kv_blocks) -> dict:
    """Every knob ``policy`` uses, validated, with batchlab's (vLLM's) defaults filled in."""
    for knob, value in given.items():
        if value is not None and policy not in _KNOB_POLICIES[knob]:
            raise ValueError(f"{knob} applies to policy {' or '.join(_KNOB_POLICIES[knob])}, not {policy!r}")
    block_size = _int_knob("block_size", block_size, 1)
    if num_kv_blocks is None:
        num_kv_blocks = cost.kv_pool_blocks(gpu_memory_utilization, block_size)
        if num_kv_blocks < 2:
            raise ValueError(
                f"the weights ({cost.weight_bytes / 1e9:.1f} GB per GPU) leave no room for a KV cache at "
                f"gpu_memory_utilization={gpu_memory_utilization}; raise it, use tp > 1 or fp8"
            )
    else:
        num_kv_blocks = _int_knob("num_kv_blocks", num_kv_blocks, 2)
    defaults = vllm_defaults(cost.hardware)
    knobs = {"block_size": block_size, "num_kv_blocks": num_kv_blocks}
    if policy in ("static", "dynamic"):
        batch_size = given["batch_size"]
        knobs["batch_size"] = _int_knob("batch_size", 32 if batch_size is None else batch_size, 1)
        if policy == "dynamic":
            delay = 0.05 if given["max_queue_delay_s"] is None else given["max_queue_delay_s"]
            if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not (0 <= delay < math.inf):
                raise ValueError(f"max_queue_delay_s must be finite seconds >= 0, got {delay!r}")
            knobs["max_queue_delay_s"] = float(delay)
        return knobs
    max_num_seqs, max_num_batched_tokens = given["max_num_seqs"], given["max_num_batched_tokens"]
    knobs["max_num_seqs"] = _int_knob(
        "max_num_seqs", defaults["max_num_seqs"] if max_num_seqs is None else max_num_seqs, 1)
    if policy == "chunked" and max_num_batched_tokens is None:
        max_num_batched_tokens = defaults["max_num_batched_tokens"]
    if max_num_batched_tokens is not None:
        knobs["max_num_batched_tokens"] = _int_knob("max_num_batched_tokens", max_num_batched_tokens, 1)
    if policy == "continuous":
        knobs["prefill_only_steps"] = bool(given["prefill_only_steps"])
    else:
        threshold = given["long_prefill_token_threshold"]
        knobs["long_prefill_token_threshold"] = _int_knob("long_prefill_token_threshold",
                                                          0 if threshold is None else threshold, 0)
        chunking = given["enable_chunked_prefill"]
        knobs["enable_chunked_prefill"] = True if chunking is None else bool(chunking)
    return knobs


def simulate(requests, policy: str, cost, *, batch_size=None, max_queue_delay_s=None, max_num_seqs=None,
             max_num_batched_tokens=None, prefill_only_steps=None, long_prefill_token_threshold=None,
             enable_chunked_prefill=None, block_size: int = 16, gpu_memory_utilization: float = 0.9,
             num_kv_blocks=None, record_schedule: bool = False):
    """Replay ``requests`` through one batching policy, one iteration at a time.

    Parameters
    ----------
    requests : Requests
        The stream (arrivals in seconds, token counts).
    policy : {"static", "dynamic", "continuous", "chunked"}
        See DESIGN section 4 and the notebooks: lockstep batches (static, dynamic), Orca's
        iteration-level batching (continuous) and vLLM V1 / Sarathi-Serve chunked prefill (chunked).
    cost : CostModel
        Gives each iteration's duration.
    batch_size : int, default 32
        Requests per lockstep batch (static, dynamic).
    max_queue_delay_s : float, default 0.05
        Seconds the oldest queued request may wait before a partial batch leaves (dynamic).
    max_num_seqs : int, default vLLM's for the GPU
        Cap on running sequences (continuous, chunked).
    max_num_batched_tokens : int
        Token budget per iteration (chunked; default vLLM's ``vllm serve`` value for the GPU). Under
        continuous, optional: the most prompt tokens admitted in one iteration (vLLM V0).
    prefill_only_steps : bool, default False
        Continuous: iterations that admit prompts run prefill only (vLLM V0) instead of alongside decodes.
    long_prefill_token_threshold : int, default 0
        Chunked: cap on tokens per request per iteration (0 = none).
    enable_chunked_prefill : bool, default True
        Chunked: False makes a prompt that does not fit the remaining budget wait for a later iteration;
        as in vLLM V1, requests behind it that do fit are admitted meanwhile.
    block_size : int, default 16
        Tokens per KV block.
    gpu_memory_utilization : float, default 0.9
        Share of HBM for weights plus KV cache.
    num_kv_blocks : int, optional
        Override the KV pool size (blocks per GPU, one of them vLLM's null block).
    record_schedule : bool, default False
        Also record ``schedule``: one row per request per iteration it was scheduled or preempted in.

    Returns
    -------
    SimResult
    """
    if not isinstance(requests, Requests):
        raise ValueError("requests must be a batchlab.Requests")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if not isinstance(cost, CostModel):
        raise ValueError("cost must be a batchlab.CostModel")
    given = {
        "batch_size": batch_size, "max_queue_delay_s": max_queue_delay_s, "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens, "prefill_only_steps": prefill_only_steps,
        "long_prefill_token_threshold": long_prefill_token_threshold,
        "enable_chunked_prefill": enable_chunked_prefill,
    }
    knobs = _resolve_knobs(cost, policy, given, block_size, gpu_memory_utilization, num_kv_blocks)
    num_kv_blocks, block_size = knobs["num_kv_blocks"], knobs["block_size"]
    raw = simulate_kernel(
        requests.arrival_s, requests.prompt_tokens, requests.output_tokens, POLICY_CODE[policy],
        cost.coefficients(), knobs.get("batch_size", 1), knobs.get("max_queue_delay_s", 0.0),
        knobs.get("max_num_seqs", 1), knobs.get("max_num_batched_tokens", 0),
        knobs.get("long_prefill_token_threshold", 0), knobs.get("enable_chunked_prefill", True),
        knobs.get("prefill_only_steps", False), num_kv_blocks - 1, block_size, bool(record_schedule),
    )
    out = KernelOutput(*raw)
    if out.status != STATUS_OK:
        raise RuntimeError("the scheduler loop could not schedule anything yet has unfinished requests (a bug)")
    return SimResult(requests, policy, cost, dict(knobs), out, bool(record_schedule))
