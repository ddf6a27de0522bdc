"""The one gRPC edge of kvstore: channel options, channels, server bootstrap and the
protobuf <-> core-type conversions that every service and client share.

    channel = sync_channel("127.0.0.1:50051")            # or aio_channel(...)
    edge = await start_server("127.0.0.1:0", add, ["kvstore.v1.Master"], metrics=collector)
    edge.address, edge.metrics_address                   # then: await edge.stop()

A server started here serves, beside its own services, gRPC health (every name SERVING)
and reflection (`grpcurl -plaintext HOST:PORT list` works), records each RPC's latency
in a Prometheus histogram and, when asked (`metrics_listen`, or the environment variable
KVSTORE_METRICS_LISTEN=HOST:PORT), exposes `/metrics` over HTTP.

Security (kvstore.security): every server authenticates each call per its
`SecurityConfig` (default: the process's KVSTORE_SECURITY_* variables): mTLS, a token
over local credentials, or insecure (which it says loudly at start); `interceptors` run
after that (the master's guard). Channels made here with no `credentials` use the
process's own credential the same way, so one setting secures every service and client.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from kvstore.errors import BadRequestError, KVStoreError, UnavailableError
from kvstore.rpc_errors import error_for_status
from kvstore.types import Location, Tier
from kvstore.v1 import common_pb2

METRICS_ENV = "KVSTORE_METRICS_LISTEN"
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Options of every kvstore channel and server: big batches, no port sharing (two
    servers must never silently share a port)."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]


GRPC_OPTIONS = channel_options()


def process_credentials() -> tuple[object | None, list[tuple[str, Any]]]:
    """This process's channel credentials and options (KVSTORE_SECURITY_*; None: insecure)."""
    from kvstore.security import config as sec_config
    from kvstore.security import credentials as sec_creds

    cfg = sec_config.from_env()
    return sec_creds.channel_credentials(cfg), sec_creds.channel_options(cfg)


def sync_channel(address: str, credentials: object | None = None) -> grpc.Channel:
    """A blocking channel: secure with `credentials` (grpc.ChannelCredentials), else with
    the process's own credential (kvstore.security), else plain."""
    options: list[tuple[str, Any]] = list(GRPC_OPTIONS)
    if credentials is None:
        credentials, extra = process_credentials()
        options += extra
    if credentials is not None:
        return grpc.secure_channel(address, credentials, options=options)  # type: ignore[arg-type]
    return grpc.insecure_channel(address, options=options)


def aio_channel(address: str, credentials: object | None = None) -> grpc.aio.Channel:
    """An asyncio channel: secure with `credentials` or the process's own, else plain."""
    options: list[tuple[str, Any]] = list(GRPC_OPTIONS)
    if credentials is None:
        credentials, extra = process_credentials()
        options += extra
    if credentials is not None:
        return grpc.aio.secure_channel(address, credentials, options=options)  # type: ignore[arg-type]
    return grpc.aio.insecure_channel(address, options=options)


def rpc_error(err: grpc.RpcError) -> KVStoreError:
    """The kvstore error of a failed RPC (kvstore.rpc_errors' mapping), not raised."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    return error_for_status(code, details or "")


# ---- protobuf <-> core types ------------------------------------------------

_TIERS = {int(t): t for t in Tier}


def tier_from_pb(value: int) -> Tier:
    """The Tier of a wire value; BadRequestError for an unknown one."""
    tier = _TIERS.get(value)
    if tier is None:
        raise BadRequestError(f"unknown tier {value}")
    return tier


def to_pb_location(loc: Location) -> common_pb2.Location:
    return common_pb2.Location(
        node_id=loc.node_id, tier=int(loc.tier), segment=loc.segment,  # type: ignore[arg-type]  # proto enum: an int
        offset=loc.offset, length=loc.length,
    )  # fmt: skip


def from_pb_location(pb: common_pb2.Location) -> Location:
    tier = _TIERS.get(pb.tier)
    if tier is None:
        tier = Tier(pb.tier)  # raises ValueError on an unknown tier
    return Location(pb.node_id, tier, pb.segment, pb.offset, pb.length, pb.capability)


def split_address(address: str) -> tuple[str, int]:
    """ "HOST:PORT" -> (host, port); BadRequestError when malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise BadRequestError(f"bad address {address!r}, want HOST:PORT")
    return host.strip("[]"), int(port)


# ---- server bootstrap -------------------------------------------------------

AddServicers = Callable[[grpc.aio.Server], None]


@dataclass(slots=True)
class EdgeServer:
    """A started server: its address, its health servicer and its /metrics endpoint."""

    server: grpc.aio.Server
    address: str
    health: health.aio.HealthServicer
    metrics: Any = None  # kvstore.metrics.MetricsEndpoint, or None
    service_names: list[str] = field(default_factory=list)

    @property
    def metrics_address(self) -> str:
        return self.metrics.address if self.metrics is not None else ""

    async def stop(self, grace_s: float = 0.5) -> None:
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace_s)
        if self.metrics is not None:
            self.metrics.close()


async def start_server(
    listen: str,
    add_servicers: AddServicers,
    service_names: Sequence[str],
    *,
    credentials: grpc.ServerCredentials | None = None,
    metrics_listen: str | None = None,
    collectors: Sequence[Any] = (),
    component: str = "",
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    security: Any = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> EdgeServer:
    """Serve `add_servicers`' services plus health and reflection on `listen` (port 0 picks
    one). `metrics_listen` None reads KVSTORE_METRICS_LISTEN ("" or unset: no /metrics).
    `security` (a kvstore.security SecurityConfig; None: the process's) authenticates every
    call; `credentials` overrides the port credentials it implies."""
    from kvstore import metrics
    from kvstore.security import config as sec_config
    from kvstore.security import credentials as sec_creds
    from kvstore.security.interceptor import AuthInterceptor

    security = sec_config.from_env() if security is None else security
    if credentials is None:
        credentials = sec_creds.server_credentials(security)
    name = label = component or (service_names[0] if service_names else "")
    rpc_metrics = metrics.RpcMetrics(name)
    token_metrics = metrics.ServingMetrics(name)
    chain = [_Timing(rpc_metrics, token_metrics), AuthInterceptor(security), *interceptors]
    server = grpc.aio.server(options=channel_options(max_message_bytes), interceptors=chain)
    add_servicers(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]
    reflection.enable_server_reflection(names, server)
    port = _bind(server, listen, credentials)
    endpoint = _metrics_endpoint(metrics_listen, [rpc_metrics, token_metrics, *collectors])
    try:
        await server.start()
    except BaseException:
        if endpoint is not None:
            endpoint.close()
        raise
    for name in ["", *service_names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    host = listen.rsplit(":", 1)[0]
    if security.insecure and credentials is None:
        sec_creds.warn_insecure(label, f"{host}:{port}")
    return EdgeServer(server, f"{host}:{port}", health_servicer, endpoint, list(service_names))


def _bind(server: grpc.aio.Server, listen: str, credentials: grpc.ServerCredentials | None) -> int:
    split_address(listen)
    try:
        if credentials is not None:
            port = server.add_secure_port(listen, credentials)
        else:
            port = server.add_insecure_port(listen)
    except RuntimeError as exc:  # grpc raises RuntimeError when the bind fails
        raise UnavailableError(f"cannot listen on {listen!r} (in use?): {exc}") from None
    if port == 0:
        raise UnavailableError(f"cannot listen on {listen!r} (in use?)")
    return port


def _metrics_endpoint(listen: str | None, collectors: Sequence[Any]) -> Any:
    from kvstore import metrics

    where = os.environ.get(METRICS_ENV, "") if listen is None else listen
    if not where:
        return None
    return metrics.MetricsEndpoint.start(where, collectors)


class _Timing(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Times every unary and server-streaming call into an RpcMetrics histogram; a stream
    whose messages carry `token_ids` (Generate, Decode) also feeds TTFT (call start to the
    first token sent) and TBT (gap between messages, split evenly over their tokens)."""

    def __init__(self, rpc_metrics: Any, token_metrics: Any) -> None:
        self.metrics = rpc_metrics
        self.tokens = token_metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        observe = self.metrics.observe

        async def timed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            try:
                return await behavior(request, context)
            finally:
                observe(method, time.perf_counter() - started, context)

        return timed

    def _stream(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        observe = self.metrics.observe

        tokens = self.tokens

        async def timed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = last = time.perf_counter()
            ttft = -1.0
            gaps: list[float] = []
            try:
                async for item in behavior(request, context):
                    n = len(getattr(item, "token_ids", ()))
                    if n:
                        now = time.perf_counter()
                        if ttft < 0:
                            ttft = now - started
                            gaps += [0.0] * (n - 1)
                        else:
                            gaps += [(now - last) / n] * n
                        last = now
                    yield item
            finally:
                observe(method, time.perf_counter() - started, context)
                if ttft >= 0:
                    tokens.observe_gaps(ttft, gaps)

        return timed
