"""A million requests through ``chunked`` with vLLM 0.33's defaults, metrics included: time and peak memory.

The stream is ``preset("azure-conv-2023", n)`` at the trace's own rate (5.5 req/s), Llama-3-8B on one H100 SXM,
vLLM's defaults (async scheduling, prefix caching, full-prompt reservation, ``max_model_len``), no token record
(``record_tokens=False``: the metrics are accumulated as the loop runs). Printed, all from this one run:

- seconds to draw the stream, to simulate, to summarise (``summary()``), and the simulation plus summary;
- the process's peak resident memory (everything: interpreter, libraries, the stream, the run);
- nanoseconds per sequence-step of the run, and the ratio to the bare-loop yardstick of
  ``bench_simulate.py`` (which records every token's time, so it runs on the first 100,000 requests only).

Run: ``python benchmarks/bench_scale.py [n_requests]`` (default 1,000,000).
"""
from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

import batchlab as bl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_simulate import bare_loop  # noqa: E402

PRESET = "azure-conv-2023"
BARE_REQUESTS = 100_000


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # ru_maxrss is in KiB on Linux


def main(n: int) -> None:
    cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))
    bl.simulate(bl.preset(PRESET, 200), "chunked", cost, record_tokens=False).summary()  # compile or load the cache
    t0 = time.perf_counter()
    requests = bl.preset(PRESET, n)
    t1 = time.perf_counter()
    res = bl.simulate(requests, "chunked", cost, record_tokens=False)
    t2 = time.perf_counter()
    summary = res.summary()
    t3 = time.perf_counter()
    peak = peak_rss_gb()
    kernel_ns = (t2 - t1) / res.sequence_steps * 1e9

    head = requests.head(BARE_REQUESTS)
    seats = res.knobs["max_num_seqs"]
    bare_loop(head.arrival_s[:10], head.prompt_tokens[:10], head.output_tokens[:10], seats)  # compile
    b0 = time.perf_counter()
    _, bare_steps = bare_loop(head.arrival_s, head.prompt_tokens, head.output_tokens, seats)
    bare_ns = (time.perf_counter() - b0) / bare_steps * 1e9

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{n:,} requests of {PRESET} at its trace's rate, chunked with vLLM {bl.VLLM_VERSION}'s defaults "
          f"(async scheduling, prefix caching, full-prompt reservation), Llama-3-8B on H100 SXM, no token record")
    print(f"machine: {os.cpu_count()} cores, load average {load}")
    print(f"draw the stream   {t1 - t0:7.2f} s")
    print(f"simulate          {t2 - t1:7.2f} s   ({len(requests):,} requests, {res.n_steps:,} steps, "
          f"{res.sequence_steps:,} sequence-steps, {summary['total_output_tokens']:,} output tokens)")
    print(f"summary()         {t3 - t2:7.2f} s")
    print(f"simulate+summary  {t3 - t1:7.2f} s")
    print(f"peak memory       {peak:7.2f} GB (whole process)")
    print(f"kernel {kernel_ns:.1f} ns/sequence-step; bare loop {bare_ns:.1f} ns/sequence-step on the first "
          f"{BARE_REQUESTS:,} requests; ratio {kernel_ns / bare_ns:.2f}x")
    print(f"completed {summary['completed']:,}, rejected {summary['rejected']:,}, "
          f"median TTFT {summary['median_ttft_ms']:.1f} ms, median ITL {summary['median_itl_ms']:.2f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
