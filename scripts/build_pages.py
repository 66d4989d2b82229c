"""Build the book with only some pages executed, into a folder of its own: a quick look at a chapter you changed.

    .venv/bin/python scripts/build_pages.py notebooks/04_step_time_roofline [book/intro ...] [--out _build/pages]

Every page of _toc.yml is rendered, so chapter numbers and links stay as in the full book, but only the pages
named are executed (the others appear without outputs, and their glued numbers as warnings). The HTML lands in
``<out>/_build/html``; point the browser tests at it with ``BATCHLAB_BOOK_HTML=<out>/_build/html`` and select the
page with ``-k``. ``make book`` is still the one build that counts.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="+", help="pages to execute, as _toc.yml names them")
    parser.add_argument("--out", default=None, help="output folder (default _build/pages-<first page's name>)")
    args = parser.parse_args(argv)
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    every = [toc["root"]] + [e["file"] for part in toc["parts"] for e in part["chapters"]]
    unknown = sorted(set(args.pages) - set(every))
    if unknown:
        parser.error(f"not in _toc.yml: {unknown}")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    skip = [f"{p}.ipynb" if (ROOT / f"{p}.ipynb").exists() else f"{p}.md" for p in every if p not in args.pages]
    config.setdefault("execute", {})["exclude_patterns"] = skip
    out = Path(args.out or ROOT / "_build" / f"pages-{Path(args.pages[0]).name}")
    with tempfile.NamedTemporaryFile("w", prefix=".build_pages-", suffix=".yml", dir=ROOT, delete=False) as fh:
        yaml.safe_dump(config, fh)
    try:
        cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(ROOT), "--config", fh.name,
               "--path-output", str(out)]
        done = subprocess.run(cmd, cwd=ROOT)
    finally:
        Path(fh.name).unlink()
    print(f"HTML in {out / '_build' / 'html'}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
