"""The package's shape (issues 9, 25): no import cycle among batchlab's modules, no module or function too long,
the kernels behind the engine layer.

Every ``import`` of a batchlab module counts, lazy ones inside functions included, so a cycle cannot hide
behind a function-level import; so does the package ``__init__`` an import runs first (``from ..calibrate.readback
import x`` runs ``batchlab/calibrate/__init__.py``). Each size test prints the largest module or function it found.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "batchlab"
MAX_MODULE_LINES = 600  # DESIGN section 2
MAX_FUNCTION_LINES = 100  # DESIGN section 2


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (``batchlab.chapters`` for its ``__init__``)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The batchlab modules that module ``name`` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # ``from . import viz`` imports a module; ``from .cost import CostModel`` imports from one.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found | _package_edges(name, path, found, modules)


def _package_edges(name: str, path: Path, targets: set[str], modules: dict[str, Path]) -> set[str]:
    """The packages whose ``__init__`` importing ``targets`` runs first: each target's enclosing packages, less
    those that already enclose ``name`` (they were initialised before ``name`` could run)."""
    mine = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    enclosing = {".".join(mine.split(".")[:i]) for i in range(1, mine.count(".") + 2)}
    out = set()
    for target in targets:
        parts = target.split(".")
        out |= {".".join(parts[:i]) for i in range(1, len(parts))}
    return {p for p in out if p in modules and p not in enclosing and p != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_no_import_cycle():
    graph = _graph()
    assert graph["batchlab.sim"] >= {"batchlab._kernels", "batchlab.cost", "batchlab.result"}  # the walk sees imports
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_package_init_edges_are_counted():
    """An import of a module in another package counts as an import of that package's ``__init__``: the cycle
    calibrate -> validate -> calibrate.presets (now .readback) -> calibrate/__init__ (issue 25) was invisible
    without it."""
    modules = _modules()
    graph = _graph()
    assert "batchlab.calibrate" not in graph["batchlab.validate.ablation"]  # no longer imported, not hidden
    assert "batchlab.validate" in graph["batchlab.calibrate.serving"]  # calibrate sits above validate
    planted = PACKAGE / "validate" / "ablation.py"
    edges = _imports("batchlab.validate.ablation", planted, modules)
    source = planted.read_text() + "\nfrom ..calibrate.readback import shipped_floors\n"
    tree_edges = _edges_of_source("batchlab.validate.ablation", planted, source, modules)
    assert "batchlab.calibrate" in tree_edges - edges  # the package __init__ edge a planted import adds
    assert _cycle({**graph, "batchlab.validate.ablation": tree_edges}) is not None  # and the cycle it closes


def _edges_of_source(name: str, path: Path, source: str, modules: dict[str, Path]) -> set[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / path.name
        copy.write_text(source)
        return _imports(name, copy, modules)


# Only the engine layer touches the jitted kernels; the rest of the package reaches them through its API.
ENGINE_LAYER = {"batchlab.sim", "batchlab.fleet", "batchlab.cost", "batchlab.result", "batchlab.metrics",
                "batchlab.vllm"}


def test_only_the_engine_layer_imports_the_kernels():
    users = {name for name, targets in _graph().items() if not name.startswith("batchlab._kernels")
             and any(t == "batchlab._kernels" or t.startswith("batchlab._kernels.") for t in targets)}
    print("modules importing batchlab._kernels:", sorted(users))
    assert users == ENGINE_LAYER, {"outside the engine layer": sorted(users - ENGINE_LAYER)}


def test_module_sizes():
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    largest = max(sizes, key=sizes.get)
    print(f"largest module: {largest}, {sizes[largest]} lines (limit {MAX_MODULE_LINES})")
    assert sizes[largest] <= MAX_MODULE_LINES, {k: v for k, v in sizes.items() if v > MAX_MODULE_LINES}


def test_function_sizes():
    lengths = {}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths[f"{name}.{node.name}:{node.lineno}"] = node.end_lineno - node.lineno + 1
    largest = max(lengths, key=lengths.get)
    print(f"largest function: {largest}, {lengths[largest]} lines (limit {MAX_FUNCTION_LINES})")
    assert lengths[largest] <= MAX_FUNCTION_LINES, {k: v for k, v in lengths.items() if v > MAX_FUNCTION_LINES}


def test_import_batchlab_leaves_the_fit_and_the_replays_unloaded():
    """``import batchlab`` (every sweep worker's first line) loads neither SciPy's optimisers nor the calibration
    and validation packages that need them; ``bl.validate`` and ``bl.calibrate`` load on first use."""
    import subprocess
    import sys

    code = ("import sys, batchlab as bl\n"
            "heavy = sorted(m for m in sys.modules if m == 'scipy.optimize' or m.startswith(('batchlab.validate',"
            " 'batchlab.calibrate')))\n"
            "print(heavy)\n"
            "print(bl.validate.replay_all.__module__, bl.calibrate.fit.__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]", out[0]
    assert out[1] == "batchlab.validate.tables batchlab.calibrate.fit", out[1]


def test_vllm_facts_live_in_one_module():
    """Every fact taken from vLLM is assigned in ``batchlab/vllm.py``: no other module assigns a ``VLLM_*`` name or
    vLLM's defaults, and the chunked policy's rule bits are named only by the kernels (their values) and by
    ``vllm.py`` (which option sets which bit)."""
    facts = {"KNOB_POLICIES", "CHUNKED_SWITCHES", "ALWAYS_ON", "BLOCK_SIZE", "GPU_MEMORY_UTILIZATION"}
    assigned, rule_users = {}, set()
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    for t in ast.walk(target):
                        if isinstance(t, ast.Name) and (t.id.startswith("VLLM_") or t.id in facts):
                            assigned.setdefault(t.id, set()).add(name)
            if isinstance(node, ast.Name) and node.id.startswith("RULE_"):
                rule_users.add(name)
            if isinstance(node, ast.alias) and node.name.startswith("RULE_"):
                rule_users.add(name)
    assert set(assigned) >= facts | {"VLLM_VERSION", "VLLM_SEQS", "VLLM_TOKENS", "VLLM_FIXED_RESERVED_BYTES"}
    elsewhere = {k: v for k, v in assigned.items() if v != {"batchlab.vllm"}}
    assert not elsewhere, elsewhere
    assert {m for m in rule_users if not m.startswith("batchlab._kernels")} == {"batchlab.vllm"}, rule_users
