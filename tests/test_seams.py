"""The two policy seams of the scheduler (issue 25): whom to preempt (``iterations.choose_victim``) and whom to
admit next (``iterations.next_waiting``). The rest of the loop must work for any answer, so a policy change
(vLLM's priority scheduling) touches those two functions and their tests only.

The loop is run as plain Python (``NUMBA_DISABLE_JIT=1``, in a subprocess) with the victim choice replaced, in the
kernel and in the reference of ``tests/reference.py`` alike, and the two must still agree request by request.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

SCRIPT = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import batchlab as bl
import reference
from batchlab._kernels import iterations

victim = sys.argv[2]
choices = {"last": lambda n: n - 1, "first": lambda n: 0, "middle": lambda n: n // 2}
pick = choices[victim]
iterations.choose_victim = lambda run, n_running: pick(n_running)
reference.choose_victim = lambda running: pick(len(running))

cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))
rng = np.random.default_rng(7)
n = 24
reqs = bl.Requests(np.sort(rng.uniform(0, 0.05, n)), rng.integers(40, 260, n), rng.integers(20, 90, n))
out = {}
for asynchronous in (False, True):
    for caching in (False, True):
        knobs = dict(max_num_seqs=8, max_num_batched_tokens=48, num_kv_blocks=48, block_size=16,
                     async_scheduling=asynchronous, enable_prefix_caching=caching, scheduler_reserve_full_isl=False,
                     max_model_len=512)
        res = bl.simulate(reqs, "chunked", cost, **knobs)
        ref = reference.reference_simulate(reqs, "chunked", cost, max_num_seqs=8, max_num_batched_tokens=48,
                                           num_kv_blocks=48, block_size=16, async_scheduling=asynchronous,
                                           enable_prefix_caching=caching, scheduler_reserve_full_isl=False,
                                           max_model_len=512, vllm_033=True)
        df = res.requests
        assert not df["rejected"].any()
        np.testing.assert_allclose(df["finish_s"], [r.finish for r in ref], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(df["first_token_s"], [r.first for r in ref], rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(df["preemptions"], [r.preemptions for r in ref])
        for times, r in zip(res.token_times, ref):
            np.testing.assert_allclose(times, r.token_times, rtol=1e-9, atol=1e-12)
        assert (df["output_tokens"] == reqs.output_tokens).all()
        out[f"{asynchronous}-{caching}"] = [int(df["preemptions"].sum()), float(df["finish_s"].max())]
print(json.dumps(out))
"""


def _run(victim: str) -> dict:
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(TESTS), victim], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fcfs():
    return _run("last")


def test_vllms_victim_preempts_under_this_pressure(fcfs):
    assert all(preempted > 0 for preempted, _ in fcfs.values()), fcfs


@pytest.mark.parametrize("victim", ["first", "middle"])
def test_the_loop_works_for_any_victim(fcfs, victim):
    """Another victim (the oldest running request, or the middle one, possibly already scheduled in the step):
    kernel and reference still agree on every token, and the runs differ from FCFS's, so the seam was used."""
    other = _run(victim)
    assert all(preempted > 0 for preempted, _ in other.values()), other
    assert other != fcfs
