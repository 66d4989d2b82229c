"""batchlab: how LLM servers batch requests, on an analytic GPU cost model and a jitted scheduler loop."""
from .cost import CostModel, StepBreakdown
from .hardware import Hardware, get_hardware, hardware_names
from .models import ModelSpec, get_model, model_names
from .result import SimResult
from .sim import POLICIES, simulate
from .vllm import VLLM_RELEASED, VLLM_VERSION, vllm_defaults
from .sweep import expand_grid, is_dominated, pareto_front, sweep
from .workload import (Requests, arrivals_gamma, arrivals_poisson, fixed, lengths_empirical, lengths_lognormal,
                       lengths_uniform, multi_turn, shared_prefix, synthetic)
from .traces import from_frame, read_trace
from .workload import preset, preset_names, trace_stats
from .datasets import replay
from .fleet import FleetResult, simulate_disaggregated, simulate_fleet, transfer_times
from .tune import SLO, max_rate, parse_goodput, tune

__all__ = [
    "VLLM_VERSION", "VLLM_RELEASED", "CostModel", "StepBreakdown", "Hardware", "get_hardware", "hardware_names",
    "ModelSpec", "get_model", "model_names", "SimResult", "POLICIES", "simulate", "vllm_defaults", "Requests",
    "arrivals_gamma", "arrivals_poisson", "fixed", "from_frame", "lengths_empirical", "lengths_lognormal",
    "lengths_uniform", "read_trace", "synthetic", "shared_prefix", "multi_turn", "preset", "preset_names",
    "trace_stats", "replay", "expand_grid", "is_dominated", "pareto_front", "sweep", "SLO", "parse_goodput",
    "max_rate", "tune", "FleetResult", "simulate_fleet", "simulate_disaggregated", "transfer_times",
]
__version__ = "0.1.0"

_LAZY = ("validate", "calibrate")  # loaded when first used: they bring scipy.optimize (0.3 s) to every import


def __getattr__(name):
    """``bl.validate`` and ``bl.calibrate`` (end-to-end runs and their replay; the cost model's fit), imported on
    first use, so ``import batchlab``, and with it every sweep worker, does not load SciPy's optimisers."""
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'batchlab' has no attribute {name!r}")
