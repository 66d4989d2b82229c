"""Chart schemas and the offline renderer: every builder's spec validates and has the marks, params and
encodings the pages rely on; the renderer's HTML has deterministic ids and loads nothing from another host."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import altair as alt
import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab import experiments, viz, widgets
from spec_helpers import axis_titles, marks, walk


@pytest.fixture(scope="module")
def cost():
    return bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))


@pytest.fixture(scope="module")
def runs(cost):
    stream = bl.synthetic(12, 512, 48, prompt_cv=0.5, output_cv=1.0, rate_req_s=20.0, seed=3)
    return [bl.simulate(stream, "static", cost, batch_size=4),
            bl.simulate(stream, "continuous", cost, max_num_seqs=8),
            bl.simulate(stream, "chunked", cost, max_num_seqs=8, max_num_batched_tokens=256)]


@pytest.fixture(scope="module")
def sweep(cost):
    return experiments.static_padding_sweep(cost, [0.0, 0.5, 1.0], n_requests=64, batch_size=8, seed=0)


@pytest.fixture
def book_mode(monkeypatch):
    monkeypatch.setenv(viz.BOOK_ENV, "1")


def spec_of(chart) -> dict:
    return chart.to_dict()  # validates against the Vega-Lite schema


def test_theme_and_renderer_are_enabled_on_import():
    assert alt.theme.active == viz.THEME
    assert alt.renderers.active == viz.THEME
    config = alt.Chart(pd.DataFrame({"x": [1]})).mark_point().encode(x="x").to_dict()["config"]
    assert config["range"]["category"] == viz.PALETTE


def test_padding_chart(sweep):
    summary, batches = sweep
    spec = spec_of(viz.padding_chart(summary, batches))
    assert len(spec["hconcat"]) == 2 and "title" not in spec
    (param,) = spec["params"]
    assert param["name"] == "cv" and param["bind"] == {"input": "range", "min": 0.0, "max": 1.0, "step": 0.5,
                                                       "name": "output-length CV"}
    assert {"line", "point", "text", "bar"} <= marks(spec)
    filters = list(walk(spec, "filter"))
    assert len(filters) == 3 and all(" cv)" in f for f in filters)  # marker, label and batch panel follow it
    assert set(axis_titles(spec)) >= {"share wasted (%)", "output-length coefficient of variation"}
    bars = spec["hconcat"][1]
    assert bars["encoding"]["x"]["field"] == "tokens" and bars["encoding"]["color"]["field"] == "kind"


def test_padding_chart_without_batch_panel(sweep):
    spec = spec_of(viz.padding_chart(sweep[0]))
    assert "layer" in spec and spec["params"][0]["name"] == "cv"


def test_gantt_frame_phases_tile_each_request(runs):
    static = runs[0]
    df = viz.gantt_frame(static)
    req = static.requests
    for r, phases in df.groupby("request"):
        phases = phases.sort_values("start_s")
        assert np.allclose(phases["start_s"].to_numpy()[1:], phases["end_s"].to_numpy()[:-1])  # no gaps
        assert phases["start_s"].iloc[0] == pytest.approx(req.loc[r, "arrival_s"])
        assert phases["end_s"].iloc[-1] == pytest.approx(req.loc[r, "release_s"])
        assert set(phases["phase"]) <= set(viz.PHASES)
    assert "held" in set(df["phase"])  # static rows wait for the batch's longest output
    assert (df["policy"] == "static").all()


def test_gantt_chart(runs):
    df = pd.concat([viz.gantt_frame(r) for r in runs], ignore_index=True)
    spec = spec_of(viz.gantt_chart(df))
    assert spec["facet"]["row"]["field"] == "policy"
    enc = spec["spec"]["encoding"]
    assert marks(spec) == {"bar"} and enc["x2"]["field"] == "end_s" and enc["y"]["field"] == "request"
    assert enc["color"]["scale"]["domain"] == list(viz.PHASES)
    assert "facet" not in spec_of(viz.gantt_chart(df.drop(columns="policy")))


def test_occupancy_chart(runs):
    steps = pd.concat([viz.steps_frame(r, label=r.policy) for r in runs], ignore_index=True)
    assert np.allclose(steps["end_s"], steps["start_s"] + steps["duration_s"])
    spec = spec_of(viz.occupancy_chart(steps))
    assert spec["mark"]["interpolate"] == "step-after"
    assert spec["encoding"]["y"]["field"] == "running" and spec["encoding"]["color"]["field"] == "policy"


def roofline_frames(cost, contexts):
    batch = np.unique(np.round(np.logspace(0, 10, 21, base=2)))
    b, c = np.meshgrid(batch, contexts)
    df = pd.DataFrame({"batch": b.ravel(), "context": c.ravel()})
    df["step_time_s"] = cost.ideal().decode_step_time(df["batch"].to_numpy(), df["context"].to_numpy())
    knees = pd.DataFrame({"context": contexts, "knee": [cost.ideal().knee(x) for x in contexts]})
    return df, knees


def test_roofline_chart_slider_over_an_even_grid(cost):
    df, knees = roofline_frames(cost, np.arange(0, 4097, 1024))
    spec = spec_of(viz.roofline_chart(df, knees))
    (param,) = spec["params"]
    assert param["bind"]["input"] == "range" and param["bind"]["step"] == 1024.0
    assert marks(spec) == {"line", "rule", "text"}
    x, y = spec["layer"][0]["encoding"]["x"], spec["layer"][0]["encoding"]["y"]
    assert x["scale"]["type"] == "log" and y["scale"]["type"] == "log"
    assert y["title"] == "step time (ms)" and x["title"] == "batch size (sequences)"
    assert all("context)" in f for f in walk(spec, "filter"))


def test_roofline_chart_select_over_an_uneven_grid(cost):
    df, knees = roofline_frames(cost, [0, 512, 1024, 4096, 16384])
    spec = spec_of(viz.roofline_chart(df.assign(hardware="h100-sxm"), knees.assign(hardware="h100-sxm"),
                                      color="hardware"))
    assert spec["params"][0]["bind"] == {"input": "select", "options": [0.0, 512.0, 1024.0, 4096.0, 16384.0],
                                         "name": "context per sequence (tokens)"}
    assert spec["layer"][0]["encoding"]["color"]["field"] == "hardware"


def test_itl_frame_holds_every_gap(runs):
    res = runs[1]
    df = viz.itl_frame(res)
    assert np.allclose(np.sort(df["itl_ms"].to_numpy()), np.sort(res.itl_s() * 1e3))
    some = viz.itl_frame(res, requests=[0, 2])
    assert set(some["request"]) == {0, 2}
    spec = spec_of(viz.itl_timeline_chart(df))
    assert marks(spec) == {"circle"}
    assert spec["encoding"]["y"]["title"] == "inter-token latency (ms)" and spec["encoding"]["x"]["field"] == "time_s"


def test_frontier_chart():
    rows = [{"max_num_seqs": s, "max_num_batched_tokens": t, "output_throughput": 100.0 * s + t / 10,
             "p99_ttft_ms": 5.0 * s + 1e4 / t} for s in (8, 32, 128) for t in (512, 2048)]
    df = pd.DataFrame(rows)
    df["pareto"] = df["p99_ttft_ms"] == df.groupby("max_num_seqs")["p99_ttft_ms"].transform("min")
    spec = spec_of(viz.frontier_chart(df, frontier="pareto", select="max_num_batched_tokens"))
    assert len(spec["layer"]) == 2 and marks(spec) == {"line"}
    assert spec["params"][0]["bind"]["input"] == "range"
    assert spec["layer"][0]["encoding"]["opacity"]["condition"][0]["test"].startswith("abs(datum['max_num")
    assert spec["layer"][0]["encoding"]["y"]["title"] == "p99 ttft (ms)"
    assert "params" not in spec_of(viz.frontier_chart(df))


def test_axis_titles_are_lowercase(sweep, runs, cost):
    df, knees = roofline_frames(cost, [0, 1024])
    charts = [viz.padding_chart(*sweep), viz.gantt_chart(viz.gantt_frame(runs[0])),
              viz.occupancy_chart(viz.steps_frame(runs[1])), viz.roofline_chart(df, knees),
              viz.itl_timeline_chart(viz.itl_frame(runs[2]))]
    for chart in charts:
        spec = spec_of(chart)
        assert "title" not in spec, "captions belong to the page"
        titles = axis_titles(spec)
        assert titles and all(t == t.lower() for t in titles), titles


def test_grid_param_tolerance_and_binding():
    param, predicate = viz.grid_param("cv", [0.0, 0.1, 0.2, 0.3], "spread", field="output_cv")
    spec = param.param.to_dict()
    assert spec["bind"]["input"] == "range" and spec["bind"]["step"] == pytest.approx(0.1)
    assert predicate.startswith("abs(datum['output_cv'] - cv) < ")
    tol = float(predicate.rsplit("<", 1)[1])
    assert 0.04 < tol < 0.06  # half a step: a slider value of 0.30000000000000004 still picks 0.3
    assert viz.grid_param("n", [1, 2, 8])[0].param.to_dict()["bind"]["input"] == "select"
    assert "bind" not in viz.grid_param("n", [4])[0].param.to_dict()


def test_titles_of_vllm_names():
    assert viz.title("p99_ttft_ms") == "p99 ttft (ms)"
    assert viz.title("duration_s") == "duration (s)"
    assert viz.title("output_throughput") == "output throughput (tok/s)"


# -- renderer -----------------------------------------------------------------------------------------------
def small_chart(data=None):
    return alt.Chart(pd.DataFrame(data or {"x": [1, 2], "y": [2, 1]})).mark_line().encode(x="x:Q", y="y:Q")


def test_renderer_in_the_book(book_mode):
    bundle = small_chart()._repr_mimebundle_()
    html = bundle["text/html"]
    (chart_id,) = re.findall(r'<div id="(batchlab-chart-\d+)"', html)
    assert f'"{chart_id}"' in html and "vegaEmbed" in html
    assert bundle["text/plain"] == f"<batchlab chart {chart_id}>"
    assert viz.VEGALITE_MIME not in bundle  # myst-nb cannot draw it and would warn
    assert "data-batchlab-library" not in html
    assert not re.search(r"<script[^>]*\bsrc=", html) and not re.search(r"<link[^>]*\bhref=", html)
    assert '"actions":false' in html
    next_id = re.findall(r'<div id="(batchlab-chart-\d+)"', small_chart()._repr_mimebundle_()["text/html"])[0]
    assert int(next_id.rsplit("-", 1)[1]) == int(chart_id.rsplit("-", 1)[1]) + 1


def test_renderer_escapes_data_inside_the_script(book_mode):
    html = small_chart({"x": [1], "y": [2], "label": ["</script><script>alert(1)</script>"]})._repr_mimebundle_()["text/html"]
    assert html.count("</script>") == 1 and html.count("<script") == 1


def test_chart_ids_are_deterministic_across_runs():
    script = ("import os; os.environ['BATCHLAB_BOOK'] = '1'\n"
              "import pandas as pd, altair as alt; import batchlab.viz\n"
              "df = pd.DataFrame({'x': [1, 2], 'y': [2, 1]})\n"
              "for m in ('mark_line', 'mark_point'):\n"
              "    print(getattr(alt.Chart(df), m)().encode(x='x', y='y')._repr_mimebundle_()['text/html'])\n")
    first, second = (subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
                     for _ in range(2))
    assert first == second
    assert re.findall(r'<div id="(batchlab-chart-\d+)"', first) == ["batchlab-chart-1", "batchlab-chart-2"]


def test_live_kernel_gets_the_library_once_and_the_vegalite_mimetype():
    script = ("import os; os.environ.pop('BATCHLAB_BOOK', None)\n"
              "import json, pandas as pd, altair as alt; import batchlab.viz as viz\n"
              "df = pd.DataFrame({'x': [1, 2], 'y': [2, 1]})\n"
              "out = [alt.Chart(df).mark_line().encode(x='x', y='y')._repr_mimebundle_() for _ in range(2)]\n"
              "print(json.dumps([{'lib': 'data-batchlab-library' in b['text/html'], 'vl': viz.VEGALITE_MIME in b,\n"
              "                   'size': len(b['text/html'])} for b in out]))\n")
    result = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                       check=True).stdout)
    assert [r["lib"] for r in result] == [True, False]
    assert all(r["vl"] for r in result)
    assert result[0]["size"] > 100_000 > result[1]["size"]


def test_offline_bundle_defines_vega_embed_and_drains_the_queue():
    js = viz.offline_bundle()
    assert js.startswith("(function () {") and re.search(r"window\.vegaEmbed\s*=", js)
    assert "window.batchlabCharts" in js and "</script" not in js
    assert not re.search(r"\bimport\s*\(|\bimportScripts\b", js)  # loads no further code


# -- widgets ------------------------------------------------------------------------------------------------
def test_explore_builds_controls_and_reruns_on_change():
    import ipywidgets as ipw

    calls = []

    def fn(cv=1.0, batch_size=32, policy="static", record=False):
        calls.append((cv, batch_size, policy, record))
        return f"{cv} {batch_size} {policy}"

    box = widgets.explore(fn, cv=(0.0, 3.0, 0.1), batch_size=(1, 128, 1), policy=["static", "dynamic"],
                          record=False)
    controls = box.children[0].children
    assert [type(c) for c in controls] == [ipw.FloatSlider, ipw.IntSlider, ipw.Dropdown, ipw.Checkbox]
    assert controls[0].value == 1.0 and controls[1].value == 32  # start at fn's defaults
    assert calls == [(1.0, 32, "static", False)]
    controls[1].value = 64
    assert calls[-1] == (1.0, 64, "static", False)
    with pytest.raises(ValueError, match="control 'bad'"):
        widgets.explore(fn, bad=object())
