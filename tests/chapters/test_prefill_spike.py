"""Chapter 5 (prefill spike): the spike is the admitting step, the requests behind the long prompt wait for it,
V0's order makes it longer; the chart is a timeline and a TTFT panel that two groups of radio buttons filter
together, every tooltip titled in words, no label running off the panel."""
from __future__ import annotations

import numpy as np
import pytest
from spec_helpers import axis_titles, marks, walk

from batchlab import viz
from batchlab.chapters import prefill_spike as chapter

SMALL = dict(n_decoders=32, context=1024, prompt_tokens=4000, tail_steps=20)


@pytest.fixture(scope="module")
def orca(cost8b):
    return chapter.prefill_spike(cost8b, n_behind=4, seed=1, **SMALL)


def test_the_largest_gap_is_the_admitting_step(orca, cost8b):
    s, steps = orca.summary, orca.run.steps
    admit = steps.iloc[s["admit_step"]]
    # The short requests all arrive after the admitting step began: it holds the long prompt and the decodes.
    assert admit["prefill_tokens"] == 4000 and admit["decode_seqs"] == 32 and admit["bound"] == "compute"
    assert s["itl_max_s"] == pytest.approx(s["admit_step_s"], rel=1e-9)
    assert s["admit_step_s"] >= cost8b.prefill_time(4000) == s["prefill_s"]
    # The engine saw it as the step began; its client sent it the request latency before.
    assert s["ttft_s"] == pytest.approx(cost8b.request_latency_s + s["admit_step_s"], rel=1e-9)
    # Every decoder sees that gap exactly once, at the end of the admitting step.
    top = orca.itl[orca.itl["itl_s"] == orca.itl["itl_s"].max()]
    assert top["sequences"].tolist() == [32]
    end = admit["start_s"] + admit["duration_s"] - orca.run.requests["arrival_s"].iloc[32]
    assert top["time_s"].iloc[0] == pytest.approx(end)
    # Before the long prompt the decoders run pure decode steps at the cost model's time (Orca's loop is
    # synchronous: the step pays all of its CPU work).
    assert s["cadence_s"] == pytest.approx(cost8b.decode_step_time(32, 1024 - 1, asynchronous=False), rel=1e-9)
    assert s["ideal_prefill_s"] == cost8b.ideal().prefill_time(4000) < s["prefill_s"]


def test_timeline_keeps_the_lead_and_every_decoder(orca, cost8b):
    gaps = orca.itl
    assert (gaps["time_s"] < 0).sum() >= 5 and gaps["time_s"].min() >= -0.2 and gaps["itl_s"].min() > 0
    assert (gaps["sequences"] == 32).all()  # lockstep: one row per iteration, every decoder in it
    # The engine sees the prompt at a step's end and takes it in the next: it waits the request latency only.
    assert orca.run.requests["queue_s"].iloc[32] == pytest.approx(cost8b.request_latency_s, abs=1e-12)


def test_requests_behind_wait_for_the_prefill(orca):
    b = orca.behind
    assert len(b) == 4 and (np.diff(b["arrival_s"]) >= 0).all()
    assert b["arrival_s"].min() >= 0 and b["arrival_s"].max() <= orca.summary["prefill_s"]
    assert (b["ttft_s"] > b["ttft_baseline_s"]).all() and orca.summary["behind_kv_waits"] == 0
    assert (np.diff(b["ttft_s"]) < 0).all()  # they wait for the prefill's end: the later, the shorter
    assert orca.summary["behind_ttft_s"] == pytest.approx(b["ttft_s"].mean())
    assert not orca.baseline.requests["prompt_tokens"].eq(4000).any()


def test_a_prompt_the_kv_pool_cannot_hold_is_an_error(cost70b_fp8):
    # Llama-3-70B FP8 on one H100 at vLLM's default gpu_memory_utilization (0.92): 72.7 GB of weights (embedding
    # and LM head in BF16) leave 452 usable blocks of 16 tokens, fewer than the 501 the 8,000-token prompt and
    # its 16 output tokens need. vLLM would refuse to start with Llama-3's 8,192-token context.
    assert cost70b_fp8.kv_pool_blocks() - 1 == 452
    with pytest.raises(ValueError, match="cannot be served.*501 KV blocks"):
        chapter.prefill_spike(cost70b_fp8, n_decoders=1, n_behind=0)


@pytest.mark.parametrize("n_decoders, waits", [(2, 0), (3, 4)])
def test_short_requests_wait_for_kv_only_when_the_pool_is_short(cost70b_fp8, n_decoders, waits):
    # Orca reserves prompt + output at admission: the short requests that fit in the blocks the decoders and the
    # long prompt leave start as its prefill ends; the others wait for memory (70B FP8 at gpu_memory_utilization
    # 0.95, 941 usable blocks: two decoders leave room for all six, three for two).
    spike = chapter.prefill_spike(cost70b_fp8, n_decoders=n_decoders, n_behind=6, seed=0,
                                  gpu_memory_utilization=0.95)
    req = spike.run.requests
    blocks = -(-(req["prompt_tokens"] + req["output_tokens"]).to_numpy() // spike.run.knobs["block_size"])
    free = spike.run.knobs["num_kv_blocks"] - 1 - blocks[:n_decoders + 1].sum()
    assert spike.run.knobs["num_kv_blocks"] - 1 == 941
    assert spike.summary["behind_kv_waits"] == max(0, 6 - free // blocks[-1]) == waits
    # The long prompt itself never waits for memory, only for the request latency.
    assert spike.run.requests["queue_s"].iloc[n_decoders] == pytest.approx(cost70b_fp8.request_latency_s, abs=1e-12)


def test_v0_order_makes_the_gap_longer_and_no_decode_runs_with_the_prompt(cost8b, orca):
    v0 = chapter.prefill_spike(cost8b, n_behind=0, prefill_only_steps=True, **SMALL)
    s = v0.summary
    admit = v0.run.steps.iloc[s["admit_step"]]
    assert admit["decode_seqs"] == 0 and admit["prefill_tokens"] == 4000
    nxt = v0.run.steps.iloc[s["admit_step"] + 1]
    assert s["itl_max_s"] == pytest.approx(admit["duration_s"] + nxt["duration_s"])
    assert s["itl_max_s"] > orca.summary["itl_max_s"]


def test_spike_grows_with_the_prompt(cost8b):
    spikes = [chapter.prefill_spike(cost8b, n_decoders=16, context=512, prompt_tokens=n, n_behind=0,
                                    tail_steps=5).summary["itl_max_s"] for n in (1000, 2000, 4000, 8000)]
    assert (np.diff(spikes) > 0).all()


@pytest.fixture(scope="module")
def frames(cost8b, cost70b_fp8):
    return chapter.spike_scenarios({"8b": (cost8b, 16), "70b": (cost70b_fp8, 2, {"gpu_memory_utilization": 0.95})},
                                   context=512, prompt_tokens=2000, n_behind=3, tail_steps=5)


def test_scenarios_frames(frames, cost8b, cost70b_fp8):
    itl, behind, summary, spikes = frames
    assert len(summary) == 4 and set(spikes) == {(m, o) for m in ("8b", "70b") for o in chapter.SPIKE_ORDERS}
    assert set(behind["run"]) == {"with the long prompt", "without it"} and len(behind) == 4 * 3 * 2
    assert {"model", "order", "time_s", "itl_ms", "sequences"} <= set(itl.columns)
    for (m, o), s in spikes.items():
        sub = itl[(itl["model"] == m) & (itl["order"] == o)]
        assert sub["itl_ms"].max() == pytest.approx(s.summary["itl_max_s"] * 1e3)
    row = summary.set_index(["model", "order"]).loc[("70b", "mixed step (Orca)")]
    assert row["itl_max_s"] > row["ideal_prefill_s"] >= cost70b_fp8.ideal().prefill_time(2000)
    assert row["n_decoders"] == 2 and row["kv_pool_tokens"] == 941 * 16  # its own gpu_memory_utilization, 0.95
    assert spikes["8b", "mixed step (Orca)"].run.knobs["num_kv_blocks"] == cost8b.kv_pool_blocks()  # vLLM's 0.92


def test_admission_table_marks_the_prompt_step_in_ms(orca):
    at = orca.summary["admit_step"]
    table = chapter.admission_table(orca, before=2, after=2)
    shown = table.data
    assert len(shown) == 5 and shown.index[2] == at
    notes = shown["besides the decodes"].tolist()
    assert notes[:2] == ["decodes only"] * 2 and notes[2] == "the long prompt, all 4,000 tokens"
    assert notes[3] == "4 short prompts of 256 tokens"  # n_behind=4, all admitted in the next iteration
    assert (shown["prompt tokens"][[n == "decodes only" for n in notes]] == 0).all()
    # times count from the long prompt's send (the chart's zero): the engine sees it one request latency later
    start = shown["start (ms)"]
    req = orca.run.requests
    sent = req["arrival_s"].iloc[orca.summary["n_decoders"]]
    assert start.loc[at] == pytest.approx((orca.run.steps["start_s"].loc[at] - sent) * 1e3)
    assert start.iloc[1] < 0 < start.loc[at]
    assert shown["duration (ms)"].loc[at] == pytest.approx(orca.summary["admit_step_s"] * 1e3)
    html = table.to_html()
    assert "duration (ms)" in html and "prompt tokens" in html and "duration_s" not in html


def test_scenario_table_in_ms_with_words(frames):
    _, _, summary, _ = frames
    shown = chapter.scenario_table(summary)
    data = shown.data.set_index("time")
    runs = [f"{m}, {o}" for m, o in zip(summary["model"], summary["order"])]
    assert list(data.columns) == runs and len(runs) == 4  # one column per run: four fit the text column
    np.testing.assert_allclose(data.loc["longest gap"].astype(float), summary["itl_max_s"] * 1e3)
    html = shown.to_html()
    assert "longest gap" in html and "itl_max" not in html and "cadence_s" not in html
    for v in summary["itl_max_s"]:  # each cell in the book's one duration rule: "196 ms", "1.10 s"
        assert f">{viz.format_duration(v, 's')}<" in html


def test_spike_chart(frames):
    itl, behind, _, _ = frames
    spec = chapter.spike_chart(itl, behind, 400, "the article's 400 ms").to_dict()
    assert "title" not in spec and len(spec["vconcat"]) == 2
    params = {p["name"]: p for p in spec["params"]}
    assert set(params) == {"model", "order"}
    assert params["model"]["bind"] == {"input": "radio", "options": ["8b", "70b"], "name": "model"}
    assert params["order"]["bind"]["input"] == "radio"  # two named choices each: buttons, not a select box
    assert params["order"]["bind"]["options"] == list(chapter.SPIKE_ORDERS)
    assert params["model"]["value"] == "8b"
    picks = [f for f in walk(spec, "filter") if isinstance(f, str) and "== model" in f]
    assert len(picks) == 3 + 1 and all("== order" in f for f in picks)  # dots, two spike labels, ttft panel
    assert {"circle", "text", "rule", "line"} <= marks(spec)
    timeline, ttft = spec["vconcat"]
    dots = timeline["layer"][0]["encoding"]
    assert dots["x"]["field"] == "time_s" and dots["y"]["field"] == "itl_ms"
    assert ttft["encoding"]["color"]["field"] == "run" and ttft["encoding"]["y"]["field"] == "ttft_ms"
    assert set(axis_titles(spec)) >= {"inter-token latency (ms)", "TTFT (ms)"}
    assert all(t.replace("TTFT", "ttft") == t.lower() for t in axis_titles(spec))
    ruled = [lyr for lyr in timeline["layer"] if lyr["mark"].get("type") == "text" and "x" in lyr["encoding"]
             and lyr["encoding"]["x"].get("value") is not None]
    assert [r["encoding"]["x"]["value"] for r in ruled] == ["width"]  # the reference's label follows the panel's edge
    ref = [r for d in spec["datasets"].values() for r in d if r.get("text") == "the article's 400 ms"]
    assert ref == [{"itl_ms": 400, "text": "the article's 400 ms"}]


def test_spike_label_marks_the_largest_gap_on_the_side_with_room(frames):
    itl, behind, _, _ = frames
    spec = chapter.spike_chart(itl, behind).to_dict()
    labels = spec["vconcat"][0]["layer"][1:]
    assert len(labels) == 2  # no reference rule unless asked: the two spike labels
    for label, text, align in zip(labels, ("right_text", "left_text"), ("left", "right")):
        ops = [t for t in label["transform"] if "joinaggregate" in t or "filter" in t]
        assert {"op": "max", "field": "itl_ms", "as": "top"} in ops[-2]["joinaggregate"]
        assert ops[-1]["filter"] == "datum.itl_ms == datum.top"  # both layers hold the dot: neither is ever empty
        assert label["mark"]["align"] == align  # right of a dot in the left half, left of one in the right half
        assert label["encoding"]["text"]["field"] == text
    calc = {t["as"]: t["calculate"] for t in labels[0]["transform"] if "calculate" in t}
    assert calc["left"] == "datum.time_s > (datum.lo + datum.hi) / 2"
    assert calc["right_text"] == "datum.left ? '' : datum.text" and calc["left_text"] == "datum.left ? datum.text : ''"


def test_every_tooltip_is_titled_in_words(frames):
    itl, behind, _, _ = frames
    spec = chapter.spike_chart(itl, behind, 400, "the article's 400 ms").to_dict()
    tips = [t for v in walk({k: v for k, v in spec.items() if k != "datasets"}, "tooltip") for t in v]
    assert len(tips) == 3 + 2 + 3  # gaps, the reference, the short requests
    assert all(t.get("title") and "_" not in t["title"] for t in tips)
    assert {"inter-token latency", "TTFT", "arrival after the long prompt (ms)"} <= {t["title"] for t in tips}
    durations = [t for t in tips if t["title"] in ("inter-token latency", "TTFT")]  # "1.33 s", not "1,333.4"
    assert len(durations) == 2 and all(t["field"] in ("gap", "ttft") and t["type"] == "nominal" for t in durations)


def test_spike_chart_axes_fit_every_selection(frames):
    # Issue: with the 70B model selected the y titles were pushed past the left edge. Both axes now reserve the
    # widest label of any selection, and the chart pads its left side.
    itl, behind, _, _ = frames
    spec = chapter.spike_chart(itl, behind, 400, "the article's 400 ms").to_dict()
    widest = max(itl["itl_ms"].max(), behind["ttft_ms"].max(), 400)
    timeline, ttft = spec["vconcat"]
    extents = {timeline["layer"][0]["encoding"]["y"]["axis"]["minExtent"], ttft["encoding"]["y"]["axis"]["minExtent"]}
    assert len(extents) == 1 and extents.pop() >= 7 * len(f"{widest:,.0f}") + 10
    assert spec["padding"]["left"] >= 10
    assert chapter.label_extent([3.0, 12_345.6]) == 7 * len("12,346") + 10
