"""Sweeps over scheduler configurations, serial or on any ``concurrent.futures.Executor``; Pareto fronts.

Besides the exact Pareto front (:func:`pareto_front`, :func:`is_dominated`), the readings the book takes of a
two-knob sweep live here: a frontier that counts near-equal throughputs as equal (:func:`tolerant_front`,
:func:`with_frontier`), where raising ``max_num_seqs`` stops paying (:func:`seqs_plateau`) and vLLM's default
against the best configuration at its throughput, by one latency or by two (:func:`default_vs_best`).

A sweep is a list of independent simulations, so it parallelises trivially: hand ``sweep`` a
``ProcessPoolExecutor`` to use every core, or ``dask.distributed.Client(...).get_executor()`` to spread a
big grid over a cluster. Results come back in grid order whichever executor ran them, so the DataFrame is
identical in every case.
"""
from __future__ import annotations

import difflib
import inspect
import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from .sim import simulate


def _knob_names() -> list[str]:
    """Knobs a configuration may set: ``policy`` and every keyword of :func:`batchlab.simulate`."""
    params = inspect.signature(simulate).parameters.values()
    return ["policy"] + [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


def _check_knobs(names, where: str) -> None:
    allowed = _knob_names()
    for knob in names:
        if not isinstance(knob, str) or knob not in allowed:
            close = difflib.get_close_matches(str(knob), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{where} names an unknown knob {knob!r}{hint}; knobs are {allowed}")


def expand_grid(grid) -> list[dict]:
    """Configurations of a grid: a mapping knob -> values (cartesian product, in key order) or a list of dicts.

    Every knob must be ``policy`` or a keyword of :func:`batchlab.simulate`; the grid must name at least one
    (an empty grid would silently run the defaults alone). Otherwise a ``ValueError`` naming the knob.
    """
    if grid is None or isinstance(grid, (str, bytes)) or not isinstance(grid, Mapping | Sequence):
        raise ValueError(f"grid must be a mapping knob -> list of values, or a non-empty list of dicts, got {grid!r}")
    if isinstance(grid, Mapping):
        if not grid:
            raise ValueError(f"grid must name at least one knob, got {grid!r}; knobs are {_knob_names()}")
        _check_knobs(grid, "grid")
        for knob, values in grid.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence | np.ndarray) or len(values) == 0:
                raise ValueError(f"grid[{knob!r}] must be a non-empty list of values")
        keys = list(grid)
        return [dict(zip(keys, combo)) for combo in itertools.product(*(list(grid[k]) for k in keys))]
    configs = list(grid)
    if not configs or not all(isinstance(c, Mapping) for c in configs):
        raise ValueError("grid must be a mapping knob -> list of values, or a non-empty list of dicts")
    for i, config in enumerate(configs):
        _check_knobs(config, f"grid[{i}]")
    return [dict(c) for c in configs]


def _run_one(requests, cost, config, slo=None) -> dict:
    knobs = dict(config)
    policy = knobs.pop("policy")
    record = slo is not None and slo.needs_tokens  # an itl bound reads each request's longest gap
    res = simulate(requests, policy, cost, **{"record_tokens": record, **knobs})
    return res.summary() if slo is None else res.summary(slo=slo)


def sweep(requests, grid, cost, *, policy: str = "chunked", executor=None, progress: bool = True, slo=None,
          **fixed_knobs) -> pd.DataFrame:
    """Simulate every configuration of ``grid`` and tabulate each run's ``summary()``.

    The runs keep no token record (``record_tokens=False``, the summary does not need it), so memory follows the
    requests, not the tokens.

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
    slo : batchlab.SLO, optional
        Adds each run's ``request_goodput`` (req/s) and ``slo_met`` under it (``summary(slo=slo)``, chapter 09);
        without it the rows are exactly ``summary()``.
    **fixed_knobs
        Knobs applied to every configuration.

    Returns
    -------
    DataFrame
        One row per configuration, in grid order: the knobs, then the summary columns.
    """
    _check_knobs(fixed_knobs, "sweep's keyword arguments")
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
                rows.append(_run_one(requests, cost, config, slo))
                if bar is not None:
                    bar.update()
        else:
            futures = [executor.submit(_run_one, requests, cost, config, slo) for config in configs]
            if bar is not None:
                for _fut in _as_completed(futures):
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


# -- reading a two-knob sweep: the tolerant frontier, the plateau, the default against the best ------------
def tolerant_front(df: pd.DataFrame, x: str = "output_throughput", y: str = "p99_ttft_ms",
                   rel_tol: float = 0.01) -> np.ndarray:
    """Mask of the rows on the latency-throughput frontier, counting throughputs within ``rel_tol`` as equal.

    A row is beaten when another has a lower ``y`` at an ``x`` of at least (1 - rel_tol) times its own, or an
    equal-or-lower ``y`` at a higher ``x``; ``x`` is maximised, ``y`` minimised. With ``rel_tol = 0`` this is
    exact Pareto dominance (:func:`is_dominated`); a positive tolerance also removes rows that are
    ahead only by the drain tail of a finite run. Of rows with identical (x, y), only the first is kept, so
    the frontier names the configuration that comes first in grid order (the smallest ``max_num_seqs``).
    Every row kept is non-dominated in the exact sense. Used in chapters 08 and 12.

    Parameters
    ----------
    df : DataFrame
        One row per configuration, with columns ``x`` and ``y``.
    x, y : str
        Throughput column (maximised, e.g. tok/s) and latency column (minimised, e.g. ms).
    rel_tol : float
        Relative throughput difference counted as equal, in [0, 1).

    Returns
    -------
    numpy.ndarray of bool
        True for the rows on the frontier, in ``df``'s order.
    """
    if not 0 <= rel_tol < 1:
        raise ValueError(f"rel_tol must be in [0, 1), got {rel_tol!r}")
    xs, ys = df[x].to_numpy(dtype=float), df[y].to_numpy(dtype=float)
    lower = (ys[None, :] < ys[:, None]) & (xs[None, :] >= xs[:, None] * (1 - rel_tol))
    faster = (ys[None, :] <= ys[:, None]) & (xs[None, :] > xs[:, None])
    return ~(lower | faster).any(axis=1) & ~df.duplicated([x, y]).to_numpy()


def with_frontier(df: pd.DataFrame, x: str = "output_throughput", y: str = "p99_ttft_ms",
                  rel_tol: float = 0.01) -> pd.DataFrame:
    """``df`` with a boolean ``frontier`` column: :func:`tolerant_front` over the configurations vLLM accepts.

    Rows with ``vllm_refuses`` are never on the frontier and never push another row off it.
    Used in chapters 08 and 12.

    Parameters
    ----------
    df : DataFrame
        A two-knob sweep (:func:`batchlab.chapters.two_knobs.two_knob_sweep`), with ``vllm_refuses``.
    x, y, rel_tol
        As :func:`tolerant_front`.

    Returns
    -------
    DataFrame
        A copy of ``df`` with the ``frontier`` column.
    """
    accepted = df[~df["vllm_refuses"]]
    front = accepted.index[tolerant_front(accepted, x, y, rel_tol)]
    return df.assign(frontier=df.index.isin(front))


def seqs_plateau(df: pd.DataFrame, y: str = "p99_ttft_ms", tol: float = 0.05) -> pd.DataFrame:
    """Per rate and token budget, the smallest ``max_num_seqs`` whose ``y`` is within ``tol`` of the best one.

    Where raising the concurrency cap stops paying: every larger cap improves ``y`` by less than ``tol``
    (a fraction) over this one. Used in chapters 08 and 12.

    Parameters
    ----------
    df : DataFrame
        A two-knob sweep: ``rate_req_s`` (req/s), ``max_num_batched_tokens``, ``max_num_seqs`` and ``y``.
    y : str
        The latency column to read (ms).
    tol : float
        Fraction of the best ``y`` counted as no improvement.

    Returns
    -------
    DataFrame
        ``rate_req_s``, ``max_num_batched_tokens``, ``max_num_seqs``, ``y`` there and ``best_<y>`` (the lowest
        over all caps).
    """
    rows = []
    for (rate, tokens), g in df.groupby(["rate_req_s", "max_num_batched_tokens"], sort=True):
        best = float(g[y].min())
        first = g[g[y] <= best * (1 + tol)].sort_values("max_num_seqs").iloc[0]
        rows.append({"rate_req_s": rate, "max_num_batched_tokens": int(tokens),
                     "max_num_seqs": int(first["max_num_seqs"]), y: float(first[y]), f"best_{y}": best})
    return pd.DataFrame(rows)


def default_vs_best(df: pd.DataFrame, defaults: dict, x: str = "output_throughput", y: str = "p99_ttft_ms",
                    rel_tol: float = 0.01, also=("p99_itl_ms",), y_rel_tol: float = 0.0,
                    then: str | None = None) -> pd.DataFrame:
    """Per rate, vLLM's default configuration beside the best configuration at the same throughput.

    "Same throughput" means an ``x`` of at least (1 - rel_tol) times the default's, at any rate of the sweep;
    configurations vLLM refuses are left out. The best is the one with the lowest ``y``; with ``y_rel_tol`` > 0
    and a ``then`` column, it is the one with the lowest ``then`` among those whose ``y`` is within
    ``y_rel_tol`` of the lowest (as good a p99 TTFT, then the lowest p99 ITL: reading two latencies). Ties go
    to the first in grid order. Used in chapters 08 and 12.

    Parameters
    ----------
    df : DataFrame
        A two-knob sweep: ``rate_req_s`` (req/s), ``max_num_seqs``, ``max_num_batched_tokens``,
        ``vllm_refuses``, ``x``, ``y`` and the columns of ``also``.
    defaults : dict
        ``max_num_seqs`` and ``max_num_batched_tokens`` of the default (:func:`batchlab.vllm_defaults`).
    x, y, rel_tol
        As :func:`tolerant_front`.
    also : sequence of str
        Further columns to report for both configurations.
    y_rel_tol : float
        Relative difference in ``y`` counted as equal, in [0, 1); used with ``then``.
    then : str, optional
        Column minimised among the configurations within ``y_rel_tol`` of the lowest ``y`` (default: ``y``).

    Returns
    -------
    DataFrame
        One row per rate: ``rate_req_s``, ``default_<col>`` and ``best_<col>`` for ``x``, ``y`` and each column
        of ``also``, ``lowest_<y>`` (the lowest ``y`` at the default's throughput), and the best
        configuration's ``best_max_num_seqs`` and ``best_max_num_batched_tokens``.
    """
    if not 0 <= y_rel_tol < 1:
        raise ValueError(f"y_rel_tol must be in [0, 1), got {y_rel_tol!r}")
    ok = df[~df["vllm_refuses"]]
    cols = list(dict.fromkeys([x, y, *also, *([then] if then else [])]))
    rows = []
    for rate, g in ok.groupby("rate_req_s", sort=True):
        dflt = g[(g["max_num_seqs"] == defaults["max_num_seqs"])
                 & (g["max_num_batched_tokens"] == defaults["max_num_batched_tokens"])].iloc[0]
        peers = ok[ok[x] >= dflt[x] * (1 - rel_tol)]
        lowest = float(peers[y].min())
        close = peers[peers[y] <= lowest * (1 + y_rel_tol)]
        best = close.loc[close[then or y].idxmin()]
        rows.append({"rate_req_s": rate} | {f"default_{c}": float(dflt[c]) for c in cols}
                    | {f"best_{c}": float(best[c]) for c in cols} | {f"lowest_{y}": lowest}
                    | {f"best_{k}": int(best[k]) for k in ("max_num_seqs", "max_num_batched_tokens")})
    return pd.DataFrame(rows)
