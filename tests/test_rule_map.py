"""The rule map of ``batchlab/_kernels/__init__.py`` (issue 25): every vLLM 0.33 rule batchlab follows names the
vLLM source it was read from, the function that implements it, the plain-Python reference that mirrors it and the
hand-worked test that pins it; each named function and test must exist, so the map cannot rot when code moves.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from batchlab import _kernels

TESTS = Path(__file__).resolve().parent
VLLM_FILES = ("vllm/v1/core/sched/scheduler.py", "vllm/v1/core/sched/async_scheduler.py",
              "vllm/v1/core/kv_cache_manager.py", "vllm/v1/core/block_pool.py", "vllm/v1/core/kv_cache_utils.py",
              "vllm/config/scheduler.py", "vllm/config/cache.py", "vllm/engine/arg_utils.py",
              "vllm/v1/worker/gpu_worker.py", "vllm/benchmarks/serve.py", "vllm/v1/engine/input_processor.py",
              "vllm/entrypoints/utils.py")


def _defined(path: Path) -> set[str]:
    """Dotted names of every function and class defined in ``path``, nested ones as ``outer.inner``."""
    names = set()

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(prefix + child.name)
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text()), "")
    return names


def _resolve(dotted: str):
    """``batchlab.x.y.f`` -> the object, importing the longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _where(ref: str) -> tuple[Path, str]:
    file, name = ref.split("::")
    return TESTS.parent / file, name


def test_the_map_covers_the_rules():
    assert len(_kernels.RULE_MAP) >= 15
    assert len({rule.rule for rule in _kernels.RULE_MAP}) == len(_kernels.RULE_MAP)


@pytest.mark.parametrize("rule", _kernels.RULE_MAP, ids=lambda r: r.rule[:40])
def test_each_named_function_and_test_exists(rule):
    assert rule.vllm_source.split(" ")[0] in VLLM_FILES, rule.vllm_source
    assert callable(_resolve(rule.kernel)), rule.kernel
    for ref in (rule.reference, rule.test):
        path, name = _where(ref)
        assert path.is_file(), ref
        assert name in _defined(path), f"{ref}: no such function in {path.name}"
    assert rule.test.split("::")[1].startswith("test_")


def test_a_stale_name_fails():
    """The checks above do fail on a name that is not there."""
    with pytest.raises(AttributeError):
        _resolve("batchlab._kernels.iterations.no_such_function")
    path, _ = _where("tests/test_vllm_rules.py::test_schedule_order")
    assert "test_no_such_test" not in _defined(path) and "test_schedule_order" in _defined(path)
