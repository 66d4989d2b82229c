"""Chapter 3's charts in a real browser: a hover on the Gantt chart and on the occupancy panels answers in words
with units (the phase and its times; the interval, the slots held and the rows generating).

Needs the built book (``make book``, or ``scripts/build_pages.py notebooks/03_continuous_batching`` with
``BATCHLAB_BOOK_HTML``) and Debian's Chromium; fixtures ``site`` and ``browser`` are in ``tests/conftest.py``.
"""
from __future__ import annotations

import pytest
from bookpage import Visit

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
        assert all(word in text for word in ("request", "phase", "from (s)", "to (s)", "lasts"))
        v.page.mouse.move(0, 0)
        text = _hover_first(v, occupancy, "g.mark-rect.role-mark path")
        assert all(word in text for word in ("policy", "from (s)", "to (s)", "slots held", "rows generating"))
        assert "_" not in text  # no code names
        assert not v.errors
    finally:
        v.close()
