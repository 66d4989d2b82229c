"""Chapter 9's goodput map in a real browser: its three radio rows select one scene, SLO and load; under the stall
bound at 95 % of capacity the readout names the tuner's pick of the facts; on the code scene it says that no
setting holds the SLO, and the map marks no pick and its legend names none; every cell's label is the goodput as
the page's table prints it (the book's one rule for rates, batchlab.viz.format_rate).

Needs the built book (``make book``, or ``scripts/build_pages.py notebooks/09_tuning`` with
``BATCHLAB_BOOK_HTML``) and Debian's Chromium; fixtures ``site`` and ``browser`` are in ``tests/conftest.py``.
"""
from __future__ import annotations

import re
from collections import Counter

import bookpage
import pytest

import batchlab as bl
from batchlab import viz
from batchlab.chapters import facts
from batchlab.chapters import tuning as chapter

pytestmark = pytest.mark.browser

PAGE = "notebooks/09_tuning"
# The knob marks of the map (pick, default, refused pairs): their aria labels name the pair and its kind.
_MARKS_JS = """el => [...el.querySelectorAll('g.mark-symbol.role-mark')].flatMap(g =>
  [...g.querySelectorAll('path')].map(p => p.getAttribute('aria-label') || ''))"""



def _pick(v, chart, name: str, label: str) -> None:
    """Check the radio button ``label`` of the control ``name`` and wait for the map to redraw."""
    labels = chart.locator(f".vega-bindings label:has(input[name={name}])")
    texts = [t.strip() for t in labels.all_inner_texts()]
    assert texts.count(label) == 1, (name, label, texts)
    button = labels.nth(texts.index(label)).locator("input")
    if button.is_checked():
        return
    before = chart.locator("svg").first.inner_html()
    button.check()
    v.page.wait_for_function("([id, old]) => document.querySelector('#' + id + ' svg').innerHTML !== old",
                             arg=[chart.get_attribute("id"), before], timeout=10_000)


# Every line the chart's svg draws: a text of several lines is one <text> with a <tspan> per line.
_LINES_JS = """el => [...el.querySelectorAll('svg text')].flatMap(t => t.querySelector('tspan')
  ? [...t.querySelectorAll('tspan')].map(s => s.textContent) : [t.textContent])"""


def _readout(chart) -> list[str]:
    lines = chart.evaluate(_LINES_JS)
    return [t for t in lines if t.startswith(("pick:", "goodput:", "no setting", "(vLLM default served"))]


# The legend's labels, as drawn: a hidden label is drawn empty.
_LEGEND_JS = """el => [...el.querySelectorAll('g.role-legend-label text')].map(t => t.textContent)"""


def test_the_stall_bound_at_the_near_load_reads_the_pick_of_the_facts(page):
    chart = page.chart(0)
    _pick(page, chart, "workload_i", chapter.WORKLOADS["azure-conv-2023"])
    _pick(page, chart, "slo_i", facts.value("tuning_itl_slo"))
    _pick(page, chart, "load_i", chapter.LOADS[max(chapter.LOADS)])
    pick, goodput, served = _readout(chart)
    seqs, tokens = facts.value("tuning_itl_pick_max_num_seqs"), facts.value("tuning_itl_pick_max_num_batched_tokens")
    assert pick == f"pick: {seqs:,} sequences, {tokens:,} tokens"
    rate = viz.format_rate  # the book's one rule for rates, as the table beside the map prints them
    assert goodput == (f"goodput: pick {rate(facts.value('tuning_itl_pick_goodput_req_s'))}, default "
                       f"{rate(facts.value('tuning_itl_default_goodput_req_s'))} req/s")
    assert served == f"(vLLM default served {rate(facts.value('tuning_served_req_s'))} req/s)"
    labels = chart.evaluate(_MARKS_JS)
    assert sum("tuner's pick" in x for x in labels) == 1 and sum("vLLM default" in x for x in labels) == 1
    assert "tuner's pick" in chart.evaluate(_LEGEND_JS)


def test_the_code_scene_names_no_pick(page):
    chart = page.chart(0)
    for slo in chapter.SLOS:
        _pick(page, chart, "workload_i", chapter.WORKLOADS["azure-code-2023"])
        _pick(page, chart, "slo_i", chapter.slo_label(bl.parse_goodput(slo)))
        first, second, third = _readout(chart)
        assert first.startswith("no setting holds the p99s") and second.startswith("goodput: best ")
        assert third.startswith("(vLLM default served ")
        legend = chart.evaluate(_LEGEND_JS)  # no pick drawn, none named: the default and refused pairs stay
        assert "tuner's pick" not in legend and {"vLLM default", "refused by vLLM"} <= set(legend)
        labels = chart.evaluate(_MARKS_JS)
        assert not any("tuner's pick" in label for label in labels) and any("vLLM default" in x for x in labels)
    _pick(page, chart, "workload_i", chapter.WORKLOADS["azure-conv-2023"])  # and back: a pick again
    assert _readout(chart)[0].startswith("pick: ") and "tuner's pick" in chart.evaluate(_LEGEND_JS)


# The cells' labels, as drawn: texts of the map's text marks that are a number (the readout's lines are words).
_CELL_LABELS_JS = """el => [...el.querySelectorAll('g.mark-text.role-mark text')].map(t => t.textContent)"""


def test_every_cell_reads_its_goodput_as_the_table_does(page):
    """On the code scene under the stall bound at 50 % of capacity (goodputs from 0 to under 1 req/s, where the
    table and the map once printed one value as "0.0" and "0.05"), and on the conversation scene at 95 % (from 1
    to 18.5 req/s): the drawn labels are, string for string, viz.format_rate of the grid's goodputs (refused pairs
    unlabelled), and the default's label is the one the table and the readout print."""
    chart = page.chart(0)
    grid, picks = chapter.chapter_grid()
    for workload, slo, load in (("azure-code-2023", chapter.SLOS[1], min(chapter.LOADS)),
                                ("azure-conv-2023", chapter.SLOS[1], max(chapter.LOADS))):
        _pick(page, chart, "workload_i", chapter.WORKLOADS[workload])
        _pick(page, chart, "slo_i", chapter.slo_label(bl.parse_goodput(slo)))
        _pick(page, chart, "load_i", chapter.LOADS[load])
        at = grid[(grid["workload"] == workload) & (grid["slo"] == slo) & (grid["load"] == load)]
        want = Counter(viz.format_rate(v) for v in at.loc[~at["vllm_refuses"], "request_goodput"])
        drawn = Counter(t for t in chart.evaluate(_CELL_LABELS_JS) if re.fullmatch(r"[\d.,]+", t))
        assert drawn == want, (workload, slo, load)
        row = picks[(picks["workload"] == workload) & (picks["slo"] == slo) & (picks["load"] == load)].iloc[0]
        assert f"default {viz.format_rate(row['default_goodput'])} req/s" in _readout(chart)[1]
        table = page.page.locator("article table", has_text="pick / vLLM default, of served").inner_text()
        assert f" / {viz.format_rate(row['default_goodput'])} of {viz.format_rate(row['served_req_s'])}" in table



def test_on_a_phone_the_map_names_every_budget(site, browser):
    """At 400 px the map's budget axis labels every column, 8,192 (vLLM's default) among them."""
    v = bookpage.Visit(browser, f"{site}/{PAGE}.html", width=400)
    try:
        chart = v.chart(0)
        budgets = sorted(chapter.chapter_grid()[0]["max_num_batched_tokens"].unique())
        axes = bookpage.axis_labels(chart, "max_num_batched_tokens (tokens)")
        assert axes == [[f"{t:,}" for t in budgets]], axes
        assert not v.errors and not v.warnings, (v.errors, v.warnings)
    finally:
        v.close()
