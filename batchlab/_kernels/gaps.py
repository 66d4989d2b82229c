"""Metrics the loops accumulate as they run: the histogram of inter-token gaps and the run totals.

The histogram (``layout.ITL_*``) is one float64 array of ``ITL_BINS`` rows, each (gaps counted, their sum, the
smallest and the largest, in seconds). Counts stay exact (integers below 2**53), so the mean gap is exact up to
rounding; a percentile read from it is exact when its order statistics are the smallest or largest of their bins
(always, when a bin holds one distinct value), and otherwise off by less than one bin's width,
``ITL_RELATIVE_ERROR`` of the value.
"""
from __future__ import annotations

import math

from numba import njit

from .layout import ITL_BINS, ITL_EXP_HI, ITL_EXP_LO, ITL_SUB, TOTAL_ITL_COUNT, TOTAL_ITL_S

GAP_FLOOR_S = 2.0 ** (ITL_EXP_LO - 1)  # gaps below this (and NaN) go to bin 0


@njit(cache=True, _nrt=False)
def gap_bin(gap):
    """The histogram bin of a gap of ``gap`` seconds: a power of two, then a linear share of that octave."""
    if not gap >= GAP_FLOOR_S:
        return 0
    mantissa, exponent = math.frexp(gap)  # gap = mantissa * 2**exponent, mantissa in [0.5, 1)
    if exponent > ITL_EXP_HI:
        return ITL_BINS - 1
    return (exponent - ITL_EXP_LO) * ITL_SUB + int((2.0 * mantissa - 1.0) * ITL_SUB) + 1


@njit(cache=True, _nrt=False)
def add_gaps(itl, totals, gap, count):
    """``count`` gaps of ``gap`` seconds each."""
    b = gap_bin(gap)
    if itl[b, 0] == 0:
        itl[b, 2] = gap
        itl[b, 3] = gap
    else:
        itl[b, 2] = min(itl[b, 2], gap)
        itl[b, 3] = max(itl[b, 3], gap)
    itl[b, 0] += count
    itl[b, 1] += gap * count
    totals[TOTAL_ITL_COUNT] += count
    totals[TOTAL_ITL_S] += gap * count
