"""Experiment functions of notebook 02 (dynamic batching): closed forms on hand-made runs, invariants on real ones."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab import experiments


@pytest.fixture(scope="module")
def cost():
    return bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))


def fake_run(arrival, scheduled, finish, starts, durations):
    """The parts of a SimResult that idle_while_waiting_fraction reads."""
    n = len(arrival)
    req = pd.DataFrame({"arrival_s": arrival, "scheduled_s": scheduled, "finish_s": finish, "rejected": [False] * n})
    return SimpleNamespace(requests=req, steps=pd.DataFrame({"start_s": starts, "duration_s": durations}))


def test_idle_while_waiting_closed_forms():
    # A batch of two that waits for its second request: idle from 0 (first arrival) to 1 s, busy 1 to 3 s.
    run = fake_run([0.0, 1.0], [1.0, 1.0], [3.0, 3.0], [1.0, 2.0], [1.0, 1.0])
    assert experiments.idle_while_waiting_fraction(run) == pytest.approx(1 / 3)
    # Idle gap with nobody waiting (the next request arrives when its step starts): no waste.
    run = fake_run([0.0, 5.0], [0.0, 5.0], [1.0, 6.0], [0.0, 5.0], [1.0, 1.0])
    assert experiments.idle_while_waiting_fraction(run) == 0.0
    # Same gap, but the second request arrived at 2 s and was only scheduled at 5 s: 3 s of 6 wasted.
    run = fake_run([0.0, 2.0], [0.0, 5.0], [1.0, 6.0], [0.0, 5.0], [1.0, 1.0])
    assert experiments.idle_while_waiting_fraction(run) == pytest.approx(3 / 6)


def test_idle_while_waiting_on_real_runs(cost):
    stream = bl.synthetic(200, 256, 64, prompt_cv=0.5, output_cv=1.0, rate_req_s=2.0, seed=1)
    frac = {}
    for policy, knobs in [("static", {"batch_size": 8}), ("dynamic", {"batch_size": 8, "max_queue_delay_s": 0.2}),
                          ("continuous", {}), ("chunked", {})]:
        frac[policy] = experiments.idle_while_waiting_fraction(bl.simulate(stream, policy, cost, **knobs))
    assert frac["continuous"] == 0.0 and frac["chunked"] == 0.0  # iteration-level servers never idle with work
    assert frac["static"] > frac["dynamic"] > 0.0
    # A lockstep batch of one is work-conserving too: it starts as soon as anything waits and the GPU is free.
    one = bl.simulate(stream, "static", cost, batch_size=1)
    assert experiments.idle_while_waiting_fraction(one) == 0.0


def test_dynamic_idles_at_most_one_timer_per_batch(cost):
    stream = bl.synthetic(300, 256, 32, prompt_cv=0.5, output_cv=1.0, rate_req_s=1.0, seed=2)
    delay = 0.3
    res = bl.simulate(stream, "dynamic", cost, batch_size=16, max_queue_delay_s=delay)
    batches = int((res.steps["prefill_tokens"] > 0).sum())
    duration = res.requests["finish_s"].max() - res.requests["arrival_s"].min()
    idle_s = experiments.idle_while_waiting_fraction(res) * duration
    assert 0 < idle_s <= batches * delay + 1e-9


def test_full_batch_fraction(cost):
    at_once = bl.synthetic(70, 128, 16, output_cv=1.0, seed=0)  # 70 = 8 full batches of 8 and one of 6
    for policy, knobs in [("static", {}), ("dynamic", {"max_queue_delay_s": 0.0})]:
        res = bl.simulate(at_once, policy, cost, batch_size=8, **knobs)
        assert experiments.full_batch_fraction(res) == pytest.approx(8 / 9)
    assert np.isnan(experiments.full_batch_fraction(bl.simulate(at_once, "continuous", cost)))
    # Requests 100 s apart: a dynamic batch never holds more than one.
    sparse = bl.Requests(np.arange(5) * 100.0, np.full(5, 128), np.full(5, 16))
    assert experiments.full_batch_fraction(bl.simulate(sparse, "dynamic", cost, batch_size=2)) == 0.0


def test_ttft_grows_by_exactly_the_delay_when_every_request_is_alone(cost):
    # Requests 100 s apart: each leaves alone when its timer fires, so its ttft is the delay plus one prefill.
    sparse = bl.Requests(np.arange(6) * 100.0, np.full(6, 300), np.full(6, 20))
    ttft = [bl.simulate(sparse, "dynamic", cost, batch_size=4, max_queue_delay_s=d).summary()["mean_ttft_ms"]
            for d in (0.0, 0.05, 0.2)]
    assert ttft[1] - ttft[0] == pytest.approx(50.0) and ttft[2] - ttft[0] == pytest.approx(200.0)
    assert ttft[0] == pytest.approx(cost.prefill_time(300) * 1e3, rel=0.05)


def test_policy_grid_shape_and_reference_cases(cost):
    rates = {"low": 0.5, "high": 8.0}
    grid = experiments.policy_grid(cost, "azure-conv-2023", 64, rates, batch_size=8, delays_s=[0.0, 0.05], seed=3)
    assert len(grid) == 2 * (1 + 2 + 2)
    assert grid["load"].tolist() == ["low"] * 5 + ["high"] * 5
    assert grid["policy"].tolist()[:5] == ["static", "dynamic", "dynamic", "continuous", "chunked"]
    assert grid.loc[grid["policy"] != "dynamic", "max_queue_delay_s"].isna().all()
    assert set(experiments.LATENCY_COLUMNS) <= set(grid.columns)
    assert (grid["mean_e2el_ms"] >= grid["mean_ttft_ms"]).all() and (grid["p99_e2el_ms"] >= grid["mean_e2el_ms"]).all()
    plain = experiments.policy_grid(cost, "azure-conv-2023", 64, [0.5], batch_size=8, seed=3, iteration=())
    assert "load" not in plain and plain["policy"].tolist() == ["static"]
    assert plain["mean_e2el_ms"].iloc[0] == grid["mean_e2el_ms"].iloc[0]  # same stream, same run


def test_dynamic_with_an_endless_timer_is_static(cost):
    # With 64 = 8 x 8 requests every batch fills before a 1e6 s timer fires: the two policies are one.
    grid = experiments.policy_grid(cost, "azure-conv-2023", 64, [1.0], batch_size=8, delays_s=[1e6], iteration=())
    static, dynamic = grid.iloc[0], grid.iloc[1]
    for col in (*experiments.LATENCY_COLUMNS, "request_throughput", "padding_fraction"):
        assert dynamic[col] == static[col], col


def test_saturation_throughput_ordering(cost):
    cap = experiments.policy_grid(cost, "azure-conv-2023", 256, [np.inf], batch_size=32).set_index("policy")
    assert (cap["idle_while_waiting_fraction"] == 0).all()
    # Iteration-level batching serves several times what padded lockstep batches of 32 serve.
    assert cap.loc["continuous", "request_throughput"] > 3 * cap.loc["static", "request_throughput"]
    assert cap.loc["static", "padding_fraction"] > 0.5 and cap.loc["continuous", "padding_fraction"] == 0
