"""A simulation is a pure function of its inputs and seed: identical numbers in another process."""
import json
import subprocess
import sys

import batchlab as bl

SCRIPT = """
import json, batchlab as bl
hw, m = bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b")
reqs = bl.synthetic(400, 800, 150, prompt_cv=1.2, output_cv=1.0, rate_req_s=25.0, arrival_cv=2.0, seed=11)
out = {p: bl.simulate(reqs, p, bl.CostModel(hw, m), **k).summary() for p, k in
       [("static", {}), ("dynamic", {}), ("continuous", {}), ("chunked", {"num_kv_blocks": 900})]}
print(json.dumps(out, sort_keys=True))
"""


def _run():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_same_summary_in_two_processes():
    a, b = _run(), _run()
    assert a == b
    assert a["chunked"]["preemptions"] > 0  # the comparison covers the preemption path too


def test_generators_are_seeded():
    a = bl.synthetic(100, 500, 100, 1.0, 1.0, rate_req_s=5.0, seed=3)
    b = bl.synthetic(100, 500, 100, 1.0, 1.0, rate_req_s=5.0, seed=3)
    c = bl.synthetic(100, 500, 100, 1.0, 1.0, rate_req_s=5.0, seed=4)
    for x, y in ((a.arrival_s, b.arrival_s), (a.prompt_tokens, b.prompt_tokens), (a.output_tokens, b.output_tokens)):
        assert (x == y).all()
    assert not (a.prompt_tokens == c.prompt_tokens).all()
