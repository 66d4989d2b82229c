"""Chapter 8's chart in a real browser: the rate buttons show one rate's runs alone (or every load) and darken
its line of the readout, the sliders
move the green point up and down at a rate below capacity, and the readout reads a queued run in seconds, as the
sweep behind the page has it.

Needs the built book (``make book``, or ``scripts/build_pages.py notebooks/08_two_knobs`` with
``BATCHLAB_BOOK_HTML``) and Debian's Chromium; fixtures ``site`` and ``browser`` are in ``tests/conftest.py``.
"""
from __future__ import annotations

import re

import bookpage
import pytest
from bookpage import chart_texts, redrawn, set_range

from batchlab import viz
from batchlab.chapters import two_knobs as chapter

pytestmark = pytest.mark.browser

PAGE = "notebooks/08_two_knobs"
LINE = re.compile(r"(\d+\.\d) req/s: ([\d,]+) tok/s, p99 TTFT ([\d,.]+) (ms|s), p99 ITL ([\d,.]+) (ms|s)")
# The fill of every point of one mark group (a layer of a panel), the points that group draws.
_FILLS_JS = """(el, cls) => [...el.querySelectorAll('g.mark-symbol.role-mark')].filter(g =>
  cls === 'first' ? true : g.getAttribute('class').includes(cls)).slice(0, 1).flatMap(g =>
  [...g.querySelectorAll('path')].map(p => p.getAttribute('fill')))"""
_CHOSEN_JS = """el => [...el.querySelectorAll('g.mark-symbol.role-mark')].filter(g =>
  g.getAttribute('class').includes('concat_1_layer_5'))[0].querySelectorAll('path')[0].getAttribute('transform')"""




def _rate_buttons(chart):
    return chart.locator(".vega-bindings input[type=radio][name=rate_i]")


def _readout(chart, fill: str | None = None) -> list:
    """The readout's lines per rate, parsed; with ``fill``, only the lines drawn in that colour."""
    lines = chart.evaluate("el => [...el.querySelectorAll('svg text')]"
                           ".map(t => [t.textContent, t.getAttribute('fill')])")
    return [m.groups() for t, f in lines if (m := LINE.fullmatch(t.strip())) and fill in (None, f)]


def test_picking_a_rate_shows_only_that_rates_points(page):
    chart = page.chart(0)
    buttons = _rate_buttons(chart)
    labels = chart.locator(".vega-bindings .vega-bind-radio label").all_inner_texts()
    assert labels[-1].strip() == chapter.EVERY_LOAD and buttons.nth(buttons.count() - 1).is_checked()
    rates = [float(t) for t in labels[:-1]]
    everything = chart.evaluate(_FILLS_JS, "first")  # the top panel's runs, every load
    assert set(everything) == set(chapter.RATE_COLORS[:len(rates)])
    assert [r for r, *_ in _readout(chart)] == [f"{r:.1f}" for r in rates]  # a line per rate
    assert len(_readout(chart, chapter.READOUT_SHOWN)) == len(rates)  # every load: every line dark
    for i, rate in enumerate(rates):
        redrawn(page, chart, lambda i=i: buttons.nth(i).check())
        for group in ("first", "concat_2_layer_0"):  # TTFT and ITL panels
            fills = chart.evaluate(_FILLS_JS, group)
            assert set(fills) == {chapter.RATE_COLORS[i]}, (rate, group, set(fills))
            assert len(fills) == len(everything) // len(rates)  # that rate's runs, all of them
        # every rate keeps its line, so the readout never changes height; the selected rate's alone is dark
        assert [r for r, *_ in _readout(chart)] == [f"{r:.1f}" for r in rates]
        assert [r for r, *_ in _readout(chart, chapter.READOUT_SHOWN)] == [f"{rate:.1f}"]
        assert len(_readout(chart, chapter.READOUT_OTHER)) == len(rates) - 1


def test_sliders_move_the_green_point_only_up_and_down_below_capacity(page):
    chart = page.chart(0)
    redrawn(page, chart, lambda: _rate_buttons(chart).nth(2).check())  # the near load, 95 % of capacity
    tokens = chart.locator(".vega-bindings input[type=range][name=tokens_i]")
    where = {}
    for position in (2, 8):  # 1,024 and 8,192 tokens, vLLM's budget
        redrawn(page, chart, lambda position=position: set_range(tokens, position))
        x, y = map(float, re.findall(r"-?[\d.]+", chart.evaluate(_CHOSEN_JS))[:2])
        where[position] = (x, y)
    (x1, y1), (x2, y2) = where[2], where[8]
    assert abs(x1 - x2) < 3 and abs(y1 - y2) > 20  # same throughput, another p99 TTFT


def test_readout_reads_a_queued_run_in_seconds(page):
    chart = page.chart(0)
    redrawn(page, chart, lambda: _rate_buttons(chart).nth(2).check())
    seqs = chart.locator(".vega-bindings input[type=range][name=seqs_i]")
    redrawn(page, chart, lambda: set_range(seqs, 0))
    assert seqs.locator("xpath=following-sibling::*[1]").inner_text() == f"{chapter.MAX_NUM_SEQS[0]:,}"
    (rate, _, ttft, unit, _, itl_unit), = _readout(chart, chapter.READOUT_SHOWN)
    df = chapter.conv_sweep()
    at = df[(df["rate_req_s"] == float(rate)) & (df["max_num_seqs"] == chapter.MAX_NUM_SEQS[0])
            & (df["max_num_batched_tokens"] == 8192)].iloc[0]
    assert at["p99_ttft_ms"] > 100e3  # eight sequences cannot keep up: the queue grows for the whole run
    assert unit == "s" and f"{ttft} {unit}" == viz.format_duration(at["p99_ttft_ms"]) and itl_unit == "ms"
    assert not [t for t in chart_texts(chart) if re.search(r"\d{2},\d{3}(\.\d+)? ms", t)]  # never "470,264 ms"



def test_on_a_phone_the_grid_names_every_budget_and_vega_warns_of_nothing(site, browser):
    """At 400 px the knob grid's budget axis still labels all eleven columns (8,192 and 16,384 among them: the
    default's and the offline default's), and neither the page opening nor a rate picked makes Vega warn (an
    empty layer used to give "Infinite extent" warnings)."""
    v = bookpage.Visit(browser, f"{site}/{PAGE}.html", width=400)
    try:
        chart = v.chart(0)
        want = [f"{t:,}" for t in chapter.MAX_NUM_BATCHED_TOKENS]
        axes = bookpage.axis_labels(chart, "max_num_batched_tokens (tokens)")
        assert axes == [want], axes
        redrawn(v, chart, lambda: _rate_buttons(chart).nth(0).check())
        assert bookpage.axis_labels(chart, "max_num_batched_tokens (tokens)") == [want]
        assert not v.warnings and not v.errors, (v.warnings, v.errors)
    finally:
        v.close()
