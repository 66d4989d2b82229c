"""The cost model and the ``simulate`` knobs of a calibration run: what was recorded, else vLLM's defaults.

What neither source records is assumed as ``../shared/data/README.md`` says the held-out check assumes: vLLM V1
with chunked prefill and automatic prefix caching on, 16-token blocks, ``gpu_memory_utilization`` 0.9, a BF16
KV cache (``kv_cache_dtype`` auto, even under FP8 weights), and for AIConfigurator's rows ``vllm serve``'s
defaults for the GPU. InferenceX rows carry their recorded serve flags (``max_num_seqs`` = concurrency,
``max_num_batched_tokens`` 8192, in the table) and run with prefix caching off (``--no-enable-prefix-caching``).
"""
from __future__ import annotations

import pandas as pd

from ..cost import CostModel
from ..hardware import get_hardware
from ..models import get_model
from ..vllm import vllm_defaults
from .raw import CLOSED_LOOP, INFERENCEX
from .runs import get_run
from .streams import BLOCK_TOKENS


def cost_for(run, **overrides) -> CostModel:
    """The CostModel of ``run``: its GPU, model, weight dtype and TP degree, a BF16 KV cache.

    Parameters
    ----------
    run : str or pandas.Series
        A run id of :func:`batchlab.validate.calibration_runs` or one of its rows.
    **overrides
        Passed to :class:`batchlab.CostModel` (efficiencies, ``overhead_s``, ``kv_dtype``, ...).
    """
    run = get_run(run)
    fields = {"dtype": run["dtype"], "tp": int(run["tp"]), "kv_dtype": "bf16", **overrides}
    return CostModel(get_hardware(run["hardware"]), get_model(run["model"]), **fields)


def _given(run, column: str, default: int) -> int:
    """The run's recorded value of ``column``, else ``default`` (not recorded: empty)."""
    value = run.get(column)
    return default if value is None or pd.isna(value) else int(value)


def knobs_for(run, **overrides) -> dict:
    """The keyword arguments of :func:`batchlab.simulate` that replay ``run`` (``cost`` and requests apart).

    Policy ``chunked`` (vLLM V1's scheduler, prefix caching and async scheduling on by default), the run's
    ``max_num_seqs``, ``max_num_batched_tokens`` and ``max_model_len`` where recorded, else ``vllm serve``'s
    defaults for the GPU (:func:`batchlab.vllm_defaults`) and the model's context length; ``num_kv_blocks`` is
    the published pool where there is one, else ``CostModel.kv_pool_blocks`` of :func:`cost_for` at the run's
    ``gpu_memory_utilization`` (0.9). A closed-loop run adds ``max_concurrency`` = its concurrency; an
    InferenceX row ``enable_prefix_caching=False``, as it was served.

    Parameters
    ----------
    run : str or pandas.Series
        A run id of :func:`batchlab.validate.calibration_runs` or one of its rows.
    **overrides
        Knobs to set or replace, e.g. ``enable_prefix_caching=False`` or ``async_scheduling=False`` for an
        ablation.
    """
    run = get_run(run)
    return knobs_with(run, cost_for(run), **overrides)


def knobs_with(run, cost: CostModel, **overrides) -> dict:
    """:func:`knobs_for` with the KV pool (where not published) sized for ``cost`` (its dtypes and TP degree)."""
    run = get_run(run)
    defaults = vllm_defaults(cost.hardware)
    seqs = _given(run, "max_num_seqs", defaults["max_num_seqs"])
    tokens = _given(run, "max_num_batched_tokens", defaults["max_num_batched_tokens"])
    blocks = _given(run, "num_gpu_blocks", 0) or cost.kv_pool_blocks(
        float(run["gpu_memory_utilization"]), BLOCK_TOKENS, tokens, seqs)
    knobs = {"policy": "chunked", "max_num_seqs": seqs, "max_num_batched_tokens": tokens,
             "max_model_len": _given(run, "max_model_len", cost.model.max_position_embeddings),
             "block_size": BLOCK_TOKENS, "num_kv_blocks": blocks}
    if run["set"] == CLOSED_LOOP:
        knobs["max_concurrency"] = int(run["concurrency"])
        if run.get("client", "") == INFERENCEX:
            knobs["enable_prefix_caching"] = False
    knobs.update(overrides)
    return knobs
