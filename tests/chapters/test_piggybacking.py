"""Chapter 07 (piggybacking): step kinds, per-step utilisation, the budget split, the mixing comparison, the stalls
of prefill-only steps behind their p99 ITL peak, the readable tables, and the charts' specs (utilisation and
roofline with a shape per run, the budget split with its buttons, the mixing comparison with a dash and a marker
per policy)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from spec_helpers import marks, titles, walk

import batchlab as bl
from batchlab.chapters import piggybacking as chapter


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
    kept = chapter.within_context(cost8b, reqs)  # llama-3-8b: 8,192 tokens of context
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
    assert "title" not in spec and all(t == t.lower() for t in titles(spec))


def test_budget_split_chart_budget_buttons(cost8b, small_stream):
    split = chapter.budget_split(cost8b, small_stream, [512, 1024, 2048, 4096])
    spec = chapter.budget_split_chart(split, max_num_batched_tokens=2048).to_dict()
    (param,) = spec["params"]
    assert param["name"] == "log2_tokens" and param["value"] == 11.0
    assert param["bind"] == {"input": "radio", "options": [9.0, 10.0, 11.0, 12.0],
                             "labels": ["512", "1,024", "2,048", "4,096"],
                             "name": "max_num_batched_tokens (tokens)"}  # the budget in tokens, not its log2
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
    assert right["layer"][0]["encoding"]["y"]["scale"]["type"] == "log"
    assert left["layer"][0]["encoding"]["x"]["field"] == "rate_req_s"
    rates = [r["rate_req_s"] for rows in spec["datasets"].values() for r in rows if "rate_req_s" in r]
    # the infinite rate is left out, not turned into null: every rate drawn is a finite number, 10 and 20 twice each
    # (two policies) and the rule's 20
    assert all(isinstance(x, (int, float)) and np.isfinite(x) for x in rates)
    assert sorted(rates) == [10.0, 10.0, 20.0, 20.0, 20.0]
    assert all(t == t.lower() for t in titles(spec))


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
    stream = chapter.within_context(cost8b, bl.preset("azure-conv-2023", 1000, rate_req_s=4.0, seed=1))
    res = bl.simulate(stream, "continuous", cost8b, prefill_only_steps=True)
    assert light["p99_itl_ms"] == res.summary()["p99_itl_ms"]  # the same run as the mixing comparison's V0
    assert light["stalls"] == len(chapter.prefill_stalls(res.steps))
    html = chapter.stall_table(df).to_html()
    assert "KV cache in use (median)" in html and "p99 TTFT (s)" in html and "kv_used" not in html


def test_kind_table_reads_in_units(cost8b, small_stream):
    util = chapter.step_utilisation({"a": bl.simulate(small_stream, "chunked", cost8b, max_num_batched_tokens=2048)})
    html = chapter.kind_table(util).to_html()
    assert "compute (% of peak)" in html and "duration (ms)" in html and "%" in html and "compute_util" not in html
