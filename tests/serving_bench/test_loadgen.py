"""The load generator against scripted gRPC services on real 127.0.0.1 sockets.

The services stand in for the nodes only to pin down what the client records: the
token stream, the timing fields it copies, round-robin order and failed requests.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from kvstore.serving_bench.loadgen import ColocatedTarget, DisaggTarget, drive
from kvstore.serving_bench.workload import Arrival
from kvstore.v1 import serving_pb2, serving_pb2_grpc

HANDOFF = serving_pb2.KVHandoff(block_tokens=16, num_layers=2, block_hashes=[b"h1"])


class ScriptedDecode(serving_pb2_grpc.DecodeServiceServicer):
    def __init__(self) -> None:
        self.seen: list[str] = []
        self.handoffs: list[serving_pb2.KVHandoff] = []

    def _chunks(self, spec: serving_pb2.GenerationSpec, first: int) -> list[serving_pb2.TokenChunk]:
        self.seen.append(spec.request_id)
        timings = serving_pb2.DecodeTimings(prefill_s=0.25, pull_s=0.125)
        return [
            serving_pb2.TokenChunk(index=0, token_ids=[first], token_times_s=[0.01],
                                   timings=timings),
            serving_pb2.TokenChunk(index=1, token_ids=[7, 8], token_times_s=[0.02, 0.03],
                                   finish_reason=serving_pb2.FINISH_REASON_LENGTH),
        ]  # fmt: skip

    async def Generate(self, request, context):  # type: ignore[no-untyped-def]
        if request.spec.request_id == "bad":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "no room")
        for chunk in self._chunks(request.spec, 5):
            yield chunk

    async def Decode(self, request, context):  # type: ignore[no-untyped-def]
        self.handoffs.append(request.handoff)
        for chunk in self._chunks(request.spec, request.first_token):
            yield chunk


class ScriptedPrefill(serving_pb2_grpc.PrefillServiceServicer):
    async def Prefill(self, request, context):  # type: ignore[no-untyped-def]
        timings = serving_pb2.PrefillTimings(
            compute_s=1.0, publish_s=0.0625, publish_wait_s=0.03125, published_bytes=65536
        )
        return serving_pb2.PrefillResponse(
            request_id=request.spec.request_id, first_token=42, cached_tokens=16,
            handoff=HANDOFF, timings=timings,
        )  # fmt: skip


async def _serve(*servicers: object) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    for s in servicers:
        if isinstance(s, ScriptedDecode):
            serving_pb2_grpc.add_DecodeServiceServicer_to_server(s, server)
        else:
            serving_pb2_grpc.add_PrefillServiceServicer_to_server(s, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def _arrival(rid: str, at_s: float = 0.0) -> Arrival:
    return Arrival(at_s, rid, "stream", (1, 2, 3), 3)


def test_colocated_round_robin_and_timings() -> None:
    async def main() -> None:
        a, b = ScriptedDecode(), ScriptedDecode()
        (sa, addr_a), (sb, addr_b) = await _serve(a), await _serve(b)
        target = ColocatedTarget([addr_a, addr_b], "tiny")
        done: list[str] = []
        try:
            arrivals = [_arrival(f"r{i}", 0.01 * i) for i in range(4)]
            records = await drive(arrivals, target, on_done=lambda r: done.append(r.request_id))
        finally:
            await target.close()
            await sa.stop(None)
            await sb.stop(None)
        assert (a.seen, b.seen) == (["r0", "r2"], ["r1", "r3"])
        assert sorted(done) == ["r0", "r1", "r2", "r3"]
        for r in records:
            assert r.ok and r.tokens == [5, 7, 8]
            assert r.compute_s == 0.25 and r.kv_bytes == 0 and r.prefill_done_s is None
            assert r.tbt_s() == pytest.approx([0.01, 0.01], abs=0.05)
            assert r.ttft_s > 0

    asyncio.run(main())


def test_disagg_passes_the_handoff_and_copies_timings() -> None:
    async def main() -> None:
        decode, prefill = ScriptedDecode(), ScriptedPrefill()
        (sd, addr_d), (sp, addr_p) = await _serve(decode), await _serve(prefill)
        target = DisaggTarget(addr_p, addr_d, "tiny")
        try:
            [r] = await drive([_arrival("d0")], target)
        finally:
            await target.close()
            await sd.stop(None)
            await sp.stop(None)
        assert decode.handoffs == [HANDOFF]
        assert r.ok and r.tokens == [42, 7, 8] and r.cached_tokens == 16
        assert (r.compute_s, r.publish_s, r.publish_wait_s) == (1.0, 0.0625, 0.03125)
        assert (r.pull_s, r.kv_bytes) == (0.125, 65536)
        assert r.prefill_done_s is not None and r.sent_s < r.prefill_done_s <= r.token_s[0]

    asyncio.run(main())


def test_failed_rpc_is_recorded_not_raised() -> None:
    async def main() -> None:
        decode = ScriptedDecode()
        server, addr = await _serve(decode)
        target = ColocatedTarget([addr], "tiny")
        try:
            [r] = await drive([_arrival("bad")], target)
        finally:
            await target.close()
            await server.stop(None)
        assert not r.ok and r.error == "RESOURCE_EXHAUSTED: no room"

    asyncio.run(main())
