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
