"""Speed of the jitted scheduler loop, per policy, in nanoseconds per sequence-step, against two yardsticks.

A sequence-step is one sequence taking part in one iteration (sum of ``steps.running``). Two ratios per
policy, both measured in this one run:

- ``vs reference``: the plain-Python reference of ``tests/reference.py`` on the first requests of the same
  stream; reference ns per sequence-step / kernel ns per sequence-step (higher is better).
- ``vs bare loop``: :func:`bare_loop` below, the least an iteration-level simulator does (arrivals, admission
  under ``max_num_seqs``, one pass over the running rows per step, a step time, one recorded token per row)
  on the same stream with 256 sequences; kernel ns per sequence-step / bare ns per sequence-step (lower is
  better; the rules of each policy are what the ratio above 1 pays for).

Rows: the four policies, ``chunked`` with vLLM 0.33's rules and defaults (async scheduling, prefix caching,
full-prompt reservation, max_model_len) and ``chunked-v1`` with those switched off (batchlab's first rules).
Each kernel is timed twice: keeping every token's time and iteration (``record_tokens=True``, as the bare loop
and the reference keep them) and keeping only the metrics the loop accumulates (``record_tokens=False``, what
sweeps and long replays run).
Run: ``python benchmarks/bench_simulate.py``.
"""
from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

import batchlab as bl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from reference import reference_simulate  # noqa: E402

N_REQUESTS = 20_000
N_REFERENCE = 300
VLLM_033 = {"async_scheduling": True, "enable_prefix_caching": True, "scheduler_reserve_full_isl": True,
            "max_model_len": 8192}
FIRST_RULES = {"async_scheduling": False, "enable_prefix_caching": False, "scheduler_reserve_full_isl": False,
               "max_model_len": 0}
RUNS = {  # label -> (policy, knobs)
    "static": ("static", {"batch_size": 64}),
    "dynamic": ("dynamic", {"batch_size": 64, "max_queue_delay_s": 0.05}),
    "continuous": ("continuous", {"max_num_seqs": 256}),
    "chunked": ("chunked", {"max_num_seqs": 256, "max_num_batched_tokens": 2048, **VLLM_033}),
    "chunked-v1": ("chunked", {"max_num_seqs": 256, "max_num_batched_tokens": 2048, **FIRST_RULES}),
}


@njit(cache=True)
def bare_loop(arrival, prompt, output, max_num_seqs):
    """The yardstick: the least an iteration-level simulator does, with none of the rules.

    Requests join in arrival order while fewer than ``max_num_seqs`` run (no KV pool, no budget, no
    preemption); each step is one pass over the running rows that sums the step's aggregates, a roofline-shaped
    step time, every row emitting one token whose time is recorded, and the finished rows leaving. Returns the
    per-token times and the number of sequence-steps.
    """
    n = arrival.shape[0]
    tok_off = np.zeros(n + 1, np.int64)
    for r in range(n):
        tok_off[r + 1] = tok_off[r] + output[r]
    tok_times = np.empty(tok_off[n])
    run = np.empty((max_num_seqs, 3), np.int64)  # request, tokens known, tokens emitted
    n_run = 0
    nxt = 0
    now = 0.0
    seq_steps = 0
    while nxt < n or n_run > 0:
        if n_run == 0 and arrival[nxt] > now:
            now = arrival[nxt]
        while nxt < n and n_run < max_num_seqs and arrival[nxt] <= now:
            run[n_run, 0] = nxt
            run[n_run, 1] = prompt[nxt]
            run[n_run, 2] = 0
            n_run += 1
            nxt += 1
        new = 0
        cached = 0
        for k in range(n_run):
            new += prompt[run[k, 0]] if run[k, 2] == 0 else 1
            cached += run[k, 1]
        now += max(1.6e10 * new / 7e14, 1.6e10 / 3.1e12) + cached * 4e-14
        seq_steps += n_run
        j = 0
        for k in range(n_run):
            r = run[k, 0]
            tok_times[tok_off[r] + run[k, 2]] = now
            run[k, 2] += 1
            run[k, 1] += 1
            if run[k, 2] < output[r]:
                run[j] = run[k]
                j += 1
        n_run = j
    return tok_times, seq_steps


def best_of(fn, repeat=3):
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))
    reqs = bl.synthetic(N_REQUESTS, 1000, 250, prompt_cv=1.0, output_cv=1.0, rate_req_s=40.0, seed=0)
    small = reqs.head(N_REFERENCE)
    bare_args = (reqs.arrival_s, reqs.prompt_tokens, reqs.output_tokens, 256)
    bare_loop(*(a[:10] if isinstance(a, np.ndarray) else a for a in bare_args))  # compile outside the timing
    print(f"{N_REQUESTS:,} requests (lognormal 1000/250 tokens, CV 1, Poisson 40 req/s), Llama-3-8B on H100 SXM")
    print(f"{'':<33}{'record_tokens=True':^37}|{'record_tokens=False':^37}")
    print(f"{'policy':<11} {'steps':>9} {'seq-steps':>11} " + f"{'kernel s':>9} {'ns/seq-step':>11} "
          f"{'vs bare':>7} {'vs ref':>7} |" * 2 + f" {'bare ns':>8} {'ref ns':>7}")
    for label, (policy, knobs) in RUNS.items():
        kw = dict(knobs, num_kv_blocks=cost.kv_pool_blocks())
        ref_kw = dict(kw, vllm_033=True) if policy == "chunked" and kw["async_scheduling"] else kw
        bl.simulate(small, policy, cost, **kw)  # compile or load from cache outside the timing
        bare_secs, (_, bare_steps) = best_of(lambda: bare_loop(*bare_args))
        ref_secs, _ = best_of(functools.partial(reference_simulate, small, policy, cost, **ref_kw), repeat=1)
        bare_ns = bare_secs / bare_steps * 1e9
        ref_ns = ref_secs / bl.simulate(small, policy, cost, **kw).sequence_steps * 1e9
        line = ""
        for record in (True, False):
            secs, res = best_of(functools.partial(bl.simulate, reqs, policy, cost, record_tokens=record, **kw))
            ns = secs / res.sequence_steps * 1e9
            line += f"{secs:>9.3f} {ns:>11.1f} {ns / bare_ns:>6.1f}x {ref_ns / ns:>6.0f}x |"
        print(f"{label:<11} {res.n_steps:>9,} {res.sequence_steps:>11,} {line} {bare_ns:>8.2f} {ref_ns:>7.0f}")


if __name__ == "__main__":
    main()
