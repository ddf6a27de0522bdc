"""The Conductor gRPC service against real processes: a master and a storage node
(tests/cluster.py), a prefill node lending a DRAM segment to the pool, a decode
node, a colocated node (the reference), a prefill node with another weight seed
(its pool keys differ: refused) and `python -m kvstore.conductor` in front of the
prefill and decode nodes. The
conductor is told nothing the nodes know (seed, batching, layers, local-prefill
limit): it reads their Stats."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from kvstore.conductor.profiles import DEFAULT_PROFILE, load_profile
from kvstore.conductor.registry import POLICIES
from kvstore.serving.client import ServingClient, make_spec
from kvstore.v1 import conductor_pb2 as cpb
from kvstore.v1 import conductor_pb2_grpc
from kvstore.v1 import serving_pb2 as spb
from tests.cluster import Cluster, _read_line, child_env, stop_process

pytestmark = pytest.mark.slow

START_S = 60.0
PROMPT = [(7 * i + 3) % 250 + 1 for i in range(40)]  # 2 full blocks of 16 + a tail of 8
LOCAL = 64  # the decode node prefills prompts up to this long itself


@dataclass
class Procs:
    """The serving processes and the conductor in front of them."""

    pool: Cluster
    prefill: str
    decode: str
    colocated: str
    odd_seed: str
    conductor: str
    procs: list[subprocess.Popen[bytes]]

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.conductor)


def spawn(args: list[str], ready: bytes, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start `python <args>`; its address, from its ready line."""
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, *args], stdout=subprocess.PIPE, stderr=err, env=child_env()
        )
    try:
        line = _read_line(proc, ready, START_S)
    except RuntimeError:
        stop_process(proc)
        raise RuntimeError(f"{args[:2]} did not start: {Cluster.log_tail(log)}") from None
    return proc, line.split()[-1].decode()


def node_args(kind: str, *extra: str) -> list[str]:
    return ["-m", kind, "--listen", "127.0.0.1:0", "--model", "tiny", "--torch-threads", "1",
            *extra]  # fmt: skip


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    work = tmp_path_factory.mktemp("conductor")
    started: list[subprocess.Popen[bytes]] = []
    with Cluster(workdir=work, nodes=1, dram_bytes=32 << 20) as pool:
        try:
            master = ["--master", pool.address]
            segment = ("--segment-bytes", str(8 << 20))  # its blocks land on its own DRAM
            pre, pre_addr = spawn(
                node_args("prefill_node", *master, *segment), b"prefill node", work / "p.log"
            )
            started.append(pre)
            dec_args = node_args("decode_node", *master, "--local-prefill-tokens", str(LOCAL))
            dec, dec_addr = spawn(dec_args, b"decode node", work / "d.log")
            started.append(dec)
            col, col_addr = spawn(
                node_args("decode_node", "--colocated"), b"colocated node", work / "c.log"
            )
            started.append(col)
            odd, odd_addr = spawn(
                node_args("prefill_node", *master, "--seed", "1"), b"prefill node", work / "o.log"
            )
            started.append(odd)
            args = ["-m", "kvstore.conductor", "--master", pool.address,
                    "--prefill", f"{pre_addr},{odd_addr}", "--decode", dec_addr]  # fmt: skip
            cond, cond_addr = spawn(args, b"conductor listening", work / "conductor.log")
            started.append(cond)
            yield Procs(pool, pre_addr, dec_addr, col_addr, odd_addr, cond_addr, started)
        finally:
            for proc in reversed(started):
                stop_process(proc)


def generate(
    channel: grpc.Channel, prompt: list[int] | str, max_tokens: int, **fields: object
) -> list[cpb.ConductorGenerateResponse]:
    stub = conductor_pb2_grpc.ConductorStub(channel)
    spec = make_spec(str(fields.pop("rid", "")), prompt, max_tokens)
    tenant = str(fields.pop("tenant", ""))
    metadata = (("kvstore-tenant", tenant),) if tenant else ()
    request = cpb.ConductorGenerateRequest(spec=spec, **fields)  # type: ignore[arg-type]
    return list(stub.Generate(request, timeout=60, metadata=metadata))


def tokens_of(messages: list[cpb.ConductorGenerateResponse]) -> list[int]:
    out: list[int] = []
    for m in messages:
        assert m.index == len(out)
        out.extend(m.token_ids)
    return out


def status(procs: Procs) -> cpb.ClusterStatusResponse:
    with procs.channel() as channel:
        stub = conductor_pb2_grpc.ConductorStub(channel)
        return stub.ClusterStatus(cpb.ClusterStatusRequest(), timeout=10)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll another process's state until `predicate` holds (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)  # polling other processes, not synchronising threads
    raise TimeoutError("condition not met in time")


def test_generate_streams_the_colocated_greedy_tokens(procs: Procs) -> None:
    with ServingClient(decode=procs.colocated) as ref:
        expected = ref.generate(make_spec("ref", PROMPT, 12)).tokens
    with procs.channel() as channel:
        first = generate(channel, PROMPT, 12, rid="g1")
        again = generate(channel, PROMPT, 12, rid="g2")
    assert len(expected) == 12
    assert tokens_of(first) == expected
    assert tokens_of(again) == expected
    place = first[0].placement
    nodes = {n.role: n.node_id for n in status(procs).nodes if n.healthy}
    assert (place.prefill_node, place.decode_node) == (nodes["prefill"], nodes["decode"])
    assert not place.local_prefill and place.policy == "cache_load"
    assert [m.finish_reason for m in first][-1] == spb.FINISH_REASON_LENGTH
    assert all(m.finish_reason == spb.FINISH_REASON_NONE for m in first[:-1])
    last = first[-1].timings
    assert last.prompt_tokens == 40 and last.cached_tokens == 0
    assert 0 < last.ttft_s <= last.total_s and last.decode.ttft_s > 0
    # the second run finds the 2 full blocks in the pool: the policy and the prefill see them,
    # in the prefill node's own segment (a local hit: the pool node is the serving node)
    assert again[0].placement.cached_blocks == 2
    assert (first[0].placement.source_node, again[0].placement.source_node) == (
        "",
        nodes["prefill"],
    )
    assert again[-1].timings.cached_tokens == 32


def test_a_tenant_matches_only_its_own_blocks(procs: Procs) -> None:
    """The pool holds this prompt's blocks (an untenanted run wrote them): tenant t1's
    first request matches none of them, its second its own; tenant t2 still none."""
    prompt = [(11 * i + 5) % 250 + 1 for i in range(40)]
    with procs.channel() as channel:
        generate(channel, prompt, 2, rid="t0")
        untenanted = generate(channel, prompt, 2, rid="t0b")[0].placement
        t1_first = generate(channel, prompt, 2, rid="t1a", tenant="t1")[0].placement
        t1_again = generate(channel, prompt, 2, rid="t1b", tenant="t1")[0].placement
        t2 = generate(channel, prompt, 2, rid="t2a", tenant="t2")[0].placement
    assert untenanted.cached_blocks == 2
    assert (t1_first.cached_blocks, t1_again.cached_blocks, t2.cached_blocks) == (0, 2, 0)


def test_prompt_text_is_tokenized_like_the_nodes_do(procs: Procs) -> None:
    with ServingClient(decode=procs.colocated) as ref:
        expected = ref.generate(make_spec("ref-t", "hello conductor", 5)).tokens
    with procs.channel() as channel:
        got = tokens_of(generate(channel, "hello conductor", 5, rid="t1"))
    assert got == expected


def test_conditional_prefills_on_the_decode_node_within_its_limit(procs: Procs) -> None:
    """Idle cluster, no objective: a local prefill is sooner (no KV move). Within the decode
    node's local-prefill limit it runs there (Generate); over it, on the prefill node."""
    long_prompt = PROMPT * 2  # 80 tokens > LOCAL
    with ServingClient(decode=procs.colocated) as ref:
        short_ref = ref.generate(make_spec("ref-s", PROMPT[:30], 6)).tokens
        long_ref = ref.generate(make_spec("ref-l", long_prompt, 6)).tokens
    nodes = {n.role: n.node_id for n in status(procs).nodes if n.healthy}
    with procs.channel() as channel:
        short = generate(channel, PROMPT[:30], 6, policy="conditional", rid="c1")
        long = generate(channel, long_prompt, 6, policy="conditional", rid="c2")
    assert tokens_of(short) == short_ref and tokens_of(long) == long_ref
    place = short[0].placement
    assert (place.policy, place.local_prefill) == ("conditional", True)
    assert place.prefill_node == place.decode_node == nodes["decode"]
    assert not short[-1].timings.HasField("prefill")  # no prefill node took part
    assert short[-1].timings.decode.prefill_s > 0
    place = long[0].placement
    assert not place.local_prefill
    assert (place.prefill_node, place.decode_node) == (nodes["prefill"], nodes["decode"])
    assert status(procs).local_prefills >= 1


def test_unknown_policy_is_invalid_argument_listing_valid_names(procs: Procs) -> None:
    with procs.channel() as channel, pytest.raises(grpc.RpcError) as err:
        generate(channel, PROMPT, 2, policy="fastest")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown policy 'fastest'" in err.value.details()
    assert all(name in err.value.details() for name in POLICIES)


def test_bad_requests_map_to_their_status(procs: Procs) -> None:
    stub = conductor_pb2_grpc.ConductorStub(channel := procs.channel())
    with channel:
        cases = {
            grpc.StatusCode.INVALID_ARGUMENT: make_spec("bad-0", PROMPT, 0),  # max_tokens 0
            grpc.StatusCode.NOT_FOUND: make_spec("bad-m", PROMPT, 2, model_id="small"),
        }
        for code, spec in cases.items():
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Generate(cpb.ConductorGenerateRequest(spec=spec), timeout=30))
            assert err.value.code() == code, err.value.details()
    assert "no serving node serves model 'small'" in err.value.details()


def test_impossible_objective_is_rejected_with_no_retry(procs: Procs) -> None:
    slo = cpb.Objectives(ttft_s=1e-9)
    with procs.channel() as channel, pytest.raises(grpc.RpcError) as err:
        generate(channel, PROMPT, 2, slo=slo)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "no retry helps" in err.value.details()
    assert "retry-after-ms" not in dict(err.value.trailing_metadata() or ())


def test_busy_decode_node_rejects_with_retry_after(procs: Procs) -> None:
    """With one stream in flight the predicted step of a batch of 2 misses a TBT objective
    that a batch of 1 meets: RESOURCE_EXHAUSTED with a retry hint in the trailers."""
    lat = load_profile(DEFAULT_PROFILE).latency
    alone = lat.decode_step_s(1, len(PROMPT))
    busy = lat.decode_step_s(2, 2 * len(PROMPT))
    assert busy > alone
    slo = cpb.Objectives(tbt_s=(alone + busy) / 2)
    stub = conductor_pb2_grpc.ConductorStub(channel := procs.channel())
    with channel:
        long = stub.Generate(
            cpb.ConductorGenerateRequest(spec=make_spec("long", PROMPT, 1500)), timeout=60
        )
        next(long)  # the first token: the stream is in flight on the decode node
        with pytest.raises(grpc.RpcError) as err:
            generate(channel, PROMPT, 4, slo=slo)
        long.cancel()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    hint = dict(err.value.trailing_metadata())["retry-after-ms"]
    assert int(hint) > 0 and "retry after" in err.value.details()
    with procs.channel() as channel:  # alone, the same objective is met
        assert len(tokens_of(generate(channel, PROMPT, 4, slo=slo))) == 4


def test_cancel_mid_stream_cancels_the_decode_node(procs: Procs) -> None:
    with ServingClient(decode=procs.decode) as node:
        failed_before = node.decode_stats().requests_failed
        with procs.channel() as channel:
            stub = conductor_pb2_grpc.ConductorStub(channel)
            stream = stub.Generate(
                cpb.ConductorGenerateRequest(spec=make_spec("cancel-me", PROMPT, 1500)), timeout=60
            )
            got = [next(stream), next(stream)]
            stream.cancel()
        assert [m.index for m in got] == [0, 1]
        wait_for(lambda: node.decode_stats().requests_failed == failed_before + 1)
        assert node.decode_stats().running == 0
    wait_for(lambda: all(n.inflight_decodes == 0 for n in status(procs).nodes))


def test_cluster_status_lists_nodes_and_policies(procs: Procs) -> None:
    got = status(procs)
    assert got.policy == "cache_load" and list(got.policies) == sorted(POLICIES)
    assert sorted((n.address, n.role, n.healthy) for n in got.nodes) == sorted(
        [(procs.prefill, "prefill", True), (procs.decode, "decode", True),
         (procs.odd_seed, "prefill", False)]
    )  # fmt: skip
    assert all(n.model_id == "tiny" and n.block_tokens == 16 for n in got.nodes)
    assert got.requests >= got.remote_prefills >= 2


def test_nodes_report_their_identity_and_queue(procs: Procs) -> None:
    """The conductor learns the identity from Stats: no flag told it the decode node's
    local-prefill limit (the conditional test relies on it) or the seed."""
    reports = {n.address: n.report for n in status(procs).nodes}
    dec, pre = reports[procs.decode], reports[procs.prefill]
    assert (dec.seed, dec.batch_invariant, dec.num_layers, dec.kv_objects) == (0, True, 4, "layer")
    assert (dec.role, dec.local_prefill_tokens, dec.block_tokens) == ("decode", LOCAL, 16)
    assert (pre.role, pre.seed, pre.local_prefill_tokens) == ("prefill", 0, 0)
    assert pre.pool_segment and not dec.pool_segment  # only the prefill node lends DRAM
    with ServingClient(prefill=procs.prefill) as node:  # now (a report may be 1 refresh old)
        now = node.prefill_stats()
    assert (now.waiting, now.waiting_tokens, now.running) == (0, 0, 0)
    assert now.requests_done >= 2
    assert dec.total_blocks == 512 and dec.free_blocks <= 512
    assert reports[procs.odd_seed].seed == 1


def test_node_with_other_pool_keys_is_refused_and_never_placed(procs: Procs) -> None:
    (odd,) = [n for n in status(procs).nodes if n.address == procs.odd_seed]
    assert not odd.healthy
    assert odd.error == (
        f"{procs.odd_seed} refused: its pool keys would differ from {procs.prefill}'s "
        "(model 'tiny'): seed 1 != 0"
    )
    with procs.channel() as channel:
        placed = {generate(channel, PROMPT, 1, rid=f"o{i}")[0].placement.prefill_node
                  for i in range(3)}  # fmt: skip
    assert odd.node_id not in placed


def test_stated_seed_that_no_node_has_refuses_them_all(procs: Procs, tmp_path: Path) -> None:
    args = ["-m", "kvstore.conductor", "--prefill", procs.prefill, "--decode", procs.decode,
            "--seed", "1"]  # fmt: skip
    proc, address = spawn(args, b"conductor listening", tmp_path / "s.log")
    try:
        with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as err:
            generate(channel, PROMPT, 2)
    finally:
        stop_process(proc)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert f"{procs.prefill} refused: its pool keys would differ: seed 0 (told 1)" in (
        err.value.details()
    )


def test_empty_cluster_is_a_clear_error(tmp_path: Path) -> None:
    proc, address = spawn(["-m", "kvstore.conductor"], b"conductor listening", tmp_path / "e.log")
    try:
        with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as err:
            generate(channel, PROMPT, 2)
    finally:
        stop_process(proc)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "empty cluster" in err.value.details()


def test_unknown_policy_flag_exits_naming_valid_policies() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvstore.conductor", "--policy", "fastest"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert out.returncode == 2
    assert "unknown policy 'fastest'" in out.stderr and "cache_load" in out.stderr
