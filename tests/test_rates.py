"""The book's one rule for request rates (batchlab.viz.format_rate): the Python twin on a table of values and
boundaries, the Vega twin (viz.rate_text) evaluated by the book's own Vega in headless Chromium on the same
values, string for string, and the chart-data rounding that keeps a chart's data to the digits it prints."""
from __future__ import annotations

import math

import numpy as np
import pytest

from batchlab import viz

# (req/s, what the book prints): chapter 9's readings, then the rule's boundaries.
TABLE = [
    (0.049649, "0.050"), (0.165497, "0.17"), (8.274874, "8.3"), (18.466218, "18.5"), (0.060991, "0.061"),
    (0.0032, "0.0032"), (0.71836, "0.72"), (19.8, "19.8"), (5.5301, "5.5"),
    (0.0, "0"), (-0.0, "0"), (1e-9, "0.0000000010"),  # zero is never a small positive rate, nor one zero
    (0.0995, "0.10"), (0.994, "0.99"), (0.996, "1.0"), (1.0, "1.0"), (1.04, "1.0"), (9.96, "10.0"),
    (99.94, "99.9"), (99.95, "100"), (99.96, "100"), (100.0, "100"), (1_107.4, "1,107"), (12_345.6, "12,346"),
    (0.125, "0.13"), (2.25, "2.3"),  # ties in binary: half away from zero, as toExponential/toFixed, not half-even
    (-0.5, "\u22120.50"), (float("nan"), "–"), (float("inf"), "–"), (None, "–"),
]


@pytest.mark.parametrize("value, text", TABLE)
def test_format_rate(value, text):
    assert viz.format_rate(value) == text


def test_missing_and_monotone():
    assert viz.format_rate(float("nan"), missing="refused") == viz.format_rate("x", missing="refused") == "refused"
    # across both switches the printed number never decreases as the rate grows (a goodput never reads above what
    # was served), and zero alone reads "0"
    grid = np.concatenate([np.linspace(1e-4, 1.2, 30_001), np.linspace(99, 101, 4_001)])
    printed = [float(viz.format_rate(v).replace(",", "")) for v in grid]
    assert all(a <= b for a, b in zip(printed, printed[1:]))
    assert all(viz.format_rate(v) != "0" and "e" not in viz.format_rate(v) for v in grid)


def test_round_rate_keeps_what_is_printed():
    values = [0.049649, 18.466218, 0.0032, 0.996, 123.4, 0.0, float("nan")]
    got = viz.round_rate(values)
    np.testing.assert_array_equal(got[:-1], [0.05, 18.5, 0.0032, 1.0, 123.0, 0.0])
    assert math.isnan(got[-1])
    assert [viz.format_rate(v) for v in got] == [viz.format_rate(v) for v in values]


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
    assert page.evaluate("typeof vegaEmbed") == "function"
    yield page
    context.close()


@pytest.mark.browser
def test_vega_twin_prints_what_the_python_twin_prints(vega_page):
    """Every row of the table, boundaries and random rates from 1e-5 to 1e4 req/s, with the default and another
    ``missing``, string for string; and the rounded values print the same."""
    values = [v for v, _ in TABLE] + [0.09951, 0.995, 0.9949, 99.949, 99.951, 0.0125, 0.00125]
    values += list(np.random.default_rng(9).lognormal(0, 3, 400))
    values += list(viz.round_rate(values[-400:]))
    rows = [{"v": v if v is None or math.isfinite(v) else str(v)} for v in values]
    exprs = [viz.rate_text("v"), viz.rate_text("v", missing="refused")]
    got = vega_page.evaluate(_EVAL_JS, [rows, exprs])
    want = [[viz.format_rate(v), viz.format_rate(v, missing="refused")] for v in values]
    assert [tuple(g) for g in got] == [tuple(w) for w in want]
