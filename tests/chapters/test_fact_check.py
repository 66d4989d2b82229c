"""Chapter 14 (fact check): each number against its closed form, the chunking trade-off's shape on the shared
scene, and the trade-off chart with a slider over log2 of the token budget."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from spec_helpers import walk

import batchlab as bl
from batchlab import viz
from batchlab.chapters import fact_check as chapter



def test_prefill_gap_closed_forms(cost8b, cost70b_fp8, h100):
    ideal = chapter.prefill_gap(cost8b.ideal(), 8000)
    # DESIGN: GEMMs about 113 ms and attention about 17 ms at 100 % of BF16 peak; the LM head for one sampled row
    # streams its 1.05 GB (0.3 ms).
    assert ideal["step_s"] == pytest.approx(0.1301, abs=5e-4)
    assert ideal["mfu"] == pytest.approx(1.0, abs=0.01) and ideal["bound"] == "compute"
    m = cost8b.model
    flops = 2 * m.body_params * 8000 + 2 * m.layers * m.attn_dim * 8000**2 + 2 * m.vocab * m.d_model
    assert ideal["flops"] == pytest.approx(flops)
    big = chapter.prefill_gap(cost70b_fp8.ideal(), 8000)
    assert big["step_s"] == pytest.approx(0.5964, abs=5e-4)  # >= 596 ms at 100 % of FP8 peak
    gemm = 2 * cost70b_fp8.model.body_params * 8000 / h100.flops_fp8
    assert gemm == pytest.approx(0.553, abs=1e-3) and big["step_s"] > gemm > 0.400  # the GEMMs alone miss 400 ms
    calibrated = chapter.prefill_gap(cost8b, 8000, decoders=64, context=2048)
    assert calibrated["step_s"] > ideal["step_s"] and 0 < calibrated["mfu"] < 1


def test_prefill_arithmetic_closed_forms(cost8b, cost70b_fp8):
    a = chapter.prefill_arithmetic(cost8b, 8000)
    assert a["gemm_flop"] == 2 * cost8b.model.body_params * 8000
    assert a["gemm_s"] == pytest.approx(0.113, abs=0.5e-3)  # 2 P'N / F: 113 ms of GEMMs on one H100 SXM
    assert a["ideal_s"] == pytest.approx(0.130, abs=0.5e-3)  # + 17 ms of attention and the LM head
    assert a["flops"] == pytest.approx(a["gemm_flop"] + a["attn_flop"] + 2 * cost8b.model.embedding_params)
    big = chapter.prefill_arithmetic(cost70b_fp8, 8000)
    assert big["peak_flops"] == cost70b_fp8.hardware.flops_fp8
    assert 0.552 < big["gemm_s"] < 0.554 and 0.596 < big["ideal_s"] < 0.597  # 553 ms of GEMMs, 596 ms in all


def test_implied_mfu(cost8b, cost70b_fp8):
    assert chapter.implied_mfu(cost70b_fp8.ideal(), 8000, 0.400) > 1  # impossible on one H100
    # The shared scene's decoders at 2,048 tokens (scenes.default_decoders): a 400 ms gap is 33 % MFU.
    gap = chapter.prefill_gap(cost8b, 8000, 116, 2048)
    assert chapter.implied_mfu(cost8b, 8000, 0.400, 116, 2048) == pytest.approx(
        gap["flops"] / (0.400 * 989.4e12), rel=1e-12)
    assert chapter.implied_mfu(cost8b, 8000, 0.400, 116, 2048) == pytest.approx(0.330, abs=0.002)
    gap = chapter.prefill_gap(cost8b, 8000, 10, 1024)
    assert chapter.implied_mfu(cost8b, 8000, gap["step_s"], 10, 1024) == pytest.approx(gap["mfu"])


def test_max_num_seqs_table_follows_the_gpu_not_the_model():
    gpus = [bl.get_hardware(n) for n in bl.hardware_names()]
    models = [bl.get_model("llama-3-8b"), bl.get_model("llama-3-70b")]
    table = chapter.max_num_seqs_table(gpus, models)
    assert len(table) == len(gpus) * 2
    assert (table.groupby("gpu")["max_num_seqs"].nunique() == 1).all()
    at = table.set_index(["gpu", "model"])
    assert at.loc[("h100-sxm", "llama-3-70b"), "max_num_seqs"] == 1024
    assert at.loc[("a100-80gb", "llama-3-8b"), ["max_num_seqs", "max_num_batched_tokens", "offline_tokens"]].tolist() \
        == [256, 2048, 8192]
    assert at.loc[("h200", "llama-3-8b"), ["max_num_batched_tokens", "offline_tokens"]].tolist() == [8192, 16384]
    assert (table["agrees"] == (table["max_num_seqs"] == table["article_rule"])).all()
    assert not at.loc[("h100-sxm", "llama-3-70b"), "agrees"] and at.loc[("h100-sxm", "llama-3-8b"), "agrees"]


@pytest.fixture(scope="module")
def trade(cost8b):
    return chapter.chunking_tradeoff(cost8b, [4096, 64, 512, 128], n_decoders=16, context=512, prompt_tokens=2000)


def test_chunking_tradeoff_chunks_are_the_budget_left_by_the_decodes(trade):
    # Every iteration gives one token to each of the 16 decoders and the rest of the budget to the prompt.
    assert trade["max_num_batched_tokens"].tolist() == [64, 128, 512, 4096]  # sorted
    expected = [math.ceil(2000 / (b - 16)) for b in trade["max_num_batched_tokens"]]
    assert trade["chunks"].tolist() == expected and expected[-1] == 1
    np.testing.assert_allclose(trade["log2_tokens"], np.log2(trade["max_num_batched_tokens"]))


def test_chunking_tradeoff_no_budget_improves_both(trade, cost8b):
    assert (np.diff(trade["ttft_s"]) < 0).all() and (np.diff(trade["itl_max_s"]) > 0).all()
    assert (trade["itl_max_s"] > trade["cadence_s"]).all()
    # Unchunked, the tallest gap is the step holding the whole prompt beside the decodes at 512 cached tokens, on
    # the scene's synchronous engine (all of the step's CPU work paid), and prefill_gap prices that step.
    whole = cost8b.step_time(prefill_chunks=[(2000, 0)], decode_contexts=[512] * 16, asynchronous=False)
    assert trade["itl_max_s"].iloc[-1] == pytest.approx(whole, rel=1e-9) == chapter.prefill_gap(
        cost8b, 2000, 16, 512)["step_s"]
    hidden = chapter.prefill_gap(cost8b, 2000, 16, 512, asynchronous=True)["step_s"]
    assert whole - hidden == pytest.approx(cost8b.cpu_hidden_fraction * (cost8b.cpu_step_s + 17 * cost8b.cpu_seq_s))


def test_chunking_tradeoff_rejects_a_budget_the_decodes_fill(cost8b):
    with pytest.raises(ValueError, match="exceed"):
        chapter.chunking_tradeoff(cost8b, [16, 512], n_decoders=16, context=512)


def test_tradeoff_chart_spec():
    trade = pd.DataFrame({"max_num_batched_tokens": [512, 1024, 2048], "log2_tokens": [9.0, 10.0, 11.0],
                          "ttft_s": [0.670, 0.400, 0.300], "itl_max_s": [0.030, 0.041, 0.065],
                          "cadence_s": [0.0224, 0.0224, 0.0224], "chunks": [23, 10, 1]})
    spec = chapter.tradeoff_chart(trade).to_dict()
    (param,) = spec["params"]
    assert param["name"] == "log2_tokens" and param["value"] == 11.0
    # A slider over log2 of the budget, evenly spaced, that shows the budget in tokens, not its log2.
    assert param["bind"] == {"input": "range", "min": 9.0, "max": 11.0, "step": 1.0,
                             "name": "max_num_batched_tokens (tokens)"}
    assert viz._slider_labels(spec)["log2_tokens"]["labels"] == ["512", "1,024", "2,048"]
    kinds = [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"] for layer in spec["layer"]]
    assert kinds.count("text") == 3 and {"line", "rule", "point"} <= set(kinds)
    filters = list(walk(spec, "filter"))
    assert len(filters) == 3 and all("log2_tokens" in f for f in filters)  # labels, ring and readout follow it
    labels = spec["layer"][1]
    assert labels["transform"] == [{"filter": f"!({filters[-1]})"}]  # the ringed point alone has no budget label
    line = spec["layer"][0]["encoding"]
    assert line["x"]["field"] == "ttft_ms" and line["y"]["field"] == "itl_max_ms"
    assert line["x"]["title"] == "newcomer's TTFT (ms)" and line["y"]["title"] == "tallest decoder gap (ms)"
    assert line["x"]["axis"]["format"] == line["y"]["axis"]["format"] == ",.0f"  # thousands separators
    assert line["y"]["scale"]["domain"][1] > 65.0  # room above the tallest point for its label
    tips = line["tooltip"]
    assert [t["field"] for t in tips] == ["max_num_batched_tokens", "chunks", "ttft_text", "gap_text"]
    assert all(t["title"] and "_" not in t["title"].replace("max_num_batched_tokens", "") for t in tips)  # words
    # durations by the book's one rule, as the readout prints them ("27.3 ms", not a tooltip's "27")
    calcs = {c["as"]: c["calculate"] for c in spec["layer"][0]["transform"]}
    assert calcs == {"ttft_text": viz.duration_text("ttft_ms"), "gap_text": viz.duration_text("itl_max_ms")}
    # the ring sits on top of the chosen point: it carries the same tooltip, or hovering that point shows nothing
    (ring,) = [layer for layer in spec["layer"] if layer["mark"].get("type") == "point" and layer["mark"].get("size")]
    assert ring["encoding"]["tooltip"] == tips
    assert {c["as"] for c in ring["transform"] if "calculate" in c} >= {"ttft_text", "gap_text"}
    points = spec["datasets"][spec["layer"][0]["data"]["name"]]
    assert [p["ttft_ms"] for p in points] == pytest.approx([670.0, 400.0, 300.0])  # seconds in, shown in ms
    assert [p["itl_max_ms"] for p in points] == pytest.approx([30.0, 41.0, 65.0])
    rule = next(layer for layer in spec["layer"] if layer["mark"] == "rule" or layer["mark"].get("type") == "rule")
    assert spec["datasets"][rule["data"]["name"]][0]["itl_max_ms"] == pytest.approx(22.4)  # the median cadence
    readout = spec["layer"][-1]
    assert readout["encoding"]["x"] == {"value": {"expr": "width"}}  # the plot's right edge, narrowed or not
    label = next(t["calculate"] for t in readout["transform"] if "calculate" in t)
    assert "' chunk'" in label and "' chunks'" in label  # "1 chunk", "5 chunks"


def test_styled_verdicts_one_row_per_claim_coloured_by_verdict():
    table = pd.DataFrame({"claim": ["a", "b"], "scope": ["Llama-3-8B BF16, one H100 SXM", "any model"],
                          "verdict": ["holds", "does not hold"], "numbers": ["1", "2"]})
    html = chapter.styled_verdicts(table).to_html()
    assert html.count(chapter.VERDICT_COLOURS["holds"]) == 1 and chapter.VERDICT_COLOURS["does not hold"] in html
    data = chapter.styled_verdicts(table).data
    assert data.columns.tolist() == ["claim", "the article says", "about", "verdict", "computed here"]
    assert data["claim"].tolist() == [1, 2]


def test_defaults_view_keeps_every_value_under_a_readable_header():
    gpus = [bl.get_hardware(n) for n in bl.hardware_names()]
    table = chapter.max_num_seqs_table(gpus, [bl.get_model("llama-3-8b")])
    shown = chapter.defaults_view(table)
    view = shown.data
    assert "memory (GiB)" in view.columns and "GPU" in view.columns and len(view) == len(table)
    assert view["vLLM's max_num_seqs"].tolist() == table["max_num_seqs"].tolist()
    assert view["agree"].tolist() == ["yes" if a else "no" for a in table["agrees"]]
    assert "H100 SXM" in view["GPU"].tolist() and "Llama-3-8B" in view["model"].tolist()
    html = shown.to_html()
    assert "1,024" in html and "79.6" in html and "h100-sxm" not in html
