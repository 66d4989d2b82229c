"""The regression net: a hash of everything a run returns, over presets x knob sets x record modes, and the fleet.

Issue 25 refactors the kernels with behaviour unchanged bit for bit; this file is what "bit for bit" is checked
against. ``tests/golden/hash_grid.json`` holds, per grid cell (``workload/knobs/record``, readable), SHA-256
digests (the first 16 hex digits) of what the run returns through the public API, part by part:

- ``requests``: every column of ``SimResult.requests`` (arrival, sent, scheduled, first-token, finish and release
  times, latencies, token counts, preemptions, cached and recomputed tokens, rejected and the reject reason);
- ``tokens``: ``token_offsets`` and ``token_times_flat``, every output token's time (``record_tokens=True``);
- ``steps``: every column of ``SimResult.steps``, one row per iteration (``record_tokens=True``);
- ``schedule``: step, request, tokens and kind of every schedule row (``record_schedule=True``);
- ``summary``: ``summary()`` (ITL from the loop's histogram), and ``summary_from_tokens`` (``record_tokens``);
- ``counts``: ``n_steps`` and ``sequence_steps``;
- the fleet adds ``engines`` (which engine served or prefilled, which decoded each request), ``replicas``
  (``FleetResult.summaries()``, one row per engine) and ``transfers`` (disaggregated: every KV transfer).

Arrays are hashed as raw bytes (floats as float64, integers and flags as int64, so a dtype change of a column
that keeps its values does not move a digest); the columns and summary keys hashed are the ones listed in the
file's ``meta`` when it was written, so a column added later does not move a digest either, while one removed
fails. The cost model is pinned (``tests/pinned.py``), so a re-fit of ``data/calibration.csv`` moves nothing.

The grid (``CELLS``, 696 cells): eight workloads of 300 requests (seed 7): the five presets of ``bl.preset_names()``
at fixed rates (all five: the whole grid runs in about 10 s), two that share prefixes (``shared_prefix``,
``multi_turn``) and one of equal 512-token prompts (``fixed``), whose sums land exactly on every token budget and
block boundary, where an off-by-one shows. Each under 20 knob sets: vLLM 0.33's defaults for the H100; few and many
seats; a small and a large token budget; ``long_prefill_token_threshold``; chunked prefill off; async scheduling
off; prefix caching off; full-prompt reservation off; a small KV pool (preemption); a closed-loop client
(``max_concurrency``); the legacy rules (vLLM 0.33's rule bits off, as ``test_golden_summaries.py``) on the first
version's pool, on a small pool, and on a small pool with chunked prefill off (a preempted request whose
recomputation exceeds the budget is rejected); ``continuous`` (Orca) uncapped, with a prompt-token cap per
iteration, and with vLLM V0's prefill-only steps; ``static``; ``dynamic``. Each run in all four record modes
(``record_tokens`` x ``record_schedule``). Then the fleet on two workloads: one replica (which must equal
``simulate``), three replicas under each router, a preempting pair, and disaggregated serving (1 prefill + 2 decode
over NVLink, 2 + 2 over the network), each in the four record modes. The tests also check that the record modes
agree where they overlap, that a fleet of one is ``simulate``, and that the grid reaches preemption, rejection
(every reason), prefix-cache hits and KV transfers.

A change of behaviour on purpose rewrites the file (``python tests/test_hash_grid.py --write``) in the same
commit and says why; a refactor must leave it untouched.
"""
from __future__ import annotations

import hashlib
import json
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest

import batchlab as bl
from pinned import PINNED_CALIBRATION

GOLDEN = Path(__file__).resolve().parent / "golden" / "hash_grid.json"
N_REQUESTS = 300
SEED = 7
DIGITS = 16  # hex digits of each SHA-256 kept in the file
PRESET_RATES = {  # preset -> arrival rate (req/s): each engine busy, queues and the long prompts' rejections seen
    "azure-code-2023": 8.0, "azure-conv-2023": 10.0, "mooncake-conversation": 1.0, "sharegpt": 25.0,
    "arxiv-summarization": 4.0,
}
LEGACY = {"async_scheduling": False, "enable_prefix_caching": False, "scheduler_reserve_full_isl": False,
          "max_model_len": 0}  # vLLM 0.33's rule bits off, as test_golden_summaries.LEGACY_CHUNKED
FIRST_POOL = "first pool"  # placeholder for the first version's pool (90 % of HBM less the weights)
KNOB_SETS = {  # name -> (policy, knobs)
    "vllm033": ("chunked", {}),
    "seqs-8": ("chunked", {"max_num_seqs": 8}),
    "seqs-2048": ("chunked", {"max_num_seqs": 2048}),
    "tokens-512": ("chunked", {"max_num_seqs": 128, "max_num_batched_tokens": 512}),
    "tokens-32768": ("chunked", {"max_num_batched_tokens": 32768}),
    "threshold-256": ("chunked", {"max_num_batched_tokens": 2048, "long_prefill_token_threshold": 256}),
    "unchunked": ("chunked", {"enable_chunked_prefill": False}),
    "sync": ("chunked", {"async_scheduling": False}),
    "no-prefix-cache": ("chunked", {"enable_prefix_caching": False}),
    "no-reserve": ("chunked", {"scheduler_reserve_full_isl": False}),
    "preempting": ("chunked", {"num_kv_blocks": 600}),
    "closed-loop-16": ("chunked", {"max_concurrency": 16}),
    "legacy": ("chunked", {**LEGACY, "num_kv_blocks": FIRST_POOL}),
    "legacy-small-pool": ("chunked", {**LEGACY, "max_num_seqs": 128, "max_num_batched_tokens": 512,
                                      "num_kv_blocks": 300}),
    "legacy-unchunked-small-pool": ("chunked", {**LEGACY, "enable_chunked_prefill": False, "max_num_seqs": 128,
                                                "max_num_batched_tokens": 1024, "num_kv_blocks": 200}),
    "continuous": ("continuous", {"max_num_seqs": 256}),
    "continuous-budget-2048": ("continuous", {"max_num_seqs": 256, "max_num_batched_tokens": 2048}),
    "continuous-v0": ("continuous", {"max_num_seqs": 256, "prefill_only_steps": True,
                                     "max_num_batched_tokens": 16384}),
    "static": ("static", {"batch_size": 32}),
    "dynamic": ("dynamic", {"batch_size": 32, "max_queue_delay_s": 0.05}),
}
RECORD_MODES = {  # name -> (record_tokens, record_schedule)
    "tokens": (True, False), "tokens+schedule": (True, True), "schedule": (False, True), "none": (False, False),
}
FLEET_WORKLOADS = ("sharegpt", "shared-prefix")
FLEETS = {  # name -> (function, arguments)
    "fleet-1": ("fleet", {"n_replicas": 1}),
    "fleet-3-round-robin": ("fleet", {"n_replicas": 3, "router": "round_robin"}),
    "fleet-3-least-outstanding": ("fleet", {"n_replicas": 3, "router": "least_outstanding"}),
    "fleet-3-prefix-aware": ("fleet", {"n_replicas": 3, "router": "prefix_aware"}),
    "fleet-2-preempting": ("fleet", {"n_replicas": 2, "num_kv_blocks": 600, "max_num_batched_tokens": 2048}),
    "disagg-1p2d-nvlink": ("disaggregated", {"n_prefill": 1, "n_decode": 2, "link": "nvlink"}),
    "disagg-2p2d-network": ("disaggregated", {"n_prefill": 2, "n_decode": 2, "link": "network",
                                              "router": "round_robin"}),
}
FLEET_RATE = 3.0  # the fleet workloads' arrival rate is this times the single engine's


@cache
def cost_model() -> bl.CostModel:
    return bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"), **PINNED_CALIBRATION)


@cache
def workload(name: str, rate_scale: float = 1.0) -> bl.Requests:
    if name in PRESET_RATES:
        return bl.preset(name, N_REQUESTS, PRESET_RATES[name] * rate_scale, seed=SEED)
    if name == "shared-prefix":
        return bl.shared_prefix(N_REQUESTS, n_groups=4, prompts_per_group=15, system_prompt_tokens=1024,
                                question_tokens=200, output_tokens=120, rate_req_s=12.0 * rate_scale, seed=SEED)
    if name == "fixed-512":  # every prompt 512 tokens (32 blocks): sums land exactly on every budget
        return bl.fixed(N_REQUESTS, 512, 64, rate_req_s=30.0 * rate_scale, seed=SEED)
    if name == "multi-turn":
        return bl.multi_turn(60, 5, system_prompt_tokens=512, user_tokens=150, output_tokens=200,
                             rate_req_s=2.0 * rate_scale, turn_gap_s=5.0, seed=SEED)
    raise KeyError(name)


WORKLOADS = (*PRESET_RATES, "shared-prefix", "multi-turn", "fixed-512")
CELLS = ([f"{w}/{k}/{r}" for w in WORKLOADS for k in KNOB_SETS for r in RECORD_MODES]
         + [f"{w}/{f}/{r}" for w in FLEET_WORKLOADS for f in FLEETS for r in RECORD_MODES])


def first_pool(cost) -> int:
    """The first version's KV pool: 90 % of HBM less the weights, in blocks of 16 tokens."""
    return int((0.9 * cost.hardware.hbm_bytes - cost.weight_bytes) // (16 * cost.kv_bytes_per_token))


def run(cell: str):
    """The SimResult (one engine) or FleetResult of grid cell ``cell``."""
    name, knobs_name, mode = cell.split("/")
    record_tokens, record_schedule = RECORD_MODES[mode]
    cost = cost_model()
    if knobs_name in FLEETS:
        kind, args = FLEETS[knobs_name]
        reqs = workload(name, FLEET_RATE)
        fn = bl.simulate_fleet if kind == "fleet" else bl.simulate_disaggregated
        return fn(reqs, cost, record_tokens=record_tokens, record_schedule=record_schedule, **args)
    policy, knobs = KNOB_SETS[knobs_name]
    knobs = {k: first_pool(cost) if v == FIRST_POOL else v for k, v in knobs.items()}
    return bl.simulate(workload(name), policy, cost, record_tokens=record_tokens, record_schedule=record_schedule,
                       **knobs)


# -- hashing ----------------------------------------------------------------------------------------------------
def _array_bytes(values) -> bytes:
    a = np.asarray(values)
    if a.dtype.kind == "f":
        return np.ascontiguousarray(a, dtype=np.float64).tobytes()
    if a.dtype.kind in "iub":
        return np.ascontiguousarray(a, dtype=np.int64).tobytes()
    return "\x1f".join(map(str, a.tolist())).encode()  # strings (reject reasons, step bounds, schedule kinds)


def _digest(named: list[tuple[str, object]]) -> str:
    h = hashlib.sha256()
    for name, values in named:
        data = _array_bytes(values)
        h.update(f"{name}:{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()[:DIGITS]


def _frame(df, columns) -> str:
    missing = [c for c in columns if c not in df.columns]
    assert not missing, f"columns gone: {missing}"
    return _digest([("index", df.index.to_numpy())] + [(c, df[c].to_numpy()) for c in columns])


def _summary(summary: dict, keys) -> str:
    missing = [k for k in keys if k not in summary]
    assert not missing, f"summary keys gone: {missing}"
    return hashlib.sha256(json.dumps({k: summary[k] for k in keys}, sort_keys=True).encode()).hexdigest()[:DIGITS]


def sim_parts(res, meta: dict) -> dict[str, str]:
    """The digests of one SimResult, part by part."""
    parts = {"requests": _frame(res.requests, meta["request_columns"]),
             "summary": _summary(res.summary(), meta["summary_keys"]),
             "counts": _digest([("n_steps", [res.n_steps]), ("sequence_steps", [res.sequence_steps])])}
    if res.recorded_tokens:
        parts["tokens"] = _digest([("offsets", res.token_offsets), ("times", res.token_times_flat)])
        parts["steps"] = _frame(res.steps, meta["step_columns"])
        parts["summary_from_tokens"] = _summary(res.summary_from_tokens(), meta["summary_keys"])
    if res._recorded:
        sched = res.schedule
        parts["schedule"] = _digest([(c, sched[c].to_numpy()) for c in ("step", "request", "tokens")]
                                    + [("kind", sched["kind"].astype(str).to_numpy())])
    return parts


def cell_parts(res, meta: dict) -> dict[str, str]:
    if not isinstance(res, bl.FleetResult):
        return sim_parts(res, meta)
    parts = {f"fleet.{k}": v for k, v in sim_parts(res.fleet, meta).items()}
    parts["summary"] = _summary(res.summary(), [*meta["summary_keys"], "n_gpus"])
    parts["engines"] = _digest([("engine", res.engine), ("decode_engine", res.decode_engine)])
    replicas = res.summaries()
    parts["replicas"] = _frame(replicas, ["role", "requests", *meta["summary_keys"]])
    if res.disaggregated:
        parts["transfers"] = _frame(res.transfers, meta["transfer_columns"])
    return parts


def current_meta() -> dict:
    """What is hashed, read off one run: the file stores it, so columns added later do not move a digest."""
    res = bl.simulate(workload("sharegpt"), "chunked", cost_model(), record_tokens=True, record_schedule=True)
    disagg = bl.simulate_disaggregated(workload("sharegpt"), cost_model())
    return {"request_columns": list(res.requests.columns), "step_columns": list(res.steps.columns),
            "summary_keys": sorted(res.summary()), "transfer_columns": list(disagg.transfers.columns),
            "n_requests": N_REQUESTS, "seed": SEED, "calibration": "tests/pinned.py PINNED_CALIBRATION"}


KINDS = ("preemptions", "cached", "transfers", "reject_kv", "reject_budget", "reject_model_len",
         "reject_recompute")


def coverage(res) -> dict[str, int]:
    """What the run exercised: preemptions, rejections by reason, prefix-cache hits, KV transfers."""
    view = res.fleet if isinstance(res, bl.FleetResult) else res
    df = view.requests
    reasons = df["reject_reason"][df["rejected"]]
    out = {"preemptions": int(df["preemptions"].sum()), "cached": int(df["cached_tokens"].sum()),
           "transfers": len(res.transfers) if isinstance(res, bl.FleetResult) and res.disaggregated else 0}
    for key, words in (("reject_kv", "KV blocks"), ("reject_budget", "cannot split"),
                       ("reject_model_len", "max_model_len"), ("reject_recompute", "recomputing")):
        out[key] = int(reasons.str.contains(words).sum())
    return out


def compute_grid(meta: dict, cells=CELLS) -> tuple[dict, dict]:
    """Digests and coverage of every cell; a cell whose run raises gets the error as its one part."""
    hashes, seen = {}, {}
    for cell in cells:
        try:
            res = run(cell)
        except Exception as error:  # noqa: BLE001 - reported per cell by test_hashes_unchanged
            hashes[cell], seen[cell] = {"error": f"{type(error).__name__}: {error}"}, {}
            continue
        hashes[cell] = cell_parts(res, meta)
        seen[cell] = coverage(res)
    return hashes, seen


# -- tests ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def golden() -> dict:
    assert GOLDEN.is_file(), f"{GOLDEN} is missing: write it with python tests/test_hash_grid.py --write"
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def grid(golden):
    return compute_grid(golden["meta"])


def test_file_lists_the_grid(golden):
    assert sorted(golden["cells"]) == sorted(CELLS)


@pytest.mark.parametrize("group", [*WORKLOADS, "fleet"])
def test_hashes_unchanged(group, golden, grid):
    hashes, _ = grid
    cells = [c for c in CELLS if (c.split("/")[1] in FLEETS) == (group == "fleet")
             and (group == "fleet" or c.startswith(group + "/"))]
    moved = {c: sorted(p for p in set(hashes[c]) | set(golden["cells"][c])
                       if hashes[c].get(p) != golden["cells"][c].get(p)) for c in cells}
    moved = {c: parts for c, parts in moved.items() if parts}
    assert not moved, f"{len(moved)} of {len(cells)} cells moved (cell: parts): " + "; ".join(
        f"{c}: {', '.join(p)}" for c, p in moved.items())


def test_record_modes_agree(grid):
    """Recording changes what is kept, never the schedule: every part two record modes both have is the same."""
    hashes, _ = grid
    for cell in CELLS:
        if not cell.endswith("/tokens+schedule"):
            continue
        full = hashes[cell]
        for mode in RECORD_MODES:
            other = hashes[cell.rsplit("/", 1)[0] + "/" + mode]
            assert {p: other[p] for p in other} == {p: full[p] for p in other}, (cell, mode)


def test_one_replica_is_simulate(grid):
    """A fleet of one is simulate(policy="chunked") bit for bit (simulate_fleet's docstring)."""
    hashes, _ = grid
    for w in FLEET_WORKLOADS:
        single = sim_parts(bl.simulate(workload(w, FLEET_RATE), "chunked", cost_model(), record_schedule=True),
                           json.loads(GOLDEN.read_text())["meta"])
        fleet = hashes[f"{w}/fleet-1/tokens+schedule"]
        for part in ("requests", "tokens", "steps", "schedule", "counts"):
            assert fleet[f"fleet.{part}"] == single[part], (w, part)


def test_grid_reaches_every_path(grid):
    """The net catches only what the grid runs: preemption, every reject reason, prefix hits and KV transfers."""
    _, seen = grid
    totals = {k: sum(s.get(k, 0) for s in seen.values()) for k in KINDS}
    assert all(v > 0 for v in totals.values()), totals
    fleet_preempt = sum(s.get("preemptions", 0) for c, s in seen.items() if c.split("/")[1] in FLEETS)
    assert fleet_preempt > 0


if __name__ == "__main__" and "--write" in sys.argv:
    import time
    t0 = time.perf_counter()
    meta = current_meta()
    hashes, seen = compute_grid(meta)
    errors = {c: h["error"] for c, h in hashes.items() if "error" in h}
    assert not errors, errors
    GOLDEN.write_text(json.dumps({"meta": meta, "cells": hashes}, indent=1, sort_keys=True) + "\n")
    totals = {k: sum(s[k] for s in seen.values()) for k in KINDS}
    print(f"wrote {GOLDEN}: {len(hashes)} cells in {time.perf_counter() - t0:.1f} s; reached {totals}")
