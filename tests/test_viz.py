"""Generic chart plumbing: the theme, axis titles, slider grids, tidy frames from a SimResult, the offline
renderer (deterministic ids, nothing loaded from another host) and the explore widget. Each chapter's own
charts are tested in tests/chapters/."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab import viz, widgets
from spec_helpers import axis_titles, marks


@pytest.fixture(scope="module")
def runs(cost8b):
    stream = bl.synthetic(12, 512, 48, prompt_cv=0.5, output_cv=1.0, rate_req_s=20.0, seed=3)
    return [bl.simulate(stream, "static", cost8b, batch_size=4),
            bl.simulate(stream, "continuous", cost8b, max_num_seqs=8),
            bl.simulate(stream, "chunked", cost8b, max_num_seqs=8, max_num_batched_tokens=256)]


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


def _gaps(res) -> pd.DataFrame:
    """Every inter-token gap of a run: request, the later token's time (s), the gap (ms)."""
    parts = [pd.DataFrame({"request": i, "time_s": t[1:], "itl_ms": np.diff(t) * 1e3})
             for i, t in enumerate(res.token_times) if t.size > 1]
    return pd.concat(parts, ignore_index=True)


def test_itl_timeline_chart(runs):
    df = _gaps(runs[1])
    assert np.allclose(np.sort(df["itl_ms"].to_numpy()), np.sort(runs[1].itl_s() * 1e3))
    spec = spec_of(viz.itl_timeline_chart(df))
    assert marks(spec) == {"circle"}
    assert spec["encoding"]["y"]["title"] == "inter-token latency (ms)" and spec["encoding"]["x"]["field"] == "time_s"


def test_axis_titles_are_lowercase(runs):
    charts = [viz.itl_timeline_chart(_gaps(runs[2]))]  # each chapter's charts: tests/chapters/
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


def test_grid_param_with_labels_shows_them_and_keeps_the_grid_values():
    # an evenly spaced grid (log2 of a budget) gets a slider whose positions the page labels in tokens
    param, predicate = viz.grid_param("log2_tokens", [11, 9, 10, 9], "budget (tokens)", value=10,
                                      labels=["512", "1,024", "2,048"])
    spec = param.param.to_dict()
    assert spec["bind"] == {"input": "range", "min": 9.0, "max": 11.0, "step": 1.0, "name": "budget (tokens)"}
    assert spec["value"] == 10.0 and predicate == "abs(datum['log2_tokens'] - log2_tokens) < 0.5"
    chart = alt.Chart(pd.DataFrame({"log2_tokens": [9, 10, 11]})).mark_point().encode(x="log2_tokens:Q")
    meta = viz._slider_labels(chart.add_params(param).to_dict())
    assert meta == {"log2_tokens": {"min": 9.0, "step": 1.0, "labels": ["512", "1,024", "2,048"]}}
    # radio buttons when asked, or for an uneven grid up to MAX_RADIO_OPTIONS values; a select box beyond
    spec = viz.grid_param("log2_tokens", [9, 10, 11], labels=["512", "1,024", "2,048"], control="radio")[0]
    assert spec.param.to_dict()["bind"] == {"input": "radio", "options": [9.0, 10.0, 11.0],
                                            "labels": ["512", "1,024", "2,048"], "name": "log2_tokens"}
    uneven = np.array([1, 2, 4, 5, 7, 8, 10, 11, 13])
    spec = viz.grid_param("i", uneven, labels=lambda v: f"{2 ** v:,.0f}", value=2.2)[0].param.to_dict()
    assert spec["bind"]["input"] == "select" and spec["bind"]["options"] == uneven.tolist()
    assert spec["bind"]["labels"][-1] == f"{2 ** 13:,}" and spec["value"] == 2.0  # nearest option
    spec = viz.grid_param("i", uneven[:-1], labels=str)[0].param.to_dict()
    assert spec["bind"]["input"] == "radio" and spec["bind"]["labels"] == [str(float(v)) for v in uneven[:-1]]
    assert "bind" not in viz.grid_param("i", [3], labels=["8"])[0].param.to_dict()  # one value: nothing to choose
    with pytest.raises(ValueError, match="labels: 2 given for 3 grid values"):
        viz.grid_param("i", [1, 2, 3], labels=["a", "b"])
    with pytest.raises(ValueError, match="evenly spaced"):
        viz.grid_param("i", uneven, control="slider")


def test_grid_labels_read_the_shown_column_in_grid_order():
    frame = pd.DataFrame({"log2_tokens": [11.0, 9.0, 10.0, 9.0], "max_num_batched_tokens": [2048, 512, 1024, 512]})
    assert viz.grid_labels(frame, "log2_tokens", "max_num_batched_tokens") == ["512", "1,024", "2,048"]
    assert viz.grid_labels(frame.astype(float), "log2_tokens", "max_num_batched_tokens") == ["512", "1,024", "2,048"]
    with pytest.raises(ValueError, match="several max_num_batched_tokens"):
        viz.grid_labels(frame.assign(max_num_batched_tokens=[2048, 512, 1024, 513]), "log2_tokens",
                        "max_num_batched_tokens")


def test_titles_of_vllm_names():
    assert viz.title("p99_ttft_ms") == "p99 TTFT (ms)"
    assert viz.title("duration_s") == "step time (s)"
    assert viz.title("output_throughput") == "output throughput (tok/s)"


# -- renderer -----------------------------------------------------------------------------------------------
def small_chart(data=None):
    return alt.Chart(pd.DataFrame(data or {"x": [1, 2], "y": [2, 1]})).mark_line().encode(x="x:Q", y="y:Q")


def test_renderer_in_the_book(book_mode):
    bundle = small_chart()._repr_mimebundle_()
    html = bundle["text/html"]
    (chart_id,) = re.findall(r'<div id="(batchlab-chart-\d+)"', html)
    assert f'"{chart_id}"' in html and "batchlabDraw" in html
    assert bundle["text/plain"] == f"<batchlab chart {chart_id}>"
    assert viz.VEGALITE_MIME not in bundle  # myst-nb cannot draw it and would warn
    assert "data-batchlab-library" not in html
    assert not re.search(r"<script[^>]*\bsrc=", html) and not re.search(r"<link[^>]*\bhref=", html)
    assert '"actions":false' in html
    next_id = re.findall(r'<div id="(batchlab-chart-\d+)"', small_chart()._repr_mimebundle_()["text/html"])[0]
    assert int(next_id.rsplit("-", 1)[1]) == int(chart_id.rsplit("-", 1)[1]) + 1


def _book_extension():
    """book/_ext/vega_offline.py, the Sphinx extension that serves the charts' library and CSS in the book."""
    path = Path(__file__).resolve().parents[1] / "book" / "_ext" / "vega_offline.py"
    spec = importlib.util.spec_from_file_location("vega_offline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_book_css_shrinks_every_chart_to_the_text_column(book_mode):
    html = small_chart()._repr_mimebundle_()["text/html"]
    assert f'class="{viz.CHART_CLASS}"' in html
    css = _book_extension().CHART_CSS
    rule = re.search(rf"\.{viz.CHART_CLASS} svg\.marks[^{{]*\{{([^}}]*)\}}", css)
    assert rule, css
    assert re.search(r"max-width:\s*100%", rule.group(1)) and re.search(r"height:\s*auto", rule.group(1))


def test_book_build_names_the_local_assets_a_page_lacks(tmp_path):
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "a.js").write_text("")
    page = tmp_path / "page.html"
    page.write_text('<script src="_static/a.js?v=1"></script><script defer src="_static/mathjax/tex-chtml.js"></script>'
                    '<link rel="icon" href="_static/favicon.svg"><link rel="stylesheet" href="https://cdn.example/x.css">'
                    '<link rel="next" href="missing.html"><script src="data:text/javascript,1"></script>')
    ext = _book_extension()
    assert ext.missing_local_assets(page) == ["_static/mathjax/tex-chtml.js", "_static/favicon.svg"]
    assert ext.external_assets(page.read_text()) == ["https://cdn.example/x.css"]


def test_renderer_escapes_data_inside_the_script(book_mode):
    chart = small_chart({"x": [1], "y": [2], "label": ["</script><script>alert(1)</script>"]})
    html = chart._repr_mimebundle_()["text/html"]
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


def test_choice_param():  # a select box over strings (chapter 05)
    param, pred = viz.choice_param("gpu", ["h100-sxm", "h200"], "GPU", field="hardware")
    d = param.param.to_dict()
    assert d["bind"] == {"input": "select", "options": ["h100-sxm", "h200"], "name": "GPU"} and d["value"] == "h100-sxm"
    assert pred == "datum['hardware'] == gpu"


def test_log_ticks_span_the_data_in_1_2_3_5_steps():  # chapter 06's log axes
    assert viz.log_ticks([212.6, 1221.8]) == [200, 300, 500, 1000]
    assert viz.log_ticks([19.7, 212.6]) == [20, 30, 50, 100, 200, 300]  # a tick past the data is not drawn
    assert viz.log_ticks([3.3e13, 9.9e14], scale=1e-12) == [30, 50, 100, 200, 300, 500, 1000]
    assert viz.log_ticks([0.05, 0.2]) == [0.05, 0.1, 0.2, 0.3]


def test_log_axis_labels_one_two_five_per_decade():
    import vl_convert  # evaluates the label expression the way the page does
    values = [0.0002, 0.0003, 0.002, 0.05, 0.07, 1.0, 3.0, 20.0, 500.0]
    spec = {"$schema": "https://vega.github.io/schema/vega-lite/v6.json",
            "data": {"values": [{"v": v} for v in values]}, "mark": "text",
            "encoding": {"text": {"field": "label"}, "y": {"field": "v", "type": "ordinal", "axis": None}},
            "transform": [{"calculate": viz.LOG125_LABEL.replace("datum.value", "datum.v"), "as": "label"}]}
    texts = re.findall(r">([^<>]+)</text>", vl_convert.vegalite_to_svg(spec))
    assert sorted(texts) == sorted(["2e-4", "0.002", "0.05", "1", "20", "500"])  # 3e-4, 0.07 and 3 get no label


def test_display_table_renames_formats_and_hides_the_index():
    frame = pd.DataFrame({"a_s": [0.12345, np.nan], "share": [0.5, 0.25], "unused": [1, 2]})
    styler = viz.display_table(frame, {"share": ("share", "{:.0%}"), "a_s": ("a (s)", "{:.2f}")})
    assert list(styler.data.columns) == ["share", "a (s)"]  # display order, the unused column dropped
    html = styler.to_html()
    assert "50%" in html and "0.12" in html and "0.12345" not in html and "–" in html
    assert "unused" not in html and ">0<" not in html  # no index column


def test_titles_are_words_with_units():
    from batchlab import viz

    assert viz.title("p99_ttft_ms") == "p99 TTFT (ms)" and viz.title("rate_req_s") == "request rate (req/s)"
    assert viz.title("mean_e2el_ms") == "mean end-to-end latency (ms)" and viz.title("pool_gib") == "KV pool (GiB)"
    t = viz.tip("p99_itl_ms", fmt=",.0f").to_dict()
    assert t == {"field": "p99_itl_ms", "type": "quantitative", "title": "p99 ITL (ms)", "format": ",.0f"}


def test_duration_text_reads_milliseconds_then_seconds():
    """The expression, drawn by Vega itself (vl-convert, offline): ms below a second, seconds from there, three
    significant digits (the book's rule; tests/test_durations.py checks it against the Python twin in Chromium)."""
    import altair as alt
    import pandas as pd
    import vl_convert

    from batchlab import viz

    df = pd.DataFrame({"i": range(5), "ms": [4.4805, 213.46, 9_999.0, 47_026.4, 470_264.0]})
    chart = alt.Chart(df).transform_calculate(shown=viz.duration_text("ms")).mark_text().encode(
        y="i:O", text="shown:N")
    svg = vl_convert.vegalite_to_svg(chart.to_dict())
    for text in ("4.48 ms", "213 ms", "10.0 s", "47.0 s", "470 s"):
        assert f">{text}<" in svg, text
    seconds = alt.Chart(pd.DataFrame({"s": [0.2135]})).transform_calculate(
        shown=viz.duration_text("s", unit="s")).mark_text().encode(text="shown:N")
    assert ">214 ms<" in vl_convert.vegalite_to_svg(seconds.to_dict())


def test_disable_when_names_the_flag_the_page_reads():
    df = pd.DataFrame({"x": [1, 2]})
    on = alt.param(name="chunking", value=True, bind=alt.binding_checkbox(name="chunking"))
    chart = viz.disable_when(alt.Chart(df).mark_point().encode(x="x:Q").add_params(on), "log2_tokens", "!chunking")
    spec = chart.to_dict()
    assert spec["usermeta"] == {"disabledBy": {"log2_tokens": "log2_tokens_disabled"}}
    assert {"name": "log2_tokens_disabled", "expr": "!chunking"} in spec["params"]
    said = viz.disable_when(alt.Chart(df).mark_point().encode(x="x:Q").add_params(on), "log2_tokens", "!chunking",
                            shown="16,384, chunking off").to_dict()
    assert said["usermeta"]["disabledShown"] == {"log2_tokens": "16,384, chunking off"}
