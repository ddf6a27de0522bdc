"""Token sampling: greedy, or seeded temperature + top-p (nucleus).

Each request owns a `Sampler` with its own CPU `torch.Generator`, so a request's
draws depend only on its seed and its logits — not on other requests in the batch,
nor on the device (logits are moved to the CPU in float32 before drawing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvstore.errors import BadRequestError


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_p in (0, 1]; seed fixes the draws."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise BadRequestError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise BadRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.seed < 2**63:
            raise BadRequestError(f"seed must be in [0, 2**63), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Sampler:
    """Draws one token per call from a logits vector, for one request."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self._gen = torch.Generator().manual_seed(params.seed)

    def sample(self, logits: torch.Tensor) -> int:
        """Next token id from logits [vocab]."""
        if logits.dim() != 1:
            raise BadRequestError(f"logits must be 1-d, got shape {tuple(logits.shape)}")
        logits = logits.detach().float().cpu()
        if self.params.greedy:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / self.params.temperature, dim=-1)
        probs = top_p_filter(probs, self.params.top_p)
        return int(torch.multinomial(probs, 1, generator=self._gen))


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest most-likely set whose mass reaches top_p (at least one token)."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = torch.sort(probs, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_probs, dim=0) - sorted_probs
    sorted_probs[mass_before >= top_p] = 0.0
    kept = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return kept / kept.sum()
