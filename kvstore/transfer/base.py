"""The transfer-engine contract: descriptors, requests, handles and the engine ABC.

A *segment* is a named memory region that a process exposes to peers (a DRAM
segment of anonymous shared memory, a registered buffer); a `SegmentDescriptor` says how to reach it
and travels as bytes or a dict (e.g. in gRPC metadata). A *buffer* is local memory
registered with an engine. A `TransferRequest` moves `length` bytes between
`remote[remote_offset:]` and `local[local_offset:]`: READ pulls remote -> local,
WRITE pushes local -> remote. Engines validate every request before any I/O.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import IntEnum
from functools import cache
from typing import Any

from kvstore.buffers import byte_view
from kvstore.errors import BadRequestError, NotFoundError, TooLargeError, TransferError
from kvstore.tiers.shm import check_address

MAX_NAME_BYTES = 1024


class TransferOp(IntEnum):
    """Direction of a one-sided transfer, seen from the initiator."""

    READ = 1
    WRITE = 2


HOST_ID_ENV = "KVSTORE_HOST_ID"


@cache
def local_host_id() -> str:
    """An id equal for processes of one boot of one host: hostname + boot id.

    A non-blank `KVSTORE_HOST_ID` environment variable replaces it: processes that
    share /dev/shm but must act as distinct hosts (network namespaces in tests,
    containers with a shared IPC mount) set distinct values, so "auto" picks TCP
    between them, never shared memory. Read once per process (the result is cached):
    set it before the process starts, not while it runs.
    """
    override = os.environ.get(HOST_ID_ENV, "").strip()
    if override:
        return override
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "noboot"
    return f"{socket.gethostname()}/{boot}"


def check_name(name: object) -> str:
    """Validate a segment or buffer name: non-empty str, at most MAX_NAME_BYTES."""
    if not isinstance(name, str) or not name:
        raise BadRequestError(f"name must be a non-empty str, got {name!r}")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise BadRequestError(f"name longer than {MAX_NAME_BYTES} bytes")
    return name


@dataclass(frozen=True, slots=True)
class SegmentDescriptor:
    """How to reach a remote segment: shared memory (`shm`, mapped by the fd that
    `shm_socket` serves), a slab file (`file`, read and written by that fd), TCP
    endpoint or NIXL."""

    name: str
    size: int
    host_id: str
    endpoint: str = ""  # "host:port" of the TransferServer serving it; "" = none
    shm: bool = False  # shared memory that same-host peers may map (see shm_socket)
    nixl_meta: bytes = b""  # agent metadata + base address, see kvstore.transfer.nixl
    # "@name" of the abstract Unix socket whose fd server hands out this segment's
    # fd (kvstore.tiers.shm.FdServer); "" = not mappable
    shm_socket: str = ""
    # an SSD slab file whose fd that server hands out: same-host peers pread/pwrite it
    # (kvstore.transfer.file) instead of mapping it
    file: bool = False

    def __post_init__(self) -> None:
        check_name(self.name)
        if not isinstance(self.size, int) or self.size < 0:
            raise BadRequestError(f"bad segment size {self.size!r}")
        if self.endpoint:
            parse_endpoint(self.endpoint)
        if self.shm_socket:
            check_address(self.shm_socket)

    @property
    def same_host(self) -> bool:
        return self.host_id == local_host_id()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nixl_meta"] = base64.b64encode(self.nixl_meta).decode()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SegmentDescriptor:
        try:
            fields = dict(d)
            fields["nixl_meta"] = base64.b64decode(fields.get("nixl_meta", ""))
            return cls(**fields)
        except (TypeError, ValueError) as e:
            raise BadRequestError(f"bad segment descriptor: {e}") from e

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> SegmentDescriptor:
        try:
            return cls.from_dict(json.loads(data))
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise BadRequestError(f"bad segment descriptor bytes: {e}") from e


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """Split "host:port" (IPv6 in brackets allowed) into (host, port)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadRequestError(f"bad endpoint {endpoint!r}, want host:port")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class BufferDescriptor:
    """A local buffer registered with an engine (by name)."""

    name: str
    size: int


@dataclass(frozen=True, slots=True)
class TransferRequest:
    """Move `length` bytes between remote[remote_offset:] and local[local_offset:]."""

    op: TransferOp
    remote: SegmentDescriptor
    remote_offset: int
    length: int
    local: BufferDescriptor
    local_offset: int = 0
    # The master's grant for this range and mode (kvstore.security.capabilities);
    # b"" in insecure mode. Sent with the request; a secured node refuses it without.
    capability: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.op, TransferOp):
            raise BadRequestError(f"op must be a TransferOp, got {self.op!r}")
        for field in ("remote_offset", "length", "local_offset"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 0:
                raise BadRequestError(f"{field} must be an int >= 0, got {value!r}")
        if self.remote_offset + self.length > self.remote.size:
            raise BadRequestError(
                f"remote range [{self.remote_offset}, +{self.length}) outside segment "
                f"{self.remote.name!r} of {self.remote.size} bytes"
            )
        if self.local_offset + self.length > self.local.size:
            raise TooLargeError(
                f"local buffer {self.local.name!r} of {self.local.size} bytes too small "
                f"for [{self.local_offset}, +{self.length})"
            )


class TransferHandle:
    """Completion of one submitted batch: one result (None or an error) per request."""

    def __init__(self, count: int) -> None:
        self._results: list[Exception | None] = [None] * count
        self._finished = [False] * count
        self._pending = count
        self._cond = threading.Condition()

    def complete(self, index: int, error: Exception | None = None) -> None:
        """Mark request `index` finished (called once per request, by the engine)."""
        with self._cond:
            if self._finished[index]:
                return
            self._finished[index] = True
            self._results[index] = error
            self._pending -= 1
            if self._pending == 0:
                self._cond.notify_all()

    def done(self) -> bool:
        with self._cond:
            return self._pending == 0

    def wait(self, timeout: float | None = None) -> list[Exception | None]:
        """Results per request; requests unfinished after `timeout` get a TransferError
        (their bytes may still land later: do not reuse those buffers)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._pending == 0, timeout):
                err = TransferError(f"transfer not complete within {timeout} s")
                return [r if f else err for r, f in zip(self._results, self._finished, strict=True)]
            return list(self._results)


def raise_first(results: Sequence[Exception | None]) -> None:
    """Raise the first error of a batch result, if any."""
    for err in results:
        if err is not None:
            raise err


class BufferRegistry:
    """Named local buffers as flat writable byte views (thread-safe)."""

    def __init__(self) -> None:
        self._views: dict[str, memoryview] = {}
        self._lock = threading.Lock()

    def add(self, name: str, buffer: object) -> BufferDescriptor:
        view = byte_view(buffer, writable=True)
        with self._lock:
            if check_name(name) in self._views:
                raise BadRequestError(f"buffer {name!r} already registered")
            self._views[name] = view
        return BufferDescriptor(name, view.nbytes)

    def remove(self, name: str) -> bool:
        with self._lock:
            return self._views.pop(name, None) is not None

    def view(self, desc: BufferDescriptor) -> memoryview:
        with self._lock:
            view = self._views.get(desc.name)
        if view is None:
            raise NotFoundError(f"buffer {desc.name!r} is not registered")
        return view

    def slice(self, desc: BufferDescriptor, offset: int, length: int) -> memoryview:
        view = self.view(desc)
        if offset + length > view.nbytes:
            raise TooLargeError(f"buffer {desc.name!r} of {view.nbytes} bytes too small")
        return view[offset : offset + length]

    def names(self) -> list[str]:
        with self._lock:
            return list(self._views)


class TransferEngine(ABC):
    """One-sided READ/WRITE between registered local buffers and remote segments."""

    kind: str = "abstract"

    def __init__(self) -> None:
        self.buffers = BufferRegistry()

    def register(self, name: str, buffer: object) -> BufferDescriptor:
        """Register local memory (bytearray, memoryview, mmap, numpy, CPU torch tensor)."""
        return self.buffers.add(name, buffer)

    def unregister(self, name: str) -> bool:
        return self.buffers.remove(name)

    @abstractmethod
    def submit(self, batch: Sequence[TransferRequest]) -> TransferHandle:
        """Start a batch; raises BadRequestError/NotFoundError before any I/O."""

    def read(
        self,
        remote: SegmentDescriptor,
        offset: int,
        length: int,
        local: BufferDescriptor,
        local_offset: int = 0,
        timeout: float | None = None,
    ) -> None:
        """Blocking READ of remote[offset:offset+length] into local[local_offset:]."""
        req = TransferRequest(TransferOp.READ, remote, offset, length, local, local_offset)
        raise_first(self.submit([req]).wait(timeout))

    def write(
        self,
        remote: SegmentDescriptor,
        offset: int,
        length: int,
        local: BufferDescriptor,
        local_offset: int = 0,
        timeout: float | None = None,
    ) -> None:
        """Blocking WRITE of local[local_offset:+length] to remote[offset:]."""
        req = TransferRequest(TransferOp.WRITE, remote, offset, length, local, local_offset)
        raise_first(self.submit([req]).wait(timeout))

    def check_batch(self, batch: Sequence[TransferRequest]) -> list[memoryview]:
        """Resolve each request's local slice; raises before any I/O on a bad one."""
        if not all(isinstance(r, TransferRequest) for r in batch):
            raise BadRequestError("batch items must be TransferRequest")
        return [self.buffers.slice(r.local, r.local_offset, r.length) for r in batch]

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and mappings."""

    def __enter__(self) -> TransferEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
