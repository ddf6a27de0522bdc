"""Configuration of a serving node (prefill, decode or colocated), and its model.

One frozen `ServingConfig` per process; `build_engine` and `kv_layout` derive the
engine and KV geometry from it, so a prefill node and a decode node started with
the same model id, seed, block size and batching mode agree on every KV byte.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from kvstore.errors import BadRequestError, NotFoundError
from kvstore.hashing import make_namespace
from kvstore.model import Engine, ModelConfig
from kvstore.tiers.kv_layout import KVLayout

MODELS = {"tiny": ModelConfig.tiny, "small": ModelConfig.small}
ROLES = ("prefill", "decode", "colocated")
ON_MISSING = ("recompute", "fail")
ON_FINISH = ("free", "publish")
KV_OBJECTS = ("layer", "block")


@dataclass(frozen=True, slots=True)
class ServingConfig:
    """What a node serves and how.

    batch_invariant: compute every token alone (bit-exact KV whatever the chunking or
      batch); the token-identity guarantee across (colocated, disaggregated, cached)
      needs it; False batches projections (faster, equal only up to float rounding).
    local_prefill_tokens: a non-colocated decode node prefills prompts up to this many
      tokens itself (Generate); 0 disables.
    on_missing: what a decode node does when the handoff's blocks cannot be read.
    on_finish: "free" drops a finished sequence's blocks; "publish" first writes its
      full blocks (prompt + generated) to the store, for the conversation's next turn.
    kv_objects: store objects per (block, layer), published layer by layer, or per
      block (all layers; fewer, larger objects), published per chunk. A decode node
      reads whatever shape the handoff names.
    tail_ttl_s: a prefill node removes a handed-off tail block that no decode node
      consumed within this many seconds (0: never; it then stays until evicted).
    """

    model_id: str = "tiny"
    role: str = "decode"
    seed: int = 0
    block_tokens: int = 16
    num_blocks: int = 512
    chunk_tokens: int = 512
    max_batch: int = 64
    batch_invariant: bool = True
    local_prefill_tokens: int = 0
    on_missing: str = "recompute"
    on_finish: str = "free"
    kv_objects: str = "layer"
    device: str = "auto"
    node_id: str = ""
    tail_ttl_s: float = 600.0

    def __post_init__(self) -> None:
        if self.model_id not in MODELS:
            raise BadRequestError(f"unknown model {self.model_id!r}; known: {sorted(MODELS)}")
        if self.role not in ROLES:
            raise BadRequestError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.on_missing not in ON_MISSING:
            raise BadRequestError(f"on_missing must be one of {ON_MISSING}")
        if self.on_finish not in ON_FINISH:
            raise BadRequestError(f"on_finish must be one of {ON_FINISH}")
        if self.kv_objects not in KV_OBJECTS:
            raise BadRequestError(f"kv_objects must be one of {KV_OBJECTS}")
        for name in ("block_tokens", "num_blocks", "chunk_tokens", "max_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise BadRequestError(f"{name} must be a positive int, got {value!r}")
        if self.local_prefill_tokens < 0 or self.seed < 0 or self.tail_ttl_s < 0:
            raise BadRequestError("local_prefill_tokens, seed and tail_ttl_s must be >= 0")

    @property
    def layered(self) -> bool:
        return self.kv_objects == "layer"

    @property
    def model(self) -> ModelConfig:
        return MODELS[self.model_id]()

    def check_model(self, model_id: str) -> None:
        if model_id != self.model_id:
            raise NotFoundError(
                f"unknown model id {model_id!r}: this node serves {self.model_id!r}"
            )


def kv_layout(config: ServingConfig) -> KVLayout:
    model = config.model
    return KVLayout(
        num_layers=model.layers,
        block_tokens=config.block_tokens,
        kv_heads=model.kv_heads,
        head_dim=model.head_dim,
        dtype=model.dtype,
    )


def namespace(config: ServingConfig, tenant: str = "") -> bytes:
    """Hash namespace: everything that changes a block's KV bytes for the same tokens,
    and the request's tenant, so one tenant's prompts never match another's blocks."""
    model = config.model
    mode = "inv" if config.batch_invariant else "batched"
    return make_namespace(
        f"{config.model_id}@seed{config.seed}",
        tenant=tenant,
        kv_dtype=model.dtype,
        kv_layout=f"paged/bt{config.block_tokens}/{mode}",
    )


def build_engine(config: ServingConfig) -> Engine:
    device = None if config.device == "auto" else config.device
    return Engine(
        config.model, seed=config.seed, device=device, batch_invariant=config.batch_invariant
    )


@dataclass(frozen=True, slots=True)
class ProcessConfig:
    """OS placement of a node process: CPU affinity and torch threads (for benches)."""

    cpus: tuple[int, ...] = ()
    torch_threads: int = 0

    def apply(self) -> None:
        if self.cpus:
            try:
                os.sched_setaffinity(0, set(self.cpus))
            except OSError as exc:
                raise BadRequestError(f"cannot pin to cpus {list(self.cpus)}: {exc}") from exc
        if self.torch_threads > 0:
            torch.set_num_threads(self.torch_threads)


def parse_cpus(text: str) -> tuple[int, ...]:
    """ "0,2-3" -> (0, 2, 3)."""
    cpus: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(cpus)
