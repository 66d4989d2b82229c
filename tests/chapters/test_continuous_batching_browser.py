"""Chapter 3's charts in a real browser: a hover on the Gantt chart and on the occupancy panels answers in words
with units (the phase and its times; the interval, the slots held and the rows generating), and at 1280 and 400 px
no text lies on a bar (the last request's end is in each panel's title) and nothing is drawn outside the svg.

Needs the built book (``make book``, or ``scripts/build_pages.py notebooks/03_continuous_batching`` with
``BATCHLAB_BOOK_HTML``) and Debian's Chromium; fixtures ``site`` and ``browser`` are in ``tests/conftest.py``.
"""
from __future__ import annotations

import re

import pytest
from bookpage import Visit, clashes

pytestmark = pytest.mark.browser

PAGE = "notebooks/03_continuous_batching"


def _hover_first(v, chart, selector: str) -> str:
    """Hover the middle of the first visible mark item matching ``selector``; the tooltip's text."""
    items = chart.locator(selector)
    for i in range(items.count()):
        items.nth(i).scroll_into_view_if_needed()
        box = items.nth(i).bounding_box()
        if box and box["width"] > 4 and box["height"] > 4:
            v.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            v.page.wait_for_function("() => { const t = document.getElementById('vg-tooltip-element');"
                                     " return t && t.classList.contains('visible') && t.innerText.trim(); }",
                                     timeout=5_000)
            return v.page.evaluate("() => document.getElementById('vg-tooltip-element').innerText")
    raise AssertionError(f"no mark item of {selector} to hover")


def test_gantt_and_occupancy_answer_a_hover(site, browser):
    v = Visit(browser, f"{site}/{PAGE}.html")
    try:
        gantt, occupancy = v.chart(0), v.chart(1)
        text = _hover_first(v, gantt, "g.mark-rect.role-mark path")
        assert all(word in text for word in ("policy", "request", "phase", "from (s)", "to (s)", "lasts"))
        lasts = re.search(r"lasts\s+([\d,.]+) (ms|s)\b", text)  # one unit, milliseconds only below a second
        assert lasts and (lasts[2] == "s" or float(lasts[1].replace(",", "")) < 1000), text
        v.page.mouse.move(0, 0)
        text = _hover_first(v, occupancy, "g.mark-rect.role-mark path")
        assert all(word in text for word in ("policy", "from (s)", "to (s)", "slots held", "rows generating"))
        assert "_" not in text  # no code names
        assert not v.errors
    finally:
        v.close()


@pytest.mark.parametrize("width", [1280, 400])
def test_no_text_lies_on_a_bar_at_either_width(site, browser, width):
    v = Visit(browser, f"{site}/{PAGE}.html", width=width)
    try:
        gantt = v.chart(0)
        titles = [t.strip() for t in gantt.locator("svg text").all_text_contents()]
        ends = [t for t in titles if re.fullmatch(r"(static|dynamic|continuous): the last request ends at "
                                                  r"[\d.]+ s", t)]
        assert len(ends) == 3, titles  # one per panel, above its bars
        for i in range(v.charts().count()):
            r = clashes(v.chart(i))
            assert not any(r.values()), (width, i, r)
        assert not v.errors
    finally:
        v.close()
