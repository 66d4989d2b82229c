"""One verdict per claim (batchlab.chapters.verdicts): the closed forms the verdicts rest on, the verdicts
themselves, and that every chapter that states a verdict glues it from the one table instead of spelling it."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from batchlab import viz
from batchlab.chapters import scenes
from batchlab.chapters import verdicts as chapter

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
VERDICT_CHAPTERS = ("05_prefill_spike", "12_cheat_sheet", "14_fact_check")
LEGEND = "**holds**, **holds under stated conditions**, or **does not hold**"


def test_compute_knee_moves_right_then_vanishes(cost8b):
    ideal = cost8b.ideal()
    assert chapter.compute_knee(ideal, 0) == pytest.approx(ideal.knee(0)) == pytest.approx(295.3, abs=0.05)
    edge = chapter.knee_vanishes_at(ideal)
    # W / (k R): 15.0 GB of streamed weights over 128 KiB of KV per token times 295.3 sequences.
    assert edge == pytest.approx(ideal.streamed_weight_bytes / (131072 * ideal.knee(0))) and 380 < edge < 395
    knees = [chapter.compute_knee(ideal, c) for c in (0, 64, 128, 256, 0.999 * edge)]
    assert all(b > a for a, b in zip(knees, knees[1:]))  # right, not down
    assert math.isinf(chapter.compute_knee(ideal, edge * 1.001)) and math.isinf(chapter.compute_knee(ideal, 1024))
    assert ideal.knee(1024) < ideal.knee(0)  # the quantity that does fall: where the step leaves its floor


def test_attention_share_at_8k(cost8b):
    a = chapter.attention_share(cost8b, 8000)
    m = cost8b.model
    attn = 2 * m.layers * m.attn_dim * 8000**2
    gemm = 2 * m.body_params * 8000
    assert a["share"] == pytest.approx(attn / (attn + gemm + 2 * m.vocab * m.d_model))
    assert 0.12 < a["share"] < 0.135  # GEMMs about 113 ms, attention about 17 ms at peak
    assert a["crossover_tokens"] == pytest.approx(m.body_params / (m.layers * m.attn_dim))
    assert chapter.attention_share(cost8b, round(a["crossover_tokens"]))["share"] == pytest.approx(0.5, abs=0.01)


def test_budget_caps_every_token_decodes_included(cost8b):
    caps = chapter.budget_caps(cost8b, 1024)
    decoders = scenes.default_decoders(cost8b)
    assert caps["most_tokens"] == 1024 and caps["decodes"] == decoders
    assert caps["most_prefill"] == 1024 - decoders  # the prompt gets what the decodes leave
    # So the budget does cap the prefill tokens, with the condition the verdict states.
    assert chapter.verdict("budget_caps").startswith("holds under stated conditions (")
    assert "counts decode tokens too, which take theirs first" in chapter.verdict("budget_caps")


def test_fixed_step_cost_counts_the_chunks(cost8b):
    small, whole = chapter.fixed_step_cost(cost8b, 8000, 512), chapter.fixed_step_cost(cost8b, 8000, 8192)
    assert (small["steps"], whole["steps"]) == (16, 1)
    assert small["fixed_s"] == pytest.approx(16 * (cost8b.overhead_s + cost8b.cpu_step_s))
    assert whole["total_s"] == pytest.approx(cost8b.step_time(prefill_chunks=[(8000, 0)], asynchronous=False))
    assert small["total_s"] > whole["total_s"] and small["fixed_share"] > 5 * whole["fixed_share"]


def test_every_duration_in_a_verdict_reads_by_the_book_rule(table):
    """The numbers the verdicts rest on print durations as the rest of the book does (batchlab.viz.format_duration):
    three significant digits and their unit; only the article's own round numbers (400 ms, 20 ms) keep theirs."""
    article = {f"{chapter.ARTICLE['gap_ms']} ms", f"{chapter.ARTICLE['cadence_ms']} ms"}
    numbers = " ".join(table["numbers"]) + " " + " ".join(table["scope"])
    shown = set(re.findall(r"(?<![\d.,])[\d.,]+ m?s\b", numbers)) - article
    assert len(shown) >= 8
    for text in shown:
        value, unit = text.split(" ")
        assert viz.format_duration(float(value.replace(",", "")), unit=unit) == text, text
    chunking = chapter.verdict("chunking")  # the real strings, as the page reads them
    assert "tallest gap from 213 ms to 27.3 ms and TTFT from 219 ms to 568 ms" in table.set_index("id").loc[
        "chunking", "numbers"], chunking
    assert "16 times: 28.5 ms" in table.set_index("id").loc["launch_overhead", "numbers"]


def test_both_better_finds_pairs_that_beat_the_default_on_both():
    sweep = pd.DataFrame({"max_num_seqs": [1024, 1024, 256, 2048], "max_num_batched_tokens": [8192, 4096, 4096, 1024],
                          "p99_ttft_ms": [420.0, 410.0, 430.0, 100.0], "p99_itl_ms": [160.0, 105.0, 90.0, 50.0],
                          "vllm_refuses": [False, False, False, True]})
    wins = chapter.both_better(sweep, {"max_num_seqs": 1024, "max_num_batched_tokens": 8192})
    assert wins[["max_num_seqs", "max_num_batched_tokens"]].values.tolist() == [[1024, 4096]]
    assert wins["default_p99_itl_ms"].iloc[0] == 160.0


@pytest.fixture(scope="module")
def table():
    return chapter.claim_table()


def test_one_verdict_per_claim(table):
    assert table["id"].is_unique and set(table["verdict"]) <= set(chapter.CATEGORIES)
    assert dict(zip(table["id"], table["verdict"])) == {
        "knee": "holds", "kv_knee": "holds under stated conditions", "weights": "holds",
        "cadence": "holds under stated conditions",
        "gap": "does not hold", "max_num_seqs": "does not hold",
        "chunking": "holds under stated conditions", "quadratic": "does not hold",
        "budget_caps": "holds under stated conditions",
        "launch_overhead": "holds under stated conditions"}
    for row in table.itertuples():  # every verdict names the model and the GPU it is about
        assert row.text == f"{row.verdict} ({row.scope})" == chapter.verdict(row.id)
        assert ("Llama-3" in row.scope or "any model" in row.scope) and ("H100" in row.scope or "any GPU" in row.scope)
    # The 400 ms gap: neither model gives it, and the verdict says what each gives and that the mechanism holds.
    gap, numbers = chapter.verdict("gap"), chapter.claim_numbers()
    assert "Llama-3-8B BF16" in gap and "Llama-3-70B FP8" in gap and "whole prefill holds" in gap
    assert viz.format_duration(numbers["gap_small_s"], unit="s") in gap and numbers["gap_small_s"] < 0.85 * 0.400
    # The knee: the verdict names both batch sizes, and which one the KV cache pulls down.
    assert "for the knee" in chapter.verdict("kv_knee") and "compute crossover" in chapter.verdict("kv_knee")
    # Chapter 08's own grid: a smaller budget than the default improves p99 TTFT and p99 ITL at once.
    wins = chapter.claim_numbers()["wins"]
    assert ((wins["max_num_seqs"] == 256) & (wins["max_num_batched_tokens"] == 4096)).any()


def _cells(name):
    return json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())["cells"]


@pytest.mark.parametrize("name", VERDICT_CHAPTERS)
def test_chapters_glue_the_one_verdict(name, table):
    cells = _cells(name)
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "verdicts.glue_verdicts(glue" in code  # the strings come from the one table
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    used = set(re.findall(r"\{glue:text\}`verdict_(\w+)`", text))
    assert used and used <= set(table["id"])
    # No chapter spells a verdict of its own: with the glued ones taken out, no category is left in the prose.
    prose = re.sub(r"\{glue(:text)?\}`[^`]*`", "", " ".join(text.split()))
    prose = prose.replace(LEGEND, "")  # the page may name the three categories once, as a legend
    assert not re.search(r"holds under stated conditions|does not hold", prose), name
    assert not [b for b in re.findall(r"\*\*(.+?)\*\*", prose) if re.search(r"\bholds?\b", b)], name  # "**It holds**"


def test_the_disputed_verdicts_appear_in_every_chapter_that_discusses_them():
    texts = {n: "\n".join("".join(c["source"]) for c in _cells(n)) for n in VERDICT_CHAPTERS}
    for claim_id in ("gap", "cadence"):
        assert all(f"verdict_{claim_id}" in t for t in texts.values()), claim_id


def test_the_defaults_verdict_names_every_gpu_preset(table):
    import batchlab as bl
    from batchlab import viz

    scope = table.set_index("id").loc["max_num_seqs", "scope"]
    assert all(viz.GPU_NAMES[g] in scope for g in bl.hardware_names()), scope  # the table beside it has them all


def test_the_pair_that_beats_the_default_is_a_fact():
    from batchlab.chapters import facts

    best = chapter.best_pair()
    wins = chapter.claim_numbers()["wins"]
    assert best["p99_itl_ms"] == wins["p99_itl_ms"].min()
    assert facts.value("chunking_win_max_num_seqs") == int(best["max_num_seqs"]) == 256
    assert facts.value("chunking_win_max_num_batched_tokens") == int(best["max_num_batched_tokens"]) == 4096
    assert facts.value("chunking_win_p99_itl_ms") == float(best["p99_itl_ms"])
    assert facts.value("chunking_win_p99_ttft_ms") == float(best["p99_ttft_ms"]) < best["default_p99_ttft_ms"]
    assert "(256, 4,096) beats the default" in chapter.claim_table().set_index("id").loc["chunking", "numbers"]
