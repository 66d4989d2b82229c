"""Chapter 1's chart in a real browser: the slider starts at output CV 1, where the text reads, its readout
reads the facts the other pages quote, and moving it rereads both shares and redraws the batch; at every CV, at
1280 and 400 px, the readout lies on no curve or marker and nothing is drawn outside the svg.

Needs the built book (``make book``, or ``scripts/build_pages.py notebooks/01_static_batching`` with
``BATCHLAB_BOOK_HTML``) and Debian's Chromium; fixtures ``site`` and ``browser`` are in ``tests/conftest.py``.
"""
from __future__ import annotations

import re

import pytest
from bookpage import Visit, chart_texts, clashes, set_range

from batchlab.chapters import facts

pytestmark = pytest.mark.browser

PAGE = "notebooks/01_static_batching"
READOUT = re.compile(r"(padded token slots|batch time half empty): (\d+)%")


def _readout(chart) -> dict:
    return {m[1]: int(m[2]) / 100 for t in chart_texts(chart) if (m := READOUT.fullmatch(t.strip()))}


def _bars(chart) -> str:
    return chart.evaluate("el => [...el.querySelectorAll('g.mark-rect.role-mark path')].map(p => "
                          "p.getAttribute('d')).join('|')")


def test_the_slider_starts_at_cv1_and_rereads_the_waste(site, browser):
    v = Visit(browser, f"{site}/{PAGE}.html")
    try:
        chart = v.chart(0)
        slider = chart.locator(".vega-bindings input[type=range]")
        assert float(slider.input_value()) == 1.0
        assert chart.locator(".vega-bindings .batchlab-slider-value").inner_text().strip() == "1.00"
        at1 = _readout(chart)
        assert at1 == {"padded token slots": round(facts.value("pad_cv1"), 2),
                       "batch time half empty": round(facts.value("half_empty_cv1"), 2)}
        bars1 = _bars(chart)
        for cv, check in (("0", lambda r: r == {"padded token slots": 0, "batch time half empty": 0}),
                          ("2", lambda r: all(r[k] > at1[k] for k in at1))):
            before = chart.locator("svg").first.inner_html()
            set_range(slider, cv)
            v.page.wait_for_function("([id, old]) => document.querySelector('#' + id + ' svg').innerHTML !== old",
                                     arg=[chart.get_attribute("id"), before], timeout=10_000)
            assert check(_readout(chart)), (cv, _readout(chart))
            assert _bars(chart) != bars1  # the first batch is redrawn at the new spread
        assert not v.errors
    finally:
        v.close()


@pytest.mark.parametrize("width", [1280, 400])
def test_the_readout_lies_on_no_mark_at_any_cv(site, browser, width):
    v = Visit(browser, f"{site}/{PAGE}.html", width=width)
    try:
        chart = v.chart(0)
        slider = chart.locator(".vega-bindings input[type=range]")
        bad = []
        for cv in [f"{0.05 * i:.2f}" for i in range(41)]:
            set_range(slider, cv)
            v.page.wait_for_timeout(30)
            r = clashes(chart)
            if any(r.values()):
                bad.append((cv, r))
        assert not bad, f"at {width} px: {bad[:4]}"
    finally:
        v.close()
