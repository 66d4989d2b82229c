"""Every numba-jitted function of batchlab: the step cost and the scheduler loops with their helpers.

Kernels take and return NumPy arrays and scalars, read no mutable globals and draw no random numbers; the
integer slot names of :mod:`.layout` are frozen into the compiled code. The public wrappers are
:class:`batchlab.CostModel` (the step cost) and :func:`batchlab.simulate` (the loops); the plain-Python
reference in ``tests/reference.py`` must agree with both.

Modules: :mod:`.layout` (slot names), :mod:`.state` (the NamedTuples that cross calls: inputs, an engine's state,
its loop's settings, outputs), :mod:`.cost` (the step cost), :mod:`.records` (growing records),
:mod:`.gaps` (the inter-token gap histogram), :mod:`.batched` (static and dynamic batching), :mod:`.kvcache` (the
block pool and prefix cache), :mod:`.iterations` (the steps of continuous and chunked), :mod:`.engine` (their
loop, resumable) and :mod:`.fleet` (several engines: replicas behind a router, disaggregated prefill and decode).

Helpers that never allocate are compiled with ``_nrt=False``: the arrays they are passed are borrowed from the
loop that owns them, so numba emits no reference counting for them. Those counts are atomic operations, and
around calls LLVM cannot inline they cost a third of the loop's time; numba refuses to compile such a helper if
it ever allocates, so the flag cannot hide a leak. Numba's on-disk cache notices only edits to a function's own file,
not to the functions it calls in other files, so this package keys its cache folder by a hash of all its
sources: an edit anywhere recompiles everything once, and a stale kernel is never loaded.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import NamedTuple

import numba

_SOURCES = sorted(Path(__file__).resolve().parent.glob("*.py"))
SOURCE_STAMP = hashlib.sha256(b"".join(p.read_bytes() for p in _SOURCES)).hexdigest()[:16]


def _cache_dir() -> str:
    """``$NUMBA_CACHE_DIR`` (else ``~/.cache/batchlab/numba``), one folder per version of these sources."""
    base = os.environ.get("NUMBA_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                                       "batchlab", "numba")
    return str(Path(base, SOURCE_STAMP))


_previous_cache_dir = numba.config.CACHE_DIR
numba.config.CACHE_DIR = _cache_dir()  # read when each @njit(cache=True) below is decorated
try:
    from .cost import step_cost
    from .entry import simulate_kernel
    from .fleet import fleet_kernel
    from .layout import *  # noqa: F403 - the slot names are this package's interface
    from .state import Engine, FleetOutput, KernelOutput, Knobs, LoopConfig, Stream
finally:
    numba.config.CACHE_DIR = _previous_cache_dir


class Rule(NamedTuple):
    """One vLLM rule the ``chunked`` policy follows: where vLLM has it, and where batchlab has it and pins it."""

    rule: str
    vllm_source: str  # file (and function) in vLLM 0.33.0's source
    kernel: str  # the batchlab function that implements it (dotted)
    reference: str  # its plain-Python mirror, "tests/reference.py::function"
    test: str  # the hand-worked test, "tests/<file>.py::test_..."


_REF = "tests/reference.py::"
_RULES = "tests/test_vllm_rules.py::"
_CASES = "tests/test_sim_cases.py::"
_SCHED = "vllm/v1/core/sched/scheduler.py Scheduler.schedule"
_ASYNC = "vllm/v1/core/sched/async_scheduler.py AsyncScheduler"
# vLLM 0.33 rule -> vLLM source -> batchlab function -> reference -> hand test (DESIGN section 4c);
# tests/test_rule_map.py checks that every function and test named here exists.
RULE_MAP = (
    Rule("running requests are scheduled before waiting ones, in admission order", _SCHED,
         "batchlab._kernels.iterations._schedule_running", _REF + "_vllm_033", _RULES + "test_schedule_order"),
    Rule("the preemption victim is the last running request (FCFS), put back at the front of the queue",
         "vllm/v1/core/sched/scheduler.py Scheduler._preempt_request", "batchlab._kernels.iterations.choose_victim",
         _REF + "choose_victim", _RULES + "test_preemption_and_resume"),
    Rule("the waiting request tried next is the front of the queue (FCFS)", _SCHED,
         "batchlab._kernels.iterations.next_waiting", _REF + "next_waiting", _RULES + "test_schedule_order"),
    Rule("a step that preempted admits no waiting request", _SCHED, "batchlab._kernels.engine._run_until",
         _REF + "_vllm_033", _CASES + "test_a_step_that_preempts_admits_nobody"),
    Rule("a preempted request recomputes its prompt and the output so far",
         "vllm/v1/core/sched/scheduler.py Scheduler._preempt_request", "batchlab._kernels.iterations._preempt_row",
         _REF + "_vllm_033", _CASES + "test_preempted_request_recomputes_prompt_and_output"),
    Rule("full-prompt reservation: admitted only if the whole prompt's blocks are free", _SCHED,
         "batchlab._kernels.kvcache.blocks_to_admit", _REF + "_vllm_033",
         _RULES + "test_full_prompt_reservation_under_kv_pressure"),
    Rule("long_prefill_token_threshold is ignored for a request alone", _SCHED, "batchlab._kernels.engine._run_until",
         _REF + "_vllm_033", _RULES + "test_long_prefill_threshold_ignored_when_alone"),
    Rule("chunking off: a waiting prompt that does not fit the budget left stops admission", _SCHED,
         "batchlab._kernels.iterations._admit_waiting", _REF + "_vllm_033",
         _CASES + "test_chunking_disabled_stops_at_a_prompt_that_does_not_fit"),
    Rule("a prefix-cache hit never covers the last prompt token",
         "vllm/v1/core/kv_cache_manager.py KVCacheManager.get_computed_blocks", "batchlab._kernels.kvcache.longest_hit",
         _REF + "BlockPool.hits", _RULES + "test_prefix_hit_never_covers_the_last_token"),
    Rule("full blocks are found by a hash chain, block by block from the prompt's start",
         "vllm/v1/core/kv_cache_utils.py hash_block_tokens", "batchlab._kernels.kvcache.block_key", _REF + "_key",
         _RULES + "test_shared_prefix_is_found_block_by_block"),
    Rule("freed blocks stay cached and are evicted least recently used, a request's last block first",
         "vllm/v1/core/block_pool.py BlockPool.free_blocks", "batchlab._kernels.kvcache.release",
         _REF + "BlockPool.release", _RULES + "test_preemption_and_resume"),
    Rule("async scheduling: a finished request holds its seat and blocks one step longer", _ASYNC,
         "batchlab._kernels.iterations._release_finished", _REF + "_vllm_033",
         _RULES + "test_async_scheduling_holds_a_finished_seat_one_step"),
    Rule("async scheduling: a request that arrives during a step is scheduled one step later", _ASYNC,
         "batchlab._kernels.engine._run_until", _REF + "_vllm_033",
         _RULES + "test_async_scheduling_sees_an_arrival_one_step_later"),
    Rule("a prompt of max_model_len tokens or more is rejected", "vllm/v1/engine/input_processor.py InputProcessor",
         "batchlab._kernels.entry.reject_up_front", _REF + "reference_simulate",
         _RULES + "test_max_model_len_rejects_and_clips"),
    Rule("max_tokens is clipped to what max_model_len leaves", "vllm/entrypoints/utils.py get_max_tokens",
         "batchlab.vllm.clip_outputs", _REF + "reference_simulate", _RULES + "test_max_model_len_rejects_and_clips"),
    Rule("closed-loop clients: a request is sent when a client slot frees", "vllm/benchmarks/serve.py benchmark",
         "batchlab._kernels.iterations._send_and_queue", _REF + "_vllm_033",
         _RULES + "test_closed_loop_sends_when_a_slot_frees"),
    Rule("max_num_seqs and max_num_batched_tokens default by GPU and usage",
         "vllm/engine/arg_utils.py EngineArgs.get_batch_defaults", "batchlab.vllm.vllm_defaults",
         _REF + "reference_simulate", _RULES + "test_vllm_033_defaults"),
    Rule("configurations vLLM refuses to start with", "vllm/config/scheduler.py SchedulerConfig",
         "batchlab.vllm.check_chunked", _REF + "reference_simulate", _RULES + "test_configurations_vllm_refuses"),
    Rule("the KV pool is what the weights, the profiled activations and the reservations leave",
         "vllm/v1/worker/gpu_worker.py Worker.determine_available_memory", "batchlab.vllm.kv_pool_blocks",
         _REF + "reference_simulate", _RULES + "test_kv_pool_matches_the_published_llama2_7b_pool"),
)

__all__ = ["SOURCE_STAMP", "Engine", "FleetOutput", "KernelOutput", "Knobs", "LoopConfig", "Stream", "fleet_kernel",
           "simulate_kernel", "step_cost", "RULE_MAP", "Rule"]
