"""Mutation testing of batchlab with mutmut 3, in a scratch copy of the tree (``make mutate``; not in CI).

    python scripts/mutate.py [PATH ...] [--tests TEST ...] [--workdir DIR] [--max-children N]
                           [--strata] [--sample N] [--seed S] [--rev REV]

PATHs are files or folders under ``batchlab/`` (default: :data:`DEFAULT_PATHS`, the metrics, the cost model and the
kernel's cost formula); ``batchlab`` mutates everything (hours without ``--sample``). The tree (tracked and
untracked, not ignored, files; with ``--rev REV`` the tracked files of commit REV, from ``git archive``) is copied
to ``DIR`` (default ``_build/mutate``), mutmut's configuration is appended to the copy's ``pyproject.toml``, and
mutmut runs there, so the working tree never holds a mutant. Test files the tree does not have (``--rev 065a19c``
lacks three of :data:`DEFAULT_TESTS`) are dropped with a note; every other top-level entry of the tree (notebooks,
data, book, ``_toc.yml``...) is copied next to the mutants, since tests read them relative to the root.

Two things make a numba package awkward for mutmut 3, handled here:

* mutmut 3 does not mutate decorated functions, so every ``@njit`` kernel would be skipped. In the copy, the
  ``@njit(...)`` lines of the mutated files under ``batchlab/_kernels/`` are removed.
* A mutant of a jitted function would be recompiled for every mutant, and plain functions called from jitted ones
  do not compile at all; so a run that mutates kernel files sets ``NUMBA_DISABLE_JIT=1``: the kernels run as plain
  Python, which the fast test subset :data:`DEFAULT_TESTS` tolerates (about 30 s for the whole subset).

**Strata.** Without ``--strata`` (and for any scope other than the whole ``batchlab`` package) there is one
mutmut workdir, JIT off, tests ``--tests`` (default :data:`DEFAULT_TESTS`), as before; the default scope works
that way although it mixes a kernel file with two plain modules. With ``--strata``, or when a PATH is the whole
``batchlab`` package, the files are split in two strata, each its own mutmut workdir:

* ``DIR-kernels``: the files under ``batchlab/_kernels/``, ``@njit`` removed, ``NUMBA_DISABLE_JIT=1``, tests
  ``--tests`` (default :data:`DEFAULT_TESTS`);
* ``DIR-package``: every other file, JIT on (nothing jitted is mutated there), tests :func:`package_tests`: every
  ``tests/test_*.py`` and ``tests/chapters/test_*.py`` except the browser/live ones and ``tests/test_layout.py`` (it
  measures the source text, which mutmut rewrites); in both strata property-based tests (pytest's ``hypothesis``
  marker: hundreds of simulations per mutant) are deselected, the other tests of their files run.

``DIR`` itself then holds only the summaries. A stratum with no file is left out.

**Sampling.** ``--sample N`` scores a uniform random sample of N mutants (``--seed S``, default 0) instead of all:
mutmut first generates the mutants and collects its test coverage stats with a filter that matches nothing, the
mutant names are read from ``mutants/**/*.py.meta``, ``random.Random(S).sample(sorted(names), n)`` draws the
sample, and ``mutmut run NAME ...`` runs exactly those (in chunks of :data:`CHUNK` names, reusing the stats). With
two strata, N is split in proportion to the strata's mutant counts (at least 1 each); each stratum's score comes
with a 95 % Wilson interval (no finite-population correction: conservative), and the combined score is the
population-weighted mean of the strata with a 95 % normal interval from the stratified variance (finite-population
corrected; Agresti-Coull ``(k+2)/(n+4)`` in the variance so that a stratum whose sampled mutants were all killed
does not give a zero-width interval). Sampled mutants that end "not counted" shrink their stratum's sample.

**Scoring** uses mutmut's own ``status_by_exit_code``: killed = killed, timeout, segfault, caught by type check;
survived = survived and "no tests" (a mutant no selected test reaches is not killed); anything else (not checked,
skipped, suspicious, interrupted) is reported as not counted. Score = killed / (killed + survived).

Outputs: ``DIR/mutation-score.txt`` (per-file lines, one line per stratum, and the combined line), with
``--sample`` also ``DIR/sample.txt`` (every sampled mutant with its stratum and status).

``@property`` and ``@cached_property`` methods are decorated too, so mutmut leaves them alone (scripts/MUTANTS.md
lists what that leaves out).
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from mutmut.stats import status_by_exit_code

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PATHS = ["batchlab/metrics.py", "batchlab/cost.py", "batchlab/_kernels/cost.py"]
# Fast tests that pin metrics, the cost model and the schedule by hand; no property tests (hundreds of runs per
# mutant), no notebooks, no browser.
DEFAULT_TESTS = ["tests/test_metrics.py", "tests/test_metrics_streaming.py", "tests/test_cost.py",
                 "tests/test_bad_inputs.py", "tests/test_input_validation.py", "tests/test_sim_cases.py",
                 "tests/test_scheduler_rules.py", "tests/test_vllm_rules.py", "tests/test_generators.py"]
KERNELS = "batchlab/_kernels/"
MARKERS = "not browser and not live and not needs_data and not hypothesis"  # pytest -m for every mutant
# Left out of the package stratum's broad test set besides the browser/live files: tests that read
# the package's source text, which mutmut rewrites (trampolines make every mutated module thousands of lines).
PACKAGE_EXCLUDE = ["tests/test_layout.py"]
KILLED = {"killed", "timeout", "segfault", "caught by type check"}
SURVIVED = {"survived", "no tests"}
NO_MATCH = "__no_such_mutant__"
CHUNK = 400  # mutant names per `mutmut run` command line (names are ~60-120 bytes)
Z = 1.959963984540054


@dataclass
class Stratum:
    name: str  # "kernels", "package" or "all" (single workdir)
    paths: list[str]  # files (or "dir/*" patterns) to mutate, relative to the tree
    tests: list[str]
    jit: bool
    dest: Path
    population: dict[str, int | None] = field(default_factory=dict)  # mutant name -> exit code
    sample: list[str] = field(default_factory=list)
    stderr: str = ""


def copy_tree(dest: Path, rev: str | None) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if rev:
        tar = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, check=True,
                             capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            archive.extractall(dest, filter="data")
        return
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
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


def expand(tree: Path, paths: list[str]) -> list[str]:
    """The .py files under ``tree`` that PATHs name (a file, or every file of a folder)."""
    out = []
    for p in paths:
        p = p.rstrip("/")
        if (tree / p).is_dir():
            out += sorted(os.path.relpath(f, tree) for f in glob.glob(str(tree / p / "**" / "*.py"), recursive=True))
        elif (tree / p).is_file():
            out.append(p)
        else:
            print(f"note: {p} does not exist in this tree, skipped")
    return list(dict.fromkeys(out))


def package_tests(tree: Path) -> list[str]:
    """Every test file of ``tree`` but the browser/live and :data:`PACKAGE_EXCLUDE` ones (property-based tests are
    deselected by the ``hypothesis`` marker, so the other tests of their files still run)."""
    out = []
    for name in sorted(glob.glob(str(tree / "tests" / "test_*.py")) + glob.glob(str(tree / "tests" / "chapters" /
                                                                                       "test_*.py"))):
        text = Path(name).read_text()
        if os.path.relpath(name, tree) in PACKAGE_EXCLUDE:
            continue
        if "playwright" in text or re.search(r"^pytestmark\s*=.*\b(browser|live)\b", text, flags=re.MULTILINE):
            continue
        out.append(os.path.relpath(name, tree))
    return out


def existing_tests(tree: Path, tests: list[str], label: str) -> list[str]:
    kept = []
    for t in tests:
        if (tree / t.split("::")[0]).exists():
            kept.append(t)
        else:
            print(f"note ({label}): {t} does not exist in this tree, dropped from the test selection")
    return kept


def also_copy(dest: Path) -> list[str]:
    """Every top-level entry of the tree but the package, the tests (mutmut copies those) and VCS/tool state: the
    tests read notebooks, data, the book's _toc.yml and the like relative to the root, and run in ``mutants/``."""
    skip = {"batchlab", "tests", "mutants", "pyproject.toml", ".git", ".venv", "_build"}
    return sorted(p.name + ("/" if p.is_dir() else "") for p in dest.iterdir() if p.name not in skip)


def configure(dest: Path, paths: list[str], tests: list[str]) -> None:
    def toml_list(items):
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"
    config = f"""

[tool.mutmut]
source_paths = ["batchlab/"]
only_mutate = {toml_list(paths)}
pytest_add_cli_args = ["-p", "no:randomly", "-q", "-x", "-m", {json.dumps(MARKERS)}]
pytest_add_cli_args_test_selection = {toml_list(tests)}
also_copy = {toml_list(also_copy(dest))}
"""
    with open(dest / "pyproject.toml", "a") as fh:
        fh.write(config)


def metas(dest: Path) -> list[tuple[str, dict]]:
    """(source file, parsed meta) for every mutmut meta file of a workdir."""
    out = []
    for meta in sorted(glob.glob(str(dest / "mutants" / "**" / "*.py.meta"), recursive=True)):
        out.append((os.path.relpath(meta, dest / "mutants")[:-5], json.loads(Path(meta).read_text())))
    return out


def exit_codes(dest: Path) -> dict[str, tuple[str, int | None]]:
    """Mutant name -> (source file, exit code)."""
    out = {}
    for name, data in metas(dest):
        for key, code in data.get("exit_code_by_key", {}).items():
            out[key] = (name, code)
    return out


def classify(code: int | None) -> str:
    status = status_by_exit_code[code]
    return "killed" if status in KILLED else "survived" if status in SURVIVED else "not counted"


@dataclass
class Tally:
    killed: int = 0
    survived: int = 0
    no_tests: int = 0
    other: int = 0

    def add(self, code: int | None) -> None:
        kind = classify(code)
        if kind == "killed":
            self.killed += 1
        elif kind == "survived":
            self.survived += 1
            self.no_tests += status_by_exit_code[code] == "no tests"
        else:
            self.other += 1

    @property
    def n(self) -> int:
        return self.killed + self.survived

    def line(self, label: str) -> str:
        return (f"{label}: {self.killed} killed, {self.survived} survived (of which {self.no_tests} no tests), "
                f"{self.other} not counted, score {self.killed / max(self.n, 1):.1%}")


def wilson(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z / (1 + Z * Z / n) * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def mutmut_run(stratum: Stratum, names: list[str], max_children: int, quiet: bool = False) -> int:
    """``mutmut run`` in the stratum's workdir; ``quiet`` keeps stderr (returned via ``stratum.stderr``)."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if stratum.jit:
        env.pop("NUMBA_DISABLE_JIT", None)
    else:
        env["NUMBA_DISABLE_JIT"] = "1"
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    done = subprocess.run([mutmut, "run", "--max-children", str(max_children), *names], cwd=stratum.dest, env=env,
                          stderr=subprocess.PIPE if quiet else None, text=True)
    stratum.stderr = done.stderr or ""
    return done.returncode


def prepare(stratum: Stratum, rev: str | None) -> None:
    copy_tree(stratum.dest, rev)
    if stratum.name == "package":
        stratum.tests = package_tests(stratum.dest)
    else:
        stratum.tests = existing_tests(stratum.dest, stratum.tests, stratum.name)
    for name in stratum.paths:
        if name.startswith(KERNELS) and name.endswith(".py") and not stratum.jit:
            print(f"[{stratum.name}] {name}: {strip_njit(stratum.dest / name)} @njit lines removed")
    configure(stratum.dest, stratum.paths, stratum.tests)


def allocate(sizes: list[int], n: int) -> list[int]:
    """Split n in proportion to sizes (largest remainder), at least 1 per non-empty stratum, at most its size."""
    total = sum(sizes)
    if n >= total:
        return list(sizes)
    quota = [n * s / total for s in sizes]
    out = [min(s, max(1 if s else 0, int(q))) for s, q in zip(sizes, quota)]
    order = sorted(range(len(sizes)), key=lambda i: quota[i] - int(quota[i]), reverse=True)
    while sum(out) < n:
        for i in order:
            if sum(out) < n and out[i] < sizes[i]:
                out[i] += 1
    while sum(out) > n:  # the "at least 1" floors took too many: take back from the largest
        i = max(range(len(sizes)), key=lambda j: out[j])
        out[i] -= 1
    return out


def under(name: str, path: str) -> bool:
    """``name`` is the file ``path`` or lies below the folder ``path``."""
    path = path.rstrip("/")
    return name == path or name.startswith(path + "/")


def stratified(per_stratum: list[tuple[int, int, Tally]]) -> tuple[float, float]:
    """Score and 95 % half-width of a stratified sample, from (population, sampled, tally) per stratum: strata
    weighted by population, each stratum's variance from (k + 2) / (n + 4) (no zero width when every sampled mutant
    was killed) with the finite-population correction."""
    big_n = sum(population for population, _, _ in per_stratum)
    est = var = 0.0
    for population, _, t in per_stratum:
        w = population / big_n
        pa = (t.killed + 2) / (t.n + 4)
        est += w * (t.killed / t.n if t.n else 0.5)
        var += w * w * pa * (1 - pa) / (t.n + 4) * max(1 - t.n / population if population else 0.0, 0.0)
    return est, Z * math.sqrt(var)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", default=DEFAULT_PATHS)
    parser.add_argument("--tests", nargs="+", default=DEFAULT_TESTS,
                        help="tests of the single workdir, or of the kernel stratum with --strata")
    parser.add_argument("--workdir", default=str(ROOT / "_build" / "mutate"))
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--strata", action="store_true",
                        help="kernels (JIT off) and the rest (JIT on, broad tests) in two workdirs; implied by "
                             "the path `batchlab`")
    parser.add_argument("--sample", type=int, default=None, help="score a random sample of N mutants")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rev", default=None, help="mutate the tracked files of this commit (git archive)")
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # keep our lines in order with mutmut's when logged to a file
    if args.sample is not None and args.sample < 1:
        parser.error("--sample must be at least 1")
    rev = None
    if args.rev:
        rev = subprocess.run(["git", "rev-parse", "--verify", args.rev + "^{commit}"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.strip()
        print(f"mutating the tracked files of {rev}")
    workdir = Path(args.workdir).resolve()
    split = args.strata or any(p.rstrip("/") == "batchlab" for p in args.paths)

    if split:
        # File lists come from the tree being mutated: the working tree, or the revision (listed by git).
        if rev:
            listing = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev], cwd=ROOT, check=True,
                                     capture_output=True, text=True).stdout.split()
            files = [f for f in listing if f.endswith(".py") and any(under(f, p) for p in args.paths)]
            for p in args.paths:
                if not any(under(f, p) for f in files):
                    print(f"note: {p} does not exist in {rev[:10]}, skipped")
        else:
            files = expand(ROOT, args.paths)
        kernel_files = [f for f in files if f.startswith(KERNELS)]
        other_files = [f for f in files if not f.startswith(KERNELS)]
        strata = []
        if kernel_files:
            strata.append(Stratum("kernels", kernel_files, args.tests, False, Path(f"{workdir}-kernels")))
        if other_files:
            strata.append(Stratum("package", other_files, [], True, Path(f"{workdir}-package")))
        if not strata:
            parser.error("nothing to mutate")
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        paths = [p.rstrip("/") + ("/*" if (ROOT / p).is_dir() else "") for p in args.paths]
        strata = [Stratum("all", paths, args.tests, False, workdir)]

    for s in strata:
        prepare(s, rev)
        print(f"[{s.name}] {len(s.paths)} path(s), {len(s.tests)} test file(s), JIT {'on' if s.jit else 'off'}, "
              f"workdir {s.dest}")

    rc = 0
    if args.sample is None:
        for s in strata:
            rc = mutmut_run(s, [], args.max_children) or rc
            subprocess.run([str(Path(sys.executable).with_name("mutmut")), "results"], cwd=s.dest)
            s.population = {k: c for k, (_, c) in exit_codes(s.dest).items()}
            s.sample = sorted(s.population)
    else:
        for s in strata:
            print(f"[{s.name}] generating mutants and collecting stats (the run then stops: no mutant is named "
                  f"{NO_MATCH})")
            start = time.monotonic()
            mutmut_run(s, [NO_MATCH], args.max_children, quiet=True)  # ends in an AssertionError: expected
            s.population = {k: c for k, (_, c) in exit_codes(s.dest).items()}
            print(f"[{s.name}] {len(s.population)} mutants; generation and stats took {time.monotonic() - start:.0f} s")
            if not (s.dest / "mutants" / "mutmut-stats.json").exists():
                print(s.stderr, file=sys.stderr)
                print(f"[{s.name}] mutmut could not collect its stats (a test failed?): see the output above")
                return 1
            if not s.population:
                print(f"[{s.name}] no mutants were generated")
                return 1
        sizes = allocate([len(s.population) for s in strata], args.sample)
        for s, n in zip(strata, sizes):
            s.sample = random.Random(args.seed).sample(sorted(s.population), n)
            print(f"[{s.name}] running {n} of {len(s.population)} mutants (seed {args.seed})")
            for i in range(0, n, CHUNK):
                rc = mutmut_run(s, s.sample[i:i + CHUNK], args.max_children) or rc

    # Scores
    lines, sample_lines, per_stratum = [], [], []
    for s in strata:
        codes = exit_codes(s.dest)
        by_file: dict[str, Tally] = {}
        tally = Tally()
        for key in s.sample:
            # mutmut stores the result of a mutant of an __init__.py under the name without "__init__."
            fname, code = codes.get(key, ("?", None))
            if code is None and key.replace("__init__.", "") in codes:
                code = codes[key.replace("__init__.", "")][1]
            by_file.setdefault(fname, Tally()).add(code)
            tally.add(code)
            sample_lines.append(f"{s.name}\t{key}\t{status_by_exit_code[code]}\t{classify(code)}")
        for fname in sorted(by_file):
            lines.append(by_file[fname].line(fname))
        label = s.name if s.name != "all" else "total"
        population = len(s.population)
        if args.sample is None:
            lines.append(tally.line(f"{label} (all {population} mutants)"))
        else:
            lo, hi = wilson(tally.killed, tally.n)
            lines.append(tally.line(f"{label} (sample of {len(s.sample)} of {population} mutants)")
                         + f", 95 % Wilson interval {lo:.1%} to {hi:.1%}")
        per_stratum.append((population, len(s.sample), tally))
    if len(strata) > 1:
        big_n = sum(p for p, _, _ in per_stratum)
        if args.sample is None:
            k = sum(t.killed for _, _, t in per_stratum)
            n = sum(t.n for _, _, t in per_stratum)
            lines.append(f"combined (all {big_n} mutants): {k} killed of {n} counted, score {k / max(n, 1):.1%}")
        else:
            est, half = stratified(per_stratum)
            lines.append(f"combined (stratified sample of {sum(d for _, d, _ in per_stratum)} of {big_n} mutants): "
                         f"score {est:.1%}, 95 % interval {max(0.0, est - half):.1%} to {min(1.0, est + half):.1%} "
                         f"(strata weighted by population: "
                         + ", ".join(f"{s.name} {p}" for s, (p, _, _) in zip(strata, per_stratum)) + ")")
    if rev:
        lines.append(f"tree: {rev}")
    (workdir / "mutation-score.txt").write_text("\n".join(lines) + "\n")
    if args.sample is not None:
        (workdir / "sample.txt").write_text("stratum\tmutant\tstatus\tcounted as\n" + "\n".join(sample_lines) + "\n")
    print("\n".join(lines))
    print(f"written: {workdir / 'mutation-score.txt'}" + (f", {workdir / 'sample.txt'}" if args.sample else ""))
    return rc


if __name__ == "__main__":
    sys.exit(main())
