"""Configuration of the conductor service.

grpc-free. How the conductor names a prompt's KV in the pool is the nodes' own
identity (their Stats; `identity.py`); `seed`, `batch_invariant` and `kv_objects`
here are explicit overrides (None: take the nodes' word), and a node that differs
from a stated value is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.conductor.fleet import EngineFleet, EngineSpec, VllmHashing, specs_from
from kvstore.conductor.identity import KV_OBJECTS, IdentityOverrides
from kvstore.conductor.profiles import DEFAULT_PROFILE, PROFILES
from kvstore.conductor.registry import POLICIES
from kvstore.errors import BadRequestError


@dataclass(frozen=True, slots=True)
class ConductorConfig:
    """Where the conductor listens, which nodes it drives and how it places requests.

    `prefill` / `decode` / `colocated`: host:port of serving nodes (a node's role is
    what its Stats reports; the flag only picks the service to ask). A decode node's
    limit for a local prefill (Generate) is what its Stats report, lowered to
    `local_prefill_tokens` when that is set; a local prefill the policy picks for a
    longer prompt runs on the least loaded prefill node instead.
    """

    listen: str = "127.0.0.1:0"
    master: str = ""
    prefill: tuple[str, ...] = ()
    decode: tuple[str, ...] = ()
    colocated: tuple[str, ...] = ()
    policy: str = "cache_load"
    profile: str = DEFAULT_PROFILE
    tbt_budget_s: float = 0.1
    seed: int | None = None
    batch_invariant: bool | None = None
    kv_objects: str | None = None
    local_prefill_tokens: int | None = None
    refresh_s: float = 1.0
    rpc_timeout_s: float = 60.0
    match_timeout_s: float = 2.0
    # a vLLM fleet (fleet.py): OpenAI servers "[NAME=]http://HOST:PORT", the KV-event PUB
    # (and ROUTER replay) endpoint of each, in the same order, and how they hash blocks
    vllm: tuple[str, ...] = ()
    kv_events: tuple[str, ...] = ()
    kv_events_replay: tuple[str, ...] = ()
    kv_events_topic: str = ""
    vllm_model: str = ""
    vllm_block_size: int = 16
    vllm_hash: str = "sha256"
    vllm_hash_seed: str | None = None
    vllm_kv_tokens: int = 1 << 20

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
        if min(self.seed or 0, self.local_prefill_tokens or 0) < 0:
            raise BadRequestError("seed and local_prefill_tokens must be >= 0")
        if self.kv_objects is not None and self.kv_objects not in KV_OBJECTS:
            raise BadRequestError(f"kv_objects must be one of {KV_OBJECTS}")
        addresses = [*self.prefill, *self.decode, *self.colocated]
        if len(set(addresses)) != len(addresses) or not all(addresses):
            raise BadRequestError(f"node addresses must be distinct and non-empty: {addresses}")
        if (self.kv_events or self.kv_events_replay) and not self.vllm:
            raise BadRequestError("kv_events needs the vLLM engines they come from (vllm)")
        if self.vllm_kv_tokens <= 0:
            raise BadRequestError("vllm_kv_tokens must be > 0")
        if self.vllm:
            self.engines()  # validates the engine list, the endpoints and the hashing

    def engines(self) -> tuple[EngineSpec, ...]:
        """The vLLM engines, each with its KV-event endpoints."""
        VllmHashing(self.vllm_block_size, self.vllm_hash, self.vllm_hash_seed)
        return specs_from(self.vllm, self.kv_events, self.kv_events_replay)

    def fleet(self) -> EngineFleet:
        """The (not yet started) vLLM fleet of this configuration."""
        hashing = VllmHashing(self.vllm_block_size, self.vllm_hash, self.vllm_hash_seed)
        return EngineFleet(self.engines(), hashing, self.vllm_model, self.vllm_kv_tokens,
                           self.kv_events_topic)  # fmt: skip

    @property
    def overrides(self) -> IdentityOverrides:
        return IdentityOverrides(self.seed, self.batch_invariant, self.kv_objects)
