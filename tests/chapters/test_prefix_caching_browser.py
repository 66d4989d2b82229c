"""Chapter 10's pool chart in a real browser: the pool slider shows its value in GiB and TiB, and moving it, or
picking another workload, redraws the TTFT bars with that run's numbers (the book's duration rule), which the
tooltips title in words.

Needs the built book (``make book``, or ``scripts/build_pages.py notebooks/10_prefix_caching`` with
``BATCHLAB_BOOK_HTML``) and Debian's Chromium; fixtures ``site`` and ``browser`` are in ``tests/conftest.py``.
"""
from __future__ import annotations

import pytest
from bookpage import redrawn, set_range

from batchlab import viz
from batchlab.chapters import prefix_caching as chapter

pytestmark = pytest.mark.browser

PAGE = "notebooks/10_prefix_caching"




def _bar_labels(workload: str, pool_gib: float | None) -> list[str]:
    """The four bar labels the chart should show for this workload and pool (None: vLLM's own; the page's sweep,
    from the cache)."""
    runs = chapter.chapter_sweep()
    runs = runs[runs["workload"] == workload]
    at = runs["default_pool"] if pool_gib is None else ~runs["default_pool"] & (runs["pool_gib"] == pool_gib)
    runs = runs[at]
    assert len(runs) == 2  # caching on and off
    return sorted(viz.format_duration(v) for v in runs[["median_ttft_ms", "p99_ttft_ms"]].to_numpy().ravel())


def _shown_bars(chart) -> list[str]:
    marks = chart.locator("svg g.mark-text.role-mark text").all_text_contents()  # not the ticks, which say "5 s"
    return sorted(t for t in marks if t.endswith((" ms", " s")) and t[0].isdigit())


def test_pool_slider_and_workload_buttons(page):
    chart = page.chart(0)
    slider = chart.locator(".vega-bindings input[type=range][name=pool_step]")
    assert slider.count() == 1
    shown = slider.locator("xpath=following-sibling::*[1]")  # the slider's value, in words
    own = chapter.chapter_sweep().query("default_pool")["pool_gib"].iloc[0]
    assert shown.inner_text() == f"vLLM's pool, {own:.1f} GiB"  # it opens on the pool the text is about
    assert _shown_bars(chart) == _bar_labels(chapter.MOONCAKE, None)

    redrawn(page, chart, lambda: set_range(slider, int(slider.get_attribute("max"))))  # the largest pool
    assert shown.inner_text() == "2 TiB"
    assert _shown_bars(chart) == _bar_labels(chapter.MOONCAKE, 2048)

    buttons = chart.locator(".vega-bindings input[type=radio]")
    assert [buttons.nth(i).get_attribute("value") for i in range(buttons.count())] == [
        chapter.MOONCAKE, chapter.SHARED_NAME, chapter.CHATS_NAME]
    redrawn(page, chart, lambda: buttons.nth(1).check())
    assert _shown_bars(chart) == _bar_labels(chapter.SHARED_NAME, 2048)


def test_bars_and_points_answer_a_hover_in_words(page):
    chart = page.chart(0)
    chart.locator("g.mark-rect path").first.hover()
    page.page.wait_for_timeout(300)
    tip = page.page.locator("#vg-tooltip-element").inner_text()
    assert "prefix caching" in tip and "time to first token" in tip and "_" not in tip
    chart.locator("g.mark-symbol path").nth(3).hover(force=True)
    page.page.wait_for_timeout(300)
    tip = page.page.locator("#vg-tooltip-element").inner_text()
    assert "KV pool\t\n" in tip and " GiB" in tip and "prefix-cache hit rate" in tip and "_" not in tip


def test_budget_chart_labels_its_lowest_line_and_reads_durations(page):
    """The budget chart's TTFT axis has a tick under the caching-on line (50 ms below its 64-85 ms), and a point's
    tooltip reads its p99 TTFT by the book's rule ("1.10 s", never "1,102 ms")."""
    budgets = chapter.chapter_budgets()
    chart = page.chart(1)
    axes = [a.locator("g.role-axis-label text").all_text_contents() for a in chart.locator("g.role-axis").all()]
    ttft_axis = next(labels for labels in axes if "1,000" in labels)
    lowest = budgets.loc[budgets["caching"], "p99_ttft_ms"].min()
    shown = [float(t.replace(",", "")) for t in ttft_axis if t]
    assert min(shown) <= lowest, (ttft_axis, lowest)  # the line sits above a labelled tick
    off = budgets[~budgets["caching"]].set_index("max_num_batched_tokens")["p99_ttft_ms"]
    want = viz.format_duration(off.loc[off.index.min()])  # the smallest budget without the cache: over a second
    assert want.endswith(" s")
    points = chart.locator("g.mark-symbol path")
    for i in range(points.count()):
        points.nth(i).hover(force=True)
        page.page.wait_for_timeout(150)
        tip = page.page.locator("#vg-tooltip-element").inner_text()
        if want in tip:
            break
    else:
        raise AssertionError(f"no point's tooltip reads {want!r}")
    assert "p99 time to first token" in tip and " ms" in tip and "_" not in tip.replace("max_num_batched_tokens", "")
    assert f"{off.loc[off.index.min()]:,.0f}" not in tip  # not the old "1,102"


def test_prose_reads_the_closed_loop_table_as_it_prints(page):
    """The sentence on the closed-loop runs quotes the shared system prompts' two throughputs as the table beside
    it prints them ("8.05 requests", not "8.0" above a table that says 8.05)."""
    table = page.page.locator("table", has_text="throughput (req/s)").inner_text()
    rows = [line.split("\t") for line in table.splitlines() if line.startswith(chapter.SHARED_NAME)]
    assert len(rows) == 2, table  # caching off and on
    header = next(line.split("\t") for line in table.splitlines() if "throughput (req/s)" in line)
    off, on = (row[header.index("throughput (req/s)")] for row in rows)
    prose = page.page.locator("p", has_text="requests per second").filter(has_text="instead of").first.inner_text()
    assert f"completes {on} requests per second instead of {off}" in prose, (prose, off, on)
