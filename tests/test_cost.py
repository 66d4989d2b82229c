"""Closed forms of the roofline (DESIGN section 3) and the CostModel's validation."""
import math

import numpy as np
import pytest

import batchlab as bl


@pytest.fixture(scope="module")
def ideal8b(h100):
    return bl.CostModel(h100, bl.get_model("llama-3-8b")).ideal()


def test_ridge_point_is_295_sequences_for_any_model(h100):
    for name in bl.model_names():
        for dtype in ("bf16", "fp8"):
            knee = bl.CostModel(h100, bl.get_model(name), dtype=dtype).ideal().knee(0)
            assert knee == pytest.approx(989.4e12 / 3.35e12, abs=0.5)
            assert knee == pytest.approx(295.3, abs=0.5)


# DESIGN section 3: B_kv = streamed weight bytes / (context k), the streamed weights being P less the embedding
# table, (8.03e9 - 0.525e9) 2 B: a little below DESIGN's first figures of 239, 120, 30 and 7.5 (all of P).
@pytest.mark.parametrize("context, expected, tol", [(512, 223.7, 0.1), (1024, 111.8, 0.1), (4096, 27.96, 0.01),
                                                    (16384, 6.99, 0.01)])
def test_kv_cache_drags_the_knee_down(ideal8b, context, expected, tol):
    streamed = (8030261248 - 128256 * 4096) * 2
    assert ideal8b.knee(context) == pytest.approx(streamed / (context * 2 * 32 * 8 * 128 * 2), rel=1e-12)
    assert ideal8b.knee(context) == pytest.approx(expected, abs=tol)
    full_p = bl.CostModel(ideal8b.hardware, ideal8b.model._replace(vocab=0)).ideal()  # every parameter streamed
    assert full_p.knee(context) > ideal8b.knee(context)


def test_knee_is_where_the_decode_step_doubles_its_floor(ideal8b):
    # Below the ridge the step is weights + KV over bandwidth: it doubles when KV bytes equal weight bytes.
    context = 4096
    b = ideal8b.knee(context)
    floor = ideal8b.streamed_weight_bytes / ideal8b.hardware.hbm_bytes_per_s
    step = ideal8b.decode_step_time(b, context)
    assert step == pytest.approx(2 * floor, rel=0.01)


def test_batch_one_decode_streams_the_weights(h100, ideal8b):
    # DESIGN section 3: every weight but the embedding table, (8.03e9 - 0.525e9) x 2 B = 15.0 GB, 4.5 ms (not 4.8).
    assert ideal8b.streamed_weight_bytes == (8030261248 - 128256 * 4096) * 2
    assert ideal8b.decode_step_time(1, 0) == pytest.approx(15.01e9 / 3.35e12, rel=0.002)
    assert ideal8b.decode_step_time(1, 0) * 1e3 == pytest.approx(4.48, abs=0.01)
    # Llama-3-70B FP8: the body in FP8 (69.5 GB) plus the LM head, which vLLM keeps in BF16 (1.05 GB): 21.1 ms.
    c70 = bl.CostModel(h100, bl.get_model("llama-3-70b"), dtype="fp8").ideal()
    assert c70.streamed_weight_bytes == (70553706496 - 2 * 128256 * 8192) + 128256 * 8192 * 2
    assert c70.decode_step_time(1, 0) * 1e3 == pytest.approx(21.06, abs=0.01)


def test_prefill_of_8000_tokens(ideal8b, h100):
    # DESIGN section 3: GEMMs about 113 ms (the LM head only for the one sampled row) plus attention about 17 ms.
    t = ideal8b.prefill_time(8000)
    b = ideal8b.step_breakdown(prefill_chunks=[(8000, 0)])
    gemm = 2 * (8030261248 - 2 * 128256 * 4096) * 8000 / 989.4e12
    assert b.gemm_s == pytest.approx(gemm, rel=1e-12) and gemm == pytest.approx(0.1129, abs=1e-4)
    assert b.attn_s == pytest.approx(2 * 32 * 4096 * 8000 * 8000 / 989.4e12, rel=1e-12)  # 17 ms
    assert b.lm_head_s == pytest.approx(128256 * 4096 * 2 / 3.35e12, rel=1e-12)  # one row: its weights stream
    assert t == pytest.approx(0.130, abs=0.001)
    c70 = bl.CostModel(h100, bl.get_model("llama-3-70b"), dtype="fp8").ideal()
    b70 = c70.step_breakdown(prefill_chunks=[(8000, 0)])
    assert b70.gemm_s == pytest.approx(0.553, abs=0.001)  # GEMMs alone: far above the article's 400 ms gap
    assert c70.prefill_time(8000) == pytest.approx(0.596, abs=0.001)


def test_flat_then_linear(ideal8b):
    """A decode step at context 0 on the ideal model, by hand: max(2 P' b / F, 2 P' / BW) for the body,
    k b / BW for the KV written, max(2 V d b / F, 2 V d / BW) for the LM head."""
    m, F, BW = ideal8b.model, 989.4e12, 3.35e12
    body, k, vd = m.body_params, ideal8b.kv_bytes_per_token, m.vocab * m.d_model

    def by_hand(b):
        return max(2 * body * b / F, 2 * body / BW) + k * b / BW + max(2 * vd * b / F, 2 * vd / BW)

    batch = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 600, 1200])
    t = ideal8b.decode_step_time(batch, 0)
    np.testing.assert_allclose(t, [by_hand(b) for b in batch], rtol=1e-12)
    # Below the ridge (295.3) more sequences are nearly free: 256 of them cost 0.8 % more than one ...
    assert t[8] / t[0] == pytest.approx(1 + 255 * k / BW / by_hand(1), rel=1e-9)
    assert 1.0 < t[8] / t[0] < 1.01
    # ... past it the step is linear in the batch, so doubling 600 sequences doubles it but for the fixed
    # weight-free terms: exactly 2 when both sides are compute-bound.
    assert t[10] / t[9] == pytest.approx(2.0, rel=1e-12)


def test_breakdown_parts_add_up(cost8b):
    b = cost8b.step_breakdown(prefill_chunks=[(512, 1024)], decode_contexts=[2048] * 64)
    assert b.total_s == pytest.approx(b.gemm_s + b.attn_s + b.elementwise_s + b.comm_s + b.overhead_s + b.lm_head_s
                                      + b.cpu_s)
    assert b.lm_head_s > 0
    assert b.comm_s == 0 and b.elementwise_s > 0
    assert cost8b.step_breakdown(decode_contexts=[100]).bound == "memory"
    assert cost8b.step_breakdown(prefill_chunks=[(8000, 0)]).bound == "compute"


def test_bound_flips_where_the_math_passes_the_traffic(h100):
    """``bound`` is "compute" when GEMM and attention math take longer than weights, KV and activations over HBM.
    On the ideal model (no elementwise term) a prefill of T new tokens at no context has math 2 P' T / F plus
    attention 2 L d T^2 / F, against traffic 2 P' / BW + k T / BW: it flips between T = 295 and 296 tokens for
    Llama-3-8B (the ridge point less a hair for the KV written)."""
    c = bl.CostModel(h100, bl.get_model("llama-3-8b")).ideal()
    m, F, BW = c.model, 989.4e12, 3.35e12
    d, k = m.heads * m.head_dim, c.kv_bytes_per_token

    def compute_bound(T):
        math_s = (2 * m.body_params * T + 2 * m.layers * d * T * T) / F
        return math_s > (2 * m.body_params + k * T) / BW

    flip = next(T for T in range(1, 1000) if compute_bound(T))
    assert flip in (295, 296)
    assert c.step_breakdown(prefill_chunks=[(flip - 1, 0)], sampled_chunks=0).bound == "memory"
    assert c.step_breakdown(prefill_chunks=[(flip, 0)], sampled_chunks=0).bound == "compute"


def test_mixed_step_matches_the_formula_by_hand(h100):
    c = bl.CostModel(h100, bl.get_model("llama-3-8b"), eta_compute=0.5, eta_memory=0.7, eta_attn=0.4,
                     eta_elementwise=0.6, overhead_s=2e-3, cpu_step_s=0.0, cpu_seq_s=0.0)
    m = c.model
    chunks, ctx = [(300, 700), (50, 0)], [1000, 3000, 20]
    T = 350 + 3
    L, d, k = m.layers, m.heads * m.head_dim, m.kv_bytes_per_token("bf16")
    F, BW = 989.4e12, 3.35e12
    body = m.params - 2 * m.vocab * m.d_model  # the embedding table is a lookup; the LM head runs apart
    gemm = max(2 * body * T / (0.5 * F), 2 * body / (0.7 * BW))
    lm_head = max(2 * 5 * m.vocab * m.d_model / (0.5 * F), m.vocab * m.d_model * 2 / (0.7 * BW))  # 5 rows sample
    f_attn = 2 * L * d * (300 * (2 * 700 + 300) + 50 * 50) + 4 * L * d * sum(ctx)
    b_kv = k * (700 + 0 + sum(ctx) + T)
    attn = max(f_attn / (0.4 * F), b_kv / (0.7 * BW))
    # Two fused add-RMSNorms (4 d each), RoPE on q and k (2 (32 + 8) 128), SiLU-and-mul (3 d_ff), BF16, L layers.
    elementwise = T * L * (8 * 4096 + 2 * 40 * 128 + 3 * 14336) * 2 / (0.6 * BW)
    assert c.step_time(chunks, ctx) == pytest.approx(gemm + lm_head + attn + elementwise + 2e-3, rel=1e-12)
    assert c.replace(eta_elementwise=None).step_time(chunks, ctx) == pytest.approx(gemm + lm_head + attn + 2e-3,
                                                                                    rel=1e-12)
    one_row = max(2 * 4 * m.vocab * m.d_model / (0.5 * F), m.vocab * m.d_model * 2 / (0.7 * BW))
    assert c.step_time(chunks, ctx, sampled_chunks=1) == pytest.approx(gemm + one_row + attn + elementwise + 2e-3,
                                                                       rel=1e-12)
    assert c.ideal().eta_elementwise is None  # DESIGN's pure roofline has no elementwise term
    # FLOPs and bytes of the step by hand: GEMMs, attention and the LM head's 5 rows; body weights, the LM head's,
    # the KV read and written, the activations.
    b = c.step_breakdown(chunks, ctx)
    assert b.flops == pytest.approx(2 * body * T + f_attn + 2 * 5 * m.vocab * m.d_model, rel=1e-12)
    act = T * L * (8 * 4096 + 2 * 40 * 128 + 3 * 14336) * 2
    assert b.hbm_bytes == pytest.approx(2 * body + b_kv + act + m.vocab * m.d_model * 2, rel=1e-12)
    math_s = 2 * body * T / (0.5 * F) + f_attn / (0.4 * F)
    traffic_s = 2 * body / (0.7 * BW) + b_kv / (0.7 * BW) + act / (0.6 * BW)
    assert b.bound == ("compute" if math_s > traffic_s else "memory") == "compute"  # 10 ms of math, 6 of weights


def test_serving_terms(cost8b):
    """CPU per step and per sequence adds to the step; async scheduling hides its share, never more than the GPU
    step; the request latency is not in the step (it delays the request, see test_sim_cases)."""
    c = cost8b.replace(cpu_step_s=2e-3, cpu_seq_s=1e-5, cpu_hidden_fraction=0.5, request_latency_s=0.05)
    gpu = cost8b.replace(cpu_step_s=0.0, cpu_seq_s=0.0).step_time(decode_contexts=[1000] * 100)
    cpu = 2e-3 + 100 * 1e-5
    assert c.step_time(decode_contexts=[1000] * 100, asynchronous=False) == pytest.approx(gpu + cpu, rel=1e-12)
    assert c.step_time(decode_contexts=[1000] * 100) == pytest.approx(gpu + cpu / 2, rel=1e-12)
    big = c.replace(cpu_step_s=1.0, cpu_hidden_fraction=1.0)  # the overlap is capped by the GPU step
    assert big.step_time(decode_contexts=[1000] * 100) == pytest.approx(1.0 + 100 * 1e-5, rel=1e-12)
    ideal = c.ideal()
    assert (ideal.request_latency_s, ideal.cpu_step_s, ideal.cpu_seq_s, ideal.cpu_hidden_fraction) == (0, 0, 0, 0)


def test_tensor_parallel_divides_work_and_adds_allreduce(h100):
    m = bl.get_model("llama-3-70b")
    one = bl.CostModel(h100, m, dtype="fp8").ideal()
    four = bl.CostModel(h100, m, dtype="fp8", tp=4).ideal()
    b1, b4 = one.step_breakdown(decode_contexts=[0] * 8), four.step_breakdown(decode_contexts=[0] * 8)
    assert b4.gemm_s == pytest.approx(b1.gemm_s / 4, rel=1e-9)
    expected_comm = 8 * 2 * m.layers * 2 * 3 / 4 * m.d_model * 2 / h100.interconnect_bytes_per_s
    assert b4.comm_s == pytest.approx(expected_comm, rel=1e-9)
    assert four.kv_pool_blocks() > 4 * one.kv_pool_blocks()  # weights shrink per GPU, so the pool grows


def test_kv_pool_size(cost8b, h100):
    # vLLM 0.33: 92 % of HBM less the weights, the profiled activations of an 8192-token step (gate/up and
    # activation outputs plus four hidden-state copies, BF16), float32 logits of 1024 rows with one softmax copy,
    # and the fixed non-torch and CUDA-graph reservation.
    k = 2 * 32 * 8 * 128 * 2
    activations = 8192 * (3 * 14336 + 4 * 4096) * 2 + 2 * 1024 * 128256 * 4
    expected = math.floor((0.92 * h100.hbm_bytes - 2 * 8030261248 - activations - 0.65e9) / (16 * k))
    assert cost8b.kv_pool_blocks() == expected == 28583
    first = math.floor((0.9 * h100.hbm_bytes - 2 * 8030261248) / (16 * k))  # batchlab's first pool: more blocks
    assert cost8b.kv_pool_blocks(0.9, 16, 0, 0) == math.floor((0.9 * h100.hbm_bytes - 2 * 8030261248 - 0.65e9)
                                                               / (16 * k)) < first


@pytest.mark.parametrize("kwargs, field", [
    (dict(dtype="fp16"), "dtype"), (dict(kv_dtype="int4"), "kv_dtype"), (dict(tp=0), "tp"), (dict(tp=16), "tp"),
    (dict(eta_compute=0), "eta_compute"), (dict(eta_memory=1.5), "eta_memory"), (dict(overhead_s=-1), "overhead_s"),
    (dict(overhead_s=math.nan), "overhead_s"), (dict(eta_elementwise=0), "eta_elementwise"),
    (dict(eta_elementwise=1.2), "eta_elementwise"), (dict(request_latency_s=-0.1), "request_latency_s"),
    (dict(cpu_seq_s=math.inf), "cpu_seq_s"), (dict(cpu_hidden_fraction=1.5), "cpu_hidden_fraction"),
    (dict(cpu_hidden_fraction=True), "cpu_hidden_fraction"),
])
def test_bad_cost_model_fields(h100, kwargs, field):
    with pytest.raises(ValueError, match=field):
        bl.CostModel(h100, bl.get_model("llama-3-8b"), **kwargs)


def test_unknown_presets():
    with pytest.raises(ValueError, match="hardware must be one of"):
        bl.get_hardware("b200")
    with pytest.raises(ValueError, match="model must be one of"):
        bl.get_model("gpt-5")


def test_bad_step_arguments(cost8b):
    with pytest.raises(ValueError, match="at least one"):
        cost8b.step_time()
    with pytest.raises(ValueError, match="new_tokens"):
        cost8b.step_time(prefill_chunks=[(0, 5)])
    with pytest.raises(ValueError, match="batch"):
        cost8b.decode_step_time(0, 10)
    with pytest.raises(ValueError, match="context"):
        cost8b.knee(-1)


def test_vllm_defaults_depend_on_the_gpu_not_the_model():
    assert bl.vllm_defaults(bl.get_hardware("h100-sxm")) == {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}
    assert bl.vllm_defaults(bl.get_hardware("h100-sxm"), "offline")["max_num_batched_tokens"] == 16384
    assert bl.vllm_defaults(bl.get_hardware("h200"))["max_num_seqs"] == 1024
    assert bl.vllm_defaults(bl.get_hardware("a100-80gb")) == {"max_num_seqs": 256, "max_num_batched_tokens": 2048}


def test_batch_for_step_time_is_the_closest_batch(cost8b):  # chapter 14, claim 4
    b = cost8b.batch_for_step_time(0.020, 2048)
    step = [cost8b.decode_step_time(x, 2048) for x in (b - 1, b, b + 1)]
    assert abs(step[1] - 0.020) <= min(abs(step[0] - 0.020), abs(step[2] - 0.020))
    assert cost8b.batch_for_step_time(0.030, 2048) > b  # a slower cadence carries more sequences
    with pytest.raises(ValueError, match="outside"):
        cost8b.batch_for_step_time(0.001, 2048)  # faster than one sequence's step


# -- cases that kill the surviving mutants of cost.py (scripts/MUTANTS.md) --------------------------------------
@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_flops_and_allreduces_by_hand(h100, tp):
    """Per GPU, every FLOP term is divided by t; each layer adds two ring all-reduces of 2 (t-1)/t of the
    activations per token and two latencies per step."""
    m = bl.get_model("llama-3-8b")
    c = bl.CostModel(h100, m, tp=tp).ideal().replace(allreduce_latency_s=3e-6)
    T, L, d = 100 + 8, m.layers, m.heads * m.head_dim
    b = c.step_breakdown(prefill_chunks=[(100, 50)], decode_contexts=[1000] * 8)
    flops = 2 * m.body_params * T + 2 * L * d * (100 * (2 * 50 + 100) + 2 * 8 * 1000) + 2 * 9 * m.vocab * m.d_model
    assert b.flops == pytest.approx(flops / tp, rel=1e-12)
    comm = T * 2 * L * 2 * (tp - 1) / tp * m.d_model * 2 / h100.interconnect_bytes_per_s + 2 * L * 3e-6
    assert b.comm_s == pytest.approx(comm, rel=1e-12)


def test_lm_head_runs_on_the_sampled_rows_only(ideal8b):
    """600 one-token chunks: the LM head over 600 rows is compute-bound (past the ridge), so it costs 2 V d rows / F;
    with 300 of them sampling, half that."""
    m, F = ideal8b.model, 989.4e12
    all_rows = ideal8b.step_breakdown(prefill_chunks=[(1, 0)] * 600)
    half = ideal8b.step_breakdown(prefill_chunks=[(1, 0)] * 600, sampled_chunks=300)
    assert all_rows.lm_head_s == pytest.approx(2 * 600 * m.vocab * m.d_model / F, rel=1e-12)
    assert half.lm_head_s == pytest.approx(2 * 300 * m.vocab * m.d_model / F, rel=1e-12)
    assert ideal8b.step_time([(1, 0)] * 600, sampled_chunks=300) == pytest.approx(half.total_s, rel=1e-12)
    assert ideal8b.step_time([(1, 0)]) > 0  # a one-token chunk is a valid step


def test_async_scheduling_is_the_default_of_the_step(cost8b):
    c = cost8b.replace(cpu_step_s=1e-3, cpu_hidden_fraction=0.5)
    ctx = [500] * 10
    assert c.step_time(decode_contexts=ctx) == c.step_time(decode_contexts=ctx, asynchronous=True)
    assert c.step_time(decode_contexts=ctx) < c.step_time(decode_contexts=ctx, asynchronous=False)
    assert c.decode_step_time(10, 500) == pytest.approx(c.step_time(decode_contexts=ctx), rel=1e-12)
    assert c.decode_step_time(10, 500, asynchronous=False) == pytest.approx(
        c.step_time(decode_contexts=ctx, asynchronous=False), rel=1e-12)
    grid = c.decode_step_time(np.array([[1, 2], [3, 4]]), 500)
    assert grid.shape == (2, 2) and grid[1, 1] == pytest.approx(c.decode_step_time(4, 500), rel=1e-12)


def test_ridge_with_efficiencies(h100):
    c = bl.CostModel(h100, bl.get_model("llama-3-8b"), eta_compute=0.6, eta_memory=0.5)
    assert c.ridge() == pytest.approx(0.6 * 989.4e12 * 2 / (2 * 0.5 * 3.35e12), rel=1e-12)
    assert c.ideal().frontend_s_per_token == 0.0 and c.ideal().allreduce_latency_s == 0.0


def test_kv_pool_defaults_and_edges(cost8b, h100):
    assert cost8b.kv_pool_blocks() == cost8b.kv_pool_blocks(0.92, 16, 8192, 1024)
    assert cost8b.vllm_reserved_bytes() == cost8b.vllm_reserved_bytes(8192, 1024)
    k = cost8b.kv_bytes_per_token
    free = 1.0 * h100.hbm_bytes - cost8b.weight_bytes - cost8b.vllm_reserved_bytes(8192, 1024)
    assert cost8b.kv_pool_blocks(1.0, 1) == math.floor(free / k)  # all of HBM, blocks of one token
    assert bl.CostModel(h100, bl.get_model("llama-3-70b")).kv_pool_blocks() == 0  # 141 GB of weights: no pool
    with pytest.raises(ValueError, match=r"^gpu_memory_utilization must be a finite number in \(0, 1\], got 0$"):
        cost8b.kv_pool_blocks(0)
    with pytest.raises(ValueError, match="^block_size must be an integer from 1 to 65536, got 0$"):
        cost8b.kv_pool_blocks(0.9, 0)


def test_batch_for_step_time_at_the_ends_of_its_range(cost8b):
    one, eight = cost8b.decode_step_time(1, 2048), cost8b.decode_step_time(8, 2048)
    assert cost8b.batch_for_step_time(one, 2048, max_batch=8) == 1
    assert cost8b.batch_for_step_time(eight, 2048, max_batch=8) == 8
    with pytest.raises(ValueError, match=r"^a 1 ms decode step is outside 1\.\.8 sequences at 2048 tokens"):
        cost8b.batch_for_step_time(0.001, 2048, max_batch=8)
    with pytest.raises(ValueError, match="outside 1..8 sequences"):
        cost8b.batch_for_step_time(eight * 1.001, 2048, max_batch=8)


def test_step_argument_messages_exactly(cost8b):
    with pytest.raises(ValueError, match="^a step needs at least one prefill chunk or one decode sequence$"):
        cost8b.step_time()
    with pytest.raises(ValueError, match=r"^prefill_chunks need new_tokens >= 1 and cached_tokens >= 0; "):
        cost8b.step_time(prefill_chunks=[(0, 5)])
    with pytest.raises(ValueError, match="^prefill_chunks need"):
        cost8b.step_time(decode_contexts=[-1])
    with pytest.raises(ValueError, match="^batch must be >= 1 and context >= 0$"):
        cost8b.decode_step_time(0, 10)
    with pytest.raises(ValueError, match="^sampled_chunks must be an integer from 0 to 1, got 2$"):
        cost8b.step_time([(10, 0)], sampled_chunks=2)
    with pytest.raises(ValueError, match="^sampled_chunks must be an integer from 0 to 1, got 0.5$"):
        cost8b.step_time([(10, 0)], sampled_chunks=0.5)


def test_fp8_weights_take_the_fp8_efficiencies(h100):
    """The defaults: BF16 weights the fitted eta_compute and eta_memory, FP8 weights their own fitted pair."""
    from batchlab.cost import DEFAULT_EFFICIENCY
    m = bl.get_model("llama-3-8b")
    bf16, fp8 = bl.CostModel(h100, m), bl.CostModel(h100, m, dtype="fp8")
    assert (bf16.eta_compute, bf16.eta_memory) == (DEFAULT_EFFICIENCY["eta_compute"], DEFAULT_EFFICIENCY["eta_memory"])
    assert (fp8.eta_compute, fp8.eta_memory) == (DEFAULT_EFFICIENCY["eta_compute_fp8"],
                                                 DEFAULT_EFFICIENCY["eta_memory_fp8"])
    assert fp8.eta_compute != bf16.eta_compute  # 0.564 and 0.706 in data/calibration.csv


def test_cost_model_stores_python_numbers(h100):
    """NumPy scalars are accepted and stored as Python int and float, so two equal models compare equal."""
    c = bl.CostModel(h100, bl.get_model("llama-3-8b"), tp=np.int64(2), eta_elementwise=np.float32(0.5),
                     eta_attn=np.float64(0.4), overhead_s=np.float32(0.25))
    assert type(c.tp) is int and type(c.eta_elementwise) is float and type(c.eta_attn) is float
    assert type(c.overhead_s) is float and c.eta_elementwise == 0.5 and c.overhead_s == 0.25
    with pytest.raises(ValueError, match=r"^hardware must be a Hardware \(see batchlab.get_hardware\)$"):
        bl.CostModel("h100-sxm", bl.get_model("llama-3-8b"))
    with pytest.raises(ValueError, match=r"^model must be a ModelSpec \(see batchlab.get_model\)$"):
        bl.CostModel(h100, "llama-3-8b")
    with pytest.raises(ValueError, match=r"^eta_elementwise must be None or in \(0, 1\], got 2$"):
        bl.CostModel(h100, bl.get_model("llama-3-8b"), eta_elementwise=2)


def test_a_step_that_samples_nothing_pays_no_lm_head(ideal8b):
    """A middle chunk (no row samples): no LM head time, FLOPs or bytes."""
    m = ideal8b.model
    b = ideal8b.step_breakdown(prefill_chunks=[(100, 0)], sampled_chunks=0)
    assert b.lm_head_s == 0.0
    assert b.flops == pytest.approx(2 * m.body_params * 100 + 2 * m.layers * m.heads * m.head_dim * 100 * 100,
                                    rel=1e-12)
    assert b.hbm_bytes == pytest.approx(2 * m.body_params + ideal8b.kv_bytes_per_token * 100, rel=1e-12)
    assert b.total_s == pytest.approx(b.gemm_s + b.attn_s, rel=1e-12)


def test_tensor_parallel_step_adds_its_all_reduces(h100):
    c = bl.CostModel(h100, bl.get_model("llama-3-8b"), tp=2).ideal().replace(allreduce_latency_s=3e-6)
    b = c.step_breakdown(decode_contexts=[1000] * 8)
    assert b.comm_s > 0
    assert b.total_s == pytest.approx(b.gemm_s + b.attn_s + b.lm_head_s + b.comm_s, rel=1e-12)


def test_bound_counts_the_elementwise_traffic(cost8b):
    """On the calibrated model the activations' traffic is on the memory side of the bound: the flip from memory
    to compute comes where GEMM and attention math pass weights, KV and activations over HBM, by hand."""
    c = cost8b
    m, F, BW = c.model, 989.4e12, 3.35e12
    d, k, a = m.heads * m.head_dim, c.kv_bytes_per_token, c.elementwise_bytes_per_token

    def compute_bound(T):
        math_s = 2 * m.body_params * T / (c.eta_compute * F) + 2 * m.layers * d * T * T / (c.eta_attn * F)
        return math_s > (2 * m.body_params + k * T) / (c.eta_memory * BW) + a * T / (c.eta_elementwise * BW)

    flip = next(T for T in range(1, 5000) if compute_bound(T))
    without = next(T for T in range(1, 5000)
                   if 2 * m.body_params * T / (c.eta_compute * F) + 2 * m.layers * d * T * T / (c.eta_attn * F)
                   > (2 * m.body_params + k * T) / (c.eta_memory * BW))
    assert flip > without  # the activations move the flip
    assert c.step_breakdown(prefill_chunks=[(flip - 1, 0)], sampled_chunks=0).bound == "memory"
    assert c.step_breakdown(prefill_chunks=[(flip, 0)], sampled_chunks=0).bound == "compute"


def test_step_breakdown_defaults_to_async_and_decode_step_time_to_a_float(cost8b):
    c = cost8b.replace(cpu_step_s=1e-3, cpu_hidden_fraction=0.5)
    ctx = [500] * 10
    assert c.step_breakdown(decode_contexts=ctx).total_s == c.step_time(decode_contexts=ctx, asynchronous=True)
    assert type(c.decode_step_time(10, 500)) is float


def test_named_coefficients_are_the_kernel_vector_by_slot_name(cost8b):
    from batchlab import _kernels as k

    named, coef = cost8b.named_coefficients(), cost8b.coefficients()
    assert list(named) == list(k.COEF_NAMES) and len(named) == k.N_COEF
    assert named["weight_bytes"] == coef[k.COEF_WEIGHT_BYTES]
    assert named["comm_s_per_step"] == coef[k.COEF_COMM_S_PER_STEP]
