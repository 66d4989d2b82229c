"""Chapter 02 (dynamic batching): the policy grid's shape and reference cases, the timer's closed form, and
the charts' specs (the queue-delay chart with its slider and metric menu, the load sweep)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from spec_helpers import marks, titles, walk

import batchlab as bl
from batchlab.cost import SERVING_FIELDS
from batchlab.chapters import dynamic_batching as chapter


@pytest.fixture(scope="module")
def runs(cost8b):
    return chapter.policy_grid(cost8b, "azure-conv-2023", 48, {"high": 6.0, "low": 0.3}, batch_size=8,
                               delays_s=[0.0, 0.01, 0.02], seed=0)


def test_ttft_grows_by_exactly_the_delay_when_every_request_is_alone(cost8b):
    # Requests 100 s apart: each leaves alone when its timer fires, so its ttft is the delay plus one prefill,
    # after the serving terms: the API server tokenises the prompt, the request takes request_latency_s to reach
    # the engine, and a lockstep step runs synchronously (its CPU work is not hidden).
    sparse = bl.Requests(np.arange(6) * 100.0, np.full(6, 300), np.full(6, 20))
    runs = {d: bl.simulate(sparse, "dynamic", cost8b, batch_size=4, max_queue_delay_s=d) for d in (0.0, 0.05, 0.2)}
    ttft = [res.summary()["mean_ttft_ms"] for res in runs.values()]
    for d, res in runs.items():  # the timer starts when the engine sees the request
        assert np.allclose(res.requests["scheduled_s"], chapter.engine_arrival_s(res) + d, rtol=0, atol=1e-12)
    assert ttft[1] - ttft[0] == pytest.approx(50.0) and ttft[2] - ttft[0] == pytest.approx(200.0)
    on_the_way = 300 * cost8b.frontend_s_per_token + cost8b.request_latency_s
    prefill = cost8b.step_time([(300, 0)], asynchronous=False)
    assert ttft[0] == pytest.approx((on_the_way + prefill) * 1e3, rel=1e-9)
    assert prefill > cost8b.prefill_time(300)  # the synchronous step pays all its CPU work


def test_policy_grid_shape_and_reference_cases(cost8b):
    rates_req_s = {"low": 0.5, "high": 8.0}
    grid = chapter.policy_grid(cost8b, "azure-conv-2023", 64, rates_req_s, batch_size=8, delays_s=[0.0, 0.05],
                               seed=3)
    assert len(grid) == 2 * (1 + 2 + 2)
    assert grid["load"].tolist() == ["low"] * 5 + ["high"] * 5
    assert grid["rate_req_s"].tolist() == [0.5] * 5 + [8.0] * 5
    assert grid["policy"].tolist()[:5] == ["static", "dynamic", "dynamic", "continuous", "chunked"]
    assert grid.loc[grid["policy"] != "dynamic", "max_queue_delay_s"].isna().all()
    assert set(chapter.LATENCY_COLUMNS) <= set(grid.columns)
    assert (grid["mean_e2el_ms"] >= grid["mean_ttft_ms"]).all() and (grid["p99_e2el_ms"] >= grid["mean_e2el_ms"]).all()
    plain = chapter.policy_grid(cost8b, "azure-conv-2023", 64, [0.5], batch_size=8, seed=3, iteration=())
    assert "load" not in plain and plain["policy"].tolist() == ["static"]
    assert plain["mean_e2el_ms"].iloc[0] == grid["mean_e2el_ms"].iloc[0]  # same stream, same run


def test_dynamic_with_an_endless_timer_is_static(cost8b):
    # With 64 = 8 x 8 requests every batch fills before a 1e6 s timer fires: the two policies are one.
    grid = chapter.policy_grid(cost8b, "azure-conv-2023", 64, [1.0], batch_size=8, delays_s=[1e6], iteration=())
    static, dynamic = grid.iloc[0], grid.iloc[1]
    for col in (*chapter.LATENCY_COLUMNS, "request_throughput", "padding_fraction"):
        assert dynamic[col] == static[col], col


def test_saturation_throughput_ordering(cost8b):
    cap = chapter.policy_grid(cost8b, "azure-conv-2023", 256, [np.inf], batch_size=32).set_index("policy")
    # Flat out, an iteration-level server never idles with a request in its queue; static waits for its
    # first batch to get through the API server (see the closed form below).
    assert (cap.loc[["continuous", "chunked"], "idle_while_queued_fraction"] == 0).all()
    assert 0 < cap.loc["static", "idle_while_queued_fraction"] < cap.loc["static", "idle_while_waiting_fraction"]
    # Iteration-level batching serves several times what padded lockstep batches of 32 serve.
    assert cap.loc["continuous", "request_throughput"] > 3 * cap.loc["static", "request_throughput"]
    assert cap.loc["static", "padding_fraction"] > 0.5 and cap.loc["continuous", "padding_fraction"] == 0


def test_saturation_idles_only_until_the_first_batch_reaches_the_engine(cost8b):
    # Every request sent at 0: the API server passes them on one at a time, so the engine sees the k-th live
    # request at request_latency_s + frontend_s_per_token x (its prompt and those before it). The first step
    # starts when the first batch is in (k = 32 for static, 1 for the iteration-level policies), and the GPU
    # never idles again: that wait is all the idle time with a request sent.
    stream = bl.preset("azure-conv-2023", 256, rate_req_s=np.inf, seed=0)
    knobs = bl.vllm_defaults(cost8b.hardware)
    for policy, kw, k in [("static", {"batch_size": 32}, 32), ("continuous", knobs, 1), ("chunked", knobs, 1)]:
        res = bl.simulate(stream, policy, cost8b, **kw)
        live = res.requests[res.requests["reject_reason"] == ""]
        first_batch_in = cost8b.request_latency_s + cost8b.frontend_s_per_token * live["prompt_tokens"].iloc[:k].sum()
        start = res.steps["start_s"].to_numpy()
        assert start[0] == pytest.approx(first_batch_in, rel=1e-12), policy
        assert np.all(start[1:] == start[:-1] + res.steps["duration_s"].to_numpy()[:-1]), policy
        duration = res.requests["finish_s"].max()
        assert bl.metrics.idle_while_waiting_fraction(res) * duration == pytest.approx(start[0], rel=1e-9), policy
        seen = chapter.engine_arrival_s(res)
        assert np.isnan(seen[res.requests["reject_reason"] != ""]).all()
        assert np.sort(seen[live.index])[k - 1] == pytest.approx(start[0], rel=1e-12), policy


def test_idle_while_queued_leaves_out_the_way_to_the_engine(cost8b):
    # Counted from each client's send, even an iteration-level server idles while a request is on its way;
    # counted from when the engine sees it, never. Dynamic batching idles at most one timer per batch then.
    stream = bl.synthetic(200, 256, 64, prompt_cv=0.5, output_cv=1.0, rate_req_s=2.0, seed=1)
    for policy in ("continuous", "chunked"):
        res = bl.simulate(stream, policy, cost8b)
        assert bl.metrics.idle_while_waiting_fraction(res) > 0 and chapter.idle_while_queued_fraction(res) == 0
    delay = 0.2
    res = bl.simulate(stream, "dynamic", cost8b, batch_size=8, max_queue_delay_s=delay)
    batches = int((res.steps["prefill_tokens"] > 0).sum())
    duration = res.requests["finish_s"].max() - np.nanmin(chapter.engine_arrival_s(res))
    assert 0 < chapter.idle_while_queued_fraction(res) * duration <= batches * delay + 1e-9
    # Without the serving terms the engine sees each request when it is sent: the two measures agree.
    engine = cost8b.replace(**dict.fromkeys(SERVING_FIELDS, 0.0))
    bare = bl.simulate(stream, "dynamic", engine, batch_size=8, max_queue_delay_s=delay)
    assert np.array_equal(chapter.engine_arrival_s(bare), stream.arrival_s)
    assert chapter.idle_while_queued_fraction(bare) == bl.metrics.idle_while_waiting_fraction(bare)


def test_latency_frame_is_one_row_per_run_and_metric(runs):
    long = chapter.latency_frame(runs)
    assert len(long) == 4 * len(runs)
    assert set(long["metric"]) == set(chapter.LATENCY_LABELS.values())
    p99 = long[(long["metric"] == "p99 e2el")]["latency_s"].to_numpy()
    assert np.allclose(p99, runs["p99_e2el_ms"].to_numpy() / 1e3)
    assert sorted(long["max_queue_delay_ms"].dropna().unique()) == pytest.approx([0.0, 10.0, 20.0])


def layer_filters(layer):
    return [t["filter"] for t in layer.get("transform", []) if isinstance(t.get("filter"), str)]


def test_queue_delay_chart(runs):
    spec = chapter.queue_delay_chart(runs).to_dict()
    assert "title" not in spec
    facet = spec["facet"]["column"]
    assert facet["field"] == "load" and facet["sort"] == ["low", "high"]  # panels ordered by rate
    assert spec["resolve"]["scale"]["y"] == "independent"
    params = {p["name"]: p for p in spec["params"]}
    assert params["delay"]["bind"] == {"input": "range", "min": 0.0, "max": 20.0, "step": 10.0,
                                       "name": "max queue delay (ms)"}
    assert params["metric"]["bind"]["input"] == "select"
    assert params["metric"]["bind"]["options"] == list(chapter.LATENCY_LABELS.values())
    assert marks(spec) == {"line", "rule", "text", "point"}
    filters = [f for f in walk(spec, "filter") if isinstance(f, str)]
    assert all(any("metric" in f for f in layer_filters(layer)) for layer in spec["spec"]["layer"])
    assert sum("delay)" in f for f in filters) == 3  # the ring and its label (two alignments) follow the slider
    y = spec["spec"]["layer"][0]["encoding"]["y"]
    assert y["scale"]["type"] == "log" and y["title"] == "latency (s)"
    assert all(t == t.lower() for t in titles(spec)) and "max queue delay (ms)" in titles(spec)
    colors = spec["spec"]["layer"][0]["encoding"]["color"]["scale"]
    assert colors["domain"] == ["static", "dynamic", "continuous", "chunked"]


def test_load_sweep_chart(cost8b):
    sweep = chapter.policy_grid(cost8b, "azure-conv-2023", 48, [0.3, 1.0, 3.0], batch_size=8, delays_s=[0.05],
                                iteration=("continuous",))
    caps = pd.DataFrame({"rate_req_s": [2.0, 20.0], "label": ["lockstep saturation", "iteration-level saturation"]})
    spec = chapter.load_sweep_chart(sweep, caps).to_dict()
    assert marks(spec) == {"line", "point", "rule", "text"} and "title" not in spec
    line = spec["layer"][0]["layer"][0]["encoding"]
    assert line["x"]["scale"]["type"] == "log" and line["y"]["scale"]["type"] == "log"
    assert line["y"]["title"] == "mean end-to-end latency (s)" and line["x"]["title"] == "offered load (req/s)"
    # a marker per policy: static's line may hide under dynamic's
    shapes = spec["layer"][0]["layer"][1]["encoding"]["shape"]["scale"]
    assert shapes["domain"] == ["static", "dynamic", "continuous"] and len(set(shapes["range"])) == 3
    assert spec["layer"][1]["encoding"]["x"]["field"] == "rate_req_s"
    p99 = chapter.load_sweep_chart(sweep, caps, metric="p99_ttft_ms").to_dict()
    assert p99["layer"][0]["layer"][0]["encoding"]["y"]["title"] == "p99 time to first token (s)"


def test_page_tables_say_what_each_number_is(runs):
    shown = runs[runs["max_queue_delay_s"].isna() | np.isclose(runs["max_queue_delay_s"], 0.02)]
    latency = chapter.latency_table(shown)
    assert list(latency.data.columns) == ["offered load", "policy", "mean end-to-end latency (s)",
                                          "p99 end-to-end latency (s)", "mean time to first token (s)",
                                          "p99 time to first token (s)", "throughput (req/s)"]
    # seconds, not ms: the table's values are the grid's divided by 1,000
    assert np.allclose(latency.data["mean end-to-end latency (s)"], shown["mean_e2el_ms"] / 1e3)
    html = chapter.usage_table(shown).to_html()
    assert "GPU busy" in html and "%" in html and "–" in html  # iteration-level batches never "leave full"
    assert not any(f"{r:.6f}" in html for r in shown["rate_req_s"])  # no bare rates as headers
    assert [chapter._seconds(v) for v in (0.036517, 1.775439, 88.381793, 204.7986)] == ["0.0365", "1.78", "88.4",
                                                                                      "205"]


def test_capacity_table(cost8b):
    capacity = chapter.policy_grid(cost8b, "azure-conv-2023", 32, [np.inf], batch_size=8, seed=0)
    table = chapter.capacity_table(capacity)
    assert list(table.data.columns) == ["policy", "saturation throughput (req/s)", "output throughput (tok/s)",
                                        "padded token slots"]
