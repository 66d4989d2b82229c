"""``simulate``: replay a request stream through one batching policy, one iteration at a time.

This module checks its inputs, has :func:`batchlab.vllm.prepare` resolve the knobs with vLLM's defaults, and
calls the jitted loop in :mod:`batchlab._kernels`; the semantics of every policy are stated there and in DESIGN
section 4.
"""
from __future__ import annotations

from . import _checks

from ._kernels import POLICIES, STATUS_OK, Knobs, Stream, simulate_kernel
from .cost import CostModel
from .result import PROGRESS_GUARD, SimResult
from .vllm import BLOCK_SIZE, GPU_MEMORY_UTILIZATION, KNOB_POLICIES, prepare
from .workload import Requests

POLICY_CODE = {name: i for i, name in enumerate(POLICIES)}


def check_inputs(requests, cost) -> None:
    """The two objects every simulation takes, refused with a ValueError if they are not what it needs."""
    if not isinstance(requests, Requests):
        raise ValueError(f"requests must be a batchlab.Requests, got {type(requests).__name__}")
    if not isinstance(cost, CostModel):
        raise ValueError("cost must be a batchlab.CostModel")


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
    if worst > _checks.INT64_MAX:
        raise ValueError(f"num_kv_blocks={knobs['num_kv_blocks']} of block_size={knobs['block_size']} with prompts of "
                         f"up to {int(requests.prompt_tokens.max())} tokens lets a {policy} batch's prefill work "
                         f"(b x p_max^2 <= {worst:.3g}) pass 2**63; lower num_kv_blocks or the prompts")


def simulate(requests, policy: str, cost, *, batch_size=None, max_queue_delay_s=None, max_num_seqs=None,
             max_num_batched_tokens=None, prefill_only_steps=None, long_prefill_token_threshold=None,
             enable_chunked_prefill=None, async_scheduling=None, enable_prefix_caching=None,
             scheduler_reserve_full_isl=None, max_model_len=None, max_concurrency=None, block_size: int = BLOCK_SIZE,
             gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION, num_kv_blocks=None, record_schedule: bool = False,
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
    _checks.choice("policy", policy, POLICIES)
    check_inputs(requests, cost)
    given = {name: value for name, value in locals().items() if name in KNOB_POLICIES}  # the knob arguments
    run = prepare(requests, cost, policy, given, block_size, gpu_memory_utilization, num_kv_blocks)
    knobs = run.knobs
    _check_int64(requests, policy, knobs)
    record = _checks.flag("record_schedule", record_schedule, False)
    record_tokens = _checks.flag("record_tokens", record_tokens, True)
    stream = Stream(requests.arrival_s, requests.prompt_tokens, run.output, run.prefix_ids, requests.prefix_offsets,
                    requests.prefix_block_tokens)
    out = simulate_kernel(stream, Knobs(
        POLICY_CODE[policy], cost.coefficients(), knobs.get("batch_size", 1), knobs.get("max_queue_delay_s", 0.0),
        knobs.get("max_num_seqs", 1), knobs.get("max_num_batched_tokens", 0),
        knobs.get("long_prefill_token_threshold", 0), run.rules, knobs.get("prefill_only_steps", False),
        knobs["num_kv_blocks"] - 1, knobs["block_size"], record, knobs.get("max_concurrency") or 0,
        run.max_model_len, record_tokens))
    if out.status != STATUS_OK:
        raise RuntimeError(PROGRESS_GUARD)
    return SimResult(requests, policy, cost, dict(knobs), out, record, run.output, record_tokens)
