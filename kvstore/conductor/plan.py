"""What the conductor service keeps per request and sends back, free of grpc.

A `Plan` is one placed request (what to send where, what was measured so far);
`placement` and `retry_metadata` build the Generate stream's placement message and
an early rejection's trailing metadata.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from kvstore.conductor.api import Decision
from kvstore.conductor.errors import RejectedError
from kvstore.conductor.nodes import NodeEntry
from kvstore.v1 import conductor_pb2 as cpb
from kvstore.v1 import serving_pb2 as spb

RETRY_AFTER_KEY = "retry-after-ms"


@dataclass(slots=True)
class Counters:
    """What the service has done since it started (ClusterStatus reports them)."""

    requests: int = 0
    rejected: int = 0
    failed: int = 0
    local_prefills: int = 0
    remote_prefills: int = 0


@dataclass(slots=True)
class Plan:
    """One placed request: what to send where, and what was measured so far."""

    spec: spb.GenerationSpec  # token ids, unique request id
    prompt_tokens: int
    decision: Decision
    policy: str
    prefill: NodeEntry
    decode: NodeEntry
    local: bool
    prefill_s: float  # predicted prefill compute (the ledger's queue estimate)
    arrival: float
    route_s: float
    timings: cpb.RequestTimings = field(default_factory=cpb.RequestTimings)

    def since(self) -> float:
        return time.perf_counter() - self.arrival


def placement(plan: Plan) -> cpb.Placement:
    """The first message's account of where the request runs and what was predicted."""
    d = plan.decision
    assert plan.prefill.info is not None and plan.decode.info is not None
    return cpb.Placement(
        policy=plan.policy,
        prefill_node=plan.prefill.info.node_id,
        decode_node=plan.decode.info.node_id,
        local_prefill=plan.local,
        cached_blocks=d.cached_blocks,
        predicted_ttft_s=d.predicted_ttft_s,
        predicted_tbt_s=d.predicted_tbt_s,
        reason=d.reason,
        source_node=d.source_node or "",
    )


def retry_metadata(exc: RejectedError) -> tuple[tuple[str, str], ...]:
    """Trailing metadata of an early rejection: `retry-after-ms` when a retry helps."""
    if exc.retry_after_s is None:
        return ()
    return ((RETRY_AFTER_KEY, str(math.ceil(exc.retry_after_s * 1000))),)
