"""Talk to the conductor: send a prompt, get text (and token ids) back as it is made.

    with ConductorClient("127.0.0.1:7000", model="tiny") as c:
        reply = c.generate("Hello", max_tokens=32)          # Generation: text, ids, timings
        for chunk in c.stream("Hello", max_tokens=32):      # Chunk per relayed message
            print(chunk.text, end="", flush=True)

    async with AsyncConductorClient("127.0.0.1:7000") as c:
        reply = await c.generate("Hello")
        async for chunk in c.stream("Hello"): ...

`deadline_s` bounds the whole call (UnavailableError past it); errors are the
kvstore error tree (an early rejection is NoSpaceError whose message says "retry
after <s>s"). `tenant` travels as request metadata `kvstore-tenant` (the conductor
logs it; it names no pool keys yet). Text is decoded with the serving nodes' byte
tokenizer incrementally: a UTF-8 character split across two messages prints once whole.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from kvstore.edge import aio_channel, rpc_error, sync_channel
from kvstore.errors import BadRequestError
from kvstore.v1 import conductor_pb2 as cpb
from kvstore.v1 import conductor_pb2_grpc
from kvstore.v1 import serving_pb2 as spb

BYTE_VOCAB = 256  # ids below are bytes (kvstore.model.tokenizer); above, special tokens
TENANT_METADATA = "kvstore-tenant"


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling of the new tokens: temperature 0 is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.seed < 0:
            raise BadRequestError("need temperature >= 0, 0 < top_p <= 1, seed >= 0")


@dataclass(frozen=True, slots=True)
class Chunk:
    """One relayed message: new token ids, their text, and when they came."""

    token_ids: tuple[int, ...]
    text: str
    seconds: tuple[float, ...]  # since the call started, per token (client clock)
    placement: cpb.Placement | None = None
    timings: cpb.RequestTimings | None = None
    finish: str = ""


@dataclass(slots=True)
class Generation:
    """A whole reply, with TTFT / TBT measured on the client's clock."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    token_seconds: list[float] = field(default_factory=list)
    finish: str = ""
    placement: cpb.Placement | None = None
    timings: cpb.RequestTimings | None = None

    @property
    def ttft_s(self) -> float:
        return self.token_seconds[0] if self.token_seconds else float("nan")

    @property
    def tbt_s(self) -> float:
        """Mean time between tokens (nan with fewer than two)."""
        t = self.token_seconds
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else float("nan")

    def add(self, chunk: Chunk) -> None:
        self.text += chunk.text
        self.token_ids += chunk.token_ids
        self.token_seconds += chunk.seconds
        self.placement = self.placement or chunk.placement
        self.timings = chunk.timings or self.timings
        self.finish = chunk.finish or self.finish


@dataclass(frozen=True, slots=True)
class GenerateOptions:
    model: str = "tiny"
    max_tokens: int = 64
    sampling: Sampling = Sampling()
    stop_token_ids: tuple[int, ...] = ()
    policy: str = ""
    ttft_slo_s: float = 0.0
    tbt_slo_s: float = 0.0
    tenant: str = ""
    deadline_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.deadline_s <= 0:
            raise BadRequestError("need max_tokens >= 1 and deadline_s > 0")


def build_request(prompt: str | list[int], o: GenerateOptions) -> cpb.ConductorGenerateRequest:
    spec = spb.GenerationSpec(
        model_id=o.model, max_tokens=o.max_tokens, stop_token_ids=list(o.stop_token_ids),
        sampling=spb.SamplingOptions(
            temperature=o.sampling.temperature, top_p=o.sampling.top_p, seed=o.sampling.seed
        ),
    )  # fmt: skip
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequestError("empty prompt")
        spec.prompt_text = prompt
    else:
        spec.prompt_token_ids[:] = list(prompt)
    slo = cpb.Objectives(ttft_s=o.ttft_slo_s, tbt_s=o.tbt_slo_s)
    return cpb.ConductorGenerateRequest(spec=spec, slo=slo, policy=o.policy)


class _Decoder:
    """Byte ids -> text, across message boundaries."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def text(self, ids: Any, final: bool = False) -> str:
        return self._utf8.decode(bytes(i for i in ids if i < BYTE_VOCAB), final)


def _chunk(msg: cpb.ConductorGenerateResponse, dec: _Decoder, started: float) -> Chunk:
    now = time.perf_counter() - started
    final = msg.finish_reason != spb.FINISH_REASON_NONE
    finish = spb.FinishReason.Name(msg.finish_reason)[14:].lower() if final else ""
    return Chunk(
        tuple(msg.token_ids), dec.text(msg.token_ids, final), (now,) * len(msg.token_ids),
        msg.placement if msg.HasField("placement") else None,
        msg.timings if msg.HasField("timings") else None, finish,
    )  # fmt: skip


def _metadata(o: GenerateOptions) -> tuple[tuple[str, str], ...]:
    return ((TENANT_METADATA, o.tenant),) if o.tenant else ()


class ConductorClient:
    """Blocking client of the conductor's Generate; thread-safe, one channel."""

    def __init__(self, address: str, credentials: object | None = None, **defaults: Any):
        self.address = address
        self.defaults = GenerateOptions(**defaults)
        self._channel = sync_channel(address, credentials)
        self._stub = conductor_pb2_grpc.ConductorStub(self._channel)

    def _options(self, overrides: dict[str, Any]) -> GenerateOptions:
        from dataclasses import replace

        return replace(self.defaults, **overrides) if overrides else self.defaults

    def stream(self, prompt: str | list[int], **options: Any) -> Iterator[Chunk]:
        """Chunks as the conductor relays them."""
        o = self._options(options)
        started = time.perf_counter()
        dec = _Decoder()
        call = self._stub.Generate(
            build_request(prompt, o), timeout=o.deadline_s, metadata=_metadata(o)
        )
        try:
            for msg in call:
                yield _chunk(msg, dec, started)
        except grpc.RpcError as err:
            # grpc raises the call itself, which this frame holds: its traceback (this
            # frame) would make a cycle that only a full collection frees, per rejection
            raise _typed(err) from None
        finally:
            call.cancel()

    def generate(self, prompt: str | list[int], **options: Any) -> Generation:
        out = Generation()
        for chunk in self.stream(prompt, **options):
            out.add(chunk)
        return out

    def status(self, timeout_s: float = 5.0) -> cpb.ClusterStatusResponse:
        try:
            return self._stub.ClusterStatus(cpb.ClusterStatusRequest(), timeout=timeout_s)
        except grpc.RpcError as err:
            raise rpc_error(err) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ConductorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _typed(err: grpc.RpcError) -> Exception:
    """The typed error of a failed call, with the call's own traceback dropped."""
    err.__traceback__ = None
    return rpc_error(err)


class AsyncConductorClient:
    """The asyncio twin of ConductorClient."""

    def __init__(self, address: str, credentials: object | None = None, **defaults: Any):
        self.address = address
        self.defaults = GenerateOptions(**defaults)
        self._channel = aio_channel(address, credentials)
        self._stub = conductor_pb2_grpc.ConductorStub(self._channel)

    async def stream(self, prompt: str | list[int], **options: Any) -> AsyncIterator[Chunk]:
        from dataclasses import replace

        o = replace(self.defaults, **options) if options else self.defaults
        started = time.perf_counter()
        dec = _Decoder()
        call = self._stub.Generate(
            build_request(prompt, o), timeout=o.deadline_s, metadata=_metadata(o)
        )
        try:
            async for msg in call:
                yield _chunk(msg, dec, started)
        except grpc.RpcError as err:
            raise _typed(err) from None  # as in ConductorClient.stream
        finally:
            call.cancel()

    async def generate(self, prompt: str | list[int], **options: Any) -> Generation:
        out = Generation()
        async for chunk in self.stream(prompt, **options):
            out.add(chunk)
        return out

    async def status(self, timeout_s: float = 5.0) -> cpb.ClusterStatusResponse:
        try:
            return await self._stub.ClusterStatus(cpb.ClusterStatusRequest(), timeout=timeout_s)
        except grpc.RpcError as err:
            raise rpc_error(err) from None

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncConductorClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
