"""Chapter 6's chart in a real browser: the budget slider moves the ring and the first-token label to that budget's
run; ticking chunking off disables the slider and shows the unchunked run; ticking it on enables it again. At every
budget and with chunking off, at 1280 and 400 px, no rule runs through a text (the first-token rule once crossed
its own label at 256 tokens).

Needs the built book (``make book``, or ``scripts/build_pages.py notebooks/06_chunked_prefill`` with
``BATCHLAB_BOOK_HTML``) and Debian's Chromium; fixtures ``site`` and ``browser`` are in ``tests/conftest.py``.
"""
from __future__ import annotations

import pytest
from bookpage import Visit, assert_formulas_fit_a_phone, chart_texts, redrawn, set_range

from batchlab import viz
from batchlab.chapters import facts

pytestmark = pytest.mark.browser

PAGE = "notebooks/06_chunked_prefill"




def _first_token(chart) -> str:
    (label,) = [t for t in chart_texts(chart) if t.startswith("first token after")]
    return label


def _ttft(name: str) -> str:
    return viz.format_duration(facts.value(name))  # the book's rule: "219 ms", "1.20 s"


def _bars_right(chart) -> float:
    """Right edge (px) of the rightmost bar of the timeline panel: how far along its time axis the gaps run."""
    return chart.evaluate("el => Math.max(...[...el.querySelectorAll('g.mark-rect path')]"
                          ".map(p => p.getBoundingClientRect()).filter(b => b.height > 0).map(b => b.right))")


def test_budget_slider_and_chunking_checkbox(page):
    chart = page.chart(0)
    slider = chart.locator(".vega-bindings input[type=range][name=log2_tokens]")
    box = chart.locator(".vega-bindings input[type=checkbox][name=chunking]")
    assert slider.count() == 1 and box.count() == 1 and box.is_checked() and slider.is_enabled()
    shown = slider.locator("xpath=following-sibling::*[1]")  # the slider's value, in tokens
    assert shown.inner_text() == "2,048"
    assert _first_token(chart) == f"first token after {_ttft('chunk_2048_ttft_ms')}"

    redrawn(page, chart, lambda: set_range(slider, 8))  # 2^8: 256 tokens, the latest first token
    full = _bars_right(chart)  # the time axis ends 0.1 s after it
    redrawn(page, chart, lambda: set_range(slider, 9))  # 2^9: 512 tokens
    assert shown.inner_text() == "512"
    assert _first_token(chart) == f"first token after {_ttft('chunk_512_ttft_ms')}"

    redrawn(page, chart, box.click)  # chunking off: the budget changes nothing, so the slider is disabled
    assert not box.is_checked() and slider.is_disabled()
    assert shown.inner_text() == "16,384, chunking off"  # the budget the chart now shows, not the slider's 512
    assert _first_token(chart) == f"first token after {_ttft('chunk_off_ttft_ms')}"
    assert _bars_right(chart) > full - 10  # the gaps run to the axis' end, not 0.1 s past this run's TTFT
    off = chart.locator("svg").first.inner_html()
    assert slider.locator("xpath=ancestor::*[contains(@class, 'vega-bind')][1]").get_attribute("class").count(
        "batchlab-disabled") == 1  # greyed out

    redrawn(page, chart, box.click)  # chunking on again: the slider is live and its budget is shown again
    assert box.is_checked() and slider.is_enabled() and shown.inner_text() == "512"
    assert _first_token(chart) == f"first token after {_ttft('chunk_512_ttft_ms')}"
    assert chart.locator("svg").first.inner_html() != off
    redrawn(page, chart, lambda: set_range(slider, 11))
    assert _first_token(chart) == f"first token after {_ttft('chunk_2048_ttft_ms')}"
    assert not page.errors, page.errors


# Every rule drawn as a mark and every text of the chart (marks, axes), with their boxes on the screen.
_LAYOUT_JS = """el => ({
  rules: [...el.querySelectorAll('g.mark-rule.role-mark line')].map(l => {
    const b = l.getBoundingClientRect();
    return [b.left - 0.5, b.top - 0.5, b.right + 0.5, b.bottom + 0.5];
  }),
  texts: [...el.querySelectorAll('svg text')].filter(t => t.textContent.trim()).map(t => {
    const b = t.getBoundingClientRect();
    return {text: t.textContent.trim(), box: [b.left, b.top, b.right, b.bottom]};
  })})"""


def crossed(chart) -> list:
    """(text, rule box) for every text of ``chart`` a rule runs through (1 px of slack each way)."""
    found = chart.evaluate(_LAYOUT_JS)
    return [(t["text"], [round(x) for x in r]) for r in found["rules"] for t in found["texts"]
            if r[0] < t["box"][2] - 1 and t["box"][0] < r[2] - 1 and r[1] < t["box"][3] - 1 and t["box"][1] < r[3] - 1]


@pytest.mark.parametrize("width", [1280, 400])
def test_no_rule_crosses_a_text_at_any_budget(site, browser, width):
    v = Visit(browser, f"{site}/{PAGE}.html", width=width)
    try:
        chart = v.chart(0)
        slider = chart.locator(".vega-bindings input[type=range][name=log2_tokens]")
        lo, hi = int(float(slider.get_attribute("min"))), int(float(slider.get_attribute("max")))
        found = {}
        for step in range(lo, hi + 1):
            if slider.input_value() != str(step):
                redrawn(v, chart, lambda s=step: set_range(slider, s))
            found[2 ** step] = crossed(chart)
        redrawn(v, chart, chart.locator(".vega-bindings input[type=checkbox]").click)
        found["chunking off"] = crossed(chart)
        assert len(found) == hi - lo + 2 and not any(found.values()), {k: x for k, x in found.items() if x}
    finally:
        v.close()


def test_display_formulas_fit_a_phone(site, browser):
    assert_formulas_fit_a_phone(browser, f"{site}/{PAGE}.html", at_least=4)
