"""The book's one duration rule (batchlab.viz): the Python twin on a table of values and boundaries, the Vega
twin evaluated by the book's own Vega (batchlab.viz.offline_bundle, through vegaEmbed) in headless Chromium on
the same table, string for string, and the chart-data rounding that keeps a chart's data and its readout to the
same digits."""
from __future__ import annotations

import math

import numpy as np
import pytest

from batchlab import viz

# (value in ms, what the book prints): the rule's examples, then its boundaries.
TABLE_MS = [
    (0.42, "0.42 ms"), (0.4249, "0.42 ms"), (4.4805, "4.48 ms"), (36.44, "36.4 ms"), (412.4, "412 ms"),
    (1_870.2, "1.87 s"), (11_093.0, "11.1 s"), (468_317.0, "468 s"), (1_107_000.0, "1,107 s"),
    (0.0, "0 ms"), (0.9994, "1.00 ms"), (1.0, "1.00 ms"), (9.9951, "10.0 ms"), (99.951, "100 ms"),
    (999.4, "999 ms"), (999.5, "1.00 s"), (999.6, "1.00 s"), (1_000.0, "1.00 s"), (9_995.1, "10.0 s"),
    (999_400.0, "999 s"), (999_600.0, "1,000 s"), (12_345_678.0, "12,346 s"),
    (1.125, "1.13 ms"),  # a tie in binary: half away from zero, as toExponential, not Python's half-even
    (float("nan"), "–"), (float("inf"), "–"), (None, "–"),
]
# (value in s, what the book prints): the boundaries the brief names, from seconds.
TABLE_S = [
    (0.9994, "999 ms"), (0.9996, "1.00 s"), (999.4, "999 s"), (999.6, "1,000 s"), (0.0, "0 ms"),
    (float("nan"), "–"), (0.036517, "36.5 ms"), (1.775439, "1.78 s"), (88.381793, "88.4 s"), (1_204.3, "1,204 s"),
    (0.00042, "0.42 ms"),
]


@pytest.mark.parametrize("value, text", TABLE_MS)
def test_format_duration_reads_ms(value, text):
    assert viz.format_duration(value) == text


@pytest.mark.parametrize("value, text", TABLE_S)
def test_format_duration_reads_seconds(value, text):
    assert viz.format_duration(value, unit="s") == text


def test_missing_and_bad_unit():
    assert viz.format_duration(float("nan"), missing="refused") == "refused"
    assert viz.format_duration(None, missing="refused") == "refused"
    with pytest.raises(ValueError, match="unit"):
        viz.format_duration(1.0, unit="us")
    with pytest.raises(ValueError, match="unit"):
        viz.duration_text("x", unit="min")


def test_never_prints_a_thousand_of_a_unit_below_the_next():
    """Across both switches, on a fine grid: no "1,000 ms" and no "1.00e+3", and the text grows with the value."""
    for ms in np.concatenate([np.linspace(990, 1010, 20_001), np.linspace(990_000, 1_010_000, 20_001)]):
        text = viz.format_duration(float(ms))
        assert text not in ("1,000 ms", "1000 ms") and "e" not in text, (ms, text)
        number, unit = text.split(" ")
        assert len(number.replace(",", "").replace(".", "").lstrip("0")) >= 3, (ms, text)


def test_round_duration_keeps_what_is_printed():
    values = [249.496354, 8_987.2, 10_964.39, 468_317.0, 0.4249, 999.6, float("nan")]
    got = viz.round_duration(values)
    np.testing.assert_array_equal(got[:-1], [249.0, 8_990.0, 11_000.0, 468_000.0, 0.42, 1_000.0])
    assert math.isnan(got[-1])
    assert [viz.format_duration(v) for v in got] == [viz.format_duration(v) for v in values]
    assert [viz.format_duration(v) for v in viz.round_duration(values)] == [viz.format_duration(v) for v in got]
    np.testing.assert_array_equal(viz.round_duration([1.874, 0.9996], unit="s"), [1.87, 1.0])


# -- the Vega twin, evaluated by the book's Vega in Chromium --------------------------------------------------
# JSON has no NaN or Infinity: they travel as strings and the first formula makes them numbers again.
_EVAL_JS = """async ([rows, exprs]) => {
  const fix = {type: 'formula', as: 'v',
               expr: "datum.v === 'nan' ? NaN : datum.v === 'inf' ? 1 / 0 : datum.v"};
  const spec = {$schema: 'https://vega.github.io/schema/vega/v6.json', data: [{name: 't', values: rows,
    transform: [fix].concat(exprs.map((e, i) => ({type: 'formula', expr: e, as: 'out' + i})))}]};
  const el = document.createElement('div');
  document.body.appendChild(el);
  const result = await vegaEmbed(el, spec, {mode: 'vega', actions: false, renderer: 'svg'});
  const out = result.view.data('t').map(d => exprs.map((e, i) => d['out' + i]));
  result.finalize();
  return out;
}"""


@pytest.fixture(scope="module")
def vega_page(browser):
    context = browser.new_context()
    page = context.new_page()
    page.set_content("<html><body></body></html>")
    page.add_script_tag(content=viz.offline_bundle())
    assert page.evaluate("typeof vegaEmbed") == "function"  # window.vega is not exposed: the bundle's is null
    yield page
    context.close()


def _vega_texts(page, values, exprs):
    rows = [{"v": v if v is None or math.isfinite(v) else str(v)} for v in values]
    return page.evaluate(_EVAL_JS, [rows, exprs])


@pytest.mark.browser
def test_vega_twin_prints_what_the_python_twin_prints(vega_page):
    """Every row of both tables, in ms and in s, with the default and another ``missing``, string for string."""
    values_ms = [v for v, _ in TABLE_MS] + [-0.42, -1_234.0, 2.5e-3, 0.995, 0.9996, 12.5, 1_234.5]
    values_ms += list(np.random.default_rng(24).lognormal(3, 4, 400))  # 1e-4 ms to hours
    values_s = [v for v, _ in TABLE_S]
    exprs = [viz.duration_text("v"), viz.duration_text("v", missing="refused")]
    got = _vega_texts(vega_page, values_ms, exprs)
    want = [[viz.format_duration(v), viz.format_duration(v, missing="refused")] for v in values_ms]
    assert [tuple(g) for g in got] == [tuple(w) for w in want]
    got_s = _vega_texts(vega_page, values_s, [viz.duration_text("v", unit="s")])
    assert [g[0] for g in got_s] == [viz.format_duration(v, unit="s") for v in values_s]
    assert [g[0] for g in got_s] == [t for _, t in TABLE_S]
