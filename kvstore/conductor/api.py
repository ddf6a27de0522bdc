"""The conductor's interface: requests, cluster views, decisions and policies.

Free of grpc and torch so that the gRPC service and the discrete-event simulator
run the same policy code. A caller builds a `ClusterView` (node states plus a
`PrefixIndex` over what each node caches) and asks a `Policy` to `place` a
`Request`; the policy returns a `Decision` or raises `RejectedError`
(RESOURCE_EXHAUSTED with `retry_after_s`). Bad input raises `BadRequestError`.

`index.DictPrefixIndex` is an in-memory PrefixIndex (tests, simple simulations).
Policies are made by name: `kvstore.conductor.make_policy(name, **kwargs)` (see
`registry.py`; names in `POLICIES`). Policies that predict latency take
`latency: LatencyModel` and `transfer: TransferModel` keyword arguments
(defaults: the fitted Llama2-70B/A100 TP4 profile of `latency.py`).

Conventions:
- `Decision.prefill_node` is always the node that runs the prefill; when
  `local_prefill` is true it equals `decode_node` (prefill on the decode node,
  no KV transfer between nodes; also the case on a COLOCATED node).
- A prefix is counted in blocks of `ClusterView.block_tokens` tokens; block ids
  are chained (equal ids = equal prefix), bytes or int (Mooncake's hash_ids).
- "conditional" on PREFILL + DECODE pools prefills on the decode node when that
  is sooner and its streams can afford it; on COLOCATED nodes it may also prefill
  on one node and decode on another. Both need one policy instance per cluster
  (policies keep state: turns, each node's recent prefill share).
- Pooled mode (`ClusterView.pooled`): any node can load a prefix cached on
  another node at min(that tier's bandwidth, the network bandwidth).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from kvstore.conductor.errors import RejectedError
from kvstore.conductor.latency import LatencyModel, TransferModel
from kvstore.errors import BadRequestError, NotFoundError
from kvstore.types import Tier

BlockId = bytes | int

__all__ = [
    "BlockId",
    "ClusterView",
    "Decision",
    "LatencyModel",
    "NodeState",
    "Policy",
    "PoolSplit",
    "PooledPrefixIndex",
    "PrefixIndex",
    "PrefixMatch",
    "RejectedError",
    "Request",
    "Role",
    "TransferModel",
]


class Role(IntEnum):
    """What a node serves."""

    PREFILL = 0
    DECODE = 1
    COLOCATED = 2


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request; SLOs in seconds, None = no objective."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[BlockId, ...] = ()
    ttft_slo_s: float | None = None
    tbt_slo_s: float | None = None

    def __post_init__(self) -> None:
        if self.prompt_tokens <= 0 or self.output_tokens < 0:
            raise BadRequestError(
                f"request {self.request_id}: prompt_tokens must be > 0 and output_tokens >= 0"
            )
        for name in ("ttft_slo_s", "tbt_slo_s"):
            slo = getattr(self, name)
            if slo is not None and not slo > 0:
                raise BadRequestError(f"request {self.request_id}: impossible {name}={slo}")


@dataclass(frozen=True, slots=True)
class NodeState:
    """A snapshot of one node's load, as the conductor sees it.

    `est_queue_wait_s` is the predicted wait before a new prefill can start on
    the node (on a DECODE node: before a local prefill can start there).
    `decode_context_tokens` is the KV length summed over its running sequences.
    `profile` names the node's latency profile (hardware; "" = the policy's default) and
    `local_prefill_tokens` the longest prompt a DECODE node prefills itself (None: no
    limit, as on a COLOCATED node; 0: none). `max_context_tokens` (None: no limit) is the
    longest prompt + output the node's model serves. A decode-capable node with
    `hands_off` False (a gRPC colocated node has no Prefill RPC) prefills only for itself.
    """

    node_id: str
    role: Role
    queued_prefill_tokens: int = 0
    running_decode_seqs: int = 0
    decode_context_tokens: int = 0
    kv_free_tokens: int = 0
    kv_capacity_tokens: int = 0
    est_queue_wait_s: float = 0.0
    profile: str = ""
    local_prefill_tokens: int | None = None
    max_context_tokens: int | None = None
    hands_off: bool = True  # may prefill for another node's decode (False: only its own)

    def __post_init__(self) -> None:
        counts = (
            self.queued_prefill_tokens,
            self.running_decode_seqs,
            self.decode_context_tokens,
            self.kv_free_tokens,
            self.kv_capacity_tokens,
        )
        if min(counts) < 0 or self.est_queue_wait_s < 0:
            raise BadRequestError(f"node {self.node_id}: negative load figures")
        if self.kv_free_tokens > self.kv_capacity_tokens:
            raise BadRequestError(f"node {self.node_id}: kv_free_tokens > kv_capacity_tokens")
        limits = (self.local_prefill_tokens, self.max_context_tokens)
        if any(x is not None and x < 0 for x in limits):
            raise BadRequestError(f"node {self.node_id}: negative token limits")

    @property
    def can_prefill(self) -> bool:
        return self.role in (Role.PREFILL, Role.COLOCATED)

    @property
    def can_decode(self) -> bool:
        return self.role in (Role.DECODE, Role.COLOCATED)

    def serves(self, req: Request) -> bool:
        """Whether the request fits the node's model context."""
        limit = self.max_context_tokens
        return limit is None or req.prompt_tokens + req.output_tokens <= limit

    def can_prefill_locally(self, req: Request) -> bool:
        """Whether the node may prefill `req` for its own decode: a COLOCATED node always,
        a DECODE node within its local-prefill limit, a PREFILL node never."""
        if self.role == Role.PREFILL or not self.serves(req):
            return False
        limit = self.local_prefill_tokens
        return self.role == Role.COLOCATED or limit is None or req.prompt_tokens <= limit


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The longest cached prefix on one node: `blocks` blocks, split by tier."""

    blocks: int
    tier_blocks: Mapping[Tier, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.blocks < 0 or sum(self.tier_blocks.values()) != self.blocks:
            raise BadRequestError(f"prefix match: tier_blocks must sum to blocks={self.blocks}")
        object.__setattr__(self, "tier_blocks", MappingProxyType(dict(self.tier_blocks)))

    @property
    def slowest_tier(self) -> Tier | None:
        """The slowest tier holding part of the prefix; None when nothing matched."""
        tiers = [t for t, n in self.tier_blocks.items() if n > 0]
        return max(tiers) if tiers else None


NO_MATCH = PrefixMatch(0)


class PrefixIndex(Protocol):
    """Which prefix of a block chain each node caches (nodes with none may be omitted)."""

    def match(self, hashes: Sequence[BlockId]) -> dict[str, PrefixMatch]: ...


class PoolSplit(Protocol):
    """The longest prefix held anywhere in a pool, as blocks per tier on and off one node."""

    @property
    def local(self) -> Mapping[Tier, int]: ...

    @property
    def remote(self) -> Mapping[Tier, int]: ...


@runtime_checkable
class PooledPrefixIndex(PrefixIndex, Protocol):
    """A pooled store's index: a prefix may be spread over several nodes' memory.

    In pooled mode policies use `prefix` when the index has it: node `node_id` loads
    the `local` blocks from its own tiers and the `remote` ones over the network.
    Without it they use `match` (the longest run on one node: its own, or one donor's).
    """

    def prefix(self, node_id: str, hashes: Sequence[BlockId]) -> PoolSplit: ...


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Nodes and their cached prefixes at the moment of one placement."""

    nodes: tuple[NodeState, ...]
    index: PrefixIndex
    pooled: bool = True
    block_tokens: int = 512

    def __post_init__(self) -> None:
        if not self.nodes:
            raise BadRequestError("empty cluster: no nodes to place on")
        ids = [n.node_id for n in self.nodes]
        if len(set(ids)) != len(ids):
            raise BadRequestError(f"duplicate node ids in {ids}")
        if self.block_tokens <= 0:
            raise BadRequestError(f"block_tokens must be > 0, got {self.block_tokens}")

    def node(self, node_id: str) -> NodeState:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise NotFoundError(f"unknown node {node_id!r}")

    def prefill_nodes(self) -> tuple[NodeState, ...]:
        """Nodes that can prefill; BadRequestError when there is none."""
        found = tuple(n for n in self.nodes if n.can_prefill)
        if not found:
            raise BadRequestError("cluster has no PREFILL or COLOCATED node")
        return found

    def decode_nodes(self) -> tuple[NodeState, ...]:
        """Nodes that can decode; BadRequestError when there is none."""
        found = tuple(n for n in self.nodes if n.can_decode)
        if not found:
            raise BadRequestError("cluster has no DECODE or COLOCATED node")
        return found

    def matches(self, hashes: Sequence[BlockId]) -> dict[str, PrefixMatch]:
        """The cached prefix per node id (NO_MATCH for nodes the index omits)."""
        found = self.index.match(hashes)
        return {n.node_id: found.get(n.node_id, NO_MATCH) for n in self.nodes}


@dataclass(frozen=True, slots=True)
class Decision:
    """Where one request runs and what the policy predicted for it."""

    prefill_node: str
    decode_node: str
    local_prefill: bool
    cached_blocks: int
    predicted_ttft_s: float
    predicted_tbt_s: float
    reason: str
    # node the cached prefix is loaded from; None when nothing is loaded or when a pooled
    # index supplies it from several nodes
    source_node: str | None = None


@runtime_checkable
class Policy(Protocol):
    """A placement policy; `place` raises RejectedError when it rejects."""

    @property
    def name(self) -> str: ...  # a class attribute in the policies (PolicyBase.name)

    def place(self, req: Request, view: ClusterView) -> Decision: ...
