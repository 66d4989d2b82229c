"""Speed of the jitted scheduler loop, per policy, in nanoseconds per sequence-step.

A sequence-step is one sequence taking part in one iteration (sum of ``steps.running``). The plain-Python
reference of ``tests/reference.py`` runs on the first requests of the same stream in the same process, and
the ratio of the two per-sequence-step costs is the speed-up. Run: ``python benchmarks/bench_simulate.py``.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import batchlab as bl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from reference import reference_simulate  # noqa: E402

N = 20_000
N_REFERENCE = 300
KNOBS = {
    "static": {"batch_size": 64},
    "dynamic": {"batch_size": 64, "max_queue_delay_s": 0.05},
    "continuous": {"max_num_seqs": 256},
    "chunked": {"max_num_seqs": 256, "max_num_batched_tokens": 2048},
}


def best_of(fn, repeat=3):
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))
    reqs = bl.synthetic(N, 1000, 250, prompt_cv=1.0, output_cv=1.0, rate=40.0, seed=0)
    small = reqs.head(N_REFERENCE)
    print(f"{N:,} requests (lognormal 1000/250 tokens, CV 1, Poisson 40 req/s), Llama-3-8B on H100 SXM")
    print(f"{'policy':<11} {'steps':>9} {'seq-steps':>12} {'kernel s':>9} {'ns/seq-step':>12} "
          f"{'ref ns/seq-step':>16} {'speed-up':>9}")
    for policy, knobs in KNOBS.items():
        kw = dict(knobs, num_kv_blocks=cost.kv_pool_blocks())
        bl.simulate(small, policy, cost, **kw)  # compile or load from cache outside the timing
        secs, res = best_of(lambda: bl.simulate(reqs, policy, cost, **kw))
        seq_steps = int(res.steps.running.sum())
        ref_secs, _ = best_of(lambda: reference_simulate(small, policy, cost, **kw), repeat=1)
        ref_seq_steps = int(bl.simulate(small, policy, cost, **kw).steps.running.sum())
        ns = secs / seq_steps * 1e9
        ref_ns = ref_secs / ref_seq_steps * 1e9
        print(f"{policy:<11} {len(res.steps):>9,} {seq_steps:>12,} {secs:>9.3f} {ns:>12.1f} {ref_ns:>16.0f} "
              f"{ref_ns / ns:>8.0f}x")


if __name__ == "__main__":
    main()
