"""Chapter 13 (validation): the validation frames agree with the shipped calibration, the sampler keeps what a
parity chart needs, the end-to-end runs behave like a server (closed forms on hand-made frames, invariants); the
parity chart (select over sets, before/after panels, log axes, y = x and the target band) and the end-to-end
chart beside the published vLLM figures; the book's setup beside the closest measured runs; tooltips and tables in
words. Everything reads the compact tables in data/."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from spec_helpers import marks, walk

import batchlab as bl
from batchlab import calibrate, viz
from batchlab._data import DATA_DIR
from batchlab.chapters import validation as chapter


@pytest.fixture(scope="module")
def costs(cost8b):
    return cost8b.replace(**calibrate.START), cost8b


@pytest.fixture(scope="module")
def frames(costs):
    return chapter.validation_frames(*costs)


def test_errors_reproduce_the_shipped_error_table(frames):
    _, errors = frames
    shipped = pd.read_csv(DATA_DIR / "calibration_errors.csv")
    shipped = shipped[shipped["split"] == "all"].set_index("set")
    ours = errors.set_index("set").loc[shipped.index]
    assert (ours["cases"] == shipped["cases"]).all()
    for col in ("median_rel_err_before", "worst_rel_err_before", "median_rel_err_after", "worst_rel_err_after"):
        np.testing.assert_allclose(ours[col], shipped[col], atol=1e-3)  # the CSV is rounded to 4 decimals


def test_cases_pair_up_across_stages(frames):
    cases, errors = frames
    before, after = (cases[cases["stage"] == s].set_index("case_id") for s in ("before", "after"))
    assert before.index.equals(after.index) and (before["measured_s"] == after["measured_s"]).all()
    np.testing.assert_allclose(after["rel_err"], (after["predicted_s"] / after["measured_s"] - 1).abs())
    assert set(cases["group"]) == {"fit", "ridge", "held out"}
    counts = before.groupby("set").size()
    assert (errors.set_index("set").loc[counts.index, "cases"] == counts).all()
    # Kernel floors only raise a prediction: the per-operator sets after calibration never predict 0.
    assert (after["predicted_s"] > 0).all()
    assert errors.set_index("set")["diagnostic"].sum() == len(calibrate.DIAGNOSTIC_SETS)


def test_parity_sample_keeps_each_panels_worst_and_pairs(frames):
    cases, _ = frames
    sample = chapter.parity_sample(cases, per_set=20)
    for name, per in sample.groupby("set"):
        ids = per.groupby("stage")["case_id"].apply(set)
        assert ids["before"] == ids["after"] and len(ids["after"]) <= 22
        full = cases[cases["set"] == name]
        for stage in ("before", "after"):
            assert per.loc[per["stage"] == stage, "rel_err"].max() == full.loc[full["stage"] == stage, "rel_err"].max()
    np.testing.assert_allclose(sample["measured_ms"], cases.set_index(["case_id", "stage"]).loc[
        list(zip(sample["case_id"], sample["stage"])), "measured_s"].to_numpy() * 1e3)
    assert sample["case"].str.len().min() > 0


def test_llmservingsim_forward_parts(costs):
    out = chapter.llmservingsim_forward(costs[1])
    assert len(out) == 2048
    assert ((out["measured_elementwise_s"] > 0) & (out["measured_elementwise_s"] < out["measured_s"])).all()
    np.testing.assert_allclose(out["predicted_s"].iloc[[0, -1]],
                               [costs[1].prefill_time(int(t)) for t in out["tokens"].iloc[[0, -1]]])
    # The elementwise term is exactly the difference between the model with and without it.
    np.testing.assert_allclose(out["predicted_s"] - out["predicted_without_elementwise_s"],
                               out["predicted_elementwise_s"], rtol=1e-9, atol=1e-12)
    # Eager PyTorch's elementwise kernels are slower than the fused ones the model charges for.
    assert (out["measured_elementwise_s"] > out["predicted_elementwise_s"]).all()


def test_eager_holdout_error_is_measured_on_the_longer_prompts_only(costs):
    short = chapter.eager_holdout_error(costs[1], max_tokens=1024)
    shipped = chapter.eager_holdout_error(costs[1], max_tokens=calibrate.EAGER_FIT_MAX_TOKENS)
    assert set(short.index) == set(shipped.index) == {"llmservingsim_attn", "llmservingsim_elementwise"}
    assert (short > 0).all() and shipped["llmservingsim_attn"] < short["llmservingsim_attn"]  # fit on more, fit better


def test_match_means_hits_the_targets_and_keeps_arrivals():
    stream = bl.preset("sharegpt", 2000, rate_req_s=5.0, seed=1)
    matched = chapter.match_means(stream, 202.0, 179.0)
    assert abs(matched.prompt_tokens.mean() - 202.0) < 0.5 and abs(matched.output_tokens.mean() - 179.0) < 0.5
    assert (matched.arrival_s == stream.arrival_s).all() and matched.prompt_tokens.min() >= 1
    cv = lambda a: a.std() / a.mean()  # noqa: E731
    assert cv(matched.output_tokens) == pytest.approx(cv(stream.output_tokens), rel=0.02)  # same shape


def test_vllm_v060_runs_behave_like_a_server(costs):
    runs = chapter.vllm_v060_runs(costs[1], [np.inf, 2.0, 8.0], n_requests=200, seed=0)
    at = runs.set_index("rate_req_s")
    assert at.loc[np.inf, "request_throughput"] > at.loc[8.0, "request_throughput"] > at.loc[2.0, "request_throughput"]
    for rate in (2.0, 8.0):  # far below saturation the server keeps up: completions track arrivals
        assert at.loc[rate, "request_throughput"] == pytest.approx(rate, rel=0.25)
    assert at.loc[np.inf, "mean_ttft_ms"] > at.loc[8.0, "mean_ttft_ms"]  # everyone queued at once waits
    assert (runs["prompt_tokens_mean"].round() == 202).all() and (runs["output_tokens_mean"].round() == 179).all()
    with pytest.raises(ValueError, match="lengths"):
        chapter.vllm_v060_runs(costs[1], [1.0], n_requests=5, lengths="mine")


def test_published_comparison_ratios():
    runs = pd.DataFrame({"rate_req_s": [np.inf, 2.0, 16.0, 32.0, 64.0], "request_throughput": [73.8, 2, 16, 30, 40],
                         "mean_tpot_ms": [30.0, 7.0, 8.0, 6.7, 50.0], "mean_ttft_ms": [900.0, 10.0, 30.0, 24.0, 500.0]})
    table = chapter.published_comparison(runs).set_index("figure")
    assert table["predicted"].tolist() == [73.8, 6.7, 30.0]  # TTFT: the highest within 2..32 QPS, not at 64
    np.testing.assert_allclose(table["ratio"], [2.0, 0.5, 0.25])


@pytest.fixture(scope="module")
def sample():
    rows = []
    for name, scale in (("set_a", 1.0), ("set_b", 100.0)):
        for stage, bias in (("before", 0.5), ("after", 1.1)):
            measured = scale * np.array([0.01, 0.1, 1.0])
            rows.append(pd.DataFrame({"case_id": [0, 1, 2], "set": name, "group": ["fit", "ridge", "held out"],
                                      "stage": stage, "case": ["tokens 1", "tokens 10", "tokens 100"],
                                      "measured_ms": measured, "predicted_ms": measured * bias,
                                      "rel_err": abs(bias - 1.0)}))
    return pd.concat(rows, ignore_index=True)


def test_parity_frame_lines_span_each_set(sample):
    frame = chapter.parity_frame(sample, band=0.15)
    lines = frame[frame["kind"] != "case"]
    assert set(lines["kind"]) == {"y = x", "±15%"}
    assert len(lines) == 2 * 2 * 3 * 2  # sets x stages x lines x two ends
    diag = lines[lines["kind"] == "y = x"]
    assert (diag["measured_ms"] == diag["predicted_ms"]).all()
    b = frame[(frame["set"] == "set_b") & (frame["kind"] != "case")]
    assert b["measured_ms"].min() <= 0.5 and b["measured_ms"].max() >= 110  # covers predicted and measured
    assert set(frame["panel"]) == set(chapter.STAGE_LABELS.values()) and "stage" not in frame


def test_parity_frame_leaves_out_cases_predicted_at_zero(sample):
    zero = sample.copy()
    zero.loc[(zero["set"] == "set_a") & (zero["stage"] == "before"), "predicted_ms"] = 0.0
    frame = chapter.parity_frame(zero)
    assert (frame["predicted_ms"] > 0).all() and (frame["measured_ms"] > 0).all()  # drawable on log axes
    kept = frame[(frame["set"] == "set_a") & (frame["kind"] == "case")]
    assert set(kept["panel"]) == {chapter.STAGE_LABELS["after"]}


def test_parity_chart_spec(sample):
    spec = chapter.parity_chart(sample, value="set_b").to_dict()
    (param,) = spec["params"]
    assert param["name"] == "measured_set" and param["value"] == "set_b"
    assert param["bind"]["input"] == "select" and param["bind"]["options"] == ["set_a", "set_b"]
    assert spec["facet"]["column"]["field"] == "panel"
    assert spec["facet"]["column"]["sort"] == list(chapter.STAGE_LABELS.values())
    assert marks(spec) == {"circle", "line"}
    enc = [e for e in walk(spec, "encoding") if "x" in e]
    assert all(e["x"]["scale"]["type"] == "log" and e["y"]["scale"]["type"] == "log" for e in enc)
    assert {e["x"]["title"] for e in enc} == {"measured time"}  # each tick carries its unit (time_label)
    assert {e["y"]["title"] for e in enc} == {"predicted time"}
    filters = list(walk(spec, "filter"))
    assert all("measured_set" in f for f in filters if "datum.set" in f) and len(filters) >= 4
    points = next(e for e in enc if "color" in e)
    assert points["color"]["field"] == "group" and points["color"]["scale"]["domain"] == list(chapter.GROUP_COLORS)
    assert "title" not in spec


def test_parity_axes_label_decades_on_wide_sets_and_units_on_ticks(sample):
    spec = chapter.parity_chart(sample).to_dict()
    axes = [e[c]["axis"] for e in walk(spec, "encoding") for c in ("x", "y") if c in e]
    wide = chapter.wide_sets(chapter.parity_frame(sample))
    expr = chapter.time_label(f"indexof({json.dumps(wide)}, measured_set) >= 0")
    assert axes and all(a["labelExpr"] == expr and a["labelOverlap"] == "greedy" for a in axes)
    assert all(a["labelSeparation"] >= 4 for a in axes)  # the clash test wants 3 px between labels
    assert "' µs'" in expr and "' ms'" in expr and "' s'" in expr and ".0e" not in expr


def test_wide_sets_are_those_spanning_more_than_two_decades():
    frame = pd.DataFrame({"set": ["a", "a", "b", "b"], "measured_ms": [0.001, 0.2, 1.0, 5.0],
                          "predicted_ms": [0.002, 0.3, 1.2, 6.0]})
    assert chapter.wide_sets(frame) == ["a"]  # a spans 2.5 decades, b under one


def test_kernel_tooltips_read_microseconds_below_a_millisecond(sample):
    spec = chapter.parity_chart(sample).to_dict()
    calcs = {c["as"]: c["calculate"] for t in walk(spec, "transform") for c in t if "calculate" in c}
    assert calcs["predicted_text"] == chapter.kernel_time_text("predicted_ms")
    assert "' µs'" in calcs["predicted_text"] and viz.duration_text("predicted_ms") in calcs["predicted_text"]
    tips = [t for e in walk(spec, "encoding") for t in e.get("tooltip", [])]
    assert {t["field"] for t in tips} >= {"measured_text", "predicted_text"} and all(t.get("title") for t in tips)


def test_published_chart_spec():
    runs = pd.DataFrame({"rate_req_s": [np.inf, 2.0, 32.0] * 2, "lengths": ["blog"] * 3 + ["trace"] * 3,
                         "mean_ttft_ms": [900.0, 12, 16, 900.0, 13, 20], "mean_tpot_ms": [28.0, 7, 8.5, 28.0, 7, 9.7]})
    spec = chapter.published_chart(runs, chapter.PUBLISHED_VLLM_V060).to_dict()
    assert len(spec["hconcat"]) == 2
    assert {"line", "point", "text"} <= marks(spec)
    ys = [layer["encoding"]["y"]["field"] for panel in spec["hconcat"] for layer in panel["layer"]]
    assert set(ys) == {"mean_ttft_ms", "mean_tpot_ms"}
    xs = {layer["encoding"]["x"]["field"] for panel in spec["hconcat"] for layer in panel["layer"]}
    assert xs == {"rate_req_s"}
    datasets = spec["datasets"].values()
    assert not any(np.isinf(row.get("rate_req_s", 0)) for data in datasets for row in data)  # no offline run drawn
    assert any(row.get("mean_tpot_ms") == 13.4 and row.get("rate_req_s") == 32.0 for data in datasets for row in data)
    legend = next(e["color"] for e in walk(spec, "encoding") if "color" in e)
    assert "202" in legend["legend"]["labelExpr"]  # the blog's means, from the published figures


def test_e2e_headline_and_parity_frame_read_the_replay():
    e2e = bl.validate.replay_all(bl.validate.calibration_runs().iloc[::20])
    errors = bl.validate.error_summary(e2e)
    head = chapter.e2e_headline(e2e, errors)
    overall = errors[errors["set"] == "all"].set_index("metric")
    for metric in ("ttft", "tpot", "e2e"):
        assert head[f"e2e_med_{metric}"] == overall.loc[metric, "median_abs_error"]
    assert head["e2e_runs"] == overall.loc["ttft", "runs"]
    per_run = e2e.drop_duplicates("run_id")  # every run is counted once: scored, or named as overloaded
    assert head["e2e_measured"] == len(per_run) == head["e2e_runs"] + head["e2e_overloaded"]
    assert head["e2e_open"] + head["e2e_closed"] == head["e2e_measured"]
    frame = chapter.e2e_parity_frame(e2e, band=0.15)
    lines = frame[frame["kind"] != "run"]
    assert len(lines) == 3 * 3 * 2  # y = x and the two band lines, two points each, per metric panel
    upper = lines[lines["line"] == "±15% 1.15"]
    np.testing.assert_allclose(upper["predicted"], 1.15 * upper["measured"], rtol=1e-3)  # 4 digits kept


def test_error_table_is_narrow_with_units(frames):
    _, errors = frames
    table = chapter.error_table(errors).data
    assert table.columns.tolist() == ["measured set", "cases", "median, starting (%)", "median, calibrated (%)",
                                      "worst, calibrated (%)"]
    np.testing.assert_allclose(table["median, calibrated (%)"], errors["median_rel_err_after"] * 100)
    marked = table["measured set"].str.endswith(" (diagnostic)")
    assert (marked == errors["diagnostic"]).all() and marked.any()
    assert set(errors["set"]) <= set(chapter.SET_NAMES)  # every set has a name a reader can read
    assert not table["measured set"].str.contains("_").any()


def test_efficiency_and_case_tables_name_what_they_show(frames, costs):
    table = chapter.efficiency_table(*costs).data.set_index("quantity")
    assert table.loc["GPU's kernel floors per step (ms)", "starting"] == "1"  # 1 ms, shown in ms
    assert table.loc["elementwise share of HBM bandwidth", "starting"] == "none"
    assert not any("_" in name for name in table.index)
    cases, _ = frames
    counts = chapter.case_counts(cases).data.set_index("measured set")
    assert counts.columns.tolist() == ["fit", "ridge", "held out"]
    assert counts.to_numpy().sum() == (cases["stage"] == "after").sum()
    assert counts.loc["all-reduce (NCCL)"].sum() == ((cases["stage"] == "after") & (cases["set"] == "allreduce")).sum()


def test_e2e_ablation_and_comparison_tables_read_in_percent(frames):
    errors = pd.DataFrame({"set": ["all"], "metric": ["ttft"], "runs": [206], "median_abs_error": [0.197],
                           "worst_abs_error": [3.72], "median_error": [-0.029], "worst_run_id": ["x"]})
    html = chapter.e2e_error_table(errors).to_html()
    assert "19.7%" in html and "372.0%" in html and "-2.9%" in html and "TTFT" in html and "worst_run" not in html
    ablations = pd.DataFrame({"mechanism": ["none", "none", "none", "async scheduling", "async scheduling",
                                            "async scheduling"], "metric": ["ttft", "tpot", "e2e"] * 2,
                              "median_abs_error": [0.197, 0.075, 0.066, 0.306, 0.068, 0.06]})
    shown = chapter.ablation_style(ablations)
    assert shown.data["switched off"].tolist() == ["nothing (the full model)", "async scheduling"]
    assert "30.6%" in shown.to_html()
    compare = pd.DataFrame({"figure": ["f"], "condition": ["c"], "published": [36.9], "predicted": [55.3],
                            "ratio": [55.3 / 36.9]})
    assert "1.50" in chapter.comparison_style(compare).to_html()


def test_runs_table_reads_an_infinite_rate_as_all_at_once():
    runs = pd.DataFrame({"lengths": ["blog", "blog"], "rate_req_s": [np.inf, 2.0], "request_throughput": [20.0, 2.0],
                         "mean_ttft_ms": [900.0, 30.0], "mean_tpot_ms": [40.0, 8.0], "preemptions": [0, 0]})
    table = chapter.runs_table(runs).data
    assert table["rate (req/s)"].tolist() == ["all at once", "2"]
    assert table.columns.tolist() == ["lengths", "rate (req/s)", "throughput (req/s)", "mean TTFT (ms)",
                                      "mean TPOT (ms)", "preemptions"]


def test_kernel_headline_is_what_the_page_glues(frames, costs):
    cases, errors = frames
    err = errors.set_index("set")
    numbers, held = chapter.kernel_headline(err, costs[1], cases)
    text = (DATA_DIR.parent / "notebooks" / "13_validation.ipynb").read_text()
    assert all(f"`{name}" in text for name in numbers)  # every number is quoted on the page, none left over
    assert numbers["eta_c_bf16"] == costs[1].eta_compute and numbers["eta_elem"] == costs[1].eta_elementwise
    assert numbers["elem_diag"] == err.loc[calibrate.DIAGNOSTIC_SETS["llmservingsim_elementwise"],
                                           "median_rel_err_after"]
    assert 0 < numbers["elem_share_lo"] <= numbers["elem_share_hi"] < 1 and numbers["longest_tokens"] % 1 == 0
    after = cases[(cases["stage"] == "after") & (cases["group"] == "held out")]
    assert held["llmservingsim_attn"] == after.loc[after["set"] == "llmservingsim_attn", "rel_err"].median()


# -- words on the page: cases, runs, axes --------------------------------------------------------------------------
def test_case_text_names_each_set_in_words():
    assert chapter.case_text({"set": "vidur_gemm", "model": "Llama-2-7b-hf", "tp": 2.0, "tokens": 4096.0}) == \
        "Llama-2-7B, TP 2: one layer's four GEMMs, 4,096 tokens"
    assert chapter.case_text({"set": "decode_attn", "geometry": "32-8-128", "tp": 1.0, "batch": 64.0,
                              "kv_len": 2048.0}) == \
        "decode attention, 32 query and 8 KV heads of 128: 64 sequences at 2,048 cached tokens"
    assert chapter.case_text({"set": "llmservingsim_attn_vllm_eta", "op": "attn", "tokens": 1.0}) == \
        "Llama-3.1-8B, eager: attention, 1 token"
    assert chapter.case_text({"set": "allreduce", "workers": 4.0, "size_bytes": 2 * 2**20}) == \
        "all-reduce of 2 MiB over 4 GPUs"
    assert chapter.case_text({"set": "gemm_kernels_fp8_bf16_eta", "m": 8.0, "k": 2048.0, "n": 6144.0}) == \
        "FP8 GEMM: 8 tokens through a 2,048 × 6,144 weight"


def test_parity_sample_cases_carry_no_code_names(frames):
    sample = chapter.parity_sample(frames[0], per_set=5)
    assert not sample["case"].str.contains(r"[a-z]+_[a-z]+|\bnan\b").any(), sample["case"].head()
    assert sample.groupby("set")["case"].nunique().min() >= 1


def test_run_text_reads_a_run_in_words():
    runs = bl.validate.calibration_runs().set_index("run_id")
    open_loop = runs[runs["set"] == "inference-perf"].iloc[0]
    assert chapter.run_text(open_loop) == "Llama-2-7B BF16 on one H100 SXM, 6 req/s open loop (roleplay prompts)"
    ix = runs[runs["client"] == "inferencex"].iloc[0]
    text = chapter.run_text(ix)
    assert text.startswith("Llama-3.1-70B FP8 on ") and "H100 SXMs" in text and "InferenceX's client" in text
    assert f"{int(ix['isl']):,}-token prompts" in text and "_" not in text


def test_log_axis_labels_carry_thousands_separators():
    assert "format(datum.value, ',~g')" in chapter.LOG_LABEL and "'~g'" not in chapter.LOG_LABEL


def test_e2e_parity_frame_reads_every_metric_in_ms():
    table = bl.validate.replay_all(bl.validate.calibration_runs().iloc[:3])
    frame = chapter.e2e_parity_frame(table)
    runs = frame[frame["kind"] == "run"].reset_index(drop=True)
    used = table[table["status"] == "ok"].reset_index(drop=True)
    np.testing.assert_allclose(runs["measured"], used["measured_ms"], rtol=1e-3)  # the ticks say ms or s
    assert set(runs["source"]) <= set(chapter.SET_COLORS) and "run_id" not in frame
    assert frame.loc[frame["metric"] == "e2e", "panel"].unique().tolist() == ["end-to-end latency"]


def test_e2e_chart_tooltips_are_words_with_units():
    table = bl.validate.replay_all(bl.validate.calibration_runs().iloc[:3])
    spec = chapter.e2e_parity_chart(table).to_dict()
    tips = [t for e in walk(spec, "encoding") for t in e.get("tooltip", [])]
    assert tips and all(t.get("title") for t in tips)
    assert {t["field"] for t in tips} == {"run", "panel", "measured_text", "predicted_text", "rel_error"}
    frame = chapter.e2e_parity_frame(table)
    runs = frame[frame["kind"] == "run"]
    assert list(runs["measured_text"]) == [viz.format_duration(v) for v in runs["measured"]]  # the book's rule
    assert (runs.loc[runs["metric"] == "e2e", "predicted_text"].str.endswith(" s")).all()
    axes = [e[c]["axis"]["labelExpr"] for e in walk(spec, "encoding") for c in ("x", "y") if c in e]
    assert axes and all(a == chapter.time_label() for a in axes)


# -- the book's setup beside the closest measured runs -------------------------------------------------------------
@pytest.fixture(scope="module")
def closest():
    close = chapter.closest_runs()
    served = bl.validate.replay_all(close)
    return close, chapter.setup_frame(served, chapter.book_setup_replay(close))


def test_closest_runs_share_the_books_gpu_tp_and_weights(closest):
    close, _ = closest
    book = chapter.book_setup()
    assert len(close) == 4 and (close["model"] == "llama-2-7b").all()
    assert (close["hardware"] == book["hardware"]).all() and (close["tp"] == 1).all()
    assert (close["dtype"] == book["dtype"]).all()
    # No run outside the selection has all three and a 7B-class model: the selection is complete.
    runs = bl.validate.calibration_runs()
    params = runs["model"].map(lambda m: bl.get_model(m).params)
    same = (runs["hardware"] == "h100-sxm") & (runs["tp"] == 1) & (runs["dtype"] == "bf16") & params.between(6e9, 1e10)
    assert set(runs.loc[same, "run_id"]) == set(close["run_id"])
    assert (close["max_num_seqs"] == 128).all() and (close["max_num_batched_tokens"] == 2048).all()  # as recorded
    assert (close["kv_kib_per_token"] == 512).all() and book["kv_kib_per_token"] == 128  # no GQA against GQA


def test_book_setup_is_the_scene_with_vllms_defaults():
    book = chapter.book_setup()
    assert (book["model"], book["hardware"], book["tp"], book["dtype"]) == ("llama-3-8b", "h100-sxm", 1, "bf16")
    assert (book["max_num_seqs"], book["max_num_batched_tokens"]) == (1024, 8192)


def test_setup_frame_pairs_served_and_book_predictions(closest):
    close, frame = closest
    assert len(frame) == 3 * len(close) and set(frame["metric"]) == {"ttft", "tpot", "e2e"}
    ok = frame[frame["status"] == "ok"]
    np.testing.assert_allclose(ok["rel_error"], ok["predicted_ms"] / ok["measured_ms"] - 1)
    assert frame.loc[frame["status"] != "ok", "rel_error"].isna().all()  # an overloaded run is not scored
    # The book's setup decodes the same traffic faster: four times less KV per token, eight times the seats.
    tpot = frame[frame["metric"] == "tpot"]
    assert (tpot["book_ms"] < tpot["predicted_ms"]).all()
    assert (ok["hit_rate"] > 0.9).all()  # shared prefixes: nearly every prompt token cached


def test_setup_headline_reads_the_frame(closest):
    close, frame = closest
    head = chapter.setup_headline(frame, close)
    ok = frame[frame["status"] == "ok"]
    for metric in ("ttft", "tpot", "e2e"):
        assert head[f"close_worst_{metric}"] == ok.loc[ok["metric"] == metric, "rel_error"].abs().max()
    assert head["close_busy_rate"] == 20.0 and head["close_ok"] == 3 and head["close_runs"] == 4
    assert head["close_light_worst"] < abs(head["close_busy_tpot"])  # the busiest stage is the worst
    assert head["book_busy_tpot_ms"] < head["close_busy_tpot_ms"]


def test_setup_tables_show_the_book_beside_the_runs(closest):
    close, frame = closest
    table = chapter.setup_table(close, 0.967, "the book's traffic").data
    assert table.columns.tolist() == ["", "the book's setup", "the 4 closest measured runs"]
    row = table.set_index("")
    assert row.loc["max_num_seqs", "the 4 closest measured runs"] == "128"
    assert row.loc["KV cache per token", "the book's setup"] == "128 KiB"
    assert "97%" in row.loc["prompts", "the 4 closest measured runs"]
    assert row.loc["load", "the 4 closest measured runs"] == "4, 6, 8 and 20 req/s"
    errors = chapter.setup_error_table(frame, close).data
    assert len(errors) == len(frame) and (errors["error"] == "–").sum() == 3  # the overloaded stage, unscored
    assert set(errors["mean of"]) == {"TTFT", "TPOT", "E2E latency"}
    assert errors["measured"].str.endswith((" ms", " s")).all()  # every time says its unit
    late = errors[(errors["error"] == "–") & (errors["mean of"] == "TTFT")]
    assert late["measured"].str.endswith(" s").all()  # the overloaded stage's 107-second TTFT reads in seconds


def test_setup_error_table_reads_durations_by_the_book_rule(closest):
    """Every time in the table is batchlab.viz.format_duration of its ms: "27.1 ms", "2.07 s", "107 s"."""
    close, frame = closest
    errors = chapter.setup_error_table(frame, close).data
    want = [viz.format_duration(v) for v in frame["measured_ms"]]
    assert errors["measured"].tolist() == want
    assert errors["predicted, as served"].tolist() == [viz.format_duration(v) for v in frame["predicted_ms"]]
    assert any(t.endswith(" ms") for t in want) and any(t.endswith(" s") for t in want)
    assert not any("," in t.split(" ")[0] and t.endswith(" ms") for t in want)  # never "9,999.0 ms"


def test_overloaded_runs_are_named_as_a_reader_reads_them():
    runs = bl.validate.calibration_runs()
    late = runs[runs["run_id"].str.contains("reasoning")].assign(status="overloaded")
    assert chapter.overloaded_names(late) == \
        "the 4 req/s stages of Llama-2-7B, Llama-2-70B and CodeLlama-34B's reasoning runs"
    mixed = pd.concat([late.iloc[:1], runs[runs["set"] == "aiconfigurator"].iloc[:1].assign(status="overloaded")])
    named = chapter.overloaded_names(mixed)  # rates or sets differ: each run in words
    assert named == " and ".join(chapter.run_text(r) for _, r in mixed.iterrows())
    assert chapter.overloaded_names(late.assign(status="ok")) == "none"


def test_ttft_misses_names_each_subset_over_the_target():
    head = {"e2e_ip_ttft": 0.034, "e2e_ac_ttft": 0.155, "e2e_ttft_70b": 0.12, "e2e_ttft_qwen": 0.367}
    assert chapter.ttft_misses(head, 0.15) == \
        "; by set and model, TTFT misses it on the closed-loop sweeps (15.5%) and on Qwen3-32B (36.7%)"
    assert chapter.ttft_misses({**head, "e2e_ac_ttft": 0.15, "e2e_ttft_qwen": 0.1}, 0.15) == \
        "; no set or model misses it on TTFT"


def test_within_sentence_follows_the_numbers():
    target = 0.15
    assert chapter.within_sentence({"ttft": 0.138, "tpot": 0.07, "e2e": 0.06}, target) == \
        "token times, end-to-end latencies and times to first token all land within 15% in the median"
    assert chapter.within_sentence({"ttft": 0.16, "tpot": 0.07, "e2e": 0.06}, target) == \
        "token times and end-to-end latencies land within 15% in the median, times to first token not yet"
    worse = chapter.within_sentence({"ttft": 0.2, "tpot": 0.2, "e2e": 0.2}, target)
    assert worse.endswith("all miss 15% in the median")
    assert "not yet" not in chapter.within_sentence({"ttft": 0.15, "tpot": 0.15, "e2e": 0.15}, target)  # at: within


def test_prefill_share_needed_closed_form():
    run = pd.Series({"model": "llama-3.1-8b", "hardware": "h200", "dtype": "fp8", "tp": 2, "isl": 2000,
                     "concurrency": 96, "e2e_ms": 1000.0, "set": "aiconfigurator"})
    m = bl.get_model("llama-3.1-8b")
    flop = 2 * m.body_params * 2000 + 2 * m.layers * m.attn_dim * 2000**2 + 2 * m.vocab * m.d_model
    expected = 96 * flop / (1.0 * 2 * bl.get_hardware("h200").flops_fp8)
    assert chapter.prefill_share_needed(run) == pytest.approx(expected, rel=1e-9)
    assert chapter.prefill_share_needed(run.replace(1000.0, 2000.0)) == pytest.approx(expected / 2, rel=1e-9)
