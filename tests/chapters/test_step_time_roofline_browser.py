"""Chapter 4's chart in a real browser: its batch slider moves the readout to the cost model's step time at that
batch and context, its context slider moves the knee markers and the readout's knees to CostModel.knee, no rule
of the chart crosses a text, and the page's display formulas fit a phone's column.

Needs the built book (``make book``, or ``scripts/build_pages.py notebooks/04_step_time_roofline`` with
``BATCHLAB_BOOK_HTML``) and Debian's Chromium; fixtures ``site`` and ``browser`` are in ``tests/conftest.py``.
"""
from __future__ import annotations

import re

import pytest
from bookpage import Visit, assert_formulas_fit_a_phone, set_range

import batchlab as bl

pytestmark = pytest.mark.browser

PAGE = "notebooks/04_step_time_roofline"
GPUS = {"H100 SXM": "h100-sxm", "H200": "h200"}  # the panels' headers -> hardware presets
MODEL = "llama-3-8b"  # the page's model, BF16
STEP = re.compile(r"step at ([\d,]+) sequences?(?: × ([\d,]+) tokens|, no cache)")
TIME = re.compile(r"(roofline|calibrated) ([\d,.]+) (ms|s)")  # viz.format_duration: "8.06 ms", "1.34 s"
KNEE = re.compile(r"knee ([\d,.]+)")

# Every text of the chart's svg with its box on the screen, in document order (panel by panel).
_TEXTS_JS = """el => [...el.querySelectorAll('svg text')].map(t => {
  const b = t.getBoundingClientRect();
  return {text: t.textContent.trim(), x: b.left, y: b.top};
}).filter(t => t.text)"""


# Every rule the chart draws as a mark (not axes): its view's name, its aria label ("batch size (sequences): 111.8;
# cost: roofline" for a knee, the batch alone for the batch marker) and its left edge on the screen.
_RULES_JS = """el => [...el.querySelectorAll('g.mark-rule.role-mark')].flatMap(g => [...g.querySelectorAll('line')]
  .map(l => ({view: g.getAttribute('class'), label: l.getAttribute('aria-label') || '',
              x: l.getBoundingClientRect().left})))"""
RULE = re.compile(r"batch size \(sequences\): ([\d,.]+)(?:; cost: (\w+))?")


def rules(chart, panel: int = 0) -> dict:
    """The marked batches of one panel (0: the first GPU's): ``"batch"`` -> (sequences, x px) for the batch
    marker and each cost model -> (sequences, x px) for its knee rule."""
    out = {}
    for r in chart.evaluate(_RULES_JS):
        m = RULE.fullmatch(r["label"])
        if m and f"concat_{panel}_" in r["view"]:
            out[m.group(2) or "batch"] = (_number(m.group(1)), r["x"])
    return out


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _costs(hardware: str) -> dict:
    calibrated = bl.CostModel(bl.get_hardware(hardware), bl.get_model(MODEL))
    return {"roofline": calibrated.ideal(), "calibrated": calibrated}


def panels(chart) -> dict:
    """GPU -> what its panel shows: ``batch`` and ``context`` of the readout, its step times in ms by cost
    model, and its knees as the readout reads them (value and left edge on the screen, px; roofline first)."""
    out, gpu = {}, None
    for t in chart.evaluate(_TEXTS_JS):
        text = t["text"]
        if text in GPUS:
            gpu = text
            out[gpu] = {"knees": []}
            continue
        if gpu is None:
            continue
        if m := STEP.fullmatch(text):
            out[gpu]["batch"], out[gpu]["context"] = _number(m.group(1)), _number(m.group(2) or "0")
        elif m := TIME.fullmatch(text):
            out[gpu][m.group(1)] = _number(m.group(2)) * (1e3 if m.group(3) == "s" else 1)  # ms
        elif m := KNEE.match(text):
            out[gpu]["knees"].append((_number(m.group(1)), t["x"]))
    return out



def _move(v, chart, slider, value) -> None:
    """Set ``slider`` to ``value`` and wait until the chart has redrawn."""
    before = chart.locator("svg").first.inner_html()
    set_range(slider, value)
    v.page.wait_for_function("([id, old]) => document.querySelector('#' + id + ' svg').innerHTML !== old",
                             arg=[chart.get_attribute("id"), before], timeout=10_000)


def _slider(chart, name: str):
    slider = chart.locator(f".vega-bindings input[type=range][name={name}]")
    assert slider.count() == 1, f"no slider {name}"
    return slider


def test_batch_slider_moves_the_readout_to_the_cost_models_step_time(page):
    chart = page.chart(0)
    slider = _slider(chart, "batch_step")
    lo, hi = int(float(slider.get_attribute("min"))), int(float(slider.get_attribute("max")))
    start = int(float(slider.input_value()))
    seen = set()
    for position in (lo, (lo + hi) // 3, start + 1, hi):
        _move(page, chart, slider, position)
        shown = slider.locator("xpath=following-sibling::*[1]").inner_text()  # the slider's label, in sequences
        read = panels(chart)
        assert set(read) == set(GPUS), read
        for gpu, panel in read.items():
            assert panel["batch"] == _number(shown), (shown, panel)
            for label, cm in _costs(GPUS[gpu]).items():
                want = cm.decode_step_time(panel["batch"], panel["context"]) * 1e3
                # three significant digits on the page
                assert panel[label] == pytest.approx(want, rel=5e-3), (gpu, label, panel, want)
        seen.add(read["H100 SXM"]["batch"])
        assert rules(chart)["batch"][0] == read["H100 SXM"]["batch"]  # the marker stands at the readout's batch
    assert len(seen) == 4  # every move showed another batch


def test_context_slider_moves_the_knee_marker(page):
    chart = page.chart(0)
    slider = _slider(chart, "context_step")
    where = {}
    for position in (slider.get_attribute("min"), slider.get_attribute("max")):
        _move(page, chart, slider, position)
        h100, marked = panels(chart)["H100 SXM"], rules(chart)
        costs = _costs("h100-sxm")
        for label, cm in costs.items():  # each curve's knee rule stands at CostModel.knee
            assert marked[label][0] == pytest.approx(cm.knee(h100["context"]), rel=1e-6), (label, marked)
        want = [round(costs[label].knee(h100["context"]), 1) for label in ("roofline", "calibrated")]
        assert [k for k, _ in h100["knees"]] == want, (h100, want)  # the readout's knees, one per cost model
        where[h100["context"]] = marked["roofline"][1]
    assert sorted(where) == [0, 16384]
    assert where[16384] < where[0] - 80  # from the ridge (295 sequences) to 7: the marker moved far to the left


# Every vertical rule the chart draws as a mark (knees, the batch marker) and every text of the chart, with their
# boxes on the screen: a rule that runs through a text makes it hard to read.
_RULES_AND_TEXTS_JS = """el => ({
  rules: [...el.querySelectorAll('g.mark-rule.role-mark line')].map(l => l.getBoundingClientRect())
    .map(b => ({x: b.left + b.width / 2, top: b.top, bottom: b.bottom})),
  texts: [...el.querySelectorAll('svg text')].filter(t => t.textContent.trim()).map(t => {
    const b = t.getBoundingClientRect();
    return {text: t.textContent.trim(), left: b.left, right: b.right, top: b.top, bottom: b.bottom};
  })})"""


def crossed(chart) -> list:
    """(text, rule x) for every text of ``chart`` a rule runs through."""
    found = chart.evaluate(_RULES_AND_TEXTS_JS)
    return [(t["text"], round(r["x"])) for r in found["rules"] for t in found["texts"]
            if t["left"] + 1 < r["x"] < t["right"] - 1 and r["top"] < t["bottom"] - 1 and t["top"] + 1 < r["bottom"]]


@pytest.mark.parametrize("width", [1280, 400])
def test_no_rule_crosses_a_text_at_any_slider_position(site, browser, width):
    v = Visit(browser, f"{site}/{PAGE}.html", width=width)
    try:
        chart = v.chart(0)
        batch, context = _slider(chart, "batch_step"), _slider(chart, "context_step")
        lo, hi = int(float(batch.get_attribute("min"))), int(float(batch.get_attribute("max")))
        clashes = []
        for c in range(int(float(context.get_attribute("max"))) + 1):
            _move(v, chart, context, c)
            for b in (lo, (lo + hi) // 2, hi):
                if batch.input_value() != str(b):
                    _move(v, chart, batch, b)
                clashes += [(c, b, *x) for x in crossed(chart)]
        assert not clashes, f"at {width} px rules cross texts: {clashes[:6]}"
    finally:
        v.close()


def test_display_formulas_fit_a_phone(site, browser):
    assert_formulas_fit_a_phone(browser, f"{site}/{PAGE}.html", at_least=5)
