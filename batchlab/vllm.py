"""Every fact batchlab takes from vLLM, in one place, and the one step that turns a user's knobs into a kernel's.

What is here, each with the vLLM 0.33 source it was read from:

* the version the rules follow (:data:`VLLM_VERSION`, :data:`VLLM_RELEASED`);
* the defaults: ``--block-size`` and ``--gpu-memory-utilization`` (``vllm/config/cache.py`` ``CacheConfig``) and
  ``max_num_seqs`` / ``max_num_batched_tokens`` by GPU and usage (``vllm/engine/arg_utils.py``
  ``EngineArgs.get_batch_defaults``), :func:`vllm_defaults`;
* the knob -> policy map (:data:`KNOB_POLICIES`: which of ``simulate``'s knobs each policy reads) and the chunked
  policy's rule bits (:data:`CHUNKED_SWITCHES`, :data:`ALWAYS_ON`), :func:`rule_bits`;
* the checks vLLM refuses to start with (``vllm/config/scheduler.py`` ``SchedulerConfig``), :func:`check_chunked`;
* the KV pool's size (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``), :func:`reserved_bytes`
  and :func:`kv_pool_blocks` (``CostModel.kv_pool_blocks`` calls them);
* output clipping to ``max_model_len`` (``vllm/entrypoints/utils.py`` ``get_max_tokens``), :func:`clip_outputs`;
* :func:`prepare`: the knobs resolved and checked, the outputs clipped, the rule bits and the dense prefix ids,
  shared by :func:`batchlab.simulate` and :mod:`batchlab.fleet`.

The scheduler rules themselves are the kernels' (``batchlab._kernels``, DESIGN section 4c); their bit values are
the kernels' interface (``_kernels/layout.py``), and which vLLM option sets which bit is said here.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _checks
from ._kernels import (RULE_ASYNC, RULE_CHUNKING, RULE_PREFIX_CACHE, RULE_RESERVE_FULL, RULE_STOP_UNFIT,
                       RULE_THRESHOLD_ALONE)
from .hardware import GiB

VLLM_VERSION = "0.33.0"  # the vLLM whose scheduler rules and defaults policy "chunked" follows (DESIGN section 4c)
VLLM_RELEASED = "2 November 2026"  # when VLLM_VERSION was published (its sdist's upload to PyPI)

BLOCK_SIZE = 16  # tokens per KV block: CacheConfig.block_size's default on CUDA
GPU_MEMORY_UTILIZATION = 0.92  # CacheConfig.gpu_memory_utilization's default in 0.33

# EngineArgs.get_batch_defaults: the GPU's memory (GiB) and name pick the defaults, never the model.
VLLM_HUGE_GPU_GIB = 160  # and above: the large seat count, the offline token budget for vllm serve too
VLLM_LARGE_GPU_GIB = 70  # and above, the A100 excepted: the large seat count
VLLM_SEQS = {"large": 1024, "small": 256}  # max_num_seqs
VLLM_TOKENS = {("huge", "serve"): 16384, ("huge", "offline"): 16384, ("large", "serve"): 8192,
               ("large", "offline"): 16384, ("small", "serve"): 2048, ("small", "offline"): 8192}

# The memory profiler (determine_available_memory): what vLLM keeps out of the KV cache besides the weights.
PROFILE_ACTIVATION_BYTES = 2  # the profiling forward pass runs in BF16
PROFILE_LOGIT_BYTES = 4  # its dummy sampler run keeps float32 logits
# Non-torch (NCCL, cuBLAS workspaces) and CUDA-graph memory vLLM keeps out of the KV cache, bytes per GPU: what is
# left of the one published KV pool size, 7,463 blocks of 16 tokens for Llama-2-7B on one H100 SXM at
# gpu_memory_utilization 0.9, max_num_batched_tokens 2048, max_num_seqs 128 (inference-sim's golden dataset,
# ../shared/data/e2e/inference_sim_training/runs.csv), once weights (13.48 GB) and the profiled activations of
# reserved_bytes (0.235 GB) are taken: 0.888 GB, rounded down to a block.
VLLM_FIXED_RESERVED_BYTES = 0.65e9

KNOB_POLICIES = {  # simulate's knob -> the policies that read it
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
CHUNKED_SWITCHES = {  # vLLM 0.33's name -> the kernel's rule bit; each on by default, as in vLLM
    "enable_chunked_prefill": RULE_CHUNKING, "scheduler_reserve_full_isl": RULE_RESERVE_FULL,
    "async_scheduling": RULE_ASYNC, "enable_prefix_caching": RULE_PREFIX_CACHE,
}
# Rules of 0.33 with no switch: with chunking off a waiting prompt that does not fit the budget left stops admission
# (scheduler.py schedule()); long_prefill_token_threshold is ignored for a request scheduled alone.
ALWAYS_ON = RULE_STOP_UNFIT | RULE_THRESHOLD_ALONE
# batchlab's own defaults for the lockstep policies (no vLLM counterpart).
STATIC_BATCH_SIZE = 32
DYNAMIC_MAX_QUEUE_DELAY_S = 0.05


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


# -- the KV pool ------------------------------------------------------------------------------------------------

def reserved_bytes(cost, max_num_batched_tokens: int, max_num_seqs: int) -> float:
    """Bytes per GPU vLLM keeps out of the KV cache besides the weights (``determine_available_memory``).

    The peak activation memory of its profiling step of ``max_num_batched_tokens`` tokens (the MLP's gate/up and
    activation outputs and a few hidden-state copies, BF16) and of its dummy sampler run over ``max_num_seqs`` rows
    of float32 logits (with one softmax copy), plus :data:`VLLM_FIXED_RESERVED_BYTES` of non-torch and CUDA-graph
    memory.
    """
    m = cost.model
    per_token = (3 * m.d_ff / cost.tp + 4 * m.d_model) * PROFILE_ACTIVATION_BYTES
    logits = 2 * max_num_seqs * m.vocab / cost.tp * PROFILE_LOGIT_BYTES
    return max_num_batched_tokens * per_token + logits + VLLM_FIXED_RESERVED_BYTES


def kv_pool_blocks(cost, gpu_memory_utilization: float, block_size: int, max_num_batched_tokens: int,
                   max_num_seqs: int) -> int:
    """KV blocks per GPU as vLLM 0.33 sizes its pool (one of them its null block).

    floor((util * HBM - weights - :func:`reserved_bytes`) / (block_size * k)): vLLM profiles a forward pass of
    ``max_num_batched_tokens`` tokens and the CUDA graphs, and gives the KV cache what is left of
    ``gpu_memory_utilization`` of the memory.
    """
    gpu_memory_utilization = _checks.real("gpu_memory_utilization", gpu_memory_utilization, 0, 1, low_open=True)
    block_size = _checks.integer("block_size", block_size, 1, 2**16)
    max_num_batched_tokens = _checks.integer("max_num_batched_tokens", max_num_batched_tokens, 0, 2**40)
    max_num_seqs = _checks.integer("max_num_seqs", max_num_seqs, 0, 2**40)
    free = (gpu_memory_utilization * cost.hardware.hbm_bytes - cost.weight_bytes
            - reserved_bytes(cost, max_num_batched_tokens, max_num_seqs))
    return max(int(free // (block_size * cost.kv_bytes_per_token)), 0)


# -- knobs -------------------------------------------------------------------------------------------------------

def _int_knob(name, value, low, high=2**40):
    return _checks.integer(name, value, low, high)


def resolve_knobs(cost, policy, given, block_size, gpu_memory_utilization, num_kv_blocks) -> dict:
    """Every knob ``policy`` uses, validated, with vLLM's defaults (batchlab's for static and dynamic) filled in.

    ``given`` maps every name of :data:`KNOB_POLICIES` to the user's value or None.
    """
    gpu_memory_utilization = _checks.real("gpu_memory_utilization", gpu_memory_utilization, 0, 1, low_open=True)
    for knob, value in given.items():
        if value is not None and policy not in KNOB_POLICIES[knob]:
            raise ValueError(f"{knob} applies to policy {' or '.join(KNOB_POLICIES[knob])}, not {policy!r}")
    defaults = vllm_defaults(cost.hardware)
    knobs = {"block_size": _int_knob("block_size", block_size, 1, 2**16)}
    if policy in ("static", "dynamic"):
        batch_size = given["batch_size"]
        knobs["batch_size"] = _int_knob("batch_size", STATIC_BATCH_SIZE if batch_size is None else batch_size, 1)
        if policy == "dynamic":
            delay = DYNAMIC_MAX_QUEUE_DELAY_S if given["max_queue_delay_s"] is None else given["max_queue_delay_s"]
            knobs["max_queue_delay_s"] = _checks.real("max_queue_delay_s", delay, 0, allowed="finite seconds >= 0")
    else:
        _iteration_knobs(knobs, cost, policy, given, defaults)
    knobs["num_kv_blocks"] = _pool(cost, knobs, defaults, gpu_memory_utilization, num_kv_blocks)
    if policy == "chunked":
        check_chunked(knobs)
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
        knobs["prefill_only_steps"] = _checks.flag("prefill_only_steps", given["prefill_only_steps"], False)
        return
    threshold = given["long_prefill_token_threshold"]
    knobs["long_prefill_token_threshold"] = _int_knob("long_prefill_token_threshold",
                                                      0 if threshold is None else threshold, 0)
    for name in CHUNKED_SWITCHES:
        knobs[name] = _checks.flag(name, given[name], True)
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
    blocks = kv_pool_blocks(cost, gpu_memory_utilization, knobs["block_size"], tokens, seqs)
    if blocks < 2:
        raise ValueError(
            f"the weights ({cost.weight_bytes / 1e9:.1f} GB per GPU) and vLLM's other reservations leave no room "
            f"for a KV cache at gpu_memory_utilization={gpu_memory_utilization}; raise it, use tp > 1 or fp8")
    return blocks


def check_chunked(knobs) -> None:
    """Configurations vLLM 0.33 refuses to start with (``SchedulerConfig``): each a ValueError naming the knob."""
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


def rule_bits(policy: str, knobs: dict) -> int:
    """The kernel's rule bits for ``policy`` with resolved ``knobs``: :data:`ALWAYS_ON` and one bit per switch of
    :data:`CHUNKED_SWITCHES` that is on (chunked); 0 for the other policies, except that ``continuous`` counts as
    chunking on (its admission never stops at an unfit prompt)."""
    rules = ALWAYS_ON if policy == "chunked" else 0
    for name, bit in CHUNKED_SWITCHES.items():
        rules |= bit if knobs.get(name, name == "enable_chunked_prefill") else 0
    return rules


def clip_outputs(requests, max_model_len: int) -> np.ndarray:
    """Each request's output tokens as vLLM serves them: ``max_tokens`` clipped to what the context leaves
    (``max_model_len`` - prompt; 0 = no limit). A prompt that fills the context keeps its count: it is rejected."""
    output = requests.output_tokens
    if max_model_len:
        room = max_model_len - requests.prompt_tokens
        output = np.where(room > 0, np.minimum(output, room), output)
    return output


class Prepared(NamedTuple):
    """A run's inputs as the kernels take them (:func:`prepare`)."""

    knobs: dict  # every knob the policy uses, resolved and checked
    output: np.ndarray  # output tokens per request, clipped to max_model_len
    rules: int  # the chunked policy's rule bits
    prefix_ids: np.ndarray  # the stream's prefix block ids renumbered 0, 1, ... (int64)
    max_model_len: int  # 0: no limit


def prepare(requests, cost, policy: str, given: dict, block_size, gpu_memory_utilization, num_kv_blocks) -> Prepared:
    """The step :func:`batchlab.simulate` and the fleet share: knobs resolved with vLLM's defaults and checked as
    vLLM checks them, outputs clipped, rule bits set and prefix ids made dense. ``policy`` is one of
    ``POLICIES`` (the callers check it)."""
    knobs = resolve_knobs(cost, policy, given, block_size, gpu_memory_utilization, num_kv_blocks)
    max_model_len = knobs.get("max_model_len", 0)
    prefix_ids = np.unique(requests.prefix_ids, return_inverse=True)[1].astype(np.int64).reshape(-1)
    return Prepared(knobs, clip_outputs(requests, max_model_len), rule_bits(policy, knobs), prefix_ids,
                    max_model_len)
