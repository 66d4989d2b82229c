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
def shared_prefix_streams(draw, max_n=24, max_prompt=400, max_output=60):
    """Streams whose prompts share prefixes: each request belongs to one of a few families and keeps its
    family's block ids for a drawn number of blocks, then ids of its own (a hash chain, as Mooncake's)."""
    base = draw(streams(max_n, max_prompt, max_output))
    tokens = draw(st.sampled_from([4, 16, 64]))
    blocks = []
    for i, (p, o) in enumerate(zip(base.prompt_tokens, base.output_tokens)):
        most = -(-int(p + o) // tokens)
        n_ids = draw(st.integers(0, most))
        shared = draw(st.integers(0, n_ids))
        family = draw(st.integers(0, 2))
        own = [100_000 + i * 1000 + j for j in range(shared, n_ids)]
        blocks.append([family * 10_000 + j for j in range(shared)] + own)
    return bl.Requests(base.arrival_s, base.prompt_tokens, base.output_tokens, blocks, tokens)


@st.composite
def knobs(draw, policy, blocks=(2, 80)):
    """Knobs of ``policy``; ``blocks`` bounds the KV pool (a pool of a few blocks exercises preemption, a larger
    one keeps cached prefixes)."""
    k = {"block_size": draw(st.sampled_from([1, 4, 16])), "num_kv_blocks": draw(st.integers(*blocks))}
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
        k["max_num_batched_tokens"] = max(k["max_num_seqs"], draw(st.sampled_from([1, 7, 32, 128, 512, 4096])))
        k["long_prefill_token_threshold"] = draw(st.sampled_from([0, 0, 5, 64]))
        k["enable_chunked_prefill"] = draw(st.sampled_from([True, True, False]))
        for switch in ("async_scheduling", "enable_prefix_caching", "scheduler_reserve_full_isl"):
            k[switch] = draw(st.booleans())
    if k["block_size"] * k["num_kv_blocks"] > 4000:
        k["num_kv_blocks"] = 4000 // k["block_size"]
    if policy == "chunked":
        # vLLM refuses to start unless the pool holds one max_model_len request and, without chunking, the budget
        # does too; 0 leaves the limit out.
        most = (k["num_kv_blocks"] - 1) * k["block_size"]
        if not k["enable_chunked_prefill"]:
            most = min(most, k["max_num_batched_tokens"])
        k["max_model_len"] = draw(st.sampled_from([0, max(2, most // 2), max(2, most)]))
        if k["max_model_len"] > most:
            k["max_model_len"] = 0
        k["max_concurrency"] = draw(st.sampled_from([None, None, 1, 3]))
    return k
