"""The load generator: sends scheduled requests to serving nodes over grpc.aio and
records, per request, the client time of every token and the nodes' timing fields.

Two targets, same interface (`await target.run(arrival) -> RequestRecord`):

    ColocatedTarget   Generate on colocated nodes, round-robin
    DisaggTarget      Prefill on the prefill node, then Decode on the decode node
                      with the returned KV handoff (the first token streams back
                      from the decode node, as the user would see it)

It uses little CPU (a few messages per token), so it can share a core with the
nodes under test. Sleeping until an arrival's time is the schedule, not a wait
on an event.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

import grpc

from kvstore import edge
from kvstore.serving_bench.metrics import RequestRecord
from kvstore.serving_bench.workload import Arrival
from kvstore.v1 import serving_pb2, serving_pb2_grpc


class Target(Protocol):
    async def run(self, arrival: Arrival) -> RequestRecord: ...

    async def close(self) -> None: ...


def _spec(arrival: Arrival, model_id: str) -> serving_pb2.GenerationSpec:
    return serving_pb2.GenerationSpec(
        request_id=arrival.request_id,
        model_id=model_id,
        prompt_token_ids=list(arrival.prompt),
        sampling=serving_pb2.SamplingOptions(temperature=0.0),
        max_tokens=arrival.max_tokens,
    )


def _channel(address: str) -> grpc.aio.Channel:
    return edge.aio_channel(address)


def _new_record(arrival: Arrival) -> RequestRecord:
    return RequestRecord(arrival.request_id, arrival.kind, len(arrival.prompt), time.perf_counter())


async def _read_stream(
    stream: AsyncIterator[serving_pb2.TokenChunk], record: RequestRecord
) -> serving_pb2.DecodeTimings | None:
    """Record every chunk's tokens; return the timings of the first chunk."""
    timings = None
    async for chunk in stream:
        record.add_chunk(time.perf_counter(), chunk.token_ids, chunk.token_times_s)
        if chunk.HasField("timings") and timings is None:
            timings = chunk.timings
    return timings


def _rpc_error(exc: grpc.aio.AioRpcError) -> str:
    return f"{exc.code().name}: {exc.details()}"


class ColocatedTarget:
    """Generate on colocated nodes, one after the other (round-robin)."""

    def __init__(self, addresses: Sequence[str], model_id: str, timeout_s: float = 120.0) -> None:
        self.channels = [_channel(a) for a in addresses]
        stubs = [serving_pb2_grpc.DecodeServiceStub(c) for c in self.channels]
        self._next = itertools.cycle(stubs).__next__
        self.model_id = model_id
        self.timeout_s = timeout_s

    async def run(self, arrival: Arrival) -> RequestRecord:
        record = _new_record(arrival)
        request = serving_pb2.GenerateRequest(spec=_spec(arrival, self.model_id))
        try:
            timings = await _read_stream(
                self._next().Generate(request, timeout=self.timeout_s), record
            )
        except grpc.aio.AioRpcError as exc:
            record.error = _rpc_error(exc)
            return record
        if timings is not None:
            record.compute_s = timings.prefill_s
            record.node_queue_s = timings.queue_s
        return record

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.channels))


class DisaggTarget:
    """Prefill on one node, Decode on another with the KV handoff."""

    def __init__(self, prefill: str, decode: str, model_id: str, timeout_s: float = 120.0) -> None:
        self.channels = [_channel(prefill), _channel(decode)]
        self.prefill = serving_pb2_grpc.PrefillServiceStub(self.channels[0])
        self.decode = serving_pb2_grpc.DecodeServiceStub(self.channels[1])
        self.model_id = model_id
        self.timeout_s = timeout_s

    async def run(self, arrival: Arrival) -> RequestRecord:
        record = _new_record(arrival)
        spec = _spec(arrival, self.model_id)
        try:
            done = await self.prefill.Prefill(
                serving_pb2.PrefillRequest(spec=spec), timeout=self.timeout_s
            )
            record.prefill_done_s = time.perf_counter()
            _take_prefill(record, done)
            request = serving_pb2.DecodeRequest(
                spec=spec, first_token=done.first_token, handoff=done.handoff
            )
            timings = await _read_stream(
                self.decode.Decode(request, timeout=self.timeout_s), record
            )
        except grpc.aio.AioRpcError as exc:
            record.error = _rpc_error(exc)
            return record
        if timings is not None:
            record.pull_s = timings.pull_s
            record.pulled_bytes = timings.pulled_bytes
        return record

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.channels))


def _take_prefill(record: RequestRecord, done: serving_pb2.PrefillResponse) -> None:
    t = done.timings
    record.cached_tokens = done.cached_tokens
    record.node_queue_s = t.queue_s
    record.compute_s = t.compute_s
    record.publish_s = t.publish_s
    record.publish_wait_s = t.publish_wait_s
    record.kv_bytes = t.published_bytes


async def drive(
    arrivals: Sequence[Arrival],
    target: Target,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> list[RequestRecord]:
    """Send each arrival at its time (relative to now); records in arrival order."""
    start = time.perf_counter()

    async def one(arrival: Arrival) -> RequestRecord:
        record = await target.run(arrival)
        if on_done is not None:
            on_done(record)
        return record

    tasks = []
    for arrival in arrivals:
        delay = start + arrival.at_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(arrival)))
    return list(await asyncio.gather(*tasks))
