"""Every numba-jitted function of batchlab: the step cost and the scheduler loops with their helpers.

Kernels take and return NumPy arrays and scalars, read no mutable globals and draw no random numbers; the
integer slot names of :mod:`.layout` are frozen into the compiled code. The public wrappers are
:class:`batchlab.CostModel` (the step cost) and :func:`batchlab.simulate` (the loops); the plain-Python
reference in ``tests/reference.py`` must agree with both.

Modules: :mod:`.layout` (slot names), :mod:`.state` (the NamedTuples that cross calls: inputs, an engine's state,
its loop's settings, outputs), :mod:`.cost` (the step cost), :mod:`.records` (growing records),
:mod:`.gaps` (the inter-token gap histogram), :mod:`.batched` (static and dynamic batching), :mod:`.kvcache` (the
block pool and prefix cache), :mod:`.iterations` (the steps of continuous and chunked), :mod:`.engine` (their
loop, resumable) and :mod:`.fleet` (several engines: replicas behind a router, disaggregated prefill and decode).

Helpers that never allocate are compiled with ``_nrt=False``: the arrays they are passed are borrowed from the
loop that owns them, so numba emits no reference counting for them. Those counts are atomic operations, and
around calls LLVM cannot inline they cost a third of the loop's time; numba refuses to compile such a helper if
it ever allocates, so the flag cannot hide a leak. Numba's on-disk cache notices only edits to a function's own file,
not to the functions it calls in other files, so this package keys its cache folder by a hash of all its
sources: an edit anywhere recompiles everything once, and a stale kernel is never loaded.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numba

_SOURCES = sorted(Path(__file__).resolve().parent.glob("*.py"))
SOURCE_STAMP = hashlib.sha256(b"".join(p.read_bytes() for p in _SOURCES)).hexdigest()[:16]


def _cache_dir() -> str:
    """``$NUMBA_CACHE_DIR`` (else ``~/.cache/batchlab/numba``), one folder per version of these sources."""
    base = os.environ.get("NUMBA_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                                       "batchlab", "numba")
    return str(Path(base, SOURCE_STAMP))


_previous_cache_dir = numba.config.CACHE_DIR
numba.config.CACHE_DIR = _cache_dir()  # read when each @njit(cache=True) below is decorated
try:
    from .cost import step_cost
    from .entry import simulate_kernel
    from .fleet import fleet_kernel
    from .layout import *  # noqa: F403 - the slot names are this package's interface
    from .state import Engine, FleetOutput, KernelOutput, Knobs, LoopConfig, Stream
finally:
    numba.config.CACHE_DIR = _previous_cache_dir

__all__ = ["SOURCE_STAMP", "Engine", "FleetOutput", "KernelOutput", "Knobs", "LoopConfig", "Stream", "fleet_kernel",
           "simulate_kernel", "step_cost"]
