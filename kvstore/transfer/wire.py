"""TCP framing of the transfer protocol, and exact-length socket helpers.

Request  (24 bytes + name + 1 + cap):  op u8 | version u8 | name_len u16 | req_id u32 |
                             offset u64 | length u64 | segment name (UTF-8) |
                             cap_len u8 | capability (kvstore.security.capabilities;
                             cap_len 0 = none, which a secured node refuses)
         a WRITE is followed by `length` payload bytes.
Version 2 added the capability; a node answers any other version with BAD_REQUEST
naming both versions, then closes (old and new peers fail clearly, never misparse).
Response (16 bytes):         status u8 | pad 3 | req_id u32 | length u64
         status OK + READ: `length` payload bytes follow; OK + WRITE: length 0;
         an error status: a UTF-8 message of `length` bytes follows.
All integers little-endian. One request in flight per connection.
"""

from __future__ import annotations

import socket
import ssl
import struct
from enum import IntEnum

from kvstore.errors import (
    BadRequestError,
    KVStoreError,
    NotFoundError,
    PermissionDeniedError,
    TooLargeError,
    TransferError,
)

VERSION = 2
MAX_CAPABILITY_BYTES = 255
REQUEST = struct.Struct("<BBHIQQ")
RESPONSE = struct.Struct("<BxxxIQ")
MAX_ERROR_BYTES = 4096


class Status(IntEnum):
    OK = 0
    BAD_REQUEST = 1
    NOT_FOUND = 2
    TOO_LARGE = 3
    INTERNAL = 4
    PERMISSION_DENIED = 5  # no valid capability for this range and mode


_ERRORS: dict[Status, type[KVStoreError]] = {
    Status.BAD_REQUEST: BadRequestError,
    Status.NOT_FOUND: NotFoundError,
    Status.TOO_LARGE: TooLargeError,
    Status.INTERNAL: TransferError,
    Status.PERMISSION_DENIED: PermissionDeniedError,
}


def status_of(error: Exception) -> Status:
    """The wire status for an error raised while serving a request."""
    if isinstance(error, TooLargeError):
        return Status.TOO_LARGE
    if isinstance(error, BadRequestError):
        return Status.BAD_REQUEST
    if isinstance(error, NotFoundError):
        return Status.NOT_FOUND
    if isinstance(error, PermissionDeniedError):
        return Status.PERMISSION_DENIED
    return Status.INTERNAL


def error_of(status: int, message: str) -> KVStoreError:
    """The typed error for a non-OK wire status (unknown codes -> TransferError)."""
    try:
        cls = _ERRORS[Status(status)]
    except (ValueError, KeyError):
        cls = TransferError
    return cls(f"peer: {message}")


def pack_request(
    op: int, req_id: int, name: bytes, offset: int, length: int, capability: bytes = b""
) -> bytes:
    if len(capability) > MAX_CAPABILITY_BYTES:
        raise BadRequestError(f"capability of {len(capability)} bytes")
    header = REQUEST.pack(op, VERSION, len(name), req_id, offset, length)
    return header + name + _CAP_LEN[len(capability)] + capability


_CAP_LEN = [bytes([n]) for n in range(MAX_CAPABILITY_BYTES + 1)]


def pack_response(status: Status, req_id: int, length: int) -> bytes:
    return RESPONSE.pack(status, req_id, length)


def pack_error(req_id: int, error: Exception) -> bytes:
    message = str(error).encode()[:MAX_ERROR_BYTES]
    return pack_response(status_of(error), req_id, len(message)) + message


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` completely from `sock`; ConnectionError on EOF."""
    got, total = 0, view.nbytes
    while got < total:
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            raise ConnectionError(f"peer closed after {got} of {total} bytes")
        got += n


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_into_exact(sock, memoryview(buf))
    return bytes(buf)


def send_with_header(sock: socket.socket, header: bytes, payload: memoryview) -> None:
    """Send header + payload with one syscall where the kernel takes it all (no copy);
    over TLS (no sendmsg) the header alone, then the payload."""
    if isinstance(sock, ssl.SSLSocket):
        sock.sendall(header)
        sock.sendall(payload)
        return
    sent = sock.sendmsg([header, payload])
    if sent < len(header):
        sock.sendall(header[sent:])
        sent = len(header)
    if sent - len(header) < payload.nbytes:
        sock.sendall(payload[sent - len(header) :])


def tune(sock: socket.socket, timeout: float | None = None) -> None:
    """No Nagle delay; a blocking socket whose send/recv fail after `timeout` seconds.

    Kernel timeouts (SO_RCVTIMEO/SO_SNDTIMEO) rather than `settimeout`, which would
    add a poll() before every recv/send. A timed-out call raises an OSError
    (BlockingIOError with EAGAIN).
    """
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(None)
    if timeout is not None:
        seconds = int(timeout)
        timeval = struct.pack("ll", seconds, int((timeout - seconds) * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
