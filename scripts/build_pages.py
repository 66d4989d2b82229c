"""Build the book with only some pages executed, into a folder of its own: a quick look at a chapter you changed.

    .venv/bin/python scripts/build_pages.py notebooks/04_step_time_roofline [book/intro ...] [--out _build/pages]

Every page of _toc.yml is rendered, so chapter numbers and links stay as in the full book, but only the pages
named are executed (the others appear without outputs, and their glued numbers as warnings). The HTML lands in
``<out>/_build/html``; point the browser tests at it with ``BATCHLAB_BOOK_HTML=<out>/_build/html`` and select the
page with ``-k``. ``make book`` is still the one build that counts.

With ``-W``, as sphinx's, the build fails (exit status 1) on any warning it prints about the pages it executes: a
glue key a page references but none of its executed cells defines, a broken reference, anything else. Warnings
located in the pages left unexecuted are expected (their glue has no outputs) and only counted.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# Sphinx's warning lines: "<file>[:<line>]: WARNING: <message>", or "WARNING: <message>" without a location.
WARNING = re.compile(r"^(?:(?P<file>[^\s:][^:]*?)(?::\d+)?: )?(?:WARNING|ERROR|CRITICAL): ")
COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # sphinx colours its output even into a pipe


def run_checked(cmd: list[str], unexecuted: set[Path]) -> tuple[int, list[str], int]:
    """Run ``cmd``, echoing its output; return its exit status, the warning lines that count and how many were
    excused because they are located in a page of ``unexecuted`` (absolute paths, without suffix)."""
    counted, excused = [], 0
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          bufsize=1) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            match = WARNING.match(COLOUR.sub("", line))
            if not match:
                continue
            where = match.group("file")
            if where and Path(where).resolve().with_suffix("") in unexecuted:
                excused += 1
            else:
                counted.append(COLOUR.sub("", line).rstrip("\n"))
    return proc.returncode, counted, excused


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="+", help="pages to execute, as _toc.yml names them")
    parser.add_argument("--out", default=None, help="output folder (default _build/pages-<first page's name>)")
    parser.add_argument("-W", dest="warnings_are_errors", action="store_true",
                        help="fail (exit 1) on any warning about an executed page, as sphinx's -W")
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
        if args.warnings_are_errors:
            returncode, counted, excused = run_checked(cmd + ["--keep-going"],
                                                       {(ROOT / p).resolve() for p in every if p not in args.pages})
        else:
            returncode = subprocess.run(cmd, cwd=ROOT).returncode
    finally:
        Path(fh.name).unlink()
    print(f"HTML in {out / '_build' / 'html'}")
    if args.warnings_are_errors:
        print(f"{excused} warnings in pages not executed, ignored; {len(counted)} in the pages built:")
        print("\n".join(counted))
        if counted and returncode == 0:
            return 1
    return returncode


if __name__ == "__main__":
    sys.exit(main())
