"""batchlab.datasets: checksums, the local mirror, the download path, and fast failure offline.

Loader tests write their own small files; the replay tests of the real traces (marked ``needs_data``) read the
mirror named by BATCHLAB_DATA_DIR, else ../shared/data/traces (see ``tests/rawdata.py``).
"""
from __future__ import annotations

import functools
import hashlib
import http.server
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import batchlab as bl
from rawdata import raw_folder
from batchlab import datasets

NAMES = ["azure-code-2023", "azure-conv-2023", "mooncake-conversation"]

AZURE_SMALL = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:50.9951690,396,109\n"  # out of order on purpose: replay sorts by arrival
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:47.1805900,1200,7\n"
)
MOONCAKE_SMALL = (
    '{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1]}\n'
    '{"timestamp": 0, "input_length": 7322, "output_length": 490, "hash_ids": [0, 2]}\n'
    '{"timestamp": 3000, "input_length": 900, "output_length": 12, "hash_ids": [3]}\n'
)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def mirror(monkeypatch) -> str:
    """The raw traces' folder, named to batchlab through BATCHLAB_DATA_DIR as a user would."""
    folder = str(raw_folder("BATCHLAB_DATA_DIR", "traces", "the raw request traces"))
    monkeypatch.setenv("BATCHLAB_DATA_DIR", folder)
    return folder


def write_mirror(root: Path, name: str, text: str) -> bytes:
    path = root / datasets._TRACES[name].relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path.read_bytes()


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """No mirror, and an empty download cache of our own."""
    monkeypatch.delenv("BATCHLAB_DATA_DIR", raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setattr(datasets, "_cache_dir", lambda: cache)
    return cache


@pytest.fixture
def http_root(tmp_path):
    """A local HTTP server on 127.0.0.1 serving a temporary folder: (folder, base URL)."""
    root = tmp_path / "www"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_names():
    assert datasets.dataset_names() == NAMES


# -- the real traces through the mirror ------------------------------------------------------------

@pytest.mark.needs_data
def test_replay_azure_conv_from_mirror(mirror):
    r = bl.replay("azure-conv-2023")
    assert len(r) == 19_366
    assert r.arrival_s[0] == 0.0 and (np.diff(r.arrival_s) >= 0).all()
    assert r.arrival_s[-1] == pytest.approx(3501.72, abs=0.01)  # about an hour of traffic, 5.53 req/s
    assert np.median(r.prompt_tokens) == 1020 and np.median(r.output_tokens) == 129


@pytest.mark.needs_data
def test_replay_other_traces_from_mirror(mirror):
    code, moon = bl.replay("azure-code-2023"), bl.replay("mooncake-conversation")
    assert len(code) == 8_819 and len(moon) == 12_031
    for r in (code, moon):
        assert r.arrival_s[0] == 0.0 and (np.diff(r.arrival_s) >= 0).all()
    # Mooncake timestamps are milliseconds: 12,031 requests over about 59 minutes (3.40 req/s).
    assert (len(moon) - 1) / moon.arrival_s[-1] == pytest.approx(3.40, abs=0.005)


@pytest.mark.needs_data
def test_replay_limit_and_speedup(mirror):
    full = bl.replay("azure-code-2023")
    r = bl.replay("azure-code-2023", speedup=4.0, limit=100)
    assert len(r) == 100
    np.testing.assert_allclose(r.arrival_s, full.arrival_s[:100] / 4.0)
    np.testing.assert_array_equal(r.prompt_tokens, full.prompt_tokens[:100])


@pytest.mark.needs_data
def test_fetch_from_mirror_returns_the_mirror_file(mirror):
    d = mirror
    assert datasets.fetch("mooncake-conversation") == Path(d) / "mooncake" / "conversation_trace.jsonl"


# -- small files written here --------------------------------------------------------------------

def test_mirror_with_wrong_checksum_is_a_clear_error(tmp_path, monkeypatch):
    data = write_mirror(tmp_path, "azure-conv-2023", AZURE_SMALL)
    monkeypatch.setenv("BATCHLAB_DATA_DIR", str(tmp_path))
    with pytest.raises(datasets.ChecksumError) as e:
        bl.replay("azure-conv-2023")
    msg = str(e.value)
    assert isinstance(e.value, ValueError)
    assert "AzureLLMInferenceTrace_conv.csv" in msg
    assert datasets._TRACES["azure-conv-2023"].sha256 in msg and sha256(data) in msg
    assert "BATCHLAB_DATA_DIR" in msg and "https://" in msg


def test_mirror_with_matching_checksum_is_replayed(tmp_path, monkeypatch):
    for name, text in (("azure-code-2023", AZURE_SMALL), ("mooncake-conversation", MOONCAKE_SMALL)):
        data = write_mirror(tmp_path, name, text)
        monkeypatch.setitem(datasets._TRACES, name, datasets._TRACES[name]._replace(sha256=sha256(data)))
    monkeypatch.setenv("BATCHLAB_DATA_DIR", str(tmp_path))
    az = bl.replay("azure-code-2023")
    np.testing.assert_allclose(az.arrival_s, [0.0, 0.5, 4.314579])
    np.testing.assert_array_equal(az.prompt_tokens, [374, 1200, 396])
    np.testing.assert_array_equal(az.output_tokens, [44, 7, 109])
    mc = bl.replay("mooncake-conversation", speedup=2.0)
    np.testing.assert_allclose(mc.arrival_s, [0.0, 0.0, 1.5])
    np.testing.assert_array_equal(mc.prompt_tokens, [6758, 7322, 900])


def test_mirror_without_the_file_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHLAB_DATA_DIR", str(tmp_path))
    with pytest.raises(datasets.DatasetUnavailableError) as e:
        datasets.fetch("mooncake-conversation")
    assert "mooncake/conversation_trace.jsonl" in str(e.value) and "BATCHLAB_DATA_DIR" in str(e.value)


def test_offline_without_mirror_fails_fast_with_advice(offline_cache, monkeypatch):
    name = "azure-conv-2023"
    # Port 9 (discard) on the loopback: nothing listens, as with no network at all.
    monkeypatch.setitem(datasets._TRACES, name, datasets._TRACES[name]._replace(url="http://127.0.0.1:9/x.csv"))
    t0 = time.monotonic()
    with pytest.raises(datasets.DatasetUnavailableError) as e:
        bl.replay(name)
    assert time.monotonic() - t0 < 30
    msg = str(e.value)
    assert isinstance(e.value, OSError)
    assert "BATCHLAB_DATA_DIR" in msg and "Connect" in msg and "http://127.0.0.1:9/x.csv" in msg
    assert not (offline_cache / "azure2023" / "AzureLLMInferenceTrace_conv.csv").exists()


def test_download_is_verified_and_cached(offline_cache, http_root, monkeypatch):
    root, base = http_root
    name = "azure-code-2023"
    data = write_mirror(root, name, AZURE_SMALL)
    info = datasets._TRACES[name]._replace(url=base + datasets._TRACES[name].relpath, sha256=sha256(data))
    monkeypatch.setitem(datasets._TRACES, name, info)
    path = datasets.fetch(name)
    assert path == offline_cache / info.relpath and path.read_bytes() == data
    (root / info.relpath).unlink()  # a second fetch must come from the cache
    assert datasets.fetch(name) == path
    assert len(bl.replay(name)) == 3


def test_download_with_wrong_checksum_is_a_clear_error(offline_cache, http_root, monkeypatch):
    root, base = http_root
    name = "mooncake-conversation"
    write_mirror(root, name, MOONCAKE_SMALL)
    info = datasets._TRACES[name]._replace(url=base + datasets._TRACES[name].relpath)
    monkeypatch.setitem(datasets._TRACES, name, info)
    with pytest.raises(datasets.ChecksumError) as e:
        datasets.fetch(name)
    assert info.sha256 in str(e.value) and "BATCHLAB_DATA_DIR" in str(e.value)
    assert not (offline_cache / info.relpath).exists()  # pooch deletes what did not verify


def test_http_error_is_a_clear_error(offline_cache, http_root, monkeypatch):
    _, base = http_root
    name = "azure-code-2023"
    monkeypatch.setitem(datasets._TRACES, name, datasets._TRACES[name]._replace(url=base + "missing.csv"))
    with pytest.raises(datasets.DatasetUnavailableError, match="BATCHLAB_DATA_DIR"):
        datasets.fetch(name)


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="azure"), "dataset must be one of"), (dict(name=["azure-conv-2023"]), "dataset must be one of"),
    (dict(speedup=0.0), "speedup must be a finite number > 0, got 0.0"), (dict(speedup=-1.0), "speedup"),
    (dict(speedup=float("inf")), "speedup.*got inf"), (dict(speedup=float("nan")), "speedup.*got nan"),
    (dict(speedup="2"), "speedup.*got '2'"), (dict(speedup=True), "speedup.*got True"),
    (dict(limit=0), "limit must be an integer from 1"), (dict(limit=-3), "limit.*got -3"),
    (dict(limit=1.5), "limit.*got 1.5"), (dict(limit=True), "limit.*got True")])
def test_bad_arguments_are_value_errors_before_any_io(kwargs, match, tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHLAB_DATA_DIR", str(tmp_path / "nowhere"))  # any file access would be an OSError
    kwargs = {"name": "azure-conv-2023", **kwargs}
    with pytest.raises(ValueError, match=match):
        bl.replay(**kwargs)


def test_unknown_name_lists_the_allowed_ones():
    with pytest.raises(ValueError) as e:
        datasets.fetch("sharegpt")
    assert all(n in str(e.value) for n in NAMES)
