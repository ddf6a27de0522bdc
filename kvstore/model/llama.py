"""Llama-family decoder modules: RMSNorm, rotate-half RoPE, GQA projections, SwiGLU.

Parameter names equal Hugging Face's (`model.layers.N.self_attn.q_proj.weight`, ...),
so a checkpoint's state dict loads with no renaming. The attention itself is not here:
each layer takes an `attend(q, k, v)` callable, so the same modules run the dense
reference (`dense_causal_attend`) and the paged engine (`kvstore.model.paged_attention`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kvstore.model.config import ModelConfig

# attend(q [n, heads, d], k [n, kv_heads, d], v [n, kv_heads, d]) -> [n, heads, d]
AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    """y = w * x / rms(x), computed in float32 like HF Llama."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [n, head_dim] (float32) per absolute position; elementwise, so a
    position's values never depend on which other positions are in the batch."""
    exponent = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
    inv_freq = 1.0 / (theta ** (exponent / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [n, heads, d] by the HF rotate-half convention (halves, not pairs)."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)


class Attention(nn.Module):
    """q/k/v/o projections with grouped-query heads; RoPE applied to q and k."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        bias = config.attention_bias
        self.config = config
        self.q_proj = nn.Linear(config.hidden, config.q_size, bias=bias)
        self.k_proj = nn.Linear(config.hidden, config.kv_size, bias=bias)
        self.v_proj = nn.Linear(config.hidden, config.kv_size, bias=bias)
        self.o_proj = nn.Linear(config.q_size, config.hidden, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        c = self.config
        n = x.shape[0]
        q = self.q_proj(x).view(n, c.heads, c.head_dim)
        k = self.k_proj(x).view(n, c.kv_heads, c.head_dim)
        v = self.v_proj(x).view(n, c.kv_heads, c.head_dim)
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta)
        out = attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        return self.o_proj(out.reshape(n, c.q_size))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.up_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.down_proj = nn.Linear(config.intermediate, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden, config.rms_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden, config.rms_eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """HF's `model.*`: embeddings, decoder layers, final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden, config.rms_eps)


class LlamaForCausalLM(nn.Module):
    """The whole decoder; `lm_head` is absent when tied to the embeddings."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = (
            None
            if config.tie_embeddings
            else nn.Linear(config.hidden, config.vocab_size, bias=False)
        )

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + output projection, returned in float32."""
        h = self.model.norm(h)
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, weight).float()

    def forward_dense(self, tokens: torch.Tensor) -> torch.Tensor:
        """Reference forward with no cache: logits [n, vocab] for tokens [n] at 0..n-1."""
        positions = torch.arange(tokens.shape[0], device=tokens.device)
        h = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            h = layer(h, positions, dense_causal_attend)
        return self.logits(h)


def dense_causal_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal GQA attention over the given tokens only, via torch SDPA (the reference)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).float(),
        k.transpose(0, 1).float(),
        v.transpose(0, 1).float(),
        is_causal=True,
    )
    return out.transpose(0, 1).to(q.dtype)


def parameter_shapes(config: ModelConfig) -> dict[str, torch.Size]:
    """Every weight the model needs, by Hugging Face name, with its shape."""
    with torch.device("meta"):
        return {name: t.shape for name, t in LlamaForCausalLM(config).state_dict().items()}


def random_weights(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Deterministic random weights (CPU generator) with O(1) activations and logits."""
    gen = torch.Generator().manual_seed(seed)
    weights: dict[str, torch.Tensor] = {}
    for name, shape in parameter_shapes(config).items():
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith(".bias"):
            w = 0.1 * torch.randn(shape, generator=gen)
        elif name == "model.embed_tokens.weight":
            w = torch.randn(shape, generator=gen)
        else:
            w = torch.randn(shape, generator=gen) / shape[-1] ** 0.5
        weights[name] = w.to(config.torch_dtype)
    return weights
