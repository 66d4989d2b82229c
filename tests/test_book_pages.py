"""Every chart of the built book, read from its page: tooltips titled in words with units, and a tooltip on every
chart (the intro promises hover values). Reads ``_build/html`` (``make book``); no browser."""
from __future__ import annotations

import json
import re

import pytest
from bookpage import HTML

pytestmark = pytest.mark.book

_SPEC = re.compile(r'var spec = (\{"[^\n]*\});\n')  # the spec is one line of JSON; widget state escapes its own
KNOB_NAMES = {"max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold", "gpu_memory_utilization",
              "max_model_len", "enable_chunked_prefill", "max_queue_delay_s"}  # vLLM's own names, as its users type
UNIT_SUFFIXES = ("_ms", "_s", "_us", "_tokens", "_gib", "_gb", "_req_s", "_tok_s", "_tflops", "_kib")


def chart_specs() -> dict[str, list[dict]]:
    """Page -> the Vega-Lite spec of each chart it draws."""
    out = {}
    for path in sorted(HTML.rglob("*.html")):
        if "_static" in path.parts:
            continue
        specs = []
        for m in _SPEC.finditer(path.read_text(encoding="utf-8")):
            try:
                specs.append(json.loads(m.group(1)))
            except json.JSONDecodeError:  # a copy escaped inside another string
                continue
        if specs:
            out[str(path.relative_to(HTML).with_suffix(""))] = specs
    return out


def tooltips(spec) -> list[dict]:
    """Every tooltip field of a spec, wherever it sits (layers, concats, facets, conditions)."""
    found = []

    def walk(v):
        if isinstance(v, dict):
            if "tooltip" in v and isinstance(v["tooltip"], (list, dict)):
                tips = v["tooltip"] if isinstance(v["tooltip"], list) else [v["tooltip"]]
                found.extend(t if isinstance(t, dict) else {"field": t} for t in tips)
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk({k: v for k, v in spec.items() if k != "datasets"})
    return found


def problems_of(tip: dict) -> list[str]:
    """What is wrong with one tooltip field (empty: titled in words, with its unit)."""
    field = str(tip.get("field", ""))
    title = tip.get("title")
    if "value" in tip and "field" not in tip:
        return []  # a constant
    if not isinstance(title, str) or not title.strip():
        return [f"{field}: no title"]
    words = re.sub(r"`[^`]*`", "", title)
    out = []
    bare = [w for w in re.findall(r"[A-Za-z0-9]+(?:_[A-Za-z0-9]+)+", words) if w not in KNOB_NAMES]
    if bare:
        out.append(f"{field}: title {title!r} has code names {bare}")
    if field.endswith(UNIT_SUFFIXES) and not re.search(r"\([^)]+\)", title):  # "p99 TTFT (ms)"
        out.append(f"{field}: title {title!r} does not say its unit")
    return out


SPECS = chart_specs() if HTML.exists() else {}


def test_the_book_has_charts():
    assert SPECS, f"no chart found in {HTML}: run `make book` first"


@pytest.mark.parametrize("page", sorted(SPECS))
def test_every_tooltip_field_is_titled_in_words_with_its_unit(page):
    bad = [p for spec in SPECS[page] for tip in tooltips(spec) for p in problems_of(tip)]
    assert not bad, f"{page}: {sorted(set(bad))}"


@pytest.mark.parametrize("page", sorted(SPECS))
def test_every_chart_answers_a_hover(page):
    bare = [i for i, spec in enumerate(SPECS[page]) if not tooltips(spec)]
    assert not bare, f"{page}: charts {bare} show nothing on hover"


def test_tooltip_rules_catch_code_names_and_missing_units():
    assert problems_of({"field": "rate_req_s"}) == ["rate_req_s: no title"]
    assert problems_of({"field": "itl_ms", "title": "itl_ms"})
    assert problems_of({"field": "itl_ms", "title": "inter-token latency"}) == [
        "itl_ms: title 'inter-token latency' does not say its unit"]
    assert problems_of({"field": "itl_ms", "title": "inter-token latency (ms)"}) == []
    assert problems_of({"field": "max_num_seqs", "title": "max_num_seqs (sequences)"}) == []


# -- links land where they say -------------------------------------------------------------------------------------
_HREF = re.compile(r'<a\b[^>]*\bhref="([^"#:]*\.html)?#([^"]+)"')
_ID = re.compile(r'\bid="([^"]+)"')


def _pages():
    return [p for p in sorted(HTML.rglob("*.html")) if "_static" not in p.parts and "_sources" not in p.parts]


def test_every_link_to_an_anchor_finds_it():
    """A link to a label of a page (the cheat sheet's, the {chapter} role's, a table's) lands on an element with that
    id: a renamed label or a typo would otherwise leave the reader at the top of the page."""
    ids = {p.resolve(): set(_ID.findall(p.read_text(encoding="utf-8"))) for p in _pages()}
    broken = []
    for page in _pages():
        for target, anchor in _HREF.findall(page.read_text(encoding="utf-8")):
            dest = (page.parent / target).resolve() if target else page.resolve()
            if dest in ids and anchor not in ids[dest]:
                broken.append(f"{page.relative_to(HTML)} -> {target}#{anchor}")
    assert not broken, sorted(set(broken))[:20]


CHART_LABELS = {"notebooks/05_prefill_spike.html": "spike-chart",
                "notebooks/06_chunked_prefill.html": "chunking-hyperbola"}  # labels links use to show a chart


@pytest.mark.parametrize("page, label", sorted(CHART_LABELS.items()))
def test_a_link_to_a_chart_lands_on_the_chart(page, label):
    """The cheat sheet and the intro link these labels to show a chart: the label stands right before it, so the
    reader lands on the chart, not on a section heading with the chart a screen further down."""
    text = (HTML / page).read_text(encoding="utf-8")
    at = text.index(f'id="{label}"')
    chart = text.find('class="batchlab-chart"', at)
    assert chart > at, f"no chart after #{label}"
    between = text[at:chart]
    assert not re.search(r"<h[1-6]\b", between) and "<p>" not in between, f"#{label} is not right before a chart"


def test_chapters_cite_the_references_they_use():
    """Every work on the references page is linked from at least one page of the book, and every link to the
    references page names one of its entries."""
    refs = HTML / "book" / "references.html"
    entries = set(re.findall(r'<p id="([a-z0-9-]+)">', refs.read_text(encoding="utf-8")))  # (label)= before an entry
    assert len(entries) >= 20
    cited = set()
    for page in _pages():
        if page == refs:
            continue
        cited |= set(re.findall(r'href="[^"]*references\.html#([a-z0-9-]+)"', page.read_text(encoding="utf-8")))
    assert cited <= entries, sorted(cited - entries)
    uncited = sorted(entries - cited)
    assert not uncited, f"works on the references page that no chapter links to: {uncited}"
