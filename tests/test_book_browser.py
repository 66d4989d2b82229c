"""The built book in a real browser: every page of the TOC opened in headless Chromium, served from 127.0.0.1.

Needs ``_build/html`` (``make book``) and Debian's ``/usr/bin/chromium`` driven by Playwright. Checks that no
page asks any other host for anything, that every chart container draws an svg or canvas, that nothing logs a
console error, that moving each slider, radio group or select box bound to a chart redraws it, and that no
control is labelled with an exponent. On every page of the TOC it also checks that

* every formula is rendered: each of Sphinx's math elements holds MathJax output, MathJax reports no TeX error,
  and no raw ``$$``, ``$...$`` or TeX command (``\\frac``, ``\\cdot``...) is left in the visible text outside code;
* no chart (its svg or canvas, or its controls) is wider than the text column, and the page never scrolls
  sideways (wide tables scroll inside the column), in a 1280 px and a 400 px window;
* no visible code cell only imports modules or calls ``glue(...)``: that plumbing belongs in a hidden cell
  (``remove-input``, or a collapsed ``hide-input``).

Saves a full-page PNG of every page at both widths to ``_build/screenshots/<page>-1280.png`` and
``<page>-400.png``, and of each page's first chart to ``_build/screenshots/<page>.png``, for a reviewer to look at.

To cover a new notebook: add it to ``_toc.yml`` (every TOC page is opened), and if its headline chart has bound
controls, give its line of ``CONTROLS`` the number of each kind.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml
from bookpage import CHART, HTML, MATH, ROOT, SCREENSHOTS, Visit, clashes, png_rgb, serve

pytestmark = pytest.mark.browser

WIDTHS = (1280, 400)  # a laptop window and a phone: every chart must fit the text column at both

# Page -> the controls bound to its charts, by kind: range sliders, radio groups, select boxes and checkboxes. The
# page must have exactly these, and moving each must redraw its chart (readouts included). One line per page: a
# chapter that adds a control changes its own line.
CONTROLS = {
    "notebooks/01_static_batching": {"range": 1},  # output-length CV
    "notebooks/02_dynamic_batching": {"range": 2, "select": 1},  # offered load, max queue delay; the latency metric
    "notebooks/03_continuous_batching": {"range": 1},  # the highlighted request
    "notebooks/04_step_time_roofline": {"range": 2},  # batch size (sequences); context per sequence (tokens)
    "notebooks/05_prefill_spike": {"radio": 2},  # model; scheduler order
    "notebooks/06_chunked_prefill": {"range": 1, "checkbox": 1},  # token budget; chunking on or off
    "notebooks/07_piggybacking": {"range": 2},  # the iteration picker; token budget of the split chart
    "notebooks/08_two_knobs": {"range": 2, "radio": 1},  # max_num_seqs, max_num_batched_tokens; one rate or all
    "notebooks/09_tuning": {"radio": 3},  # workload, SLO and load of the goodput map
    "notebooks/10_prefix_caching": {"range": 1, "radio": 1},  # KV pool (GiB); workload
    "notebooks/11_disaggregation": {"radio": 2},  # SLO; workload
    "notebooks/13_validation": {"select": 1},  # the measured set of the parity chart
    "notebooks/14_fact_check": {"range": 1},  # max_num_batched_tokens (tokens) of the chunking trade-off
}
CONTROL_SELECTORS = {"range": "input[type=range]", "radio": ".vega-bind-radio", "select": "select",
                     "checkbox": "input[type=checkbox]"}


def toc_pages() -> list[str]:
    """Every page of ``_toc.yml``, in order (paths without suffix)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                pages.append(entry["file"])
            walk(entry.get("chapters"))
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return [re.sub(r"\.(md|ipynb)$", "", p) for p in pages]


PAGES = toc_pages()


@pytest.fixture
def visit(site, browser, request):
    page = request.param
    v = Visit(browser, f"{site}/{page}.html")
    yield page, v
    v.close()


@pytest.fixture
def visit_at(site, browser, request):
    """A TOC page opened in a window ``width`` px wide (``request.param`` is ``(page, width)``)."""
    page, width = request.param
    v = Visit(browser, f"{site}/{page}.html", width=width)
    yield page, width, v
    v.close()


def test_toc_pages_were_built():
    missing = [p for p in PAGES if not (HTML / f"{p}.html").exists()]
    assert (HTML / "index.html").exists(), "no _build/html/index.html: run `make book` first"
    assert not missing, f"pages in _toc.yml with no HTML (run `make book`): {missing}"


def test_control_pages_are_in_toc():
    assert set(CONTROLS) <= set(PAGES), "CONTROLS names a page that is not in _toc.yml"


@pytest.mark.parametrize("visit", PAGES, indirect=True)
def test_page_is_offline_and_every_chart_draws(visit):
    page, v = visit
    ids = v.wait_all_drawn()
    assert len(ids) == len(set(ids)), f"{page}: duplicate chart ids {ids}"
    controls = v.page.locator(f"{CHART} .vega-bind").all_inner_texts()
    assert not [t for t in controls if "2^" in t], f"{page}: a control shows an exponent: {controls}"
    try:  # late requests (to any host) would show up here
        v.page.wait_for_load_state("networkidle", timeout=60_000)
    except Exception:  # Playwright's idle signal can stall on a loaded machine: trust the request log instead
        v.page.wait_for_timeout(1_000)
        assert not v.pending, f"{page}: requests still open after 60 s: {sorted(v.pending)}"
    assert not v.blocked, f"{page} asked other hosts for: {v.blocked}"
    assert all(u.startswith(("http://127.0.0.1:", "data:", "blob:")) for u in v.requests), v.requests
    assert not v.errors, f"{page}: console errors {v.errors}"
    if ids:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        v.charts().first.screenshot(path=str(SCREENSHOTS / f"{Path(page).name}.png"))


# -- formulas -------------------------------------------------------------------------------------------------

# Text a reader sees, outside code, charts and MathJax's own output, that still looks like TeX.
_RAW_TEX_JS = r"""() => {
  const root = document.querySelector('article.bd-article') || document.body;
  const skip = 'pre, code, script, style, textarea, svg, mjx-container, .highlight';
  const shown = el => el.checkVisibility ? el.checkVisibility() : el.getClientRects().length > 0;
  const tex = /\$\$|\$[^$\s][^$]*\$|\\[A-Za-z]+/;
  const found = [];
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    if (!el || el.closest(skip) || !shown(el)) continue;
    const m = node.textContent.match(tex);
    if (m) found.push(node.textContent.slice(Math.max(0, m.index - 30), m.index + 50).trim());
  }
  return found;
}"""


@pytest.mark.parametrize("visit", PAGES, indirect=True)
def test_every_formula_is_rendered(visit):
    page, v = visit
    v.wait_math()
    math = v.page.locator(MATH)
    unrendered = math.evaluate_all(
        "els => els.filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.trim().slice(0, 80))")
    assert not unrendered, f"{page}: formulas MathJax did not typeset: {unrendered}"
    assert v.page.locator("mjx-container").count() >= math.count()
    tex_errors = v.page.locator("mjx-merror").evaluate_all(
        "els => els.map(e => e.getAttribute('data-mjx-error') || e.textContent)")
    assert not tex_errors, f"{page}: MathJax could not read a formula: {tex_errors}"
    raw = v.page.evaluate(_RAW_TEX_JS)
    assert not raw, f"{page}: raw TeX in the page text (write it as $...$ or $$...$$): {raw}"
    assert not v.errors, f"{page}: console errors {v.errors}"


# -- charts fit the text column; full-page screenshots ----------------------------------------------------------
# Each chart's svg or canvas and its controls, against the content box of the article column (and the window).
_OVERFLOW_JS = r"""() => {
  const out = [];
  for (const chart of document.querySelectorAll('div[id^=batchlab-chart-]')) {
    const col = chart.closest('article.bd-article') || chart.closest('main') || document.body;
    const cs = getComputedStyle(col), r = col.getBoundingClientRect();
    const left = Math.max(0, r.left + parseFloat(cs.paddingLeft));
    const right = Math.min(document.documentElement.clientWidth, r.right - parseFloat(cs.paddingRight));
    const parts = chart.querySelectorAll('svg.marks, canvas.marks, .vega-bindings');
    if (!chart.querySelector('svg.marks, canvas.marks')) out.push({chart: chart.id, problem: 'no svg or canvas'});
    for (const el of parts) {
      const b = el.getBoundingClientRect();
      if (b.width > right - left + 1 || b.left < left - 1 || b.right > right + 1) {
        out.push({chart: chart.id, element: el.tagName.toLowerCase() + '.' + el.getAttribute('class'),
                  width: Math.round(b.width), left: Math.round(b.left), right: Math.round(b.right),
                  column: [Math.round(left), Math.round(right)]});
      }
    }
  }
  return out;
}"""

PAGES_AT_WIDTHS = [(page, width) for page in PAGES for width in WIDTHS]


@pytest.mark.parametrize("visit_at", PAGES_AT_WIDTHS, indirect=True, ids=[f"{p}-{w}" for p, w in PAGES_AT_WIDTHS])
def test_charts_fit_the_text_column(visit_at):
    """Every chart fits the text column at this width; a full-page screenshot is saved first, pass or fail."""
    page, width, v = visit_at
    v.wait_all_drawn()
    v.wait_math()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    v.page.screenshot(path=str(SCREENSHOTS / f"{Path(page).name}-{width}.png"), full_page=True)
    wide = v.page.evaluate(_OVERFLOW_JS)
    assert not wide, f"{page} at {width} px: charts wider than the text column: {wide}"
    sideways = v.page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert sideways <= 0, f"{page} at {width} px: the page scrolls sideways by {sideways} px (a wide table or word)"
    assert not v.errors, f"{page} at {width} px: console errors {v.errors}"
    assert not v.warnings, f"{page} at {width} px: console warnings (Vega's, say an empty layer's) {v.warnings}"


# -- no plumbing on the page --------------------------------------------------------------------------------------
_PLUMBING_PREFIXES = ("import ", "from ", "glue(")


def only_imports_or_glue(source: str) -> bool:
    """True if a code cell does nothing a reader needs to see: every non-blank, non-comment line starts with
    ``import``, ``from`` or ``glue(``, or (for statements over several lines) every statement is an import or
    a ``glue(...)`` call. An empty cell is not counted."""
    code = [line.strip() for line in source.splitlines()]
    code = [line for line in code if line and not line.startswith("#")]
    if not code:
        return False
    if all(line.startswith(_PLUMBING_PREFIXES) for line in code):
        return True
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython magics, a fragment
        return False
    return all(isinstance(node, (ast.Import, ast.ImportFrom))
               or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                   and isinstance(node.value.func, ast.Name) and node.value.func.id == "glue")
               for node in tree.body)


def test_only_imports_or_glue_tells_plumbing_from_code():
    assert only_imports_or_glue("import numpy as np\nfrom myst_nb import glue\n\n# numbers\nglue('a', 1)\n")
    assert only_imports_or_glue("from batchlab import (\n    viz,\n    sim,\n)\nglue('knee', knee,\n display=False)")
    assert not only_imports_or_glue("import batchlab as bl\nres = bl.simulate(reqs, 'chunked', cost)")
    assert not only_imports_or_glue("chart = fig(res)\nglue('chart', chart)")
    assert not only_imports_or_glue("# nothing to run\n\n")


# Each code cell's input, and whether a reader sees it (a collapsed hide-input cell is not seen).
_CELL_INPUTS_JS = r"""() => [...document.querySelectorAll('div.cell')].map((cell, i) => {
  const input = cell.querySelector('div.cell_input');
  if (!input) return null;
  const r = input.getBoundingClientRect();
  const shown = r.width > 0 && r.height > 0 && (!input.checkVisibility || input.checkVisibility());
  const pre = input.querySelector('pre');
  return {cell: i + 1, shown, source: (pre || input).textContent};
}).filter(c => c)"""


@pytest.mark.parametrize("visit", PAGES, indirect=True)
def test_no_visible_cell_only_imports_or_glues(visit):
    page, v = visit
    cells = v.page.evaluate(_CELL_INPUTS_JS)
    plumbing = [f"cell {c['cell']}: {c['source'].strip()[:60]!r}" for c in cells
                if c["shown"] and only_imports_or_glue(c["source"])]
    assert not plumbing, f"{page}: visible code cells that only import or glue (hide them): {plumbing}"


def _redraws(v, page, control, change, shot: str):
    """Apply ``change`` to a control bound to a chart and wait until that chart's svg differs."""
    chart = control.locator("xpath=ancestor::div[starts-with(@id, 'batchlab-chart-')][1]")
    chart_id = chart.get_attribute("id")
    v.wait_drawn(chart_id)
    before = chart.locator("svg").first.inner_html()
    change(control)
    v.page.wait_for_function(
        "([id, old]) => { const s = document.querySelector('#' + id + ' svg'); return s && s.innerHTML !== old; }",
        arg=[chart_id, before], timeout=10_000)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    chart.screenshot(path=str(SCREENSHOTS / f"{Path(page).name}-{shot}.png"))


def _move_slider(slider):
    target = slider.get_attribute("max") if slider.input_value() != slider.get_attribute("max") \
        else slider.get_attribute("min")
    slider.evaluate("(el, value) => { el.value = value; el.dispatchEvent(new Event('input', {bubbles: true}));"
                    " el.dispatchEvent(new Event('change', {bubbles: true})); }", target)


def _pick_other_option(select):
    options = select.locator("option").evaluate_all("opts => opts.map(o => o.value)")
    select.select_option(next(o for o in options if o != select.input_value()))


def _pick_other_button(group):
    group.locator("input[type=radio]:not(:checked)").first.check()


def _toggle(box):
    box.click()


CHANGES = {"range": _move_slider, "radio": _pick_other_button, "select": _pick_other_option, "checkbox": _toggle}
CONTROL_CASES = [(page, kind) for page, kinds in CONTROLS.items() for kind in kinds]


@pytest.mark.parametrize("visit, kind", CONTROL_CASES, indirect=["visit"],
                         ids=[f"{p}-{k}" for p, k in CONTROL_CASES])
def test_every_bound_control_redraws_its_chart(visit, kind):
    """The page has exactly its controls of this kind, and each one, moved, redraws its chart."""
    page, v = visit
    v.wait_all_drawn()
    controls = v.page.locator(f"{CHART} .vega-bindings {CONTROL_SELECTORS[kind]}")
    assert controls.count() == CONTROLS[page][kind], f"{page}: {controls.count()} {kind} controls"
    for i in range(controls.count()):
        if controls.nth(i).is_disabled():
            continue  # disabled in this state (a checkbox elsewhere turns it on)
        _redraws(v, page, controls.nth(i), CHANGES[kind], f"{kind}{i + 1}")
    assert not v.errors, f"{page}: console errors {v.errors}"
    assert not v.warnings, f"{page}: console warnings after moving each {kind} control: {v.warnings}"


def test_pages_have_no_controls_beyond_the_listed_ones(site, browser):
    for page in PAGES:
        if page in CONTROLS:
            continue
        v = Visit(browser, f"{site}/{page}.html")
        try:
            v.wait_all_drawn()
            assert v.page.locator(f"{CHART} .vega-bindings input, {CHART} .vega-bindings select").count() == 0, page
        finally:
            v.close()


_EXTERNAL_ASSET = re.compile(
    r"<script\b[^>]*\bsrc\s*=\s*[\"']?(https?:)?//|<link\b[^>]*\bhref\s*=\s*[\"']?(https?:)?//[^>]*>"
    r"|@import\s+[\"']?(url\()?[\"']?(https?:)?//|@font-face[^}]*url\(\s*[\"']?(https?:)?//", re.IGNORECASE)


def test_built_html_references_no_external_script_style_or_font():
    pages = sorted(HTML.rglob("*.html"))
    assert pages, "no built HTML: run `make book` first"
    offenders = {}
    for path in pages + sorted((HTML / "_static").rglob("*.css")):
        hits = [m.group(0)[:120] for m in _EXTERNAL_ASSET.finditer(path.read_text(encoding="utf-8", errors="replace"))]
        hits = [h for h in hits if not re.search(r"rel=[\"']?(canonical|alternate)", h)]
        if hits:
            offenders[str(path.relative_to(HTML))] = hits
    assert not offenders, f"external assets: {offenders}"


def test_pages_use_the_shared_library_not_an_inline_copy():
    """In the book the library comes from _static once; a page that inlines it means BATCHLAB_BOOK was lost."""
    assert (HTML / "_static" / "batchlab-vega.js").stat().st_size > 100_000
    for page in PAGES:
        text = (HTML / f"{page}.html").read_text(encoding="utf-8")
        assert "data-batchlab-library" not in text, f"{page} inlines the chart library"
        if "batchlab-chart-" in text:
            assert "_static/batchlab-vega.js" in text, f"{page} has charts but does not load the library"


def test_live_kernel_output_draws_without_the_book(browser, tmp_path):
    """What a live kernel shows (first chart carries the library, the second relies on it) draws offline."""
    import subprocess
    import sys

    script = ("import os; os.environ.pop('BATCHLAB_BOOK', None)\n"
              "import pandas as pd, altair as alt; import batchlab.viz as viz\n"
              "df = pd.DataFrame({'x': [1, 2, 3], 'y': [3, 1, 2]})\n"
              "for mark in ('mark_line', 'mark_bar'):\n"
              "    print(getattr(alt.Chart(df), mark)().encode(x='x', y='y')._repr_mimebundle_()['text/html'])\n")
    html = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert html.count("data-batchlab-library") == 1
    page_file = tmp_path / "live.html"
    page_file.write_text(f"<!doctype html><html><body>{html}</body></html>", encoding="utf-8")
    context = browser.new_context()
    page = context.new_page()
    errors, foreign = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("request", lambda r: foreign.append(r.url) if not r.url.startswith(("file:", "data:", "blob:")) else None)
    page.goto(page_file.as_uri())
    for n in (1, 2):
        page.wait_for_selector(f"#batchlab-chart-{n} svg", state="attached", timeout=15_000)
    context.close()
    assert not errors and not foreign, (errors, foreign)


# -- charts are readable: text size, overlaps, cut labels, separators -------------------------------------------
MIN_TEXT_PX = 7.0  # the smallest chart text a reader can read on a phone

# Every text of every chart: its rendered size (font size times the svg's scale on screen), its box, its role.
_CHART_TEXT_JS = r"""() => {
  const out = [];
  for (const chart of document.querySelectorAll('div[id^=batchlab-chart-]')) {
    const svg = chart.querySelector('svg.marks');
    if (!svg) continue;
    for (const t of svg.querySelectorAll('text')) {
      const text = t.textContent.trim();
      if (!text || t.closest('[opacity="0"]') || getComputedStyle(t).opacity === '0') continue;
      const m = t.getScreenCTM();
      const scale = m ? Math.hypot(m.a, m.b) : 1;
      const size = parseFloat(t.getAttribute('font-size') || getComputedStyle(t).fontSize) * scale;
      const b = t.getBoundingClientRect();
      const group = t.closest('g[class*="role-"]');
      const role = group ? [...group.classList].filter(c => c.startsWith('role-')).join(' ') : '';
      const mark = t.closest('g.mark-text') && role.includes('role-mark') ? 'mark-text' : '';  // not axes, legends
      out.push({chart: chart.id, text, px: Math.round(size * 10) / 10, role, mark,
                box: [b.left, b.top, b.right, b.bottom]});
    }
  }
  return out;
}"""


def _same_place(a, b) -> bool:
    return all(abs(x - y) < 1.0 for x, y in zip(a, b))


def _overlaps(a, b) -> bool:
    (l1, t1, r1, b1), (l2, t2, r2, b2) = a, b
    pad = 0.5
    return l1 < r2 - pad and l2 < r1 - pad and t1 < b2 - pad and t2 < b1 - pad


@pytest.mark.parametrize("visit_at", PAGES_AT_WIDTHS, indirect=True, ids=[f"{p}-{w}" for p, w in PAGES_AT_WIDTHS])
def test_chart_text_is_readable_and_whole(visit_at):
    """At this width every chart's text is at least 7 px tall; no text label of a mark overlaps another; no label,
    title or legend entry is cut short ("…"); no axis number of five digits or more lacks thousands separators."""
    page, width, v = visit_at
    v.wait_all_drawn()
    texts = v.page.evaluate(_CHART_TEXT_JS)
    small = sorted({(t["chart"], t["text"][:30], t["px"]) for t in texts if t["px"] < MIN_TEXT_PX})
    assert not small, f"{page} at {width} px: chart text under {MIN_TEXT_PX} px: {small[:12]}"
    cut = sorted({(t["chart"], t["text"]) for t in texts if t["text"].endswith(("…", "..."))})
    assert not cut, f"{page} at {width} px: chart text cut short: {cut}"
    bare = sorted({(t["chart"], t["text"]) for t in texts if "axis-label" in t["role"]
                   and re.fullmatch(r"-?\d{5,}(\.\d+)?", t["text"])})
    assert not bare, f"{page} at {width} px: axis numbers without thousands separators: {bare}"
    labels = [t for t in texts if t["mark"]]
    clash = [(a["chart"], a["text"][:24], b["text"][:24]) for i, a in enumerate(labels) for b in labels[i + 1:]
             if a["chart"] == b["chart"] and _overlaps(a["box"], b["box"])
             and not (a["text"] == b["text"] and _same_place(a["box"], b["box"]))]  # one label drawn twice
    assert not clash, f"{page} at {width} px: text labels of a chart overlap: {clash[:8]}"


# Clashes a page means: (page, chart index, the text ``bookpage.clashes`` reports, matched whole as a regular
# expression) -> why. Keep each entry to one chart and one kind of text; never widen a tolerance instead.
CLASHES_ALLOWED: dict[tuple[str, int, str], str] = {
    ("notebooks/09_tuning", 0, r"\d+(\.\d+)? \| bar"):
        "the goodput map prints each cell's goodput (req/s) inside its own cell, in a colour read on that cell",
}


def _allowed(page: str, index: int, item: str) -> bool:
    return any(p == page and i == index and re.fullmatch(text, item) for p, i, text in CLASHES_ALLOWED)


def _chart_problems(v, page: str, index: int, state: str) -> list[tuple]:
    """What ``bookpage.clashes`` finds in the page's ``index``-th chart, less the allowed ones."""
    found = clashes(v.charts().nth(index))
    out = [(state, index, "wider", "svg wider than its column")] if found.pop("wider") else []
    return out + [(state, index, kind, item) for kind, items in found.items() for item in items
                  if not (kind == "clashes" and _allowed(page, index, item))]


@pytest.mark.parametrize("visit_at", PAGES_AT_WIDTHS, indirect=True, ids=[f"{p}-{w}" for p, w in PAGES_AT_WIDTHS])
def test_no_chart_text_lies_on_a_mark_in_any_control_state(visit_at):
    """In every chart, as the page opens and after each control bound to it is moved once (in page order, each
    move kept): no text of a mark lies on a line, rule, point or bar; nothing is drawn outside the svg; no two tick
    labels of an axis run together; no two legend entries overlap (``bookpage.clashes``)."""
    page, width, v = visit_at
    ids = v.wait_all_drawn()
    bad = [p for i in range(len(ids)) for p in _chart_problems(v, page, i, "first state")]
    controls = v.page.locator(f"{CHART} .vega-bindings :is({', '.join(CONTROL_SELECTORS.values())})")
    for n in range(controls.count()):
        control = controls.nth(n)
        kind = next(k for k, sel in CONTROL_SELECTORS.items() if control.evaluate("(el, s) => el.matches(s)", sel))
        if kind != "radio" and control.is_disabled():
            continue  # disabled in this state (a checkbox elsewhere turns it on)
        chart_id = control.locator("xpath=ancestor::div[starts-with(@id, 'batchlab-chart-')][1]").get_attribute("id")
        before = v.page.locator(f"#{chart_id} svg").first.inner_html()
        CHANGES[kind](control)
        v.page.wait_for_function(
            "([id, old]) => { const s = document.querySelector('#' + id + ' svg'); return s && s.innerHTML !== old; }",
            arg=[chart_id, before], timeout=10_000)
        name = control.get_attribute("name") or control.locator("input").first.get_attribute("name")
        bad += _chart_problems(v, page, ids.index(chart_id), f"after moving {kind} {name!r}")
    assert not bad, f"{page} at {width} px: chart layout clashes (state, chart index, kind, what): {bad[:12]}"
    assert not v.errors, f"{page} at {width} px: console errors {v.errors}"


_TABLES_JS = r"""() => [...document.querySelectorAll('article table')].map(t => ({
  head: (t.querySelector('th') || {}).textContent, scroll: t.scrollWidth, box: t.parentElement.clientWidth,
  stacked: t.classList.contains('batchlab-stacked')}))"""


# Pages whose charts carry the widest tooltips (several fields of words): on a phone each stays on the screen.
TOOLTIP_PAGES = ["notebooks/01_static_batching", "notebooks/04_step_time_roofline", "notebooks/11_disaggregation"]
_TIP_JS = """() => { const t = document.getElementById('vg-tooltip-element');
  if (!t || !t.classList.contains('visible')) { return null; }
  const b = t.getBoundingClientRect(); return [b.left, b.right, document.documentElement.clientWidth]; }"""


@pytest.mark.parametrize("visit_at", [(p, 400) for p in TOOLTIP_PAGES], indirect=True,
                         ids=[f"{p}-400" for p in TOOLTIP_PAGES])
def test_tooltips_stay_on_a_phone_screen(visit_at):
    """vega-tooltip flips a tooltip to the left of the pointer near the right edge, with no clamp: on a 400 px
    screen a wide one started past the left edge (down to -115 px), its titles cut off. batchlab/viz.js clamps it.
    Hovers marks spread across every chart and checks each tooltip lies within the screen."""
    page, width, v = visit_at
    seen, off = 0, []
    for chart_id in v.wait_all_drawn():
        v.page.locator(f"#{chart_id}").scroll_into_view_if_needed()
        marks = v.page.locator(f"#{chart_id} g.mark-symbol path, #{chart_id} g.mark-rect path")
        boxes = [b for b in (marks.nth(i).bounding_box() for i in range(min(marks.count(), 80))) if b]
        boxes = [b for b in boxes if b["width"] > 2 and b["height"] > 2 and 0 < b["y"] + b["height"] / 2 < 860]
        boxes = sorted(boxes, key=lambda b: b["x"])
        for b in boxes[::max(1, len(boxes) // 12)]:  # spread across the chart: a tooltip flips left past mid-screen
            v.page.mouse.move(b["x"] + b["width"] / 2, b["y"] + b["height"] / 2)
            v.page.wait_for_timeout(120)
            tip = v.page.evaluate(_TIP_JS)
            if tip is None:
                continue
            seen += 1
            if tip[0] < -0.5 or tip[1] > tip[2] + 0.5:
                off.append((chart_id, [round(x) for x in tip]))
    assert seen >= 5, f"{page}: only {seen} tooltips shown"
    assert not off, f"{page}: tooltips off the screen (left, right, screen width): {off[:6]}"


@pytest.mark.parametrize("visit_at", [(p, 400) for p in PAGES], indirect=True, ids=[f"{p}-400" for p in PAGES])
def test_every_table_column_is_visible_on_a_phone(visit_at):
    """At 400 px no table hides columns behind a sideways scroll: a wide one is stacked, one block per row."""
    page, _, v = visit_at
    hidden = [t for t in v.page.evaluate(_TABLES_JS) if t["scroll"] > t["box"] + 1]
    assert not hidden, f"{page} at 400 px: tables wider than the column: {hidden}"


# -- a book, not a folder of notebooks ------------------------------------------------------------------------------
CHAPTER_PAGES = [p for p in PAGES if p.startswith("notebooks/")]
MAX_OPEN_CELLS = 2  # code cells a chapter shows open: the ones that teach the API


@pytest.mark.parametrize("visit", CHAPTER_PAGES, indirect=True)
def test_at_most_two_code_cells_are_open(visit):
    page, v = visit
    shown = [c for c in v.page.evaluate(_CELL_INPUTS_JS) if c["shown"]]
    assert len(shown) <= MAX_OPEN_CELLS, (
        f"{page}: {len(shown)} code cells open (fold the others with hide-input): "
        f"{[c['source'].strip()[:50] for c in shown]}")


def test_chapters_are_numbered_in_reading_order(site, browser):
    """Every chapter's title carries its number, the file's number, and the sidebar lists them in that order."""
    v = Visit(browser, f"{site}/book/intro.html")
    try:
        entries = v.page.evaluate(r"""() => [...document.querySelectorAll('nav.bd-docs-nav a.reference')]
            .map(a => ({href: a.getAttribute('href'), text: a.textContent.trim()}))""")
    finally:
        v.close()
    numbered = [(e["href"].removeprefix("../"), e["text"]) for e in entries if "notebooks/" in e["href"]]
    assert len(numbered) == len(CHAPTER_PAGES)
    for (href, text), page in zip(numbered, CHAPTER_PAGES):
        n = int(Path(page).name[:2])
        assert href.split("#")[0] == f"{page}.html" and text.startswith(f"{n}. "), (href, text, page)
    for page in CHAPTER_PAGES:
        html = (HTML / f"{page}.html").read_text(encoding="utf-8")
        h1 = next(h for h in re.findall(r"<h1>(.*?)</h1>", html, re.S) if "headerlink" in h)  # the page's, not print's
        assert f'<span class="section-number">{int(Path(page).name[:2])}. </span>' in h1, (page, h1[:120])


_TABLE_FIT_JS = r"""() => [...document.querySelectorAll('article table')].map(t => ({
  head: (t.querySelector('th') || {}).textContent, scroll: t.scrollWidth, box: t.parentElement.clientWidth,
  stacked: t.classList.contains('batchlab-stacked'),
  cut: [...t.querySelectorAll('th, td')].filter(c => c.getBoundingClientRect().right
       > t.parentElement.getBoundingClientRect().right + 1).map(c => c.textContent.trim().slice(0, 30))}))"""


@pytest.mark.parametrize("visit", PAGES, indirect=True)
def test_every_table_fits_the_text_column_at_1280(visit):
    """In a desktop column a table keeps its rows as rows (stacking is for phones) and shows every column without a
    sideways scroll: no cell's right edge passes the column's (chapter 8's ratio column was hidden that way)."""
    page, v = visit
    tables = v.page.evaluate(_TABLE_FIT_JS)
    stacked = [t["head"] for t in tables if t["stacked"]]
    assert not stacked, f"{page} at 1280 px: tables stacked one block per row: {stacked}"
    wide = [(t["head"], t["scroll"], t["box"], t["cut"][:4]) for t in tables if t["scroll"] > t["box"] + 1 or t["cut"]]
    assert not wide, f"{page} at 1280 px: tables wider than the text column (head, width, column, cut cells): {wide}"


RADIO_PAGES = [p for p, kinds in CONTROLS.items() if "radio" in kinds]


@pytest.mark.parametrize("visit", RADIO_PAGES, indirect=True)
def test_dark_mode_shows_which_radio_button_is_selected(visit):
    """In dark mode a chart's checked radio button reads as checked: its centre is filled with the accent colour,
    and an unchecked one is hollow, its centre the colour of what surrounds it. (Chromium's dark scheme drew the
    unchecked one as a filled dark disc on the light card, the checked one as a pale ring: read the wrong way
    round.)"""
    page, v = visit
    v.wait_all_drawn()
    v.page.evaluate("() => document.documentElement.setAttribute('data-theme', 'dark')")
    group = v.page.locator(".batchlab-chart .vega-bind-radio").first
    checked = group.locator("input[type=radio]:checked").first
    unchecked = group.locator("input[type=radio]:not(:checked)").first
    checked.scroll_into_view_if_needed()
    v.page.mouse.move(0, 0)  # no hover highlight on either

    def centre(radio):  # mean colour of the button's middle 4 x 4 pixels, and of its corner (what surrounds it)
        rgb = png_rgb(radio.screenshot()).astype(float)
        h, w = rgb.shape[:2]
        return rgb[h // 2 - 2:h // 2 + 2, w // 2 - 2:w // 2 + 2].reshape(-1, 3).mean(axis=0), rgb[0, 0]

    on, _ = centre(checked)
    off, around = centre(unchecked)
    assert on.max() - on.min() > 60, f"{page}, dark mode: the checked radio's centre is not coloured: {on}"
    assert abs(off.mean() - around.mean()) < 30, (
        f"{page}, dark mode: the unchecked radio looks filled (centre {off.mean():.0f}, around {around.mean():.0f})")


def test_stacked_table_labels_come_from_every_header_row(browser, tmp_path):
    """A pandas Styler with a named index writes two header rows, the second holding only the index's name; with
    columns in two levels, both rows name each column. Stacked on a phone (batchlab-tables.js), each cell is labelled
    from the header cells above it in every row, never blank: the index's name, the column's name, "level sub"."""
    import sys

    import pandas as pd

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    import vega_offline

    named = pd.DataFrame({f"column number {i} in words": [f"{i}.{j}" for j in range(3)] for i in range(7)},
                         index=pd.Index(["first run", "second run", "third run"], name="run"))
    levels = pd.DataFrame([[1_000.5 * i for i in range(9)]] * 2, columns=pd.MultiIndex.from_product(
        [["time to first token (ms)", "time between tokens (ms)", "end-to-end latency (ms)"], ["p50", "p90", "p99"]]))
    tables = "".join(f"<div class='cell_output'>{t.to_html()}</div>" for t in (named.style, levels.style.hide()))
    assert tables.count("<tr>") > 0 and named.style.to_html().split("</thead>")[0].count("<tr") == 2
    (tmp_path / "tables.html").write_text(
        f"<!doctype html><html><head><meta name='viewport' content='width=device-width'><style>{vega_offline.CHART_CSS}"
        f"</style></head><body><article class='bd-article'>{tables}</article>"
        f"<script>{vega_offline.TABLES_JS}</script></body></html>", encoding="utf-8")
    url, stop = serve(tmp_path)
    v = Visit(browser, f"{url}/tables.html", width=400)
    try:
        found = v.page.evaluate("""() => [...document.querySelectorAll('article table')].map(t => ({
            stacked: t.classList.contains('batchlab-stacked'),
            rows: [...t.tBodies[0].rows].map(r => [...r.cells].map(c => c.getAttribute('data-label')))}))""")
    finally:
        v.close()
        stop()
    assert [t["stacked"] for t in found] == [True, True]
    assert found[0]["rows"] == [["run"] + list(named.columns)] * 3
    assert found[1]["rows"] == [[" ".join(c) for c in levels.columns]] * 2
