"""Several engines in one simulation: replicas behind a router, and disaggregated prefill and decode.

:func:`simulate_fleet` runs ``n_replicas`` copies of one vLLM engine (policy ``chunked``, vLLM 0.33's rules) behind
a router; :func:`simulate_disaggregated` runs prefill instances and decode instances with the KV cache of each
finished prompt sent between them. Both run every engine's jitted loop together, in time order
(:mod:`batchlab._kernels.fleet`), and return a :class:`FleetResult`. Used in chapter 11 (one engine or two kinds).
"""
from __future__ import annotations

import dataclasses
from functools import cached_property

import numpy as np
import pandas as pd

from . import _checks
from ._kernels import (POLICY_CHUNKED, REQ_CACHED, REQ_COMPUTED, REQ_OUTPUT, REQ_PREEMPT, REQ_RECOMPUTED, REQ_REJECT,
                       ROUTERS, STATUS_OK, TIME_FINISH, TIME_FIRST, TIME_RELEASE, TIME_SCHED, TIME_SEEN, TIME_SENT,
                       TOTAL_BUSY_S, FleetOutput, Knobs, Stream, fleet_kernel)
from .cost import CostModel
from .result import PROGRESS_GUARD, KernelOutput, SimResult
from .sim import check_inputs
from .vllm import BLOCK_SIZE, GPU_MEMORY_UTILIZATION, KNOB_POLICIES, prepare
from .workload import Requests

LINKS = ("nvlink", "network")  # how the KV cache travels from a prefill to a decode instance


@dataclasses.dataclass(frozen=True, eq=False)
class FleetResult:
    """One run of :func:`simulate_fleet` or :func:`simulate_disaggregated`.

    Attributes
    ----------
    stream : Requests
    cost : CostModel
    knobs : dict, every engine's knobs as used (vLLM's defaults filled in)
    router : str
    n_prefill, n_decode : int
        Engines of each kind; ``n_prefill`` = 0 for replicas serving whole requests (``n_decode`` of them).
    link : str or None
        ``"nvlink"`` or ``"network"`` (disaggregated), else None.
    """

    stream: Requests
    cost: CostModel
    knobs: dict
    router: str
    n_prefill: int
    n_decode: int
    link: str | None
    generated: np.ndarray = dataclasses.field(repr=False)
    transfer_s: np.ndarray = dataclasses.field(repr=False)
    kv_bytes: np.ndarray = dataclasses.field(repr=False)
    raw: FleetOutput = dataclasses.field(repr=False)
    recorded_tokens: bool = dataclasses.field(repr=False, default=False)
    recorded_schedule: bool = dataclasses.field(repr=False, default=False)

    @property
    def n_engines(self) -> int:
        """Engines (one GPU each at ``tp=1``; ``cost.tp`` GPUs each otherwise)."""
        return self.n_prefill + self.n_decode

    @property
    def n_gpus(self) -> int:
        """GPUs the fleet uses: engines x tensor-parallel degree."""
        return self.n_engines * self.cost.tp

    @property
    def disaggregated(self) -> bool:
        return self.n_prefill > 0

    @property
    def engine(self) -> np.ndarray:
        """Per request, the engine that served it (a replica) or computed its prompt (a prefill instance); -1:
        rejected before any engine saw it."""
        return self.raw.front_of

    @property
    def decode_engine(self) -> np.ndarray:
        """Per request, the engine that produced its output after the first token (-1: none, e.g. one-token
        outputs on a disaggregated fleet); the same as :attr:`engine` for replicas."""
        return self.raw.back_of

    def role(self, i: int) -> str:
        """``"replica"``, ``"prefill"`` or ``"decode"``."""
        if not self.disaggregated:
            return "replica"
        return "prefill" if i < self.n_prefill else "decode"

    def _kernel_output(self, rows, i) -> KernelOutput:
        """The :class:`KernelOutput` of requests ``rows``: the whole fleet (``i`` None) or engine ``i``."""
        raw = self.raw
        req, times, req_d, times_d, back = raw.req, raw.times, raw.req_d, raw.times_d, raw.back_of
        tok_off, tok_times, steps, step_off = raw.token_offsets, raw.token_times_s, raw.steps, raw.step_off
        sched, sched_off, itl, totals = raw.schedule, raw.sched_off, raw.itl, raw.totals
        back_side = back >= 0 if self.disaggregated else np.zeros(back.shape, bool)
        if i is not None and self.role(i) == "decode":
            back_side = np.ones(back.shape, bool)
        finish = np.where(back_side, times_d[:, TIME_FINISH], times[:, TIME_FINISH])
        release = np.where(back_side, times_d[:, TIME_RELEASE], times[:, TIME_RELEASE])
        two = self.disaggregated and i is None
        preempt = req[:, REQ_PREEMPT] + (req_d[:, REQ_PREEMPT] if two else 0)
        reject = np.maximum(req[:, REQ_REJECT], req_d[:, REQ_REJECT])
        computed = req[:, REQ_COMPUTED] + (req_d[:, REQ_COMPUTED] if two else 0)
        recomputed = req[:, REQ_RECOMPUTED] + (req_d[:, REQ_RECOMPUTED] if two else 0)
        if i is not None and self.role(i) == "decode":
            preempt, computed, recomputed = req_d[:, REQ_PREEMPT], req_d[:, REQ_COMPUTED], req_d[:, REQ_RECOMPUTED]
        cached = req[:, REQ_CACHED] if i is None or self.role(i) != "decode" else np.zeros(len(req), np.int64)
        if i is None:
            engine_steps, engine_sched = steps, sched
            itl_i = itl.sum(axis=0)
            totals_i = totals.sum(axis=0)
            totals_i[TOTAL_BUSY_S] /= self.n_engines  # so gpu_busy_fraction is the fleet's mean
        else:
            engine_steps, engine_sched = steps[step_off[i]:step_off[i + 1]], sched[sched_off[i]:sched_off[i + 1]]
            itl_i, totals_i = itl[i], totals[i]
        off, flat = np.zeros(1, np.int64), np.empty(0)
        if self.recorded_tokens:
            lens = tok_off[rows + 1] - tok_off[rows]
            off = np.concatenate([[0], np.cumsum(lens)])
            idx = np.repeat(tok_off[rows] - off[:-1], lens) + np.arange(off[-1])
            flat = tok_times[idx]
        scheduled = times_d[:, TIME_SCHED] if i is not None and self.role(i) == "decode" else times[:, TIME_SCHED]
        seen = times_d[:, TIME_SEEN] if i is not None and self.role(i) == "decode" else times[:, TIME_SEEN]
        cols = (times[:, TIME_FIRST], finish, scheduled, release, preempt, reject,
                np.zeros(len(req), np.int64), computed, recomputed, cached, times[:, TIME_SENT], seen)
        return KernelOutput(STATUS_OK, *(np.asarray(c)[rows] for c in cols), off, flat, engine_steps, engine_sched,
                            itl_i, totals_i)

    def _view(self, rows, i) -> SimResult:
        whole = len(rows) == len(self.stream)
        stream = self.stream if whole else self.stream._select(rows, self.stream.arrival_s[rows])
        generated = self.generated
        if i is not None and self.role(i) == "prefill":
            generated = np.ones_like(generated)
        return SimResult(stream, "chunked", self.cost, dict(self.knobs), self._kernel_output(rows, i),
                         self.recorded_schedule, generated[rows], self.recorded_tokens)

    @cached_property
    def fleet(self) -> SimResult:
        """The whole fleet as one :class:`SimResult` (steps of every engine one after another; ITL histograms
        summed; ``gpu_busy_fraction`` the mean over engines)."""
        return self._view(np.arange(len(self.stream)), None)

    def replica(self, i: int) -> SimResult:
        """Engine ``i`` as a :class:`SimResult` over the requests it served (a prefill instance: their prompts and
        first tokens; a decode instance: their outputs, with the TTFT of their prefill). Its ``summary()`` has
        DESIGN section 5's keys, its prefix-cache hit rate among them."""
        i = _checks.integer("i", i, 0, self.n_engines - 1)
        rows = self._rows(i)
        if rows.size == 0:
            raise ValueError(f"engine {i} served no request (summaries() lists it with requests = 0)")
        return self._view(rows, i)

    def _rows(self, i: int) -> np.ndarray:
        who = self.decode_engine if self.role(i) == "decode" else self.engine
        return np.flatnonzero(who == i)

    def summary(self, slo=None) -> dict:
        """The fleet's ``vllm bench serve``-style summary (DESIGN section 5), plus ``n_gpus`` and, with ``slo``,
        ``request_goodput``, ``slo_met`` and ``goodput_per_gpu`` (req/s per GPU)."""
        out = self.fleet.summary(slo)
        out["n_gpus"] = self.n_gpus
        if slo is not None:
            out["goodput_per_gpu"] = out["request_goodput"] / self.n_gpus
        return out

    def summaries(self) -> pd.DataFrame:
        """One row per engine: its role, requests and the summary keys of :meth:`replica`'s ``summary()`` (NaN for an
        engine that served no request)."""
        rows = []
        for i in range(self.n_engines):
            n = self._rows(i).size
            rows.append({"engine": i, "role": self.role(i), "requests": n, **(self.replica(i).summary() if n else {})})
        return pd.DataFrame(rows).set_index("engine")

    def goodput(self, ttft_s=None, tpot_s=None, e2el_s=None, itl_s=None) -> float:
        """Requests/s the fleet completed within every given SLO (seconds; ``itl_s``: each request's longest gap)."""
        return self.fleet.goodput(ttft_s=ttft_s, tpot_s=tpot_s, e2el_s=e2el_s, itl_s=itl_s)

    @cached_property
    def transfers(self) -> pd.DataFrame:
        """Disaggregated runs: one row per KV transfer (request, bytes, seconds, when it left with the first
        token, when it landed, the decode instance)."""
        sent = np.flatnonzero(self.decode_engine >= 0) if self.disaggregated else np.empty(0, np.int64)
        times = self.raw.times
        return pd.DataFrame({"request": sent, "kv_bytes": self.kv_bytes[sent], "transfer_s": self.transfer_s[sent],
                             "left_s": times[sent, TIME_FIRST], "landed_s": self.raw.ready_s[sent],
                             "decode_engine": self.decode_engine[sent]}).set_index("request")


def _given(knobs: dict) -> dict:
    given = dict.fromkeys(KNOB_POLICIES)
    for name, value in knobs.items():
        if name not in given or name == "max_concurrency" or "chunked" not in KNOB_POLICIES[name]:
            allowed = sorted(k for k, p in KNOB_POLICIES.items() if "chunked" in p and k != "max_concurrency")
            raise ValueError(f"unknown knob {name!r} for a fleet of chunked engines; allowed: {allowed}")
        given[name] = value
    return given


def _run(requests, cost, n_engines, n_prefill, router, link, knobs, block_size, gpu_memory_utilization,
         num_kv_blocks, record_tokens, record_schedule) -> FleetResult:
    check_inputs(requests, cost)
    _checks.choice("router", router, ROUTERS)
    run = prepare(requests, cost, "chunked", _given(knobs), block_size, gpu_memory_utilization, num_kv_blocks)
    resolved, output, max_model_len = run.knobs, run.output, run.max_model_len
    if router == "prefix_aware" and not resolved["enable_prefix_caching"]:
        raise ValueError("router='prefix_aware' reads the engines' prefix caches: it needs enable_prefix_caching=True")
    record_tokens = _checks.flag("record_tokens", record_tokens, False)
    record_schedule = _checks.flag("record_schedule", record_schedule, False)
    kv_bytes, transfer_s = transfer_times(cost, requests.prompt_tokens, link or "nvlink")
    stream = Stream(requests.arrival_s, requests.prompt_tokens, output, run.prefix_ids, requests.prefix_offsets,
                    requests.prefix_block_tokens)
    knobs = Knobs(POLICY_CHUNKED, cost.coefficients(), 1, 0.0, resolved["max_num_seqs"],
                  resolved["max_num_batched_tokens"], resolved["long_prefill_token_threshold"], run.rules, False,
                  resolved["num_kv_blocks"] - 1, resolved["block_size"], record_schedule, 0, max_model_len,
                  record_tokens)
    raw = fleet_kernel(stream, knobs, n_engines, n_prefill, ROUTERS.index(router), transfer_s)
    if raw.status != STATUS_OK:
        raise RuntimeError(PROGRESS_GUARD)
    generated = np.asarray(output, np.int64)
    assert np.array_equal(raw.req_d[:, REQ_OUTPUT], generated)  # the decode (or only) table holds the outputs
    return FleetResult(requests, cost, resolved, router, n_prefill, n_engines - n_prefill, link, generated,
                       transfer_s, kv_bytes, raw, record_tokens, record_schedule)


def transfer_times(cost, prompt_tokens, link: str = "nvlink") -> tuple[np.ndarray, np.ndarray]:
    """Bytes and seconds to move each prompt's KV cache from a prefill to a decode instance.

    bytes = ``kv_bytes_per_token`` x prompt tokens (the whole model's KV, every layer); seconds = latency + bytes /
    bandwidth, where over ``"nvlink"`` (same node) the bandwidth is ``Hardware.interconnect_bytes_per_s`` and the
    latency ``interconnect_latency_s``, and over ``"network"`` (another node) ``network_bytes_per_s`` and
    ``network_latency_s``; under tensor parallelism each of the ``tp`` GPUs sends its shard over its own link.
    """
    _checks.choice("link", link, LINKS)
    hw = cost.hardware
    bandwidth, latency = ((hw.interconnect_bytes_per_s, hw.interconnect_latency_s) if link == "nvlink"
                          else (hw.network_bytes_per_s, hw.network_latency_s))
    kv_bytes = cost.model.kv_bytes_per_token(cost.dtype) * np.asarray(prompt_tokens, np.float64)
    return kv_bytes, latency + kv_bytes / (bandwidth * cost.tp)


def simulate_fleet(requests, cost, n_replicas: int = 2, *, router: str = "least_outstanding",
                   block_size: int = BLOCK_SIZE, gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                   num_kv_blocks=None, record_tokens: bool = False, record_schedule: bool = False,
                   **knobs) -> FleetResult:
    """``n_replicas`` copies of one vLLM engine behind a router, simulated together.

    Parameters
    ----------
    requests : Requests
    cost : CostModel
        Every replica's (one GPU each at ``tp=1``).
    n_replicas : int
        Engines, 1 to 1024. With one, the run is :func:`batchlab.simulate`'s (policy ``chunked``) bit for bit.
    router : {"round_robin", "least_outstanding", "prefix_aware"}
        Round robin; the replica with the fewest requests sent and not yet released, as it counted them when it
        last planned (the queue depth llm-d's load scorers read); or the replica whose KV pool holds the longest
        run of the request's prefix blocks (llm-d's prefix-cache scorer, here reading the pools exactly), ties to
        the least outstanding.
    block_size, gpu_memory_utilization, num_kv_blocks, **knobs
        As :func:`batchlab.simulate` with policy ``chunked`` (every replica gets the same): ``max_num_seqs``,
        ``max_num_batched_tokens``, ``async_scheduling``, ``enable_prefix_caching``, ... (``max_concurrency``
        excepted: clients here are open loop).
    record_tokens, record_schedule : bool, default False
        Keep every token's time and every iteration, and the schedule rows (``replica(i).schedule``).

    Returns
    -------
    FleetResult
    """
    n = _checks.integer("n_replicas", n_replicas, 1, 1024)
    return _run(requests, cost, n, 0, router, None, knobs, block_size, gpu_memory_utilization, num_kv_blocks,
                record_tokens, record_schedule)


def simulate_disaggregated(requests, cost, n_prefill: int = 1, n_decode: int = 1, *, link: str = "nvlink",
                           router: str = "least_outstanding", block_size: int = BLOCK_SIZE,
                           gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION, num_kv_blocks=None,
                           record_tokens: bool = False, record_schedule: bool = False, **knobs) -> FleetResult:
    """Disaggregated serving: ``n_prefill`` prefill instances and ``n_decode`` decode instances.

    A prefill instance runs vLLM's scheduler on prompts only (chunked, its budget and rules): a request's first
    token ends its work there. Its KV cache then travels to a decode instance (:func:`transfer_times` over
    ``link``), starting with the first token; when it lands, the decode instance with the fewest outstanding
    requests takes it (round robin if ``router`` is): it waits in that instance's queue until a seat
    (``max_num_seqs``) and blocks for prompt + first token are free, then decodes, never recomputing the prompt
    unless it is preempted. ``router`` picks the prefill instance as :func:`simulate_fleet` picks a replica.
    Decode instances do not cache prefixes. Assumed: the transfer starts when the prompt finishes (vLLM's
    connectors pull it when the decode side admits the request, so there it overlaps the wait less), and both
    kinds use the same knobs and GPU. Other parameters as :func:`simulate_fleet`.

    Returns
    -------
    FleetResult
    """
    n_p = _checks.integer("n_prefill", n_prefill, 1, 1024)
    n_d = _checks.integer("n_decode", n_decode, 1, 1024)
    link = _checks.choice("link", link, LINKS)
    return _run(requests, cost, n_p + n_d, n_p, router, link, knobs, block_size, gpu_memory_utilization,
                num_kv_blocks, record_tokens, record_schedule)
