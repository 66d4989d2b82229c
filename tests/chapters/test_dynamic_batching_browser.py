"""Chapter 2's chart in a real browser: the load slider moves the readout, the load panel's rule and the delay
panel to another load, and at the loads where the timer matters its slider moves dynamic batching's latency
while at a load past lockstep saturation it moves it hardly at all, as the runs behind the page have it.

Needs the built book (``make book``, or ``scripts/build_pages.py notebooks/02_dynamic_batching`` with
``BATCHLAB_BOOK_HTML``) and Debian's Chromium; fixtures ``site`` and ``browser`` are in ``tests/conftest.py``.
"""
from __future__ import annotations

import re

import pytest
from bookpage import Visit, chart_texts, set_range

from batchlab.chapters import dynamic_batching as chapter
from batchlab.chapters import facts

pytestmark = pytest.mark.browser

PAGE = "notebooks/02_dynamic_batching"
VALUE = re.compile(r"(static|dynamic|continuous|chunked): ([\d,.]+) (ms|s)")


@pytest.fixture
def chart(site, browser):
    v = Visit(browser, f"{site}/{PAGE}.html")
    yield v, v.chart(0)
    v.close()


def _readout(chart) -> dict:
    """The readout above the panels: its header lines, and each policy's value there (seconds)."""
    texts = [t.strip() for t in chart_texts(chart)]
    values = {m[1]: float(m[2].replace(",", "")) / (1e3 if m[3] == "ms" else 1.0)
              for t in texts if (m := VALUE.fullmatch(t))}
    return {"texts": texts, **values}


def _move(v, chart, name, value) -> dict:
    before = chart.locator("svg").first.inner_html()
    set_range(chart.locator(f".vega-bindings input[name={name}]"), value)
    v.page.wait_for_function("([id, old]) => document.querySelector('#' + id + ' svg').innerHTML !== old",
                             arg=[chart.get_attribute("id"), before], timeout=10_000)
    return _readout(chart)


def _rule_x(chart) -> float:
    """Where the load panel's rule at the selected load is drawn (px, in the svg)."""
    return chart.evaluate("""el => { const g = [...el.querySelectorAll('g.mark-rule.role-mark')][0];
        const line = g.querySelector('line, path'); return line.getBoundingClientRect().left; }""")


def test_the_chart_starts_at_the_low_load_and_timer_the_text_reads(chart):
    _, c = chart
    r = _readout(c)
    assert f"at {facts.value('low_load_req_s'):.2f} req/s, {100 * chapter.LOW_LOAD:g} % of capacity" in r["texts"]
    assert f"max queue delay {chapter.TIMER_MS} ms" in r["texts"]
    assert r["dynamic"] == pytest.approx(facts.value("low_e2el_dynamic_s"), abs=6e-4)  # shown to the ms
    assert r["static"] == pytest.approx(facts.value("low_e2el_static_s"), abs=0.06)
    assert r["continuous"] == pytest.approx(facts.value("low_e2el_orca_s"), abs=6e-4)
    labels = c.locator(".vega-bindings .batchlab-slider-value").all_inner_texts()
    assert labels[0].strip() == f"{facts.value('low_load_req_s'):.2f} req/s, 1 % of capacity"


def test_the_delay_matters_at_light_load_and_not_past_lockstep_saturation(chart):
    v, c = chart
    lightest, past = 0, chapter.LOADS.index(0.4)
    at = _move(v, c, "load_index", lightest)
    assert "static: above the axis ↑" in at["texts"]  # 160 s would flatten the curve the panel is about
    x_light = _rule_x(c)
    short = _move(v, c, "delay", 0)
    long = _move(v, c, "delay", chapter.DELAYS_MS[-1])
    assert "max queue delay 1,000 ms" in long["texts"]
    assert long["dynamic"] > 1.3 * short["dynamic"]  # +0.8 s on 1.7 s: the timer is waited out
    assert long["dynamic"] - short["dynamic"] <= 1.0  # never more than its face value
    assert long["continuous"] == short["continuous"]  # no timer in iteration-level batching
    at = _move(v, c, "load_index", past)
    assert any(t.startswith("at ") and "40 % of capacity" in t for t in at["texts"])
    assert "static ≈ dynamic" in at["texts"] and "static: above the axis ↑" not in at["texts"]
    assert _rule_x(c) > x_light + 100  # the load panel's rule moved right, to 8.3 req/s
    short = _move(v, c, "delay", 0)
    assert abs(short["dynamic"] / at["dynamic"] - 1) < 0.05  # past saturation the timer decides nothing
    assert at["dynamic"] > 100 * at["continuous"]


def test_the_metric_menu_rereads_every_line(chart):
    v, c = chart
    mean = _readout(c)
    before = c.locator("svg").first.inner_html()
    c.locator(".vega-bindings select").select_option("p99 TTFT")
    v.page.wait_for_function("([id, old]) => document.querySelector('#' + id + ' svg').innerHTML !== old",
                             arg=[c.get_attribute("id"), before], timeout=10_000)
    p99 = _readout(c)
    assert "p99 TTFT" in p99["texts"] and "mean end-to-end latency" not in p99["texts"]
    assert p99["continuous"] < mean["continuous"]  # a TTFT is shorter than the whole request
