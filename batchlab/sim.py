"""``simulate``: replay a request stream through one batching policy, one iteration at a time.

This module validates the knobs, fills in vLLM's defaults and calls the jitted loop in
:mod:`batchlab._kernels`; the semantics of every policy are stated there and in DESIGN section 4.
"""
from __future__ import annotations

import numpy as np

from . import _validate

from ._kernels import (POLICIES, RULE_ASYNC, RULE_CHUNKING, RULE_PREFIX_CACHE, RULE_RESERVE_FULL, RULE_STOP_UNFIT,
                       RULE_THRESHOLD_ALONE, STATUS_OK, Knobs, Stream, simulate_kernel)
from .cost import CostModel
from .hardware import GiB
from .result import PROGRESS_GUARD, SimResult
from .workload import Requests

POLICY_CODE = {name: i for i, name in enumerate(POLICIES)}


# vLLM 0.33 EngineArgs.get_batch_defaults: the GPU's memory (GiB) and name pick the defaults, never the model.
VLLM_HUGE_GPU_GIB = 160  # and above: the large seat count, the offline token budget for vllm serve too
VLLM_LARGE_GPU_GIB = 70  # and above, the A100 excepted: the large seat count
VLLM_SEQS = {"large": 1024, "small": 256}  # max_num_seqs
VLLM_TOKENS = {("huge", "serve"): 16384, ("huge", "offline"): 16384, ("large", "serve"): 8192,
               ("large", "offline"): 16384, ("small", "serve"): 2048, ("small", "offline"): 8192}


def vllm_defaults(hardware, usage: str = "serve") -> dict[str, int]:
    """vLLM V1's default ``max_num_seqs`` and ``max_num_batched_tokens`` for a GPU.

    They depend on the GPU, not the model (vLLM 0.33 ``EngineArgs.get_batch_defaults``): GPUs of 160 GiB or more
    get 1024 sequences and 16384 tokens; others with at least 70 GiB, the A100 excepted, 1024 sequences and 8192
    tokens (``vllm serve``) or 16384 (offline ``LLM``); every other GPU 256 sequences and 2048 / 8192 tokens.
    """
    if usage not in ("serve", "offline"):
        raise ValueError(f"usage must be 'serve' or 'offline', got {usage!r}")
    if hardware.hbm_bytes >= VLLM_HUGE_GPU_GIB * GiB:
        size = "huge"
    elif hardware.hbm_bytes >= VLLM_LARGE_GPU_GIB * GiB and "a100" not in hardware.name:
        size = "large"
    else:
        size = "small"
    return {"max_num_seqs": VLLM_SEQS["small" if size == "small" else "large"],
            "max_num_batched_tokens": VLLM_TOKENS[size, usage]}


def seats_for(cost, max_num_batched_tokens: int) -> int:
    """``max_num_seqs`` a vLLM user must set with a token budget: vLLM's default for the GPU, capped at the budget.

    vLLM refuses to start when ``max_num_batched_tokens < max_num_seqs`` (its ``SchedulerConfig`` wants at least
    one token per running sequence), so a budget below the default 1,024 seats of an H100 needs the seats lowered
    with it. Used in chapters 05, 06, 07, 12 and 14.

    Parameters
    ----------
    cost : CostModel
        Its GPU sets the default (:func:`batchlab.vllm_defaults`).
    max_num_batched_tokens : int
        Token budget per iteration.

    Returns
    -------
    int
        min(default ``max_num_seqs``, ``max_num_batched_tokens``).
    """
    return min(vllm_defaults(cost.hardware)["max_num_seqs"], int(max_num_batched_tokens))


_KNOB_POLICIES = {
    "batch_size": ("static", "dynamic"),
    "max_queue_delay_s": ("dynamic",),
    "max_num_seqs": ("continuous", "chunked"),
    "max_num_batched_tokens": ("continuous", "chunked"),
    "prefill_only_steps": ("continuous",),
    "long_prefill_token_threshold": ("chunked",),
    "enable_chunked_prefill": ("chunked",),
    "async_scheduling": ("chunked",),
    "enable_prefix_caching": ("chunked",),
    "scheduler_reserve_full_isl": ("chunked",),
    "max_model_len": ("chunked",),
    "max_concurrency": ("chunked",),
}
_CHUNKED_SWITCHES = {  # vLLM 0.33's name -> the kernel's rule bit; each on by default, as in vLLM
    "enable_chunked_prefill": RULE_CHUNKING, "scheduler_reserve_full_isl": RULE_RESERVE_FULL,
    "async_scheduling": RULE_ASYNC, "enable_prefix_caching": RULE_PREFIX_CACHE,
}


def _int_knob(name, value, low, high=2**40):
    return _validate.integer(name, value, low, high)


def _bool_knob(name, value, default: bool) -> bool:
    return _validate.flag(name, value, default)


def _resolve_knobs(cost, policy, given, block_size, gpu_memory_utilization, num_kv_blocks) -> dict:
    """Every knob ``policy`` uses, validated, with batchlab's (vLLM's) defaults filled in."""
    gpu_memory_utilization = _validate.real("gpu_memory_utilization", gpu_memory_utilization, 0, 1, low_open=True)
    for knob, value in given.items():
        if value is not None and policy not in _KNOB_POLICIES[knob]:
            raise ValueError(f"{knob} applies to policy {' or '.join(_KNOB_POLICIES[knob])}, not {policy!r}")
    defaults = vllm_defaults(cost.hardware)
    knobs = {"block_size": _int_knob("block_size", block_size, 1, 2**16)}
    if policy in ("static", "dynamic"):
        batch_size = given["batch_size"]
        knobs["batch_size"] = _int_knob("batch_size", 32 if batch_size is None else batch_size, 1)
        if policy == "dynamic":
            delay = 0.05 if given["max_queue_delay_s"] is None else given["max_queue_delay_s"]
            knobs["max_queue_delay_s"] = _validate.real("max_queue_delay_s", delay, 0, allowed="finite seconds >= 0")
    else:
        _iteration_knobs(knobs, cost, policy, given, defaults)
    knobs["num_kv_blocks"] = _pool(cost, knobs, defaults, gpu_memory_utilization, num_kv_blocks)
    if policy == "chunked":
        _check_chunked(knobs)
    return knobs


def _iteration_knobs(knobs, cost, policy, given, defaults) -> None:
    """The knobs of ``continuous`` and ``chunked``, into ``knobs``."""
    max_num_seqs, max_num_batched_tokens = given["max_num_seqs"], given["max_num_batched_tokens"]
    knobs["max_num_seqs"] = _int_knob(
        "max_num_seqs", defaults["max_num_seqs"] if max_num_seqs is None else max_num_seqs, 1)
    if policy == "chunked" and max_num_batched_tokens is None:
        max_num_batched_tokens = defaults["max_num_batched_tokens"]
    if max_num_batched_tokens is not None:
        knobs["max_num_batched_tokens"] = _int_knob("max_num_batched_tokens", max_num_batched_tokens, 1)
    concurrency = given["max_concurrency"]
    knobs["max_concurrency"] = None if concurrency is None else _int_knob("max_concurrency", concurrency, 1)
    if policy == "continuous":
        knobs["prefill_only_steps"] = _bool_knob("prefill_only_steps", given["prefill_only_steps"], False)
        return
    threshold = given["long_prefill_token_threshold"]
    knobs["long_prefill_token_threshold"] = _int_knob("long_prefill_token_threshold",
                                                      0 if threshold is None else threshold, 0)
    for name in _CHUNKED_SWITCHES:
        knobs[name] = _bool_knob(name, given[name], True)
    max_model_len = cost.model.max_position_embeddings if given["max_model_len"] is None else given["max_model_len"]
    if max_model_len != 0:  # 0: not modelled (batchlab's first version)
        max_model_len = _int_knob("max_model_len", max_model_len, 2)
    knobs["max_model_len"] = int(max_model_len)


def _pool(cost, knobs, defaults, gpu_memory_utilization, num_kv_blocks) -> int:
    """KV blocks per GPU (one of them vLLM's null block): given, or sized as vLLM 0.33 sizes it."""
    if num_kv_blocks is not None:
        return _int_knob("num_kv_blocks", num_kv_blocks, 2)
    tokens = knobs.get("max_num_batched_tokens") or defaults["max_num_batched_tokens"]
    seqs = knobs.get("max_num_seqs") or defaults["max_num_seqs"]
    blocks = cost.kv_pool_blocks(gpu_memory_utilization, knobs["block_size"], tokens, seqs)
    if blocks < 2:
        raise ValueError(
            f"the weights ({cost.weight_bytes / 1e9:.1f} GB per GPU) and vLLM's other reservations leave no room "
            f"for a KV cache at gpu_memory_utilization={gpu_memory_utilization}; raise it, use tp > 1 or fp8")
    return blocks


def _check_chunked(knobs) -> None:
    """Configurations vLLM 0.33 refuses to start with: each a ValueError naming the knob."""
    seqs, tokens, max_model_len = knobs["max_num_seqs"], knobs["max_num_batched_tokens"], knobs["max_model_len"]
    if tokens < seqs:
        raise ValueError(f"max_num_batched_tokens ({tokens}) must be >= max_num_seqs ({seqs}), as vLLM requires")
    if max_model_len == 0:
        return
    if not knobs["enable_chunked_prefill"] and tokens < max_model_len:
        raise ValueError(f"with enable_chunked_prefill=False, max_num_batched_tokens ({tokens}) must be >= "
                         f"max_model_len ({max_model_len}), as vLLM requires; raise it or lower max_model_len")
    usable = knobs["num_kv_blocks"] - 1
    need = -(-max_model_len // knobs["block_size"])
    if need > usable:
        raise ValueError(f"the KV pool ({usable} blocks of {knobs['block_size']} tokens) cannot hold one request of "
                         f"max_model_len={max_model_len} tokens ({need} blocks), so vLLM would refuse to start; lower "
                         f"max_model_len or give the cache more memory (gpu_memory_utilization, num_kv_blocks)")


def _check_int64(requests, policy, knobs) -> None:
    """Refuse the inputs whose kernel arithmetic could leave int64.

    Requests bound every prompt and output to 2**40 tokens and a stream's tokens to 2**62. The one product that
    can still grow past 2**63 is a lockstep batch's prefill work, b p_max^2 (static, dynamic): the KV pool of
    ``C = usable blocks x block_size`` tokens admits a batch only if b p_max <= C, and a prompt only if p <= C, so
    b p_max^2 <= C min(max prompt, C), checked here in Python integers. With vLLM's pools (C of a few million
    tokens) it always holds; only a hand-set ``num_kv_blocks`` in the billions can break it.
    """
    if policy not in ("static", "dynamic"):
        return  # the iteration loop's attention work is float64; its integer sums are bounded by the pool
    capacity = (knobs["num_kv_blocks"] - 1) * knobs["block_size"]
    worst = capacity * min(int(requests.prompt_tokens.max()), capacity)
    if worst > _validate.INT64_MAX:
        raise ValueError(f"num_kv_blocks={knobs['num_kv_blocks']} of block_size={knobs['block_size']} with prompts of "
                         f"up to {int(requests.prompt_tokens.max())} tokens lets a {policy} batch's prefill work "
                         f"(b x p_max^2 <= {worst:.3g}) pass 2**63; lower num_kv_blocks or the prompts")


def simulate(requests, policy: str, cost, *, batch_size=None, max_queue_delay_s=None, max_num_seqs=None,
             max_num_batched_tokens=None, prefill_only_steps=None, long_prefill_token_threshold=None,
             enable_chunked_prefill=None, async_scheduling=None, enable_prefix_caching=None,
             scheduler_reserve_full_isl=None, max_model_len=None, max_concurrency=None, block_size: int = 16,
             gpu_memory_utilization: float = 0.92, num_kv_blocks=None, record_schedule: bool = False,
             record_tokens: bool = True):
    """Replay ``requests`` through one batching policy, one iteration at a time.

    Parameters
    ----------
    requests : Requests
        The stream (arrivals in seconds, token counts, optional prefix block ids).
    policy : {"static", "dynamic", "continuous", "chunked"}
        See DESIGN section 4 and the notebooks: lockstep batches (static, dynamic), Orca's
        iteration-level batching (continuous) and vLLM's scheduler (chunked, the rules of vLLM
        ``batchlab.VLLM_VERSION``).
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
        Chunked: cap on tokens per request per iteration (0 = none); ignored for a request that is alone.
    enable_chunked_prefill : bool, default True
        Chunked: False admits whole prompts only; a waiting prompt that does not fit the budget left stops
        admission for that iteration (nobody behind it jumps the queue).
    async_scheduling : bool, default True
        Chunked: vLLM plans the next iteration while one runs, so a request that arrives during an iteration
        starts one iteration later and a finished one holds its seat and blocks one iteration longer.
    enable_prefix_caching : bool, default True
        Chunked: a new request reuses the cached blocks of its prefix (``requests.prefix_blocks``; without
        them only a preempted request finds its own blocks again); free cached blocks are evicted LRU.
    scheduler_reserve_full_isl : bool, default True
        Chunked: a waiting request is admitted only if the blocks of its whole prompt are free.
    max_model_len : int, default the model's context length
        Chunked: a prompt of ``max_model_len`` tokens or more is rejected; outputs are clipped to fit. The pool
        must hold one request this long. 0 leaves the limit out (batchlab's first version).
    max_concurrency : int, optional
        Chunked: at most this many requests in flight, as ``vllm bench serve --max-concurrency``:
        a request is sent at its arrival or when a slot frees, whichever is later; latencies count from then.
    block_size : int, default 16
        Tokens per KV block.
    gpu_memory_utilization : float, default 0.92
        Share of HBM vLLM may use; the KV pool is what the weights and vLLM's other reservations leave
        (:meth:`CostModel.kv_pool_blocks`).
    num_kv_blocks : int, optional
        Override the KV pool size (blocks per GPU, one of them vLLM's null block).
    record_schedule : bool, default False
        Also record ``schedule``: one row per request per iteration it was scheduled or preempted in.
    record_tokens : bool, default True
        Keep the timeline: every output token's time (``token_times``) and one row per iteration (``steps``).
        False keeps memory proportional to the requests, not the tokens (sweeps, the tuner, long replays);
        ``summary()`` is the same either way, its ITL percentiles within ``batchlab.metrics.ITL_RELATIVE_ERROR``.

    Returns
    -------
    SimResult

    Raises
    ------
    ValueError
        A bad knob or argument, naming it, its value and the allowed range.

    Notes
    -----
    Bounds that keep the kernel's int64 arithmetic exact for every accepted input: token counts of 1 to 2**40
    per prompt and per output and at most 2**62 per stream (checked by :class:`Requests`); integer knobs up to
    2**40 (``block_size`` up to 2**16); and for ``static`` and ``dynamic``, (usable KV blocks x ``block_size``)
    x min(longest prompt, that capacity) below 2**63, which bounds a lockstep batch's prefill work b p_max^2.
    Every other sum the loop keeps is bounded by the KV pool or computed in float64.
    """
    if not isinstance(requests, Requests):
        raise ValueError(f"requests must be a batchlab.Requests, got {type(requests).__name__}")
    _validate.choice("policy", policy, POLICIES)
    if not isinstance(cost, CostModel):
        raise ValueError("cost must be a batchlab.CostModel")
    given = {
        "batch_size": batch_size, "max_queue_delay_s": max_queue_delay_s, "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens, "prefill_only_steps": prefill_only_steps,
        "long_prefill_token_threshold": long_prefill_token_threshold,
        "enable_chunked_prefill": enable_chunked_prefill, "async_scheduling": async_scheduling,
        "enable_prefix_caching": enable_prefix_caching, "scheduler_reserve_full_isl": scheduler_reserve_full_isl,
        "max_model_len": max_model_len, "max_concurrency": max_concurrency,
    }
    knobs = _resolve_knobs(cost, policy, given, block_size, gpu_memory_utilization, num_kv_blocks)
    _check_int64(requests, policy, knobs)
    record = _bool_knob("record_schedule", record_schedule, False)
    record_tokens = _bool_knob("record_tokens", record_tokens, True)
    output = requests.output_tokens
    max_model_len = knobs.get("max_model_len", 0)
    if max_model_len:  # vLLM clips max_tokens to what the context leaves (a prompt that fills it is rejected)
        room = max_model_len - requests.prompt_tokens
        output = np.where(room > 0, np.minimum(output, room), output)
    rules = RULE_STOP_UNFIT | RULE_THRESHOLD_ALONE if policy == "chunked" else 0
    for name, bit in _CHUNKED_SWITCHES.items():
        rules |= bit if knobs.get(name, name == "enable_chunked_prefill") else 0
    prefix_ids = np.unique(requests.prefix_ids, return_inverse=True)[1].astype(np.int64).reshape(-1)
    stream = Stream(requests.arrival_s, requests.prompt_tokens, output, prefix_ids, requests.prefix_offsets,
                    requests.prefix_block_tokens)
    out = simulate_kernel(stream, Knobs(
        POLICY_CODE[policy], cost.coefficients(), knobs.get("batch_size", 1), knobs.get("max_queue_delay_s", 0.0),
        knobs.get("max_num_seqs", 1), knobs.get("max_num_batched_tokens", 0),
        knobs.get("long_prefill_token_threshold", 0), rules, knobs.get("prefill_only_steps", False),
        knobs["num_kv_blocks"] - 1, knobs["block_size"], record, knobs.get("max_concurrency") or 0, max_model_len,
        record_tokens))
    if out.status != STATUS_OK:
        raise RuntimeError(PROGRESS_GUARD)
    return SimResult(requests, policy, cost, dict(knobs), out, record, output, record_tokens)
