"""Model presets: the shapes that set weight bytes, KV bytes per token and attention FLOPs."""
from __future__ import annotations

from functools import cache
from typing import NamedTuple

from ._data import read_presets
from ._checks import CheckedTuple, integer

BYTES_PER_ELEMENT = {"bf16": 2, "fp8": 1}


def _element_bytes(dtype: str) -> int:
    if dtype not in BYTES_PER_ELEMENT:
        raise ValueError(f"dtype must be one of {tuple(BYTES_PER_ELEMENT)}, got {dtype!r}")
    return BYTES_PER_ELEMENT[dtype]


class _ModelFields(NamedTuple):

    name: str
    params: int  # parameters, embeddings and LM head included
    layers: int  # transformer blocks
    d_model: int  # hidden size
    heads: int  # query heads
    kv_heads: int  # key/value heads (GQA groups)
    head_dim: int  # dimension of one head
    d_ff: int  # MLP intermediate size
    vocab: int  # vocabulary size
    max_position_embeddings: int = 8192  # tokens of context the model was trained for (vLLM's default max_model_len)
    tied_embeddings: int = 0  # 1: the LM head is the input embedding matrix (one copy in ``params``)


_SHAPE_LIMIT = 2**31  # any layer count, width or vocabulary: far past every model, far inside int64 products
_FIELD_RANGES = {  # field -> (least, most); params, d_ff and vocab may be 0 for one operator's shape (calibrate)
    "params": (0, 2**50), "layers": (1, _SHAPE_LIMIT), "d_model": (1, _SHAPE_LIMIT), "heads": (1, _SHAPE_LIMIT),
    "kv_heads": (1, _SHAPE_LIMIT), "head_dim": (1, _SHAPE_LIMIT), "d_ff": (0, _SHAPE_LIMIT),
    "vocab": (0, _SHAPE_LIMIT), "max_position_embeddings": (1, _SHAPE_LIMIT), "tied_embeddings": (0, 1),
}


class ModelSpec(CheckedTuple, _ModelFields):
    """A decoder-only transformer with grouped-query attention.

    Validated on construction (and by ``_replace``): whole numbers in range (``layers``, ``d_model``, ``heads``,
    ``kv_heads``, ``head_dim`` >= 1; ``params``, ``d_ff``, ``vocab`` >= 0, so one operator's shape can be
    described; ``kv_heads`` <= ``heads``; ``params`` at least the embedding table and LM head it counts);
    otherwise a ``ValueError`` naming the field.
    """

    __slots__ = ()

    def check(self) -> ModelSpec:
        """Raise ``ValueError`` naming the first bad field; return ``self``."""
        if not isinstance(self.name, str):
            raise ValueError(f"ModelSpec.name must be a string, got {self.name!r}")
        for field, (low, high) in _FIELD_RANGES.items():
            integer(f"ModelSpec.{field}", getattr(self, field), low, high)
        if self.kv_heads > self.heads:
            raise ValueError(f"ModelSpec.kv_heads ({self.kv_heads}) must be from 1 to heads ({self.heads})")
        if self.body_params < 0:
            raise ValueError(f"ModelSpec.params ({self.params}) must be at least the embedding table and LM head it "
                             f"includes ({self.params - self.body_params} = vocab x d_model x "
                             f"{1 if self.tied_embeddings else 2})")
        return self

    @property
    def embedding_params(self) -> int:
        """Parameters of the input embedding table, vocab x d_model (a row lookup per token, no GEMM)."""
        return self.vocab * self.d_model

    @property
    def body_params(self) -> int:
        """Parameters every new token multiplies: all but the embedding table and the LM head."""
        return self.params - self.embedding_params * (1 if self.tied_embeddings else 2)

    def weight_bytes(self, dtype: str = "bf16") -> float:
        """Bytes of weights held in HBM: the body in ``dtype``; the embedding table and the LM head stay BF16
        (vLLM's FP8 quantisation, like the published FP8 checkpoints, leaves them unquantised)."""
        tables = self.params - self.body_params
        return float(self.body_params * _element_bytes(dtype) + tables * BYTES_PER_ELEMENT["bf16"])

    def kv_bytes_per_token(self, dtype: str = "bf16") -> int:
        """Bytes of K and V cached per token over all layers: 2 * L * H_kv * d_h * bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * _element_bytes(dtype)

    @property
    def attn_dim(self) -> int:
        """Query width H * d_h, the ``d`` of the attention FLOP formula."""
        return self.heads * self.head_dim


@cache
def _presets() -> dict[str, ModelSpec]:
    out = {}
    for name, row in read_presets("models.csv").items():
        out[name] = ModelSpec(name=name, **{k: int(v) for k, v in row.items() if k != "name"})
    return out


def model_names() -> list[str]:
    """Names accepted by :func:`get_model`."""
    return list(_presets())


def get_model(name: str) -> ModelSpec:
    """The preset model ``name`` (:func:`model_names` lists them; shapes in ``data/models.csv``)."""
    presets = _presets()
    if name not in presets:
        raise ValueError(f"model must be one of {sorted(presets)}, got {name!r}")
    return presets[name]
