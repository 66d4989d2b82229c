"""Every latency and throughput metric, defined once, named as ``vllm bench serve`` names them.

Per request: ttft = first token - arrival; tpot = (finish - first token) / (output - 1); e2el = finish -
arrival; itl = every gap between consecutive tokens of one request; queue = first scheduled - arrival.
Aggregates use completed requests only. As in ``vllm bench serve``, an aggregate over an empty set is 0.
"""
from __future__ import annotations

import numpy as np

PERCENTILES = (("median", 50), ("p90", 90), ("p99", 99))
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


def per_request(arrival_s, output_tokens, scheduled_s, first_token_s, finish_s) -> dict[str, np.ndarray]:
    """Per-request latencies in seconds (NaN where a request was rejected, tpot NaN for one-token outputs)."""
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    out = np.asarray(output_tokens)
    first = np.asarray(first_token_s, dtype=np.float64)
    finish = np.asarray(finish_s, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (finish - first) / (out - 1), np.nan)
    return {
        "queue_s": np.asarray(scheduled_s, dtype=np.float64) - arrival_s,
        "ttft_s": first - arrival_s,
        "tpot_s": tpot,
        "e2el_s": finish - arrival_s,
    }


def inter_token_gaps(token_times_s: np.ndarray, token_offsets: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Every gap between consecutive tokens of the requests selected by ``mask`` (seconds, flat)."""
    gaps = np.diff(token_times_s)
    # Drop the gap that straddles two requests (it ends at a request's first token) and the gaps of
    # requests outside ``mask``: a token-level mask, shifted by one because gap i ends at token i + 1.
    keep = np.repeat(mask, np.diff(token_offsets))
    keep[token_offsets[:-1][np.diff(token_offsets) > 0]] = False
    return gaps[keep[1:]]


def _stats(name: str, values_s: np.ndarray) -> dict[str, float]:
    v = values_s[np.isfinite(values_s)] * 1e3
    out = {f"mean_{name}_ms": float(v.mean()) if v.size else 0.0}
    qs = np.percentile(v, [q for _, q in PERCENTILES]) if v.size else np.zeros(len(PERCENTILES))
    for (label, _), value in zip(PERCENTILES, qs):  # one partition of the data for every percentile
        out[f"{label}_{name}_ms"] = float(value)
    return out


def summary(requests, token_times_s, token_offsets, step_durations_s) -> dict[str, float]:
    """The ``vllm bench serve`` summary of one run (see DESIGN section 5 for every key).

    ``requests`` is the per-request DataFrame of a :class:`~batchlab.sim.SimResult`.
    """
    done = ~requests["rejected"].to_numpy()
    arrival = requests["arrival_s"].to_numpy()
    finish = requests["finish_s"].to_numpy()
    duration = float(np.nanmax(finish[done]) - arrival.min()) if done.any() else 0.0
    inp = int(requests["prompt_tokens"].to_numpy()[done].sum())
    outp = int(requests["output_tokens"].to_numpy()[done].sum())
    padded = requests["padded_tokens"].to_numpy()
    slots = (requests["prompt_tokens"] + requests["output_tokens"] - 1).to_numpy() + padded
    rate = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    out = {
        "completed": int(done.sum()),
        "rejected": int((~done).sum()),
        "duration": duration,
        "total_input_tokens": inp,
        "total_output_tokens": outp,
        "request_throughput": rate(int(done.sum())),
        "output_throughput": rate(outp),
        "total_token_throughput": rate(inp + outp),
    }
    out.update(_stats("ttft", requests["ttft_s"].to_numpy()[done]))
    out.update(_stats("tpot", requests["tpot_s"].to_numpy()[done]))
    out.update(_stats("itl", inter_token_gaps(token_times_s, token_offsets, done)))
    out.update(_stats("e2el", requests["e2el_s"].to_numpy()[done]))
    out["preemptions"] = int(requests["preemptions"].sum())
    out["padding_fraction"] = float(padded[done].sum() / slots[done].sum()) if done.any() else 0.0
    out["gpu_busy_fraction"] = float(np.sum(step_durations_s) / duration) if duration > 0 else 0.0
    return out


def goodput(requests, ttft_s: float | None = None, tpot_s: float | None = None, e2el_s: float | None = None) -> float:
    """Requests per second that completed within every given SLO (seconds), as ``vllm bench serve --goodput``."""
    if ttft_s is None and tpot_s is None and e2el_s is None:
        raise ValueError("goodput needs at least one SLO: ttft_s, tpot_s or e2el_s")
    done = ~requests["rejected"].to_numpy()
    ok = done.copy()
    for col, slo in (("ttft_s", ttft_s), ("tpot_s", tpot_s), ("e2el_s", e2el_s)):
        if slo is not None:
            if not slo > 0:
                raise ValueError(f"{col} SLO must be > 0 seconds, got {slo!r}")
            v = requests[col].to_numpy()
            ok &= ~(v > slo)  # NaN tpot (one-token output) meets any tpot SLO
    if not done.any():
        return 0.0
    duration = float(np.nanmax(requests["finish_s"].to_numpy()[done]) - requests["arrival_s"].min())
    return float(ok.sum() / duration) if duration > 0 else 0.0
