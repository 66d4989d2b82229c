"""Wall time of a 64-point tuning run (issue 14): 2,000 requests of the Azure conversation preset, Llama-3-8B
on one H100 SXM, SLO p99 TTFT 500 ms and p99 TPOT 50 ms, serially. Target: under 5 s on a 2-core machine.

Run: ``python benchmarks/bench_tune.py``. The timing and the tuner's answer (goodputs within 1 % tie; the pick
is the tied setting with the smallest SLO load, the largest p99 / bound) come from this one run.
"""
from __future__ import annotations

import time

import batchlab as bl


def main():
    cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))
    reqs = bl.preset("azure-conv-2023", 2000, seed=0)
    slo = bl.parse_goodput("ttft:500 tpot:50")
    bl.simulate(reqs.head(20), "chunked", cost)  # load the kernel outside the timing
    t0 = time.perf_counter()
    result = bl.tune(reqs, cost, slo, progress=False)
    wall_s = time.perf_counter() - t0
    simulated = int((~result.table["vllm_refuses"]).sum())
    print(f"{len(result.table)} grid points ({simulated} simulated, the rest refused by vLLM) x {len(reqs):,} "
          "requests, "
          f"azure-conv-2023, Llama-3-8B on H100 SXM, SLO {slo.spec()}")
    print(f"wall time:      {wall_s:6.2f} s  ({wall_s / simulated * 1e3:.0f} ms per configuration; target < 5 s)")
    best, default = result.best, result.defaults
    print(f"best:           {best['max_num_seqs']} seqs, {best['max_num_batched_tokens']} tokens, "
          f"goodput {best['request_goodput']:.3f} req/s, SLO load {best['slo_load']:.3f} (largest p99 / bound)")
    print(f"vLLM defaults:  {default['max_num_seqs']} seqs, {default['max_num_batched_tokens']} tokens, "
          f"goodput {default['request_goodput']:.3f} req/s, SLO load {default['slo_load']:.3f}  "
          f"(gain x{result.gain:.3f})")


if __name__ == "__main__":
    main()
