"""The one place that maps kvstore errors to gRPC status codes and back.

server side: `status_for(exc)` and `@translate` turn a KVStoreError into an RPC status
             carrying its message; any other exception becomes INTERNAL.
client side: `raise_from_rpc_error(err)` turns a grpc.RpcError back into
             the matching KVStoreError (DEADLINE_EXCEEDED and UNAVAILABLE
             become UnavailableError: the service could not answer in time).
per key:     `code_for(exc)` / `error_for(code, message)` map errors to the
             ErrorCode enum of batched results (kvstore.v1.common_pb2).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from kvstore import errors
from kvstore.v1 import common_pb2

_STATUS: dict[type[errors.KVStoreError], grpc.StatusCode] = {
    cls: grpc.StatusCode[cls.grpc_code] for cls in errors.ALL_ERRORS
}
# Several classes share a status (e.g. UNAVAILABLE); the client maps back to the most general.
_FROM_STATUS: dict[grpc.StatusCode, type[errors.KVStoreError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.BadRequestError,
    grpc.StatusCode.OUT_OF_RANGE: errors.BadRequestError,
    grpc.StatusCode.NOT_FOUND: errors.NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: errors.ExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: errors.NotReadyError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.NoSpaceError,
    grpc.StatusCode.DATA_LOSS: errors.CorruptError,
    grpc.StatusCode.UNAVAILABLE: errors.UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: errors.UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDeniedError,
}
_CODE: dict[type[errors.KVStoreError], int] = {
    errors.BadRequestError: common_pb2.ERROR_CODE_INVALID_ARGUMENT,
    errors.TooLargeError: common_pb2.ERROR_CODE_TOO_LARGE,
    errors.NotFoundError: common_pb2.ERROR_CODE_NOT_FOUND,
    errors.ExistsError: common_pb2.ERROR_CODE_ALREADY_EXISTS,
    errors.NotReadyError: common_pb2.ERROR_CODE_NOT_READY,
    errors.NoSpaceError: common_pb2.ERROR_CODE_NO_SPACE,
    errors.CorruptError: common_pb2.ERROR_CODE_CORRUPT,
    errors.TransferError: common_pb2.ERROR_CODE_TRANSFER,
    errors.UnavailableError: common_pb2.ERROR_CODE_UNAVAILABLE,
    errors.UnauthenticatedError: common_pb2.ERROR_CODE_UNAUTHENTICATED,
    errors.PermissionDeniedError: common_pb2.ERROR_CODE_PERMISSION_DENIED,
}
_FROM_CODE: dict[int, type[errors.KVStoreError]] = {v: k for k, v in _CODE.items()}


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status of an exception (most specific class first); INTERNAL if foreign."""
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return grpc.StatusCode.INTERNAL


# gRPC's own RESOURCE_EXHAUSTED for a message over the channel's limit: the request was
# too big, not the pool full (e.g. "Received message larger than max (70000000 vs. 67108864)")
_TOO_LARGE_MESSAGE = ("larger than max", "message too large")


def error_for_status(code: grpc.StatusCode, message: str) -> errors.KVStoreError:
    """The KVStoreError a client raises for a failed RPC."""
    if code == grpc.StatusCode.UNAVAILABLE:  # HA: a follower names the leader
        not_leader = errors.NotLeaderError.parse(message)
        if not_leader is not None:
            return not_leader
    cls = _FROM_STATUS.get(code, errors.KVStoreError)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and any(
        m in message.lower() for m in _TOO_LARGE_MESSAGE
    ):
        cls = errors.TooLargeError
    return cls(f"{code.name}: {message}")


def raise_from_rpc_error(err: grpc.RpcError) -> NoReturn:
    """Re-raise a grpc.RpcError (sync or aio) as the matching KVStoreError."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    raise error_for_status(code, details or "") from err


def code_for(exc: BaseException | None) -> int:
    """The per-key ErrorCode of a result (OK for None)."""
    if exc is None:
        return common_pb2.ERROR_CODE_OK
    for cls in type(exc).__mro__:
        if cls in _CODE:
            return _CODE[cls]
    return common_pb2.ERROR_CODE_INTERNAL


def error_for(code: int, message: str = "") -> errors.KVStoreError | None:
    """The KVStoreError of a per-key ErrorCode (None for OK)."""
    if code == common_pb2.ERROR_CODE_OK:
        return None
    return _FROM_CODE.get(code, errors.KVStoreError)(message or common_pb2.ErrorCode.Name(code))


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def translate(method: F) -> F:
    """Decorate an aio servicer method: a raised error aborts with its status and message."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except errors.KVStoreError as exc:
            await context.abort(status_for(exc), str(exc))

    return wrapper  # type: ignore[return-value]
