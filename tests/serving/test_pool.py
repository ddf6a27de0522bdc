"""Token identity across processes through the pool: a master and one storage node
(DRAM-only or SSD-only segment) as real processes, a prefill node and a decode node
process per transport (shm, tcp, nixl when installed). Every output must equal colocated generation
(`Engine.generate`, which the colocated node reproduces: test_nodes.py), for
(b) a cold prompt, (c)/(d) a second prompt whose prefix is served from the DRAM /
SSD segment, a fully cached prompt, a prompt whose blocks were removed
(recomputed), and a next turn that reuses blocks the decode node published
(on_finish=publish). All nodes run batch_invariant (the default), which makes KV
bytes independent of chunking and batching."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from kvstore.client import Client
from kvstore.errors import NotFoundError
from kvstore.model import Engine
from kvstore.serving.client import ServingClient, make_spec
from kvstore.serving.config import ServingConfig, build_engine
from kvstore.serving.kv_io import object_keys
from kvstore.serving.prefill import PrefillWorker
from kvstore.serving.request import Request
from kvstore.serving.scheduler import DecodeScheduler
from kvstore.serving.store import PoolBlockStore
from kvstore.transfer.nixl import nixl_available
from kvstore.types import Tier
from tests.cluster import Cluster
from tests.serving.helpers import start_nodes, submit

pytestmark = pytest.mark.slow
# An SSD segment is a file, not shared memory: a client forced to shm cannot map it
# (INVALID_ARGUMENT "cannot be mapped from this host"), so SSD runs over tcp only.
# NIXL: storage nodes serve their DRAM segment (not SSD) by NIXL when it is installed.
# (tier, transport, kv objects): per-(block, layer) objects everywhere, per-block once.
STACKS = [
    ("dram", "shm", "layer"),
    ("dram", "tcp", "layer"),
    ("ssd", "tcp", "layer"),
    ("dram", "shm", "block"),
    ("dram", "nixl", "layer"),
]
NEEDS_NIXL = pytest.mark.skipif(not nixl_available(), reason="NIXL not installed")
PARAMS = [
    pytest.param(s, id="-".join(s), marks=NEEDS_NIXL if s[1] == "nixl" else ()) for s in STACKS
]
TIERS = {"dram": Tier.DRAM, "ssd": Tier.SSD}


def prompt_a(salt: int) -> tuple[int, ...]:
    return tuple((7 * i + 3 + salt) % 256 for i in range(60))  # 3 full blocks + 12-token tail


def prompt_b(salt: int) -> tuple[int, ...]:
    return prompt_a(salt)[:48] + tuple((5 * i + salt) % 256 for i in range(8))  # shares 3


@pytest.fixture(scope="module")
def engine() -> Engine:
    return build_engine(ServingConfig())


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Cluster]]:
    """One pool per tier, started on first use: a DRAM-only or an SSD-only storage node."""
    started: dict[str, Cluster] = {}

    def get(tier: str) -> Cluster:
        if tier not in started:
            ssd = 0 if tier == "dram" else 16 << 20
            sizes = {"dram_bytes": (16 << 20) - ssd, "ssd_bytes": ssd}
            workdir = tmp_path_factory.mktemp(f"pool-{tier}")
            nixl = nixl_available()  # the nixl transport case reads the DRAM node by NIXL
            started[tier] = Cluster(nodes=1, workdir=workdir, nixl=nixl, **sizes).start()
        return started[tier]

    yield get
    for c in started.values():
        c.close()


@pytest.fixture(scope="module", params=PARAMS)
def stack(
    clusters: Callable[[str], Cluster], request: pytest.FixtureRequest
) -> Iterator[dict[str, Any]]:
    tier, transport, kv_objects = request.param
    cluster = clusters(tier)
    common = ("--master", cluster.address, "--transport", transport)
    prefill, decode = start_nodes(
        ("prefill_node", *common, "--chunk-tokens", "32", "--kv-objects", kv_objects),
        ("decode_node", *common, "--on-finish", "publish"),
    )
    client = ServingClient(prefill=prefill.address, decode=decode.address, timeout_s=60.0)
    salt = 1 + STACKS.index(request.param)  # fresh prompts per stack: nothing cached yet
    yield {
        "cluster": cluster,
        "client": client,
        "salt": salt,
        "transport": transport,
        "tier": TIERS[tier],
        "layered": kv_objects == "layer",
    }
    client.close()
    prefill.stop()
    decode.stop()


def test_disaggregated_and_cached_prefixes_match_colocated(
    stack: dict[str, Any], engine: Engine
) -> None:
    client, cluster, salt = stack["client"], stack["cluster"], stack["salt"]
    a, b = prompt_a(salt), prompt_b(salt)
    want_a, want_b = engine.generate(list(a), 6), engine.generate(list(b), 6)
    cold = client.disaggregated(make_spec("a1", a, 6))
    assert cold.tokens == want_a and cold.prefill.cached_tokens == 0
    assert cold.timings.pulled_bytes == 4 * 4 * 8192 and not cold.timings.recomputed
    tail = object_keys(cold.prefill.handoff.tail_key, 4, stack["layered"])[0]
    assert cluster.holders(tail) == []  # the decode node removed the request-scoped tail
    shared = client.disaggregated(make_spec("b1", b, 6))  # (c)/(d): prefix from the segment
    assert shared.tokens == want_b and shared.prefill.cached_tokens == 48
    again = client.disaggregated(make_spec("a2", a, 6))
    assert again.tokens == want_a and again.prefill.cached_tokens == 48
    (segment,) = cluster.stats().segments
    assert segment.tier == int(stack["tier"]) and segment.hits > 0


def test_next_turn_finds_the_blocks_decode_published(stack: dict[str, Any], engine: Engine) -> None:
    client, salt = stack["client"], stack["salt"]
    first = prompt_a(salt + 300)  # 60 tokens; 6 new ones make 65 positions: 4 full blocks
    out = client.disaggregated(make_spec("t1", first, 6))
    follow_up = (*first, *out.tokens, 1, 2, 3, 4)
    turn2 = client.disaggregated(make_spec("t2", follow_up, 4))
    assert turn2.prefill.cached_tokens == 64  # 3 blocks from prefill, the 4th from decode
    assert turn2.tokens == engine.generate(list(follow_up), 4)


def test_removed_blocks_are_recomputed(stack: dict[str, Any], engine: Engine) -> None:
    client, cluster, salt = stack["client"], stack["cluster"], stack["salt"]
    c = prompt_a(salt + 100)
    spec = make_spec("c", c, 5)
    pre = client.prefill(spec)
    key = object_keys(pre.handoff.block_hashes[1].hex(), 4, stack["layered"])[-1]
    with Client(cluster.address, transport=stack["transport"]) as pool:
        assert pool.remove(key, force=True)
    out = client.decode(spec, pre)
    assert out.tokens == engine.generate(list(c), 5) and out.timings.recomputed


def test_cancelled_decode_releases_blocks_and_tail(stack: dict[str, Any]) -> None:
    client, cluster, salt = stack["client"], stack["cluster"], stack["salt"]
    spec = make_spec("x", prompt_a(salt + 200), 400)
    pre = client.prefill(spec)
    stream = client.decode_stream(spec, pre)
    assert next(stream).index == 0
    stream.cancel()
    with pytest.raises(grpc.RpcError):
        list(stream)
    stats = client.decode_stats()
    for _ in range(200):  # bounded poll of another process
        if stats.free_blocks == stats.total_blocks:
            break
        cluster.wait_stats(lambda s: True, timeout_s=1.0)
        stats = client.decode_stats()
    assert stats.free_blocks == stats.total_blocks and stats.running == 0
    assert cluster.holders(object_keys(pre.handoff.tail_key, 4, stack["layered"])[0]) == []


def test_unknown_model_is_not_found(stack: dict[str, Any]) -> None:
    with pytest.raises(NotFoundError, match="unknown model id"):
        stack["client"].prefill(make_spec("m", (1, 2, 3), 2, model_id="nope"))


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_storage_node_gone_recompute_or_fail_in_bounded_time(
    tmp_path: Path, engine: Engine, policy: str
) -> None:
    """In-process prefill and decode over the pool client; the only storage node is
    SIGKILLed between prefill and decode."""
    config = ServingConfig(num_blocks=32, on_missing=policy)
    with Cluster(nodes=1, workdir=tmp_path) as cluster:
        store = PoolBlockStore.connect(cluster.address, transport="tcp", timeout_s=3.0)
        prefill, decode = (
            PrefillWorker(config, engine, store),
            DecodeScheduler(config, engine, store),
        )
        try:
            req = Request("gone", prompt_a(77), 5)
            pre = prefill.prefill(req)
            cluster.kill_node(0)
            start = time.monotonic()
            out = submit(decode, req, pre)[1].wait(30.0)
            assert time.monotonic() - start < 20.0
            if policy == "recompute":
                assert out.tokens == engine.generate(list(req.prompt), 5)
                assert out.timings.recomputed
            else:
                assert out.tokens == [] and isinstance(out.events[-1].error, NotFoundError)
            assert decode.wait_idle(5.0) and decode.stats().free_blocks == 32
        finally:
            decode.stop()
            prefill.close()
            store.close()
