"""The built book speaks with one voice: every page agrees with every other on each fact it states.

Reads what the build glued on every page (``_build/jupyter_execute/**/*.glue.json``) and the prose of every page,
and applies :func:`batchlab.chapters.facts.check_pages`: a fact has its one value wherever it is glued, no page
glues a fact's value under a name of its own, and no page types a fact's number by hand. Needs ``make book``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from batchlab.chapters import facts
from bookpage import HTML

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[1]
EXECUTED = HTML.parent / "jupyter_execute"


def _pages() -> list[str]:
    from test_book_browser import PAGES  # the TOC's pages, in order

    return PAGES


def _markdown(page: str) -> str:
    for suffix in (".ipynb", ".md"):
        path = ROOT / f"{page}{suffix}"
        if path.exists():
            break
    else:
        raise FileNotFoundError(page)
    if path.suffix == ".md":
        return re.sub(r"```\{code-cell\}.*?```", " ", path.read_text(), flags=re.S)
    cells = json.loads(path.read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def _glued(page: str) -> dict[str, str]:
    path = EXECUTED / f"{page}.glue.json"
    if not path.exists():
        return {}
    return {name: out["data"]["text/plain"] for name, out in json.loads(path.read_text()).items()}


def _renderings() -> dict[str, str]:
    """How pages print each non-integer fact, with its unit ("20.8 req/s", "0.11 ms"): typed by hand, that is the
    fact restated. A unit makes the match specific (a bare "0.11" may be a vLLM version)."""
    out = {}
    for name, f in facts.registry().items():
        v = facts.value(name)
        if f.fmt and isinstance(v, float):
            out[name] = facts.rendered(name)
    return out


def test_the_book_was_built():
    if not EXECUTED.exists():
        pytest.fail(f"{EXECUTED} is missing: run `make book` first")
    assert any(_glued(p) for p in _pages()), "no page glued anything"


def test_every_page_agrees_on_every_fact():
    pages = _pages()
    values = {name: facts.value(name) for name in facts.registry()}
    texts = {name: facts.formatted(name) for name in values}
    problems = facts.check_pages({p: _glued(p) for p in pages}, {p: _markdown(p) for p in pages}, values,
                                 _renderings(), texts)
    assert not problems, "pages disagree on the book's facts:\n" + "\n".join(problems)


def test_facts_are_glued_by_the_pages_that_state_them():
    """A fact a page prints ({glue:text}`name`) is one the page glued from the facts layer, with its value."""
    values = {name: repr(facts.value(name)) for name in facts.registry()}
    for page in _pages():
        used = set(re.findall(r"\{glue:text\}`([a-z0-9_]+)[:`]", _markdown(page))) & set(values)
        glued = _glued(page)
        assert all(glued.get(name) == values[name] for name in used), (page, sorted(used - set(glued)))
