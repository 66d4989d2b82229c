"""Chapter 11's goodput chart in a real browser: the SLO and the workload are radio buttons labelled in words
(the SLO by its bounds in ms), and picking one redraws the bars with that cell's goodputs, which a bar's tooltip
reads in req/s.

Needs the built book (``make book``, or ``scripts/build_pages.py notebooks/11_disaggregation`` with
``BATCHLAB_BOOK_HTML``) and Debian's Chromium; fixtures ``site`` and ``browser`` are in ``tests/conftest.py``.
"""
from __future__ import annotations

import pytest
from bookpage import redrawn

from batchlab.chapters import disaggregation as chapter

pytestmark = pytest.mark.browser

PAGE = "notebooks/11_disaggregation"




def _tooltip_of_bar(v, chart, config: str) -> str:
    """Hover each bar until the tooltip names ``config``; return the tooltip's text."""
    bars = chart.locator("g.mark-rect path")
    for i in range(bars.count()):
        bars.nth(i).hover()
        v.page.wait_for_timeout(200)
        tip = v.page.locator("#vg-tooltip-element").inner_text()
        if f"\n{config}\n" in tip:  # the configuration's value line
            return tip
    raise AssertionError(f"no bar of {config!r}")


def test_slo_and_workload_buttons(page):
    chart = page.chart(0)
    slo = chart.locator(".vega-bindings input[type=radio][name=slo_index]")
    assert slo.count() == len(chapter.SLOS) and slo.first.is_checked()  # the tightest SLO when the page opens
    labels = chart.locator(".vega-bindings .vega-bind-radio label").all_inner_texts()
    for ttft, tpot in chapter.SLOS:
        assert chapter.slo_label(ttft, tpot) in labels
    workload = chart.locator(".vega-bindings input[type=radio][name=workload_pick]")
    redrawn(page, chart, lambda: workload.nth(2).check())  # code
    win = chapter.chapter_winners()
    best = win.loc[("code", 0)]
    tip = _tooltip_of_bar(page, chart, best["best_split_config"])
    assert f"{best['best_split']:.2f}" in tip and "goodput per GPU (req/s)" in tip and "_" not in tip

    redrawn(page, chart, lambda: slo.nth(1).check())  # the middle SLO: colocated chunked prefill wins
    row = win.loc[("code", 1)]
    tip = _tooltip_of_bar(page, chart, row["winner"])
    assert f"{row['best_colocated']:.2f}" in tip and chapter.slo_label(*chapter.SLOS[1]) in tip


def test_prose_reads_the_winners_table_as_it_prints(page):
    """The page's sentence on code under the tight SLO quotes the two goodputs the winners table prints for that
    cell, to the same hundredth ("8.61 requests per second per GPU", not "8.6" beside the table's 8.61)."""
    best = chapter.chapter_winners().loc[("code", 0)]
    split, colocated = f"{best['best_split']:.2f}", f"{best['best_colocated']:.2f}"
    table = page.page.locator("table", has_text="best split (req/s per GPU)").inner_text()
    assert f"{split} ({best['best_split_config']})" in table and colocated in table
    prose = page.page.locator("p", has_text="requests per second per GPU").first.inner_text()
    assert f"{split} requests per second per GPU" in prose and f"colocated setting {colocated}" in prose, prose
