"""Model configuration of the reference engine: one frozen, validated dataclass.

Field names are short and engine-facing; `kvstore.model.checkpoint` maps them to and
from Hugging Face `config.json` keys. `dtype` is a string so the config stays
JSON-friendly and hashable; `torch_dtype` turns it into a `torch.dtype`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvstore.errors import BadRequestError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
MODEL_TYPES = ("llama", "qwen2", "mistral")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape and numerics of a Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU)."""

    vocab_size: int = 260
    hidden: int = 256
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 32
    intermediate: int = 512
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    max_position: int = 2048
    dtype: str = "float32"
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    tie_embeddings: bool = False  # lm_head shares the embedding matrix
    model_type: str = "llama"

    def __post_init__(self) -> None:
        sizes = {
            "vocab_size": self.vocab_size,
            "hidden": self.hidden,
            "layers": self.layers,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "intermediate": self.intermediate,
            "max_position": self.max_position,
        }
        for name, value in sizes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise BadRequestError(f"{name} must be a positive int, got {value!r}")
        if self.heads % self.kv_heads:
            raise BadRequestError(f"heads={self.heads} not a multiple of kv_heads={self.kv_heads}")
        if self.head_dim % 2:
            raise BadRequestError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_theta <= 0 or self.rms_eps <= 0:
            raise BadRequestError("rope_theta and rms_eps must be positive")
        if self.dtype not in DTYPES:
            raise BadRequestError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.model_type not in MODEL_TYPES:
            raise BadRequestError(f"model_type must be one of {MODEL_TYPES}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    @classmethod
    def tiny(cls, **overrides: object) -> ModelConfig:
        """The test default: 4 layers, hidden 256, 8 heads / 2 KV heads, byte vocab."""
        return cls(**overrides)  # type: ignore[arg-type]

    @classmethod
    def small(cls, **overrides: object) -> ModelConfig:
        """A bigger random model for benches (~60M parameters)."""
        fields: dict[str, object] = {
            "hidden": 768,
            "layers": 8,
            "heads": 12,
            "kv_heads": 4,
            "head_dim": 64,
            "intermediate": 2048,
            "max_position": 8192,
        }
        fields.update(overrides)
        return cls(**fields)  # type: ignore[arg-type]
