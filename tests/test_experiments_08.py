"""Notebook 08's experiment functions: the tolerant frontier against exact Pareto dominance, the plateau and
default-vs-best readings on hand-worked frames, vLLM's defaults per GPU, and the sweep's invariants."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab import experiments as ex

X, Y = "output_throughput", "p99_ttft_ms"


def frame(points, **cols):
    return pd.DataFrame({X: [p[0] for p in points], Y: [p[1] for p in points], **cols})


@pytest.mark.parametrize("seed", range(5))
def test_zero_tolerance_is_exact_pareto(seed):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({X: rng.random(120), Y: rng.random(120)})
    mask = ex.tolerant_front(df, rel_tol=0.0)
    np.testing.assert_array_equal(mask, ~bl.is_dominated(df, X, Y))
    assert set(df.index[mask]) == set(bl.pareto_front(df, X, Y).index)


@pytest.mark.parametrize("seed", range(5))
def test_tolerant_front_keeps_only_exactly_non_dominated_rows(seed):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({X: np.repeat(rng.random(30), 4) * (1 + rng.random(120) * 0.005), Y: rng.random(120)})
    mask = ex.tolerant_front(df, rel_tol=0.01)
    assert mask.any()
    assert not bl.is_dominated(df, X, Y)[mask].any()
    assert mask.sum() <= (~bl.is_dominated(df, X, Y)).sum()  # a subset of the exact front
    assert df.loc[mask, Y].min() == df[Y].min()  # the lowest latency always survives


def test_tolerance_drops_a_row_ahead_only_by_noise():
    df = frame([(1000.0, 300.0), (1000.5, 360.0), (2000.0, 500.0), (1500.0, 800.0)])
    assert ex.tolerant_front(df, rel_tol=0.0).tolist() == [True, True, True, False]
    assert ex.tolerant_front(df, rel_tol=0.01).tolist() == [True, False, True, False]


def test_identical_rows_keep_the_first_only():
    df = frame([(10.0, 5.0), (10.0, 5.0), (20.0, 9.0)])
    assert ex.tolerant_front(df).tolist() == [True, False, True]
    with pytest.raises(ValueError, match="rel_tol"):
        ex.tolerant_front(df, rel_tol=1.0)


def test_refused_rows_neither_join_nor_hide_the_frontier():
    df = frame([(100.0, 50.0), (110.0, 40.0), (90.0, 60.0)], vllm_refuses=[False, True, False])
    out = ex.with_frontier(df, rel_tol=0.0)
    assert out["frontier"].tolist() == [True, False, False]  # row 1 would dominate row 0 if it counted


def test_seqs_plateau_closed_form():
    seqs = [8, 16, 32, 64]
    df = pd.DataFrame({"rate": 1.0, "max_num_batched_tokens": [512] * 4 + [2048] * 4, "max_num_seqs": seqs * 2,
                       Y: [900.0, 400.0, 104.0, 100.0] + [500.0, 300.0, 200.0, 210.0]})
    out = ex.seqs_plateau(df, tol=0.05).set_index("max_num_batched_tokens")
    assert out.loc[512, "max_num_seqs"] == 32 and out.loc[512, f"best_{Y}"] == 100.0
    assert out.loc[2048, "max_num_seqs"] == 32  # non-monotone: the best is at 32, 64 is worse
    assert ex.seqs_plateau(df, tol=0.0).set_index("max_num_batched_tokens").loc[512, "max_num_seqs"] == 64


def test_default_vs_best_picks_the_lowest_latency_at_the_same_throughput():
    rows = [(1024, 8192, 1000.0, 400.0, 200.0), (256, 4096, 999.0, 350.0, 100.0), (128, 2048, 980.0, 300.0, 50.0),
            (1024, 512, 1001.0, 10.0, 10.0)]  # the last is refused by vLLM and must be ignored
    df = pd.DataFrame(rows, columns=["max_num_seqs", "max_num_batched_tokens", X, Y, "p99_itl_ms"]).assign(rate=5.0)
    df["vllm_refuses"] = df["max_num_batched_tokens"] < df["max_num_seqs"]
    out = ex.default_vs_best(df, {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}, rel_tol=0.01).iloc[0]
    assert (out["best_max_num_seqs"], out["best_max_num_batched_tokens"]) == (256, 4096)  # 980 is 2 % slower
    assert out[f"default_{Y}"] == 400.0 and out[f"best_{Y}"] == 350.0 and out["best_p99_itl_ms"] == 100.0
    wide = ex.default_vs_best(df, {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}, rel_tol=0.05).iloc[0]
    assert wide["best_max_num_seqs"] == 128


def test_vllm_defaults_follow_the_gpu():
    table = ex.vllm_defaults_table(["h100-sxm", "h200", "a100-80gb", "h100-pcie"]).set_index("gpu")
    assert table.loc["h100-sxm", ["max_num_seqs", "max_num_batched_tokens_serve",
                                  "max_num_batched_tokens_offline"]].tolist() == [1024, 8192, 16384]
    assert table.loc["h200"].tolist()[1:] == table.loc["h100-sxm"].tolist()[1:]
    assert table.loc["a100-80gb"].tolist()[1:] == [256, 2048, 8192]  # 80 GiB, but an A100
    assert table.loc["a100-80gb", "hbm_gib"] == pytest.approx(80.0)
    assert table.loc["h100-pcie", "max_num_seqs"] == 1024  # 79.6 GiB >= 70


@pytest.fixture(scope="module")
def small_sweep(cost8b):
    return ex.two_knob_sweep(cost8b, "azure-conv-2023", [4.0, 40.0], [4, 64, 1024], [512, 2048],
                             n_requests=150, seed=1)


def test_two_knob_sweep_layout_and_invariants(small_sweep):
    df = small_sweep
    assert len(df) == 12 and df["rate"].tolist() == [4.0] * 6 + [40.0] * 6
    assert df["vllm_refuses"].tolist() == [False, False, False, False, True, False] * 2
    assert df["total_output_tokens"].nunique() == 1 and (df["rejected"] == 0).all()  # same lengths at every rate
    at = df.set_index(["rate", "max_num_seqs", "max_num_batched_tokens"])
    assert at.loc[(40.0, 4, 2048), Y] > at.loc[(40.0, 64, 2048), Y]  # a cap of 4 queues an overload
    assert at.loc[(40.0, 4, 2048), X] < at.loc[(40.0, 64, 2048), X]
    assert at.loc[(4.0, 64, 2048), Y] < at.loc[(40.0, 64, 2048), Y]  # more load, longer queues


def test_two_knob_sweep_is_the_same_on_an_executor(cost8b, small_sweep):
    with ThreadPoolExecutor(2) as pool:
        pooled = ex.two_knob_sweep(cost8b, "azure-conv-2023", [4.0, 40.0], [4, 64, 1024], [512, 2048],
                                   n_requests=150, seed=1, executor=pool)
    pd.testing.assert_frame_equal(small_sweep, pooled)


def test_saturation_rate_is_the_queued_run_throughput(cost8b):
    cap = ex.saturation_rate(cost8b, "azure-conv-2023", 300, seed=2)
    res = bl.simulate(bl.preset("azure-conv-2023", 300, rate_req_s=np.inf, seed=2), "chunked", cost8b)
    assert cap == pytest.approx(300 / res.requests["finish_s"].max())
    assert ex.saturation_rate(cost8b, "azure-conv-2023", 300, seed=2, max_num_seqs=8) < cap / 2
