"""Typed errors of kvstore, in one place.

    KVStoreError
    ├── BadRequestError      malformed input: wrong types, sizes, ranges   (INVALID_ARGUMENT)
    │   └── TooLargeError    an object larger than a tier or buffer       (INVALID_ARGUMENT)
    ├── NotFoundError        unknown key, node or segment                  (NOT_FOUND)
    ├── ExistsError          key already committed or being written        (ALREADY_EXISTS)
    ├── NotReadyError        key is still being written                    (FAILED_PRECONDITION)
    ├── NoSpaceError         tier or pool full, nothing evictable; ENOSPC  (RESOURCE_EXHAUSTED)
    ├── CorruptError         checksum mismatch on read                     (DATA_LOSS)
    ├── TransferError        a peer vanished or a transfer failed          (UNAVAILABLE)
    ├── UnavailableError     a service (master, node) cannot be reached    (UNAVAILABLE)
    │   └── NotLeaderError   a master that is not the HA leader (names it) (UNAVAILABLE)
    ├── IOFaultError         the OS or RocksDB failed an I/O (EIO, ...)    (INTERNAL)
    ├── UnauthenticatedError no valid credential (kvstore.security)        (UNAUTHENTICATED)
    └── PermissionDeniedError the credential may not do this               (PERMISSION_DENIED)

`None` means "absent / not now"; an exception means bad input or a fault.
Each class names its gRPC status code as a string so that this module imports
no grpc; `kvstore.rpc_errors` maps them to and from gRPC in one place.
"""

from __future__ import annotations


class KVStoreError(Exception):
    """Base of every kvstore error."""

    grpc_code: str = "UNKNOWN"


class BadRequestError(KVStoreError, ValueError):
    grpc_code = "INVALID_ARGUMENT"


class TooLargeError(BadRequestError):
    grpc_code = "INVALID_ARGUMENT"


class NotFoundError(KVStoreError, KeyError):
    grpc_code = "NOT_FOUND"

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "not found"


class ExistsError(KVStoreError):
    grpc_code = "ALREADY_EXISTS"


class NotReadyError(KVStoreError):
    grpc_code = "FAILED_PRECONDITION"


class NoSpaceError(KVStoreError):
    grpc_code = "RESOURCE_EXHAUSTED"


class CorruptError(KVStoreError):
    grpc_code = "DATA_LOSS"


class TransferError(KVStoreError):
    grpc_code = "UNAVAILABLE"


class UnavailableError(KVStoreError):
    grpc_code = "UNAVAILABLE"


class NotLeaderError(UnavailableError):
    """This master is not the pool's leader (a follower, or a leader that lost its
    lease): nothing was done. `leader` is the leader's address when known, else ""."""

    grpc_code = "UNAVAILABLE"
    PREFIX = "not leader"  # how the status message starts on the wire

    def __init__(self, message: str = "", leader: str = "") -> None:
        super().__init__(message or f"{self.PREFIX}: leader is {leader or 'unknown'}")
        self.leader = leader

    @classmethod
    def parse(cls, message: str) -> NotLeaderError | None:
        """The error a status message carries ("...not leader: leader is HOST:PORT..."),
        or None when it is not a not-leader message."""
        at = message.find(cls.PREFIX + ":")
        if at < 0:
            return None
        rest = message[at:].split("leader is ", 1)
        leader = rest[1].split()[0].rstrip(".,;") if len(rest) == 2 and rest[1] else ""
        return cls(message, "" if leader == "unknown" else leader)


class IOFaultError(KVStoreError):
    grpc_code = "INTERNAL"


class UnauthenticatedError(KVStoreError):
    """The caller presented no valid credential (kvstore.security)."""

    grpc_code = "UNAUTHENTICATED"


class PermissionDeniedError(KVStoreError):
    """The caller's credential does not allow this call (kvstore.security.authz)."""

    grpc_code = "PERMISSION_DENIED"


# The errors that round-trip through a gRPC status or a per-key ErrorCode.
ALL_ERRORS: tuple[type[KVStoreError], ...] = (
    BadRequestError,
    TooLargeError,
    NotFoundError,
    ExistsError,
    NotReadyError,
    NoSpaceError,
    CorruptError,
    TransferError,
    UnavailableError,
    UnauthenticatedError,
    PermissionDeniedError,
)
# IOFaultError is left out on purpose: on the wire it is INTERNAL, which reads back
# as a plain KVStoreError (a remote device fault is not the caller's to handle).
