"""Notebook 10's experiments: the validation frames agree with the shipped calibration, the sampler keeps what a
parity chart needs, and the end-to-end runs behave like a server (closed forms on hand-made frames, invariants)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab import calibrate, experiments
from batchlab._data import DATA_DIR


@pytest.fixture(scope="module")
def costs():
    after = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))
    return after.replace(**calibrate.START), after


@pytest.fixture(scope="module")
def frames(measured, costs):
    return experiments.validation_frames(*costs, root=measured)


def test_shipped_floors_are_the_csv_rows():
    rows = pd.read_csv(DATA_DIR / "calibration.csv").set_index("name")["value"]
    floors = experiments.shipped_floors()
    assert floors.gemm_s == rows["kernel_floor_gemm_s"] and floors.prefill_attn_s == rows["kernel_floor_prefill_attn_s"]
    assert all(0 < v < 1e-4 for v in floors)  # microseconds per kernel, not milliseconds


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


def test_parity_sample_keeps_each_panels_worst_and_pairs(frames):
    cases, _ = frames
    sample = experiments.parity_sample(cases, per_set=20)
    for name, per in sample.groupby("set"):
        ids = per.groupby("stage")["case_id"].apply(set)
        assert ids["before"] == ids["after"] and len(ids["after"]) <= 22
        full = cases[cases["set"] == name]
        for stage in ("before", "after"):
            assert per.loc[per["stage"] == stage, "rel_err"].max() == full.loc[full["stage"] == stage, "rel_err"].max()
    np.testing.assert_allclose(sample["measured_ms"], cases.set_index(["case_id", "stage"]).loc[
        list(zip(sample["case_id"], sample["stage"])), "measured_s"].to_numpy() * 1e3)
    assert sample["case"].str.len().min() > 0


def test_llmservingsim_forward_parts(measured, costs):
    out = experiments.llmservingsim_forward(costs[1], measured)
    assert len(out) == 2048
    assert ((out["measured_elementwise_s"] > 0) & (out["measured_elementwise_s"] < out["measured_s"])).all()
    np.testing.assert_allclose(out["predicted_s"].iloc[[0, -1]],
                               [costs[1].prefill_time(int(t)) for t in out["tokens"].iloc[[0, -1]]])
    # The elementwise term is exactly the difference between the model with and without it.
    np.testing.assert_allclose(out["predicted_s"] - out["predicted_without_elementwise_s"],
                               out["predicted_elementwise_s"], rtol=1e-9, atol=1e-12)
    # Eager PyTorch's elementwise kernels are slower than the fused ones the model charges for.
    assert (out["measured_elementwise_s"] > out["predicted_elementwise_s"]).all()


def test_shipped_own_kernels_are_the_csv_rows():
    rows = pd.read_csv(DATA_DIR / "calibration.csv").set_index("name")["value"]
    own = experiments.shipped_own_kernels()
    assert own.eager_eta_attn == rows["eager_eta_attn"] and own.eta_compute_fp8 == rows["eta_compute_fp8"]


def test_match_means_hits_the_targets_and_keeps_arrivals():
    stream = bl.preset("sharegpt", 2000, rate_req_s=5.0, seed=1)
    matched = experiments.match_means(stream, 202.0, 179.0)
    assert abs(matched.prompt_tokens.mean() - 202.0) < 0.5 and abs(matched.output_tokens.mean() - 179.0) < 0.5
    assert (matched.arrival_s == stream.arrival_s).all() and matched.prompt_tokens.min() >= 1
    cv = lambda a: a.std() / a.mean()  # noqa: E731
    assert cv(matched.output_tokens) == pytest.approx(cv(stream.output_tokens), rel=0.02)  # same shape


def test_vllm_v060_runs_behave_like_a_server(costs):
    runs = experiments.vllm_v060_runs(costs[1], [np.inf, 2.0, 8.0], n_requests=200, seed=0)
    at = runs.set_index("rate")
    assert at.loc[np.inf, "request_throughput"] > at.loc[8.0, "request_throughput"] > at.loc[2.0, "request_throughput"]
    for rate in (2.0, 8.0):  # far below saturation the server keeps up: completions track arrivals
        assert at.loc[rate, "request_throughput"] == pytest.approx(rate, rel=0.25)
    assert at.loc[np.inf, "mean_ttft_ms"] > at.loc[8.0, "mean_ttft_ms"]  # everyone queued at once waits
    assert (runs["prompt_tokens_mean"].round() == 202).all() and (runs["output_tokens_mean"].round() == 179).all()
    with pytest.raises(ValueError, match="lengths"):
        experiments.vllm_v060_runs(costs[1], [1.0], n_requests=5, lengths="mine")


def test_published_comparison_ratios():
    runs = pd.DataFrame({"rate": [np.inf, 2.0, 16.0, 32.0, 64.0], "request_throughput": [73.8, 2, 16, 30, 40],
                         "mean_tpot_ms": [30.0, 7.0, 8.0, 6.7, 50.0], "mean_ttft_ms": [900.0, 10.0, 30.0, 24.0, 500.0]})
    table = experiments.published_comparison(runs).set_index("figure")
    assert table["predicted"].tolist() == [73.8, 6.7, 30.0]  # TTFT: the highest within 2..32 QPS, not at 64
    np.testing.assert_allclose(table["ratio"], [2.0, 0.5, 0.25])
