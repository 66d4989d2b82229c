"""Model presets: the shapes that set weight bytes, KV bytes per token and attention FLOPs."""
from __future__ import annotations

from functools import cache
from typing import NamedTuple

from ._data import read_presets

BYTES_PER_ELEMENT = {"bf16": 2, "fp8": 1}


def _element_bytes(dtype: str) -> int:
    if dtype not in BYTES_PER_ELEMENT:
        raise ValueError(f"dtype must be one of {tuple(BYTES_PER_ELEMENT)}, got {dtype!r}")
    return BYTES_PER_ELEMENT[dtype]


class ModelSpec(NamedTuple):
    """A decoder-only transformer with grouped-query attention."""

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
