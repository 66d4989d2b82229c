"""Workload presets: samples from data/workload_quantiles.csv match the real traces they were derived from.

The traces themselves are read from the mirror named by BATCHLAB_DATA_DIR, else ../shared/data/traces; tests that
need them are marked ``needs_data`` (see ``tests/rawdata.py``).
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from rawdata import raw_folder
from batchlab import workload

ROOT = Path(__file__).resolve().parent.parent
N = 100_000
PRESETS = ["azure-code-2023", "azure-conv-2023", "mooncake-conversation", "sharegpt", "arxiv-summarization"]
TIMED = PRESETS[:4]  # presets whose trace has timestamps

# name: (path under the mirror, prompt column, output column), read here independently of the script
RAW = {
    "azure-code-2023": ("azure2023/AzureLLMInferenceTrace_code.csv", "ContextTokens", "GeneratedTokens"),
    "azure-conv-2023": ("azure2023/AzureLLMInferenceTrace_conv.csv", "ContextTokens", "GeneratedTokens"),
    "mooncake-conversation": ("mooncake/conversation_trace.jsonl", "input_length", "output_length"),
    "sharegpt": ("sharegpt/sharegpt_req300_rate10_llama.csv", "input_toks", "output_toks"),
    "arxiv-summarization": ("arxiv_summarization/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
                            "num_prefill_tokens", "num_decode_tokens"),
}


def data_dir() -> Path:
    return raw_folder("BATCHLAB_DATA_DIR", "traces", "the raw request traces")


def raw_frame(name: str) -> pd.DataFrame:
    path = data_dir() / RAW[name][0]
    if path.suffix == ".jsonl":
        with open(path) as fh:
            return pd.DataFrame([json.loads(line) for line in fh if line.strip()])
    return pd.read_csv(path)


@cache
def reference(name: str) -> dict[str, float]:
    """The trace's median and p90 of prompt and output lengths: from the raw file when the mirror is set, else
    from the committed table."""
    if os.environ.get("BATCHLAB_DATA_DIR"):
        df = raw_frame(name)
        _, p, o = RAW[name]
        return {"prompt_tokens_median": df[p].median(), "prompt_tokens_p90": df[p].quantile(0.9),
                "output_tokens_median": df[o].median(), "output_tokens_p90": df[o].quantile(0.9)}
    s = bl.trace_stats(name)
    return {k: s[k] for k in ("prompt_tokens_median", "prompt_tokens_p90", "output_tokens_median",
                              "output_tokens_p90")}


def test_preset_names():
    assert bl.preset_names() == PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_lengths_match_trace_median_and_p90(name):
    r = bl.preset(name, N, rate_req_s=1.0, seed=0)
    ref = reference(name)
    got = {"prompt_tokens_median": np.median(r.prompt_tokens), "prompt_tokens_p90": np.quantile(r.prompt_tokens, 0.9),
           "output_tokens_median": np.median(r.output_tokens), "output_tokens_p90": np.quantile(r.output_tokens, 0.9)}
    for key, want in ref.items():
        assert got[key] == pytest.approx(want, rel=0.05), (name, key, got[key], want)


# The sample rate of n gamma gaps with CV c has a standard error of c / sqrt(n). For Azure code (c = 13.2) that is
# 4.2 % at 100,000 requests, so a 5 % check there would pass or fail by the seed (across 30 seeds: 70 % within
# 5 %); a million requests (1.3 %) make it a real check. The other traces have c <= 3.0: at most 1 % at 100,000.
ARRIVAL_N = {"azure-code-2023": 1_000_000}


@pytest.mark.parametrize("name", TIMED)
def test_arrivals_match_table_rate_and_cv(name):
    s = bl.trace_stats(name)
    r = bl.preset(name, ARRIVAL_N.get(name, N), seed=0)
    gaps = np.diff(r.arrival_s)
    assert r.arrival_s[0] == 0.0
    assert 1.0 / gaps.mean() == pytest.approx(s["rate_req_per_s"], rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(s["interarrival_cv"], rel=0.05)


@pytest.mark.needs_data
def test_table_stats_match_raw_traces():
    for name in PRESETS:
        df = raw_frame(name)
        s = bl.trace_stats(name)
        _, p, o = RAW[name]
        assert s["n"] == len(df)
        assert s["prompt_tokens_median"] == pytest.approx(df[p].median())
        assert s["output_tokens_p90"] == pytest.approx(df[o].quantile(0.9))
        assert s["prompt_tokens_mean"] == pytest.approx(df[p].mean(), rel=1e-6)
    # The published summary in ../shared/data/README.md
    assert bl.trace_stats("azure-code-2023")["rate_req_per_s"] == pytest.approx(2.57, abs=0.005)
    assert bl.trace_stats("azure-code-2023")["interarrival_cv"] == pytest.approx(13.2, abs=0.05)
    assert bl.trace_stats("azure-conv-2023")["interarrival_cv"] == pytest.approx(1.09, abs=0.005)
    assert bl.trace_stats("mooncake-conversation")["rate_req_per_s"] == pytest.approx(3.40, abs=0.005)


@pytest.mark.needs_data
def test_committed_table_is_what_the_script_writes():
    spec = importlib.util.spec_from_file_location("make_wq", ROOT / "scripts" / "make_workload_quantiles.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    built = mod.build_table(data_dir())
    committed = pd.read_csv(ROOT / "data" / "workload_quantiles.csv")
    pd.testing.assert_frame_equal(built, committed, check_dtype=False, rtol=1e-9)


def test_table_layout():
    t = pd.read_csv(ROOT / "data" / "workload_quantiles.csv").set_index("preset")
    assert list(t.index) == PRESETS
    for col in ("prompt_tokens", "output_tokens"):
        q = t[[f"{col}_p{p}" for p in range(101)]].to_numpy()
        assert (np.diff(q, axis=1) >= 0).all() and (q >= 1).all()
    assert t.loc["arxiv-summarization", ["rate_req_per_s", "interarrival_cv"]].isna().all()
    assert t.loc[TIMED, ["rate_req_per_s", "interarrival_cv"]].notna().all().all()
    assert t.loc["sharegpt", "arrivals"] == "synthetic-poisson"
    assert t[["source_repo", "source_commit", "source_path", "licence"]].notna().all().all()


def test_arxiv_needs_a_rate_and_is_poisson():
    with pytest.raises(ValueError, match="rate_req_s="):
        bl.preset("arxiv-summarization", 10)
    r = bl.preset("arxiv-summarization", N, rate_req_s=4.0, seed=3)
    gaps = np.diff(r.arrival_s)
    assert 1.0 / gaps.mean() == pytest.approx(4.0, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.02)
    assert math.isnan(bl.trace_stats("arxiv-summarization")["rate_req_per_s"])


def test_explicit_rate_overrides_the_trace_rate():
    r = bl.preset("azure-conv-2023", N, rate_req_s=20.0, seed=0)
    assert 1.0 / np.diff(r.arrival_s).mean() == pytest.approx(20.0, rel=0.02)
    assert (bl.preset("sharegpt", 50, rate_req_s=math.inf).arrival_s == 0).all()


@pytest.mark.parametrize("name", PRESETS)
def test_same_seed_same_stream(name):
    a, b = bl.preset(name, 1000, rate_req_s=2.0, seed=7), bl.preset(name, 1000, rate_req_s=2.0, seed=7)
    c = bl.preset(name, 1000, rate_req_s=2.0, seed=8)
    for field in ("arrival_s", "prompt_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)
    g = bl.preset(name, 1000, rate_req_s=2.0, seed=np.random.default_rng(7))
    np.testing.assert_array_equal(g.output_tokens, a.output_tokens)


def test_unknown_name_lists_the_allowed_ones():
    for f in (lambda: bl.preset("azure", 10), lambda: bl.trace_stats("azure")):
        with pytest.raises(ValueError) as e:
            f()
        assert all(name in str(e.value) for name in PRESETS)


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_requests=0), "n_requests must be an integer from 1"), (dict(n_requests=-5), "n_requests.*got -5"),
    (dict(n_requests=2.5), "n_requests.*got 2.5"), (dict(n_requests=True), "n_requests.*got True"),
    (dict(n_requests=10, rate_req_s=0.0), "rate_req_s must be a number > 0.*got 0.0"),
    (dict(n_requests=10, rate_req_s=-1.0), "rate_req_s.*got -1.0"),
    (dict(n_requests=10, rate_req_s=float("nan")), "rate_req_s.*got nan"),
    (dict(n_requests=10, seed=-1), "seed must be an integer >= 0"), (dict(n_requests=10, seed="x"), "seed.*'x'")])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bl.preset("azure-conv-2023", **kwargs)


def test_preset_is_exported_and_in_workload():
    assert bl.preset is workload.preset and "preset" in bl.__all__ and "replay" in bl.__all__
