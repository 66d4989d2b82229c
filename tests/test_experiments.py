"""The experiment functions behind the notebooks: closed forms on hand-made frames, invariants on real runs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab import experiments


def frame(scheduled, finish, release):
    n = len(finish)
    return pd.DataFrame({"scheduled_s": scheduled, "finish_s": finish, "release_s": release,
                         "rejected": [False] * n, "output_tokens": [1] * n})


def test_half_empty_fraction_closed_forms():
    # One batch of two rows from 0 s: half the rows are done at 1 s, the batch ends at 3 s -> 2/3.
    assert experiments.half_empty_fraction(frame([0, 0], [1, 3], [3, 3])) == pytest.approx(2 / 3)
    # Every row ends with the batch: no tail.
    assert experiments.half_empty_fraction(frame([0, 0, 0], [3, 3, 3], [3, 3, 3])) == 0.0
    # Two batches weigh by their running time: (2 + 0) / (3 + 1).
    two = frame([0, 0, 3, 3], [1, 3, 4, 4], [3, 3, 4, 4])
    assert experiments.half_empty_fraction(two) == pytest.approx(0.5)
    # Three rows: "half done" is the second finish.
    assert experiments.half_empty_fraction(frame([0, 0, 0], [1, 2, 4], [4, 4, 4])) == pytest.approx(0.5)


def test_first_batch_rows_pad_to_the_longest():
    req = pd.DataFrame({"release_s": [5.0, 5.0, 5.0, 9.0], "output_tokens": [30, 10, 20, 99]})
    rows = experiments.first_batch_rows(req).pivot(index="row", columns="kind", values="tokens")
    assert rows["generated"].tolist() == [10, 20, 30]
    assert (rows["generated"] + rows["padding"]).tolist() == [30, 30, 30]


def test_static_padding_sweep_zero_at_zero_variance_and_rising():
    cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))
    summary, batches = experiments.static_padding_sweep(cost, [0.0, 0.5, 1.0, 2.0], n_requests=128, batch_size=16)
    assert summary.loc[0, ["padding_fraction", "half_empty_fraction", "padded_tokens"]].tolist() == [0, 0, 0]
    assert (np.diff(summary["padding_fraction"]) > 0).all()
    assert (np.diff(summary["half_empty_fraction"]) > 0).all()
    assert set(batches["output_cv"]) == {0.0, 0.5, 1.0, 2.0}
    assert batches.groupby("output_cv")["row"].nunique().tolist() == [16] * 4
    # The batch panel's padding is the per-request padded_tokens of the first batch (equal prompts).
    res = bl.simulate(bl.synthetic(128, 512, 256, prompt_cv=0.0, output_cv=1.0, seed=0), "static", cost,
                      batch_size=16)
    first = res.requests.iloc[:16]
    shown = batches[(batches["output_cv"] == 1.0) & (batches["kind"] == "padding")]["tokens"].sum()
    assert shown == first["padded_tokens"].sum()
    assert summary.loc[2, "padding_fraction"] == res.summary()["padding_fraction"]
