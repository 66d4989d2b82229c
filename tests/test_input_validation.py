"""Bad input gets a ValueError naming the field and what is allowed."""
import math

import numpy as np
import pytest

import batchlab as bl


@pytest.mark.parametrize("arrival, prompt, output, field", [
    ([0, 1], [10, -5], [3, 3], "prompt_tokens"),
    ([0, 1], [10, 5], [3, math.nan], "output_tokens"),
    ([0, 1], [10, 5.5], [3, 3], "prompt_tokens"),
    ([0, 1], [10, 0], [3, 3], "prompt_tokens"),
    ([0, 1], [10, 5], [0, 3], "output_tokens"),
    ([1, 0], [10, 5], [3, 3], "sorted"),
    ([0, math.nan], [10, 5], [3, 3], "arrival_s"),
    ([-1, 0], [10, 5], [3, 3], "arrival_s"),
    ([0, 1], [10, 5, 6], [3, 3], "one length"),
    ([0, 1], [True, False], [3, 3], "prompt_tokens must hold .* got dtype bool"),
    ([], [], [], "at least one"),
])
def test_bad_requests(arrival, prompt, output, field):
    with pytest.raises(ValueError, match=field):
        bl.Requests(arrival, prompt, output)


@pytest.fixture(scope="module")
def reqs():
    return bl.Requests([0.0, 0.1], [10, 20], [5, 5])


@pytest.mark.parametrize("policy, kwargs, field", [
    ("chunked", dict(max_num_seqs=0), "max_num_seqs"),
    ("chunked", dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    ("chunked", dict(max_num_batched_tokens=2.5), "max_num_batched_tokens"),
    ("continuous", dict(max_num_seqs=-3), "max_num_seqs"),
    ("static", dict(batch_size=0), "batch_size"),
    ("dynamic", dict(max_queue_delay_s=-1.0), "max_queue_delay_s"),
    ("dynamic", dict(max_queue_delay_s=math.inf), "max_queue_delay_s"),
    ("chunked", dict(long_prefill_token_threshold=-1), "long_prefill_token_threshold"),
    ("chunked", dict(block_size=0), "block_size"),
    ("chunked", dict(num_kv_blocks=1), "num_kv_blocks"),
    ("chunked", dict(batch_size=8), "batch_size applies to"),
    ("static", dict(max_num_seqs=8), "max_num_seqs applies to"),
    ("continuous", dict(enable_chunked_prefill=False), "enable_chunked_prefill applies to"),
    ("chunked", dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    ("fifo", dict(), "policy must be one of"),
])
def test_bad_knobs(reqs, cost8b, policy, kwargs, field):
    with pytest.raises(ValueError, match=field):
        bl.simulate(reqs, policy, cost8b, **kwargs)


def test_bad_arguments_of_the_entry_points(reqs, cost8b, h100):
    with pytest.raises(ValueError, match="requests"):
        bl.simulate({"arrival_s": [0]}, "chunked", cost8b)
    with pytest.raises(ValueError, match="cost"):
        bl.simulate(reqs, "chunked", "h100")
    with pytest.raises(ValueError, match="dtype"):
        bl.CostModel(h100, bl.get_model("llama-3-8b"), dtype="int8")
    with pytest.raises(ValueError, match="no room for a KV cache"):
        bl.simulate(reqs, "chunked", bl.CostModel(h100, bl.get_model("llama-3-70b")))  # 141 GB of BF16 weights
    with pytest.raises(ValueError, match="seed"):
        bl.synthetic(5, 100, 10, seed=-1)
    with pytest.raises(ValueError, match="cv"):
        bl.synthetic(5, 100, 10, output_cv=-0.5)
    with pytest.raises(ValueError, match="rate"):
        bl.arrivals_gamma(5, 0.0)
    with pytest.raises(ValueError, match="n_requests must be"):
        bl.synthetic(0, 100, 10)


def test_requests_are_read_only_copies():
    a = np.array([0.0, 1.0])
    r = bl.Requests(a, [1, 2], [3, 4])
    a[0] = 5.0
    assert r.arrival_s[0] == 0.0
    with pytest.raises(ValueError, match="read-only"):
        r.arrival_s[0] = 2.0
