"""``SimResult``: what one simulation produced, as DataFrames and the vLLM-style summary."""
from __future__ import annotations

import dataclasses
from functools import cached_property

import numpy as np
import pandas as pd

from . import metrics
from .sim import KIND_NAMES, REJECT_BUDGET, REJECT_KV, REJECT_RECOMPUTE, STEP_COLUMNS


def _reject_reason(code, prompt, output, knobs) -> str:
    if code == REJECT_KV:
        bs = knobs["block_size"]
        need = -(-(prompt + output - 1) // bs)
        return (f"prompt + output ({prompt} + {output} tokens) needs {need} KV blocks of {bs}; "
                f"the pool has {knobs['num_kv_blocks'] - 1} usable")
    if code == REJECT_BUDGET:
        return (f"prompt of {prompt} tokens exceeds max_num_batched_tokens={knobs['max_num_batched_tokens']} "
                f"and this policy cannot split a prompt")
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
    schedule : DataFrame (``record_schedule=True`` only): step, request, tokens, kind
    """

    stream: object
    policy: str
    cost: object
    knobs: dict
    _raw: tuple = dataclasses.field(repr=False)
    _recorded: bool = dataclasses.field(repr=False, default=False)

    @classmethod
    def from_kernel(cls, stream, policy, cost, knobs, raw, recorded):
        return cls(stream, policy, cost, dict(knobs), raw, recorded)

    # Raw kernel outputs, by name.
    @property
    def token_offsets(self) -> np.ndarray:
        """Index of each request's first token in :attr:`token_times_flat` (length n + 1)."""
        return self._raw[10]

    @property
    def token_times_flat(self) -> np.ndarray:
        """Every output token's emission time (s), request after request."""
        return self._raw[11]

    @cached_property
    def requests(self) -> pd.DataFrame:
        (_, first, finish, sched, release, preempt, reject, pad, computed, recomputed, *_rest) = self._raw
        s = self.stream
        rejected = reject > 0
        # A request rejected after preemption has a first token but no result: blank its times.
        first, finish = np.where(rejected, np.nan, first), np.where(rejected, np.nan, finish)
        lat = metrics.per_request(s.arrival_s, s.output_tokens, sched, first, finish)
        reasons = np.full(len(s), "", dtype=object)
        for i in np.flatnonzero(rejected):
            reasons[i] = _reject_reason(reject[i], s.prompt_tokens[i], s.output_tokens[i], self.knobs)
        df = pd.DataFrame({
            "arrival_s": s.arrival_s, "prompt_tokens": s.prompt_tokens, "output_tokens": s.output_tokens,
            "scheduled_s": sched, "first_token_s": first, "finish_s": finish, "release_s": release,
            **lat,
            "preemptions": preempt, "computed_tokens": computed, "recomputed_tokens": recomputed,
            "padded_tokens": pad, "rejected": rejected, "reject_reason": reasons,
        })
        df.index.name = "request"
        return df

    @cached_property
    def steps(self) -> pd.DataFrame:
        raw = self._raw[12]
        df = pd.DataFrame(raw, columns=list(STEP_COLUMNS))
        for col in ("prefill_tokens", "decode_seqs", "running", "kv_blocks_used"):
            df[col] = df[col].astype(np.int64)
        df["bound"] = np.where(raw[:, 6] > 0, "compute", "memory")
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
        raw = self._raw[13]
        return pd.DataFrame({
            "step": raw[:, 0], "request": raw[:, 1], "tokens": raw[:, 2],
            "kind": pd.Categorical.from_codes(raw[:, 3], categories=list(KIND_NAMES)),
        })

    def itl_s(self) -> np.ndarray:
        """Every inter-token gap (s) of completed requests."""
        done = ~self.requests["rejected"].to_numpy()
        return metrics.inter_token_gaps(self.token_times_flat, self.token_offsets, done)

    def summary(self) -> dict:
        """``vllm bench serve``-style summary; keys in DESIGN section 5."""
        return metrics.summary(self.requests, self.token_times_flat, self.token_offsets,
                               self._raw[12][:, 1])

    def goodput(self, ttft_s=None, tpot_s=None, e2el_s=None) -> float:
        """Requests/s completed within every given SLO (seconds)."""
        return metrics.goodput(self.requests, ttft_s=ttft_s, tpot_s=tpot_s, e2el_s=e2el_s)
