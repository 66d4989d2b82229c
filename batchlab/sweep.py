"""Sweeps over scheduler configurations, serial or on any ``concurrent.futures.Executor``; Pareto fronts.

A sweep is a list of independent simulations, so it parallelises trivially: hand ``sweep`` a
``ProcessPoolExecutor`` to use every core, or ``dask.distributed.Client(...).get_executor()`` to spread a
big grid over a cluster. Results come back in grid order whichever executor ran them, so the DataFrame is
identical in every case.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from .sim import simulate


def expand_grid(grid) -> list[dict]:
    """Configurations of a grid: a mapping knob -> values (cartesian product, in key order) or a list of dicts."""
    if isinstance(grid, Mapping):
        for knob, values in grid.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence | np.ndarray) or len(values) == 0:
                raise ValueError(f"grid[{knob!r}] must be a non-empty list of values")
        keys = list(grid)
        return [dict(zip(keys, combo)) for combo in itertools.product(*(list(grid[k]) for k in keys))]
    configs = list(grid)
    if not configs or not all(isinstance(c, Mapping) for c in configs):
        raise ValueError("grid must be a mapping knob -> list of values, or a non-empty list of dicts")
    return [dict(c) for c in configs]


def _run_one(requests, cost, config) -> dict:
    knobs = dict(config)
    policy = knobs.pop("policy")
    return simulate(requests, policy, cost, **knobs).summary()


def sweep(requests, grid, cost, *, policy: str = "chunked", executor=None, progress: bool = True,
          **fixed_knobs) -> pd.DataFrame:
    """Simulate every configuration of ``grid`` and tabulate each run's ``summary()``.

    Parameters
    ----------
    requests : Requests
        The stream every configuration replays.
    grid : mapping or list of dicts
        ``{"max_num_seqs": [8, 64, 256], "max_num_batched_tokens": [512, 2048]}`` (cartesian product) or an
        explicit list of knob dicts. A ``"policy"`` key overrides ``policy`` per configuration.
    cost : CostModel
    policy : str, default "chunked"
    executor : concurrent.futures.Executor, optional
        Runs the simulations (a process pool, or a Dask client's ``get_executor()``); serial if None.
    progress : bool, default True
        Show a tqdm progress bar (works in JupyterLab too) for sweeps of more than a few configurations.
    **fixed_knobs
        Knobs applied to every configuration.

    Returns
    -------
    DataFrame
        One row per configuration, in grid order: the knobs, then the summary columns.
    """
    configs = []
    for config in expand_grid(grid):
        clash = set(config) & set(fixed_knobs)
        if clash:
            raise ValueError(f"knobs {sorted(clash)} are both in the grid and fixed")
        configs.append({"policy": policy, **fixed_knobs, **config})
    show = progress and len(configs) > 4
    bar = None
    if show:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(configs), desc="sweep", leave=False)
    try:
        if executor is None:
            rows = []
            for config in configs:
                rows.append(_run_one(requests, cost, config))
                if bar is not None:
                    bar.update()
        else:
            futures = [executor.submit(_run_one, requests, cost, config) for config in configs]
            if bar is not None:
                for fut in _as_completed(futures):
                    bar.update()
            rows = [fut.result() for fut in futures]
    finally:
        if bar is not None:
            bar.close()
    knobs = pd.DataFrame(configs)
    return pd.concat([knobs, pd.DataFrame(rows)], axis=1)


def _as_completed(futures):
    from concurrent.futures import as_completed
    try:
        return as_completed(futures)
    except TypeError:  # futures of another library: wait in order
        return futures


def pareto_front(df: pd.DataFrame, x: str, y: str, maximize_x: bool = True, minimize_y: bool = True) -> pd.DataFrame:
    """Rows not dominated in (x, y), sorted by x: no other row is at least as good in both and better in one.

    By default x is maximised (e.g. ``output_throughput``) and y minimised (e.g. ``p99_ttft_ms``).
    """
    for col in (x, y):
        if col not in df.columns:
            raise ValueError(f"column {col!r} not in the DataFrame; columns are {list(df.columns)}")
    xs = df[x].to_numpy(dtype=float) * (1 if maximize_x else -1)
    ys = df[y].to_numpy(dtype=float) * (1 if minimize_y else -1)
    order = np.lexsort((ys, -xs))  # best x first, ties by best y
    keep = []
    best_y = np.inf
    for i in order:
        if ys[i] < best_y:
            keep.append(i)
            best_y = ys[i]
    return df.iloc[sorted(keep, key=lambda i: df[x].iloc[i])]


def is_dominated(df: pd.DataFrame, x: str, y: str, maximize_x: bool = True, minimize_y: bool = True) -> np.ndarray:
    """Boolean mask: True where some other row is at least as good in both x and y and better in one."""
    xs = df[x].to_numpy(dtype=float) * (1 if maximize_x else -1)
    ys = df[y].to_numpy(dtype=float) * (1 if minimize_y else -1)
    ge = (xs[None, :] >= xs[:, None]) & (ys[None, :] <= ys[:, None])
    gt = (xs[None, :] > xs[:, None]) | (ys[None, :] < ys[:, None])
    return (ge & gt).any(axis=1)
