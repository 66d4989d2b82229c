"""Replay whole traces with their real arrival times through vLLM 0.33's chunked scheduler on Llama-3-8B / H100
SXM, and time them: the Azure 2023 conversation trace (19,366 requests) and the Mooncake conversation trace
(12,031 requests with their prefix hash ids, prefix caching on, a 128k context, a pool that keeps every block).

Needs the trace: ``BATCHLAB_DATA_DIR`` pointing at a local mirror (the Makefile sets it when
``../shared/data/traces`` exists), or network access for ``batchlab.datasets`` to download it.
Run: ``python benchmarks/bench_replay.py``.
"""
from __future__ import annotations

import time

import batchlab as bl
from batchlab.datasets import replay


def main():
    cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))
    t0 = time.perf_counter()
    reqs = replay("azure-conv-2023")
    t_load = time.perf_counter() - t0
    bl.simulate(reqs.head(50), "chunked", cost)  # compile or load the kernel outside the timing
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        res = bl.simulate(reqs, "chunked", cost)
        s = res.summary()
        best = min(best, time.perf_counter() - t0)
    print(f"azure-conv-2023: {len(reqs):,} requests over {reqs.arrival_s[-1] / 60:.1f} min of trace, "
          f"chunked (vLLM defaults for H100: {bl.vllm_defaults(cost.hardware)}), Llama-3-8B on H100 SXM")
    print(f"loading the trace:      {t_load:6.2f} s")
    print(f"simulate + summary():   {best:6.2f} s  (best of 3; {len(res.steps):,} iterations)")
    print(f"completed {s['completed']:,}, rejected {s['rejected']}, p99 TTFT {s['p99_ttft_ms']:.0f} ms, "
          f"p99 ITL {s['p99_itl_ms']:.0f} ms, output {s['output_throughput']:.0f} tok/s")


def mooncake():
    cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))
    reqs = replay("mooncake-conversation")
    knobs = {"max_model_len": 131_072, "max_num_batched_tokens": 16_384, "num_kv_blocks": 1_200_000}
    bl.simulate(reqs.head(50), "chunked", cost, **knobs)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        res = bl.simulate(reqs, "chunked", cost, **knobs)
        s = res.summary()
        best = min(best, time.perf_counter() - t0)
    reuse = 1 - len(set(reqs.prefix_ids.tolist())) / reqs.prefix_ids.size
    print(f"mooncake-conversation: {len(reqs):,} requests, prefix caching on, {knobs}")
    print(f"simulate + summary():   {best:6.2f} s  (best of 3; {len(res.steps):,} iterations)")
    print(f"prefix-cache hit rate {s['prefix_cache_hit_rate']:.3f} (the trace's block reuse: {reuse:.3f}), "
          f"preemptions {s['preemptions']}, completed {s['completed']:,}")


if __name__ == "__main__":
    main()
    mooncake()
