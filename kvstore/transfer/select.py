"""Choosing a transport: `make_engine(kind)` and the per-peer routing AutoEngine.

"auto" routes each request by its remote segment: shared memory when the segment
is shared memory on this host (mapped by fd), the slab file's fd when it is an SSD
segment on this host whose node hands that fd out (kvstore.transfer.file; TCP when it
does not), NIXL when installed and the segment publishes NIXL metadata, TCP otherwise.
"shm", "tcp" and "nixl" force one transport.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence

from kvstore.errors import BadRequestError
from kvstore.transfer.base import (
    BufferDescriptor,
    SegmentDescriptor,
    TransferEngine,
    TransferHandle,
    TransferRequest,
)
from kvstore.transfer.file import FileEngine, file_reachable
from kvstore.transfer.nixl import nixl_available
from kvstore.transfer.shm import ShmEngine, shm_reachable
from kvstore.transfer.tcp import TcpConfig, TcpEngine

ENGINE_KINDS = ("auto", "shm", "tcp", "nixl")


def choose_kind(remote: SegmentDescriptor, *, nixl: bool | None = None) -> str:
    """The transport "auto" uses for `remote` (`nixl` overrides the install check)."""
    if shm_reachable(remote):
        return "shm"
    if file_reachable(remote):
        return "file"
    has_nixl = nixl_available() if nixl is None else nixl
    if has_nixl and remote.nixl_meta:
        return "nixl"
    if remote.endpoint:
        return "tcp"
    raise BadRequestError(f"segment {remote.name!r} is reachable by no transport here")


def make_engine(
    kind: str = "auto", *, tcp: TcpConfig | None = None, shm_prefault: bool = True
) -> TransferEngine:
    """An engine of `kind` (one of ENGINE_KINDS); BadRequestError for an unknown kind.
    `shm_prefault`: shared memory maps a peer's segment with a background pre-fault."""
    if kind == "auto":
        factory = functools.partial(_make_one, shm_prefault=shm_prefault)
        return AutoEngine(tcp=tcp, factory=factory)
    return _make_one(kind, tcp, shm_prefault)


def _make_one(kind: str, tcp: TcpConfig | None, shm_prefault: bool = True) -> TransferEngine:
    if kind == "shm":
        return ShmEngine(prefault=shm_prefault)
    if kind == "tcp":
        return TcpEngine(tcp)
    if kind == "file":
        return FileEngine()
    if kind == "nixl":
        from kvstore.transfer.nixl import NixlEngine

        return NixlEngine()
    raise BadRequestError(f"unknown transfer engine {kind!r}; valid: {', '.join(ENGINE_KINDS)}")


class _Join(TransferHandle):
    """A handle over sub-handles, each covering some of the batch's indices."""

    def __init__(self, parts: list[tuple[TransferHandle, list[int]]], count: int) -> None:
        super().__init__(count)
        self._parts = parts

    def wait(self, timeout: float | None = None) -> list[Exception | None]:
        results: list[Exception | None] = [None] * len(self._finished)
        deadline = None if timeout is None else time.monotonic() + timeout
        for handle, indices in self._parts:  # sub-handles run concurrently
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            for index, result in zip(indices, handle.wait(left), strict=True):
                results[index] = result
        return results

    def done(self) -> bool:
        return all(handle.done() for handle, _ in self._parts)


class AutoEngine(TransferEngine):
    """Routes each request to the transport `choose_kind` picks; sub-engines are made
    on first use and see every buffer registered here."""

    kind = "auto"

    def __init__(
        self,
        *,
        tcp: TcpConfig | None = None,
        factory: Callable[[str, TcpConfig | None], TransferEngine] = _make_one,
    ) -> None:
        super().__init__()
        self._tcp = tcp
        self._factory = factory
        self._engines: dict[str, TransferEngine] = {}
        self._objects: dict[str, object] = {}
        self._lock = threading.Lock()

    def register(self, name: str, buffer: object) -> BufferDescriptor:
        desc = super().register(name, buffer)
        with self._lock:
            self._objects[name] = buffer
            engines = list(self._engines.values())
        for engine in engines:
            engine.register(name, buffer)
        return desc

    def unregister(self, name: str) -> bool:
        with self._lock:
            self._objects.pop(name, None)
            engines = list(self._engines.values())
        for engine in engines:
            engine.unregister(name)
        return super().unregister(name)

    def engine(self, kind: str) -> TransferEngine:
        """The sub-engine of `kind`, made (and given every registered buffer) on first use."""
        with self._lock:
            engine = self._engines.get(kind)
            if engine is None:
                engine = self._engines[kind] = self._factory(kind, self._tcp)
                for name, buffer in self._objects.items():
                    engine.register(name, buffer)
            return engine

    def submit(self, batch: Sequence[TransferRequest]) -> TransferHandle:
        self.check_batch(batch)
        groups: dict[str, list[int]] = {}
        for index, req in enumerate(batch):
            kind = choose_kind(req.remote)
            if kind == "file" and not self._file_usable(req):
                kind = "tcp"  # the node hands out no slab fd (or not to us): its endpoint
            groups.setdefault(kind, []).append(index)
        parts = [
            (self.engine(kind).submit([batch[i] for i in indices]), indices)
            for kind, indices in groups.items()
        ]
        return _Join(parts, len(batch))

    def _file_usable(self, req: TransferRequest) -> bool:
        engine = self.engine("file")
        return isinstance(engine, FileEngine) and engine.usable(req.remote, req.capability)

    def close(self) -> None:
        with self._lock:
            engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            engine.close()
