"""Tenant byte isolation on kvstore's serving nodes: a request's tenant salts its block
hashes (`GenerationSpec.tenant` -> `kvstore.serving.config.namespace`), so a prefill
node never loads blocks another tenant's requests wrote, whoever asks the pool. Real
processes: a master and one DRAM storage node, a prefill and a decode node, and a
conductor that passes the caller's `kvstore-tenant` metadata on to the nodes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from kvstore.errors import BadRequestError
from kvstore.hashing import block_hashes
from kvstore.model import Engine
from kvstore.serving.client import ServingClient, make_spec
from kvstore.serving.config import ServingConfig, build_engine, namespace
from kvstore.serving.kv_io import object_keys
from kvstore.v1 import conductor_pb2 as cpb
from kvstore.v1 import conductor_pb2_grpc
from tests.cli.procs import run
from tests.cluster import Cluster
from tests.serving.helpers import ServiceProcess, start_nodes

pytestmark = pytest.mark.slow  # node processes boot in 5-20 s on the loaded 2-core box
CONFIG = ServingConfig()
PROMPT = tuple((13 * i + 7) % 256 for i in range(60))  # 3 full blocks + a 12-token tail


@dataclass
class Stack:
    pool: Cluster
    client: ServingClient
    conductor: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("tenants")
    with Cluster(workdir=work, nodes=1, dram_bytes=32 << 20) as pool:
        common = ("--master", pool.address, "--transport", "shm")
        prefill, decode = start_nodes(
            ("prefill_node", *common), ("decode_node", *common, "--on-finish", "publish")
        )
        conductor = ServiceProcess("kvstore.conductor", "--listen", "127.0.0.1:0", "--master",
                                   pool.address, "--prefill", prefill.address, "--decode",
                                   decode.address)  # fmt: skip
        client = ServingClient(prefill=prefill.address, decode=decode.address, timeout_s=60)
        try:
            yield Stack(pool, client, conductor.address)
        finally:
            client.close()
            conductor.stop()
            prefill.stop()
            decode.stop()


@pytest.fixture(scope="module")
def engine() -> Engine:
    return build_engine(CONFIG)


def _last_layer_keys(tenant: str, prompt: tuple[int, ...]) -> list[str]:
    hashes = block_hashes(prompt, CONFIG.block_tokens, namespace(CONFIG, tenant))
    return [object_keys(h.hex(), CONFIG.model.layers, True)[-1] for h in hashes]


def test_same_prompt_two_tenants_never_share_blocks(stack: Stack, engine: Engine) -> None:
    want = engine.generate(list(PROMPT), 4)
    run = stack.client.disaggregated
    a1 = run(make_spec("a1", PROMPT, 4, tenant="acme"))
    b1 = run(make_spec("b1", PROMPT, 4, tenant="globex"))  # the same prompt, another tenant
    a2 = run(make_spec("a2", PROMPT, 4, tenant="acme"))
    b2 = run(make_spec("b2", PROMPT, 4, tenant="globex"))
    shared = run(make_spec("n1", PROMPT, 4))  # no tenant: the unsalted space, also apart
    got = [(g.prefill.cached_tokens, g.tokens) for g in (a1, b1, a2, b2, shared)]
    assert got == [(0, want), (0, want), (48, want), (48, want), (0, want)]
    # both tenants' blocks are in the pool, under different keys
    acme, globex = _last_layer_keys("acme", PROMPT), _last_layer_keys("globex", PROMPT)
    assert not set(acme) & set(globex)
    assert all(stack.pool.holders(k) for k in acme + globex)


def test_next_turn_reuses_only_the_tenants_own_decode_blocks(stack: Stack, engine: Engine) -> None:
    first = tuple((3 * i + 1) % 256 for i in range(60))
    out = stack.client.disaggregated(make_spec("t1", first, 6, tenant="acme"))
    follow_up = (*first, *out.tokens, 9, 8, 7, 6)
    mine = stack.client.disaggregated(make_spec("t2", follow_up, 2, tenant="acme"))
    theirs = stack.client.disaggregated(make_spec("t3", follow_up, 2, tenant="globex"))
    assert mine.prefill.cached_tokens == 64  # 3 blocks from prefill, the 4th from decode
    assert theirs.prefill.cached_tokens == 0
    assert mine.tokens == theirs.tokens == engine.generate(list(follow_up), 2)


def _generate(address: str, prompt: tuple[int, ...], rid: str, tenant: str, spec_tenant: str = ""
              ) -> list[cpb.ConductorGenerateResponse]:  # fmt: skip
    spec = make_spec(rid, prompt, 2, tenant=spec_tenant)
    metadata = (("kvstore-tenant", tenant),) if tenant else ()
    with grpc.insecure_channel(address) as channel:
        stub = conductor_pb2_grpc.ConductorStub(channel)
        request = cpb.ConductorGenerateRequest(spec=spec)
        return list(stub.Generate(request, timeout=60, metadata=metadata))


def test_conductor_passes_the_callers_tenant_to_the_nodes(stack: Stack) -> None:
    """Through the conductor: the prefill node's own pool match (timings.cached_tokens,
    what it actually loaded) finds a tenant's blocks only for that tenant."""
    prompt = tuple((17 * i + 2) % 256 for i in range(40))  # 2 full blocks + 8
    first = _generate(stack.conductor, prompt, "c1", "initech")[-1].timings
    again = _generate(stack.conductor, prompt, "c2", "initech")[-1].timings
    other = _generate(stack.conductor, prompt, "c3", "umbrella")[-1].timings
    assert (first.cached_tokens, again.cached_tokens, other.cached_tokens) == (0, 32, 0)
    # a spec naming another tenant than the caller's metadata is refused
    with pytest.raises(grpc.RpcError) as err:
        _generate(stack.conductor, prompt, "c4", "initech", spec_tenant="umbrella")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_bad_tenant_is_refused_by_the_node(stack: Stack) -> None:
    with pytest.raises(BadRequestError, match="bad tenant"):
        stack.client.prefill(make_spec("x", PROMPT, 1, tenant="a/b"))


def test_lookup_finds_a_prompt_only_under_its_tenant(stack: Stack, tmp_path: Path) -> None:
    """`kvstore lookup --tenant` hashes as the nodes do for that tenant."""
    prompt = tuple((19 * i + 4) % 256 for i in range(40))
    stack.client.disaggregated(make_spec("l1", prompt, 1, tenant="hooli"))
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(" ".join(map(str, prompt)))
    found = {}
    for tenant in ("hooli", "pied-piper", ""):
        flags = ("--tenant", tenant) if tenant else ()
        res = run("lookup", "--tokens", str(tokens), "--conductor", stack.conductor,
                  "--master", stack.pool.address, "--json", *flags)  # fmt: skip
        assert res.returncode == 0, res.stderr
        found[tenant] = json.loads(res.stdout)["pool_tokens"]
    assert found == {"hooli": 32, "pied-piper": 0, "": 0}
