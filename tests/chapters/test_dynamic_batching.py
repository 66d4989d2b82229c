"""Chapter 02 (dynamic batching): the policy grid's shape and reference cases, the timer's closed form, the
load x delay grid, the chart's spec (load and delay sliders, metric menu, the delay panel's reference lines and
labels), the page's tables, and the facts (one capacity, its ratios)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from spec_helpers import marks, titles, walk

import batchlab as bl
from batchlab import viz
from batchlab._kernels import REJECT_RECOMPUTE
from batchlab._kernels.cost import serve_time
from batchlab.cost import SERVING_FIELDS
from batchlab.chapters import dynamic_batching as chapter
from batchlab.chapters import facts, scenes


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


def test_every_policy_gets_the_requests_that_fit_the_context(cost8b):
    # The conv scene's 3,000 requests hold 19 prompts longer than Llama-3-8B's 8,192 tokens: vLLM rejects them,
    # Orca's policy and lockstep batches would serve them (lockstep padding whole batches to 13k tokens). Every
    # policy of the grid gets the stream without them, as Scene.requests(fit_context=True) gives it, so all four
    # complete the same requests and none is rejected.
    conv = scenes.scene("conv")
    sat = chapter.policy_grid(cost8b, conv.workload, conv.n_requests, [np.inf], seed=conv.seed).set_index("policy")
    fit = conv.requests(np.inf, fit_context=True)
    assert (sat["completed"] == len(fit.arrival_s)).all() and (sat["rejected"] == 0).all()
    assert conv.n_requests - len(fit.arrival_s) == facts.value("conv_over_context") > 0
    static = bl.simulate(fit, "static", cost8b, batch_size=32).summary()
    assert sat.loc["static", "request_throughput"] == static["request_throughput"]
    assert sat.equals(chapter.conv_saturation().set_index("policy"))  # the page's facts come from this stream
    # vLLM's capacity (chapter 8's fact) is measured on all 3,000 requests: it rejects the 19 and does the same
    # work, so the two streams give it to the last digit.
    assert sat.loc["chunked", "request_throughput"] == facts.value("capacity_req_s")


def test_latencies_read_by_the_book_rule(loads):
    """Every latency the chart prints (readout and tooltips of both panels) is batchlab.viz.duration_text of
    seconds: the book's one rule ("36.4 ms", "1.87 s"), checked in a browser by tests/test_durations.py."""
    rules = pd.DataFrame({"rate_req_s": [1.5, 6.0], "label": ["lockstep saturation", "capacity"]})
    spec = chapter.delay_load_chart(loads, rules).to_dict()
    rule = viz.duration_text("latency_s", unit="s")
    calcs = [c for ts in walk(spec, "transform") if isinstance(ts, list) for c in ts if "calculate" in c]
    tips = [c for c in calcs if c["as"] == "latency_text"]
    assert len(tips) >= 3 and all(c["calculate"] == rule for c in tips)  # load panel, delay panel, its rules
    readout = [c for c in calcs if c["as"] == "text" and "datum.policy + ': '" in c["calculate"]]
    assert readout and all(rule in c["calculate"] for c in readout)


def test_dynamic_with_an_endless_timer_is_static(cost8b):
    # With 64 = 8 x 8 requests every batch fills before a 1e6 s timer fires: the two policies are one. (Seed 1:
    # all 64 fit the context; seed 0's first 64 hold an 11,286-token prompt, which the grid leaves out.)
    assert len(scenes.within_context(cost8b, bl.preset("azure-conv-2023", 64, seed=1)).arrival_s) == 64
    grid = chapter.policy_grid(cost8b, "azure-conv-2023", 64, [1.0], batch_size=8, delays_s=[1e6], iteration=(),
                               seed=1)
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


def test_engine_arrival_is_the_kernels_seen_time_bit_for_bit(cost8b):
    # The simulator returns when the engine saw each request (``seen_s``); the chapter reads it instead of running
    # the API server again. Against that re-run in Python (the same serve_time, requests in order, those rejected up
    # front left out): every policy, a closed-loop client, and preemption with a rejection after it.
    stream = bl.preset("azure-conv-2023", 200, rate_req_s=20.0, seed=2)
    legacy = {"async_scheduling": False, "enable_prefix_caching": False, "scheduler_reserve_full_isl": False,
              "max_model_len": 0}
    runs = [("static", {"batch_size": 32}), ("dynamic", {"batch_size": 8, "max_queue_delay_s": 0.05}),
            ("continuous", {}), ("chunked", {}), ("chunked", {"max_concurrency": 8}),
            ("chunked", {**legacy, "num_kv_blocks": 400, "enable_chunked_prefill": False,
                         "max_num_batched_tokens": 4096})]
    for policy, kw in runs:
        res = bl.simulate(stream, policy, cost8b, **kw)
        code, sent, prompt = res.raw.reject_code, res.requests["sent_s"].to_numpy(), stream.prompt_tokens
        again = np.full(len(stream), np.nan)
        free = -np.inf
        for r in np.flatnonzero((code == 0) | (code == REJECT_RECOMPUTE)):  # those rejected later entered the loop
            again[r], free = serve_time(free, sent[r], prompt[r], cost8b.coefficients())
        assert chapter.engine_arrival_s(res).tobytes() == again.tobytes(), (policy, kw)


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


@pytest.fixture(scope="module")
def loads(cost8b):
    """A small load x delay grid: 48 requests at three loads of a 6 req/s capacity, three delays."""
    return chapter.load_delay_grid(cost8b, "azure-conv-2023", 48, 6.0, (0.05, 0.5, 1.0), (0, 10, 20), batch_size=8)


def test_load_delay_grid_rates_are_shares_of_capacity(loads, cost8b):
    assert sorted(loads["load"].unique()) == [0.05, 0.5, 1.0]
    assert np.allclose(loads["rate_req_s"], loads["load"] * 6.0)
    assert len(loads) == 3 * (1 + 3 + 2)
    one = chapter.policy_grid(cost8b, "azure-conv-2023", 48, [3.0], batch_size=8, delays_s=[0.01])
    mine = loads[np.isclose(loads["load"], 0.5)]
    assert chapter.pick(mine, 0.5, "dynamic", delay_ms=10) == one.loc[1, "mean_e2el_ms"]
    assert chapter.pick(mine, 0.5, "static", "p99_ttft_ms") == one.loc[0, "p99_ttft_ms"]
    with pytest.raises(ValueError, match="capacity_req_s"):
        chapter.load_delay_grid(cost8b, "azure-conv-2023", 48, 0.0)
    with pytest.raises(ValueError, match="runs match"):
        chapter.pick(mine, 0.5, "dynamic", delay_ms=15)


def test_latency_frame_is_one_row_per_run_and_metric(loads):
    long = chapter.latency_frame(loads)
    assert len(long) == 4 * len(loads)
    assert set(long["metric"]) == set(chapter.LATENCY_LABELS.values())
    p99 = long[(long["metric"] == "p99 end-to-end latency")]["latency_s"].to_numpy()
    assert np.allclose(p99, loads["p99_e2el_ms"].to_numpy() / 1e3)
    assert sorted(long["max_queue_delay_ms"].dropna().unique()) == pytest.approx([0.0, 10.0, 20.0])
    assert (long.groupby("load")["load_index"].first().to_numpy() == [0, 1, 2]).all()
    assert chapter.load_labels(long) == ["0.30 req/s, 5% of capacity", "3.0 req/s, 50% of capacity",
                                         "6.0 req/s, 100% of capacity"]


def _long(static: float, continuous: float, chunked: float, dynamic=(1.0, 2.0)) -> pd.DataFrame:
    rows = [{"load_index": 0, "metric": "m", "policy": "dynamic", "max_queue_delay_ms": 100.0 * i, "latency_s": v}
            for i, v in enumerate(dynamic)]
    rows += [{"load_index": 0, "metric": "m", "policy": p, "max_queue_delay_ms": np.nan, "latency_s": v}
             for p, v in (("static", static), ("continuous", continuous), ("chunked", chunked))]
    return pd.DataFrame(rows)


def test_delay_panel_marks_keep_static_off_a_scale_it_would_flatten():
    # top = 1.12 x 2 s: static at 100 s is not drawn, an "above" row says so; the iteration-level lines are.
    marks_ = chapter.delay_panel_marks(_long(100.0, 0.50, 0.52)).set_index("kind")
    assert set(marks_.loc["rule", "policy"]) == {"continuous", "chunked"}
    assert marks_.loc["above", "policy"] == "static" and marks_.loc["above", "latency_s"] == 100.0
    # Static within 1.5 times the rest is drawn.
    near = chapter.delay_panel_marks(_long(2.05, 0.5, 1.5))
    assert set(near.loc[near["kind"] == "rule", "policy"]) == {"static", "continuous", "chunked"}
    assert set(near["kind"]) == {"rule"}  # no text among the lines: the legend and the readout name them


def test_the_readout_says_where_static_is_above_the_delay_panel(loads):
    rules = pd.DataFrame({"rate_req_s": [1.5, 6.0], "label": ["lockstep saturation", "capacity"]})
    spec = chapter.delay_load_chart(loads, rules).to_dict()
    readout = spec["vconcat"][-1]["layer"][-1]
    assert any(chapter.OFF_AXIS in t.get("calculate", "") for t in readout["transform"])
    data = pd.DataFrame(spec["datasets"][spec["vconcat"][-1]["data"]["name"]])
    above = chapter.delay_panel_marks(chapter.latency_frame(loads)).query("kind == 'above'")
    flagged = data[data["off_axis"]]
    assert len(above) and (flagged["policy"] == "static").all()
    assert set(zip(flagged["load_index"], flagged["metric"])) == set(zip(above["load_index"], above["metric"]))


def test_delay_load_chart(loads):
    rules = pd.DataFrame({"rate_req_s": [1.5, 6.0], "label": ["lockstep saturation", "capacity"]})
    spec = chapter.delay_load_chart(loads, rules, delay_ms=10, load=0.5).to_dict()
    assert "title" not in spec
    params = {p["name"]: p for p in spec["params"]}
    assert params["load_index"]["bind"] == {"input": "range", "min": 0.0, "max": 2.0, "step": 1.0,
                                            "name": "offered load"}
    assert params["load_index"]["value"] == 1.0 and params["delay"]["value"] == 10.0  # where the text reads
    assert params["delay"]["bind"]["input"] == "range" and params["delay"]["bind"]["step"] == 10.0
    assert params["metric"]["bind"]["options"] == list(chapter.LATENCY_LABELS.values())
    panels, readout = spec["vconcat"]  # the readout last, next to the controls under the chart
    load_panel, delay_panel = panels["hconcat"]
    assert len(readout["layer"]) == 4  # the metric, the load, the delay, then one line per policy
    y_load = load_panel["layer"][0]["encoding"]["y"]
    assert y_load["scale"]["type"] == "log" and load_panel["layer"][0]["encoding"]["x"]["scale"]["type"] == "log"
    y_delay = delay_panel["layer"][1]["encoding"]["y"]
    assert y_delay["scale"] == {"zero": True} and delay_panel["layer"][1]["encoding"]["x"]["title"] == \
        "max queue delay (ms)"
    # every policy has its colour, marker and dash; dynamic alone follows the delay, every layer the metric
    scales = load_panel["layer"][0]["encoding"]
    assert scales["color"]["scale"]["domain"] == ["static", "dynamic", "continuous", "chunked"]
    assert len({str(d) for d in scales["strokeDash"]["scale"]["range"]}) == 3
    assert len(set(load_panel["layer"][1]["encoding"]["shape"]["scale"]["range"])) == 4
    filters = [f for f in walk(spec, "filter") if isinstance(f, str)]
    assert sum("delay)" in f for f in filters) >= 3 and sum("load_index)" in f for f in filters) >= 4
    tips = [t for layer in (*load_panel["layer"], *delay_panel["layer"]) for t in
            layer.get("encoding", {}).get("tooltip", [])]
    assert tips and all(t.get("title") and "_" not in t["title"] for t in tips)
    assert not any("ms or s" in t["title"] for t in tips)  # one unit per field: the value carries it
    # The max queue delay is dynamic batching's alone: the other policies' tooltips say so in words, not "null".
    timer = [t for t in tips if t["title"] == "max queue delay"]
    assert timer and all(t["field"] == "timer_text" for t in timer)
    assert {"calculate": chapter.TIMER_TEXT, "as": "timer_text"} in load_panel["layer"][1]["transform"]
    # every text a tooltip shows is calculated in that layer (else the page reads "undefined")
    for layer in (*load_panel["layer"], *delay_panel["layer"]):
        made = {c["as"] for c in layer.get("transform", []) if "calculate" in c}
        shown = {t["field"] for t in layer.get("encoding", {}).get("tooltip", []) if t["field"].endswith("_text")}
        assert shown <= made, shown - made
    rates = [t for t in tips if t["title"] == "offered load (req/s)"]
    assert rates and all(t["field"] == "rate_text" for t in rates)  # "18.8", as the readout prints it
    assert {"calculate": viz.rate_text("rate_req_s"), "as": "rate_text"} in load_panel["layer"][1]["transform"]
    # The load panel's lines are named by the legend (no text among its lines); its y axes never change width.
    texts = [layer for layer in load_panel["layer"] if layer.get("mark", {}).get("type") == "text"]
    assert len(texts) == 1 and texts[0]["mark"]["y"] == 0  # the rules' names, above the plot
    for panel in (load_panel, delay_panel):
        axis = panel["layer"][1]["encoding"]["y"]["axis"]
        assert axis["minExtent"] == axis["maxExtent"] == chapter.Y_EXTENT["maxExtent"]
    assert marks(spec) >= {"line", "point", "rule", "text"}
    assert all(t == t.lower() for t in titles(spec))


def test_page_tables_say_what_each_number_is(loads, cost8b):
    shown = loads[(loads["policy"] != "dynamic") | np.isclose(loads["max_queue_delay_s"], 0.02)]
    latency = chapter.latency_table(shown)
    assert list(latency.data.columns) == ["load (share of capacity)", "policy", "mean end-to-end",
                                          "p99 end-to-end", "mean TTFT", "p99 TTFT", "throughput (req/s)"]
    # each latency with its unit, by the book's rule: the cells are the grid's values (ms) read as the page reads
    assert np.allclose(latency.data["mean end-to-end"], shown["mean_e2el_ms"])
    html = latency.to_html()
    cells = [viz.format_duration(v) for v in shown["p99_ttft_ms"]]
    assert all(f">{c}<" in html for c in cells) and any(c.endswith(" ms") for c in cells)
    assert latency.data["load (share of capacity)"].iloc[0] == "5%"
    assert "chunked (vLLM)" in set(latency.data["policy"])
    html = chapter.usage_table(shown).to_html()
    assert "GPU busy" in html and "%" in html and "–" in html  # iteration-level batches never "leave full"
    assert [viz.format_duration(v, unit="s") for v in (0.036517, 1.775439, 88.381793, 204.7986)] == [
        "36.5 ms", "1.78 s", "88.4 s", "205 s"]


def test_capacity_table(cost8b):
    capacity = chapter.policy_grid(cost8b, "azure-conv-2023", 32, [np.inf], batch_size=8, seed=0)
    table = chapter.capacity_table(capacity, 10.0)
    assert list(table.data.columns) == ["policy", "saturation throughput (req/s)", "share of capacity",
                                        "output throughput (tok/s)", "padded token slots"]
    assert np.allclose(table.data["share of capacity"], capacity["request_throughput"] / 10.0)
    assert table.data["saturation throughput (req/s)"].map("{:.3g}".format).tolist() == [
        f"{v:.3g}" for v in capacity["request_throughput"]]  # three significant digits, as the facts print


def test_the_facts_are_one_capacity_and_its_ratios():
    sat = chapter.conv_saturation().set_index("policy")["request_throughput"]
    # vLLM's saturation throughput on the conv scene is the book's capacity (chapter 8's fact): one number
    assert sat["chunked"] == facts.value("capacity_req_s")
    assert facts.value("lockstep_capacity_req_s") == sat["static"]
    assert facts.value("orca_capacity_req_s") == sat["continuous"] < sat["chunked"]
    assert facts.value("orca_over_lockstep") == pytest.approx(sat["continuous"] / sat["static"], rel=1e-12)
    assert facts.value("lockstep_share_of_capacity") == pytest.approx(sat["static"] / sat["chunked"], rel=1e-12)
    assert facts.value("low_load_req_s") == chapter.LOW_LOAD * facts.value("capacity_req_s")
    assert facts.value("dynamic_timer_ms") == chapter.TIMER_MS
