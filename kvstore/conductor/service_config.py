"""Configuration of the conductor service, and how it names a prompt's KV in the pool.

grpc-free. `PoolKeys` derives a prompt's block hashes and the pool keys the
prefill nodes publish (`<hash hex>/L<last layer>`, what their own prefix match
asks for) from the serving package's namespace; it imports that package (and so
torch) on first use only, so that importing the conductor stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from kvstore.conductor.profiles import DEFAULT_PROFILE, PROFILES
from kvstore.conductor.registry import POLICIES
from kvstore.errors import BadRequestError
from kvstore.hashing import block_hashes
from kvstore.types import block_key


@dataclass(frozen=True, slots=True)
class ConductorConfig:
    """Where the conductor listens, which nodes it drives and how it places requests.

    `prefill` / `decode` / `colocated`: host:port of serving nodes (a node's role is
    what its Stats reports; the flag only picks the service to ask). `local_prefill_tokens`
    is the decode nodes' own limit for a local prefill (Generate); a local prefill the
    policy picks for a longer prompt runs on the least loaded prefill node instead.
    """

    listen: str = "127.0.0.1:0"
    master: str = ""
    prefill: tuple[str, ...] = ()
    decode: tuple[str, ...] = ()
    colocated: tuple[str, ...] = ()
    policy: str = "cache_load"
    profile: str = DEFAULT_PROFILE
    tbt_budget_s: float = 0.1
    seed: int = 0
    batch_invariant: bool = True
    local_prefill_tokens: int = 0
    refresh_s: float = 1.0
    rpc_timeout_s: float = 60.0
    match_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise BadRequestError(
                f"unknown policy {self.policy!r}; valid: {', '.join(sorted(POLICIES))}"
            )
        if self.profile not in PROFILES:
            raise BadRequestError(
                f"unknown profile {self.profile!r}; valid: {', '.join(sorted(PROFILES))}"
            )
        times = (self.tbt_budget_s, self.refresh_s, self.rpc_timeout_s, self.match_timeout_s)
        if min(times) <= 0:
            raise BadRequestError("tbt_budget_s, refresh_s and the timeouts must be > 0")
        if self.seed < 0 or self.local_prefill_tokens < 0:
            raise BadRequestError("seed and local_prefill_tokens must be >= 0")
        addresses = [*self.prefill, *self.decode, *self.colocated]
        if len(set(addresses)) != len(addresses) or not all(addresses):
            raise BadRequestError(f"node addresses must be distinct and non-empty: {addresses}")


@dataclass(frozen=True, slots=True)
class PoolKeys:
    """A prompt's chained block hashes and the pool key of each block's last layer."""

    seed: int = 0
    batch_invariant: bool = True

    def hashes(self, model_id: str, block_tokens: int, tokens: Sequence[int]) -> list[bytes]:
        ns = _namespace(model_id, self.seed, block_tokens, self.batch_invariant)
        return block_hashes(tokens, block_tokens, ns)

    def keys(self, model_id: str, hashes: Sequence[bytes]) -> list[str]:
        last = _num_layers(model_id) - 1
        return [block_key(h, f"L{last}") for h in hashes]


@cache
def _namespace(model_id: str, seed: int, block_tokens: int, batch_invariant: bool) -> bytes:
    from kvstore.serving.config import ServingConfig, namespace

    config = ServingConfig(
        model_id=model_id, seed=seed, block_tokens=block_tokens, batch_invariant=batch_invariant
    )
    return namespace(config)


@cache
def _num_layers(model_id: str) -> int:
    from kvstore.serving.config import MODELS

    if model_id not in MODELS:
        raise BadRequestError(f"unknown model {model_id!r}; known: {sorted(MODELS)}")
    return int(MODELS[model_id]().layers)
