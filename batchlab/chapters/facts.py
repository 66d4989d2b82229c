"""The book's facts: every number or verdict a reader meets on more than one page, computed once.

A **fact** is a value computed from a named scene (:data:`batchlab.chapters.scenes.SCENES`: model, GPU, traffic,
load), registered with :func:`fact` beside the experiment that shows it in full, in that chapter's module. It
has a name, which is also the name every page glues it under, a unit, the format pages print it with, the
chapter that owns it and one sentence saying what it is. Pages never recompute a fact: they glue it
(:func:`glue`), so a change in the engine moves every page together, and each chapter's hidden asserts check
the claims its prose makes about it.

Two caches make "computed once" literal. :func:`value` keeps each fact for the life of the process, and
:func:`memo` (used on the experiments behind facts: sweeps, tuning grids) keeps an experiment's result on disk,
keyed by its arguments and by a hash of the package's source and data files, so the notebooks that run the same
experiment during one build (the chapter, the cheat sheet, the intro) share one run, and any edit to
``batchlab/`` or ``data/`` recomputes everything. ``BATCHLAB_CACHE_DIR`` moves the disk cache (``off``: none).

:func:`check_pages` is the book-wide rule the tests apply to every built page: a fact has one value wherever it
is glued, no page glues a fact's value under a name of its own, and no page types a fact's number by hand.
Used by every chapter, the intro and the tests.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import math
import os
import pickle
import re
import tempfile
from pathlib import Path
from typing import NamedTuple
from collections.abc import Callable

import numpy as np
import pandas as pd

from .._data import DATA_DIR
from . import CHAPTERS

PACKAGE_DIR = Path(__file__).resolve().parents[1]
CACHE_ENV = "BATCHLAB_CACHE_DIR"


class Fact(NamedTuple):
    """One registered fact (:func:`fact`)."""

    name: str  # the glue name every page uses
    scene: str  # key of scenes.SCENES: the setting the value comes from
    unit: str  # what the number counts, as a page writes it ("req/s", "ms", "sequences"; "" for a share or text)
    fmt: str  # the format spec pages print it with (",.1f", ".0%"; RATE: the book's rate rule; "" for text)
    chapter: str  # slug of the chapter that shows it in full (batchlab.chapters.CHAPTERS)
    text: str  # what it is, one sentence
    compute: Callable[[], object]


_FACTS: dict[str, Fact] = {}
RATE = "rate"  # a Fact.fmt: the book's rule for request rates (viz.format_rate: "0.061", "18.5", "1,020")


def fact(name: str, *, scene: str, unit: str = "", fmt: str = "", chapter: str, text: str):
    """Register the decorated function (no arguments) as the fact ``name``. See the module docstring."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"fact name {name!r}: lowercase letters, digits and _ only (it is a glue name)")
    if chapter not in CHAPTERS:
        raise ValueError(f"fact {name!r}: chapter {chapter!r} is not one of {sorted(CHAPTERS)}")

    def register(fn):
        if name in _FACTS and _FACTS[name].compute.__qualname__ != fn.__qualname__:
            raise ValueError(f"fact {name!r} is registered twice ({_FACTS[name].compute.__module__})")
        _FACTS[name] = Fact(name, scene, unit, fmt, chapter, text, fn)
        return fn

    return register


def _load_all() -> None:
    """Import every chapter module, so every fact is registered (each registers its own on import)."""
    for module in (*CHAPTERS, "verdicts"):  # verdicts: the book's verdicts on the article's claims
        importlib.import_module(f"batchlab.chapters.{module}")


def registry() -> dict[str, Fact]:
    """Every fact of the book, by name."""
    _load_all()
    return dict(_FACTS)


def get(name: str) -> Fact:
    """The registered :class:`Fact` ``name`` (ValueError naming the known ones otherwise)."""
    if name not in _FACTS:
        _load_all()
    if name not in _FACTS:
        raise ValueError(f"no fact {name!r}; facts: {', '.join(sorted(_FACTS))}")
    return _FACTS[name]


def _plain(v):
    """A NumPy scalar as the Python scalar it holds (glue then stores a clean repr)."""
    return v.item() if isinstance(v, np.generic) else v


@functools.cache
def value(name: str):
    """The fact's value (a float, int, bool or string), computed once per process."""
    v = _plain(get(name).compute())
    if not isinstance(v, (bool, int, float, str)):
        raise TypeError(f"fact {name!r} computed a {type(v).__name__}; facts are numbers or strings")
    return v


def formatted(name: str) -> str:
    """The fact's number as pages print it, without its unit: its format spec, or the rate rule (``"0.061"``)."""
    f, v = get(name), value(name)
    if f.fmt == RATE:
        from .. import viz  # the rule's home, beside its Vega twin

        return viz.format_rate(v)
    return format(v, f.fmt) if f.fmt else str(v)


def rendered(name: str) -> str:
    """The fact as pages print it: its value in its format, with its unit (``"20.8 req/s"``)."""
    f = get(name)
    text = formatted(name)
    return f"{text} {f.unit}" if f.unit and not f.fmt.endswith("%") else text


def glue(glue_fn, *names: str) -> dict:
    """Glue each fact under its own name (``glue_fn`` is ``myst_nb.glue``); return the values by name.

    Pages print them with the fact's format, ``{glue:text}`capacity_req_s:.1f```, so a number reads the same on
    every page.
    """
    out = {}
    for name in names:
        out[name] = value(name)
        glue_fn(name, out[name], display=False)
    return out


def glue_text(glue_fn, *names: str) -> dict:
    """Glue each fact's :func:`formatted` text under ``<name>_text``; return the texts by fact name.

    For facts whose format is no Python spec (:data:`RATE`): pages print ``{glue:text}`name_text```, so a rate
    reads "0.061" wherever it appears, as the tables and charts print it.
    """
    out = {name: formatted(name) for name in names}
    for name, text in out.items():
        glue_fn(f"{name}_text", text, display=False)
    return out


def table() -> pd.DataFrame:
    """Every fact: ``name``, ``value``, ``rendered``, ``unit``, ``scene``, ``chapter`` and ``text``."""
    rows = [{"name": f.name, "value": value(f.name), "rendered": rendered(f.name), "unit": f.unit,
             "scene": f.scene, "chapter": f.chapter, "text": f.text} for f in registry().values()]
    return pd.DataFrame(rows)


# -- the disk cache behind experiments ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """SHA-256 of every file of the package and of ``data/`` (paths and bytes): the cache's version."""
    h = hashlib.sha256()
    root = PACKAGE_DIR.parent  # DATA_DIR is root / "data"
    files = sorted(PACKAGE_DIR.rglob("*.py")) + sorted(p for p in DATA_DIR.rglob("*") if p.is_file())
    for path in files:
        if "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def cache_dir() -> Path | None:
    """Where :func:`memo` keeps results: ``$BATCHLAB_CACHE_DIR``, else ``_build/cache`` of a checkout, else the
    user's cache folder; None (no disk cache) for ``BATCHLAB_CACHE_DIR=off``."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else Path(env)
    root = PACKAGE_DIR.parent
    if (root / "pyproject.toml").exists() and os.access(root, os.W_OK):
        return root / "_build" / "cache"
    return Path.home() / ".cache" / "batchlab"


_MEMORY: dict[str, bytes] = {}


def memo(fn):
    """Cache ``fn``'s results by its arguments, in memory and on disk (:func:`cache_dir`), for pure experiments.

    The key is a hash of the function's name, its pickled arguments and :func:`source_hash`; each call returns a
    fresh copy (unpickled), so a caller may change what it gets. Arguments that do not pickle (an executor, a
    lambda) bypass the cache; so does ``executor=`` given at all, which changes nothing in the result.
    ``fn.uncached`` is the function itself.
    """
    @functools.wraps(fn)
    def cached(*args, **kwargs):
        if kwargs.get("executor") is not None:
            return fn(*args, **kwargs)
        try:
            blob = pickle.dumps((fn.__module__, fn.__qualname__, args, sorted(kwargs.items())), protocol=4)
        except Exception:  # noqa: BLE001 - anything unpicklable: run it
            return fn(*args, **kwargs)
        key = hashlib.sha256(source_hash().encode() + blob).hexdigest()[:32]
        if key not in _MEMORY:
            folder = cache_dir()
            path = None if folder is None else folder / f"{fn.__module__}.{fn.__qualname__}.{key}.pkl"
            if path is not None and path.exists():
                _MEMORY[key] = path.read_bytes()
            else:
                _MEMORY[key] = pickle.dumps(fn(*args, **kwargs), protocol=4)
                if path is not None:
                    _write_atomic(path, _MEMORY[key])
        return pickle.loads(_MEMORY[key])

    cached.uncached = fn
    return cached


def _write_atomic(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:  # a read-only checkout: the memory cache still holds it
        pass


# -- the book-wide rule the tests apply ---------------------------------------------------------------------------
_ROLE = re.compile(r"\{[a-z:]+\}`[^`]*`")  # MyST roles: {glue:text}`name:fmt`, {chapter}`...`, {doc}`...`
_MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$", re.S)
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def prose(markdown: str) -> str:
    """The text a reader reads of a markdown cell: roles, math and code left out."""
    return _CODE.sub(" ", _MATH.sub(" ", _ROLE.sub(" ", markdown)))


def _number(text: str):
    try:
        return float(text.replace("np.float64(", "").rstrip(")"))
    except ValueError:
        return None


def _distinctive(v) -> bool:
    """A number unlikely to equal another by chance: not a whole number (integers repeat everywhere)."""
    return isinstance(v, float) and math.isfinite(v) and not float(v).is_integer()


def check_pages(glued: dict[str, dict[str, str]], markdown: dict[str, str], facts: dict[str, object],
                renderings: dict[str, str] | None = None, texts: dict[str, str] | None = None) -> list[str]:
    """Every way the pages of a built book disagree about a fact, as sentences (empty: they agree).

    Parameters
    ----------
    glued : dict
        Page -> {glue name: the text/plain of its value}, as the built book's ``*.glue.json`` files hold it.
    markdown : dict
        Page -> its markdown (every markdown cell, or the page's text).
    facts : dict
        Fact name -> value (:func:`value` of every fact of :func:`registry`).
    renderings : dict, optional
        Fact name -> how pages print it (:func:`rendered`: number and unit); these strings typed in a page's prose
        are a fact restated by hand. Only renderings whose number carries a decimal point are searched.
    texts : dict, optional
        Fact name -> its number as pages print it (:func:`formatted`); a page gluing ``<fact>_text``
        (:func:`glue_text`) must glue that string.

    The rules: (1) a page gluing a fact's name glues the fact's value; (2) a name glued on several pages that is
    not a fact is page-local, except that no page-local name may carry a fact's value (a non-integer number or
    a string equal to it: the page computed the fact again instead of gluing it); (3) no prose types a
    rendering of a fact; (4) a fact's printed twin ``<fact>_text`` is the fact's own :func:`formatted` text.
    """
    problems = []
    wanted = {name: repr(_plain(v)) for name, v in facts.items()}
    distinct = {name: v for name, v in facts.items() if _distinctive(v) or (isinstance(v, str) and len(v) > 20)}
    for page, names in sorted(glued.items()):
        for name, text in names.items():
            if name in wanted:
                if text != wanted[name]:
                    problems.append(f"{page}: glues fact {name} = {text}, but the fact is {wanted[name]}")
                continue
            if name.endswith("_text") and name[:-5] in (texts or {}):
                if text != repr(texts[name[:-5]]):
                    problems.append(f"{page}: glues {name} = {text}, but fact {name[:-5]} prints as "
                                    f"{texts[name[:-5]]!r}")
                continue
            num = _number(text)
            for fname, fv in distinct.items():
                same = (isinstance(fv, str) and text.strip("'\"") == fv) or (
                    num is not None and isinstance(fv, float) and abs(num - fv) <= 1e-12 * max(1.0, abs(fv)))
                if same:
                    problems.append(f"{page}: glues {name} = {text}, the value of fact {fname}: glue the fact")
    for page, text in sorted(markdown.items()):
        body = prose(text)
        for fname, shown in (renderings or {}).items():
            if "." not in shown or not re.search(r"\d", shown):
                continue
            if re.search(r"(?<![\d.,])" + re.escape(shown) + r"(?![\d])", body):
                problems.append(f"{page}: types {shown!r}, the value of fact {fname}, by hand: glue it")
    return problems
