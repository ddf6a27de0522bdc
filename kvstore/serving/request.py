"""A validated generation request and the KV handoff between prefill and decode.

grpc-free: the node servers convert protobuf messages to these dataclasses (see
`kvstore.serving.convert`) and every check happens here, once, for both nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import xxhash

from kvstore.errors import BadRequestError, TooLargeError
from kvstore.model import ModelConfig, Sampler, SamplingParams

MAX_REQUEST_ID = 256  # it becomes part of the tail block's store key
MAX_TENANT = 256


@dataclass(frozen=True, slots=True)
class Request:
    """One generation: prompt token ids, how many new tokens, how to sample."""

    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_ids: frozenset[int] = frozenset()
    tenant: str = ""  # salts the prompt's block hashes ("" = the shared, unsalted space)

    def __post_init__(self) -> None:
        if not 0 < len(self.request_id) <= MAX_REQUEST_ID:
            raise BadRequestError(f"request_id must be 1..{MAX_REQUEST_ID} characters")
        if "/" in self.tenant or len(self.tenant) > MAX_TENANT:
            raise BadRequestError(
                f"bad tenant {self.tenant[:40]!r}: no '/', at most {MAX_TENANT} characters"
            )
        if not self.prompt:
            raise BadRequestError(f"request {self.request_id!r}: empty prompt")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise BadRequestError(f"max_tokens must be >= 1, got {self.max_tokens!r}")

    @property
    def total_tokens(self) -> int:
        """Positions the sequence occupies at most (prompt + new tokens)."""
        return len(self.prompt) + self.max_tokens

    def check_fits(self, model: ModelConfig) -> None:
        """Bad token ids or a sequence beyond the model's context are the caller's fault."""
        bad = [t for t in self.prompt if not 0 <= t < model.vocab_size]
        if bad:
            raise BadRequestError(f"token id {bad[0]} outside vocab of {model.vocab_size}")
        if len(self.prompt) >= model.max_position:
            raise TooLargeError(
                f"prompt of {len(self.prompt)} tokens exceeds the model's context of "
                f"{model.max_position}"
            )
        if self.total_tokens > model.max_position:
            raise TooLargeError(
                f"prompt {len(self.prompt)} + max_tokens {self.max_tokens} exceeds the "
                f"model's context of {model.max_position}"
            )


def sample_token(params: SamplingParams, logits: torch.Tensor, index: int) -> int:
    """New token number `index` of a request. Each draw gets its own generator, seeded
    from (seed, index), so a token does not depend on which node drew the ones
    before it: seeded sampling gives the same text colocated and disaggregated."""
    if params.greedy:
        return int(torch.argmax(logits))
    seed = xxhash.xxh64_intdigest(f"{params.seed}/{index}".encode()) >> 1  # < 2**63
    return Sampler(replace(params, seed=seed)).sample(logits)


@dataclass(frozen=True, slots=True)
class Handoff:
    """Where a prefilled prompt's KV lives in the pool: full blocks by hash, plus a
    request-scoped key for the partial last block (so decode gets every token's KV)."""

    block_tokens: int
    num_layers: int
    block_hashes: tuple[bytes, ...]
    tail_key: str = ""
    tail_tokens: int = 0
    layered: bool = True  # objects per (block, layer); False: one per block

    def __post_init__(self) -> None:
        if self.block_tokens <= 0 or self.num_layers <= 0:
            raise BadRequestError("handoff needs positive block_tokens and num_layers")
        if bool(self.tail_key) != (self.tail_tokens > 0):
            raise BadRequestError("handoff tail_key and tail_tokens disagree")
        if not 0 <= self.tail_tokens < self.block_tokens:
            raise BadRequestError(f"tail of {self.tail_tokens} tokens is not a partial block")

    @property
    def prompt_tokens(self) -> int:
        return len(self.block_hashes) * self.block_tokens + self.tail_tokens

    @property
    def num_blocks(self) -> int:
        return len(self.block_hashes) + (1 if self.tail_tokens else 0)

    @property
    def refs(self) -> list[str]:
        """Object key stems of the prompt's blocks, in order (the tail last)."""
        return [h.hex() for h in self.block_hashes] + ([self.tail_key] if self.tail_key else [])
