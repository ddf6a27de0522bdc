"""The conductor's own accounting of the work it has sent to each serving node.

The serving nodes' Stats report their queue (free KV blocks, running sequences,
queued prefill requests and tokens), but a report is up to a refresh period old by
the time a burst of requests arrives, and after a stream ends it keeps counting it
for as long. Like Dynamo's router, the conductor therefore places by what it
dispatched itself (the reports are shown by ClusterStatus):
per node, the prefills in flight (with their predicted compute time, which gives
the queue wait of the next one) and the decode streams in flight (their context
and the KV tokens they may grow to). `node_state` turns that into the
`NodeState` the policies read. Deterministic: every call takes the time `now`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.conductor.api import NodeState, Role
from kvstore.conductor.identity import KeyIdentity
from kvstore.errors import BadRequestError, ExistsError, NotFoundError


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a serving node told the conductor about itself (its Stats): its id, role,
    KV capacity, the identity that names its pool keys (None: not reported) and, for a
    decode node, the longest prompt it prefills itself (Generate)."""

    address: str
    node_id: str
    role: Role
    model_id: str
    block_tokens: int
    total_blocks: int
    identity: KeyIdentity | None = None
    local_prefill_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.node_id or self.block_tokens <= 0 or self.total_blocks < 0:
            raise BadRequestError(f"bad node info from {self.address}: {self}")
        if self.local_prefill_tokens < 0:
            raise BadRequestError(f"bad local_prefill_tokens from {self.address}")

    @property
    def kv_capacity_tokens(self) -> int:
        """KV tokens the node can hold; 0 for a PREFILL node (it keeps none)."""
        return 0 if self.role == Role.PREFILL else self.total_blocks * self.block_tokens


@dataclass(slots=True)
class _Prefill:
    tokens: int
    predicted_s: float
    started_s: float


@dataclass(slots=True)
class _Decode:
    context_tokens: int
    reserved_tokens: int


@dataclass(slots=True)
class _Node:
    prefills: dict[str, _Prefill] = field(default_factory=dict)
    decodes: dict[str, _Decode] = field(default_factory=dict)
    routed_prefills: int = 0
    routed_decodes: int = 0


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """A node's in-flight work as counted by the conductor."""

    prefills: int
    prefill_tokens: int
    decodes: int
    context_tokens: int
    reserved_tokens: int
    est_queue_wait_s: float
    routed_prefills: int
    routed_decodes: int


class Ledger:
    """In-flight prefills and decode streams per node id."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}

    def _node(self, node_id: str) -> _Node:
        return self._nodes.setdefault(node_id, _Node())

    def start_prefill(
        self, node_id: str, request_id: str, tokens: int, predicted_s: float, now: float
    ) -> None:
        """A prefill of `tokens` prompt tokens, predicted to take `predicted_s`, was sent."""
        node = self._node(node_id)
        if request_id in node.prefills:
            raise ExistsError(f"prefill {request_id!r} already in flight on {node_id}")
        node.prefills[request_id] = _Prefill(tokens, max(predicted_s, 0.0), now)
        node.routed_prefills += 1

    def finish_prefill(self, node_id: str, request_id: str) -> bool:
        """The prefill ended (done, failed or cancelled); False if it was not in flight."""
        return self._node(node_id).prefills.pop(request_id, None) is not None

    def start_decode(
        self, node_id: str, request_id: str, prompt_tokens: int, max_tokens: int
    ) -> None:
        """A decode stream started: it holds the prompt's KV and may grow by `max_tokens`."""
        node = self._node(node_id)
        if request_id in node.decodes:
            raise ExistsError(f"decode {request_id!r} already in flight on {node_id}")
        node.decodes[request_id] = _Decode(prompt_tokens, prompt_tokens + max_tokens)
        node.routed_decodes += 1

    def add_tokens(self, node_id: str, request_id: str, count: int) -> None:
        """`count` more tokens were generated: the stream's context grew."""
        dec = self._node(node_id).decodes.get(request_id)
        if dec is None:
            raise NotFoundError(f"no decode {request_id!r} in flight on {node_id}")
        dec.context_tokens = min(dec.context_tokens + count, dec.reserved_tokens)

    def finish_decode(self, node_id: str, request_id: str) -> bool:
        """The stream ended; False if it was not in flight."""
        return self._node(node_id).decodes.pop(request_id, None) is not None

    def load(self, node_id: str, now: float) -> NodeLoad:
        """The node's in-flight work; the queue wait assumes one prefill at a time, FIFO."""
        node = self._node(node_id)
        pre = sorted(node.prefills.values(), key=lambda p: p.started_s)
        wait = sum(p.predicted_s for p in pre[1:])
        if pre:
            wait += max(pre[0].predicted_s - (now - pre[0].started_s), 0.0)
        return NodeLoad(
            prefills=len(pre),
            prefill_tokens=sum(p.tokens for p in pre),
            decodes=len(node.decodes),
            context_tokens=sum(d.context_tokens for d in node.decodes.values()),
            reserved_tokens=sum(d.reserved_tokens for d in node.decodes.values()),
            est_queue_wait_s=wait,
            routed_prefills=node.routed_prefills,
            routed_decodes=node.routed_decodes,
        )

    def node_state(self, info: NodeInfo, now: float) -> NodeState:
        """The policies' view of `info`'s node: its capacity less what is in flight there."""
        load = self.load(info.node_id, now)
        capacity = info.kv_capacity_tokens
        return NodeState(
            node_id=info.node_id,
            role=info.role,
            queued_prefill_tokens=load.prefill_tokens,
            running_decode_seqs=load.decodes,
            decode_context_tokens=load.context_tokens,
            kv_free_tokens=max(capacity - load.reserved_tokens, 0),
            kv_capacity_tokens=capacity,
            est_queue_wait_s=load.est_queue_wait_s,
            # a DECODE node prefills (Generate) up to its limit, a COLOCATED one any prompt;
            # only a PREFILL node serves Prefill for another node's decode
            local_prefill_tokens=info.local_prefill_tokens if info.role == Role.DECODE else None,
            hands_off=info.role == Role.PREFILL,
        )

    def node_ids(self) -> list[str]:
        """Every node the ledger has counted work for."""
        return list(self._nodes)

    def idle(self) -> bool:
        """Nothing is in flight anywhere."""
        return not any(n.prefills or n.decodes for n in self._nodes.values())

    def check_integrity(self) -> None:
        """Every stream's context is within its reservation and every figure is >= 0."""
        for node_id, node in self._nodes.items():
            for rid, dec in node.decodes.items():
                if not 0 <= dec.context_tokens <= dec.reserved_tokens:
                    raise AssertionError(f"{node_id}/{rid}: context outside its reservation")
            for rid, pre in node.prefills.items():
                if pre.tokens <= 0 or pre.predicted_s < 0:
                    raise AssertionError(f"{node_id}/{rid}: bad prefill entry {pre}")
