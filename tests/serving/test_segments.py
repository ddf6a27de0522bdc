"""Serving nodes that contribute a DRAM segment to the pool (Mooncake's design): a
master and one storage node (tests/cluster.py), a prefill node and a decode node
each lending 8 MiB under its serving node id. The blocks a node publishes land on
its own segment first, so the master's prefix match names the serving node that
holds them; a tail no decode node consumed is swept after the prefill node's TTL."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvstore.client import Client
from kvstore.hashing import block_hashes
from kvstore.model import Engine
from kvstore.serving.client import ServingClient, make_spec
from kvstore.serving.config import ServingConfig, build_engine, namespace
from kvstore.serving.kv_io import object_keys
from kvstore.types import Tier
from tests.cluster import Cluster
from tests.serving.helpers import NodeProcess, start_nodes

pytestmark = pytest.mark.slow
SEGMENT = str(8 << 20)
TAIL_TTL_S = 3.0


def prompt(salt: int) -> tuple[int, ...]:
    return tuple((11 * i + salt) % 256 for i in range(60))  # 3 full blocks + 12-token tail


@dataclass
class Stack:
    cluster: Cluster
    client: ServingClient
    nodes: list[NodeProcess]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir: Path = tmp_path_factory.mktemp("segments")
    with Cluster(nodes=1, workdir=workdir, dram_bytes=8 << 20) as cluster:
        common = ("--master", cluster.address, "--transport", "shm", "--segment-bytes", SEGMENT)
        nodes = start_nodes(
            ("prefill_node", *common, "--node-id", "pre-a", "--tail-ttl-s", str(TAIL_TTL_S)),
            ("decode_node", *common, "--node-id", "dec-a", "--on-finish", "publish"),
        )
        client = ServingClient(prefill=nodes[0].address, decode=nodes[1].address, timeout_s=60)
        try:
            yield Stack(cluster, client, nodes)
        finally:
            client.close()
            for node in nodes:
                node.stop()


@pytest.fixture(scope="module")
def engine() -> Engine:
    return build_engine(ServingConfig())


def test_stats_name_the_node_and_its_segment(stack: Stack) -> None:
    pre, dec = stack.client.prefill_stats(), stack.client.decode_stats()
    assert (pre.node_id, pre.role, pre.pool_segment) == ("pre-a", "prefill", True)
    assert (dec.node_id, dec.role, dec.pool_segment) == ("dec-a", "decode", True)
    segments = {s.node_id for s in stack.cluster.stats().segments}
    assert {"pre-a", "dec-a"} <= segments


def test_prefill_blocks_land_on_the_prefill_nodes_segment(stack: Stack) -> None:
    pre = stack.client.prefill(make_spec("p1", prompt(1), 2))
    refs = [h.hex() for h in pre.handoff.block_hashes]
    assert len(refs) == 3
    for ref in refs:
        for key in object_keys(ref, 4, layered=True):
            assert stack.cluster.holders(key) == ["pre-a"]
    with Client(stack.cluster.address, transport="tcp") as pool:
        match = pool.match_prefix([f"{r}/L3" for r in refs])
    assert match.pool_length == 3
    assert match.matches == (("pre-a", Tier.DRAM, 3),)


def test_decode_reads_the_prefill_segment_and_publishes_on_its_own(
    stack: Stack, engine: Engine
) -> None:
    p = prompt(2)
    out = stack.client.disaggregated(make_spec("d1", p, 6))
    assert out.tokens == engine.generate(list(p), 6)
    # 60 prompt tokens + 5 fed back: a 4th full block, published by the decode node
    hashes = block_hashes([*p, *out.tokens[:5]], 16, namespace(ServingConfig()))
    assert [h.hex() for h in hashes[:3]] == [h.hex() for h in out.prefill.handoff.block_hashes]
    with Client(stack.cluster.address, transport="tcp") as pool:
        match = pool.match_prefix([f"{h.hex()}/L3" for h in hashes])
    assert match.pool_length == 4
    assert match.matches == (("pre-a", Tier.DRAM, 3),)  # dec-a holds the 4th only
    assert stack.cluster.holders(f"{hashes[3].hex()}/L3") == ["dec-a"]


def test_unconsumed_tail_is_swept_after_the_ttl(stack: Stack) -> None:
    pre = stack.client.prefill(make_spec("t1", prompt(3), 2))  # never decoded
    tail = object_keys(pre.handoff.tail_key, 4, layered=True)
    assert stack.cluster.holders(tail[0]) == ["pre-a"]
    stack.cluster.wait_stats(
        lambda _: all(stack.cluster.holders(k) == [] for k in tail), timeout_s=TAIL_TTL_S + 15
    )
    full = f"{pre.handoff.block_hashes[0].hex()}/L3"
    assert stack.cluster.holders(full) == ["pre-a"]  # the shared blocks stay
