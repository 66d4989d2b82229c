"""Public request traces: downloaded with SHA-256 verification, or read from a local mirror; replayed as ``Requests``.

Three traces are known by name (see ``data/README.md`` for sources and licences):

``azure-code-2023``, ``azure-conv-2023``
    Azure LLM inference traces of November 2023 (Patel et al., Splitwise, ISCA 2024), CC-BY-4.0.
``mooncake-conversation``
    Mooncake's conversation trace (FAST'25 release), Apache-2.0.

Where the bytes come from:

* If the environment variable ``BATCHLAB_DATA_DIR`` is set, it names a local mirror laid out as
  ``azure2023/AzureLLMInferenceTrace_code.csv``, ``azure2023/AzureLLMInferenceTrace_conv.csv`` and
  ``mooncake/conversation_trace.jsonl``. Files are read from there, never downloaded, and their SHA-256 is checked
  all the same (CI and the tests point it at ``../shared/data/traces``).
* Otherwise each file is downloaded once from its public URL into ``pooch.os_cache("batchlab")`` and checked
  against the same SHA-256. With no network the download fails within a few seconds with
  :class:`DatasetUnavailableError`, which says what to do; it never waits indefinitely.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import pooch
import requests

from . import _checks
from .traces import read_trace
from .workload import Requests
from .vllm import BLOCK_SIZE

ENV_VAR = "BATCHLAB_DATA_DIR"
DOWNLOAD_TIMEOUT_S = 10.0  # seconds per connect and per read; offline machines fail fast instead of hanging


class TraceFile(NamedTuple):
    """One public trace file and how to read it."""

    relpath: str  # path inside a mirror (and inside the cache), e.g. "azure2023/AzureLLMInferenceTrace_code.csv"
    url: str  # public original
    sha256: str  # hex digest of the public original
    arrival: str  # column holding arrival times
    prompt: str  # column holding prompt tokens
    output: str  # column holding output tokens
    time_unit: str  # unit of the arrival column: "datetime", "s", "ms", "us" or "ns"
    prefix_blocks: str | None = None  # column of prefix block ids (hash chain), if the trace has one
    prefix_block_tokens: int = BLOCK_SIZE  # tokens per prefix block id


_AZURE = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
_MOONCAKE = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces/"

_TRACES = {
    "azure-code-2023": TraceFile(
        "azure2023/AzureLLMInferenceTrace_code.csv", _AZURE + "AzureLLMInferenceTrace_code.csv",
        "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
        "TIMESTAMP", "ContextTokens", "GeneratedTokens", "datetime"),
    "azure-conv-2023": TraceFile(
        "azure2023/AzureLLMInferenceTrace_conv.csv", _AZURE + "AzureLLMInferenceTrace_conv.csv",
        "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
        "TIMESTAMP", "ContextTokens", "GeneratedTokens", "datetime"),
    "mooncake-conversation": TraceFile(
        "mooncake/conversation_trace.jsonl", _MOONCAKE + "conversation_trace.jsonl",
        "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
        "timestamp", "input_length", "output_length", "ms", "hash_ids", 512),
}


class DatasetUnavailableError(OSError):
    """A trace could be neither read from the mirror nor downloaded."""


class ChecksumError(ValueError):
    """A trace file's SHA-256 differs from the public original's."""


def dataset_names() -> list[str]:
    """Names accepted by :func:`fetch` and :func:`replay`."""
    return list(_TRACES)


def _cache_dir() -> Path:
    """Where downloads are kept (the platform's user cache); tests point this elsewhere."""
    return Path(pooch.os_cache("batchlab"))


def _info(name: str) -> TraceFile:
    if not isinstance(name, str) or name not in _TRACES:
        raise ValueError(f"dataset must be one of {dataset_names()}, got {name!r}")
    return _TRACES[name]


def fetch(name: str) -> Path:
    """Local path of the trace ``name``, verified against its SHA-256.

    Reads the mirror named by ``BATCHLAB_DATA_DIR`` when that is set; otherwise downloads the public original
    once into the user cache (``pooch.os_cache("batchlab")``).

    Raises
    ------
    ValueError
        ``name`` is not one of :func:`dataset_names`.
    ChecksumError
        The file's bytes differ from the public original (a ``ValueError``).
    DatasetUnavailableError
        The mirror lacks the file, or the download failed (no network, timeout, HTTP error); an ``OSError``.
    """
    info = _info(name)
    mirror = os.environ.get(ENV_VAR, "")
    if mirror:
        return _from_mirror(name, info, Path(mirror).expanduser())
    return _download(name, info)


def _from_mirror(name: str, info: TraceFile, root: Path) -> Path:
    path = root / info.relpath
    if not path.is_file():
        raise DatasetUnavailableError(
            f"{ENV_VAR}={str(root)!r} is set but {info.relpath!r} is not in it (looked for {str(path)!r}). "
            f"Copy {info.url} there, point {ENV_VAR} at a folder laid out like ../shared/data/traces, "
            f"or unset {ENV_VAR} to download {name!r} into the cache."
        )
    found = pooch.file_hash(str(path), alg="sha256")
    if found != info.sha256:
        raise ChecksumError(
            f"checksum mismatch for {str(path)!r} (dataset {name!r}): expected SHA-256 {info.sha256}, "
            f"found {found}. The mirror's copy is not the public original; replace it with a fresh copy of "
            f"{info.url}, or unset {ENV_VAR} to download it."
        )
    return path


def _download(name: str, info: TraceFile) -> Path:
    cache = _cache_dir() / Path(info.relpath).parent
    downloader = pooch.HTTPDownloader(timeout=DOWNLOAD_TIMEOUT_S, progressbar=False)
    try:
        return Path(pooch.retrieve(info.url, known_hash=f"sha256:{info.sha256}", fname=Path(info.relpath).name,
                                   path=cache, downloader=downloader))
    except requests.exceptions.RequestException as exc:
        raise DatasetUnavailableError(
            f"could not download {name!r} from {info.url} ({type(exc).__name__}: {exc}). "
            f"Connect to the internet, or set {ENV_VAR} to a local mirror laid out like ../shared/data/traces "
            f"(it must hold {info.relpath!r})."
        ) from exc
    except ValueError as exc:
        # pooch raises ValueError when the downloaded bytes do not match known_hash (and deletes them).
        if "does not match the known hash" not in str(exc):
            raise
        raise ChecksumError(
            f"checksum mismatch for the download of {name!r} from {info.url} ({exc}). The file at that URL "
            f"has changed since batchlab recorded its SHA-256; set {ENV_VAR} to a mirror holding the recorded "
            f"version, or report it to batchlab's maintainers."
        ) from exc


def replay(name: str, speedup: float = 1.0, limit: int | None = None) -> Requests:
    """The trace ``name`` as a request stream with its real arrival times.

    Parameters
    ----------
    name : str
        One of :func:`dataset_names`.
    speedup : float
        Arrivals are ``speedup`` times faster than recorded (the rate is multiplied by it), > 0.
    limit : int, optional
        Keep only the first ``limit`` requests in arrival order.

    Returns
    -------
    Requests
        Sorted by arrival (ties keep file order), the first at 0 s. Azure timestamps are datetimes; Mooncake's are
        milliseconds (on a grid of about 3 s: requests come in groups).
    """
    info = _info(name)
    speedup = _checks.real("speedup", speedup, 0, low_open=True, allowed="a finite number > 0")
    if limit is not None:
        limit = _checks.integer("limit", limit, 1, 2**62)
    reqs = read_trace(fetch(name), info.arrival, info.prompt, info.output, info.time_unit, info.prefix_blocks,
                      info.prefix_block_tokens)
    if limit is not None:
        reqs = reqs.head(limit)
    return reqs if speedup == 1 else reqs.scale_time(speedup)
