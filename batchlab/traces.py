"""The one reader of request traces: a table of arrival times and token counts (and optionally prefix block ids)
turned into :class:`batchlab.Requests`, the same way for :func:`read_trace`, :func:`from_frame`,
:func:`batchlab.replay` (the registered public traces) and the command line's ``--dataset file.csv``
(:mod:`batchlab.loaders`).

Columns
-------
Found by name, case-insensitively and ignoring ``_``, ``-`` and spaces (``_ARRIVAL``, ``_PROMPT``, ``_OUTPUT`` list
the spellings tried), or named exactly. Token counts must be whole numbers >= 1. A prefix-block column holds a
list of block ids per row (a JSON list, or its text in a CSV cell: ``"[1, 2, 3]"``), ``prefix_block_tokens``
tokens per id (see :class:`batchlab.Requests`).

Arrival times
-------------
Datetime strings (or a pandas datetime column) are read as datetimes: seconds since the first, exact to the
microsecond and beyond (:func:`datetime_offsets_s`, never through float epoch seconds). Numbers are seconds
unless ``time_unit`` ("s", "ms", "us", "ns") says otherwise or the column's name ends in one of those units
(``arrival_ms``, ``timestamp_ns``). Numbers above 1e8 without a unit look like epoch timestamps in an unknown
unit (issue 16 found epoch nanoseconds read as seconds) and are refused. Rows are sorted by arrival, stably
(ties keep file order), and shifted so the first arrives at 0.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from .vllm import BLOCK_SIZE
from .workload import Requests

EPOCH_LIKE = 1e8  # arrival numbers above this (3 years in seconds) without a unit are refused
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}

# Column spellings tried, in order of preference; compared after _normalise (lower case, no "_", "-" or spaces).
_ARRIVAL = ("timestamp", "arrival_s", "arrival_time", "arrival_time_s", "arrival_timestamp", "arrival", "time",
            "time_s", "timestamp_s", "arrival_ms", "timestamp_ms", "time_ms", "arrival_us", "timestamp_us",
            "arrival_ns", "timestamp_ns")
_PROMPT = ("prompt_tokens", "input_tokens", "input_len", "input_length", "prompt_len", "prompt_length",
           "num_prompt_tokens", "num_input_tokens", "context_tokens", "num_prefill_tokens", "request_tokens",
           "prompt_token_count", "isl")
_OUTPUT = ("output_tokens", "output_len", "output_length", "generated_tokens", "num_decode_tokens",
           "completion_tokens", "num_output_tokens", "num_generated_tokens", "response_tokens",
           "output_token_count", "osl")


def datetime_offsets_s(values) -> np.ndarray:
    """Seconds from the earliest of ``values`` (datetimes, or text pandas reads as dates and times) to each.

    Exact to the digits the values hold: the differences are taken in integer nanoseconds, whatever resolution
    pandas infers (``datetime64[us]`` for "10:00:00.250", ``[ns]`` for Azure's seven digits), and only then turned
    into seconds, never through float epoch seconds (1.7e9 s, whose float spacing is 0.24 us). Naive times are
    read as written and offsets honoured (as UTC): only differences matter. Raises what pandas raises on text that
    is not a date. Used by :func:`arrival_seconds`."""
    stamps = pd.to_datetime(pd.Series(values), format="mixed", utc=True)
    ns = stamps.dt.tz_localize(None).astype("datetime64[ns]").astype("int64").to_numpy()
    return (ns - ns.min()) / 1e9 if ns.size else np.zeros(0)


def read_csv(path: Path) -> pd.DataFrame:
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a readable CSV ({str(err).strip().splitlines()[0]})") from None
    if df.empty:
        raise ValueError(f"{path}: has a header ({', '.join(map(str, df.columns))}) but no rows; expected one "
                         f"request per row")
    return df


def read_json_lines(path: Path, text: str) -> list:
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {lineno} is not valid JSON ({err.msg}); expected one JSON object "
                             f"per line") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}: line {lineno} is a JSON {type(record).__name__}, expected an object "
                             f"(one request per line)")
        records.append(record)
    return records


def _normalise(name) -> str:
    return re.sub(r"[\s_\-]", "", str(name).lower())


def find_column(df: pd.DataFrame, given: str | None, spellings: tuple, what: str, where: str) -> str | None:
    if given is not None:
        if given not in df.columns:
            raise ValueError(f"{where}: no {what} column {given!r}; columns are {list(map(str, df.columns))}")
        return given
    by_name = {}
    for col in df.columns:
        by_name.setdefault(_normalise(col), col)
    for spelling in spellings:
        if _normalise(spelling) in by_name:
            return by_name[_normalise(spelling)]
    return None


def _unit_from_name(column: str) -> str | None:
    match = re.search(r"[_\-\s](s|ms|us|ns)$", str(column).lower())
    return match.group(1) if match else None


def token_column(df: pd.DataFrame, column: str, where: str) -> np.ndarray:
    """The whole numbers >= 1 of ``column``, or a ValueError naming the first bad row."""
    raw = df[column]
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    if pd.api.types.is_bool_dtype(raw):
        is_bool = np.ones(len(raw), dtype=bool)
    elif pd.api.types.is_numeric_dtype(raw):
        is_bool = np.zeros(len(raw), dtype=bool)
    else:  # mixed values (JSON lines): a true/false among numbers is not a count
        is_bool = raw.map(lambda v: isinstance(v, (bool, np.bool_))).to_numpy(dtype=bool)
    with np.errstate(invalid="ignore"):
        bad = is_bool | ~np.isfinite(values) | (values != np.round(values)) | (values < 1)
    if bad.any():
        i = int(np.argmax(bad))
        v, r = values[i], raw.iloc[i]
        if is_bool[i]:
            what = "a boolean"
        elif math.isnan(v):
            what = "missing (NaN)" if pd.isna(r) else "not a number"
        elif math.isinf(v) or v != round(v):
            what = "not a whole number"
        else:
            what = "negative" if v < 0 else "zero"
        raise ValueError(f"{where}: {column!r} of row {i} is {what} ({r!r}); expected token counts, whole numbers "
                         f">= 1")
    return values.astype(np.int64)


def arrival_seconds(df: pd.DataFrame, column: str, time_unit: str | None, where: str) -> tuple[np.ndarray, str]:
    """Arrival times in seconds (not yet shifted) and the unit they were read in."""
    col = df[column]
    if pd.api.types.is_bool_dtype(col):
        raise ValueError(f"{where}: arrival column {column!r} holds booleans; expected times")
    if (not pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_datetime64_any_dtype(col)
            and pd.to_numeric(col, errors="coerce").notna().all()):
        col = pd.to_numeric(col)  # numbers written as text ("12.5") are numbers, not dates
    if pd.api.types.is_datetime64_any_dtype(col) or not pd.api.types.is_numeric_dtype(col):
        if time_unit is not None:
            raise ValueError(f"{where}: arrival column {column!r} holds datetimes or text, so time_unit="
                             f"{time_unit!r} does not apply; drop it")
        if col.isna().any():
            raise ValueError(f"{where}: arrival column {column!r} is missing in row {int(np.argmax(col.isna()))}")
        try:  # seconds from the earliest, exact
            return datetime_offsets_s(col), "datetime"
        except (ValueError, TypeError, OverflowError):
            sample = col.iloc[0]
            raise ValueError(f"{where}: arrival column {column!r} holds {sample!r}, neither a number nor a date and "
                             f"time; expected seconds (or time_unit=) or datetimes") from None
    values = col.to_numpy(dtype=np.float64)
    if not np.isfinite(values).all():
        row = int(np.argmax(~np.isfinite(values)))
        raise ValueError(f"{where}: arrival column {column!r} of row {row} is {values[row]!r}; expected finite times")
    named = _unit_from_name(column)
    if time_unit is not None and named is not None and named != time_unit:
        raise ValueError(f"{where}: arrival column {column!r} says its unit is {named!r} but time_unit="
                         f"{time_unit!r} was given")
    unit = time_unit or named
    if unit is None:
        if np.abs(values).max() > EPOCH_LIKE:
            raise ValueError(f"{where}: arrival column {column!r} holds numbers up to {np.abs(values).max():.4g}, "
                             f"which look like epoch timestamps in an unknown unit; pass time_unit= "
                             f"(--time-unit: {', '.join(TIME_UNITS)}) to say which")
        unit = "s"
    return values * TIME_UNITS[unit], unit


def prefix_column(df: pd.DataFrame, column: str, where: str) -> list:
    """The block-id lists of ``column``: lists (JSON) or their text (a CSV cell ``"[1, 2]"``); empty if missing."""
    out = []
    for i, cell in enumerate(df[column]):
        if isinstance(cell, str):
            try:
                cell = json.loads(cell) if cell.strip() else []
            except json.JSONDecodeError:
                raise ValueError(f"{where}: {column!r} of row {i} is {cell!r}; expected a list of block ids such "
                                 f"as [1, 2, 3]") from None
        elif cell is None or (isinstance(cell, float) and math.isnan(cell)):
            cell = []
        out.append(cell)
    return out


class TraceColumns(NamedTuple):
    """A trace's columns as read, rows in file order (:func:`read_columns`)."""

    arrival_s: np.ndarray | None  # seconds, not yet shifted; None if the table has no arrival column
    unit: str | None  # the unit the arrivals were read in ("datetime", "s", ...)
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    prefix_blocks: list | None  # block-id lists, if a prefix column was named
    names: dict  # what -> the column read ("arrival", "prompt", "output", "prefix_blocks")


def read_columns(df: pd.DataFrame, where: str, arrival=None, prompt=None, output=None, time_unit=None,
                 prefix_blocks=None) -> TraceColumns:
    """Read a trace table's columns: each named, or found by its usual spellings (prefix blocks only if named)."""
    if df.empty:
        raise ValueError(f"{where}: no requests; expected one request per row")
    if time_unit is not None and time_unit not in TIME_UNITS and time_unit != "datetime":
        raise ValueError(f"time_unit must be one of {sorted(TIME_UNITS) + ['datetime']}, got {time_unit!r}")
    names = {}
    for what, given, spellings in (("prompt", prompt, _PROMPT), ("output", output, _OUTPUT)):
        found = find_column(df, given, spellings, what, where)
        if found is None:
            raise ValueError(f"{where}: no {what}-token column; tried {', '.join(spellings)} (case and _ ignored) "
                             f"among {list(map(str, df.columns))}; name it with {what}= (--{what}-column)")
        names[what] = found
    column = find_column(df, arrival, _ARRIVAL, "arrival", where)
    secs = unit = None
    if column is not None:
        names["arrival"] = column
        secs, unit = arrival_seconds(df, column, None if time_unit == "datetime" else time_unit, where)
        if time_unit == "datetime" and unit != "datetime":
            raise ValueError(f"{where}: time_unit='datetime' but arrival column {column!r} holds numbers")
    blocks = None
    if prefix_blocks is not None:
        names["prefix_blocks"] = find_column(df, prefix_blocks, (), "prefix-block", where)
        blocks = prefix_column(df, names["prefix_blocks"], where)
    return TraceColumns(secs, unit, token_column(df, names["prompt"], where), token_column(df, names["output"], where),
                        blocks, names)


def from_frame(df: pd.DataFrame, arrival: str | None = None, prompt: str | None = None, output: str | None = None,
               time_unit: str | None = None, prefix_blocks: str | None = None,
               prefix_block_tokens: int = BLOCK_SIZE) -> Requests:
    """A stream from a table with an arrival column (seconds, ms, us, ns, or datetimes) and two length columns.

    Columns are named or found by their usual spellings (module notes); ``time_unit`` None reads datetimes as
    datetimes and numbers in the unit their column's name ends in, else seconds. Arrivals are shifted so the first
    is at 0; rows are sorted by arrival (stable, so ties keep file order). ``prefix_blocks`` names an optional
    column of block-id lists (see :class:`Requests`), of ``prefix_block_tokens`` tokens each.
    """
    cols = read_columns(df, "trace", arrival, prompt, output, time_unit, prefix_blocks)
    if cols.arrival_s is None:
        raise ValueError(f"trace: no arrival column (tried {', '.join(_ARRIVAL)}, case and _ ignored) among "
                         f"{list(map(str, df.columns))}; name it with arrival=")
    return sorted_requests(cols, prefix_block_tokens)


def sorted_requests(cols: TraceColumns, prefix_block_tokens: int = BLOCK_SIZE, limit: int | None = None) -> Requests:
    """``cols`` (with arrivals) as Requests: sorted by arrival, stably, the first ``limit``, shifted to start at 0."""
    order = np.argsort(cols.arrival_s, kind="stable")[:limit]
    secs = cols.arrival_s[order] - cols.arrival_s[order][0]
    blocks = None if cols.prefix_blocks is None else [cols.prefix_blocks[i] for i in order]
    return Requests(secs, cols.prompt_tokens[order], cols.output_tokens[order], blocks, prefix_block_tokens)


def read_table(path) -> pd.DataFrame:
    """A CSV, JSON-lines or JSON-list trace file as a table (by extension), or a ValueError naming the file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return read_csv(path)
    if suffix in (".jsonl", ".json"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if suffix == ".json" and text.lstrip().startswith("["):
            data = json.loads(text)
            if isinstance(data, list) and all(isinstance(r, dict) for r in data):
                return pd.DataFrame(data)
        return pd.DataFrame(read_json_lines(path, text))
    raise ValueError(f"trace files must end in .csv, .jsonl or .json, got {path.name!r}")


def read_trace(path, arrival: str | None = None, prompt: str | None = None, output: str | None = None,
               time_unit: str | None = None, prefix_blocks: str | None = None,
               prefix_block_tokens: int = BLOCK_SIZE) -> Requests:
    """Read a CSV or JSON-lines trace (by extension) into ``Requests``; see :func:`from_frame`."""
    return from_frame(read_table(path), arrival, prompt, output, time_unit, prefix_blocks, prefix_block_tokens)
