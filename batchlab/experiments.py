"""The experiments behind the notebooks, as functions: each runs the simulator over a grid and returns tidy frames.

Notebooks call one of these per idea and chart the result with :mod:`batchlab.viz`; the hidden assert cells
and the tests check the same frames, so a number on a page and the number a test checks are one computation.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .sim import simulate
from .workload import synthetic


def half_empty_fraction(requests: pd.DataFrame) -> float:
    """Share of lockstep-batch time spent after half of the batch's rows had already finished.

    The tail waste of static and dynamic batching: a finished row keeps its slot until the batch's longest
    output ends. Batches are told apart by their release time (every row of a batch is released together).

    Parameters
    ----------
    requests : DataFrame
        ``SimResult.requests`` of a ``static`` or ``dynamic`` run (seconds in ``scheduled_s``, ``finish_s``,
        ``release_s``).

    Returns
    -------
    float
        Dimensionless, in [0, 1]; exactly 0 when every row of every batch ends on the same step.
    """
    done = requests[~requests["rejected"]]
    tail = busy = 0.0
    for release, batch in done.groupby("release_s"):
        finish = np.sort(batch["finish_s"].to_numpy())
        half = finish[(finish.size + 1) // 2 - 1]  # when at least half of the rows are done
        tail += release - half
        busy += release - batch["scheduled_s"].min()
    return float(tail / busy) if busy > 0 else 0.0


def first_batch_rows(requests: pd.DataFrame) -> pd.DataFrame:
    """The rows of the first lockstep batch, shortest output first, as generated and padded decode tokens.

    Returns a long frame with columns ``row`` (1 = shortest output), ``kind`` ("generated" or "padding")
    and ``tokens``; padding here is the decode tail a row sits through after its own output ended.
    """
    first = requests[requests["release_s"] == requests["release_s"].min()]
    rows = first.sort_values(["output_tokens"], kind="stable").reset_index(drop=True)
    longest = int(rows["output_tokens"].max())
    wide = pd.DataFrame({"row": np.arange(1, len(rows) + 1), "generated": rows["output_tokens"].to_numpy(),
                         "padding": longest - rows["output_tokens"].to_numpy()})
    return wide.melt(id_vars="row", var_name="kind", value_name="tokens")


def static_padding_sweep(cost, output_cvs, *, n_requests: int = 512, batch_size: int = 32,
                         prompt_tokens: int = 512, output_mean: float = 256.0, seed=0):
    """Padding tax and tail waste of static batching as the output-length variance grows (notebook 01).

    Every stream has the same prompt length (so prompt padding is zero and all padding is decode tail) and
    lognormal outputs of mean ``output_mean`` and coefficient of variation ``cv``. The same ``seed`` is used
    for every CV, so the streams differ only by their spread (common random numbers).

    Parameters
    ----------
    cost : CostModel
        Times each iteration.
    output_cvs : sequence of float
        Coefficients of variation of the output length (dimensionless, >= 0).
    n_requests, batch_size : int
        Requests in each stream (all arriving at time 0) and rows per lockstep batch.
    prompt_tokens : int
        Tokens in every prompt.
    output_mean : float
        Mean output tokens.
    seed : int or numpy.random.Generator

    Returns
    -------
    summary : DataFrame
        One row per CV: ``output_cv``, ``padding_fraction`` (share of computed token slots that were
        padding), ``half_empty_fraction`` (see :func:`half_empty_fraction`), ``padded_tokens``,
        ``max_output_tokens``, ``duration_s`` and ``output_throughput`` (tok/s).
    batches : DataFrame
        :func:`first_batch_rows` of each CV, with an ``output_cv`` column.
    """
    rows, batches = [], []
    for cv in output_cvs:
        stream = synthetic(n_requests, prompt_tokens, output_mean, prompt_cv=0.0, output_cv=float(cv), seed=seed)
        res = simulate(stream, "static", cost, batch_size=batch_size)
        summ, req = res.summary(), res.requests
        rows.append({"output_cv": float(cv), "padding_fraction": summ["padding_fraction"],
                     "half_empty_fraction": half_empty_fraction(req),
                     "padded_tokens": int(req["padded_tokens"].sum()),
                     "max_output_tokens": int(req["output_tokens"].max()),
                     "duration_s": summ["duration"], "output_throughput": summ["output_throughput"]})
        batches.append(first_batch_rows(req).assign(output_cv=float(cv)))
    return pd.DataFrame(rows), pd.concat(batches, ignore_index=True)
