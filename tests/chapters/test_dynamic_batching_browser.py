"""Chapter 2's chart in a real browser: the load slider moves the readout, the load panel's rule and the delay
panel to another load, and at the loads where the timer matters its slider moves dynamic batching's latency
while at a load past lockstep saturation it moves it hardly at all, as the runs behind the page have it. In
every state of its controls, at 1280 and 400 px, the chart fits the width it was drawn at, no text lies on a
mark, and a hover reads each value with its unit, never "null".

Needs the built book (``make book``, or ``scripts/build_pages.py notebooks/02_dynamic_batching`` with
``BATCHLAB_BOOK_HTML``) and Debian's Chromium; fixtures ``site`` and ``browser`` are in ``tests/conftest.py``.
"""
from __future__ import annotations

import re

import pytest
from bookpage import Visit, chart_texts, clashes, set_range

from batchlab.chapters import dynamic_batching as chapter
from batchlab.chapters import facts

pytestmark = pytest.mark.browser

PAGE = "notebooks/02_dynamic_batching"
VALUE = re.compile(r"(static|dynamic|continuous|chunked): ([\d,.]+) (ms|s)(" + re.escape(chapter.OFF_AXIS) + ")?")



@pytest.fixture
def chart(site, browser):
    v = Visit(browser, f"{site}/{PAGE}.html")
    yield v, v.chart(0)
    v.close()


def _readout(chart) -> dict:
    """The readout under the panels: its header lines, and each policy's value there (seconds)."""
    texts = [t.strip() for t in chart_texts(chart)]
    values, off = {}, set()
    for t in texts:
        if m := VALUE.fullmatch(t):
            values[m[1]] = float(m[2].replace(",", "")) / (1e3 if m[3] == "ms" else 1.0)
            if m[4]:
                off.add(m[1])
    return {"texts": texts, "off_axis": off, **values}


def _move(v, chart, name, value) -> dict:
    before = chart.locator("svg").first.inner_html()
    set_range(chart.locator(f".vega-bindings input[name={name}]"), value)
    v.page.wait_for_function("([id, old]) => document.querySelector('#' + id + ' svg').innerHTML !== old",
                             arg=[chart.get_attribute("id"), before], timeout=10_000)
    return _readout(chart)


def _metric(v, chart, name) -> None:
    if chart.locator(".vega-bindings select").input_value() == name:
        return
    before = chart.locator("svg").first.inner_html()
    chart.locator(".vega-bindings select").select_option(name)
    v.page.wait_for_function("([id, old]) => document.querySelector('#' + id + ' svg').innerHTML !== old",
                             arg=[chart.get_attribute("id"), before], timeout=10_000)


def _rule_x(chart) -> float:
    """Where the load panel's rule at the selected load is drawn (px, in the svg)."""
    return chart.evaluate("""el => { const g = [...el.querySelectorAll('g.mark-rule.role-mark')][0];
        const line = g.querySelector('line, path'); return line.getBoundingClientRect().left; }""")


def test_the_chart_starts_at_the_low_load_and_timer_the_text_reads(chart):
    _, c = chart
    r = _readout(c)
    assert f"at {facts.value('low_load_req_s'):.2f} req/s, {100 * chapter.LOW_LOAD:g}% of capacity" in r["texts"]
    assert f"max queue delay {chapter.TIMER_MS} ms" in r["texts"]
    # three significant digits, in seconds from one second up (1.86 s, 84.6 s)
    assert r["dynamic"] == pytest.approx(facts.value("low_e2el_dynamic_s"), rel=3e-3)
    assert r["static"] == pytest.approx(facts.value("low_e2el_static_s"), rel=3e-3)
    assert r["continuous"] == pytest.approx(facts.value("low_e2el_orca_s"), rel=3e-3)
    assert r["off_axis"] == {"static"}  # 85 s would flatten the delay panel's curve: the readout says so
    labels = c.locator(".vega-bindings .batchlab-slider-value").all_inner_texts()
    assert labels[0].strip() == f"{facts.value('low_load_req_s'):.2f} req/s, 1% of capacity"


def test_the_delay_matters_at_light_load_and_not_past_lockstep_saturation(chart):
    v, c = chart
    lightest, past = 0, chapter.LOADS.index(0.4)
    at = _move(v, c, "load_index", lightest)
    assert at["off_axis"] == {"static"}  # 170 s would flatten the curve the panel is about
    x_light = _rule_x(c)
    short = _move(v, c, "delay", 0)
    long = _move(v, c, "delay", chapter.DELAYS_MS[-1])
    assert "max queue delay 1,000 ms" in long["texts"]
    assert long["dynamic"] > 1.3 * short["dynamic"]  # +0.8 s on 1.7 s: the timer is waited out
    assert long["dynamic"] - short["dynamic"] <= 1.0  # never more than its face value
    assert long["continuous"] == short["continuous"]  # no timer in iteration-level batching
    at = _move(v, c, "load_index", past)
    assert any(t.startswith("at ") and "40% of capacity" in t for t in at["texts"])
    assert not at["off_axis"]  # static and dynamic run together there: both drawn
    assert abs(at["static"] / at["dynamic"] - 1) < 0.05
    assert _rule_x(c) > x_light + 100  # the load panel's rule moved right, to 8.3 req/s
    short = _move(v, c, "delay", 0)
    assert abs(short["dynamic"] / at["dynamic"] - 1) < 0.05  # past saturation the timer decides nothing
    assert at["dynamic"] > 100 * at["continuous"]


def test_the_metric_menu_rereads_every_line(chart):
    v, c = chart
    mean = _readout(c)
    _metric(v, c, "p99 TTFT")
    p99 = _readout(c)
    assert "p99 TTFT" in p99["texts"] and "mean end-to-end latency" not in p99["texts"]
    assert p99["continuous"] < mean["continuous"]  # a TTFT is shorter than the whole request


@pytest.mark.parametrize("width", [1280, 400])
def test_every_state_fits_and_no_text_lies_on_a_mark(site, browser, width):
    """Every metric at every load (the timer the text reads), and the whole delay range at three loads: nothing
    drawn outside the svg (Vega sizes it once, so a wider axis would be clipped), the svg no wider than its
    column, and no text of a mark on a line, rule or point, no
    two tick labels of an axis run together and no legend entries overlap (``bookpage.clashes``)."""
    v = Visit(browser, f"{site}/{PAGE}.html", width=width)
    try:
        c = v.chart(0)
        bad, seen = [], 0
        for metric in chapter.LATENCY_LABELS.values():
            _metric(v, c, metric)
            states = [("load_index", i) for i in range(len(chapter.LOADS))]
            states += [(name, x) for i in (0, 8, len(chapter.LOADS) - 1)
                       for name, x in (("load_index", i), ("delay", 0), ("delay", 500), ("delay", 1000),
                                       ("delay", chapter.TIMER_MS))]
            for name, value in states:
                set_range(c.locator(f".vega-bindings input[name={name}]"), value)
                v.page.wait_for_timeout(30)
                r = clashes(c)
                seen += 1
                if any(r.values()):
                    bad.append((metric, name, value, r))
        assert seen >= 100 and not bad, f"at {width} px: {bad[:5]}"
    finally:
        v.close()


def test_a_hover_reads_each_value_with_its_unit(chart):
    """The load panel's points: policy, load, share, the timer (words where a policy has none), the latency with
    its unit; no "null", no code name, no millisecond count past a second."""
    v, c = chart
    _metric(v, c, "p99 end-to-end latency")
    _move(v, c, "load_index", len(chapter.LOADS) - 1)
    points = c.locator("g.mark-symbol.role-mark path")
    seen = set()
    for i in range(0, points.count(), 3):
        points.nth(i).scroll_into_view_if_needed()
        box = points.nth(i).bounding_box()
        if not box or box["width"] < 3:
            continue
        v.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        try:
            v.page.wait_for_function("() => { const t = document.getElementById('vg-tooltip-element');"
                                     " return t && t.classList.contains('visible') && t.innerText.trim(); }",
                                     timeout=2_000)
        except Exception:  # noqa: BLE001 - a point under another one: the next
            continue
        text = v.page.evaluate("() => document.getElementById('vg-tooltip-element').innerText")
        assert "null" not in text and "undefined" not in text and "NaN" not in text and "_" not in text, text
        latency = re.search(r"latency\s+([\d,.]+) (ms|s)\b", text)
        assert latency, text
        assert latency[2] == "s" or float(latency[1].replace(",", "")) < 1000, text
        if "no timer" in text:
            seen.add("no timer")
        elif re.search(r"max queue delay\s+[\d,]+ ms", text):
            seen.add("timer")
        v.page.mouse.move(0, 0)
    assert seen == {"timer", "no timer"}, seen
