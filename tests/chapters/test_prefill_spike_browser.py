"""Chapter 5's chart in a real browser: for every model and scheduler order, at 1280 and 400 px, no two tick labels
of an axis touch (the 70B run's time axis once printed "-0.20.0"), no rule runs through a text, and the largest
gap's label reads the run's gap.

Needs the built book (``make book``, or ``scripts/build_pages.py notebooks/05_prefill_spike`` with
``BATCHLAB_BOOK_HTML``) and Debian's Chromium; fixtures ``site`` and ``browser`` are in ``tests/conftest.py``.
"""
from __future__ import annotations

import itertools

import pytest
from bookpage import Visit, chart_texts, redrawn

from batchlab import viz
from batchlab.chapters import facts
from batchlab.chapters import prefill_spike as chapter

pytestmark = pytest.mark.browser

PAGE = "notebooks/05_prefill_spike"
MODELS = ("Llama-3-8B BF16", "Llama-3-70B FP8")  # the page's radio buttons
TICK_GAP_PX = 3.0  # two tick labels closer than this read as one number ("-0.20.0")

# Per axis of the chart, the screen boxes of the tick labels Vega shows (it hides some by opacity); and every
# rule and text drawn as a mark.
_LAYOUT_JS = """el => ({
  axes: [...el.querySelectorAll('g.role-axis')].map(a => [...a.querySelectorAll('g.role-axis-label text')]
    .filter(t => t.textContent.trim() && !t.closest('[opacity="0"]') && getComputedStyle(t).opacity !== '0')
    .map(t => {
      const b = t.getBoundingClientRect();
      return {text: t.textContent.trim(), box: [b.left, b.top, b.right, b.bottom]};
    })),
  rules: [...el.querySelectorAll('g.mark-rule.role-mark line')].map(l => {
    const b = l.getBoundingClientRect();
    return [b.left, b.top, b.right, b.bottom];
  }),
  texts: [...el.querySelectorAll('g.mark-text.role-mark text')].filter(t => t.textContent.trim()).map(t => {
    const b = t.getBoundingClientRect();
    return {text: t.textContent.trim(), box: [b.left, b.top, b.right, b.bottom]};
  })})"""


def _meet(a, b, pad: float = 1.0) -> bool:
    """Boxes (left, top, right, bottom) that share more than ``pad`` px both ways (a rule's box is a line); a
    negative ``pad`` also counts boxes closer than ``-pad`` px."""
    return a[0] < b[2] - pad and b[0] < a[2] - pad and a[1] < b[3] - pad and b[1] < a[3] - pad


def clashes(chart) -> list:
    found = chart.evaluate(_LAYOUT_JS)
    out = [("ticks", a["text"], b["text"]) for axis in found["axes"] for a, b in itertools.combinations(axis, 2)
           if _meet(a["box"], b["box"], pad=-TICK_GAP_PX)]
    for rule in found["rules"]:
        r = [rule[0] - 0.5, rule[1] - 0.5, rule[2] + 0.5, rule[3] + 0.5]  # a line's box has no width
        out += [("rule", t["text"]) for t in found["texts"] if _meet(r, t["box"])]
    return out


@pytest.mark.parametrize("width", [1280, 400])
def test_no_tick_labels_touch_and_no_rule_crosses_a_text(site, browser, width):
    v = Visit(browser, f"{site}/{PAGE}.html", width=width)
    try:
        chart = v.chart(0)
        seen = []
        for model, order in itertools.product(MODELS, chapter.SPIKE_ORDERS):
            for value in (model, order):
                button = chart.locator(f".vega-bindings input[type=radio][value='{value}']")
                if not button.is_checked():
                    redrawn(v, chart, button.check)
            texts = chart_texts(chart)
            gap = next(t for t in texts if t.startswith("one gap of "))
            seen.append(gap)
            found = clashes(chart)
            assert not found, f"{model}, {order} at {width} px: {found}"
        assert seen[0] == f"one gap of {viz.format_duration(facts.value('spike_gap_ms'))}"  # the 8B mixed step
        assert len(set(seen)) == 4  # every run shows its own gap
        assert not v.errors, v.errors
    finally:
        v.close()
