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
controls, add ``"notebooks/NN_slug": <number of them>`` to ``SLIDER_PAGES``, ``RADIO_PAGES`` or ``SELECT_PAGES``.
"""
from __future__ import annotations

import ast
import functools
import http.server
import re
import threading
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LOCAL_HOSTS = {"127.0.0.1"}
CHART = "div[id^=batchlab-chart-]"
WIDTHS = (1280, 400)  # a laptop window and a phone: every chart must fit the text column at both

# Page (TOC path without suffix) -> how many range sliders its charts must have; each must redraw its chart.
SLIDER_PAGES = {
    "notebooks/01_static_batching": 1,
    "notebooks/02_dynamic_batching": 1,  # max queue delay (the latency metric is a select box)
}
# Page -> how many radio groups bound to its charts: grids encoded as log2 or an index, labelled with the value
# in tokens or sequences (viz.grid_param's labels). Picking another button in each must redraw its chart.
RADIO_PAGES = {
    "notebooks/04_step_time_roofline": 1,  # context per sequence (tokens)
    "notebooks/06_chunked_prefill": 1,  # token budget (and a chunking checkbox)
    "notebooks/07_piggybacking": 1,  # token budget of the split chart
    "notebooks/08_two_knobs": 3,  # max_num_seqs, max_num_batched_tokens and the request rate
    "notebooks/14_fact_check": 1,
    "notebooks/09_tuning": 3,  # workload, SLO (in ms) and load of the goodput map
    "notebooks/10_prefix_caching": 2,  # workload and KV pool (in GiB) of the hit-rate chart
    "notebooks/11_disaggregation": 2,  # workload and SLO (TTFT and TPOT bounds in ms) of the goodput chart
}


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


@pytest.fixture(scope="module")
def site():
    if not (HTML / "index.html").exists():
        pytest.fail(f"{HTML} has no built book: run `make book` first")
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Visit:
    """One page opened in a fresh context, with every request, console error and page error recorded."""

    def __init__(self, browser, url, width: int = 1280):
        self.requests, self.blocked, self.errors = [], [], []
        self.context = browser.new_context(viewport={"width": width, "height": 1000 if width >= 800 else 860})
        self.page = self.context.new_page()
        self.page.route("**/*", self._route)
        self.pending = set()
        self.page.on("request", lambda r: (self.requests.append(r.url), self.pending.add(r.url)))
        self.page.on("requestfinished", lambda r: self.pending.discard(r.url))
        self.page.on("requestfailed", lambda r: self.pending.discard(r.url))
        self.page.on("websocket", lambda ws: self.blocked.append(ws.url))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(url, wait_until="load")

    def _route(self, route):
        url = route.request.url
        host = re.match(r"^[a-z]+://([^/:]+)", url)
        if host and host.group(1) not in LOCAL_HOSTS:
            self.blocked.append(url)
            route.abort()
        else:
            route.continue_()

    def charts(self):
        return self.page.locator(CHART)

    def wait_drawn(self, chart_id: str):
        self.page.wait_for_selector(f"#{chart_id} svg, #{chart_id} canvas", state="attached", timeout=15_000)

    def wait_all_drawn(self) -> list[str]:
        ids = [self.charts().nth(i).get_attribute("id") for i in range(self.charts().count())]
        for chart_id in ids:
            self.wait_drawn(chart_id)
        return ids

    def wait_math(self) -> None:
        """Wait until MathJax has typeset the page (nothing to wait for on a page without math)."""
        if self.page.locator(MATH).count() == 0:
            return
        self.page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                                    timeout=15_000)
        self.page.evaluate("() => MathJax.startup.promise.then(() => true)")

    def close(self):
        self.context.close()


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


def test_slider_pages_are_in_toc():
    assert set(SLIDER_PAGES) <= set(PAGES), "SLIDER_PAGES names a page that is not in _toc.yml"
    assert set(SELECT_PAGES) <= set(PAGES), "SELECT_PAGES names a page that is not in _toc.yml"
    assert set(RADIO_PAGES) <= set(PAGES), "RADIO_PAGES names a page that is not in _toc.yml"


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
MATH = "span.math, div.math"  # what Sphinx writes for $...$ and $$...$$; MathJax typesets inside it

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


def _each_control_redraws(visit, selector: str, expected: dict, change, shot: str, noun: str):
    """Every control of the page's charts matching ``selector`` (at least ``expected[page]`` of them) redraws
    its chart when ``change`` is applied; screenshots ``<page>-<shot><i>.png``."""
    page, v = visit
    controls = v.page.locator(f"{CHART} .vega-bindings {selector}")
    assert controls.count() >= expected[page], f"{page}: expected {expected[page]} {noun}"
    for i in range(controls.count()):
        _redraws(v, page, controls.nth(i), change, f"{shot}{i + 1}")
    assert not v.errors, f"{page}: console errors {v.errors}"


@pytest.mark.parametrize("visit", sorted(SLIDER_PAGES), indirect=True)
def test_every_bound_slider_redraws_its_chart(visit):
    _each_control_redraws(visit, "input[type=range]", SLIDER_PAGES, _move_slider, "slider", "sliders")


def _pick_other_button(group):
    group.locator("input[type=radio]:not(:checked)").first.check()


@pytest.mark.parametrize("visit", sorted(RADIO_PAGES), indirect=True)
def test_every_bound_radio_group_redraws_its_chart(visit):
    _each_control_redraws(visit, ".vega-bind-radio", RADIO_PAGES, _pick_other_button, "radio", "radio groups")


# Page -> how many select boxes bound to its charts; choosing another option in each must redraw its chart.
SELECT_PAGES = {
    "notebooks/03_continuous_batching": 1,  # the highlighted request (none, or request 0, 1, ...)
    "notebooks/05_prefill_spike": 2,  # model and scheduler order
    "notebooks/13_validation": 1,
}


@pytest.mark.parametrize("visit", sorted(SELECT_PAGES), indirect=True)
def test_every_bound_select_redraws_its_chart(visit):
    _each_control_redraws(visit, "select", SELECT_PAGES, _pick_other_option, "select", "select boxes")


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
