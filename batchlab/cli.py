"""``python -m batchlab simulate|tune``: vLLM's flag names in, ``vllm bench serve``'s table and JSON keys out.

``simulate`` replays a workload (:func:`batchlab.loaders.load_workload`: a preset, a synthetic spec, a trace
file or a saved ``vllm bench serve`` result) through policy ``chunked`` (vLLM's scheduler) on the analytic cost
model, prints the table ``vllm bench serve`` prints and, with ``--save-result``, writes the JSON keys it writes
for the metrics batchlab models. ``tune`` searches ``max_num_seqs`` x ``max_num_batched_tokens`` for the largest
goodput under ``--goodput`` (:func:`batchlab.tune.tune`).

The table layout and the JSON keys follow ``vllm/benchmarks/serve.py`` (``benchmark`` and ``main_async``).
Keys written: ``date``, ``backend``, ``model_id``, ``num_prompts``, ``request_rate`` (a trace's own mean rate
when it keeps its arrival times), ``burstiness`` (as given; null when the dataset's own arrivals were kept),
``max_concurrency``, ``duration``, ``completed``, ``failed`` (requests batchlab rejects, e.g. a prompt longer
than ``max_model_len``, which vLLM answers with an error), ``total_input_tokens``, ``total_output_tokens``,
``request_throughput``, ``request_goodput`` (null without ``--goodput``, as vLLM), ``output_throughput``,
``total_token_throughput``, ``max_concurrent_requests``, ``input_lens``, ``output_lens``, ``ttfts`` (s),
``latencies`` (s), ``queue_times`` (s, client-side wait under ``--max-concurrency``), ``errors``, and
``mean_/median_/std_/p<q>_<metric>_ms`` for each selected metric. Left out, because batchlab does not model them
or keeps no record of them: ``itls``, ``start_times``, ``generated_texts``, ``max_output_tokens_per_s``,
``rtfx``, the speculative-decoding keys, and ``std_itl_ms`` (the loop bins inter-token gaps in a histogram, which
gives the mean and percentiles but not the spread; asking for an ITL percentile other than 50, 90 or 99 makes
the run keep every token's time, and then ITL statistics, the spread included, are exact). A ``batchlab``
object holds what was simulated (model, GPU, knobs, workload).

Errors (a bad flag or value, an unknown model, a malformed file) end with exit code 2 and one line
``batchlab: error: ...`` on stderr.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from datetime import datetime
from pathlib import Path

import numpy as np

from . import __version__
from .metrics import bench_serve_stats, peak_concurrency, percentile_word
from .vllm import BLOCK_SIZE, GPU_MEMORY_UTILIZATION, VLLM_VERSION

LATENCY_METRICS = {  # vLLM's metric name -> (printed name, section header), as in vllm/benchmarks/serve.py
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}
DEFAULT_MODEL = "llama-3-8b"  # the book's reference model
SUMMARY_PERCENTILES = {50: "median", 90: "p90", 99: "p99"}  # the percentiles SimResult.summary() gives
GPU_ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb", "h100-80gb": "h100-sxm", "a100-sxm": "a100-80gb"}


class _Parser(argparse.ArgumentParser):
    """argparse that ends a usage error with one line, ``batchlab: error: ...``, and exit code 2."""

    def error(self, message):
        self.exit(2, f"batchlab: error: {message} (see '{self.prog} --help')\n")


# -- argument types (argparse turns ArgumentTypeError into a usage error) ---------------------------------------

def _number(parse, ok, expected: str):
    """An argparse type: ``parse(text)`` (int or float) that must satisfy ``ok``; else "expected <expected>"."""
    def convert(text: str):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return convert


_positive_int = _number(int, lambda v: v >= 1, "a whole number >= 1")
_nonnegative_int = _number(int, lambda v: v >= 0, "a whole number >= 0")
_rate = _number(float, lambda v: v > 0, "requests/s > 0 or inf")
_fraction = _number(float, lambda v: 0 < v <= 1, "a fraction in (0, 1]")


def _int_grid(text: str) -> list[int]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}")
    return sorted({_positive_int(v) for v in values})


def _metrics(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    bad = [n for n in names if n not in LATENCY_METRICS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(LATENCY_METRICS)}, "
                                         f"got {text!r}")
    return list(dict.fromkeys(names))


def _percentiles(text: str) -> list[float]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            value = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated percentiles, got {text!r}") from None
        if not 0 < value <= 100:
            raise argparse.ArgumentTypeError(f"percentiles must be in (0, 100], got {part!r}")
        out.append(value)
    if not out:
        raise argparse.ArgumentTypeError(f"expected comma-separated percentiles, got {text!r}")
    return out


def _saved_model_id(dataset: str) -> str | None:
    """The ``model_id`` of a saved ``vllm bench serve`` result, if ``dataset`` is one (else None)."""
    path = Path(dataset)
    if path.suffix.lower() != ".json" or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return None  # load_workload says what is wrong with the file
    model_id = data.get("model_id") if isinstance(data, dict) and "input_lens" in data else None
    return model_id if isinstance(model_id, str) and model_id else None


def resolve_model(text: str) -> str:
    """The batchlab model name for ``text``: a batchlab name, or a Hugging Face id as vLLM users type it.

    ``meta-llama/Llama-3.1-8B-Instruct`` -> ``llama-3.1-8b``: the organisation, a ``Meta-`` prefix and the
    suffixes ``-Instruct``, ``-chat``, ``-hf``, ``-FP8``, ``-it`` and a ``-v0.2``-style version are dropped and the
    rest lower-cased; what is left must be a batchlab model. An FP8 checkpoint has the shapes of its BF16 model.
    """
    from .models import model_names
    names = model_names()
    if text in names:
        return text
    stem = text.rsplit("/", 1)[-1].lower()
    stem = re.sub(r"^meta-", "", stem)
    previous = None
    while previous != stem:
        previous = stem
        stem = re.sub(r"(-instruct|-chat|-hf|-fp8|-it|-v\d+(\.\d+)*)$", "", stem)
    if stem in names:
        return stem
    raise ValueError(f"unknown model {text!r}; batchlab models: {', '.join(names)} (or their "
                                     f"Hugging Face ids, e.g. meta-llama/Llama-3.1-8B-Instruct)")


def resolve_gpu(text: str) -> str:
    from .hardware import hardware_names
    names = hardware_names()
    key = text.lower().replace("_", "-")
    key = GPU_ALIASES.get(key, key)
    if key in names:
        return key
    raise argparse.ArgumentTypeError(f"unknown GPU {text!r}; batchlab GPUs: {', '.join(names)}")


# -- the parser --------------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="batchlab", description="Simulate vLLM's scheduler on an analytic GPU cost model, with "
                     "vllm serve / vllm bench serve flag names. No GPU is used.")
    sub = parser.add_subparsers(dest="command", metavar="{simulate,tune}", required=True)
    sim = sub.add_parser("simulate", help="replay a workload and print vllm bench serve's table",
                         description="Replay a workload through vLLM's scheduler (policy chunked) on the cost model "
                         "and print the table vllm bench serve prints.")
    _common_flags(sim)
    sim.add_argument("--goodput", nargs="+", metavar="KEY:VALUE",
                     help="SLOs in ms for request goodput, e.g. ttft:500 tpot:50 (keys ttft, tpot, e2el as vLLM; "
                     "itl bounds each request's longest gap between two tokens)")
    sim.set_defaults(func=run_simulate)
    tune = sub.add_parser("tune", help="search max_num_seqs x max_num_batched_tokens for the largest goodput",
                          description="Search max_num_seqs x max_num_batched_tokens for the largest request "
                          "goodput under an SLO; print the best setting, vLLM's defaults and the frontier. "
                          "Goodputs within 1% of the largest tie; the tie goes to the setting (with at least "
                          "the defaults' goodput) with the smallest SLO load, the largest P99 / bound. "
                          "--max-num-seqs N (or --max-num-batched-tokens, --long-prefill-token-threshold) fixes "
                          "that knob instead of searching it.")
    _common_flags(tune)
    tune.add_argument("--goodput", nargs="+", metavar="KEY:VALUE", required=True,
                      help="SLOs in ms, e.g. ttft:500 tpot:50 itl:200 (keys ttft, tpot, e2el, vLLM's syntax; "
                      "itl bounds each request's longest gap between two tokens)")
    tune.add_argument("--max-num-seqs-grid", type=_int_grid, metavar="N,N,...",
                      help="max_num_seqs values to try (default: the tuner's grid)")
    tune.add_argument("--max-num-batched-tokens-grid", type=_int_grid, metavar="N,N,...",
                      help="max_num_batched_tokens values to try (default: the tuner's grid)")
    tune.add_argument("--long-prefill-token-threshold-grid", type=_int_grid, metavar="N,N,...",
                      help="also search long_prefill_token_threshold over these values")
    tune.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    tune.set_defaults(func=run_tune)
    return parser


def _common_flags(p: argparse.ArgumentParser) -> None:
    eng = p.add_argument_group("engine (vllm serve flags)")
    eng.add_argument("--model", help="batchlab model name or Hugging Face id (default: the model_id of a saved "
                     "vllm bench serve result, else llama-3-8b)")
    eng.add_argument("--gpu", type=resolve_gpu, default="h100-sxm", help="GPU (default h100-sxm)")
    eng.add_argument("--tensor-parallel-size", "-tp", type=_positive_int, default=1, help="TP degree (1 to 8)")
    eng.add_argument("--dtype", choices=("auto", "bfloat16", "bf16", "float16", "half"), default="auto",
                     help="activation/weight type; float16 is timed as bfloat16 (same bytes and peak FLOP/s)")
    eng.add_argument("--quantization", "-q", choices=("fp8",), default=None,
                     help="fp8: FP8 weights (also implied by an -FP8 checkpoint id)")
    eng.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto", help="KV cache type")
    eng.add_argument("--max-num-seqs", type=_positive_int, help="default: vLLM's for the GPU")
    eng.add_argument("--max-num-batched-tokens", type=_positive_int, help="default: vLLM's for the GPU")
    eng.add_argument("--gpu-memory-utilization", type=_fraction,
                     help=f"default {GPU_MEMORY_UTILIZATION} (vLLM {VLLM_VERSION})")
    eng.add_argument("--max-model-len", type=_positive_int, help="default: the model's context length")
    eng.add_argument("--long-prefill-token-threshold", type=_nonnegative_int, help="default 0 (none)")
    eng.add_argument("--block-size", type=_positive_int, default=16, help="tokens per KV block (default 16)")
    for flag in ("enable-chunked-prefill", "enable-prefix-caching", "async-scheduling"):
        eng.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, default=None, help="default on")
    wl = p.add_argument_group("workload (vllm bench serve flags)")
    wl.add_argument("--dataset", required=True,
                    help="a preset (azure-conv-2023, sharegpt, ...), a spec synthetic:prompt=512,output=128,rate=4,"
                    "n=1000, a .csv/.jsonl trace, or a vllm bench serve --save-result --save-detailed .json")
    wl.add_argument("--num-prompts", type=_positive_int,
                    help="requests (preset, synthetic: default 1000; a file: the first N, default all)")
    wl.add_argument("--request-rate", type=_rate,
                    help="requests/s, inf = all at once (default: the dataset's own; a timed trace is rescaled)")
    wl.add_argument("--burstiness", type=_rate, help="gamma shape of the gaps, 1 = Poisson (vLLM's meaning)")
    wl.add_argument("--max-concurrency", type=_positive_int, help="at most this many requests in flight")
    wl.add_argument("--seed", type=_nonnegative_int, default=0, help="seed of every draw (default 0)")
    wl.add_argument("--arrival-column", help="trace column of arrival times (default: detected)")
    wl.add_argument("--prompt-column", help="trace column of prompt tokens (default: detected)")
    wl.add_argument("--output-column", help="trace column of output tokens (default: detected)")
    wl.add_argument("--time-unit", choices=("s", "ms", "us", "ns"), help="unit of numeric arrival times")
    wl.add_argument("--prefix-blocks-column", help="trace column of prefix block ids, a list per request (default: "
                    "none, so only a preempted request finds its own blocks again)")
    wl.add_argument("--prefix-block-tokens", type=_positive_int, default=BLOCK_SIZE,
                    help=f"tokens per prefix block id (default {BLOCK_SIZE}, vLLM's block size)")
    out = p.add_argument_group("results (vllm bench serve flags)")
    out.add_argument("--save-result", action="store_true", help="write the result as JSON")
    out.add_argument("--result-filename", help="JSON file name (default batchlab-<rate>qps-<model>-<date>.json)")
    out.add_argument("--result-dir", help="directory for the JSON file")
    if p.prog.endswith("tune"):
        return  # tune reports goodput and p99 TTFT/TPOT per setting, not a latency table
    out.add_argument("--percentile-metrics", type=_metrics, default=list(LATENCY_METRICS),
                     help="comma-separated subset of ttft,tpot,itl,e2el (default all four; vLLM's: ttft,tpot,itl)")
    out.add_argument("--metric-percentiles", type=_percentiles, default=[99.0],
                     help="comma-separated percentiles (default 99)")


# -- building the run --------------------------------------------------------------------------------------------

def _cost(args):
    from .cost import CostModel
    from .hardware import get_hardware
    from .models import get_model
    fp8_checkpoint = "fp8" in str(args.model_id).lower()
    dtype = "fp8" if args.quantization == "fp8" or fp8_checkpoint else "bf16"
    kv_dtype = "fp8" if args.kv_cache_dtype == "fp8" else "bf16"
    return CostModel(get_hardware(args.gpu), get_model(args.model), dtype=dtype, tp=args.tensor_parallel_size,
                     kv_dtype=kv_dtype)


def _workload(args):
    from .loaders import load_workload
    return load_workload(args.dataset, n_requests=args.num_prompts, rate_req_s=args.request_rate, seed=args.seed,
                         arrival=args.arrival_column, prompt=args.prompt_column, output=args.output_column,
                         time_unit=args.time_unit, burstiness=args.burstiness, max_concurrency=args.max_concurrency,
                         prefix_blocks=args.prefix_blocks_column, prefix_block_tokens=args.prefix_block_tokens)


def _knobs(args) -> dict:
    """The simulate() knobs the user gave (the rest keep vLLM's defaults)."""
    given = {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
             "max_model_len": args.max_model_len, "long_prefill_token_threshold": args.long_prefill_token_threshold,
             "enable_chunked_prefill": args.enable_chunked_prefill,
             "enable_prefix_caching": args.enable_prefix_caching, "async_scheduling": args.async_scheduling}
    knobs = {k: v for k, v in given.items() if v is not None}
    knobs["block_size"] = args.block_size
    if args.gpu_memory_utilization is not None:
        knobs["gpu_memory_utilization"] = args.gpu_memory_utilization
    return knobs


def _preamble(args, cost, workload, knobs) -> None:
    named = "" if args.model_id == args.model else f" (from {args.model_id})"
    print(f"batchlab {__version__}: vLLM {VLLM_VERSION}'s scheduler on an analytic cost model (no GPU used)")
    print(f"Model: {args.model}{named}, {cost.dtype} weights, {cost.kv_dtype} KV cache; GPU: {args.gpu} x "
          f"TP {cost.tp}")
    print("Knobs: " + ", ".join(f"{k}={v}" for k, v in knobs.items()))
    print(f"Workload: {workload.source}")


# -- simulate ----------------------------------------------------------------------------------------------------

def _metric_stats(res, summary: dict, metric: str, percentiles: list[float]) -> dict:
    """``mean_/median_/std_/p<q>_<metric>_ms`` as vLLM writes them (std_itl_ms only from a token record)."""
    out = {}
    if metric == "itl" and not res.recorded_tokens:
        out[f"mean_{metric}_ms"] = summary[f"mean_{metric}_ms"]
        out[f"median_{metric}_ms"] = summary[f"median_{metric}_ms"]
        for p in percentiles:
            out[f"p{percentile_word(p)}_{metric}_ms"] = summary[f"{SUMMARY_PERCENTILES[p]}_{metric}_ms"]
        return out
    if metric == "itl":
        values = res.itl_s()
    else:
        done = ~res.requests["rejected"].to_numpy()
        values = res.requests[f"{metric}_s"].to_numpy()[done]
    return bench_serve_stats(metric, values * 1e3, percentiles)  # a one-token output has no TPOT: NaN, left out


def bench_result(res, workload, args, slo) -> dict:
    """The ``vllm bench serve`` result dict of one simulated run (keys in the module docstring)."""
    summary = res.summary()
    reqs = res.requests
    done = ~reqs["rejected"].to_numpy()
    rate = workload.request_rate
    result = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "batchlab",
        "model_id": args.model_id,
        "num_prompts": workload.n_prompts,
        "request_rate": "inf" if rate is None or math.isinf(rate) else rate,
        "burstiness": args.burstiness,
        "max_concurrency": workload.max_concurrency,
        "duration": summary["duration"],
        "completed": summary["completed"],
        "failed": summary["rejected"],
        "total_input_tokens": summary["total_input_tokens"],
        "total_output_tokens": summary["total_output_tokens"],
        "request_throughput": summary["request_throughput"],
        "request_goodput": None,
        "output_throughput": summary["output_throughput"],
        "total_token_throughput": summary["total_token_throughput"],
        "max_concurrent_requests": peak_concurrency(reqs["sent_s"].to_numpy()[done],
                                                     reqs["finish_s"].to_numpy()[done]),
    }
    if slo is not None:
        result["request_goodput"] = slo.goodput(res)
    for metric in args.percentile_metrics:
        result.update(_metric_stats(res, summary, metric, args.metric_percentiles))
    zero = np.where(done, 1.0, 0.0)  # vLLM writes 0 for a failed request's ttft, latency and output length
    result.update({
        "input_lens": reqs["prompt_tokens"].astype(int).tolist(),
        "output_lens": np.where(done, reqs["output_tokens"], 0).astype(int).tolist(),
        "ttfts": np.nan_to_num(reqs["ttft_s"].to_numpy() * zero).tolist(),
        "latencies": np.nan_to_num(reqs["e2el_s"].to_numpy() * zero).tolist(),
        "queue_times": (reqs["sent_s"] - reqs["arrival_s"]).tolist(),
        "errors": reqs["reject_reason"].astype(str).tolist(),
    })
    result["batchlab"] = {
        "version": __version__, "vllm_version": VLLM_VERSION, "model": args.model, "gpu": args.gpu,
        "tensor_parallel_size": res.cost.tp, "dtype": res.cost.dtype, "kv_cache_dtype": res.cost.kv_dtype,
        "policy": res.policy, "knobs": res.knobs, "workload": workload.source, "seed": args.seed,
        "preemptions": summary["preemptions"], "gpu_busy_fraction": summary["gpu_busy_fraction"],
        "prefix_cache_hit_rate": summary["prefix_cache_hit_rate"],
    }
    return result


def print_table(result: dict, args) -> None:
    """The table ``vllm bench serve`` prints, same labels and layout (``{:<40} {:<10}``)."""
    line = "{:<40} {:<10}".format
    num = "{:<40} {:<10.2f}".format
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print(line("Successful requests:", result["completed"]))
    print(line("Failed requests:", result["failed"]))
    if result["max_concurrency"] is not None:
        print(line("Maximum request concurrency:", result["max_concurrency"]))
    if result["request_rate"] != "inf":
        print(num("Request rate configured (RPS):", result["request_rate"]))
    print(num("Benchmark duration (s):", result["duration"]))
    print(line("Total input tokens:", result["total_input_tokens"]))
    print(line("Total generated tokens:", result["total_output_tokens"]))
    print(num("Request throughput (req/s):", result["request_throughput"]))
    if result["request_goodput"] is not None:
        print(num("Request goodput (req/s):", result["request_goodput"]))
    print(num("Output token throughput (tok/s):", result["output_throughput"]))
    print(num("Peak concurrent requests:", result["max_concurrent_requests"]))
    print(num("Total token throughput (tok/s):", result["total_token_throughput"]))
    for metric in args.percentile_metrics:
        name, header = LATENCY_METRICS[metric]
        print("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        print(num(f"Mean {name} (ms):", result[f"mean_{metric}_ms"]))
        print(num(f"Median {name} (ms):", result[f"median_{metric}_ms"]))
        for p in args.metric_percentiles:
            print(num(f"P{percentile_word(p)} {name} (ms):", result[f"p{percentile_word(p)}_{metric}_ms"]))
    print("=" * 50)


def _result_path(args, rate, kind: str = "") -> Path:
    if args.result_filename:
        name = args.result_filename
    else:
        concurrency = f"-concurrency{args.max_concurrency}" if args.max_concurrency is not None else ""
        rate_word = "inf" if rate is None or math.isinf(rate) else f"{rate:g}"
        prefix = f"batchlab-{kind}-" if kind else "batchlab-"
        name = f"{prefix}{rate_word}qps{concurrency}-{args.model}-{datetime.now():%Y%m%d-%H%M%S}.json"
    path = Path(name)
    if args.result_dir:
        Path(args.result_dir).mkdir(parents=True, exist_ok=True)
        path = Path(args.result_dir) / path
    return path


def _write_json(path: Path, data: dict) -> None:
    def clean(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        if isinstance(value, np.generic):
            return clean(value.item())
        return value
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(clean(data), fh)
    print(f"Saved {path}")


def run_simulate(args) -> int:
    from .sim import simulate
    from .tune import parse_goodput
    cost = _cost(args)
    workload = _workload(args)
    knobs = _knobs(args)
    if workload.max_concurrency is not None:
        knobs["max_concurrency"] = workload.max_concurrency
    slo = parse_goodput(args.goodput) if args.goodput else None
    # The loop's ITL histogram gives the median, p90 and p99; any other ITL percentile needs every token's time.
    exact_itl = "itl" in args.percentile_metrics and any(p not in SUMMARY_PERCENTILES for p in args.metric_percentiles)
    record = exact_itl or (slo is not None and slo.needs_tokens)  # an itl bound reads each request's longest gap
    res = simulate(workload.requests, "chunked", cost, record_tokens=record, **knobs)
    _preamble(args, cost, workload, res.knobs)
    result = bench_result(res, workload, args, slo)
    print_table(result, args)
    if args.save_result:
        _write_json(_result_path(args, workload.request_rate), result)
    return 0


# -- tune --------------------------------------------------------------------------------------------------------

def _grid(args, knob: str):
    """One knob's values for the tuner: the fixed value (``--max-num-seqs 64``), the grid, or None (its default)."""
    fixed, grid = getattr(args, knob), getattr(args, f"{knob}_grid")
    if fixed is not None and grid is not None:
        flag = knob.replace("_", "-")
        raise ValueError(f"give --{flag} (one value) or --{flag}-grid (values to search), not both")
    return [fixed] if fixed is not None else grid


def _setting(point: dict) -> str:
    return ", ".join(f"{k}={point[k]}" for k in ("max_num_seqs", "max_num_batched_tokens",
                                                  "long_prefill_token_threshold") if k in point)


def _gain_text(gain: float) -> str:
    if math.isnan(gain):
        return "n/a (no setting has goodput > 0)"
    return "inf (vLLM's defaults have goodput 0)" if math.isinf(gain) else f"{gain:.2f}x"


def print_tuning(found, slo, n_configs: int, n_refused: int) -> None:
    """The best setting, vLLM's defaults, the gain and the frontier, in ``vllm bench serve``'s layout."""
    line = "{:<40} {:<10}".format
    num = "{:<40} {:<10.2f}".format
    print("{s:{c}^{n}}".format(s=" Tuning Result ", n=50, c="="))
    print(line("SLO (--goodput, ms):", slo.spec()))
    print(line("Configurations simulated:", n_configs - n_refused))
    if n_refused:
        print(line("Refused by vLLM (tokens < seqs):", n_refused))
    pct = f"P{percentile_word(slo.percentile)}"
    for header, point in (("Best setting", found.best), ("vLLM defaults", found.defaults)):
        print("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        print(_setting(point))
        print(num("Request goodput (req/s):", point["request_goodput"]))
        print(num("P99 TTFT (ms):", point["p99_ttft_ms"]))
        print(num("P99 TPOT (ms):", point["p99_tpot_ms"]))
        if "p99_longest_itl_ms" in point:
            print(num("P99 longest gap per request (ms):", point["p99_longest_itl_ms"]))
        print(line(f"SLO met at {pct}:", "yes" if point["slo_met"] else "no"))
        print(num(f"SLO load ({pct} / bound, largest):", point["slo_load"]))
    print(line("Gain (best / defaults goodput):", _gain_text(found.gain)))
    print("{s:{c}^{n}}".format(s="Frontier: goodput vs P99 TTFT", n=50, c="-"))
    cols = [k for k in ("max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold")
            if k in found.frontier.columns]
    heads = {"max_num_seqs": "seqs", "max_num_batched_tokens": "tokens", "long_prefill_token_threshold": "lp_thr"}
    print(" ".join(f"{heads[c]:>7}" for c in cols) + f" {'goodput':>9} {'p99 ttft':>9} {'p99 tpot':>9} "
          f"{'slo load':>9}  slo")
    print(" ".join(f"{'':>7}" for _ in cols) + f" {'(req/s)':>9} {'(ms)':>9} {'(ms)':>9}")
    for _, row in found.frontier.sort_values("p99_ttft_ms", kind="mergesort").iterrows():
        print(" ".join(f"{int(row[c]):>7}" for c in cols) + f" {row['request_goodput']:>9.2f} "
              f"{row['p99_ttft_ms']:>9.2f} {row['p99_tpot_ms']:>9.2f} {row['slo_load']:>9.3f}  "
              f"{'yes' if row['slo_met'] else 'no'}")
    print("=" * 50)


def run_tune(args) -> int:
    from .tune import parse_goodput, tune
    slo = parse_goodput(args.goodput)
    cost = _cost(args)
    workload = _workload(args)
    fixed = _knobs(args)
    grids = {knob: _grid(args, knob) for knob in ("max_num_seqs", "max_num_batched_tokens",
                                                   "long_prefill_token_threshold")}
    for knob in grids:
        fixed.pop(knob, None)
    if workload.max_concurrency is not None:
        fixed["max_concurrency"] = workload.max_concurrency
    _preamble(args, cost, workload, fixed)
    found = tune(workload.requests, cost, slo, progress=not args.disable_tqdm, **grids, **fixed)
    n_refused = int(found.table["vllm_refuses"].sum())
    print_tuning(found, slo, len(found.table), n_refused)
    if args.save_result:
        rate = workload.request_rate
        result = {
            "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "batchlab", "model_id": args.model_id,
            "num_prompts": workload.n_prompts, "request_rate": "inf" if rate is None or math.isinf(rate) else rate,
            "burstiness": args.burstiness, "max_concurrency": workload.max_concurrency, "goodput": slo.bounds_ms,
            "slo_percentile": slo.percentile, "best": found.best, "defaults": found.defaults, "gain": found.gain,
            "frontier": found.frontier.to_dict("records"), "table": found.table.to_dict("records"),
            "batchlab": {"version": __version__, "vllm_version": VLLM_VERSION, "model": args.model, "gpu": args.gpu,
                         "tensor_parallel_size": cost.tp, "dtype": cost.dtype, "kv_cache_dtype": cost.kv_dtype,
                         "fixed_knobs": fixed, "workload": workload.source, "seed": args.seed},
        }
        _write_json(_result_path(args, rate, "tune"), result)
    return 0


# -- entry point -------------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    """``batchlab`` / ``python -m batchlab``: parse, run, and turn a ValueError or OSError into exit code 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.model_id = args.model or _saved_model_id(args.dataset) or DEFAULT_MODEL  # as typed, for model_id
        try:
            args.model = resolve_model(args.model_id)
        except ValueError as err:
            if args.model is None:  # the saved result's model: say where it came from
                raise ValueError(f"{args.dataset} was run with model_id {args.model_id!r}, which batchlab does not "
                                 f"know; pass --model to simulate one it does ({err})") from None
            raise
        return args.func(args)
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, OSError) as err:
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"batchlab: error: {message}", file=sys.stderr)
        return 2
