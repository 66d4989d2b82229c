"""Chapter 03 (continuous batching): one stream under three policies with the same slots, slot-use closed forms,
and the charts' specs (the Gantt chart with its request select box and last-end rule, the occupancy panels)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from spec_helpers import axis_titles, marks

import batchlab as bl
from batchlab import viz
from batchlab.chapters import continuous_batching as chapter


@pytest.fixture(scope="module")
def stream():
    return bl.preset("azure-conv-2023", 12, rate_req_s=4.0, seed=0)


@pytest.fixture(scope="module")
def runs(cost8b, stream):
    return chapter.timeline_runs(cost8b, stream, slots=4, max_queue_delay_s=0.05)


@pytest.fixture(scope="module")
def gantt(runs):
    return pd.concat([viz.gantt_frame(r) for r in runs.values()], ignore_index=True)


def test_timeline_runs_share_the_slot_count(runs):
    assert list(runs) == ["static", "dynamic", "continuous"]
    assert runs["static"].knobs["batch_size"] == runs["dynamic"].knobs["batch_size"] == 4
    assert runs["continuous"].knobs["max_num_seqs"] == 4
    assert runs["dynamic"].knobs["max_queue_delay_s"] == 0.05
    for res in runs.values():
        assert res.steps["running"].max() == 4


def test_held_share_closed_form(cost8b):
    # One batch of two rows, outputs 1 and 3: step 0 (prefill) emits both first tokens, steps 1 and 2 only
    # the long row's, so the short row holds its slot for steps 1 and 2.
    two = bl.Requests(np.zeros(2), np.array([64, 64]), np.array([1, 3]))
    res = bl.simulate(two, "static", cost8b, batch_size=2)
    d = res.steps["duration_s"].to_numpy()
    assert d.size == 3
    # Lockstep steps run synchronously, the finished row still computed: prefill of both, then two decodes.
    assert d == pytest.approx([cost8b.step_time([(64, 0), (64, 0)], asynchronous=False),
                               cost8b.decode_step_time(2, 64, asynchronous=False),
                               cost8b.decode_step_time(2, 65, asynchronous=False)], rel=1e-12)
    # The batch leaves when the engine sees the second request: both sent at 0, tokenised one after the other.
    start = cost8b.request_latency_s + 2 * 64 * cost8b.frontend_s_per_token
    assert res.steps["start_s"].iloc[0] == pytest.approx(start, rel=1e-12)
    row = chapter.timeline_summary({"static": res}).iloc[0]
    assert row["held_share"] == pytest.approx((d[1] + d[2]) / (2 * d.sum()))
    # Averaged from the first send, so the wait for the engine counts as time with nothing generating.
    assert row["mean_generating"] == pytest.approx((2 * d[0] + d[1] + d[2]) / (start + d.sum()))
    assert row["last_finish_s"] == pytest.approx(start + d.sum()) and row["iterations"] == 3
    # Equal outputs: nobody is ever held.
    same = bl.Requests(np.zeros(4), np.full(4, 64), np.full(4, 5))
    assert chapter.timeline_summary({"s": bl.simulate(same, "static", cost8b, batch_size=2)})["held_share"][0] == 0


def test_timeline_summary_orders_the_policies(runs):
    summ = chapter.timeline_summary(runs).set_index("policy")
    assert summ.loc["continuous", "held_share"] == 0
    assert summ.loc["static", "held_share"] > 0 and summ.loc["dynamic", "held_share"] > 0
    assert summ.loc["continuous", "last_finish_s"] < summ.loc[["static", "dynamic"], "last_finish_s"].min()
    assert (summ["mean_e2el_s"] >= summ["mean_ttft_s"]).all()


def test_last_finish_by_seed_matches_single_runs(cost8b):
    check = chapter.last_finish_by_seed(cost8b, "azure-conv-2023", 12, 4.0, [0, 5], slots=4)
    assert list(check.index) == [0, 5] and list(check.columns) == ["static", "dynamic", "continuous"]
    one = chapter.timeline_runs(cost8b, bl.preset("azure-conv-2023", 12, rate_req_s=4.0, seed=5), slots=4)
    assert check.loc[5, "dynamic"] == one["dynamic"].requests["finish_s"].max()
    # With one slot continuous batching is first come, first served, like lockstep batches of one.
    solo = chapter.last_finish_by_seed(cost8b, "azure-conv-2023", 12, 4.0, [1], slots=1)
    assert solo.loc[1, "continuous"] == pytest.approx(solo.loc[1, "static"], rel=1e-9)


def test_gantt_chart(gantt):
    spec = chapter.gantt_chart(gantt).to_dict()  # the plain builder: bars faceted, nothing else
    assert spec["facet"]["row"]["field"] == "policy"
    enc = spec["spec"]["encoding"]
    assert marks(spec) == {"bar"} and enc["x2"]["field"] == "end_s" and enc["y"]["field"] == "request"
    assert enc["color"]["scale"]["domain"] == list(viz.PHASES)
    assert "params" not in spec and "layer" not in spec["spec"]
    bare = chapter.gantt_chart(gantt.drop(columns="policy")).to_dict()
    assert "facet" not in bare and "title" not in bare
    assert axis_titles(bare) and all(t == t.lower() for t in axis_titles(bare))


def test_gantt_chart_with_highlight_and_last_end(gantt):
    spec = chapter.gantt_chart(gantt, highlight=True, last_end=True).to_dict()
    assert "title" not in spec
    assert spec["facet"]["row"]["field"] == "policy"
    assert spec["facet"]["row"]["sort"] == ["static", "dynamic", "continuous"]  # the order the runs came in
    (param,) = spec["params"]
    assert param["name"] == "request" and param["value"] == -1
    bind = param["bind"]  # a slider over the request ids, -1 for none, labelled in words beside it
    assert bind == {"input": "range", "min": -1.0, "max": 11.0, "step": 1.0, "name": "highlight"}
    labels = viz._slider_labels(spec)["request"]["labels"]
    assert labels[:2] == ["no request", "request 0"] and len(labels) == 13
    bars, rule = spec["spec"]["layer"]
    assert bars["mark"]["type"] == "bar" and bars["encoding"]["x2"]["field"] == "end_s"
    tips = {t["field"]: t["title"] for t in bars["encoding"]["tooltip"]}
    assert tips == {"policy": "policy", "request": "request", "phase": "phase", "start_s": "from (s)",
                    "end_s": "to (s)", "lasts": "lasts"}  # its value carries its unit: "35.2 ms", "2.68 s"
    assert bars["encoding"]["tooltip"][0]["field"] == "policy"  # which panel's request 3, first
    # A phase's ends read to the hundredth of a second, as the page's prose and the panel titles state times.
    assert {t["field"]: t.get("format") for t in bars["encoding"]["tooltip"] if t["field"].endswith("_s")} == {
        "start_s": ",.2f", "end_s": ",.2f"}
    assert {"calculate": viz.duration_text("phase_s", unit="s"), "as": "lasts"} in bars["transform"]
    assert bars["encoding"]["color"]["scale"]["domain"] == list(viz.PHASES)
    assert "datum.request == request" in bars["encoding"]["opacity"]["condition"][0]["test"]
    assert rule["mark"]["type"] == "rule" and rule["encoding"]["x"]["field"] == "last_s"
    assert rule["transform"][0]["aggregate"][0] == {"op": "max", "field": "end_s", "as": "last_s"}
    # The last end's time is in each panel's title, above its bars: no text mark can run into a bar.
    header = spec["facet"]["row"]["header"]
    assert header["labelOrient"] == "top" and header["labelAngle"] == 0
    ends = gantt.groupby("policy")["end_s"].max()
    for policy, end in ends.items():
        assert f"datum.value == '{policy}' ? ': the last request ends at {end:.2f} s'" in header["labelExpr"]


def test_gantt_chart_options_apart(gantt):
    assert "params" not in chapter.gantt_chart(gantt, last_end=True).to_dict()
    only = chapter.gantt_chart(gantt, highlight=True).to_dict()
    assert marks(only) == {"bar"} and only["params"][0]["name"] == "request"
    bare = chapter.gantt_chart(gantt.drop(columns="policy"), highlight=True, last_end=True).to_dict()
    assert "facet" not in bare and {"bar", "rule"} == marks(bare)
    assert f"the last request ends at {gantt['end_s'].max():.2f} s" in str(axis_titles(bare))


def test_occupancy_frame_steps_and_idle_zeros(runs):
    res = runs["static"]
    df = chapter.occupancy_frame(res)
    assert set(df["measure"]) == {"slots held", "rows generating"} and (df["policy"] == "static").all()
    wide = df.pivot(index="time_s", columns="measure", values="rows")
    assert (wide["rows generating"] <= wide["slots held"]).all()
    # Static waits for its fourth request: nothing held before the first dispatch, zero again at the end.
    first = res.steps["start_s"].iloc[0]
    assert wide.index[0] == first and wide.iloc[-1].tolist() == [0, 0]
    assert wide.index[-1] == pytest.approx((res.steps["start_s"] + res.steps["duration_s"]).iloc[-1])
    # Between lockstep batches with a gap, the frame drops to zero.
    end = (res.steps["start_s"] + res.steps["duration_s"]).to_numpy()
    gaps = end[:-1][res.steps["start_s"].to_numpy()[1:] > end[:-1]]
    for t in gaps:
        assert wide.loc[t, "slots held"] == 0
    # The step function reproduces the slot-time of the run.
    held = wide["slots held"].to_numpy()
    assert np.sum(held[:-1] * np.diff(wide.index.to_numpy())) == pytest.approx(
        float((res.steps["running"] * res.steps["duration_s"]).sum()))


def test_occupancy_panels_chart(runs):
    df = pd.concat([chapter.occupancy_frame(r) for r in runs.values()], ignore_index=True)
    spec = chapter.occupancy_panels_chart(df).to_dict()
    assert spec["facet"]["row"]["field"] == "policy" and "title" not in spec
    generating, held, hover = spec["spec"]["layer"]
    assert generating["mark"]["type"] == "rect" and generating["encoding"]["x2"]["field"] == "end_s"
    assert held["mark"]["type"] == "line" and held["mark"]["interpolate"] == "step-after"
    assert generating["encoding"]["y"]["title"] == "sequences" and generating["encoding"]["x"]["title"] == "time (s)"
    assert generating["encoding"]["color"]["scale"]["domain"] == ["slots held", "rows generating"]
    # An invisible rect per interval answers a hover anywhere in the panel, its fields titled in words.
    assert hover["mark"] == {"type": "rect", "opacity": 0}
    assert [t["title"] for t in hover["encoding"]["tooltip"]] == [
        "policy", "from (s)", "to (s)", "slots held (sequences)", "rows generating (sequences)"]
    assert [t.get("format") for t in hover["encoding"]["tooltip"][1:3]] == [",.2f", ",.2f"]  # as the Gantt's
    # The intervals tile each run: every one ends where the next starts, and the run's last has no length.
    data = pd.DataFrame(next(iter(spec["datasets"].values())))
    for _, run in data.groupby("policy"):
        assert np.array_equal(run["end_s"].to_numpy()[:-1], run["time_s"].to_numpy()[1:])
        assert run["end_s"].iloc[-1] == run["time_s"].iloc[-1]


def test_page_tables(cost8b):
    stream = bl.preset("azure-conv-2023", 6, rate_req_s=4.0, seed=0)
    table = chapter.stream_table(stream)
    assert list(table.data.columns) == ["request", "sent at (s)", "prompt (tokens)", "output (tokens)"]
    assert table.data["prompt (tokens)"].tolist() == stream.to_frame()["prompt_tokens"].tolist()
    check = pd.DataFrame({"static": [3.0, 5.0, 4.0], "dynamic": [2.0, 6.0, 4.0], "continuous": [1.0, 2.0, 3.0]})
    stats = chapter.seed_check_table(check).data.set_index("last request ends (s)")
    assert stats.loc["median", "static"] == 4.0 and stats.loc["fastest stream", "dynamic"] == 2.0
    assert stats.loc["slowest stream", "continuous"] == 3.0 and stats.loc["mean", "continuous"] == 2.0
