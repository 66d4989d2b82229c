"""The analytic cost of one iteration: a per-operator roofline on one GPU (or a tensor-parallel group), plus the
serving terms a client of vLLM sees.

One iteration holds prefill chunks i (c_i new tokens on top of p_i cached ones) and decode sequences j
(context l_j). With T = sum(c_i) + N_dec new tokens, S rows that sample a token (every decode, and every
prompt whose last chunk ends in the step) and N sequences scheduled:

    t_gemm = max(2 P' T / (eta_c F), P' b_w / (eta_m BW))          body weights stream once per step
    t_lm   = max(2 d V S / (eta_c F16), V d 2 / (eta_m BW))         LM head on sampled rows only (S > 0), BF16
    F_attn = sum_i 2 L d c_i (2 p_i + c_i) + sum_j 4 L d l_j         causal prefill + one decode row
    B_kv   = k (sum_i p_i + sum_j l_j + T)                           read cached KV, write new KV
    t_attn = max(F_attn / (eta_a F), B_kv / (eta_m BW))
    t_elem = T a / (eta_e BW)                                        norms, RoPE, SiLU-and-mul
    t_gpu  = t_gemm + t_lm + t_attn + t_elem + t_comm + t_overhead
    t_cpu  = c_step + c_seq N,   less min(h t_cpu, t_gpu) with async scheduling
    step   = t_gpu + t_cpu

P' is the parameters every token multiplies: all but the embedding table (a row lookup, no GEMM, only the
looked-up rows read) and the LM head (``ModelSpec.body_params``). The LM head and the embedding stay BF16 under
FP8 quantisation, as in vLLM. ``a`` is the activation traffic of the elementwise kernels vLLM runs around the
GEMMs, per token, as they read and write it at the least: two fused residual-add RMSNorms (4 d elements each),
RoPE on the queries and keys in place (2 (H + H_kv) d_h / t) and SiLU-and-mul (3 d_ff / t), in BF16, over L
layers. DESIGN section 3's formula leaves this term out; the measured H100 timings show it is 10 to 15 % of a
prefill (``batchlab.calibrate``), so the calibrated model keeps it and :meth:`CostModel.ideal`, DESIGN's pure
roofline, does not.

The serving terms (DESIGN section 3): the API server takes requests one at a time, ``frontend_s_per_token``
per prompt token (tokenising), and ``request_latency_s`` more passes before the engine sees a request (HTTP,
the hop to the engine, and streaming back: it lands once on TTFT and once on E2E);
``cpu_step_s`` and ``cpu_seq_s`` are the engine's CPU work per step and per scheduled sequence (input
preparation, sampling, output processing), of which async scheduling overlaps the fraction
``cpu_hidden_fraction`` with the GPU's step (never more than the GPU step). All are fitted once, globally, on
the end-to-end runs (``data/calibration.csv``) and are zero in :meth:`CostModel.ideal`.

Under tensor parallelism t the work and bytes per GPU are divided by t and every layer adds two
all-reduces of the activations (ring algorithm). The formula itself lives in ``_kernels.step_cost`` so the
jitted scheduler loop and this module evaluate the very same code.
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple
from collections.abc import Sequence

import numpy as np

from ._data import read_calibration
from .hardware import DTYPES, Hardware
from .models import BYTES_PER_ELEMENT, ModelSpec
from . import _kernels as k
from . import _checks
from ._kernels import step_cost
from . import vllm
from .vllm import VLLM_SEQS, VLLM_TOKENS

ACTIVATION_BYTES = 2  # activations travel between GPUs in BF16

# Fitted on measured H100 timings by ``python -m batchlab.calibrate`` (data/calibration.csv, data/README.md).
# Only if that file is absent do DESIGN section 3's starting values apply: they are guesses, not measurements.
_STARTING = {"eta_compute": 0.6, "eta_memory": 0.8, "eta_attn": 0.5, "eta_elementwise": None, "overhead_s": 1e-3,
             "allreduce_latency_s": 0.0, "eta_compute_fp8": 0.6, "eta_memory_fp8": 0.8, "request_latency_s": 0.0,
             "cpu_step_s": 0.0, "cpu_seq_s": 0.0, "cpu_hidden_fraction": 0.0, "frontend_s_per_token": 0.0}
SERVING_FIELDS = ("request_latency_s", "frontend_s_per_token", "cpu_step_s", "cpu_seq_s", "cpu_hidden_fraction")


def _shipped_efficiency() -> dict:
    fitted = read_calibration()
    return {k: fitted.get(k, v) for k, v in _STARTING.items()}


DEFAULT_EFFICIENCY = _shipped_efficiency()


class StepBreakdown(NamedTuple):
    """Where the time of one iteration goes."""

    total_s: float  # seconds, the whole step
    gemm_s: float  # seconds, weight GEMMs (max of compute and weight streaming)
    attn_s: float  # seconds, attention (max of compute and KV traffic)
    comm_s: float  # seconds, tensor-parallel all-reduces
    elementwise_s: float  # seconds, norms, RoPE and SiLU-and-mul (activation traffic)
    overhead_s: float  # seconds, fixed per-step GPU cost (kernel floors)
    flops: float  # FLOP per GPU in the step
    hbm_bytes: float  # bytes read or written from HBM per GPU in the step
    bound: str  # "compute" if the math takes longer than the memory traffic, else "memory"
    lm_head_s: float = 0.0  # seconds, the LM head on the sampled rows
    cpu_s: float = 0.0  # seconds, the engine's CPU work the step pays for (after async overlap)


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Time of one scheduler iteration for a model on a GPU.

    Parameters
    ----------
    hardware, model : Hardware, ModelSpec
        From :func:`batchlab.get_hardware` and :func:`batchlab.get_model`.
    dtype : {"bf16", "fp8"}
        Storage and GEMM type of the weights.
    tp : int
        Tensor-parallel degree (1 to 8).
    kv_dtype : {"bf16", "fp8"}
        Storage type of the KV cache (vLLM's ``kv_cache_dtype``; its "auto" keeps BF16).
    eta_compute, eta_memory, eta_attn : float, optional
        Achieved fraction of peak FLOP/s in GEMMs, of HBM bandwidth, and of peak FLOP/s in attention.
        Default: the fitted values of ``data/calibration.csv`` (FP8 GEMMs have their own eta_compute and
        eta_memory there, used when ``dtype="fp8"``).
    eta_elementwise : float or None
        Achieved fraction of HBM bandwidth in the elementwise kernels (norms, RoPE, SiLU-and-mul) on their
        least activation traffic. ``None`` leaves the term out, as DESIGN section 3 and :meth:`ideal` do.
        Default: the fitted value of ``data/calibration.csv``.
    overhead_s : float
        Seconds added to every iteration (scheduling, kernel launches, sampling).
    allreduce_latency_s : float
        Seconds of fixed latency per all-reduce when ``tp > 1``.
    request_latency_s, cpu_step_s, cpu_seq_s : float
        Serving terms, seconds: client to engine per request; engine CPU work per step and per scheduled
        sequence. Default: fitted on the end-to-end runs (``data/calibration.csv``).
    frontend_s_per_token : float
        Serving term, seconds per prompt token the API server spends on a request (tokenising), one request at
        a time, so a burst of requests reaches the engine spread out.
    cpu_hidden_fraction : float
        Share of the step's CPU work async scheduling overlaps with the GPU, in [0, 1].
    """

    hardware: Hardware
    model: ModelSpec
    dtype: str = "bf16"
    tp: int = 1
    kv_dtype: str = "bf16"
    eta_compute: float = None
    eta_memory: float = None
    eta_attn: float = DEFAULT_EFFICIENCY["eta_attn"]
    eta_elementwise: float | None = DEFAULT_EFFICIENCY["eta_elementwise"]
    overhead_s: float = DEFAULT_EFFICIENCY["overhead_s"]
    allreduce_latency_s: float = DEFAULT_EFFICIENCY["allreduce_latency_s"]
    request_latency_s: float = DEFAULT_EFFICIENCY["request_latency_s"]
    frontend_s_per_token: float = DEFAULT_EFFICIENCY["frontend_s_per_token"]
    cpu_step_s: float = DEFAULT_EFFICIENCY["cpu_step_s"]
    cpu_seq_s: float = DEFAULT_EFFICIENCY["cpu_seq_s"]
    cpu_hidden_fraction: float = DEFAULT_EFFICIENCY["cpu_hidden_fraction"]

    def __post_init__(self):
        suffix = "_fp8" if self.dtype == "fp8" else ""
        for field in ("eta_compute", "eta_memory"):
            if getattr(self, field) is None:
                object.__setattr__(self, field, DEFAULT_EFFICIENCY.get(field + suffix, DEFAULT_EFFICIENCY[field]))
        if not isinstance(self.hardware, Hardware):
            raise ValueError("hardware must be a Hardware (see batchlab.get_hardware)")
        if not isinstance(self.model, ModelSpec):
            raise ValueError("model must be a ModelSpec (see batchlab.get_model)")
        self.hardware.check()  # again: tuple.__new__ and pickles of old versions skip the constructor's check
        self.model.check()
        for field in ("dtype", "kv_dtype"):
            _checks.choice(field, getattr(self, field), DTYPES)
        object.__setattr__(self, "tp", _checks.integer("tp", self.tp, 1, 8))
        # Fields are stored as Python floats, so np.float32 efficiencies give the same coefficients as floats.
        for field in ("eta_compute", "eta_memory", "eta_attn"):
            object.__setattr__(self, field, _checks.real(field, getattr(self, field), 0, 1, low_open=True,
                                                           allowed="in (0, 1]"))
        if self.eta_elementwise is not None:
            object.__setattr__(self, "eta_elementwise", _checks.real(
                "eta_elementwise", self.eta_elementwise, 0, 1, low_open=True, allowed="None or in (0, 1]"))
        object.__setattr__(self, "cpu_hidden_fraction", _checks.real(
            "cpu_hidden_fraction", self.cpu_hidden_fraction, 0, 1, allowed="in [0, 1]"))
        for field in ("overhead_s", "allreduce_latency_s", "request_latency_s", "frontend_s_per_token", "cpu_step_s",
                      "cpu_seq_s"):
            object.__setattr__(self, field, _checks.real(field, getattr(self, field), 0,
                                                           allowed="a finite number of seconds >= 0"))

    # -- derived quantities -------------------------------------------------------------------
    def ideal(self) -> CostModel:
        """DESIGN's pure roofline: GEMMs and attention at peak, no elementwise term, overhead, latency or serving
        terms."""
        return dataclasses.replace(
            self, eta_compute=1.0, eta_memory=1.0, eta_attn=1.0, eta_elementwise=None, overhead_s=0.0,
            allreduce_latency_s=0.0, request_latency_s=0.0, frontend_s_per_token=0.0, cpu_step_s=0.0, cpu_seq_s=0.0,
            cpu_hidden_fraction=0.0,
        )

    def replace(self, **changes) -> CostModel:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def peak_flops(self) -> float:
        """FLOP/s per GPU for this weight dtype."""
        return self.hardware.peak_flops(self.dtype)

    @property
    def weight_bytes(self) -> float:
        """Weight bytes held by one GPU (the embedding table and the LM head in BF16)."""
        return self.model.weight_bytes(self.dtype) / self.tp

    @property
    def lm_head_bytes(self) -> float:
        """Bytes of the LM head on one GPU (BF16, split over the TP group): streamed in a step that samples."""
        return self.model.embedding_params * BYTES_PER_ELEMENT["bf16"] / self.tp

    @property
    def streamed_weight_bytes(self) -> float:
        """Weight bytes one decode step streams from HBM on one GPU: the body and the LM head, not the embedding
        table (a row lookup). Llama-3-8B in BF16: (8.03e9 - 0.525e9) x 2 B = 15.0 GB."""
        return self.model.body_params * BYTES_PER_ELEMENT[self.dtype] / self.tp + self.lm_head_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes per token held by one GPU (KV heads are split over the TP group, replicated below one per GPU)."""
        m = self.model
        heads_per_gpu = max(m.kv_heads / self.tp, 1.0)
        return 2 * m.layers * heads_per_gpu * m.head_dim * BYTES_PER_ELEMENT[self.kv_dtype]

    @property
    def elementwise_bytes_per_token(self) -> float:
        """Least activation bytes the norms, RoPE and SiLU-and-mul read and write per token, one GPU.

        Per layer: two fused residual-add RMSNorms (read x and the residual, write both: 4 d), RoPE on the
        queries and keys in place (2 (H + H_kv) d_h / t) and SiLU-and-mul (read 2 d_ff / t, write d_ff / t),
        BF16 activations. The norms see the whole hidden state on every GPU of a TP group.
        """
        m, tp = self.model, self.tp
        elements = 8 * m.d_model + 2 * (m.heads + m.kv_heads) * m.head_dim / tp + 3 * m.d_ff / tp
        return m.layers * elements * ACTIVATION_BYTES

    def coefficients(self) -> np.ndarray:
        """The float64 vector ``_kernels.step_cost`` reads: every constant of the formula, per GPU.

        Slots are named by the ``COEF_*`` constants of :mod:`batchlab._kernels`.
        """
        m, hw, tp = self.model, self.hardware, self.tp
        coef = np.zeros(k.N_COEF)
        coef[k.COEF_GEMM_FLOPS_PER_TOKEN] = 2.0 * m.body_params / tp
        coef[k.COEF_WEIGHT_BYTES] = m.body_params * BYTES_PER_ELEMENT[self.dtype] / tp
        coef[k.COEF_LM_HEAD_FLOPS_PER_ROW] = 2.0 * m.embedding_params / tp
        coef[k.COEF_LM_HEAD_BYTES] = self.lm_head_bytes
        coef[k.COEF_LM_HEAD_FLOP_RATE] = self.eta_compute * hw.peak_flops("bf16")  # a BF16 GEMM, same efficiency
        coef[k.COEF_REQUEST_LATENCY_S] = self.request_latency_s
        coef[k.COEF_FRONTEND_S_PER_TOKEN] = self.frontend_s_per_token
        coef[k.COEF_CPU_STEP_S] = self.cpu_step_s
        coef[k.COEF_CPU_SEQ_S] = self.cpu_seq_s
        coef[k.COEF_CPU_HIDDEN] = self.cpu_hidden_fraction
        coef[k.COEF_ATTN_FLOPS_PER_WORK] = 2.0 * m.layers * m.attn_dim / tp
        coef[k.COEF_KV_BYTES_PER_TOKEN] = self.kv_bytes_per_token
        coef[k.COEF_PEAK_FLOPS] = self.peak_flops
        coef[k.COEF_HBM_BYTES_PER_S] = hw.hbm_bytes_per_s
        coef[k.COEF_ETA_COMPUTE] = self.eta_compute
        coef[k.COEF_ETA_MEMORY] = self.eta_memory
        coef[k.COEF_ETA_ATTN] = self.eta_attn
        coef[k.COEF_OVERHEAD_S] = self.overhead_s
        elementwise = self.eta_elementwise is not None
        coef[k.COEF_ELEMENTWISE_BYTES_PER_TOKEN] = self.elementwise_bytes_per_token if elementwise else 0.0
        coef[k.COEF_ETA_ELEMENTWISE] = self.eta_elementwise if elementwise else 1.0
        if tp > 1:
            # Two ring all-reduces per layer, each moving 2 (t-1)/t of the activations per GPU.
            per_token = 2 * m.layers * 2 * (tp - 1) / tp * m.d_model * ACTIVATION_BYTES
            coef[k.COEF_COMM_S_PER_TOKEN] = per_token / hw.interconnect_bytes_per_s
            coef[k.COEF_COMM_S_PER_STEP] = 2 * m.layers * self.allreduce_latency_s
        return coef

    def named_coefficients(self) -> dict[str, float]:
        """:meth:`coefficients` by name: ``{"gemm_flops_per_token": ..., "weight_bytes": ..., ...}``, the kernels'
        slot names (``_kernels.COEF_NAMES``), for code outside the engine layer."""
        return dict(zip(k.COEF_NAMES, map(float, self.coefficients())))

    def vllm_reserved_bytes(self, max_num_batched_tokens: int = VLLM_TOKENS["large", "serve"],
                            max_num_seqs: int = VLLM_SEQS["large"]) -> float:
        """Bytes per GPU vLLM keeps out of the KV cache besides the weights: :func:`batchlab.vllm.reserved_bytes`
        (vLLM ``determine_available_memory``), which :meth:`kv_pool_blocks` takes."""
        return vllm.reserved_bytes(self, max_num_batched_tokens, max_num_seqs)

    def kv_pool_blocks(self, gpu_memory_utilization: float = vllm.GPU_MEMORY_UTILIZATION,
                       block_size: int = vllm.BLOCK_SIZE, max_num_batched_tokens: int = VLLM_TOKENS["large", "serve"],
                       max_num_seqs: int = VLLM_SEQS["large"]) -> int:
        """KV blocks per GPU as vLLM 0.33 sizes its pool, its null block one of them (:func:`.vllm.kv_pool_blocks`).

        floor((util * HBM - weights - :meth:`vllm_reserved_bytes`) / (block_size * k)): vLLM profiles a forward
        pass of ``max_num_batched_tokens`` tokens and the CUDA graphs, and gives the KV cache what is left of
        ``gpu_memory_utilization`` (default 0.92, vLLM 0.33's) of the memory. The defaults are an H100's.
        """
        return vllm.kv_pool_blocks(self, gpu_memory_utilization, block_size, max_num_batched_tokens, max_num_seqs)

    # -- step times ---------------------------------------------------------------------------
    def step_breakdown(
        self,
        prefill_chunks: Sequence[tuple[int, int]] = (),
        decode_contexts: Sequence[int] = (),
        sampled_chunks: int | None = None,
        asynchronous: bool = True,
    ) -> StepBreakdown:
        """Time of one iteration and where it goes.

        Parameters
        ----------
        prefill_chunks : sequence of (new_tokens, cached_tokens)
            Prompt chunks computed in the step; ``cached_tokens`` of the same prompt are already in KV.
        decode_contexts : sequence of int
            Context length (cached tokens) of each sequence emitting one token.
        sampled_chunks : int, optional
            How many of the prompt chunks end their prompt (sample a first token, so run the LM head).
            Default: all of them.
        asynchronous : bool
            Async scheduling (vLLM 0.33's default, as in :func:`batchlab.simulate`) overlaps part of the CPU
            work with the GPU; ``False`` gives the synchronous engine.
        """
        chunks = np.asarray(prefill_chunks, dtype=np.float64).reshape(-1, 2)
        ctx = np.asarray(decode_contexts, dtype=np.float64).reshape(-1)
        if (chunks < 0).any() or (ctx < 0).any() or (chunks[:, 0] < 1).any():
            raise ValueError("prefill_chunks need new_tokens >= 1 and cached_tokens >= 0; decode_contexts >= 0")
        c, p = chunks[:, 0], chunks[:, 1]
        new_tokens = c.sum() + ctx.size
        if new_tokens == 0:
            raise ValueError("a step needs at least one prefill chunk or one decode sequence")
        attn_work = (c * (2 * p + c)).sum() + 2 * ctx.sum()
        cached = p.sum() + ctx.sum()
        n_chunks = len(chunks)
        sampled = n_chunks if sampled_chunks is None else sampled_chunks
        if isinstance(sampled, bool) or not isinstance(sampled, (int, np.integer)) or not 0 <= sampled <= n_chunks:
            raise ValueError(f"sampled_chunks must be an integer from 0 to {n_chunks}, got {sampled_chunks!r}")
        out = step_cost(self.coefficients(), new_tokens, attn_work, cached, sampled + ctx.size, n_chunks + ctx.size,
                        _checks.flag("asynchronous", asynchronous))
        total, gemm, attn, comm, elementwise, lm_head, cpu, flops, nbytes, compute_bound = out
        return StepBreakdown(total, gemm, attn, comm, elementwise, self.overhead_s, flops, nbytes,
                             "compute" if compute_bound else "memory", lm_head, cpu)

    def step_time(self, prefill_chunks: Sequence[tuple[int, int]] = (), decode_contexts: Sequence[int] = (),
                  sampled_chunks: int | None = None, asynchronous: bool = True) -> float:
        """Seconds for one iteration of prefill chunks ``(new, cached)`` and decodes at ``decode_contexts``
        (the arguments of :meth:`step_breakdown`)."""
        return self.step_breakdown(prefill_chunks, decode_contexts, sampled_chunks, asynchronous).total_s

    def decode_step_time(self, batch, context, asynchronous: bool = True):
        """Seconds of one decode iteration of ``batch`` sequences each holding ``context`` cached tokens.

        Broadcasts over arrays of ``batch`` and ``context`` (for roofline charts).
        """
        b, ctx = np.broadcast_arrays(np.asarray(batch, dtype=np.float64), np.asarray(context, dtype=np.float64))
        if (b < 1).any() or (ctx < 0).any():
            raise ValueError("batch must be >= 1 and context >= 0")
        coef = self.coefficients()
        asynchronous = _checks.flag("asynchronous", asynchronous)
        out = np.array([step_cost(coef, bi, 2 * bi * ci, bi * ci, bi, bi, asynchronous)[0]
                        for bi, ci in zip(b.ravel(), ctx.ravel())])
        return float(out[0]) if b.ndim == 0 else out.reshape(b.shape)

    def prefill_time(self, tokens: int) -> float:
        """Seconds to prefill one prompt of ``tokens`` tokens alone, unchunked."""
        tokens = _checks.integer("tokens", tokens, 1, _checks.MAX_TOKENS)
        return self.step_time(prefill_chunks=[(tokens, 0)])

    def ridge(self) -> float:
        """Batch (sequences) where a decode step's GEMM math equals its weight streaming.

        eta_c F b_w / (2 eta_m BW): 295.3 for BF16 weights on an H100 SXM at 100 % of peak, for any model size.
        Used in chapters 04, 12 and 14.
        """
        b_w = BYTES_PER_ELEMENT[self.dtype]
        return self.eta_compute * self.peak_flops * b_w / (2 * self.eta_memory * self.hardware.hbm_bytes_per_s)

    def kv_knee(self, context: float) -> float:
        """B_kv = P b_w / (context k): the batch whose KV reads equal the streamed weight bytes (sequences).

        ``context`` is cached tokens per sequence (>= 0); ``inf`` at 0, where the KV term never binds.
        Used in chapter 04.
        """
        if context < 0:
            raise ValueError(f"context must be >= 0, got {context!r}")
        return math.inf if context == 0 else self.streamed_weight_bytes / (context * self.kv_bytes_per_token)

    def knee(self, context: float = 0.0) -> float:
        """Batch size where a decode step leaves its floor: min(:meth:`ridge`, :meth:`kv_knee`).

        The ridge is where GEMM math equals weight streaming; B_kv is where the KV bytes read equal the weight
        bytes, doubling the memory floor. With no context the KV term never binds.
        """
        return min(self.ridge(), self.kv_knee(context))

    def batch_for_step_time(self, step_s: float, context: int, max_batch: int = 4096) -> int:
        """The decode batch whose step time is closest to ``step_s`` seconds, every sequence at ``context`` tokens.

        Decode step time rises monotonically with the batch, so this is where the cost model puts a given
        inter-token cadence. Raises ``ValueError`` if even one sequence, or ``max_batch``, misses it by more
        than one step's increment (the cadence is then out of this model's reach on this GPU). Used in
        chapters 12 and 14.
        """
        batch = np.arange(1, max_batch + 1)
        step = self.decode_step_time(batch, context)
        if step[0] > step_s or step[-1] < step_s:
            raise ValueError(f"a {step_s * 1e3:g} ms decode step is outside 1..{max_batch} sequences at {context} "
                             f"tokens: the step takes {step[0] * 1e3:.1f} to {step[-1] * 1e3:.1f} ms")
        return int(batch[np.argmin(np.abs(step - step_s))])
