"""One input-checking layer for the public API (not :mod:`batchlab.validate`, which checks predictions against
measured runs): every refusal a ``ValueError`` naming the field, the value and what is allowed.

The rules, the same everywhere:

* integers are checked for range before any cast to a fixed-width type, so nothing wraps;
* ``bool`` (and ``numpy.bool_``) is accepted only where a flag is meant, and refused as a number
  (``overhead_s=True`` is an error, not one second);
* strings are refused as flags (``bool("no")`` is True) and as numbers;
* NumPy scalars (``np.int64``, ``np.float32``) are accepted wherever Python numbers are.

Bounds that keep the kernels' int64 arithmetic from overflowing are stated here once and quoted in the
docstrings of :class:`batchlab.Requests` and :func:`batchlab.simulate`.
"""
from __future__ import annotations

import math

import numpy as np

# Tokens of one prompt or one output. 2**40 is about 1.1e12 tokens, five orders of magnitude past any model's
# context, so the limit only refuses mistakes (2**63, 1e19, epoch nanoseconds read as tokens), and a request's
# prompt + output (<= 2**41) and a stream's total (checked against MAX_STREAM_TOKENS) stay far inside int64.
MAX_TOKENS = 2**40
# Prompt plus output tokens summed over a whole stream: the kernel's token offsets are a running sum in int64.
MAX_STREAM_TOKENS = 2**62
# Seconds an arrival may lie after the stream's first. 1e8 s is about 3.2 years: a larger value is an epoch
# timestamp (1.7e9 s, 1.7e12 ms or 1.7e18 ns since 1970) passed where seconds since the first request are meant.
MAX_ARRIVAL_S = 1e8
INT64_MAX = 2**63 - 1

_INTEGER_TYPES = (int, np.integer)
_REAL_TYPES = (int, float, np.integer, np.floating)
_BOOL_TYPES = (bool, np.bool_)


def integer(name: str, value, low: int, high: int) -> int:
    """``value`` as a Python int in [low, high]; bools, floats and strings refused."""
    if isinstance(value, _BOOL_TYPES) or not isinstance(value, _INTEGER_TYPES) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer from {low} to {high}, got {value!r}")
    return int(value)


def real(name: str, value, low: float = -math.inf, high: float = math.inf, *, low_open: bool = False,
         high_open: bool = False, allow_inf: bool = False, allowed: str | None = None) -> float:
    """``value`` as a float in the interval from ``low`` to ``high``; bools, strings, NaN and (unless ``allow_inf``)
    infinities refused. ``allowed`` replaces the range in the message."""
    if allowed is None:
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        allowed = f"a number in {left}{low:g}, {high:g}{right}"
        if not allow_inf:
            allowed = "a finite " + allowed[2:]
    ok = isinstance(value, _REAL_TYPES) and not isinstance(value, _BOOL_TYPES)
    if ok:
        try:
            x = float(value)
        except OverflowError:  # a Python int past 1.8e308
            x = math.inf if value > 0 else -math.inf
        ok = (not math.isnan(x) and (allow_inf or math.isfinite(x))
              and (x > low if low_open else x >= low) and (x < high if high_open else x <= high))
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return x


def flag(name: str, value, default: bool | None = None) -> bool:
    """``value`` as a bool: True or False only (``None`` gives ``default`` when one is given); strings and
    numbers refused, since ``bool("no")`` and ``bool(0.5)`` are True."""
    if value is None and default is not None:
        return default
    if not isinstance(value, _BOOL_TYPES):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def choice(name: str, value, allowed) -> str:
    """``value`` if it is one of the strings ``allowed``; other strings, lists and unhashable values refused."""
    allowed = list(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def token_array(values, field: str) -> np.ndarray:
    """A one-dimensional int64 array of token counts, each from 1 to :data:`MAX_TOKENS`, range-checked before the
    cast (so 2**63, 1e19, 1e300 and uint64's maximum are refused, never wrapped)."""
    allowed = f"whole numbers from 1 to 2**40 ({MAX_TOKENS:,})"
    a = np.asarray(values)
    if a.ndim != 1:
        raise ValueError(f"{field} must be a one-dimensional array of token counts ({allowed})")
    if a.dtype.kind not in "iuf":  # bool, complex, object (Python ints past uint64), strings, datetimes
        raise ValueError(f"{field} must hold {allowed}, got dtype {a.dtype}")
    if a.dtype.kind == "f":
        if not np.isfinite(a).all():
            raise ValueError(f"{field} must hold finite {allowed} (found NaN or inf)")
        if (a != np.round(a)).any():
            raise ValueError(f"{field} must hold {allowed} (found a fraction)")
    if a.size and a.min() < 1:
        raise ValueError(f"{field} must hold {allowed}, found {a.min()}")
    if a.size and a.max() > MAX_TOKENS:
        raise ValueError(f"{field} must hold {allowed}, found {a.max():.6g}")
    return a.astype(np.int64)


def arrival_array(values) -> np.ndarray:
    """Arrivals as float64 seconds since the stream began.

    Numbers are seconds, each from 0 to :data:`MAX_ARRIVAL_S`. ``datetime64`` arrays, ``datetime.datetime`` or
    ``pandas.Timestamp`` values are converted to seconds since the first of them; ``timedelta64`` values to
    seconds. Complex numbers, strings and epoch-like values (1.7e9 s, 1.7e18 ns) are refused.
    """
    a = _datetimes_as_seconds(values)
    if a.ndim != 1:
        raise ValueError("arrival_s must be a one-dimensional array of seconds")
    if a.dtype.kind == "b" or a.dtype.kind not in "iuf":
        raise ValueError(f"arrival_s must hold real numbers of seconds since the stream began (or datetimes), "
                         f"got dtype {a.dtype}")
    a = a.astype(np.float64)
    if not np.isfinite(a).all():
        raise ValueError("arrival_s must be finite seconds >= 0 (found NaN or inf)")
    if a.size and a.min() < 0:
        raise ValueError(f"arrival_s must be seconds >= 0, found {a.min():g}")
    if a.size and a.max() > MAX_ARRIVAL_S:
        raise ValueError(
            f"arrival_s must be seconds since the stream began, from 0 to {MAX_ARRIVAL_S:g} (about 3 years); found "
            f"{a.max():.4g}, which looks like an epoch timestamp: pass seconds since the first request, e.g. "
            f"(t - t[0]) / 1e9 for nanoseconds, or the datetimes themselves (datetime64 or pandas Timestamps)")
    return a


def _datetimes_as_seconds(values) -> np.ndarray:
    """``values`` as an array; datetimes become seconds since the first, timedeltas seconds."""
    a = np.asarray(values)
    if a.dtype.kind == "O" and a.size and a.ndim == 1:
        import datetime

        import pandas as pd
        if all(isinstance(v, (datetime.datetime, np.datetime64)) for v in a):
            try:
                a = pd.to_datetime(a).to_numpy(dtype="datetime64[ns]")
            except (TypeError, ValueError) as exc:  # e.g. timezone-aware mixed with naive
                raise ValueError(f"arrival_s holds datetimes pandas cannot put on one clock: {exc}") from None
        elif all(isinstance(v, (datetime.timedelta, np.timedelta64)) for v in a):
            a = pd.to_timedelta(a).to_numpy(dtype="timedelta64[ns]")
    if a.dtype.kind == "M":
        if np.isnat(a).any():
            raise ValueError("arrival_s holds NaT (a missing datetime)")
        ns = a.astype("datetime64[ns]").astype(np.int64)
        return (ns - ns.min()) / 1e9 if ns.size else ns.astype(np.float64)
    if a.dtype.kind == "m":
        if np.isnat(a).any():
            raise ValueError("arrival_s holds NaT (a missing timedelta)")
        return a.astype("timedelta64[ns]").astype(np.int64) / 1e9
    return a


class CheckedTuple:
    """Mixin for a ``NamedTuple`` subclass that validates itself: on construction, and on ``_replace`` (which
    goes through ``_make``). The subclass defines ``check()``, raising ``ValueError`` and returning ``self``.
    Used by :class:`batchlab.Hardware` and :class:`batchlab.ModelSpec`."""

    __slots__ = ()

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls, *args, **kwargs)
        self.check()
        return self

    @classmethod
    def _make(cls, iterable):
        return cls(*iterable)  # so _replace validates too

