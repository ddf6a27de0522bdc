"""Mooncake Store's integer return codes and how kvstore errors map onto them.

The values are Mooncake's `ErrorCode` enum (mooncake-store/include/types.h); its
Python API returns them as plain ints: 0 for success, a negative code otherwise.
Only the codes the facade can produce are listed.
"""

from __future__ import annotations

from enum import IntEnum

from kvstore import errors


class ErrorCode(IntEnum):
    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    NO_AVAILABLE_HANDLE = -200  # no space in the pool
    INVALID_KEY = -400
    INVALID_PARAMS = -600  # bad argument, buffer too small, overlapping registration
    INVALID_READ = -701
    REPLICA_IS_NOT_READY = -703  # the key is still being written
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706  # remove of a leased (being read) or pinned object
    TRANSFER_FAIL = -800
    RPC_FAIL = -900
    UNAVAILABLE_IN_CURRENT_STATUS = -1010  # called before setup or after close
    NOT_SUPPORTED = -1012  # an operation the facade does not offer (docs/mooncake_compat.md)
    FILE_NOT_FOUND = -1100  # save_tensor_to_safetensor of a key holding no tensor
    TASK_NOT_FOUND = -1400


_BY_CLASS: tuple[tuple[type[errors.KVStoreError], ErrorCode], ...] = (
    # most specific first: TooLargeError is a BadRequestError
    (errors.TooLargeError, ErrorCode.INVALID_PARAMS),
    (errors.BadRequestError, ErrorCode.INVALID_PARAMS),
    (errors.NotFoundError, ErrorCode.OBJECT_NOT_FOUND),
    (errors.ExistsError, ErrorCode.OBJECT_ALREADY_EXISTS),
    (errors.NotReadyError, ErrorCode.REPLICA_IS_NOT_READY),
    (errors.NoSpaceError, ErrorCode.NO_AVAILABLE_HANDLE),
    (errors.CorruptError, ErrorCode.INVALID_READ),
    (errors.TransferError, ErrorCode.TRANSFER_FAIL),
    (errors.UnavailableError, ErrorCode.RPC_FAIL),
)


def code_of(exc: BaseException | None) -> int:
    """The Mooncake code of a kvstore outcome (None = success); anything else is internal."""
    if exc is None:
        return int(ErrorCode.OK)
    for cls, code in _BY_CLASS:
        if isinstance(exc, cls):
            return int(code)
    if isinstance(exc, ValueError | TypeError):  # e.g. sequences of different lengths
        return int(ErrorCode.INVALID_PARAMS)
    return int(ErrorCode.INTERNAL_ERROR)


def put_code(exc: BaseException | None) -> int:
    """A put of a key that exists (committed or being written) is a silent success in
    Mooncake: the old value stays and 0 is returned."""
    return int(ErrorCode.OK) if isinstance(exc, errors.ExistsError) else code_of(exc)


def remove_code(exc: BaseException | None) -> int:
    """Mooncake refuses to remove a leased object with OBJECT_HAS_LEASE; kvstore says
    NotReadyError for leased, pinned and in-flight keys alike."""
    if isinstance(exc, errors.NotReadyError):
        return int(ErrorCode.OBJECT_HAS_LEASE)
    return code_of(exc)
