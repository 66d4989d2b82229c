"""The shared long-prompt scene: the stream is what it says, every policy and budget meets the same batch, its
measures match the cost model's closed forms, and chapters 05, 06, 12 and 14 quote the same numbers for it."""
from __future__ import annotations

import numpy as np
import pytest

from batchlab.chapters import chunked_prefill, fact_check, prefill_spike, scenes

SMALL = dict(n_decoders=16, context=512, prompt_tokens=2000)

# The notebooks' parameters (05: six short requests of 256 tokens behind the long prompt, seed 0; 06 and 11:
# their budget grids and 06's unchunked budget). The scene itself is left at its defaults, as the notebooks do.
BUDGETS_06 = [256, 512, 1024, 2048, 4096, 8192]
UNCHUNKED_06 = 16384
BUDGETS_11 = [512, 1024, 2048, 4096, 8192]


def test_stream_layout():
    s = scenes.stream(2.0, n_decoders=3, decoder_output_tokens=7, prompt_tokens=900, newcomer_output_tokens=5,
                      behind_s=[2.1, 2.5], behind_tokens=50)
    assert s.arrival_s.tolist() == [0, 0, 0, 2.0, 2.1, 2.5]
    assert s.prompt_tokens.tolist() == [1, 1, 1, 900, 50, 50]  # one-token prompts: admitted together
    assert s.output_tokens.tolist() == [7, 7, 7, 5, 5, 5]
    base = scenes.stream(2.0, n_decoders=2, decoder_output_tokens=7, behind_s=[2.1], newcomer=False)
    assert base.n_requests == 3 and scenes.PROMPT_TOKENS not in base.prompt_tokens.tolist()


def test_default_batch_is_the_article_cadence(cost8b):
    # The scene runs the synchronous engine, so its batch is the one whose synchronous step is nearest 20 ms.
    n = scenes.default_decoders(cost8b)
    assert 100 < n < 200 and n < cost8b.batch_for_step_time(scenes.CADENCE_S, scenes.CONTEXT)  # async hides CPU
    step = [cost8b.decode_step_time(b, scenes.CONTEXT, asynchronous=False) for b in (n - 1, n, n + 1)]
    assert abs(step[1] - scenes.CADENCE_S) <= min(abs(s - scenes.CADENCE_S) for s in step)
    assert step[0] < scenes.CADENCE_S < step[2]


@pytest.mark.parametrize("policy, knobs", [
    ("continuous", {}), ("continuous", {"prefill_only_steps": True}),
    ("chunked", {"max_num_batched_tokens": 256}), ("chunked", {"max_num_batched_tokens": 4096}),
    ("chunked", {"max_num_batched_tokens": 8192, "enable_chunked_prefill": False}),  # vLLM: >= max_model_len
])
def test_every_policy_meets_the_same_batch(cost8b, policy, knobs):
    run = scenes.run(cost8b, policy, **SMALL, **knobs)
    n, ctx = SMALL["n_decoders"], SMALL["context"]
    emitted = [int((t <= run.seen_s).sum()) for t in run.res.token_times[:n]]
    assert emitted == [ctx] * n  # one-token prompts + ctx outputs: ctx tokens of KV in the next iteration
    req = run.res.requests
    assert req["arrival_s"].iloc[n] == run.arrival_s and req["prompt_tokens"].iloc[n] == SMALL["prompt_tokens"]
    # Its client sends it the request latency before the engine sees it, at a step's end, and the next iteration
    # takes it: it waits for nothing else.
    assert cost8b.request_latency_s > 0 and run.seen_s - run.arrival_s == pytest.approx(cost8b.request_latency_s,
                                                                                          abs=1e-12)
    assert req["queue_s"].iloc[n] == pytest.approx(cost8b.request_latency_s, abs=1e-12)
    assert not req["rejected"].any() and (req["finish_s"].iloc[:n] > req["first_token_s"].iloc[n]).all()
    # The decoders' step before the arrival is a synchronous decode of the whole batch at ctx - 1 cached tokens.
    assert run.measures["cadence_s"] == pytest.approx(cost8b.decode_step_time(n, ctx - 1, asynchronous=False),
                                                      rel=1e-9)
    assert run.measures["admit_step"] == ctx and run.res.steps["start_s"].iloc[ctx] == run.seen_s


def test_chunked_scene_knobs_are_vllms_with_a_synchronous_scheduler(cost8b):
    # vLLM refuses max_num_seqs > max_num_batched_tokens: the scene caps the GPU's 1,024 seats at the budget.
    assert scenes.run(cost8b, "chunked", max_num_batched_tokens=256, **SMALL).res.knobs["max_num_seqs"] == 256
    default = scenes.run(cost8b, "chunked", **SMALL).res.knobs
    assert (default["max_num_seqs"], default["max_num_batched_tokens"]) == (1024, 8192)  # H100: vLLM's defaults
    assert default["async_scheduling"] is False and default["enable_prefix_caching"] is True
    assert default["max_model_len"] == 8192  # Llama-3's context, vLLM's default
    # Given knobs win; async scheduling plans the iteration after the arrival before the engine sees the
    # newcomer, so its prefill starts one decode step later; every step is shorter by the CPU work it hides.
    sync = scenes.run(cost8b, "chunked", max_num_batched_tokens=512, **SMALL)
    late = scenes.run(cost8b, "chunked", max_num_batched_tokens=512, max_num_seqs=64, async_scheduling=True, **SMALL)
    assert late.res.knobs["max_num_seqs"] == 64 and late.res.knobs["async_scheduling"] is True
    n, latency = SMALL["n_decoders"], cost8b.request_latency_s
    assert sync.res.requests["queue_s"].iloc[n] == pytest.approx(latency, abs=1e-12)  # the request latency only
    assert late.measures["admit_step"] == sync.measures["admit_step"] + 1  # the first step with prompt tokens
    waited = late.res.steps.iloc[sync.measures["admit_step"]]  # a decode of the whole batch at ctx cached tokens
    assert waited["prefill_tokens"] == 0 and waited["decode_seqs"] == n
    assert late.res.requests["queue_s"].iloc[n] == pytest.approx(latency + waited["duration_s"], rel=1e-9)
    assert waited["duration_s"] == pytest.approx(cost8b.decode_step_time(n, SMALL["context"]), rel=1e-9)
    assert late.measures["chunks"] == sync.measures["chunks"]
    # Its first token comes one decode step later, less the CPU work async scheduling hides in each chunk's step
    # (the decoders and the prompt's chunk scheduled: n + 1 sequences).
    hidden = cost8b.cpu_hidden_fraction * (cost8b.cpu_step_s + cost8b.cpu_seq_s * (n + 1))
    delay = late.measures["ttft_s"] - sync.measures["ttft_s"]
    assert delay == pytest.approx(waited["duration_s"] - sync.measures["chunks"] * hidden, rel=0.01)
    # The tallest gap is the same chunk's step less that hidden CPU work (at one more token of context).
    assert late.measures["itl_max_s"] == pytest.approx(sync.measures["itl_max_s"] - hidden, rel=1e-3)


def test_unchunked_gap_is_the_whole_prompt_beside_the_decodes(cost8b):
    ideal = cost8b.ideal()  # no request latency: the client's TTFT is the engine's
    run = scenes.run(ideal, "continuous", **SMALL)
    m, n, ctx = run.measures, SMALL["n_decoders"], SMALL["context"]
    step = ideal.step_time(prefill_chunks=[(SMALL["prompt_tokens"], 0)], decode_contexts=[ctx] * n)
    assert m["itl_max_s"] == pytest.approx(step, rel=1e-9) and m["ttft_s"] == pytest.approx(step, rel=1e-9)
    assert m["admit_step_s"] == pytest.approx(step, rel=1e-12)
    assert m["chunks"] == 1 and m["largest_chunk_tokens"] == SMALL["prompt_tokens"]
    # Chapter 14's analytic gap is the same iteration.
    assert fact_check.prefill_gap(ideal, SMALL["prompt_tokens"], n, ctx)["step_s"] == pytest.approx(step, rel=1e-12)


def test_v0_order_gap_spans_the_prefill_only_step_and_the_next_decode(cost8b):
    run = scenes.run(cost8b, "continuous", prefill_only_steps=True, **SMALL)
    m, steps = run.measures, run.res.steps
    admit, nxt = steps.iloc[m["admit_step"]], steps.iloc[m["admit_step"] + 1]
    assert admit["decode_seqs"] == 0 and admit["prefill_tokens"] == SMALL["prompt_tokens"]
    assert m["ttft_s"] == pytest.approx(cost8b.request_latency_s + admit["duration_s"], rel=1e-9)
    assert m["itl_max_s"] == pytest.approx(admit["duration_s"] + nxt["duration_s"])


def test_decoder_gaps_window(cost8b):
    run = scenes.run(cost8b, "chunked", max_num_batched_tokens=512, **SMALL)
    gaps = scenes.decoder_gaps(run, 0.05, 0.02)
    assert (gaps["sequences"] == SMALL["n_decoders"]).all()  # lockstep: one row per iteration
    assert gaps["time_s"].min() >= -0.05 and gaps["time_s"].max() <= run.measures["ttft_s"] + 0.02
    assert gaps["itl_s"].max() == pytest.approx(run.measures["itl_max_s"])
    # Time runs from the newcomer's send; the cadence is the gap that ends when the engine sees it.
    seen = gaps[np.isclose(gaps["time_s"], cost8b.request_latency_s, rtol=0, atol=1e-9)]
    assert len(seen) == 1 and seen["itl_s"].iloc[0] == pytest.approx(run.measures["cadence_s"])
    full = scenes.decoder_gaps(run)
    assert full["sequences"].sum() == SMALL["n_decoders"] * (run.res.requests["output_tokens"].iloc[0] - 1)


def test_scene_errors(cost8b):
    with pytest.raises(ValueError, match="exceed n_decoders"):
        scenes.run(cost8b, "chunked", max_num_batched_tokens=16, **SMALL)
    with pytest.raises(ValueError, match="context"):
        scenes.run(cost8b, "chunked", n_decoders=4, context=1)
    with pytest.raises(ValueError, match="max_num_seqs"):
        scenes.run(cost8b, "chunked", max_num_seqs=8, **SMALL)  # half the batch would start later
    with pytest.raises(RuntimeError, match="tail_steps"):  # 32-token chunks outlast decoders sized for 496
        scenes.run(cost8b, "chunked", max_num_batched_tokens=512, long_prefill_token_threshold=32, tail_steps=0,
                   **SMALL)


@pytest.fixture(scope="module")
def quoted(cost8b):
    """What chapters 05, 06 and 14 compute from the scene, through their own functions and parameters."""
    spike = prefill_spike.prefill_spike(cost8b, n_behind=6, behind_tokens=256, seed=0)
    points, _ = chunked_prefill.chunk_budget_sweep(cost8b, BUDGETS_06,
                                                   unchunked_max_num_batched_tokens=UNCHUNKED_06)
    trade = fact_check.chunking_tradeoff(cost8b, BUDGETS_11)
    return spike.summary, points, trade


def test_chapters_quote_the_same_numbers_for_the_scene(quoted, cost8b):
    s05, points, trade = quoted
    at06 = points[points["config"] == "chunked"].set_index("max_num_batched_tokens")
    off06 = points[points["config"] == "unchunked"].iloc[0]
    at11 = trade.set_index("max_num_batched_tokens")
    # Chapter 14's claim 4: the batch whose (synchronous) decode step is nearest the article's 20 ms; chapter 05
    # uses the scene's default.
    decoders = cost8b.replace(cpu_hidden_fraction=0.0).batch_for_step_time(0.020, 2048)
    assert s05["n_decoders"] == decoders and (s05["context"], scenes.PROMPT_TOKENS) == (2048, 8000)
    # The unchunked gap and the newcomer's TTFT: 05 (Orca), 06 (chunking off), 11 (8192 fits the whole prompt).
    for key in ("itl_max_s", "ttft_s", "cadence_s"):
        assert s05[key] == off06[key] == at06.loc[8192, key] == at11.loc[8192, key]
    # Chapter 14's claim 5 prices the same iteration with the cost model alone; the newcomer's client waits the
    # request latency more.
    gap = fact_check.prefill_gap(cost8b, scenes.PROMPT_TOKENS, decoders, scenes.CONTEXT)["step_s"]
    assert s05["itl_max_s"] == pytest.approx(gap, rel=1e-12) and s05["admit_step_s"] == pytest.approx(gap, rel=1e-12)
    assert s05["ttft_s"] == pytest.approx(cost8b.request_latency_s + gap, rel=1e-9)
    # Every budget both chapters sweep gives both the same point.
    for budget in set(BUDGETS_06) & set(BUDGETS_11):
        for key in ("itl_max_s", "ttft_s", "cadence_s", "chunks"):
            assert at06.loc[budget, key] == at11.loc[budget, key]
    assert np.isclose(s05["cadence_s"], cost8b.decode_step_time(decoders, 2047, asynchronous=False), rtol=1e-9)
    # The numbers the four pages print, with the shipped calibration (data/calibration.csv, serving terms
    # included): 115 decoders, a 20.0 ms cadence, a 213 ms spike and a 219 ms TTFT (5.7 ms of it request latency).
    assert decoders == 115
    assert (s05["cadence_s"], s05["itl_max_s"], s05["ttft_s"]) == pytest.approx((0.01996, 0.2135, 0.2192), abs=1e-4)
