"""Calibrate the cost model against measured H100 timings: efficiencies, kernel floors, overheads.

The measurements come from three public repositories (``data/README.md`` names their commits and licences).
Every function reads them from the compact tidy table committed in ``data/measured_timings.csv.gz`` when its
``root`` is None (the default), so a fresh clone needs nothing beside it; given a folder (``root``, e.g.
:func:`measured_dir`, which reads ``$BATCHLAB_MEASURED_DIR`` or ``../shared/data/measured``) they read the raw
public files there instead, which give the very same numbers. ``scripts/make_measured_timings.py`` writes the
table from the raw files. Run ``python -m batchlab.calibrate`` (``--raw`` for the raw files) to refit and
rewrite ``data/calibration.csv`` (the fitted values, which :class:`batchlab.CostModel` then uses as its
defaults) and ``data/calibration_errors.csv`` (per set and split, the median and worst relative error before
and after calibration).

Modules: :mod:`~batchlab.calibrate.readers` (raw files and the compact table, one tidy table),
:mod:`~batchlab.calibrate.cases` (the table as cases with their work), :mod:`~batchlab.calibrate.predict`
(predictions, the public loaders, errors), :mod:`~batchlab.calibrate.fit` (the fit),
:mod:`~batchlab.calibrate.shipped` (the calibration files, written and read back).

The model of one operator
-------------------------
Every per-operator prediction is ``_kernels.step_cost``'s term for that operator alone (its FLOPs and bytes
come from :meth:`CostModel.coefficients` and :attr:`CostModel.elementwise_bytes_per_token`, so shapes are
counted exactly as the simulator counts them) plus a fixed *kernel floor* for every kernel launched::

    t_op = n_kernels * floor + max(flops / (eta * F), bytes / (eta_memory * BW))     GEMMs, attention
    t_op = n_kernels * floor + activation_bytes / (eta_elementwise * BW)             norms, RoPE, SiLU, add

The floor is what a kernel costs however little it does (ramp-up, tail, and in some harnesses the launch). It
matters for small operators, so it is fitted, once per measuring harness because each harness times kernels
its own way. The CostModel has no per-kernel term, only ``overhead_s`` per step, and the floors map onto it:
``overhead_s = L * (4 * floor_gemm + floor_decode_attn + 5 * floor_elementwise)`` with the L = 32 layers of the
reference model Llama-3-8B (4 GEMM kernels and one attention kernel per layer, as vLLM fuses them, and the
five elementwise kernels of vidur's profile).

DESIGN section 3's formula has no elementwise term; vidur's profile shows the norms, RoPE, SiLU-and-mul and
residual add are 10 to 15 % of a layer's time at a few thousand tokens, so the calibrated CostModel has one
(``eta_elementwise``), and ``CostModel.ideal()`` keeps DESIGN's formula without it.

The fit
-------
:func:`scipy.optimize.least_squares` on log(predicted / measured), so relative error, symmetric in over- and
under-prediction, with a soft-L1 (robust) loss of scale 5 % and every training set weighted equally. Each
efficiency is fitted where it binds: the max() form has a sharp corner where real GEMMs bend smoothly, so GEMM
cases near the ridge (between 64 and 1024 tokens for BF16, 64 and 4096 for FP8) stay out of the fit and are
reported as split ``ridge``. Training splits:

- ``eta_compute``, ``eta_memory`` and the GEMM floor: vidur's per-layer GEMMs of Llama-2-7B and Llama-2-70B at
  TP 1 and 2;
- ``eta_memory`` (one bandwidth efficiency for weights and KV, as in the CostModel) and the decode floor:
  decode-attention kernels at TP 1;
- ``eta_attn`` and the prefill floor: prefill-attention kernels of geometries 32-8-128, 64-8-128, 40-40-128;
- ``eta_elementwise`` and the elementwise floor: vidur's per-layer norms, RoPE, SiLU-and-mul and add of the
  same two models at TP 1 and 2;
- ``allreduce_latency_s``: vidur's NCCL all-reduce on a DGX H100 with 2 and 8 GPUs, the bandwidth term held at
  the hardware preset's interconnect bandwidth, as the CostModel computes it;
- kernels that are not vLLM's BF16 ones get their own efficiencies (:class:`OwnKernels`): FP8 GEMMs
  (``eta_compute_fp8``, ``eta_memory_fp8`` and a floor, on the FP8 GEMM benchmark with n = 6144; the CostModel's
  defaults when ``dtype="fp8"``) and eager PyTorch's attention and elementwise kernels (on LLMServingSim's
  profile up to 1,536 prompt tokens; not CostModel defaults, since vLLM runs neither). Each of those sets is
  also reported under the BF16 defaults as a diagnostic set (:data:`DIAGNOSTIC_SETS`).

Held out, only evaluated: vidur at TP 4 and 8 and its other models (CodeLlama-34B, InternLM-20B, Qwen-72B, and
phi-2 for GEMMs; shapes read from the files' own columns), the FP8 GEMMs with n = 11008, decode attention at TP 2
and 4, the other three prefill geometries, 4-GPU all-reduce, and of LLMServingSim's Llama-3.1-8B profile each
GEMM, the eager kernels on prompts of more than 1,536 tokens, and the whole forward pass against
:meth:`CostModel.prefill_time` (the CostModel's defaults, vLLM's kernels, against eager PyTorch's).
"""
from .._data import DATA_DIR
from .cases import EAGER_FIT_MAX_TOKENS, LLMSERVINGSIM_SMALL_OPS
from .fit import ERROR_COLUMNS, Calibration, fit, fit_eager
from .predict import (DIAGNOSTIC_SETS, ETA_FIELDS, NO_FLOORS, START, KernelFloors, OwnKernels, cost_etas, evaluate,
                      load_all, load_allreduce, load_decode_attention, load_gemm_kernels, load_llmservingsim,
                      load_prefill_attention, load_vidur_elementwise, load_vidur_gemm, relative_errors)
from .readers import (COLUMNS, HARDWARE, MEASURED_ENV, REFERENCE_MODEL, TIMINGS_FILE, llmservingsim_forward_s,
                      llmservingsim_layers, measured_dir, measured_timings, read_raw, write_timings)
from .serving import SERVING_TERMS, ServingFit, fit_serving
from .readback import shipped_floors, shipped_kernels_only, shipped_own_kernels
from .shipped import FIT_NOTES, main, parameter_table, serving_table, shipped_serving_terms

__all__ = [
    "DATA_DIR", "MEASURED_ENV", "HARDWARE", "REFERENCE_MODEL", "TIMINGS_FILE", "COLUMNS", "START", "ETA_FIELDS",
    "EAGER_FIT_MAX_TOKENS", "LLMSERVINGSIM_SMALL_OPS", "DIAGNOSTIC_SETS", "ERROR_COLUMNS", "FIT_NOTES",
    "KernelFloors", "NO_FLOORS", "OwnKernels", "Calibration",
    "measured_dir", "measured_timings", "read_raw", "write_timings", "llmservingsim_layers", "llmservingsim_forward_s",
    "load_vidur_gemm", "load_vidur_elementwise", "load_gemm_kernels", "load_decode_attention",
    "load_prefill_attention", "load_llmservingsim", "load_allreduce", "load_all", "relative_errors", "evaluate",
    "cost_etas", "fit", "fit_eager", "parameter_table", "shipped_floors", "shipped_own_kernels", "main",
    "SERVING_TERMS", "ServingFit", "fit_serving", "serving_table", "shipped_serving_terms", "shipped_kernels_only",
]
