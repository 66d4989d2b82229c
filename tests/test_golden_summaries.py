"""Behaviour pinned across refactors: every policy on the book's workloads gives bit-identical summaries.

``tests/golden/summaries.json`` was written before the package layout moved (issue 9) by
``python tests/test_golden_summaries.py --write``; a refactor that changes any number fails here. A change of
behaviour on purpose rewrites the file in the same commit and says why.

vLLM 0.33's rules (issue 10) are switched off here, and the pool is the first version's (90 % of HBM less the
weights), so the first version's schedules must come out bit for bit. Two rules changed rather than being
added, and have no switch: ``long_prefill_token_threshold`` is ignored for a request alone, and with chunking
off a prompt that does not fit the budget left stops admission. The ``chunked-threshold`` and
``chunked-unchunked`` entries were therefore rewritten when those rules landed (hand-worked cases in
``tests/test_vllm_rules.py`` pin both rules down).

Rewritten whole for issue 11, on purpose: the cost model now charges the embedding as a lookup and the LM head
on sampled rows only, and carries the fitted serving terms (API server, request latency, CPU per step), so every
step time and latency moved. ``tests/test_cost.py`` pins the new closed forms and ``tests/test_sim_reference.py``
the serving terms against the plain-Python reference.

The cost model here is pinned (:data:`PINNED`: the calibrated terms the file was last written with), so a
later re-fit of ``data/calibration.csv`` does not move these numbers: the file pins the scheduler and the step-cost
formulas, and a re-fit is checked where it belongs (chapter 13, ``tests/calibrate``).

Since issue 12 ``summary()`` reads ITL from a histogram the loop fills as it runs; the summaries pinned here are
computed from every token's time (``SimResult.summary_from_tokens``), so the schedules stay pinned bit for bit,
and ``tests/test_metrics_streaming.py`` holds ``summary()`` to them within the histogram's stated bound.

Since issue 25, vLLM 0.33's rules are pinned too: ``tests/golden/summaries_vllm033.json`` holds ``chunked`` on the
same workloads with every rule at vLLM's default (async scheduling, prefix caching, full-prompt reservation,
``max_model_len`` the model's) and the pool sized as vLLM 0.33 sizes it (``gpu_memory_utilization`` 0.92), under
the knob sets of :data:`DEFAULT_RULE_CONFIGS`. ``--write`` writes both files (a refactor leaves both untouched);
its test is parametrized over the configurations, not over the file, so a missing file or entry fails.
``tests/test_hash_grid.py`` pins every run's full output (token times, steps, schedule) as hashes.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

import batchlab as bl
from pinned import PINNED_CALIBRATION

GOLDEN = Path(__file__).resolve().parent / "golden" / "summaries.json"
GOLDEN_DEFAULT_RULES = GOLDEN.with_name("summaries_vllm033.json")
N_REQUESTS = 500
WORKLOADS = {  # preset -> arrival rate (req/s); None keeps the trace's own
    "azure-conv-2023": None, "azure-code-2023": None, "mooncake-conversation": 0.5, "sharegpt": None,
    "arxiv-summarization": 2.0,
}
CONFIGS = {
    "static": ("static", {"batch_size": 32}),
    "dynamic": ("dynamic", {"batch_size": 32, "max_queue_delay_s": 0.05}),
    "continuous": ("continuous", {"max_num_seqs": 256}),
    "continuous-v0": ("continuous", {"max_num_seqs": 256, "prefill_only_steps": True,
                                     "max_num_batched_tokens": 16384}),
    "chunked": ("chunked", {}),
    "chunked-small-pool": ("chunked", {"max_num_seqs": 128, "max_num_batched_tokens": 512, "num_kv_blocks": 700}),
    "chunked-threshold": ("chunked", {"max_num_batched_tokens": 2048, "long_prefill_token_threshold": 256}),
    "chunked-unchunked": ("chunked", {"max_num_batched_tokens": 16384, "enable_chunked_prefill": False}),
}


DEFAULT_RULE_CONFIGS = {  # chunked under vLLM 0.33's rules and pool: name -> knobs
    "vllm033": {},
    "vllm033-small-budget": {"max_num_seqs": 128, "max_num_batched_tokens": 512},
    "vllm033-threshold": {"max_num_batched_tokens": 2048, "long_prefill_token_threshold": 256},
    "vllm033-unchunked": {"enable_chunked_prefill": False},
    "vllm033-sync": {"async_scheduling": False},
    "vllm033-small-pool": {"num_kv_blocks": 700},
}


LEGACY_CHUNKED = {"async_scheduling": False, "enable_prefix_caching": False, "scheduler_reserve_full_isl": False,
                  "max_model_len": 0}


def first_pool(cost) -> int:
    """The first version's KV pool: 90 % of HBM less the weights, in blocks of 16 tokens."""
    return int((0.9 * cost.hardware.hbm_bytes - cost.weight_bytes) // (16 * cost.kv_bytes_per_token))


PINNED = PINNED_CALIBRATION  # the calibration the file was written with


def _summaries() -> dict:
    cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"), **PINNED)
    out = {}
    for workload, rate in WORKLOADS.items():
        reqs = bl.preset(workload, N_REQUESTS, rate, seed=7)
        for name, (policy, knobs) in CONFIGS.items():
            out[f"{workload}/{name}"] = _summary(policy, knobs, cost, reqs)
    return out


def _summary(policy, knobs, cost, reqs) -> dict:
    knobs = {"num_kv_blocks": first_pool(cost), **(LEGACY_CHUNKED if policy == "chunked" else {}), **knobs}
    return _tokens_summary(bl.simulate(reqs, policy, cost, **knobs))


def _tokens_summary(result) -> dict:
    summary = result.summary_from_tokens()
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}


def _default_rule_summaries() -> dict:
    """``chunked`` under vLLM 0.33's default rules and pool, on :data:`WORKLOADS`."""
    cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"), **PINNED)
    out = {}
    for workload, rate in WORKLOADS.items():
        reqs = bl.preset(workload, N_REQUESTS, rate, seed=7)
        for name, knobs in DEFAULT_RULE_CONFIGS.items():
            out[f"{workload}/{name}"] = _tokens_summary(bl.simulate(reqs, "chunked", cost, **knobs))
    return out


@pytest.mark.parametrize("key", [f"{w}/{c}" for w in WORKLOADS for c in CONFIGS])
def test_summary_unchanged(key, summaries):
    """Parametrized over the configurations, not over the file: a missing file or entry fails, never skips."""
    assert GOLDEN.is_file(), f"{GOLDEN} is missing: run this file with --write"
    golden = json.loads(GOLDEN.read_text())
    assert key in golden, f"{key} is not in {GOLDEN.name}: run this file with --write"
    assert golden[key] and {k: summaries[key][k] for k in golden[key]} == golden[key]


def test_the_golden_files_hold_exactly_the_grid():
    """No stale entry either: each file's keys are its grid's (a configuration renamed leaves none behind)."""
    assert sorted(json.loads(GOLDEN.read_text())) == sorted(f"{w}/{c}" for w in WORKLOADS for c in CONFIGS)
    assert sorted(json.loads(GOLDEN_DEFAULT_RULES.read_text())) == sorted(
        f"{w}/{c}" for w in WORKLOADS for c in DEFAULT_RULE_CONFIGS)


@pytest.fixture(scope="module")
def summaries():
    return _summaries()


@pytest.fixture(scope="module")
def default_rule_summaries():
    return _default_rule_summaries()


@pytest.mark.parametrize("key", [f"{w}/{c}" for w in WORKLOADS for c in DEFAULT_RULE_CONFIGS])
def test_default_rule_summary_unchanged(key, default_rule_summaries):
    assert GOLDEN_DEFAULT_RULES.is_file(), f"{GOLDEN_DEFAULT_RULES} is missing: run this file with --write"
    golden = json.loads(GOLDEN_DEFAULT_RULES.read_text())
    assert key in golden, f"{key} is not in {GOLDEN_DEFAULT_RULES.name}: run this file with --write"
    assert {k: default_rule_summaries[key][k] for k in golden[key]} == golden[key]


def test_default_rules_are_exercised(default_rule_summaries):
    """The default-rule entries reach preemption and rejection (prompts of max_model_len or more)."""
    runs = default_rule_summaries.values()
    assert sum(s["preemptions"] for s in runs) > 0
    assert sum(s["rejected"] for s in runs) > 0


if __name__ == "__main__" and "--write" in sys.argv:
    GOLDEN.write_text(json.dumps(_summaries(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
    GOLDEN_DEFAULT_RULES.write_text(json.dumps(_default_rule_summaries(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN_DEFAULT_RULES}")
