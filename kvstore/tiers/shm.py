"""Shared-memory segments that the kernel frees: anonymous memory passed by fd.

A segment is a memfd (`os.memfd_create`, close-on-exec) of a fixed size, reserved
up front and mapped with MAP_POPULATE. It has no name in any file system, so
nothing outlives its users: when the last process that maps it or holds its fd
exits, however it exits (SIGKILL included), the kernel frees the memory. A named
/dev/shm file, the first design, leaked its full size whenever its owner died
without close().

Same-host peers reach a segment through its owner's `FdServer`: a Unix socket in
the abstract namespace (an address starting with NUL: no socket file either,
gone with the process; written "@name" in descriptors). A peer sends a segment
name and receives the segment's fd by SCM_RIGHTS, maps it and closes the fd
(`SharedSegment.attach`). Abstract sockets are per network namespace, so peers
in another netns (an emulated host) cannot reach it, as they must not. The
server checks the peer's uid (SO_PEERCRED) the way the 0600 /dev/shm files did:
same user or root; nothing more.

`reclaim_stale_files` removes the /dev/shm files that nodes of the first design
left behind.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import re
import socket
import struct
import threading
import uuid
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

import numpy as np

from kvstore.errors import (
    BadRequestError,
    KVStoreError,
    NoSpaceError,
    NotFoundError,
    TransferError,
    UnavailableError,
)
from kvstore.tiers import prefault

log = logging.getLogger(__name__)

_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux only; elsewhere fault lazily

SHM_DIR = "/dev/shm"  # only for reclaiming the first design's files
MAX_NAME_BYTES = 255
_MEMFD_LABEL_BYTES = 249  # the kernel's limit on a memfd's name (shown in /proc/PID/maps)
MAX_ADDRESS_BYTES = 107  # sun_path is 108 bytes, the leading NUL included
_OK, _NO = b"OK", b"NO"
_SIZE = struct.Struct("<Q")


def new_segment_name(prefix: str = "kvstore") -> str:
    """A fresh, unique segment name such as 'kvstore-3f2a...'."""
    return check_segment_name(f"{prefix}-{uuid.uuid4().hex}")


def check_segment_name(name: object) -> str:
    """Validate a segment name: a non-empty str without '/' or NUL, at most 255 bytes."""
    if not isinstance(name, str) or not name or name in (".", ".."):
        raise BadRequestError(f"segment name must be a non-empty str, got {name!r}")
    if "/" in name or "\0" in name or len(name.encode()) > MAX_NAME_BYTES:
        raise BadRequestError(f"bad segment name {name!r}: no '/', NUL, or > 255 bytes")
    return name


def check_address(address: object) -> str:
    """Validate an fd-server address: "@" + 1..106 bytes (an abstract socket name)."""
    if not isinstance(address, str) or not address.startswith("@") or len(address) < 2:
        raise BadRequestError(f"fd socket address must be '@name', got {address!r}")
    if "\0" in address or len(address.encode()) > MAX_ADDRESS_BYTES:
        raise BadRequestError(f"fd socket address {address!r} too long or has NUL")
    return address


def _sockaddr(address: str) -> str:
    return "\0" + check_address(address)[1:]


class SharedSegment:
    """One mapped memfd segment. Create (owner) or attach (peer), then read/write
    through `buffer` or `numpy()`. `serve` lets same-host peers attach; `close`
    unmaps and, for the owner, stops serving and closes the fd."""

    def __init__(self, name: str, mapping: mmap.mmap, size: int, fd: int | None) -> None:
        self._name = name
        self._mmap: mmap.mmap | None = mapping
        self._view: memoryview | None = memoryview(mapping)
        self._size = size
        self._fd = fd  # the owner's memfd (kept to serve it); None for a peer
        self._prefaulter: prefault.Prefaulter | None = None
        self._fd_lock = threading.Lock()
        self._server: FdServer | None = None
        # A dropped, unclosed owner still closes its fd (the mapping dies with the mmap).
        self._finalizer = weakref.finalize(self, _close_fd, fd) if fd is not None else None

    @classmethod
    def create(cls, name: str, size: int, populate: bool = True) -> SharedSegment:
        """A new anonymous segment of `size` bytes, labelled `name`.

        `populate` reserves the memory now (fallocate, after checking what the host
        and its cgroup have left), so a short host fails here with NoSpaceError
        instead of a SIGBUS on first write, and maps it with MAP_POPULATE, so the
        first copy into each page does not pay a page fault (a cold segment ran at
        2.3 GB/s against 12.6 GB/s warm).
        """
        check_segment_name(name)
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise BadRequestError(f"segment size must be a positive int, got {size!r}")
        if populate:
            _check_memory(size, name)
        label = name.encode()[:_MEMFD_LABEL_BYTES].decode(errors="ignore") or "kvstore"
        fd = os.memfd_create(label, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            if populate:
                _reserve(fd, size, name)
            flags = mmap.MAP_SHARED | (_MAP_POPULATE if populate else 0)
            mapping = mmap.mmap(fd, size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return cls(name, mapping, size, fd)

    @classmethod
    def attach(
        cls,
        name: str,
        address: str,
        writable: bool = False,
        populate: bool = False,
        timeout_s: float = 10.0,
        capability: bytes = b"",
    ) -> SharedSegment:
        """Map segment `name` served at `address` (NotFoundError if it serves no such
        segment, UnavailableError if nothing listens there); read-only by default.
        `populate` pre-faults the mapping for peers that will copy a lot: in the
        background, lowest offsets first, where the kernel can (kvstore.tiers.prefault;
        `prefaulted` is set when done), else at once (MAP_POPULATE)."""
        check_segment_name(name)
        fd = fetch_fd(address, name, timeout_s, capability)
        background = populate and prefault.supported()
        try:
            size = os.fstat(fd).st_size  # the kernel's word, not the reply's
            if size == 0:
                raise BadRequestError(f"shared segment {name!r} is empty")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            at_once = populate and not background
            flags = mmap.MAP_SHARED | (_MAP_POPULATE if at_once else 0)
            mapping = mmap.mmap(fd, size, flags, prot)
        finally:
            os.close(fd)  # the mapping keeps the memory; the fd is not needed
        seg = cls(name, mapping, size, None)
        if background:
            seg._prefaulter = prefault.Prefaulter(mapping, size, writable, name)
        return seg

    @property
    def prefaulted(self) -> threading.Event | None:
        """Set once a background pre-fault (`attach(populate=True)`) has ended; None
        when none runs."""
        return self._prefaulter.done if self._prefaulter is not None else None

    @property
    def name(self) -> str:
        return self._name

    @property
    def size(self) -> int:
        return self._size

    @property
    def owner(self) -> bool:
        return self._finalizer is not None

    @property
    def closed(self) -> bool:
        return self._view is None

    @property
    def address(self) -> str:
        """The fd server's address once `serve` ran, else ""."""
        server = self._server
        return server.address if server is not None else ""

    @property
    def buffer(self) -> memoryview:
        """The whole segment as bytes (read-only when attached read-only)."""
        if self._view is None:
            raise BadRequestError(f"shared segment {self._name!r} is closed")
        return self._view

    def numpy(self) -> np.ndarray:
        """A uint8 array over the whole segment (shares memory, no copy)."""
        if self._mmap is None:
            raise BadRequestError(f"shared segment {self._name!r} is closed")
        return np.frombuffer(self._mmap, dtype=np.uint8)

    def serve(self, server: FdServer | None = None) -> str:
        """Let same-host peers attach: add to `server` (default: this process's,
        started on first use); returns its address. Owner only; idempotent."""
        if self._fd is None or self.closed:
            raise BadRequestError(f"only an open owner can serve segment {self._name!r}")
        if self._server is None:
            self._server = server or process_fd_server()
            self._server.add(self)
        return self._server.address

    def dup_fd(self) -> int:
        """A new fd of the segment for the caller to send and close (owner only)."""
        with self._fd_lock:
            if self._fd is None or self._finalizer is None or not self._finalizer.alive:
                raise NotFoundError(f"shared segment {self._name!r} is closed")
            return os.dup(self._fd)

    def close(self) -> None:
        """Stop serving, close the fd and drop this process's mapping. Views still
        held elsewhere keep the pages mapped (never dangling) until they are garbage
        collected; the kernel frees the memory after the last one. Idempotent."""
        if self._server is not None:
            self._server.remove(self._name, self)
        with self._fd_lock:
            if self._finalizer is not None:
                self._finalizer()
        if self._prefaulter is not None:  # it holds the mapping: let it go first
            self._prefaulter.stop()
        view, mapping = self._view, self._mmap
        self._view = self._mmap = None
        with contextlib.suppress(BufferError):  # exported views: unmapped when they die
            if view is not None:
                view.release()
            if mapping is not None:
                mapping.close()

    def __enter__(self) -> SharedSegment:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"SharedSegment({self._name!r}, size={self._size}, owner={self.owner}, {state})"


def _close_fd(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _reserve(fd: int, size: int, name: str) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM):
            raise NoSpaceError(f"no memory for {size} bytes ({name!r})") from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise


def available_memory() -> int | None:
    """Bytes the host (MemAvailable) and this cgroup (v2 memory.max) still allow;
    None where neither is readable."""
    limits: list[int] = []
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
                break
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                limits.append(max(0, int(limit) - int(f.read())))
    return min(limits) if limits else None


def _check_memory(size: int, name: str) -> None:
    # fallocate on a memfd does not fail with ENOSPC when memory is short (the
    # internal shm mount has no size limit): it would swap, then wake the OOM killer.
    free = available_memory()
    if free is not None and size > free:
        raise NoSpaceError(f"no memory for {size} bytes ({name!r}): {free} available")


# -- the fd server -------------------------------------------------------------------


class Served(Protocol):
    """What an fd server hands out: a SharedSegment, or an SSD segment's slab file."""

    @property
    def name(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def owner(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def dup_fd(self) -> int: ...


class FdServer:
    """Serves the fds of its segments to same-host peers over an abstract Unix socket.

    One request per connection: the peer sends a segment name (one SEQPACKET
    message, at most MAX_NAME_BYTES), the server replies "OK" + u64 size with the
    fd attached, or "NO" + a reason. Each connection gets its own thread and a
    timeout, so a peer that connects and says nothing delays only itself; at most
    `max_connections` are handled at once (more are closed at accept).
    """

    def __init__(
        self, address: str | None = None, timeout_s: float = 5.0, max_connections: int = 64,
        authorize: Callable[[str, bytes, int], None] | None = None,
    ) -> None:  # fmt: skip
        # authorize(name, capability, peer uid) raises a KVStoreError to refuse the fd
        # (kvstore.transfer.shm.fd_gate); None: any process of this user (or root)
        self.authorize = authorize
        self.address = check_address(address or f"@kvstore-fd-{os.getpid()}-{uuid.uuid4().hex}")
        self.timeout_s = timeout_s
        self._segments: dict[str, weakref.ref[Served]] = {}
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._refused = 0  # connections closed unanswered: over the limit or another uid

    def add(self, segment: Served) -> None:
        """Serve `segment` by its name (BadRequestError if a live one has that name)."""
        with self._lock:
            ref = self._segments.get(segment.name)
            if ref is not None and ref() is not None:
                raise BadRequestError(f"a segment named {segment.name!r} is already served")
            self._segments[segment.name] = weakref.ref(segment)

    def remove(self, name: str, segment: Served | None = None) -> bool:
        """Stop serving `name` (only if it is `segment`, when given)."""
        with self._lock:
            ref = self._segments.get(name)
            if ref is None or (segment is not None and ref() is not segment):
                return False
            del self._segments[name]
            return True

    def names(self) -> list[str]:
        """Names served now (a segment dropped without close() no longer counts)."""
        with self._lock:
            return [name for name, ref in self._segments.items() if ref() is not None]

    @property
    def refused(self) -> int:
        """Connections closed unanswered: over `max_connections` or another user."""
        with self._lock:
            return self._refused

    def check_integrity(self) -> None:
        """Raise AssertionError unless every live entry is an open owner under its name."""
        with self._lock:
            for name, ref in self._segments.items():
                segment = ref()
                if segment is not None:
                    assert segment.name == name, f"{name!r} maps to {segment.name!r}"
                    assert segment.owner and not segment.closed, f"{name!r} is not served open"

    @property
    def running(self) -> bool:
        return self._listener is not None and not self._stopping.is_set()

    def start(self) -> str:
        """Bind and accept in a background thread; returns the address."""
        if self._listener is not None:
            raise BadRequestError("fd server already started")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            listener.bind(_sockaddr(self.address))
            listener.listen(64)
        except OSError as e:
            listener.close()
            raise UnavailableError(f"cannot listen on {self.address!r}: {e}") from e
        self._listener = listener
        self._thread = threading.Thread(target=self._accept_loop, name="kvstore-fd", daemon=True)
        self._thread.start()
        return self.address

    def stop(self) -> None:
        """Stop accepting (handlers in flight finish within their timeout). Idempotent."""
        self._stopping.set()
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
            listener.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.timeout_s)

    def _accept_loop(self) -> None:
        listener = self._listener
        while listener is not None and not self._stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # stopped (shutdown/close) or the socket broke
            if not self._slots.acquire(blocking=False):
                self._refuse(conn)
                continue
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(self.timeout_s)
                uid = _peer_uid(conn)
                if self.authorize is None and uid not in (0, os.getuid()):
                    self._refuse(conn)
                    return
                self._answer(conn, uid)
        except OSError as e:
            log.debug("fd request dropped: %s", e)
        finally:
            self._slots.release()

    def _refuse(self, conn: socket.socket) -> None:
        with self._lock:
            self._refused += 1
        conn.close()

    def _answer(self, conn: socket.socket, uid: int) -> None:
        data, _, flags, _ = conn.recvmsg(MAX_NAME_BYTES + 1 + MAX_CAPABILITY_BYTES)
        name, _, capability = data.partition(b"\0")  # name, then an optional capability
        if flags & socket.MSG_TRUNC or len(name) > MAX_NAME_BYTES:
            conn.sendall(_NO + b"segment name too long")
            return
        try:
            if self.authorize is not None:
                self.authorize(name.decode(), capability, uid)
            fd, size = self._lookup(name.decode())
        except (UnicodeDecodeError, KVStoreError) as e:
            conn.sendall(_NO + str(e).encode()[:1024])
            return
        try:
            socket.send_fds(conn, [_OK + _SIZE.pack(size)], [fd])
        finally:
            os.close(fd)

    def _lookup(self, name: str) -> tuple[int, int]:
        with self._lock:
            ref = self._segments.get(name)
            segment = ref() if ref is not None else None
            if ref is not None and segment is None:  # dropped without close()
                del self._segments[name]
        if segment is None:
            raise NotFoundError(f"no segment {name!r} served here")
        return segment.dup_fd(), segment.size


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


MAX_CAPABILITY_BYTES = 255


def fetch_fd(address: str, name: str, timeout_s: float = 10.0, capability: bytes = b"") -> int:
    """Ask the fd server at `address` for segment `name`'s fd, which the caller owns
    and must close. NotFoundError if not served there, UnavailableError if nothing
    listens, TransferError for a broken exchange."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    with sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(_sockaddr(address))
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise UnavailableError(f"no fd server at {address!r}: {e}") from e
        try:
            sock.sendall(name.encode() + (b"\0" + capability if capability else b""))
            data, fds, _, _ = socket.recv_fds(sock, 2048, 1)
        except OSError as e:
            raise TransferError(f"fd request for {name!r} at {address!r} failed: {e}") from e
    if data.startswith(_OK) and len(data) == len(_OK) + _SIZE.size and len(fds) == 1:
        return fds[0]
    for fd in fds:  # never keep an fd that came with a malformed reply
        os.close(fd)
    if data.startswith(_NO):
        raise NotFoundError(data[len(_NO) :].decode(errors="replace"))
    raise TransferError(f"bad reply from fd server {address!r} for {name!r}")


_process_server: FdServer | None = None
_process_lock = threading.Lock()


def process_fd_server() -> FdServer:
    """This process's fd server, started on first use and kept for the process's life
    (its socket is abstract: it goes away with the process, nothing to clean)."""
    global _process_server
    with _process_lock:
        if _process_server is None or not _process_server.running:
            server = FdServer()
            server.start()
            _process_server = server
        return _process_server


def _forget_in_child() -> None:
    # A forked child has the listening socket but no accept thread: start afresh.
    global _process_server, _process_lock
    if _process_server is not None and _process_server._listener is not None:
        _process_server._listener.close()
    _process_server, _process_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


# -- the first design's files --------------------------------------------------------


def owner_label(owner: str) -> str:
    """How a node id appears in its segment names ('/' and NUL replaced, cut at 160)."""
    return owner.replace("/", "_").replace("\0", "_")[:160]


def reclaim_stale_files(node_id: str, directory: str = SHM_DIR) -> list[str]:
    """Remove the /dev/shm segment files a node of id `node_id` created before
    segments were anonymous ("kvs-<id>-<tier>-<8 hex>", this user's only); returns
    the names removed. Call it when the node starts: no live process uses them."""
    pattern = re.compile(rf"kvs-{re.escape(owner_label(node_id))}-(dram|ssd|hbm)-[0-9a-f]{{8}}")
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        path = os.path.join(directory, name)
        if not pattern.fullmatch(name):
            continue
        with contextlib.suppress(FileNotFoundError):
            if os.lstat(path).st_uid != os.getuid():
                continue
            os.unlink(path)
            removed.append(name)
            log.info("removed stale shared-memory file %s", path)
    return sorted(removed)
