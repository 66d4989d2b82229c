"""Chapter 9's goodput map in a real browser: its three radio rows select one scene, SLO and load; under the stall
bound at 95 % of capacity the readout names the tuner's pick of the facts; on the code scene it says that no
setting holds the SLO, and the map marks no pick and its legend names none.

Needs the built book (``make book``, or ``scripts/build_pages.py notebooks/09_tuning`` with
``BATCHLAB_BOOK_HTML``) and Debian's Chromium; fixtures ``site`` and ``browser`` are in ``tests/conftest.py``.
"""
from __future__ import annotations

import pytest

import batchlab as bl
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
    assert goodput == (f"goodput: pick {facts.value('tuning_itl_pick_goodput_req_s'):.2f}, default "
                       f"{facts.value('tuning_itl_default_goodput_req_s'):.2f} req/s")
    assert served == f"(vLLM default served {facts.value('tuning_served_req_s'):.2f} req/s)"
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
