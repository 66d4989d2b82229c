"""Opening the built book in headless Chromium: the page server, the browser and one visit, shared by the book's
browser tests (tests/test_book_browser.py, tests/chapters/test_*_browser.py). Fixtures ``site`` and ``browser``
live in conftest.py and use this module."""
from __future__ import annotations

import functools
import http.server
import os
import re
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The built book; BATCHLAB_BOOK_HTML points the tests at another build (scripts/build_pages.py).
HTML = Path(os.environ.get("BATCHLAB_BOOK_HTML", ROOT / "_build" / "html")).resolve()
SCREENSHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LOCAL_HOSTS = {"127.0.0.1"}
CHART = "div[id^=batchlab-chart-]"
MATH = "span.math, div.math"  # what Sphinx writes for $...$ and $$...$$; MathJax typesets inside it


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(directory: Path = HTML):
    """A server of ``directory`` on 127.0.0.1; returns (base URL, stop function)."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop():
        server.shutdown()
        server.server_close()

    return f"http://127.0.0.1:{server.server_address[1]}", stop


class Visit:
    """One page opened in a fresh context, with every request, console error and page error recorded."""

    def __init__(self, browser, url, width: int = 1280):
        self.requests, self.blocked, self.errors, self.warnings = [], [], [], []
        self.context = browser.new_context(viewport={"width": width, "height": 1000 if width >= 800 else 860})
        self.page = self.context.new_page()
        self.page.route("**/*", self._route)
        self.pending = set()
        self.page.on("request", lambda r: (self.requests.append(r.url), self.pending.add(r.url)))
        self.page.on("requestfinished", lambda r: self.pending.discard(r.url))
        self.page.on("requestfailed", lambda r: self.pending.discard(r.url))
        self.page.on("websocket", lambda ws: self.blocked.append(ws.url))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else
                     self.warnings.append(m.text) if m.type == "warning" else None)
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
        """Until the chart's final layout (wide or narrow, batchlab/viz.js) is on the page."""
        self.page.wait_for_selector(f"#{chart_id}[data-batchlab-drawn]", state="attached", timeout=20_000)

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

    def chart(self, index: int = 0):
        """The ``index``-th chart of the page, drawn."""
        loc = self.charts().nth(index)
        self.wait_drawn(loc.get_attribute("id"))
        return loc

    def close(self):
        self.context.close()


def set_range(slider, value) -> None:
    """Move a range input to ``value`` as a reader's drag would (input and change events)."""
    slider.evaluate("(el, value) => { el.value = value; el.dispatchEvent(new Event('input', {bubbles: true}));"
                    " el.dispatchEvent(new Event('change', {bubbles: true})); }", str(value))


def chart_texts(chart) -> list[str]:
    """Every text the chart's svg draws (marks, axes, legends), in document order."""
    return chart.locator("svg text").all_text_contents()


_AXIS_LABELS_JS = """(el, title) => [...el.querySelectorAll('g.role-axis')].filter(a =>
  [...a.querySelectorAll('g.role-axis-title text')].some(t => t.textContent === title)).map(a =>
  [...a.querySelectorAll('g.role-axis-label text')].filter(t => t.getAttribute('opacity') !== '0')
    .map(t => t.textContent))"""


def axis_labels(chart, title: str) -> list[list[str]]:
    """The labels drawn on each axis of the chart titled ``title``: Vega hides an overlapping one with opacity 0,
    which this leaves out."""
    return chart.evaluate(_AXIS_LABELS_JS, title)


def redrawn(visit: Visit, chart, act) -> None:
    """Do ``act()`` and wait until ``chart``'s svg differs from before (the control redrew it)."""
    before = chart.locator("svg").first.inner_html()
    act()
    visit.page.wait_for_function("([id, old]) => document.querySelector('#' + id + ' svg').innerHTML !== old",
                                 arg=[chart.get_attribute("id"), before], timeout=10_000)


def png_rgb(png: bytes):
    """A Playwright screenshot (8-bit RGB or RGBA PNG, not interlaced) as a height x width x 3 array, 0-255."""
    import struct
    import zlib

    import numpy as np

    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, data, head = 8, b"", None
    while pos < len(png):
        size, kind = struct.unpack(">I4s", png[pos:pos + 8])
        body = png[pos + 8:pos + 8 + size]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            data += body
        pos += 12 + size
    width, height, depth, color, _, _, interlace = head
    assert depth == 8 and color in (2, 6) and not interlace, f"unsupported PNG: {head}"
    step = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(data), np.uint8).reshape(height, 1 + width * step)
    out = np.zeros((height, width * step), np.int32)
    for y in range(height):  # undo the PNG filter of each row (None, Sub, Up, Average, Paeth)
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        up = out[y - 1] if y else np.zeros_like(line)
        if f in (0, 2):
            out[y] = (line + (up if f == 2 else 0)) % 256
            continue
        row = np.zeros_like(line)
        for x in range(len(line)):
            left = row[x - step] if x >= step else 0
            corner = up[x - step] if x >= step else 0
            if f == 1:
                pred = left
            elif f == 3:
                pred = (left + up[x]) // 2
            else:
                p = left + up[x] - corner
                pa, pb, pc = abs(p - left), abs(p - up[x]), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else (up[x] if pb <= pc else corner)
            row[x] = (line[x] + pred) % 256
        out[y] = row
    return out.reshape(height, width, step)[:, :, :3]


# Each display formula's typeset width against its box: the box scrolls sideways when the formula is wider.
_FORMULAS_JS = """() => [...document.querySelectorAll('div.math')].map(d => {
  const m = d.querySelector('mjx-container mjx-math');
  return {tex: d.textContent.slice(0, 40), box: d.clientWidth, scroll: d.scrollWidth,
          width: m ? m.getBoundingClientRect().width : -1};
})"""


def display_formulas(visit: Visit) -> tuple[list[dict], list[dict]]:
    """Every display formula of the page once MathJax has typeset it, and those wider than their column (or not
    typeset at all)."""
    visit.wait_math()
    formulas = visit.page.evaluate(_FORMULAS_JS)
    wide = [f for f in formulas if f["width"] > f["box"] + 1 or f["scroll"] > f["box"] + 1 or f["width"] <= 0]
    return formulas, wide


def assert_formulas_fit_a_phone(browser, url: str, at_least: int) -> None:
    """The page at ``url``, opened 400 px wide, has at least ``at_least`` display formulas and none wider than its
    column (chapters 4 and 6, whose formulas are the widest)."""
    v = Visit(browser, url, width=400)
    try:
        formulas, wide = display_formulas(v)
        assert len(formulas) >= at_least
        assert not wide, f"display formulas wider than the column at 400 px: {wide}"
    finally:
        v.close()


# What lies on what in a chart's svg, in the chart's current state (shared by tests/test_book_browser.py and the
# chapters' browser tests; see ``clashes``). Boxes are screen boxes; a text's box is shrunk by 1 px each side, so a
# line that only grazes its edge does not count.
TICK_GAP_PX = 3.0  # two tick labels of an axis side by side closer than this read as one number ("1,0001,100")
CLASHES_JS = r"""(el, tickGap) => {
  const svg = el.querySelector('svg.marks');
  if (!svg) return {clashes: [], outside: ['no svg'], wider: false, ticks: [], legend: []};
  const frame = svg.getBoundingClientRect();
  const hidden = n => { for (let e = n; e && e !== svg; e = e.parentElement) {
      if (e.getAttribute('opacity') === '0' || getComputedStyle(e).opacity === '0'
          || e.getAttribute('display') === 'none') return true; }
    return n.getAttribute('fill-opacity') === '0' && (n.getAttribute('stroke') || 'none') === 'none'; };
  const shown = t => t.textContent.trim() && !hidden(t);
  const boxes = [];
  for (const t of svg.querySelectorAll('g.mark-text.role-mark text')) {
    if (!shown(t)) continue;
    const b = t.getBoundingClientRect();
    boxes.push({text: t.textContent.trim(), l: b.left + 1, t: b.top + 1, r: b.right - 1, b: b.bottom - 1});
  }
  const clashes = [];
  const hit = (x, y, kind) => boxes.forEach(
    b => { if (x > b.l && x < b.r && y > b.t && y < b.b) clashes.push(b.text + ' | ' + kind); });
  for (const p of svg.querySelectorAll('g.mark-line.role-mark path, g.mark-rule.role-mark line,'
                                       + ' g.mark-rule.role-mark path')) {
    if (hidden(p) || !p.getTotalLength) continue;
    const m = p.getScreenCTM(), n = p.getTotalLength();
    for (let s = 0; s <= n; s += 1) {
      const q = p.getPointAtLength(s);
      hit(m.a * q.x + m.c * q.y + m.e, m.b * q.x + m.d * q.y + m.f, p.closest('g.mark-line') ? 'line' : 'rule');
    }
  }
  for (const p of svg.querySelectorAll('g.mark-symbol.role-mark path, g.mark-rect.role-mark path')) {
    if (hidden(p)) continue;
    const r = p.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    boxes.forEach(b => { if (r.left < b.r && b.l < r.right && r.top < b.b && b.t < r.bottom)
      clashes.push(b.text + ' | ' + (p.closest('g.mark-symbol') ? 'point' : 'bar')); });
  }
  // Tick labels of one axis whose glyphs share a row and stand closer side by side than tickGap px, or overlap.
  // A text's svg box is its font's whole line, taller than its digits (stacked labels of a dense band axis would
  // always "overlap"), so each label is measured by its ink: its advance across, its glyphs' height, in the frame of
  // its own rotation (a rotated label's screen box is a tilted rectangle's bounding box, wider than the label).
  const ctx = document.createElement('canvas').getContext('2d');
  const ink = t => {
    const bb = t.getBBox(), m = t.getScreenCTM(), cs = getComputedStyle(t);
    ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
    const q = ctx.measureText(t.textContent), base = bb.y + q.fontBoundingBoxAscent;
    const top = base - q.actualBoundingBoxAscent, bottom = base + q.actualBoundingBoxDescent;
    const turn = -Math.atan2(m.b, m.a), cos = Math.cos(turn), sin = Math.sin(turn);
    const pts = [[bb.x, top], [bb.x + bb.width, top], [bb.x, bottom], [bb.x + bb.width, bottom]].map(([x, y]) => {
      const X = m.a * x + m.c * y + m.e, Y = m.b * x + m.d * y + m.f;
      return [X * cos - Y * sin, X * sin + Y * cos];
    });
    const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
    return {l: Math.min(...xs), r: Math.max(...xs), t: Math.min(...ys), b: Math.max(...ys)};
  };
  const ticks = [];
  for (const axis of svg.querySelectorAll('g.role-axis')) {
    const labels = [...axis.querySelectorAll('g.role-axis-label text')].filter(shown).map(
      t => ({text: t.textContent.trim(), b: ink(t)}));
    for (let i = 0; i < labels.length; i++) for (let j = i + 1; j < labels.length; j++) {
      const a = labels[i].b, b = labels[j].b;
      if (a.t < b.b && b.t < a.b && a.l < b.r + tickGap && b.l < a.r + tickGap)
        ticks.push(labels[i].text + ' | ' + labels[j].text);
    }
  }
  // Legend entries (a symbol and its label; a gradient legend's labels), of every legend of the chart.
  const entries = [];
  for (const t of svg.querySelectorAll('g.role-legend-label text')) {
    if (!shown(t)) continue;
    const own = t.closest('g.role-scope > g') || t.parentElement;
    let [l, tp, r, bt] = [Infinity, Infinity, -Infinity, -Infinity];
    for (const n of [t, ...own.querySelectorAll('g.role-legend-symbol path')]) {
      if (hidden(n)) continue;
      const b = n.getBoundingClientRect();
      [l, tp, r, bt] = [Math.min(l, b.left), Math.min(tp, b.top), Math.max(r, b.right), Math.max(bt, b.bottom)];
    }
    entries.push({text: t.textContent.trim(), l, t: tp, r, b: bt});
  }
  const legend = [];
  for (let i = 0; i < entries.length; i++) for (let j = i + 1; j < entries.length; j++) {
    const a = entries[i], b = entries[j];
    if (a.l < b.r - 0.5 && b.l < a.r - 0.5 && a.t < b.b - 0.5 && b.t < a.b - 0.5)
      legend.push(a.text + ' | ' + b.text);
  }
  const outside = [];
  for (const n of svg.querySelectorAll('text, path, line')) {
    if (hidden(n) || n.closest('[clip-path]')) continue;  // a clipped mark shows only inside its group's frame
    const r = n.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.left < frame.left - 1 || r.right > frame.right + 1 || r.top < frame.top - 1 || r.bottom > frame.bottom + 1)
      outside.push(n.tagName === 'text' ? n.textContent.trim().slice(0, 30) : n.tagName + ' of ' + (
        (n.closest('g[class*="role-"]') || svg).getAttribute('class') || 'svg').replace(/ ?(mark-\S+|\S+_marks)/g, ''));
  }
  return {clashes: [...new Set(clashes)], outside: [...new Set(outside)],
          wider: frame.width > el.getBoundingClientRect().width + 1, ticks: [...new Set(ticks)],
          legend: [...new Set(legend)]};
}"""


def clashes(chart) -> dict:
    """What is wrong with the drawn chart's layout in its current state, by kind (each empty when all is well):

    * ``clashes``: a text of a mark (not an axis or legend) with a line or rule passing through its box, or a point
      or bar overlapping it ("label | rule");
    * ``outside``: anything drawn outside the svg, which clips it (Vega sizes the svg once);
    * ``wider``: True if the svg is wider than the chart's container;
    * ``ticks``: two tick labels of one axis overlapping, or side by side closer than ``TICK_GAP_PX``;
    * ``legend``: two legend entries (symbol and label) overlapping.

    ``any(clashes(chart).values())`` is False for a clean chart."""
    return chart.evaluate(CLASHES_JS, TICK_GAP_PX)
