"""Node processes over gRPC without a pool: the colocated baseline, request errors
as status codes, cancelled streams, Stats and health."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvstore.errors import BadRequestError, NotFoundError
from kvstore.model import Engine
from kvstore.serving.client import AsyncServingClient, Generation, ServingClient, make_spec
from kvstore.serving.config import ServingConfig, build_engine
from kvstore.v1 import serving_pb2 as pb
from tests.serving.helpers import NodeProcess, start_nodes

pytestmark = pytest.mark.slow  # node processes boot in 5-20 s on the loaded 2-core box
PROMPT = [(7 * i + 3) % 256 for i in range(60)]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return build_engine(ServingConfig())


@pytest.fixture(scope="module")
def booted() -> Iterator[list[NodeProcess]]:
    """A colocated node and a decode node (local prefill up to 32 tokens), booted together."""
    nodes = start_nodes(
        ("decode_node", "--colocated", "--num-blocks", "64", "--chunk-tokens", "32"),
        ("decode_node", "--local-prefill-tokens", "32", "--num-blocks", "64"),
    )
    yield nodes
    for node in nodes:
        node.stop()


@pytest.fixture(scope="module")
def colocated(booted: list[NodeProcess]) -> NodeProcess:
    return booted[0]


@pytest.fixture(scope="module")
def decode_only(booted: list[NodeProcess]) -> NodeProcess:
    return booted[1]


def test_colocated_matches_the_reference_engine(colocated: NodeProcess, engine: Engine) -> None:
    expected = engine.generate(PROMPT, 8)
    with ServingClient(decode=colocated.address) as client:
        out = client.generate(make_spec("a", PROMPT, 8))
        text = client.generate(make_spec("t", "hello", 3))
        stats = client.decode_stats()
    assert out.tokens == expected and out.finish_reason == pb.FINISH_REASON_LENGTH
    assert len(out.token_times_s) == 8 and out.token_times_s == sorted(out.token_times_s)
    assert out.timings is not None and out.timings.prefill_s > 0
    assert out.timings.ttft_s == pytest.approx(out.token_times_s[0], abs=1e-3)
    assert text.tokens == engine.generate([256, *b"hello"], 3)
    summary = (stats.role, stats.model_id, stats.free_blocks, stats.total_blocks)
    assert summary == ("colocated", "tiny", 64, 64)


def test_stop_token_ends_the_stream(colocated: NodeProcess, engine: Engine) -> None:
    expected = engine.generate(PROMPT, 8)
    with ServingClient(decode=colocated.address) as client:
        out = client.generate(make_spec("s", PROMPT, 8, stop_token_ids=[expected[3]]))
    first_stop = expected.index(expected[3])
    assert out.tokens == expected[: first_stop + 1]
    assert out.finish_reason == pb.FINISH_REASON_STOP


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        (make_spec("m", PROMPT, 4, model_id="llama-70b"), NotFoundError, "unknown model id"),
        (make_spec("e", [], 4), BadRequestError, "empty prompt"),
        (make_spec("l", [1] * 2048, 4), BadRequestError, "context"),
        (make_spec("z", PROMPT, 0), BadRequestError, "max_tokens"),
    ],
)
def test_bad_requests_get_clear_status(
    colocated: NodeProcess, spec: pb.GenerationSpec, error: type, match: str
) -> None:
    with ServingClient(decode=colocated.address) as client, pytest.raises(error, match=match):
        client.generate(spec)


def test_decode_node_prefills_only_short_prompts(decode_only: NodeProcess, engine: Engine) -> None:
    with ServingClient(decode=decode_only.address) as client:
        short = client.generate(make_spec("s", PROMPT[:32], 3))
        with pytest.raises(BadRequestError, match="local-prefill limit of 32"):
            client.generate(make_spec("l", PROMPT[:33], 3))
    assert short.tokens == engine.generate(PROMPT[:32], 3)


def test_cancelled_stream_frees_its_blocks(colocated: NodeProcess) -> None:
    with ServingClient(decode=colocated.address) as client:
        stream = client.generate_stream(make_spec("c", PROMPT, 900))
        first = next(stream)
        assert first.index == 0
        stream.cancel()
        with pytest.raises(grpc.RpcError) as info:
            list(stream)
        assert info.value.code() == grpc.StatusCode.CANCELLED
        freed = threading.Event()
        for _ in range(200):  # bounded: the node frees the blocks at its next iteration
            stats = client.decode_stats()
            if stats.free_blocks == stats.total_blocks and stats.running == 0:
                freed.set()
                break
            freed.wait(0.05)
        assert freed.is_set(), f"blocks not freed: {stats}"


def test_health_reports_serving(colocated: NodeProcess) -> None:
    with grpc.insecure_channel(colocated.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service="kvstore.v1.DecodeService"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_concurrent_streams_share_the_batch(colocated: NodeProcess, engine: Engine) -> None:
    prompts = [PROMPT[:20], PROMPT[5:40], PROMPT[30:47]]

    async def run() -> list[Generation]:
        async with AsyncServingClient(decode=colocated.address) as client:
            before = (await client.decode_stats()).steps
            outs = await asyncio.gather(
                *(client.generate(make_spec(f"c{i}", p, 12)) for i, p in enumerate(prompts))
            )
            steps = (await client.decode_stats()).steps - before
        assert steps < 3 * 11  # the three sequences shared decode steps
        return list(outs)

    outs = asyncio.run(run())
    assert [o.tokens for o in outs] == [engine.generate(p, 12) for p in prompts]
