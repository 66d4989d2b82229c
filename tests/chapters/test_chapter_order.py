"""The reading order is one list: batchlab.chapters.CHAPTERS, the notebooks' file numbers and _toc.yml agree.

The browser test checks the built book on top of this: every chapter's title and sidebar entry carry its number.
"""
from __future__ import annotations

import importlib
import re

import yaml

from batchlab._data import DATA_DIR
from batchlab.chapters import CHAPTERS, link, notebook

ROOT = DATA_DIR.parent


def toc_notebooks() -> list[tuple[str, bool]]:
    """(notebook name, whether its part is numbered), in the TOC's order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [(entry["file"].split("/")[-1], bool(part.get("numbered")))
            for part in toc["parts"] for entry in part["chapters"] if entry["file"].startswith("notebooks/")]


def test_every_notebook_is_a_chapter_with_its_number():
    files = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert files == sorted(notebook(slug) for slug in CHAPTERS)
    assert sorted(CHAPTERS.values()) == list(range(1, len(CHAPTERS) + 1))  # 1, 2, ... with no gap


def test_toc_lists_the_chapters_in_reading_order_all_numbered():
    entries = toc_notebooks()
    assert [name for name, _ in entries] == [notebook(s) for s in sorted(CHAPTERS, key=CHAPTERS.get)]
    assert all(numbered for _, numbered in entries), "every part holding chapters is numbered in _toc.yml"
    for name, _ in entries:  # the file number is the chapter number
        assert int(re.match(r"(\d\d)_", name).group(1)) == CHAPTERS[name[3:]]


def test_every_chapter_has_its_module():
    for slug in CHAPTERS:
        assert importlib.util.find_spec(f"batchlab.chapters.{slug}") is not None, slug


def test_link_names_the_chapter_by_number():
    assert link("chunked_prefill") == '<a href="06_chunked_prefill.html">chapter 6</a>'
    assert link("tuning", "tuning-map", from_book=True) == \
        '<a href="../notebooks/09_tuning.html#tuning-map">chapter 9</a>'


def test_every_module_of_the_package_is_a_chapter_or_named_as_shared():
    from batchlab.chapters import SHARED

    modules = sorted(p.stem for p in (ROOT / "batchlab" / "chapters").glob("*.py") if p.stem != "__init__")
    assert modules == sorted([*CHAPTERS, *SHARED]) and not set(CHAPTERS) & set(SHARED)
    for name in SHARED:
        assert importlib.import_module(f"batchlab.chapters.{name}").__doc__, name
