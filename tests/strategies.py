"""Hypothesis strategies for request streams and scheduler knobs, small enough to run hundreds of times."""
import numpy as np
from hypothesis import strategies as st

import batchlab as bl


@st.composite
def streams(draw, max_n=24, max_prompt=400, max_output=60, min_n=1):
    n = draw(st.integers(min_n, max_n))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.01, 0.05, 0.3]), min_size=n, max_size=n))
    prompt = draw(st.lists(st.integers(1, max_prompt), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, max_output), min_size=n, max_size=n))
    return bl.Requests(np.cumsum(gaps) - gaps[0], prompt, output)


def steered_streams(max_n=24):
    """:func:`streams` with prompts capped at 400, 100 or 40 tokens: short prompts with outputs of up to 60
    tokens grow their KV after admission, which is what fills a pool and makes the scheduler preempt; half the
    streams have at least 8 requests, since one or two requests rarely contend for the pool."""
    return st.tuples(st.sampled_from([400, 100, 40]), st.sampled_from([1, 8])).flatmap(
        lambda most: streams(max_n, max_prompt=most[0], min_n=most[1]))


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
def knobs(draw, policy, blocks=(2, 80), requests=None):
    """Knobs of ``policy``; ``blocks`` bounds the KV pool (a pool of a few blocks exercises preemption, a larger
    one keeps cached prefixes).

    With ``requests``, the draws are steered so that most examples exercise the scheduler rather than reject
    every request up front: four times in five the pool holds the largest request once to four times over (so
    everything is admitted, and two requests running at once must often preempt), the token budget of a policy
    that cannot split a prompt mostly holds the longest prompt, max_model_len mostly leaves the prompts alone,
    and fewer runs have a single client. :func:`outcome` classifies each run; conftest prints the shares.
    """
    k = {"block_size": draw(st.sampled_from([1, 4, 16]))}
    bs = k["block_size"]
    steer = requests is not None and draw(st.integers(0, 4)) > 0
    if steer:
        need = int(max(-(-(p + o - 1) // bs) for p, o in zip(requests.prompt_tokens, requests.output_tokens)))
        k["num_kv_blocks"] = need * draw(st.sampled_from([1, 1, 1, 2, 4])) + draw(st.integers(0, need // 4)) + 1
    else:
        k["num_kv_blocks"] = draw(st.integers(*blocks))
    longest = int(requests.prompt_tokens.max()) if steer else 0
    if policy in ("static", "dynamic"):
        k["batch_size"] = draw(st.integers(1, 8))
        if policy == "dynamic":
            k["max_queue_delay_s"] = draw(st.sampled_from([0.0, 0.005, 0.05, 1.0]))
    else:
        k["max_num_seqs"] = draw(st.integers(2 if steer else 1, 12))
    if policy == "continuous":
        k["prefill_only_steps"] = draw(st.booleans())
        budgets = [None, 64, 300, 2048] + ([None, longest, longest + 100] if steer else [])
        k["max_num_batched_tokens"] = draw(st.sampled_from(budgets))
    if policy == "chunked":
        k["max_num_batched_tokens"] = max(k["max_num_seqs"], draw(st.sampled_from([1, 7, 32, 128, 512, 4096])))
        k["long_prefill_token_threshold"] = draw(st.sampled_from([0, 0, 5, 64]))
        k["enable_chunked_prefill"] = draw(st.sampled_from([True, True, False]))
        if steer and not k["enable_chunked_prefill"] and draw(st.integers(0, 4)) > 0:
            k["max_num_batched_tokens"] = max(k["max_num_batched_tokens"], longest)
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
        lengths = [0, max(2, most // 2), max(2, most)] + ([0, 0, max(2, most)] if steer else [])
        k["max_model_len"] = draw(st.sampled_from(lengths))
        if k["max_model_len"] > most:
            k["max_model_len"] = 0
        k["max_concurrency"] = draw(st.sampled_from([None, None, 1, 3] + ([None, None, 3] if steer else [])))
    return k


# What the property tests' examples exercised, per test: printed by conftest's pytest_terminal_summary.
OUTCOMES: dict[str, dict[str, int]] = {}
KINDS = ("examples", "admits", "rejects all", "chunks a prompt", "preempts")


def outcome(res, test: str) -> dict[str, bool]:
    """Classify one run (admitted anyone, rejected everyone, split a prompt, preempted) and count it under
    ``test``; returns the classification. A prompt is split when a request's first prefill row schedules fewer
    tokens than its prompt less what it found cached."""
    df = res.requests
    n = len(df)
    first = {}
    if res.schedule is not None and len(res.schedule):
        s = res.schedule
        pre = s[s["kind"] == "prefill"]
        first = pre.groupby("request")["tokens"].first().to_dict()
    chunks = any(t < df["prompt_tokens"].iloc[r] - df["cached_tokens"].iloc[r] for r, t in first.items())
    got = {"examples": True, "admits": bool((~df["rejected"]).any()), "rejects all": bool(df["rejected"].sum() == n),
           "chunks a prompt": bool(chunks), "preempts": bool(df["preemptions"].sum() > 0)}
    counts = OUTCOMES.setdefault(test, dict.fromkeys(KINDS, 0))
    for kind, hit in got.items():
        counts[kind] += int(hit)
    try:
        from hypothesis import event
        for kind, hit in got.items():
            if hit and kind != "examples":
                event(kind)
    except Exception:  # outside a hypothesis test
        pass
    return got
