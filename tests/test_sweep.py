"""Sweeps give identical tables serially, on a process pool and on a Dask cluster; Pareto fronts; the tolerant
frontier against exact Pareto dominance, and the plateau and default-vs-best readings on hand-worked frames."""
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab.sweep import default_vs_best, seqs_plateau, tolerant_front, with_frontier

GRID = {"max_num_seqs": [4, 32, 128], "max_num_batched_tokens": [256, 2048]}


@pytest.fixture(scope="module")
def stream():
    return bl.synthetic(300, 800, 120, prompt_cv=1.0, output_cv=1.0, rate_req_s=20.0, seed=5)


def test_serial_process_pool_and_dask_agree(stream, cost8b):
    serial = bl.sweep(stream, GRID, cost8b, progress=False)
    with ProcessPoolExecutor(2) as pool:
        pooled = bl.sweep(stream, GRID, cost8b, executor=pool, progress=False)
    from dask.distributed import Client, LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        dasked = bl.sweep(stream, GRID, cost8b, executor=client.get_executor(), progress=False)
    assert len(serial) == 6
    pd.testing.assert_frame_equal(serial, pooled)
    pd.testing.assert_frame_equal(serial, dasked)
    assert serial["p99_ttft_ms"].nunique() > 1  # the knobs matter, so agreement is not trivial


def test_grid_order_and_fixed_knobs(stream, cost8b):
    df = bl.sweep(stream.head(50), GRID, cost8b, progress=False, block_size=16)
    assert df[["max_num_seqs", "max_num_batched_tokens"]].values.tolist() == [
        [4, 256], [4, 2048], [32, 256], [32, 2048], [128, 256], [128, 2048]]
    assert (df.block_size == 16).all() and (df.policy == "chunked").all()
    with pytest.raises(ValueError, match="both in the grid and fixed"):
        bl.sweep(stream, GRID, cost8b, max_num_seqs=8)
    with pytest.raises(ValueError, match="non-empty list"):
        bl.sweep(stream, {"max_num_seqs": []}, cost8b)


def test_pareto_front_is_non_dominated():
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"thr": rng.random(200), "lat": rng.random(200)})
    front = bl.pareto_front(df, "thr", "lat")
    assert not bl.is_dominated(df, "thr", "lat")[front.index].any()
    rest = df.drop(front.index)
    assert bl.is_dominated(df, "thr", "lat")[rest.index].all()
    assert front.thr.is_monotonic_increasing and front.lat.is_monotonic_increasing
    assert front.thr.max() == df.thr.max()


# -- reading a two-knob sweep ---------------------------------------------------------------------------------
X, Y = "output_throughput", "p99_ttft_ms"


def frame(points, **cols):
    return pd.DataFrame({X: [p[0] for p in points], Y: [p[1] for p in points], **cols})


@pytest.mark.parametrize("seed", range(5))
def test_zero_tolerance_is_exact_pareto(seed):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({X: rng.random(120), Y: rng.random(120)})
    mask = tolerant_front(df, rel_tol=0.0)
    np.testing.assert_array_equal(mask, ~bl.is_dominated(df, X, Y))
    assert set(df.index[mask]) == set(bl.pareto_front(df, X, Y).index)


@pytest.mark.parametrize("seed", range(5))
def test_tolerant_front_keeps_only_exactly_non_dominated_rows(seed):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({X: np.repeat(rng.random(30), 4) * (1 + rng.random(120) * 0.005), Y: rng.random(120)})
    mask = tolerant_front(df, rel_tol=0.01)
    assert mask.any()
    assert not bl.is_dominated(df, X, Y)[mask].any()
    assert mask.sum() <= (~bl.is_dominated(df, X, Y)).sum()  # a subset of the exact front
    assert df.loc[mask, Y].min() == df[Y].min()  # the lowest latency always survives


def test_tolerance_drops_a_row_ahead_only_by_noise():
    df = frame([(1000.0, 300.0), (1000.5, 360.0), (2000.0, 500.0), (1500.0, 800.0)])
    assert tolerant_front(df, rel_tol=0.0).tolist() == [True, True, True, False]
    assert tolerant_front(df, rel_tol=0.01).tolist() == [True, False, True, False]


def test_identical_rows_keep_the_first_only():
    df = frame([(10.0, 5.0), (10.0, 5.0), (20.0, 9.0)])
    assert tolerant_front(df).tolist() == [True, False, True]
    with pytest.raises(ValueError, match="rel_tol"):
        tolerant_front(df, rel_tol=1.0)


def test_refused_rows_neither_join_nor_hide_the_frontier():
    df = frame([(100.0, 50.0), (110.0, 40.0), (90.0, 60.0)], vllm_refuses=[False, True, False])
    out = with_frontier(df, rel_tol=0.0)
    assert out["frontier"].tolist() == [True, False, False]  # row 1 would dominate row 0 if it counted


def test_seqs_plateau_closed_form():
    seqs = [8, 16, 32, 64]
    df = pd.DataFrame({"rate_req_s": 1.0, "max_num_batched_tokens": [512] * 4 + [2048] * 4, "max_num_seqs": seqs * 2,
                       Y: [900.0, 400.0, 104.0, 100.0] + [500.0, 300.0, 200.0, 210.0]})
    out = seqs_plateau(df, tol=0.05).set_index("max_num_batched_tokens")
    assert out.loc[512, "max_num_seqs"] == 32 and out.loc[512, f"best_{Y}"] == 100.0
    assert out.loc[2048, "max_num_seqs"] == 32  # non-monotone: the best is at 32, 64 is worse
    assert (out["rate_req_s"] == 1.0).all()
    assert seqs_plateau(df, tol=0.0).set_index("max_num_batched_tokens").loc[512, "max_num_seqs"] == 64


def test_default_vs_best_picks_the_lowest_latency_at_the_same_throughput():
    rows = [(1024, 8192, 1000.0, 400.0, 200.0), (256, 4096, 999.0, 350.0, 100.0), (128, 2048, 980.0, 300.0, 50.0),
            (1024, 512, 1001.0, 10.0, 10.0)]  # the last is refused by vLLM and must be ignored
    df = pd.DataFrame(rows, columns=["max_num_seqs", "max_num_batched_tokens", X, Y, "p99_itl_ms"]).assign(
        rate_req_s=5.0)
    df["vllm_refuses"] = df["max_num_batched_tokens"] < df["max_num_seqs"]
    out = default_vs_best(df, {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}, rel_tol=0.01).iloc[0]
    assert (out["best_max_num_seqs"], out["best_max_num_batched_tokens"]) == (256, 4096)  # 980 is 2 % slower
    assert out[f"default_{Y}"] == 400.0 and out[f"best_{Y}"] == 350.0 and out["best_p99_itl_ms"] == 100.0
    assert out["rate_req_s"] == 5.0
    assert out[f"lowest_{Y}"] == 350.0
    wide = default_vs_best(df, {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}, rel_tol=0.05).iloc[0]
    assert wide["best_max_num_seqs"] == 128


def test_default_vs_best_reads_a_second_latency_within_a_tolerance_of_the_first():
    rows = [(1024, 8192, 1000.0, 500.0, 180.0), (256, 4096, 1000.0, 517.0, 115.0), (256, 2048, 1000.0, 609.0, 63.0),
            (64, 8192, 1000.0, 520.0, 170.0)]
    df = pd.DataFrame(rows, columns=["max_num_seqs", "max_num_batched_tokens", X, Y, "p99_itl_ms"]).assign(
        rate_req_s=5.0, vllm_refuses=False)
    defaults = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}
    strict = default_vs_best(df, defaults).iloc[0]  # lowest TTFT only: the default itself
    assert (strict["best_max_num_seqs"], strict["best_max_num_batched_tokens"]) == (1024, 8192)
    two = default_vs_best(df, defaults, y_rel_tol=0.05, then="p99_itl_ms").iloc[0]  # TTFT <= 525 ms, then ITL
    assert (two["best_max_num_seqs"], two["best_max_num_batched_tokens"]) == (256, 4096)
    assert two[f"lowest_{Y}"] == 500.0 and two[f"best_{Y}"] == 517.0 and two["best_p99_itl_ms"] == 115.0
    assert default_vs_best(df, defaults, y_rel_tol=0.25, then="p99_itl_ms").iloc[0]["best_p99_itl_ms"] == 63.0
    with pytest.raises(ValueError, match="y_rel_tol"):
        default_vs_best(df, defaults, y_rel_tol=1.0)
