"""``python -m batchlab simulate|tune`` end to end in a subprocess: help, results, saved JSON, and clean errors."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from batchlab import cli, metrics

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).parent / "data" / "vllm_bench_serve_detailed.json"
SMALL = ["--dataset", "sharegpt", "--num-prompts", "200", "--request-rate", "8"]


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "batchlab", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def table_value(stdout: str, label: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith(label)]
    assert len(lines) == 1, (label, stdout)
    return lines[0][len(label):].strip()


def assert_usage_error(proc, *fragments):
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("batchlab: error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("command, flags", [("simulate", ["--dataset", "--max-num-seqs", "--request-rate",
                                                         "--save-result", "--tensor-parallel-size"]),
                                            ("tune", ["--goodput", "--max-num-seqs-grid", "--disable-tqdm"])])
def test_help(command, flags):
    proc = run(command, "--help")
    assert proc.returncode == 0 and proc.stderr == ""
    for flag in flags:
        assert flag in proc.stdout


def test_simulate_preset_prints_the_table_and_saves_vllm_keys(tmp_path):
    out = tmp_path / "result.json"
    proc = run("simulate", *SMALL, "--goodput", "ttft:500", "tpot:50", "--metric-percentiles", "90,99",
               "--save-result", "--result-filename", out)
    assert proc.returncode == 0, proc.stderr
    stdout = proc.stdout
    assert "============ Serving Benchmark Result ============" in stdout
    assert "---------------Time to First Token----------------" in stdout
    assert "-----Time per Output Token (excl. 1st token)------" in stdout
    assert table_value(stdout, "Successful requests:") == "200"
    assert float(table_value(stdout, "Request rate configured (RPS):")) == 8.0
    saved = json.loads(out.read_text())
    keys = {"date", "backend", "model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency",
            "duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
            "request_goodput", "output_throughput", "total_token_throughput", "max_concurrent_requests",
            "input_lens", "output_lens", "ttfts", "latencies", "errors"}
    for metric in ("ttft", "tpot", "itl", "e2el"):
        keys |= {f"mean_{metric}_ms", f"median_{metric}_ms", f"p90_{metric}_ms", f"p99_{metric}_ms"}
        if metric != "itl":
            keys.add(f"std_{metric}_ms")
    assert keys <= set(saved), keys - set(saved)
    assert saved["completed"] == 200 and saved["num_prompts"] == 200 and saved["request_rate"] == 8.0
    assert saved["total_input_tokens"] == sum(saved["input_lens"]) == int(table_value(stdout, "Total input tokens:"))
    assert saved["total_output_tokens"] == sum(saved["output_lens"])
    assert 0 < saved["request_goodput"] <= saved["request_throughput"]
    assert len(saved["ttfts"]) == 200
    assert saved["p99_ttft_ms"] == pytest.approx(float(table_value(stdout, "P99 TTFT (ms):")), abs=0.006)
    # the saved result is itself a vllm bench serve result batchlab can replay
    again = run("simulate", "--dataset", out, "--percentile-metrics", "ttft")
    assert again.returncode == 0, again.stderr
    assert table_value(again.stdout, "Total input tokens:") == str(saved["total_input_tokens"])


def test_simulate_bench_result_reproduces_count_and_token_totals():
    saved = json.loads(BENCH.read_text())
    proc = run("simulate", "--dataset", BENCH, "--model", saved["model_id"])
    assert proc.returncode == 0, proc.stderr
    assert int(table_value(proc.stdout, "Successful requests:")) == saved["completed"]
    assert int(table_value(proc.stdout, "Total input tokens:")) == saved["total_input_tokens"]
    assert int(table_value(proc.stdout, "Total generated tokens:")) == saved["total_output_tokens"]
    assert "llama-3-8b (from meta-llama/Meta-Llama-3-8B-Instruct)" in proc.stdout


def test_tune_on_a_small_grid_prints_best_defaults_frontier_and_saves_them(tmp_path):
    out = tmp_path / "tune.json"
    proc = run("tune", "--dataset", "azure-conv-2023", "--num-prompts", "300", "--goodput", "ttft:500", "tpot:50",
               "--max-num-seqs-grid", "16,64,256", "--max-num-batched-tokens-grid", "128,512,2048", "--disable-tqdm",
               "--save-result", "--result-filename", out)
    assert proc.returncode == 0, proc.stderr
    for heading in ("Tuning Result", "Best setting", "vLLM defaults", "Frontier", "Gain (best / defaults goodput):"):
        assert heading in proc.stdout
    assert table_value(proc.stdout, "Configurations simulated:") == "9"  # 3 x 3 + the defaults, one pair refused
    assert table_value(proc.stdout, "Refused by vLLM (tokens < seqs):") == "1"
    saved = json.loads(out.read_text())
    assert saved["goodput"] == {"ttft": 500.0, "tpot": 50.0}
    assert saved["best"]["max_num_seqs"] in (16, 64, 256, 1024)  # the grid, or vLLM's defaults
    assert saved["best"]["max_num_batched_tokens"] in (128, 512, 2048, 8192)
    assert saved["defaults"]["max_num_seqs"] == 1024 and saved["defaults"]["max_num_batched_tokens"] == 8192
    assert saved["best"]["request_goodput"] >= saved["defaults"]["request_goodput"]
    assert saved["gain"] == pytest.approx(saved["best"]["request_goodput"] / saved["defaults"]["request_goodput"])
    assert len(saved["table"]) == 10 and 1 <= len(saved["frontier"]) <= 9
    assert f"{saved['best']['request_goodput']:.2f}" in proc.stdout
    # the tie rule's measure, printed and saved: the largest p99 / bound
    for point in (saved["best"], saved["defaults"]):
        assert point["slo_load"] == pytest.approx(max(point["p99_ttft_ms"] / 500, point["p99_tpot_ms"] / 50))
    loads = [line.split()[-1] for line in proc.stdout.splitlines() if line.startswith("SLO load (P99 / bound")]
    assert loads == [f"{saved['best']['slo_load']:.2f}", f"{saved['defaults']['slo_load']:.2f}"]
    assert "slo load" in proc.stdout and all("slo_load" in row for row in saved["table"] + saved["frontier"])


def test_tune_bad_goodput():
    assert_usage_error(run("tune", *SMALL, "--goodput", "ttft=500"), "ttft=500", "colon")


def test_bad_flag():
    assert_usage_error(run("simulate", *SMALL, "--max-num-seq-typo", "8"), "--max-num-seq-typo")


def test_bad_value():
    assert_usage_error(run("simulate", *SMALL, "--gpu-memory-utilization", "1.5"), "--gpu-memory-utilization",
                       "(0, 1]")


def test_unknown_model():
    assert_usage_error(run("simulate", *SMALL, "--model", "gpt-5"), "unknown model 'gpt-5'", "llama-3-8b")


def test_malformed_file(tmp_path):
    bad = tmp_path / "trace.csv"
    bad.write_text("timestamp,prompt_tokens,output_tokens\n0,12,-3\n")
    assert_usage_error(run("simulate", "--dataset", bad), str(bad), "'output_tokens' of row 0 is negative")


# -- in process: the pieces the subprocess tests rely on --------------------------------------------------------

@pytest.mark.parametrize("typed, name", [("llama-3-8b", "llama-3-8b"),
                                         ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
                                         ("meta-llama/Meta-Llama-3-70B-Instruct", "llama-3-70b"),
                                         ("meta-llama/Llama-2-7b-chat-hf", "llama-2-7b"),
                                         ("nvidia/Llama-3.1-8B-Instruct-FP8", "llama-3.1-8b"),
                                         ("mistralai/Mistral-7B-Instruct-v0.2", "mistral-7b"),
                                         ("Qwen/Qwen3-32B", "qwen3-32b")])
def test_resolve_model_maps_hugging_face_ids(typed, name):
    assert cli.resolve_model(typed) == name


def test_peak_concurrency_counts_half_open_intervals():
    sent = np.array([0.0, 1.0, 2.0, 2.5])
    finish = np.array([2.0, 3.0, 2.6, 4.0])  # the first ends as the third starts: not both in flight
    assert metrics.peak_concurrency(sent, finish) == 3


def test_percentile_key_spelling_follows_vllm():
    assert metrics.percentile_word(99.0) == "99" and metrics.percentile_word(99.9) == "99.9"


def test_bench_serve_stats_by_hand():
    """vllm bench serve's statistics of 1, 2, 3, 4 and a NaN (left out): mean 2.5, median 2.5, population std
    sqrt(1.25), p99 by linear interpolation 3 + 0.97 = 3.97, p50 2.5; an empty sample reads as one 0."""
    got = metrics.bench_serve_stats("ttft", np.array([4.0, np.nan, 1.0, 3.0, 2.0]), [99, 50, 12.5])
    assert got == pytest.approx({"mean_ttft_ms": 2.5, "median_ttft_ms": 2.5, "std_ttft_ms": 1.25 ** 0.5,
                                 "p99_ttft_ms": 3.97, "p50_ttft_ms": 2.5, "p12.5_ttft_ms": 1.375}, rel=1e-12)
    assert metrics.bench_serve_stats("x", np.array([np.nan]), [99]) == {"mean_x_ms": 0.0, "median_x_ms": 0.0,
                                                                        "std_x_ms": 0.0, "p99_x_ms": 0.0}


def test_main_returns_2_on_a_bad_file(tmp_path, capsys):
    bad = tmp_path / "b.json"
    bad.write_text('{"input_lens": [1, 2], "output_lens": [3], "request_rate": 1}')
    assert cli.main(["simulate", "--dataset", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("batchlab: error: ") and "input_lens has 2 entries but output_lens 1" in err


def test_tune_refuses_a_knob_fixed_and_searched(capsys):
    argv = ["tune", "--dataset", "synthetic:prompt=64,output=8,n=20", "--goodput", "ttft:500",
            "--max-num-seqs", "8", "--max-num-seqs-grid", "8,16"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--max-num-seqs (one value) or --max-num-seqs-grid" in err


def test_simulate_itl_percentile_beyond_the_histogram_is_exact(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["simulate", "--dataset", "synthetic:prompt=256,output=32,rate=20,n=60", "--percentile-metrics", "itl",
            "--metric-percentiles", "95", "--save-result", "--result-filename", str(out)]
    assert cli.main(argv) == 0
    stdout = capsys.readouterr().out
    assert "P95 ITL (ms):" in stdout and "P99 ITL (ms):" not in stdout
    saved = json.loads(out.read_text())
    assert {"mean_itl_ms", "median_itl_ms", "std_itl_ms", "p95_itl_ms"} <= set(saved)  # from every token's time
    assert "mean_ttft_ms" not in saved  # only the selected metrics, as vLLM


def test_simulate_takes_the_model_of_a_saved_result(tmp_path, capsys):
    assert cli.main(["simulate", "--dataset", str(BENCH), "--percentile-metrics", "ttft"]) == 0
    assert "Model: llama-3-8b (from meta-llama/Meta-Llama-3-8B-Instruct)" in capsys.readouterr().out
    other = tmp_path / "qwen.json"
    other.write_text(BENCH.read_text().replace("meta-llama/Meta-Llama-3-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct"))
    assert cli.main(["simulate", "--dataset", str(other)]) == 2
    err = capsys.readouterr().err
    assert "was run with model_id 'Qwen/Qwen2.5-7B-Instruct'" in err and "pass --model" in err
