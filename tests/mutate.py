"""Mutation testing of batchlab with mutmut 3, in a scratch copy of the working tree (``make mutate``; not in CI).

    python tests/mutate.py [PATH ...] [--tests TEST ...] [--workdir DIR] [--max-children N]

PATHs are files under ``batchlab/`` (default: :data:`DEFAULT_PATHS`, the metrics, the cost model and the kernel's
cost formula); ``batchlab`` mutates everything (hours). The tree (tracked and untracked, not ignored, files) is
copied to ``DIR`` (default ``_build/mutate``), mutmut's configuration is appended to the copy's
``pyproject.toml``, and mutmut runs there, so the working tree never holds a mutant.

Two things make a numba package awkward for mutmut 3, handled here:

* mutmut 3 does not mutate decorated functions, so every ``@njit`` kernel would be skipped. In the copy, the
  ``@njit(...)`` lines of the mutated files under ``batchlab/_kernels/`` are removed.
* A mutant of a jitted function would be recompiled for every mutant, and plain functions called from jitted ones
  do not compile at all; so every run sets ``NUMBA_DISABLE_JIT=1``: the kernels run as plain Python, which the
  fast test subset below tolerates (about 30 s for the whole subset).

``@property`` and ``@cached_property`` methods are decorated too, so mutmut leaves them alone (tests/MUTANTS.md
lists what that leaves out). The score printed at the end is killed / (killed + survived) per file.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PATHS = ["batchlab/metrics.py", "batchlab/cost.py", "batchlab/_kernels/cost.py"]
# Fast tests that pin metrics, the cost model and the schedule by hand; no property tests (hundreds of runs per
# mutant), no notebooks, no browser.
DEFAULT_TESTS = ["tests/test_metrics.py", "tests/test_metrics_streaming.py", "tests/test_cost.py",
                 "tests/test_bad_inputs.py", "tests/test_input_validation.py", "tests/test_sim_cases.py",
                 "tests/test_scheduler_rules.py", "tests/test_vllm_rules.py", "tests/test_generators.py"]


def copy_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    if dest.exists():
        shutil.rmtree(dest)
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def strip_njit(path: Path) -> int:
    text = path.read_text()
    new, n = re.subn(r"^[ \t]*@njit(\(.*\))?[ \t]*\n", "", text, flags=re.MULTILINE)
    path.write_text(new)
    return n


def configure(dest: Path, paths: list[str], tests: list[str]) -> None:
    def toml_list(items):
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"
    config = f"""

[tool.mutmut]
source_paths = ["batchlab/"]
only_mutate = {toml_list(paths)}
pytest_add_cli_args = ["-p", "no:randomly", "-q", "-x", "-m", "not browser and not live and not needs_data"]
pytest_add_cli_args_test_selection = {toml_list(tests)}
also_copy = ["data/", "DESIGN.md", "book/"]
"""
    with open(dest / "pyproject.toml", "a") as fh:
        fh.write(config)


def scores(dest: Path) -> dict[str, tuple[int, int]]:
    """File -> (killed, survived) from mutmut's meta files."""
    out = {}
    for meta in sorted(glob.glob(str(dest / "mutants" / "**" / "*.py.meta"), recursive=True)):
        codes = json.loads(Path(meta).read_text()).get("exit_code_by_key", {}).values()
        killed = sum(1 for c in codes if c not in (0, None))
        survived = sum(1 for c in codes if c == 0)
        out[os.path.relpath(meta, dest / "mutants")[:-5]] = (killed, survived)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", default=DEFAULT_PATHS)
    parser.add_argument("--tests", nargs="+", default=DEFAULT_TESTS)
    parser.add_argument("--workdir", default=str(ROOT / "_build" / "mutate"))
    parser.add_argument("--max-children", type=int, default=2)
    args = parser.parse_args(argv)
    paths = [p.rstrip("/") + ("/*" if (ROOT / p).is_dir() else "") for p in args.paths]
    dest = Path(args.workdir).resolve()
    copy_tree(dest)
    for path in args.paths:
        names = [str(dest / path)] if path.endswith(".py") else glob.glob(str(dest / path / "**" / "*.py"),
                                                                          recursive=True)
        for name in names:
            if "/_kernels/" in name and name.endswith(".py"):
                print(f"{os.path.relpath(name, dest)}: {strip_njit(Path(name))} @njit lines removed")
    configure(dest, paths, args.tests)
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1", "PYTHONHASHSEED": "0"}
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    run = subprocess.run([mutmut, "run", "--max-children", str(args.max_children)], cwd=dest, env=env)
    subprocess.run([mutmut, "results"], cwd=dest, env=env)
    lines = []
    total_k = total_s = 0
    for name, (k, s) in scores(dest).items():
        total_k, total_s = total_k + k, total_s + s
        lines.append(f"{name}: {k} killed, {s} survived, score {k / max(k + s, 1):.1%}")
    lines.append(f"total: {total_k} killed, {total_s} survived, score {total_k / max(total_k + total_s, 1):.1%}")
    (dest / "mutation-score.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
