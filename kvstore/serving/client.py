"""A small synchronous client of the serving nodes (tests, benches, demos).

    c = ServingClient(prefill="127.0.0.1:7001", decode="127.0.0.1:7002")
    out = c.disaggregated(make_spec("r1", prompt, max_tokens=32))   # Prefill, then Decode
    out = ServingClient(decode=colocated_addr).generate(spec)        # colocated baseline
    out.tokens, out.prefill.timings, out.timings, out.token_times_s
    async with AsyncServingClient(prefill=..., decode=...) as c:      # same, on grpc.aio
        out = await c.disaggregated(spec)

Failed RPCs raise the matching kvstore error (kvstore.rpc_errors).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from kvstore import edge
from kvstore.errors import BadRequestError
from kvstore.rpc_errors import raise_from_rpc_error
from kvstore.v1 import serving_pb2 as pb
from kvstore.v1 import serving_pb2_grpc


def make_spec(
    request_id: str,
    prompt: Sequence[int] | str,
    max_tokens: int,
    *,
    model_id: str = "tiny",
    temperature: float = 0.0,
    seed: int = 0,
    stop_token_ids: Sequence[int] = (),
    tenant: str = "",
) -> pb.GenerationSpec:
    spec = pb.GenerationSpec(
        request_id=request_id,
        model_id=model_id,
        max_tokens=max_tokens,
        sampling=pb.SamplingOptions(temperature=temperature, top_p=1.0, seed=seed),
        stop_token_ids=list(stop_token_ids),
        tenant=tenant,
    )
    if isinstance(prompt, str):
        spec.prompt_text = prompt
    else:
        spec.prompt_token_ids.extend(prompt)
    return spec


@dataclass(slots=True)
class Generation:
    """A finished stream: new tokens, when each arrived, and the nodes' timings."""

    tokens: list[int] = field(default_factory=list)
    token_times_s: list[float] = field(default_factory=list)
    finish_reason: int = pb.FINISH_REASON_NONE
    timings: pb.DecodeTimings | None = None
    prefill: pb.PrefillResponse | None = None


class ServingClient:
    """Stubs for a prefill node and/or a decode (or colocated) node."""

    def __init__(self, prefill: str = "", decode: str = "", timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self._channels: list[grpc.Channel] = []
        self._prefill = (
            serving_pb2_grpc.PrefillServiceStub(self._channel(prefill)) if prefill else None
        )
        self._decode = serving_pb2_grpc.DecodeServiceStub(self._channel(decode)) if decode else None

    def _channel(self, address: str) -> grpc.Channel:
        channel = edge.sync_channel(address)
        self._channels.append(channel)
        return channel

    def prefill(self, spec: pb.GenerationSpec) -> pb.PrefillResponse:
        if self._prefill is None:
            raise BadRequestError("no prefill node configured")
        try:
            return self._prefill.Prefill(pb.PrefillRequest(spec=spec), timeout=self.timeout_s)
        except grpc.RpcError as err:
            raise_from_rpc_error(err)

    def decode_stream(self, spec: pb.GenerationSpec, pre: pb.PrefillResponse) -> grpc.Call:
        """The raw Decode stream (iterate it; `.cancel()` it to stop early)."""
        return self._decode_stub().Decode(decode_request(spec, pre), timeout=self.timeout_s)

    def generate_stream(self, spec: pb.GenerationSpec) -> grpc.Call:
        return self._decode_stub().Generate(pb.GenerateRequest(spec=spec), timeout=self.timeout_s)

    def decode(self, spec: pb.GenerationSpec, pre: pb.PrefillResponse) -> Generation:
        out = collect(self.decode_stream(spec, pre))
        out.prefill = pre
        return out

    def generate(self, spec: pb.GenerationSpec) -> Generation:
        return collect(self.generate_stream(spec))

    def disaggregated(self, spec: pb.GenerationSpec) -> Generation:
        return self.decode(spec, self.prefill(spec))

    def prefill_stats(self) -> pb.ServingStatsResponse:
        assert self._prefill is not None
        return self._prefill.Stats(pb.ServingStatsRequest(), timeout=self.timeout_s)

    def decode_stats(self) -> pb.ServingStatsResponse:
        return self._decode_stub().Stats(pb.ServingStatsRequest(), timeout=self.timeout_s)

    def _decode_stub(self) -> serving_pb2_grpc.DecodeServiceStub:
        if self._decode is None:
            raise BadRequestError("no decode node configured")
        return self._decode

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> ServingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def decode_request(spec: pb.GenerationSpec, pre: pb.PrefillResponse) -> pb.DecodeRequest:
    """The Decode call for a prefilled spec: the prompt as the prefill node tokenized it."""
    request = pb.DecodeRequest(spec=spec, first_token=pre.first_token, handoff=pre.handoff)
    request.spec.prompt_text = ""
    del request.spec.prompt_token_ids[:]
    request.spec.prompt_token_ids.extend(pre.prompt_token_ids)
    return request


def _add(out: Generation, chunk: pb.TokenChunk) -> None:
    if chunk.HasField("timings"):
        out.timings = chunk.timings
    out.tokens.extend(chunk.token_ids)
    out.token_times_s.extend(chunk.token_times_s)
    out.finish_reason = chunk.finish_reason


def collect(stream: Iterator[pb.TokenChunk]) -> Generation:
    """Read a token stream to its end."""
    out = Generation()
    try:
        for chunk in stream:
            _add(out, chunk)
    except grpc.RpcError as err:
        raise_from_rpc_error(err)
    return out


async def collect_async(stream: AsyncIterator[pb.TokenChunk]) -> Generation:
    """Read a grpc.aio token stream to its end."""
    out = Generation()
    try:
        async for chunk in stream:
            _add(out, chunk)
    except grpc.RpcError as err:
        raise_from_rpc_error(err)
    return out


class AsyncServingClient:
    """`ServingClient` on grpc.aio, for many concurrent requests from one event loop."""

    def __init__(self, prefill: str = "", decode: str = "", timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self._channels: list[grpc.aio.Channel] = []
        self._prefill = (
            serving_pb2_grpc.PrefillServiceStub(self._channel(prefill)) if prefill else None
        )
        self._decode = serving_pb2_grpc.DecodeServiceStub(self._channel(decode)) if decode else None

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = edge.aio_channel(address)
        self._channels.append(channel)
        return channel

    async def prefill(self, spec: pb.GenerationSpec) -> pb.PrefillResponse:
        if self._prefill is None:
            raise BadRequestError("no prefill node configured")
        try:
            return await self._prefill.Prefill(pb.PrefillRequest(spec=spec), timeout=self.timeout_s)
        except grpc.RpcError as err:
            raise_from_rpc_error(err)

    def decode_stream(self, spec: pb.GenerationSpec, pre: pb.PrefillResponse) -> Any:
        """The raw Decode stream (`async for`; `.cancel()` to stop early)."""
        return self._decode_stub().Decode(decode_request(spec, pre), timeout=self.timeout_s)

    def generate_stream(self, spec: pb.GenerationSpec) -> Any:
        return self._decode_stub().Generate(pb.GenerateRequest(spec=spec), timeout=self.timeout_s)

    async def decode(self, spec: pb.GenerationSpec, pre: pb.PrefillResponse) -> Generation:
        out = await collect_async(self.decode_stream(spec, pre))
        out.prefill = pre
        return out

    async def generate(self, spec: pb.GenerationSpec) -> Generation:
        return await collect_async(self.generate_stream(spec))

    async def disaggregated(self, spec: pb.GenerationSpec) -> Generation:
        return await self.decode(spec, await self.prefill(spec))

    async def decode_stats(self) -> pb.ServingStatsResponse:
        return await self._decode_stub().Stats(pb.ServingStatsRequest(), timeout=self.timeout_s)

    def _decode_stub(self) -> serving_pb2_grpc.DecodeServiceStub:
        if self._decode is None:
            raise BadRequestError("no decode node configured")
        return self._decode

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()

    async def __aenter__(self) -> AsyncServingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
