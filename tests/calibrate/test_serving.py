"""The whole-server fit (batchlab.calibrate.serving): physical terms, shipped as CostModel defaults, and the
shipped end-to-end error table is what replaying every calibration run with those defaults gives."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab import calibrate, validate
from batchlab._data import DATA_DIR
from batchlab.calibrate import serving, shipped

TARGET = 0.15


@pytest.fixture(scope="module")
def terms():
    return shipped.shipped_serving_terms()


@pytest.fixture(scope="module")
def replayed():
    return validate.replay_all()


def test_terms_are_physical_and_global(terms):
    assert set(terms) == set(serving.SERVING_TERMS)
    assert 1e-3 <= terms["request_latency_s"] <= 50e-3  # s per request: HTTP, the hop to the engine, streaming
    assert 0 < terms["frontend_s_per_token"] <= 20e-6  # s per prompt token: tokenising, one request at a time
    assert 0 < terms["cpu_step_s"] <= 5e-3 and 0 < terms["cpu_seq_s"] <= 100e-6
    assert 0 < terms["cpu_hidden_fraction"] < 1
    assert 0.3 < terms["eta_compute_fp8"] <= 1 and 0.3 < terms["eta_memory_fp8"] <= 1
    kernels_only = pd.read_csv(DATA_DIR / "calibration.csv").set_index("name")["value"]
    # vLLM's own NVLink all-reduce for a step's activations is faster than NCCL's microbenchmark.
    assert 0 < terms["allreduce_latency_s"] < kernels_only["allreduce_latency_s_kernels_only"]
    # FP8 GEMMs in whole servers stream weights faster than the small benchmarked GEMMs suggested.
    assert terms["eta_memory_fp8"] > kernels_only["eta_memory_fp8_kernels_only"]


def test_terms_are_the_cost_model_defaults(terms, h100):
    for dtype in ("bf16", "fp8"):
        cost = bl.CostModel(h100, bl.get_model("llama-3.1-70b"), dtype=dtype, tp=4)
        for name in ("request_latency_s", "frontend_s_per_token", "cpu_step_s", "cpu_seq_s", "cpu_hidden_fraction",
                     "allreduce_latency_s"):
            assert getattr(cost, name) == terms[name]
    fp8 = bl.CostModel(h100, bl.get_model("llama-3.1-70b"), dtype="fp8")
    assert (fp8.eta_compute, fp8.eta_memory) == (terms["eta_compute_fp8"], terms["eta_memory_fp8"])


def test_fp8_gemm_set_still_within_target(terms):
    assert serving.kernel_error(terms) <= TARGET


def test_shipped_e2e_errors_are_the_replay(replayed):
    shipped_errors = pd.read_csv(DATA_DIR / shipped.E2E_ERRORS_FILE)
    now = validate.error_summary(replayed)
    pd.testing.assert_frame_equal(now.round(4).reset_index(drop=True), shipped_errors, check_dtype=False)


def test_fit_beats_its_start_and_every_mechanism_helps(terms):
    runs = serving.fit_runs()
    assert serving.objective(terms, runs) < serving.objective(serving.START, runs)
    no_serving = dict(terms, request_latency_s=1e-9, frontend_s_per_token=1e-12, cpu_step_s=1e-9, cpu_seq_s=1e-12)
    assert serving.objective(terms, runs) < serving.objective(no_serving, runs)


def test_end_to_end_medians(replayed):
    """Issue 11: median |error| of TPOT and E2E within 15 % over every usable run. TTFT misses the target (about
    21 %: the closed-loop sweeps; notebook 10 names the cause); this bound catches it getting worse."""
    overall = validate.error_summary(replayed).query("set == 'all'").set_index("metric")["median_abs_error"]
    assert overall["tpot"] <= TARGET and overall["e2e"] <= TARGET
    assert overall["ttft"] <= 0.25
    per_run = replayed.drop_duplicates("run_id")
    assert per_run.loc[per_run["status"] == "overloaded", "overloaded"].all()
    assert not per_run.loc[per_run["status"] == "ok", "overloaded"].any()
    assert np.isfinite(replayed["predicted_ms"]).all()
    assert calibrate.shipped_serving_terms() == shipped.shipped_serving_terms()
