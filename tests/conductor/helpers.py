"""Hand-computable models and clusters for the conductor tests."""

from __future__ import annotations

from kvstore.conductor.api import ClusterView, NodeState, Request, Role
from kvstore.conductor.index import DictPrefixIndex
from kvstore.conductor.latency import QuadraticLatencyModel, TransferModel

# prefill: 0.1 ms per new token; decode step: 10 ms + 1 ms per sequence.
LAT = QuadraticLatencyModel("test", prefill_ms=(0.0, 0.1, 0.0), decode_ms=(10.0, 0.0, 1.0))
# 1000 B of KV per token; HBM 1 TB/s, DRAM 1 GB/s, SSD 100 MB/s; network 1 GB/s.
TR = TransferModel(
    kv_bytes_per_token=1000,
    tier_bytes_per_s=(1e12, 1e9, 1e8),
    network_bytes_per_s=1e9,
    overhead_s=0.0,
)
BT = 100  # tokens per block
KW = {"latency": LAT, "transfer": TR}


def node(
    nid: str, role: Role, wait: float = 0.0, running: int = 0, free: int = 100_000
) -> NodeState:
    return NodeState(
        node_id=nid,
        role=role,
        queued_prefill_tokens=int(wait * 10_000),
        running_decode_seqs=running,
        decode_context_tokens=running * 1000,
        kv_free_tokens=free,
        kv_capacity_tokens=100_000,
        est_queue_wait_s=wait,
    )


def req(prompt: int, rid: str = "r", output: int = 10, **slo: float) -> Request:
    blocks = tuple(range(prompt // BT))
    return Request(rid, 0.0, prompt, output, blocks, slo.get("ttft"), slo.get("tbt"))


def view(
    nodes: list[NodeState], index: DictPrefixIndex | None = None, pooled: bool = False
) -> ClusterView:
    return ClusterView(tuple(nodes), index or DictPrefixIndex(), pooled=pooled, block_tokens=BT)
