"""Sweeps give identical tables serially, on a process pool and on a Dask cluster; Pareto fronts."""
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd
import pytest

import batchlab as bl

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
