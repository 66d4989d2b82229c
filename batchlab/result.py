"""``SimResult``: what one simulation produced, as DataFrames and the vLLM-style summary."""
from __future__ import annotations

import dataclasses
from functools import cached_property

import numpy as np
import pandas as pd

from . import metrics
from ._kernels import (KIND_NAMES, REJECT_BUDGET, REJECT_KV, REJECT_MODEL_LEN, REJECT_RECOMPUTE, SCHED_KIND,
                       SCHED_REQUEST, SCHED_STEP, SCHED_TOKENS, STEP_COLUMNS, STEP_COMPUTE_BOUND, STEP_DURATION,
                       TOTAL_BUSY_S, TOTAL_SEQ_STEPS, TOTAL_STEPS, KernelOutput)


# What simulate and the fleet raise when a loop returns STATUS_STUCK (batchlab._kernels.engine._run_until).
PROGRESS_GUARD = ("the scheduler loop made no progress (its progress guard: an iteration scheduled rows but "
                  "computed no token, or nothing could be scheduled while requests waited): a bug")


def _reject_reason(code, prompt, output, knobs) -> str:
    if code == REJECT_KV:
        bs = knobs["block_size"]
        need = -(-(prompt + output - 1) // bs)
        return (f"prompt + output ({prompt} + {output} tokens) needs {need} KV blocks of {bs}; "
                f"the pool has {knobs['num_kv_blocks'] - 1} usable")
    if code == REJECT_BUDGET:
        return (f"prompt of {prompt} tokens exceeds max_num_batched_tokens={knobs['max_num_batched_tokens']} "
                f"and this policy cannot split a prompt")
    if code == REJECT_MODEL_LEN:
        return (f"prompt of {prompt} tokens leaves no room for one output token under "
                f"max_model_len={knobs['max_model_len']}")
    if code == REJECT_RECOMPUTE:
        return (f"preempted, and recomputing its prompt plus output exceeds "
                f"max_num_batched_tokens={knobs['max_num_batched_tokens']} with chunked prefill disabled")
    return ""


@dataclasses.dataclass(frozen=True, eq=False)
class SimResult:
    """One run of :func:`batchlab.simulate`.

    Attributes
    ----------
    policy, knobs : the policy and every knob as used (defaults filled in)
    cost : the CostModel that timed each iteration
    requests : DataFrame, one row per request (times in seconds)
    steps : DataFrame, one row per iteration
    token_times : list of arrays, per request the emission time (s) of each output token
        (``record_tokens=True`` only, as ``steps``)
    schedule : DataFrame (``record_schedule=True`` only): step, request, tokens, kind
    """

    stream: object
    policy: str
    cost: object
    knobs: dict
    raw: KernelOutput = dataclasses.field(repr=False)
    _recorded: bool = dataclasses.field(repr=False, default=False)
    generated: np.ndarray | None = dataclasses.field(repr=False, default=None)  # output tokens after clipping
    recorded_tokens: bool = dataclasses.field(repr=False, default=True)

    def _need_tokens(self, what: str) -> None:
        if not self.recorded_tokens:
            raise AttributeError(f"{what} was not recorded: call simulate(..., record_tokens=True)")

    @property
    def token_offsets(self) -> np.ndarray:
        """Index of each request's first token in :attr:`token_times_flat` (length n + 1). A request rejected before
        the loop (it could never be served) takes no room: its span is empty, so a huge ``output_tokens`` that
        cannot fit allocates nothing."""
        self._need_tokens("token_offsets")
        return self.raw.token_offsets

    @property
    def token_times_flat(self) -> np.ndarray:
        """Every output token's emission time (s), request after request."""
        self._need_tokens("token_times_flat")
        return self.raw.token_times_s

    @cached_property
    def _columns(self) -> dict[str, np.ndarray]:
        """The per-request columns as arrays (what :attr:`requests` and :meth:`summary` are built from)."""
        raw, s = self.raw, self.stream
        rejected = raw.reject_code > 0
        # A request rejected after preemption has a first token but no result: blank its times.
        first, finish = np.where(rejected, np.nan, raw.first_token_s), np.where(rejected, np.nan, raw.finish_s)
        output = s.output_tokens if self.generated is None else self.generated
        # Latencies count from when the client sent the request: its arrival, or later under max_concurrency.
        lat = metrics.per_request(raw.sent_s, output, raw.scheduled_s, first, finish)
        return {
            "arrival_s": s.arrival_s, "sent_s": raw.sent_s, "seen_s": raw.seen_s, "prompt_tokens": s.prompt_tokens,
            "output_tokens": output, "cached_tokens": raw.cached_tokens, "scheduled_s": raw.scheduled_s,
            "first_token_s": first, "finish_s": finish, "release_s": raw.release_s,
            **lat,
            "preemptions": raw.preemptions, "computed_tokens": raw.computed_tokens,
            "recomputed_tokens": raw.recomputed_tokens, "padded_tokens": raw.padded_tokens, "rejected": rejected,
        }

    @cached_property
    def requests(self) -> pd.DataFrame:
        cols, s = self._columns, self.stream
        reasons = np.full(len(s), "", dtype=object)
        for i in np.flatnonzero(cols["rejected"]):
            reasons[i] = _reject_reason(self.raw.reject_code[i], s.prompt_tokens[i], cols["output_tokens"][i],
                                        self.knobs)
        df = pd.DataFrame({**cols, "reject_reason": reasons})
        df.index.name = "request"
        return df

    @cached_property
    def steps(self) -> pd.DataFrame:
        self._need_tokens("steps")
        raw = self.raw.steps
        df = pd.DataFrame(raw, columns=list(STEP_COLUMNS))
        for col in ("prefill_tokens", "decode_seqs", "running", "kv_blocks_used"):
            df[col] = df[col].astype(np.int64)
        df["bound"] = np.where(raw[:, STEP_COMPUTE_BOUND] > 0, "compute", "memory")
        df = df.drop(columns="compute_bound")
        dur = df["duration_s"].to_numpy()
        df["compute_util"] = df["flops"] / (self.cost.peak_flops * dur)
        df["bandwidth_util"] = df["hbm_bytes"] / (self.cost.hardware.hbm_bytes_per_s * dur)
        df.index.name = "step"
        return df

    @cached_property
    def token_times(self) -> list[np.ndarray]:
        off, flat = self.token_offsets, self.token_times_flat
        return [flat[off[i]:off[i + 1]] for i in range(off.size - 1)]

    @cached_property
    def schedule(self) -> pd.DataFrame:
        if not self._recorded:
            raise AttributeError("schedule was not recorded: call simulate(..., record_schedule=True)")
        raw = self.raw.schedule
        return pd.DataFrame({
            "step": raw[:, SCHED_STEP], "request": raw[:, SCHED_REQUEST], "tokens": raw[:, SCHED_TOKENS],
            "kind": pd.Categorical.from_codes(raw[:, SCHED_KIND], categories=list(KIND_NAMES)),
        })

    def longest_itl_s(self) -> np.ndarray:
        """Per request, its longest gap between two consecutive tokens (s; NaN for one token or rejected), the
        statistic of an ``itl:`` SLO (``record_tokens=True`` only)."""
        self._need_tokens("longest_itl_s (an itl SLO)")
        out = metrics.longest_gaps(self.token_times_flat, self.token_offsets)
        out[self._columns["rejected"]] = np.nan
        return out

    def itl_s(self) -> np.ndarray:
        """Every inter-token gap (s) of completed requests (``record_tokens=True`` only)."""
        done = ~self._columns["rejected"]
        return metrics.inter_token_gaps(self.token_times_flat, self.token_offsets, done)

    @property
    def sequence_steps(self) -> int:
        """Sequences running summed over iterations (``steps.running.sum()``), recorded or not."""
        return int(self.raw.totals[TOTAL_SEQ_STEPS])

    @property
    def n_steps(self) -> int:
        """Iterations run, recorded or not."""
        return int(self.raw.totals[TOTAL_STEPS])

    def summary(self, slo=None) -> dict:
        """``vllm bench serve``-style summary; keys in DESIGN section 5.

        Computed from what the loop accumulated as it ran, so it costs a pass over the requests, never over the
        tokens: every key is exact except the ITL percentiles, read from a histogram and within
        ``batchlab.metrics.ITL_RELATIVE_ERROR`` (2**-13) of the values the full token record gives.

        With ``slo`` (a :class:`batchlab.SLO`), two keys more: ``request_goodput`` (req/s completed with every
        bound met, the key ``vllm bench serve --goodput`` writes) and ``slo_met`` (the SLO's percentile of every
        bounded latency within its bound, :meth:`batchlab.SLO.met_by`); with an ``itl`` bound also
        ``mean_longest_itl_ms``, ``median_``, ``p90_`` and ``p99_longest_itl_ms`` over the requests' longest
        gaps (``record_tokens=True`` runs only).
        """
        out = metrics.summary(self._columns, metrics.histogram_stats("itl", self.raw.itl),
                              float(self.raw.totals[TOTAL_BUSY_S]))
        if slo is not None:
            if slo.itl_ms is not None:  # the per-request statistic the itl bound reads
                out.update(metrics.sample_stats("longest_itl", self.longest_itl_s()))
            out["request_goodput"] = slo.goodput(self)
            out["slo_met"] = slo.met_by(out)
        return out

    def summary_from_tokens(self) -> dict:
        """:meth:`summary` computed the slow way, from every token's time (``record_tokens=True`` only): the
        reference the histogram is checked against."""
        return metrics.summary(self._columns, metrics.sample_stats("itl", self.itl_s()),
                               float(np.sum(self.raw.steps[:, STEP_DURATION])))

    def goodput(self, ttft_s=None, tpot_s=None, e2el_s=None, itl_s=None) -> float:
        """Requests/s completed within every given SLO (seconds; ``itl_s`` bounds each request's longest gap
        between two tokens and needs ``record_tokens=True``)."""
        cols = self._columns if itl_s is None else {**self._columns, "longest_itl_s": self.longest_itl_s()}
        return metrics.goodput(cols, ttft_s=ttft_s, tpot_s=tpot_s, e2el_s=e2el_s, itl_s=itl_s)
