"""Wall time of a 64-configuration sweep over 2,000 requests, serially and on 2 worker processes.

Run: ``python benchmarks/bench_sweep.py``. Both timings and their ratio come from this one run.
"""
from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor

import batchlab as bl

GRID = {"max_num_seqs": [8, 16, 32, 64, 128, 256, 512, 1024],
        "max_num_batched_tokens": [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]}


def main():
    cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))
    reqs = bl.synthetic(2000, 1000, 250, prompt_cv=1.0, output_cv=1.0, rate_req_s=20.0, seed=0)
    bl.simulate(reqs.head(20), "chunked", cost)  # load the kernel outside the timing
    t0 = time.perf_counter()
    serial = bl.sweep(reqs, GRID, cost, progress=False)
    t_serial = time.perf_counter() - t0
    with ProcessPoolExecutor(2) as pool:
        list(pool.map(abs, range(2)))  # start the workers outside the timing
        t0 = time.perf_counter()
        pooled = bl.sweep(reqs, GRID, cost, executor=pool, progress=False)
        t_pool = time.perf_counter() - t0
    assert serial.equals(pooled)
    print(f"{len(serial)} configurations x {len(reqs):,} requests, chunked, Llama-3-8B on H100 SXM")
    print(f"serial:     {t_serial:6.2f} s  ({t_serial / len(serial) * 1e3:.0f} ms per configuration)")
    print(f"2 workers:  {t_pool:6.2f} s")
    print(f"speed-up:   {t_serial / t_pool:6.2f}x")


if __name__ == "__main__":
    main()
