"""Shared-prefix workloads: the generators' block ids, and the hit rates prefix caching gets from them."""
from __future__ import annotations

import numpy as np
import pytest

import batchlab as bl
from rawdata import raw_folder


def test_shared_prefix_hit_rate_is_the_closed_form(cost8b):
    # 10 groups x 10 prompts of 700 system + 50 question tokens, cycled over 1,000 requests. In the first round
    # the first prompt of each group finds nothing and the other 90 find their group's 43 full system blocks
    # (688 tokens); afterwards every prompt has been seen and finds all its full blocks but the one holding its
    # last token: (750 - 1) // 16 = 46 blocks, 736 tokens.
    reqs = bl.shared_prefix(1000, 10, 10, 700, 50, 250, rate_req_s=6.0, seed=1)
    res = bl.simulate(reqs, "chunked", cost8b)
    expected = (90 * 688 + 900 * 736) / (1000 * 750)
    assert res.summary()["prefix_cache_hit_rate"] == pytest.approx(expected, abs=1e-12)
    cached = res.requests["cached_tokens"].to_numpy()
    assert (cached[:100] <= 688).all() and (cached[100:] == 736).all()
    off = bl.simulate(reqs, "chunked", cost8b, enable_prefix_caching=False)
    assert off.summary()["prefix_cache_hit_rate"] == 0.0
    assert off.summary()["mean_ttft_ms"] > 1.5 * res.summary()["mean_ttft_ms"]


def test_shared_prefix_ids_follow_the_groups():
    reqs = bl.shared_prefix(20, 2, 3, 40, 8, 5, seed=0, prefix_block_tokens=16)
    first = {tuple(ids[:2]) for ids in reqs.prefix_blocks}  # the two full system blocks (32 of 40 tokens)
    assert len(first) == 2  # one per group
    assert len({tuple(ids) for ids in reqs.prefix_blocks}) == 6  # six distinct prompts, cycled
    assert all(len(ids) == 3 for ids in reqs.prefix_blocks)  # 48 prompt tokens: 3 blocks, the last one partial


def test_multi_turn_prompts_extend_the_previous_turn():
    reqs = bl.multi_turn(3, 4, 64, 32, 16, rate_req_s=1.0, turn_gap_s=5.0, seed=2)
    assert len(reqs) == 12
    assert sorted(set(reqs.prompt_tokens.tolist())) == [64 + 32 + k * 48 for k in range(4)]
    by_len = {}
    for p, ids in zip(reqs.prompt_tokens, reqs.prefix_blocks):
        by_len.setdefault(int(p), []).append(list(ids))
    # Every turn's ids start with the previous turn's ids (prompt and answer) of some conversation.
    for k in range(1, 4):
        for ids in by_len[96 + 48 * k]:
            assert any(ids[:len(prev)] == prev for prev in by_len[96 + 48 * (k - 1)])
    with pytest.raises(ValueError, match="turn_gap_s must be finite seconds >= 0"):
        bl.multi_turn(1, 2, 8, 8, 8, turn_gap_s=-1.0)


def test_multi_turn_finds_the_previous_answer_cached(cost8b):
    # One conversation, turns far apart: turn k finds the previous turn's prompt and answer cached, except the
    # answer's last token, whose KV was never computed (it was sampled, not fed back). Turn 2 asks 144 tokens;
    # turn 1 computed 96 + 16 - 1 = 111, so 6 full blocks (96 tokens) are found; turn 3: 144 + 15 = 159 -> 144.
    reqs = bl.multi_turn(1, 3, 64, 32, 16, turn_gap_s=100.0, seed=0)
    res = bl.simulate(reqs, "chunked", cost8b)
    expected = [0, 96, 144]
    assert res.requests["cached_tokens"].tolist() == expected


@pytest.mark.needs_data
def test_mooncake_hit_rate_matches_the_traces_block_reuse(cost8b, monkeypatch):
    # 36.6 % of Mooncake's 512-token blocks repeat earlier ones (../shared/data/README.md). With a pool that keeps
    # everything, vLLM's prefix cache finds nearly that share of the prompt tokens.
    monkeypatch.setenv("BATCHLAB_DATA_DIR", str(raw_folder("BATCHLAB_DATA_DIR", "traces", "the raw request traces")))
    reqs = bl.replay("mooncake-conversation")
    ids = reqs.prefix_ids
    reuse = 1 - np.unique(ids).size / ids.size
    assert reuse == pytest.approx(0.366, abs=0.001)
    res = bl.simulate(reqs, "chunked", cost8b, num_kv_blocks=2_000_000, max_model_len=131_072,
                      max_num_batched_tokens=16_384)  # 32M tokens: every prefix lives until it is reused
    hit = res.summary()["prefix_cache_hit_rate"]
    assert abs(hit - reuse) < 0.01
