"""Helpers for reading Vega-Lite specs in the chart tests."""
from __future__ import annotations


def walk(node, key):
    """Every value stored under ``key`` anywhere in a spec."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from walk(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v, key)


def marks(spec) -> set[str]:
    """Mark types used anywhere in a spec."""
    return {m if isinstance(m, str) else m["type"] for m in walk(spec, "mark")}


def axis_titles(spec) -> list[str]:
    """Titles of every x and y encoding that sets one."""
    return [enc[ch]["title"] for enc in walk(spec, "encoding") for ch in ("x", "y")
            if ch in enc and isinstance(enc[ch], dict) and isinstance(enc[ch].get("title"), str)]


titles = axis_titles
