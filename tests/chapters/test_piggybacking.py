"""Chapter 7 (piggybacking): step kinds, per-step utilisation, the budget split, the mixing comparison, the stalls
of prefill-only steps behind their p99 ITL peak, the readable tables, and the charts' specs (utilisation and
roofline with a shape per run, the budget split with its slider, the mixing comparison with a dash and a marker
per policy), the iteration picker (each iteration's rows replayed from the schedule and priced as the engine
priced them, both sides of every roofline) and the mixing facts."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from spec_helpers import marks, titles, walk

import batchlab as bl
from batchlab import viz
from batchlab.chapters import piggybacking as chapter
from batchlab.chapters import scenes


@pytest.fixture(scope="module")
def stream():
    return bl.preset("azure-conv-2023", 300, rate_req_s=float("inf"), seed=1)


@pytest.fixture(scope="module")
def small_stream():
    return bl.preset("azure-conv-2023", 200, rate_req_s=float("inf"), seed=2)


def test_seats_for_caps_the_default_at_the_budget(cost8b):
    assert [chapter.seats_for(cost8b, b) for b in (256, 1024, 2048, 8192)] == [256, 1024, 1024, 1024]  # H100: 1024
    with pytest.raises(ValueError, match="max_num_seqs"):  # what vLLM refuses, and why seats_for exists
        bl.simulate(bl.fixed(4, 100, 10), "chunked", cost8b, max_num_batched_tokens=512)
    split = chapter.budget_split(cost8b, bl.fixed(4, 100, 10), [256])  # runs with 256 seats, as vLLM must
    assert set(split["max_num_batched_tokens"]) == {256}


def test_within_context_keeps_what_vllm_serves(cost8b):
    reqs = bl.Requests(arrival_s=[0.0, 1.0, 2.0, 3.0], prompt_tokens=[100, 8191, 8192, 8000],
                       output_tokens=[50, 10, 10, 500])
    kept = scenes.within_context(cost8b, reqs)  # llama-3-8b: 8,192 tokens of context
    assert kept.arrival_s.tolist() == [0.0, 1.0, 3.0] and kept.prompt_tokens.tolist() == [100, 8191, 8000]
    assert kept.output_tokens.tolist() == [50, 1, 192]  # clipped to the room the prompt leaves
    res = bl.simulate(reqs, "chunked", cost8b)
    assert res.requests["rejected"].tolist() == [False, False, True, False]  # vLLM rejects the same prompt
    assert res.requests["output_tokens"][~res.requests["rejected"]].tolist() == [50, 1, 192]


def test_step_kinds_closed_form():
    steps = pd.DataFrame({"prefill_tokens": [0, 512, 300, 0], "decode_seqs": [64, 0, 20, 1]})
    assert chapter.step_kinds(steps).tolist() == ["decode", "prefill", "mixed", "decode"]


def test_step_utilisation_matches_the_roofline_quantities(cost8b, stream):
    res = bl.simulate(stream, "chunked", cost8b, max_num_batched_tokens=1024)
    df = chapter.step_utilisation({"a": res})
    s = res.steps
    assert len(df) == len(s) and set(df["kind"]) <= set(chapter.STEP_KINDS) and (df["run"] == "a").all()
    assert np.allclose(df["compute_util"], s["flops"] / (cost8b.peak_flops * s["duration_s"]))
    assert np.allclose(df["flops_per_s"] / cost8b.peak_flops, df["compute_util"])
    assert np.allclose(df["intensity"] * df["bandwidth_util"] * cost8b.hardware.hbm_bytes_per_s, df["flops_per_s"])
    assert (df["compute_util"] <= cost8b.eta_compute + 1e-9).all()  # no step beats its calibrated ceiling
    cut = chapter.step_utilisation({"a": res}, window_s=(1.0, 2.0))
    assert cut["start_s"].between(1.0, 2.0, inclusive="left").all() and 0 < len(cut) < len(df)


def test_mixed_steps_use_more_compute_than_decodes_and_more_bandwidth_than_prefills(cost8b, stream):
    runs = {"chunked": bl.simulate(stream, "chunked", cost8b, max_num_batched_tokens=2048),
            "v0": bl.simulate(stream, "continuous", cost8b, prefill_only_steps=True)}
    med = chapter.step_utilisation(runs).groupby("kind")[["compute_util", "bandwidth_util"]].median()
    assert med.loc["mixed", "compute_util"] > med.loc["decode", "compute_util"]
    assert med.loc["mixed", "bandwidth_util"] > med.loc["prefill", "bandwidth_util"]
    v0 = chapter.step_kinds(runs["v0"].steps)
    assert "mixed" not in set(v0) and {"decode", "prefill"} <= set(v0)  # V0 never mixes


def test_roofline_ceiling_closed_form(cost8b):
    hw = cost8b.hardware
    ridge = cost8b.peak_flops / hw.hbm_bytes_per_s  # 295.3 FLOP/byte for BF16 on H100
    df = chapter.roofline_ceiling(cost8b, [1.0, ridge, 10 * ridge])
    assert ridge == pytest.approx(295.3, abs=0.1)
    assert np.allclose(df["flops_per_s"], [hw.hbm_bytes_per_s, cost8b.peak_flops, cost8b.peak_flops])


def test_budget_split_accounts_for_every_token(cost8b, stream):
    budgets = [512, 1024, 2048]
    split = chapter.budget_split(cost8b, stream, budgets, bin_s=0.5)
    assert sorted(set(split["max_num_batched_tokens"])) == budgets
    assert np.allclose(split["log2_tokens"], np.log2(split["max_num_batched_tokens"]))
    per_bin = split.pivot_table(index=["max_num_batched_tokens", "time_s"], columns="kind", values="tokens_per_step")
    assert ((per_bin["prefill"] + per_bin["decode"]).to_numpy()
            <= per_bin.index.get_level_values("max_num_batched_tokens").to_numpy() + 1e-9).all()  # never over
    totals = (split["tokens_per_step"] * split["steps"]).groupby([split["max_num_batched_tokens"], split["kind"]]).sum()
    for b in budgets:
        seats = chapter.seats_for(cost8b, b)  # 512 of them with a 512-token budget
        res = bl.simulate(stream, "chunked", cost8b, max_num_batched_tokens=b, max_num_seqs=seats)
        served = res.requests[~res.requests["rejected"]]  # vLLM rejects prompts of 8,192 tokens or more
        assert res.summary()["preemptions"] == 0 and 0 < res.summary()["rejected"] < 5
        assert totals[(b, "prefill")] == pytest.approx(served["prompt_tokens"].sum())  # every prompt once
        # the step that completes a prompt emits its first token; every later token is one decode
        assert totals[(b, "decode")] == pytest.approx((served["output_tokens"] - 1).sum())


def test_mixing_comparison_same_load_same_lengths(cost8b):
    # 1,000 requests: with a few hundred the drain at the end of the run decides the throughput, not the mixing.
    df = chapter.mixing_comparison(cost8b, "azure-conv-2023", 1000, [4.0, 30.0], max_num_batched_tokens=2048, seed=1)
    assert len(df) == 2 * len(chapter.MIXING_POLICIES)
    assert set(df["policy"]) == set(chapter.MIXING_POLICIES)
    assert df.groupby("rate_req_s")["total_input_tokens"].nunique().eq(1).all()  # same lengths at every rate
    light = df[df["rate_req_s"] == 4.0].set_index("policy")["output_throughput"]
    assert light.max() / light.min() < 1.01  # far below saturation everyone serves the offered load
    sat = df[df["rate_req_s"] == 30.0].set_index("policy")  # past saturation: throughput is capacity
    chunked, v0 = (sat.loc[k] for k in ("chunked: prompt chunks mixed in (vLLM V1)", "prefill-only steps (vLLM V0)"))
    assert chunked["output_throughput"] > v0["output_throughput"]  # mixing raises the capacity
    assert chunked["p99_itl_ms"] < v0["p99_itl_ms"]


def test_utilisation_chart(cost8b, small_stream):
    runs = {"chunked": bl.simulate(small_stream, "chunked", cost8b, max_num_batched_tokens=2048),
            "v0": bl.simulate(small_stream, "continuous", cost8b, prefill_only_steps=True)}
    steps = chapter.step_utilisation(runs)
    spec = chapter.utilisation_chart(steps, chapter.roofline_ceiling(cost8b, np.geomspace(1, 1e4, 20))).to_dict()
    left, right = spec["vconcat"]
    assert marks(left) == {"point"} and marks(right) == {"line", "point"}
    assert left["encoding"]["x"]["field"] == "bandwidth_util" and left["encoding"]["y"]["field"] == "compute_util"
    assert left["encoding"]["color"]["scale"]["domain"] == ["decode", "mixed", "prefill"]
    dots = right["layer"][1]["encoding"]
    for enc in (left["encoding"], dots):  # the two runs pooled in one scatter, told apart by shape, with a legend
        assert enc["shape"]["field"] == "run" and enc["shape"]["scale"]["domain"] == ["chunked", "v0"]
        assert enc["shape"]["scale"]["range"] == ["circle", "triangle-up"] and enc["shape"]["title"] == "run"
        assert enc["shape"]["legend"]["orient"] == "top"
    assert dots["x"]["scale"]["type"] == "log" and dots["y"]["scale"]["type"] == "log"
    # lowercase words, units as the datasheet spells them
    assert dots["x"]["title"] == "arithmetic intensity (FLOP per byte)" and "(TFLOP/s)" in dots["y"]["title"]
    words = [t.replace("TFLOP", "tflop").replace("FLOP", "flop") for t in titles(spec)]
    assert "title" not in spec and all(t == t.lower() for t in words)
    tips = {t["field"]: t["title"] for t in dots["tooltip"]}  # the roofline panel's values, hovered
    assert tips["intensity"] == "arithmetic intensity (FLOP per byte)" and tips["tflops"].endswith("(TFLOP/s)")


def test_budget_split_chart_budget_slider(cost8b, small_stream):
    split = chapter.budget_split(cost8b, small_stream, [512, 1024, 2048, 4096])
    spec = chapter.budget_split_chart(split, max_num_batched_tokens=2048).to_dict()
    (param,) = spec["params"]
    assert param["name"] == "log2_tokens" and param["value"] == 11.0
    assert param["bind"] == {"input": "range", "min": 9.0, "max": 12.0, "step": 1.0,
                             "name": "max_num_batched_tokens (tokens)"}  # a slider over the log2 grid ...
    assert viz._slider_labels(spec)["log2_tokens"]["labels"] == ["512", "1,024", "2,048", "4,096"]  # ... in tokens
    assert marks(spec) == {"area", "rule", "text"}
    area = spec["layer"][0]["encoding"]
    assert area["y"]["stack"] == "zero" and area["color"]["field"] == "kind"
    assert all("log2_tokens" in f for f in walk(spec, "filter") if isinstance(f, str))
    assert all(t == t.lower() for t in titles(spec))


def test_mixing_chart():
    df = pd.DataFrame({"rate_req_s": [10.0, 10.0, 20.0, 20.0, np.inf, np.inf], "policy": ["a", "b"] * 3,
                       "output_throughput": [1e3, 1e3, 2e3, 1.9e3, 2.1e3, 2e3], "p99_itl_ms": [50, 90] * 3})
    spec = chapter.mixing_chart(df, rate_req_s=20.0).to_dict()
    left, right = spec["vconcat"]
    assert marks(spec) == {"line", "point", "rule"}
    assert left["layer"][0]["encoding"]["y"]["field"] == "output_throughput"
    for panel in (left, right):  # coinciding lines stay visible: a dash and a hollow marker shape per policy
        line, dots = panel["layer"][0], panel["layer"][1]
        dash = line["encoding"]["strokeDash"]["scale"]
        assert dash["domain"] == ["a", "b"] and dash["range"][0] != dash["range"][1]
        shape = dots["encoding"]["shape"]["scale"]
        assert shape["domain"] == ["a", "b"] and len(set(shape["range"])) == 2 and dots["mark"]["filled"] is False
    itl_y = right["layer"][0]["encoding"]["y"]
    assert itl_y["scale"]["type"] == "log"
    assert itl_y["axis"]["values"] == [50, 100] and itl_y["axis"]["format"] == ","  # a few ticks, with separators
    assert itl_y["scale"]["domain"][0] < 50 and itl_y["scale"]["domain"][1] > 90  # every point inside
    wide = chapter.mixing_chart(df.assign(p99_itl_ms=[3.0, 12000.0] * 3), rate_req_s=20.0).to_dict()
    assert wide["vconcat"][1]["layer"][0]["encoding"]["y"]["axis"]["values"] == [10, 100, 1000, 10000]
    assert left["layer"][0]["encoding"]["x"]["field"] == "rate_req_s"
    rates = [r["rate_req_s"] for rows in spec["datasets"].values() for r in rows if "rate_req_s" in r]
    # the infinite rate is left out, not turned into null: every rate drawn is a finite number, 10 and 20 twice each
    # (two policies) and the rule's 20
    assert all(isinstance(x, (int, float)) and np.isfinite(x) for x in rates)
    assert sorted(rates) == [10.0, 10.0, 20.0, 20.0, 20.0]
    assert all(t == t.lower() for t in titles(spec))
    with_cap = chapter.mixing_chart(df, rate_req_s=20.0, capacity_req_s=15.0).to_dict()
    caps = [r["capacity_req_s"] for rows in with_cap["datasets"].values() for r in rows if "capacity_req_s" in r]
    assert caps == [15.0] and marks(with_cap) == {"line", "point", "rule", "text"}


def test_prefill_stalls_closed_form():
    steps = pd.DataFrame({"start_s": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "duration_s": [1.0] * 7,
                          "prefill_tokens": [100, 0, 50, 60, 10, 70, 0], "decode_seqs": [0, 5, 0, 0, 4, 0, 0]})
    stalls = chapter.prefill_stalls(steps)  # prefill-only: 0, then 2-3, then 5; 6 is an idle step (neither)
    assert stalls["start_s"].tolist() == [0.0, 2.0, 5.0] and stalls["iterations"].tolist() == [1, 2, 1]
    assert stalls["duration_s"].tolist() == [1.0, 2.0, 1.0]


def test_stall_comparison_explains_the_prefill_only_peak(cost8b):
    df = chapter.stall_comparison(cost8b, "azure-conv-2023", 1000, [4.0, 40.0], seed=1)
    assert df["rate_req_s"].tolist() == [4.0, 40.0] and (df["n_requests"] == 1000).all()
    light, heavy = df.iloc[0], df.iloc[1]
    assert (df["preemptions"] == 0).all()  # whole-request KV reserved at admission: nobody is preempted
    assert light["kv_used"] < 0.5 < 0.95 < heavy["kv_used"] <= 1.0  # overload fills the cache ...
    assert heavy["chained"] < 0.5 and 0 <= light["chained"] <= 1  # ... and admission waits for freed blocks
    assert heavy["request_throughput"] < 40.0 and heavy["p99_ttft_ms"] > 10 * light["p99_ttft_ms"]
    stream = scenes.within_context(cost8b, bl.preset("azure-conv-2023", 1000, rate_req_s=4.0, seed=1))
    res = bl.simulate(stream, "continuous", cost8b, prefill_only_steps=True)
    assert light["p99_itl_ms"] == res.summary()["p99_itl_ms"]  # the same run as the mixing comparison's V0
    assert light["stalls"] == len(chapter.prefill_stalls(res.steps))
    assert (df["n_run"] == len(stream.arrival_s)).all() and len(stream.arrival_s) < 1000  # what the runs serve
    html = chapter.stall_table(df).to_html()
    assert "KV cache in use (median)" in html and "p99 TTFT (s)" in html and "kv_used" not in html


def test_kind_table_reads_in_units(cost8b, small_stream):
    util = chapter.step_utilisation({"a": bl.simulate(small_stream, "chunked", cost8b, max_num_batched_tokens=2048)})
    html = chapter.kind_table(util).to_html()
    assert "compute (% of peak)" in html and "duration (ms)" in html and "%" in html and "compute_util" not in html


def test_kind_medians_keep_the_runs_apart(cost8b, small_stream):
    runs = {"v1": bl.simulate(small_stream, "chunked", cost8b, max_num_batched_tokens=2048),
            "v0": bl.simulate(small_stream, "continuous", cost8b, prefill_only_steps=True)}
    util = chapter.step_utilisation(runs)
    med = chapter.kind_medians(util)
    assert list(dict.fromkeys(med["run"])) == ["v1", "v0"]  # runs in order, then kinds in STEP_KINDS order
    assert med[["run", "kind"]].drop_duplicates().shape[0] == len(med) and med["iterations"].sum() == len(util)
    for (run, kind), row in med.set_index(["run", "kind"]).iterrows():  # each run's own medians, never pooled
        own = util[(util["run"] == run) & (util["kind"] == kind)]
        assert row["bandwidth_util"] == own["bandwidth_util"].median() and row["iterations"] == len(own)
        assert row["decode_seqs"] == own["decode_seqs"].median()
    assert "mixed" not in set(med.loc[med["run"] == "v0", "kind"])  # prefill-only steps never mix
    html = chapter.kind_table(util).to_html()
    assert html.count("<tr") == len(med) + 1 and "decode rows" in html and ">run<" in html


# -- inside one iteration -------------------------------------------------------------------------------------------
def _priced(cost, rows, asynchronous):
    """Every step of ``rows`` priced from its rows (seconds, FLOP, bytes), through the cost model's breakdown."""
    out = {}
    for step, one in rows.groupby("step"):
        chunks = one[one["kind"] == "prefill"]
        b = cost.step_breakdown(list(zip(chunks["new_tokens"], chunks["cached_tokens"])),
                                one.loc[one["kind"] == "decode", "cached_tokens"].tolist(),
                                sampled_chunks=int(chunks["samples"].sum()), asynchronous=asynchronous)
        out[step] = (b.total_s, b.flops, b.hbm_bytes)
    return pd.DataFrame(out, index=["duration_s", "flops", "hbm_bytes"]).T


@pytest.mark.parametrize("knobs", [{}, {"async_scheduling": False}, {"num_kv_blocks": 1500}],
                         ids=["async", "sync", "preempting"])
def test_iteration_rows_replay_what_the_engine_priced(cost8b, stream, knobs):
    # Identity: each step's rows, priced by the cost model, give the step's duration, FLOPs and bytes exactly,
    # prefix hits and preemptions (a small KV pool) included.
    res = bl.simulate(stream, "chunked", cost8b, max_num_batched_tokens=1024, record_schedule=True, **knobs)
    rows = chapter.iteration_rows(res)
    priced = _priced(cost8b, rows, res.knobs["async_scheduling"])
    assert len(priced) == len(res.steps) and (priced.index == res.steps.index).all()
    for col in priced:
        assert np.allclose(priced[col], res.steps[col], rtol=1e-12, atol=0), col
    assert (res.summary()["preemptions"] > 0) == ("num_kv_blocks" in knobs)  # the case does preempt
    # every prompt token computed once per admission, one sample per output token
    served = res.requests[~res.requests["rejected"]]
    assert rows["samples"].sum() == served["output_tokens"].sum()
    assert (rows.loc[rows["kind"] == "decode", "new_tokens"] == 1).all()
    first = rows[rows["kind"] == "prefill"].groupby("request").first()
    assert (first["cached_tokens"] == 0).all()  # no prefix blocks: every prompt starts from an empty cache
    assert chapter.iteration_rows(res, 10)["step"].max() == 10


def test_iteration_rows_need_a_recorded_schedule(cost8b, small_stream):
    with pytest.raises(AttributeError, match="record_schedule"):
        chapter.iteration_rows(bl.simulate(small_stream, "chunked", cost8b))


def test_iteration_split_gives_both_sides_of_every_roofline(cost8b):
    rows = pd.DataFrame({"step": 0, "request": [0, 1, 2, 3], "kind": ["prefill", "decode", "decode", "prefill"],
                         "new_tokens": [1500, 1, 1, 200], "cached_tokens": [512, 900, 3000, 0],
                         "samples": [False, True, True, True]})
    split = chapter.iteration_split(cost8b, rows, asynchronous=False)
    b = cost8b.step_breakdown([(1500, 512), (200, 0)], [900, 3000], sampled_chunks=1, asynchronous=False)
    # the step pays the longer side of each operator: the breakdown's times
    assert max(split["gemm_compute_s"], split["gemm_memory_s"]) == pytest.approx(b.gemm_s, rel=1e-12)
    assert max(split["attn_compute_s"], split["attn_memory_s"]) == pytest.approx(b.attn_s, rel=1e-12)
    assert max(split["lm_head_compute_s"], split["lm_head_memory_s"]) == pytest.approx(b.lm_head_s, rel=1e-12)
    paid = b.gemm_s + b.attn_s + b.lm_head_s + split["elementwise_s"] + split["overhead_s"] + split["cpu_s"]
    assert split["total_s"] == b.total_s == pytest.approx(paid, rel=1e-12)
    # closed forms: 2 P' T FLOPs at eta_c F; the body's weights at the calibrated bandwidth; 1,702 new tokens
    bw = cost8b.eta_memory * cost8b.hardware.hbm_bytes_per_s
    assert split["gemm_compute_s"] == pytest.approx(
        2 * cost8b.model.body_params * 1702 / (cost8b.eta_compute * cost8b.peak_flops), rel=1e-12)
    assert split["gemm_memory_s"] + split["lm_head_memory_s"] == pytest.approx(cost8b.streamed_weight_bytes / bw)
    assert split["attn_memory_s"] == pytest.approx(cost8b.kv_bytes_per_token * (512 + 900 + 3000 + 1702) / bw)
    # a big chunk: compute-bound GEMMs, and its causal rows make even the attention compute-bound beside two decodes
    assert split["gemm_compute_s"] > split["gemm_memory_s"] and split["attn_compute_s"] > split["attn_memory_s"]
    nothing = chapter.iteration_split(cost8b, rows[rows["request"] == 0])  # a chunk that samples nothing
    assert nothing["lm_head_compute_s"] == nothing["lm_head_memory_s"] == 0.0


def test_iteration_apart_saves_a_weight_stream_and_a_fixed_cost(cost8b):
    rows = pd.DataFrame({"step": 0, "request": [0] + list(range(1, 65)), "kind": ["prefill"] + ["decode"] * 64,
                         "new_tokens": [1900] + [1] * 64, "cached_tokens": [0] + [1000] * 64,
                         "samples": [True] + [True] * 64})
    apart = chapter.iteration_apart(cost8b, rows)
    whole = chapter.iteration_split(cost8b, rows)
    decodes = chapter.iteration_split(cost8b, rows[rows["kind"] == "decode"])
    assert apart["decodes_s"] == decodes["total_s"] and apart["decodes_s"] + apart["prompts_s"] > whole["total_s"]
    assert apart["saved_s"] == pytest.approx(apart["decodes_s"] + apart["prompts_s"] - whole["total_s"], rel=1e-12)
    parts = apart["saved_weights_s"] + apart["saved_attention_s"] + apart["saved_fixed_s"]
    assert apart["saved_s"] == pytest.approx(parts, rel=1e-12)
    # the decodes stream no weights of their own, paying their GEMM FLOPs instead (the chunk samples: LM head too)
    stream = cost8b.streamed_weight_bytes / (cost8b.eta_memory * cost8b.hardware.hbm_bytes_per_s)
    assert apart["saved_weights_s"] == pytest.approx(stream - decodes["gemm_compute_s"], rel=1e-9)
    fixed = cost8b.overhead_s + cost8b.cpu_step_s * (1 - cost8b.cpu_hidden_fraction)  # fixed_step_async
    assert apart["saved_fixed_s"] == pytest.approx(fixed, rel=1e-9)
    # the CPU work splits into a fixed part per iteration and a part per sequence; only the first is saved
    assert whole["cpu_step_s"] + whole["cpu_seq_s"] == pytest.approx(whole["cpu_s"], rel=1e-12)
    assert whole["cpu_step_s"] == pytest.approx(cost8b.cpu_step_s * (1 - cost8b.cpu_hidden_fraction), rel=1e-9)
    assert whole["cpu_seq_s"] == pytest.approx(65 * cost8b.cpu_seq_s * (1 - cost8b.cpu_hidden_fraction), rel=1e-9)
    alone = chapter.iteration_apart(cost8b, rows[rows["kind"] == "decode"])
    assert alone["prompts_s"] == alone["saved_s"] == 0.0 and alone["decodes_s"] == decodes["total_s"]


@pytest.fixture(scope="module")
def picker(cost8b, stream):
    res = bl.simulate(stream, "chunked", cost8b, max_num_batched_tokens=1024, record_schedule=True)
    return res, chapter.picker_frames(cost8b, res, 20, 30)


def test_picker_frames_are_the_runs_iterations(cost8b, picker):
    res, frames = picker
    it = frames["iterations"]
    assert it["position"].tolist() == list(range(30)) and it["step"].tolist() == list(range(20, 50))
    assert np.allclose(it["duration_s"], res.steps["duration_s"].iloc[20:50], rtol=1e-12)
    assert (it["prompt_tokens"] == res.steps["prefill_tokens"].iloc[20:50].to_numpy()).all()
    assert (it["decodes"] == res.steps["decode_seqs"].iloc[20:50].to_numpy()).all()
    words = {"decode": "decodes only", "mixed": "mixed", "prefill": "prompts only"}
    assert it["label"].tolist() == [f"{s:,} ({words[k]})" for s, k in zip(it["step"], it["kind"])]
    counted = frames["decodes"].groupby("position")["decodes"].sum()
    assert (counted.reindex(it["position"], fill_value=0).to_numpy() == it["decodes"].to_numpy()).all()
    new = frames["chunks"][frames["chunks"]["part"] == "new"].groupby("position")["tokens"].sum()
    assert (new.reindex(it["position"], fill_value=0).to_numpy() == it["prompt_tokens"].to_numpy()).all()
    split = frames["split"]
    paid = split[split["paid"]].groupby("position")["ms"].sum()  # the opaque bars add up to the step
    assert np.allclose(paid.to_numpy(), it["duration_s"] * 1e3, rtol=1e-9)
    lines = frames["readout"][frames["readout"]["position"] == 0]["text"].tolist()
    took = viz.format_duration(it["duration_s"].iloc[0], unit="s")  # the book's rule: "27.1 ms"
    assert lines[0] == f"iteration 20 at {it['start_s'].iloc[0]:.2f} s: {took}" and took.endswith(" ms")
    assert chapter.busiest(frames) == int(it["position"].iloc[it["prompt_tokens"].argmax()])
    with pytest.raises(ValueError, match="first_step"):
        chapter.picker_frames(cost8b, res, len(res.steps) - 5, 30)


def test_iteration_chart_slider_and_panels(picker):
    _, frames = picker
    spec = chapter.iteration_chart(frames, position=3).to_dict()
    (param,) = [p for p in spec["params"] if p["name"] == "iteration"]
    assert param["bind"]["input"] == "range" and param["value"] == 3.0
    assert param["bind"]["min"] == 0 and param["bind"]["max"] == 29 and param["bind"]["step"] == 1
    assert viz._slider_labels(spec)["iteration"]["labels"] == frames["iterations"]["label"].tolist()
    assert len(spec["vconcat"]) == 4 and {"bar", "text"} <= marks(spec)
    filters = [f for f in walk(spec, "filter") if isinstance(f, str)]
    at = "abs(datum['position'] - iteration) < 0.5"  # every panel shows the chosen iteration only
    assert sum(at in f for f in filters) == 7 and all(at in f or f == "datum.part == 'new'" for f in filters)
    tips = [t for tt in walk(spec, "tooltip") for t in (tt if isinstance(tt, list) else [tt])]
    assert tips and all(isinstance(t, dict) and t.get("title") for t in tips)
    assert not [t["title"] for t in tips if "_" in t["title"]]
    for chart in walk(spec, "tooltip"):  # one tooltip never shows two fields under one title (the last would win)
        if isinstance(chart, list):
            assert len({t["title"] for t in chart}) == len(chart), chart
    by_field = {t["field"]: t["title"] for t in tips}
    assert by_field["tokens"] == "tokens in this bar (tokens)" and by_field["new_tokens"].endswith("(tokens)")
    assert by_field["cached_tokens"].endswith("(tokens)") and by_field["decodes"].endswith("(sequences)")
    decode_axis = [e["y"]["title"] for e in walk(spec, "encoding") if e.get("y", {}).get("field") == "decodes"]
    assert decode_axis == ["decode rows (sequences)"]
    chunk = frames["chunks"].iloc[0]
    assert chunk["part_words"] and chunk["new_tokens"] >= 0 and chunk["cached_tokens"] >= 0
    assert chapter.iteration_chart(frames).to_dict()["params"][0]["value"] == chapter.busiest(frames)


def test_mixing_facts_are_the_conv_scene_at_its_overload_rate():
    from batchlab.chapters import facts

    rate = facts.value("rate_over_req_s")
    here = chapter.conv_mixing([rate]).set_index("policy")
    for key, label in {"v1": "chunked: prompt chunks mixed in (vLLM V1)", "orca": "whole prompts mixed in (Orca)",
                       "v0": "prefill-only steps (vLLM V0)"}.items():
        assert facts.value(f"mix_{key}_tput") == here.loc[label, "output_throughput"]
        assert facts.value(f"mix_{key}_p99_itl_ms") == here.loc[label, "p99_itl_ms"]
    assert rate > facts.value("capacity_req_s")  # past capacity: throughput is what each scheduler can do
    assert facts.value("mix_v1_tput") > facts.value("mix_orca_tput") > facts.value("mix_v0_tput")
    assert facts.value("mix_v1_p99_itl_ms") < facts.value("mix_orca_p99_itl_ms")


def test_steps_table_shows_the_steps_in_words_and_units(cost8b):
    steps = bl.simulate(bl.fixed(8, 500, 20), "chunked", cost8b, max_num_batched_tokens=2048).steps.head(3)
    shown = chapter.steps_table(steps)
    assert list(shown.data.columns) == ["iteration", "start (s)", "duration", "prompt tokens", "decode rows",
                                        "compute (TFLOP)", "HBM traffic (GB)"]
    html = shown.to_html()
    assert viz.format_duration(float(steps["duration_s"].iloc[0]), unit="s") in html  # the book's duration rule
    assert f"{steps['flops'].iloc[0] / 1e12:.2f}" in html and f"{steps['hbm_bytes'].iloc[0] / 1e9:.1f}" in html
    assert "e+" not in html  # no raw exponents
