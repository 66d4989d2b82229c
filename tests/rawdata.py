"""Where the raw public files are, for the tests that read them (marked ``needs_data``).

A test that needs a raw trace or measured timing file finds its folder through the environment variable that
batchlab itself reads, else ``../shared/data`` beside the repository (what CI has). With neither, it says so in
one line naming the variable to set: a skip on a developer's machine, a failure under CI (``CI`` set), where
the files must be there.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def raw_folder(variable: str, subfolder: str, what: str) -> Path:
    """The folder named by ``$variable``, else ``../shared/data/<subfolder>``; skips or fails in one line."""
    path = Path(os.environ.get(variable) or SHARED / subfolder)
    if path.is_dir():
        return path
    message = f"{what} not found: set {variable} to a mirror of them (../shared/data/{subfolder})"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)
