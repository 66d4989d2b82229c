"""GPU presets: peak dense throughput, HBM bandwidth and capacity, interconnect."""
from __future__ import annotations

from functools import cache
from typing import NamedTuple

from ._data import read_presets
from ._checks import CheckedTuple, flag, real

DTYPES = ("bf16", "fp8")
GiB = 1024**3  # bytes


class _HardwareFields(NamedTuple):

    name: str
    flops_bf16: float  # FLOP/s, dense BF16 tensor-core peak
    flops_fp8: float  # FLOP/s, dense FP8 peak (equal to BF16 where the GPU has no FP8 units)
    hbm_bytes_per_s: float  # bytes/s, HBM bandwidth
    hbm_bytes: float  # bytes, HBM capacity as the driver reports it
    interconnect_bytes_per_s: float  # bytes/s, NVLink bandwidth per direction per GPU
    has_fp8: bool  # whether FP8 GEMMs run at twice the BF16 rate
    # KV-cache transfer between engines (disaggregated prefill and decode, batchlab.disagg): time = latency +
    # bytes / bandwidth. Within a node over NVLink (interconnect_bytes_per_s); between nodes over one network link.
    interconnect_latency_s: float = 5e-6  # s, NVLink transfer latency (a few microseconds)
    network_bytes_per_s: float = 50e9  # bytes/s, one 400 Gb/s link between nodes (InfiniBand NDR, RoCE)
    network_latency_s: float = 10e-6  # s, network transfer latency between nodes (about 10 microseconds)


_POSITIVE_FIELDS = ("flops_bf16", "flops_fp8", "hbm_bytes_per_s", "hbm_bytes", "interconnect_bytes_per_s",
                    "interconnect_latency_s", "network_bytes_per_s", "network_latency_s")


class Hardware(CheckedTuple, _HardwareFields):
    """One GPU. Figures are dense (no sparsity) datasheet peaks; see ``data/README.md``.

    Validated on construction (and by ``_replace``): every rate and size a finite number > 0 (FLOP/s, bytes/s,
    bytes), ``has_fp8`` a bool, ``name`` a string; otherwise a ``ValueError`` naming the field.
    """

    __slots__ = ()

    def check(self) -> Hardware:
        """Raise ``ValueError`` naming the first bad field; return ``self``."""
        if not isinstance(self.name, str):
            raise ValueError(f"Hardware.name must be a string, got {self.name!r}")
        for field in _POSITIVE_FIELDS:
            real(f"Hardware.{field}", getattr(self, field), 0, low_open=True, allowed="a finite number > 0")
        flag("Hardware.has_fp8", self.has_fp8)
        return self

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for GEMMs whose weights are stored as ``dtype``."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        return self.flops_fp8 if dtype == "fp8" else self.flops_bf16

    @property
    def ridge_point(self) -> float:
        """FLOP per byte at which BF16 compute time equals HBM time."""
        return self.flops_bf16 / self.hbm_bytes_per_s


@cache
def _presets() -> dict[str, Hardware]:
    out = {}
    for name, row in read_presets("hardware.csv").items():
        out[name] = Hardware(
            name=name,
            flops_bf16=float(row["flops_bf16"]),
            flops_fp8=float(row["flops_fp8"]),
            hbm_bytes_per_s=float(row["hbm_bytes_per_s"]),
            hbm_bytes=float(row["hbm_bytes"]),
            interconnect_bytes_per_s=float(row["interconnect_bytes_per_s"]),
            has_fp8=bool(int(row["has_fp8"])),
        )
    return out


def hardware_names() -> list[str]:
    """Names accepted by :func:`get_hardware`."""
    return list(_presets())


def get_hardware(name: str) -> Hardware:
    """The preset GPU called ``name`` (``h100-sxm``, ``h100-pcie``, ``h200``, ``a100-80gb``)."""
    presets = _presets()
    if name not in presets:
        raise ValueError(f"hardware must be one of {sorted(presets)}, got {name!r}")
    return presets[name]
