"""Sphinx extension: the book carries its own copy of Vega, Vega-Lite and vega-embed, and checks it needs no other host.

* Writes :func:`batchlab.viz.offline_bundle` to ``_static/batchlab-vega.js`` once per build and loads it on
  every page as a classic script (a module script would not load from ``file://``), with a few lines of CSS
  for the chart containers.
* Sets ``BATCHLAB_BOOK=1`` in this process before any notebook runs: the kernels myst-nb starts inherit it,
  and then :func:`batchlab.viz.render` leaves the library to the page instead of inlining it.
* With ``execute_notebooks: force``, makes Sphinx read every page on every build, so notebooks rerun after
  an edit to ``batchlab/`` (Sphinx would otherwise reuse the outputs of unedited notebooks).
* Leaves out sphinx-thebe's assets when thebe is off (they name a CDN and raise a console error).
* After the build, reads every HTML page and warns (an error under ``-W``) about any script, stylesheet,
  font or preload that would come from another host, e.g. MathJax from a CDN on a page with ``$math$`` (the
  book serves MathJax from ``_static/mathjax``: sphinx-mathjax-offline), and about any script, stylesheet or
  icon a page names in the book that is not there.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from sphinx.util import logging

BUNDLE = "batchlab-vega.js"
STYLE = "batchlab-charts.css"
TABLES = "batchlab-tables.js"
# A chart scales down to the text column, svg and legend together at their aspect ratio (vega's svg has a viewBox),
# instead of spilling over or scrolling: on a phone the whole chart stays in view. Slider labels in the chart's
# type size. A display formula or a table wider than a phone's column scrolls sideways inside the column, and a
# knob's name in a heading wraps, so the page itself never scrolls sideways.
# vegaEmbed makes the chart's own div the .vega-embed container (an inline-block otherwise).
CHART_CSS = """.batchlab-chart, .batchlab-chart.vega-embed { display: block; max-width: 100%; margin: 0.5rem 0 1rem; }
.batchlab-chart svg.marks, .batchlab-chart canvas.marks { display: block; max-width: 100%; height: auto; }
.batchlab-chart .vega-bindings { font-size: 0.8rem; margin-top: 0.25rem; max-width: 100%; }
.batchlab-chart .vega-bind-name { margin-right: 0.5rem; }
.batchlab-chart .vega-bind { margin-bottom: 0.35rem; }
.batchlab-chart .vega-bind-radio label { margin: 0 0.8rem 0 0.2rem; }
.batchlab-chart .vega-bindings input[type=range] { vertical-align: middle; width: 14rem; max-width: 60%; }
div.math { max-width: 100%; overflow-x: auto; overflow-y: hidden; }
.cell_output table, div.output table { display: block; max-width: 100%; overflow-x: auto; }
:is(h1, h2, h3) code, :is(h1, h2, h3) code span.pre { overflow-wrap: anywhere; white-space: normal; }
table code, table code span.pre { overflow-wrap: anywhere; white-space: normal; }
.prev-next-area a code, .prev-next-area a code span.pre { overflow-wrap: anywhere; white-space: normal; }
.batchlab-chart .batchlab-slider-value { display: inline-block; min-width: 4.5em; margin-left: 0.4rem;
  font-variant-numeric: tabular-nums; }
.batchlab-chart .vega-bind.batchlab-disabled { opacity: 0.45; }
/* myst-nb prints every glued number bold, so none stands out: a page bolds the one number a paragraph is about. */
body span.pasted-text { font-weight: inherit; }
/* In dark mode a chart keeps its white card, and its controls sit on the same card in the light scheme: Chromium's
   dark radio buttons draw the checked one so close to the unchecked that the choice could not be read. */
html[data-theme="dark"] .batchlab-chart .vega-bindings { color-scheme: light; background: #ffffff; color: #222222;
  border-radius: 2px; padding: 0.3rem 0.5rem; }
html[data-theme="dark"] .batchlab-chart .vega-bindings input { accent-color: #0072B2; }
html[data-theme="dark"] .batchlab-chart svg.marks { background: #ffffff; border-radius: 2px; }
/* A table's cells get room around their text (the browser's default is 1 px, so columns ran together). */
article table th, article table td { padding: 0.25rem 0.6rem; }
/* On a phone a table wider than its column becomes one block per row, each cell under its header
   (batchlab-tables.js), so every column stays readable instead of hiding behind a sideways scroll. */
table.batchlab-stacked, table.batchlab-stacked tbody, table.batchlab-stacked tr, table.batchlab-stacked td,
table.batchlab-stacked th { display: block; width: auto !important; text-align: left !important; }
table.batchlab-stacked { overflow-x: visible; }
table.batchlab-stacked thead { display: none; }
table.batchlab-stacked tr { border-top: 1px solid #bbb; padding: 0.35rem 0; }
table.batchlab-stacked td, table.batchlab-stacked tbody th { border: none; padding: 0.1rem 0; }
table.batchlab-stacked td[data-label]::before, table.batchlab-stacked tbody th[data-label]::before {
  content: attr(data-label) ": "; font-weight: 600; }
/* In a wider column a table too wide for it first tightens (smaller type, narrower cell padding); only if it is
   still too wide does it scroll sideways (batchlab-wide). */
table.batchlab-compact { font-size: 0.9em; }
table.batchlab-compact th, table.batchlab-compact td { padding: 0.25rem 0.3rem; }
/* A table too wide even then scrolls sideways; its first column stays put, so a row keeps its name. */
table.batchlab-wide { display: block; max-width: 100%; overflow-x: auto; font-size: 0.9em; }
table.batchlab-wide .batchlab-short { white-space: nowrap; }
table.batchlab-wide tr > :first-child { position: sticky; left: 0; z-index: 1;
  background: var(--pst-color-background, #fff); }
"""
# A table wider than its column: in a phone's column (under 600 px) it is marked stacked, each cell labelled with its
# column's header, and the CSS above shows it as one block per row; in a wider column it first tightens (compact)
# and, if still too wide, scrolls sideways with its first column (the row's name) kept in view. Redone when the
# window is resized.
TABLES_JS = """(function () {
  var NARROW_PX = 600;  // a narrower column is a phone's: stack; a wider one tightens, then scrolls
  // Each column's label: the texts of its header cells, row by row, joined (a cell spanning rows or columns counts
  // once per column). A pandas Styler with a named index writes two header rows: the columns' names, then the
  // index's name under an empty corner; so the first column is named by the second row, the others by the first.
  function headers(table) {
    var rows = table.tHead ? table.tHead.rows : [], grid = [];
    for (var r = 0; r < rows.length; r++) {
      grid[r] = grid[r] || [];
      for (var i = 0, col = 0; i < rows[r].cells.length; i++) {
        var c = rows[r].cells[i];
        while (grid[r][col]) { col++; }
        for (var dr = 0; dr < (c.rowSpan || 1); dr++) {
          grid[r + dr] = grid[r + dr] || [];
          for (var k = 0; k < (c.colSpan || 1); k++) { grid[r + dr][col + k] = c; }
        }
        col += c.colSpan || 1;
      }
    }
    var out = [], width = 0;
    for (var w = 0; w < rows.length; w++) { width = Math.max(width, grid[w].length); }
    for (var j = 0; j < width; j++) {
      var parts = [];
      for (var q = 0; q < rows.length; q++) {
        var cell = grid[q][j], text = cell ? cell.textContent.trim() : "";
        if (text && (!q || grid[q - 1][j] !== cell)) { parts.push(text); }
      }
      out.push(parts.join(" "));
    }
    return out;
  }
  function label(table) {
    var names = headers(table);
    for (var r = 0; r < table.tBodies.length; r++) {
      var rows = table.tBodies[r].rows;
      for (var j = 0; j < rows.length; j++) {
        var cells = rows[j].cells, offset = names.length - cells.length;
        for (var i = 0; i < cells.length; i++) {
          var name = names[i + Math.max(offset, 0)];
          if (name) { cells[i].setAttribute("data-label", name); }
        }
      }
    }
  }
  function sizeCells(table) {  // a short body cell (a name, a number) stays on one line; a sentence wraps
    var cells = table.querySelectorAll("td, tbody th");
    for (var i = 0; i < cells.length; i++) {
      cells[i].classList.toggle("batchlab-short", cells[i].textContent.trim().length <= 24);
    }
  }
  function fit() {
    var tables = document.querySelectorAll("article table");
    for (var i = 0; i < tables.length; i++) {
      var t = tables[i], box = t.parentElement;
      t.classList.remove("batchlab-stacked", "batchlab-compact", "batchlab-wide");
      if (t.scrollWidth <= box.clientWidth + 1) { continue; }
      if (box.clientWidth < NARROW_PX) { label(t); t.classList.add("batchlab-stacked"); continue; }
      t.classList.add("batchlab-compact");
      if (t.scrollWidth > box.clientWidth + 1) { t.classList.add("batchlab-wide"); sizeCells(t); }
    }
  }
  var timer = null;
  window.addEventListener("resize", function () { clearTimeout(timer); timer = setTimeout(fit, 150); });
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", fit); } else { fit(); }
})();
"""
logger = logging.getLogger(__name__)

# An element that makes the browser fetch: <script src>, <link href> (stylesheet, font, preload, icon), <img src>...
_FETCH = re.compile(
    r"<(script|link|img|iframe|source|embed)\b[^>]*?\b(src|href)\s*=\s*[\"']?((?:https?:)?//[^\"'\s>]+)",
    re.IGNORECASE)
_CSS_URL = re.compile(r"(@import\s+|url\(\s*)[\"']?((?:https?:)?//[^\"')\s]+)", re.IGNORECASE)
_NOT_FETCHED = re.compile(r"\brel\s*=\s*[\"']?(canonical|alternate|author|license|next|prev)\b", re.IGNORECASE)


def external_assets(html: str) -> list[str]:
    """URLs on another host that a page would load by itself (links a reader clicks are not counted)."""
    found = []
    for match in _FETCH.finditer(html):
        element = html[match.start(): html.find(">", match.end()) + 1]
        if match.group(1).lower() == "link" and _NOT_FETCHED.search(element):
            continue
        found.append(match.group(3))
    found += [m.group(2) for m in _CSS_URL.finditer(html)]
    return found


# A script or a stylesheet, icon or preload a page names by a path inside the book.
_LOCAL_ASSET = re.compile(r"<(script)\b[^>]*?\bsrc\s*=\s*[\"']([^\"'\s>]+)"
                          r"|<(link)\b(?=[^>]*\brel\s*=\s*[\"']?(?:stylesheet|icon|shortcut icon|preload)\b)"
                          r"[^>]*?\bhref\s*=\s*[\"']([^\"'\s>]+)", re.IGNORECASE)


def missing_local_assets(page: Path) -> list[str]:
    """Paths inside the book that ``page`` loads by itself (scripts, stylesheets, icons) and that do not exist."""
    missing = []
    for match in _LOCAL_ASSET.finditer(page.read_text(encoding="utf-8", errors="replace")):
        url = match.group(2) or match.group(4)
        if re.match(r"^(?:[a-z][a-z0-9+.-]*:|//|#)", url, re.IGNORECASE):
            continue  # another host (reported above), data: or an anchor
        path = re.split(r"[?#]", url, maxsplit=1)[0]
        if path and not (page.parent / path).exists():
            missing.append(path)
    return missing


def _write_bundle(app) -> None:
    if app.builder.format != "html":
        return
    from batchlab.viz import offline_bundle

    for name, text in ((BUNDLE, offline_bundle()), (STYLE, CHART_CSS), (TABLES, TABLES_JS)):
        path = Path(app.outdir) / "_static" / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")


def _reread_everything(app, env, added, changed, removed) -> list[str]:
    """Sphinx re-reads only edited sources, so after an edit to batchlab/ a notebook would keep its old
    outputs even with ``execute_notebooks: force``. Read (and so execute) every page on every build."""
    if getattr(app.config, "nb_execution_mode", None) != "force":
        return []
    return sorted(set(env.found_docs) - set(added) - set(changed) - set(removed))


def _drop_thebe(app, pagename, templatename, context, doctree) -> None:
    """Jupyter Book always loads sphinx-thebe; with thebe off its assets only name a CDN and, added twice,
    redeclare a constant (a console error on every page). Leave them out."""
    if (app.config.html_theme_options.get("launch_buttons") or {}).get("thebe"):
        return

    def is_thebe(asset) -> bool:
        body = str((getattr(asset, "attributes", None) or {}).get("body", ""))
        # and the explore cells' ipywidgets state: with no widget manager on the page (nb_ipywidgets_js is empty) it
        # draws nothing, yet it would carry a second copy of every chart those cells showed
        return ("thebe" in str(getattr(asset, "filename", asset) or "") or "THEBE_JS_URL" in body
                or "application/vnd.jupyter.widget-state+json" in str(
                    (getattr(asset, "attributes", None) or {}).get("type", "")))

    for key in ("script_files", "css_files"):
        if key in context:
            context[key] = [asset for asset in context[key] if not is_thebe(asset)]


def _check_offline(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    outdir = Path(app.outdir)
    if not (outdir / "_static" / BUNDLE).exists():
        logger.warning(f"vega_offline: _static/{BUNDLE} is missing; charts will not draw")
    for page in sorted(outdir.rglob("*.html")):
        for url in external_assets(page.read_text(encoding="utf-8", errors="replace")):
            logger.warning(f"vega_offline: {page.relative_to(outdir)} loads {url} from another host; "
                           f"the book must work offline (charts and MathJax are served from _static)")
        if page.relative_to(outdir).parts[0] == "_static":
            continue  # the theme's template macros, not pages
        for path in missing_local_assets(page):
            logger.warning(f"vega_offline: {page.relative_to(outdir)} loads {path}, which the build did not write")


def setup(app):
    # Inherited by the kernels that execute the notebooks during this build (see batchlab.viz).
    os.environ["BATCHLAB_BOOK"] = "1"
    app.add_js_file(BUNDLE, priority=200)  # before the pages' inline chart scripts; classic, not deferred
    app.add_css_file(STYLE)
    app.add_js_file(TABLES)
    app.connect("builder-inited", _write_bundle)
    app.connect("env-get-outdated", _reread_everything)
    app.connect("html-page-context", _drop_thebe, priority=900)  # after sphinx-thebe added its assets
    # After sphinx-mathjax-offline has copied MathJax into _static (at the default priority, 500).
    app.connect("build-finished", _check_offline, priority=900)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
