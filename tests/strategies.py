"""Hypothesis strategies for request streams and scheduler knobs, small enough to run hundreds of times."""
import numpy as np
from hypothesis import strategies as st

import batchlab as bl


@st.composite
def streams(draw, max_n=24, max_prompt=400, max_output=60):
    n = draw(st.integers(1, max_n))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.01, 0.05, 0.3]), min_size=n, max_size=n))
    prompt = draw(st.lists(st.integers(1, max_prompt), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, max_output), min_size=n, max_size=n))
    return bl.Requests(np.cumsum(gaps) - gaps[0], prompt, output)


@st.composite
def knobs(draw, policy):
    k = {"block_size": draw(st.sampled_from([1, 4, 16])), "num_kv_blocks": draw(st.integers(2, 80))}
    if policy in ("static", "dynamic"):
        k["batch_size"] = draw(st.integers(1, 8))
        if policy == "dynamic":
            k["max_queue_delay_s"] = draw(st.sampled_from([0.0, 0.005, 0.05, 1.0]))
    else:
        k["max_num_seqs"] = draw(st.integers(1, 12))
    if policy == "continuous":
        k["prefill_only_steps"] = draw(st.booleans())
        k["max_num_batched_tokens"] = draw(st.sampled_from([None, 64, 300, 2048]))
    if policy == "chunked":
        k["max_num_batched_tokens"] = draw(st.sampled_from([1, 7, 32, 128, 512, 4096]))
        k["long_prefill_token_threshold"] = draw(st.sampled_from([0, 0, 5, 64]))
        k["enable_chunked_prefill"] = draw(st.sampled_from([True, True, False]))
    if k["block_size"] * k["num_kv_blocks"] > 4000:
        k["num_kv_blocks"] = 4000 // k["block_size"]
    return k
