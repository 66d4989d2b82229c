"""load_workload: every source kind read exactly, and every malformed input refused with a message naming it."""
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import batchlab as bl
from batchlab.loaders import Workload, load_workload, parse_synthetic, vllm_arrivals

BENCH = Path(__file__).parent / "data" / "vllm_bench_serve_detailed.json"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def bench_dict(**changes):
    data = json.loads(BENCH.read_text())
    data.update(changes)
    return data


def write_bench(tmp_path, data, name="bench.json"):
    return write(tmp_path, name, json.dumps(data))


def refused(source, *fragments, **kwargs):
    """load_workload(source) raises a ValueError whose message holds every fragment."""
    with pytest.raises(ValueError) as info:
        load_workload(source, **kwargs)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


# -- round trips ------------------------------------------------------------------------------------------------

def test_csv_round_trip_sorts_stably_and_reads_the_unit_from_the_column_name(tmp_path):
    path = write(tmp_path, "t.csv", "arrival_ms,input_tokens,output_tokens\n"
                                    "1500,10,3\n500,20,4\n1500,30,5\n2500,40,6\n")
    w = load_workload(path)
    assert isinstance(w, Workload)
    np.testing.assert_allclose(w.requests.arrival_s, [0.0, 1.0, 1.0, 2.0])  # ms -> s, shifted to the first
    assert list(w.requests.prompt_tokens) == [20, 10, 30, 40]  # the tie at 1500 ms keeps file order
    assert list(w.requests.output_tokens) == [4, 3, 5, 6]
    assert w.n_prompts == 4 and w.max_concurrency is None
    assert w.request_rate == pytest.approx(3 / 2.0)
    assert "arrival_ms" in w.source and "input_tokens" in w.source


def test_jsonl_round_trip_with_datetime_strings_and_azure_spellings(tmp_path):
    rows = [{"TIMESTAMP": "2023-11-16 18:15:46.500", "ContextTokens": 374, "GeneratedTokens": 44},
            {"TIMESTAMP": "2023-11-16 18:15:46.000", "ContextTokens": 396, "GeneratedTokens": 109},
            {"TIMESTAMP": "2023-11-16 18:15:49.250", "ContextTokens": 879, "GeneratedTokens": 31}]
    path = write(tmp_path, "t.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    w = load_workload(path)
    np.testing.assert_allclose(w.requests.arrival_s, [0.0, 0.5, 3.25])
    assert list(w.requests.prompt_tokens) == [396, 374, 879]
    assert int(w.requests.output_tokens.sum()) == 44 + 109 + 31


def test_dataframe_with_pandas_datetimes_and_given_columns():
    df = pd.DataFrame({"when": pd.to_datetime(["2024-01-01 00:00:02", "2024-01-01 00:00:00"]),
                       "p": [5, 6], "o": [7, 8]})
    w = load_workload(df, arrival="when", prompt="p", output="o")
    np.testing.assert_allclose(w.requests.arrival_s, [0.0, 2.0])
    assert list(w.requests.prompt_tokens) == [6, 5]


def test_datetimes_with_utc_offsets_are_compared_in_utc():
    df = pd.DataFrame({"timestamp": ["2024-01-01T00:00:00+01:00", "2023-12-31T23:00:01Z",
                                     "2024-01-01 00:00:00.5+01:00"], "prompt_tokens": [1, 2, 3],
                       "output_tokens": [1, 1, 1]})
    w = load_workload(df)
    np.testing.assert_allclose(w.requests.arrival_s, [0.0, 0.5, 1.0])
    assert list(w.requests.prompt_tokens) == [1, 3, 2]


def test_numbers_written_as_text_are_numbers():
    df = pd.DataFrame({"timestamp": ["1.5", "0.5"], "prompt_tokens": ["3", 4], "output_tokens": [1, 1]})
    w = load_workload(df)
    np.testing.assert_allclose(w.requests.arrival_s, [0.0, 1.0])
    assert list(w.requests.prompt_tokens) == [4, 3]


def test_epoch_nanoseconds_read_with_time_unit(tmp_path):
    path = write(tmp_path, "t.csv", "timestamp,prompt_tokens,output_tokens\n"
                                    "1700000000000000000,5,5\n1700000000250000000,6,6\n")
    w = load_workload(path, time_unit="ns")
    np.testing.assert_allclose(w.requests.arrival_s, [0.0, 0.25])


def test_trace_rate_rescales_arrivals_and_n_requests_keeps_the_first(tmp_path):
    path = write(tmp_path, "t.csv", "time,prompt_len,output_len\n0,1,1\n1,2,2\n3,3,3\n4,4,4\n")
    w = load_workload(path, rate_req_s=1.5)  # trace mean rate: 3 gaps in 4 s = 0.75 req/s
    np.testing.assert_allclose(w.requests.arrival_s, [0.0, 0.5, 1.5, 2.0])
    assert w.request_rate == 1.5
    w = load_workload(path, n_requests=2)
    assert list(w.requests.prompt_tokens) == [1, 2] and w.n_prompts == 4


def test_trace_without_arrivals_replays_at_a_rate_or_closed_loop(tmp_path):
    path = write(tmp_path, "t.csv", "prompt_tokens,output_tokens\n" + "".join(f"{i + 1},{i + 2}\n" for i in range(8)))
    w = load_workload(path, rate_req_s=4.0, seed=3)
    assert list(w.requests.prompt_tokens) == list(range(1, 9))  # file order kept
    assert w.requests.arrival_s[-1] == pytest.approx(8 / 4.0)  # vLLM's rescaling: the last goes at n / rate
    w = load_workload(path, max_concurrency=2)
    assert not w.requests.arrival_s.any() and w.max_concurrency == 2 and math.isinf(w.request_rate)


def test_bench_result_reproduces_count_and_token_totals_exactly():
    saved = json.loads(BENCH.read_text())
    w = load_workload(BENCH)
    assert len(w.requests) == saved["completed"] == 11
    assert int(w.requests.prompt_tokens.sum()) == saved["total_input_tokens"]
    assert int(w.requests.output_tokens.sum()) == saved["total_output_tokens"]
    assert w.n_prompts == saved["num_prompts"] == 12
    assert w.request_rate == 4.0 and w.max_concurrency is None
    kept = [i for i, e in enumerate(saved["errors"]) if not e]
    assert list(w.requests.prompt_tokens) == [saved["input_lens"][i] for i in kept]  # order as sent
    full = vllm_arrivals(12, 4.0, 1.0, 0)
    np.testing.assert_allclose(w.requests.arrival_s, full[kept])
    assert full[-1] == pytest.approx(12 / 4.0)


def test_bench_result_all_at_once_with_max_concurrency(tmp_path):
    path = write_bench(tmp_path, bench_dict(request_rate="inf", max_concurrency=4))
    w = load_workload(path)
    assert not w.requests.arrival_s.any() and math.isinf(w.request_rate) and w.max_concurrency == 4


def test_bench_result_without_errors_key_treats_zero_outputs_as_failed(tmp_path):
    data = bench_dict()
    del data["errors"]
    w = load_workload(write_bench(tmp_path, data))
    assert len(w.requests) == 11 and int(w.requests.output_tokens.sum()) == data["total_output_tokens"]


def test_bench_result_ramp_up_rates_rise(tmp_path):
    n = 400
    data = {"input_lens": [10] * n, "output_lens": [5] * n, "request_rate": "inf", "burstiness": 1.0,
            "ramp_up_strategy": "linear", "ramp_up_start_rps": 1, "ramp_up_end_rps": 20}
    w = load_workload(write_bench(tmp_path, data))
    gaps = np.diff(w.requests.arrival_s)
    assert gaps[:50].mean() > 5 * gaps[-50:].mean()  # 1 req/s at the start, 20 at the end


def test_vllm_arrivals_have_the_asked_rate_and_burstiness():
    t = vllm_arrivals(20000, 8.0, 0.25, seed=1)
    gaps = np.diff(t)
    assert t[-1] == pytest.approx(20000 / 8.0)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.05)  # CV = 1 / sqrt(burstiness)
    np.testing.assert_allclose(vllm_arrivals(4, 2.0, math.inf), [0.5, 1.0, 1.5, 2.0])


def test_preset_and_synthetic_sources():
    w = load_workload("sharegpt", n_requests=50, rate_req_s=2.0, seed=1)
    assert len(w.requests) == 50 and w.request_rate == 2.0
    same = bl.preset("sharegpt", 50, 2.0, seed=1)
    np.testing.assert_array_equal(w.requests.prompt_tokens, same.prompt_tokens)
    w = load_workload("synthetic:prompt=512,output=128,rate=4,n=30")
    assert len(w.requests) == 30 and w.request_rate == 4.0
    assert set(w.requests.prompt_tokens) == {512} and set(w.requests.output_tokens) == {128}
    assert parse_synthetic("synthetic:prompt=100,output=10,prompt_cv=0.5,max_tokens=900") == {
        "prompt_mean": 100.0, "output_mean": 10.0, "prompt_cv": 0.5, "max_tokens": 900}
    assert len(load_workload("synthetic:prompt=10,output=5", n_requests=7).requests) == 7


# -- malformed: one test per case -------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    refused(tmp_path / "nope.csv", "nope.csv", "no such file", "preset name", "synthetic")


def test_empty_file(tmp_path):
    refused(write(tmp_path, "e.csv", "  \n"), "e.csv", "empty")


def test_header_only_csv(tmp_path):
    refused(write(tmp_path, "h.csv", "timestamp,prompt_tokens,output_tokens\n"), "h.csv", "no rows")


def test_unknown_extension(tmp_path):
    refused(write(tmp_path, "t.parquet", "x"), "t.parquet", "unknown extension", ".csv", ".jsonl", ".json")


def test_unparseable_json(tmp_path):
    refused(write(tmp_path, "b.json", '{"input_lens": [1, 2'), "b.json", "not valid JSON")


def test_unparseable_jsonl_line(tmp_path):
    refused(write(tmp_path, "t.jsonl", '{"prompt_tokens": 1, "output_tokens": 2}\n{oops\n'), "t.jsonl", "line 2",
            "not valid JSON")


def test_jsonl_line_not_an_object(tmp_path):
    refused(write(tmp_path, "t.jsonl", '[1, 2]\n'), "t.jsonl", "line 1", "expected an object")


def test_unparseable_csv(tmp_path):
    refused(write(tmp_path, "t.csv", "time,prompt_tokens,output_tokens\n0,1,1\n1,2,2,9,9\n"), "t.csv",
            "not a readable CSV")


def test_missing_prompt_column_lists_spellings(tmp_path):
    refused(write(tmp_path, "t.csv", "time,tokens_in,output_tokens\n0,1,1\n"), "t.csv", "no prompt-token column",
            "input_tokens", "context_tokens", "num_prefill_tokens", "tokens_in", "prompt=")


def test_missing_output_column_lists_spellings(tmp_path):
    refused(write(tmp_path, "t.csv", "time,prompt_tokens,tokens_out\n0,1,1\n"), "t.csv", "no output-token column",
            "generated_tokens", "num_decode_tokens", "output=")


def test_missing_arrival_column_says_rate_or_concurrency(tmp_path):
    refused(write(tmp_path, "t.csv", "prompt_tokens,output_tokens\n1,1\n"), "t.csv", "no arrival column",
            "timestamp", "arrival_time", "rate_req_s", "max_concurrency")


def test_given_column_not_found(tmp_path):
    refused(write(tmp_path, "t.csv", "time,prompt_tokens,output_tokens\n0,1,1\n"), "t.csv", "'isl'", prompt="isl")


def test_negative_token_count(tmp_path):
    refused(write(tmp_path, "t.csv", "time,prompt_tokens,output_tokens\n0,1,1\n1,-4,1\n"), "t.csv",
            "'prompt_tokens' of row 1 is negative", ">= 1")


def test_zero_token_count(tmp_path):
    refused(write(tmp_path, "t.csv", "time,prompt_tokens,output_tokens\n0,1,0\n"), "t.csv",
            "'output_tokens' of row 0 is zero")


def test_non_integer_token_count(tmp_path):
    refused(write(tmp_path, "t.csv", "time,prompt_tokens,output_tokens\n0,1.5,1\n"), "t.csv",
            "not a whole number")


def test_nan_token_count(tmp_path):
    refused(write(tmp_path, "t.csv", "time,prompt_tokens,output_tokens\n0,1,1\n1,,1\n"), "t.csv",
            "row 1 is missing (NaN)")


def test_text_token_count(tmp_path):
    refused(write(tmp_path, "t.jsonl", '{"time": 0, "prompt_tokens": "many", "output_tokens": 1}\n'), "t.jsonl",
            "not a number")


def test_boolean_token_count(tmp_path):
    refused(write(tmp_path, "t.jsonl", '{"time": 0, "prompt_tokens": true, "output_tokens": 1}\n'
                                       '{"time": 1, "prompt_tokens": 5, "output_tokens": 1}\n'), "t.jsonl",
            "row 0 is a boolean")


def test_epoch_like_arrivals_without_unit_refused(tmp_path):
    refused(write(tmp_path, "t.csv", "timestamp,prompt_tokens,output_tokens\n1700000000000000000,1,1\n"),
            "t.csv", "epoch", "time_unit")


def test_unparseable_arrival_text(tmp_path):
    refused(write(tmp_path, "t.csv", "timestamp,prompt_tokens,output_tokens\nsoon,1,1\n"), "t.csv",
            "'soon'", "neither a number nor a date")


def test_nan_arrival(tmp_path):
    refused(write(tmp_path, "t.csv", "time,prompt_tokens,output_tokens\n0,1,1\n,2,2\n"), "t.csv",
            "row 1", "finite times")


def test_time_unit_contradicts_column_name(tmp_path):
    refused(write(tmp_path, "t.csv", "arrival_ms,prompt_tokens,output_tokens\n0,1,1\n"), "t.csv", "'ms'",
            "time_unit='s'", time_unit="s")


def test_bad_time_unit_option(tmp_path):
    refused(write(tmp_path, "t.csv", "time,prompt_tokens,output_tokens\n0,1,1\n"), "time_unit", time_unit="minutes")


def test_bench_lens_of_different_lengths(tmp_path):
    data = bench_dict(output_lens=[5, 6])
    refused(write_bench(tmp_path, data), "bench.json", "input_lens has 12 entries but output_lens 2")


def test_bench_without_lens_names_save_detailed(tmp_path):
    data = bench_dict()
    for key in ("input_lens", "output_lens", "errors"):
        del data[key]
    refused(write_bench(tmp_path, data), "bench.json", "input_lens, output_lens", "--save-detailed")


def test_bench_without_request_rate(tmp_path):
    data = bench_dict()
    del data["request_rate"]
    refused(write_bench(tmp_path, data), "bench.json", "request_rate")


def test_bench_bad_request_rate(tmp_path):
    refused(write_bench(tmp_path, bench_dict(request_rate="fast")), "bench.json", "request_rate is 'fast'",
            '"inf"')


def test_bench_negative_length(tmp_path):
    lens = bench_dict()["input_lens"]
    lens[3] = -2
    refused(write_bench(tmp_path, bench_dict(input_lens=lens)), "bench.json", "input_lens[3] is -2")


def test_bench_totals_disagree_with_lists(tmp_path):
    refused(write_bench(tmp_path, bench_dict(total_output_tokens=1)), "bench.json", "total_output_tokens is 1",
            "inconsistent")


def test_bench_completed_disagrees_with_lists(tmp_path):
    refused(write_bench(tmp_path, bench_dict(completed=12)), "bench.json", "completed is 12", "11")


def test_bench_errors_wrong_length(tmp_path):
    refused(write_bench(tmp_path, bench_dict(errors=[""])), "bench.json", "errors", "one entry per request")


def test_bench_every_request_failed(tmp_path):
    data = bench_dict(output_lens=[0] * 12, completed=0, total_input_tokens=0, total_output_tokens=0)
    refused(write_bench(tmp_path, data), "bench.json", "every request failed")


def test_json_neither_bench_nor_records(tmp_path):
    refused(write(tmp_path, "x.json", '{"model": "llama", "layers": 32}'), "x.json", "neither",
            "input_lens", "layers")


def test_json_of_appended_results(tmp_path):
    one = json.dumps(bench_dict())
    refused(write(tmp_path, "a.json", one + "\n" + one + "\n"), "a.json", "2 JSON objects", "--append-result")


def test_synthetic_unknown_key():
    refused("synthetic:prompt=10,outptu=5", "unknown key 'outptu'", "output")


def test_synthetic_bad_value():
    refused("synthetic:prompt=10,output=5,rate=fast", "key 'rate' must be a number", "'fast'")


def test_synthetic_missing_key():
    refused("synthetic:prompt=10", "missing output=")


def test_synthetic_count_given_twice():
    refused("synthetic:prompt=10,output=5,n=20", "n=20", "n_requests=30", n_requests=30)


def test_burstiness_with_a_timed_trace(tmp_path):
    refused(write(tmp_path, "t.csv", "time,prompt_tokens,output_tokens\n0,1,1\n"), "t.csv", "burstiness",
            burstiness=0.5)


def test_datetime_strings_read_to_the_microsecond_by_every_reader(tmp_path):
    """Arrivals written as datetime strings with milliseconds (pandas infers datetime64[us] for them) read as 0,
    0.25 and 1.5 s, exactly, through bl.read_trace (which datasets.replay calls) and through load_workload (the
    command line's --dataset); before, read_trace gave 0.00025 and 0.0015 (microseconds taken for nanoseconds) and
    the loader 0.24999976 (through float epoch seconds)."""
    path = tmp_path / "trace.csv"
    pd.DataFrame({"timestamp": ["2024-05-01 10:00:01.5", "2024-05-01 10:00:00", "2024-05-01 10:00:00.250",
                                "2024-05-01 10:00:00.000001"],
                  "input_tokens": [30, 10, 20, 40], "output_tokens": [3, 1, 2, 4]}).to_csv(path, index=False)
    want = np.array([0.0, 0.000001, 0.25, 1.5])
    read = bl.read_trace(path, "timestamp", "input_tokens", "output_tokens", time_unit="datetime")
    loaded = load_workload(path).requests
    for reqs in (read, loaded):
        np.testing.assert_array_equal(reqs.arrival_s, want)
        np.testing.assert_array_equal(reqs.prompt_tokens, [10, 40, 20, 30])
    ns = pd.DataFrame({"t": ["2023-11-16 18:15:46.6805900", "2023-11-16 18:15:50.9951690"], "p": [1, 1], "o": [1, 1]})
    assert bl.from_frame(ns, "t", "p", "o").arrival_s.tolist() == [0.0, 4.314579]  # Azure's seven digits: exact


def _same_requests(a, b) -> None:
    for field in ("arrival_s", "prompt_tokens", "output_tokens", "prefix_ids", "prefix_offsets"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    assert a.prefix_block_tokens == b.prefix_block_tokens


def test_one_trace_reader_behind_read_trace_replay_and_the_command_line(tmp_path, monkeypatch, capsys):
    """A CSV of datetime-string arrivals (microseconds) and prefix block ids (their text in a cell) gives the same
    Requests, to the bit, through bl.read_trace, datasets.replay (a registered trace read from a mirror) and the
    command line's --dataset; and the command line's run is simulate's on those Requests (issue 25)."""
    import hashlib

    from batchlab import cli, datasets

    path = tmp_path / "mine" / "trace.csv"
    path.parent.mkdir()
    pd.DataFrame({"timestamp": ["2024-05-01 10:00:01.5", "2024-05-01 10:00:00", "2024-05-01 10:00:00.250",
                                "2024-05-01 10:00:00.000001"],
                  "input_tokens": [300, 100, 200, 400], "output_tokens": [3, 1, 2, 4],
                  "hash_ids": ["[7, 8, 9]", "[7]", "[7, 8]", "[7, 8, 9, 10]"]}).to_csv(path, index=False)
    read = bl.read_trace(path, "timestamp", "input_tokens", "output_tokens", prefix_blocks="hash_ids",
                         prefix_block_tokens=128)
    np.testing.assert_array_equal(read.arrival_s, [0.0, 0.000001, 0.25, 1.5])
    assert [list(b) for b in read.prefix_blocks] == [[7], [7, 8, 9, 10], [7, 8], [7, 8, 9]]

    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    entry = datasets.TraceFile("mine/trace.csv", "https://example.invalid/trace.csv", sha, "timestamp",
                               "input_tokens", "output_tokens", "datetime", "hash_ids", 128)
    monkeypatch.setitem(datasets._TRACES, "mine", entry)
    monkeypatch.setenv(datasets.ENV_VAR, str(tmp_path))
    _same_requests(datasets.replay("mine"), read)

    loaded = load_workload(path, prefix_blocks="hash_ids", prefix_block_tokens=128).requests
    _same_requests(loaded, read)

    out = tmp_path / "out.json"
    argv = ["simulate", "--dataset", str(path), "--prefix-blocks-column", "hash_ids", "--prefix-block-tokens", "128",
            "--save-result", "--result-filename", str(out)]
    assert cli.main(argv) == 0
    saved = json.loads(out.read_text())
    res = bl.simulate(read, "chunked", bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b")))
    assert saved["input_lens"] == read.prompt_tokens.tolist()
    np.testing.assert_array_equal(saved["ttfts"], res.requests["ttft_s"].to_numpy())
    assert res.requests["cached_tokens"].sum() > 0  # the prefix blocks reached the engine
