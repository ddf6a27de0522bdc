"""NixlEngine: one-sided READ/WRITE through NIXL's UCX backend (optional extra).

NIXL (`pip install --no-deps nixl-cu12`) is imported lazily; `nixl_available()`
says whether it can be. A process that serves memory calls `expose(name, buf)`:
the segment descriptor then carries `nixl_meta` = base address (u64 LE) + this
agent's metadata, which an initiator loads with `add_remote_agent`. Each submit
posts one NIXL transfer per remote agent and polls it to completion in a thread.

UCX_MODULES defaults to "^efa" (see `_nixl_api`: without it every process that made
an agent died of SIGSEGV at exit) and UCX_LOG_FILE to stderr. NIXL logs INFO lines
to stdout on import and per agent; unless the user set NIXL_LOG_LEVEL, the import
here asks for warnings only, and NIXL's console handler is moved to stderr (a
library must not write on a program's stdout).
"""

from __future__ import annotations

import importlib
import logging
import os
import struct
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from typing import Any

from kvstore.buffers import address_of, byte_view
from kvstore.errors import BadRequestError, TransferError
from kvstore.transfer.base import (
    BufferDescriptor,
    SegmentDescriptor,
    TransferEngine,
    TransferHandle,
    TransferOp,
    TransferRequest,
    local_host_id,
)

_ADDR = struct.Struct("<Q")
_MODULES = ("nixl._api", "nixl_cu12._api", "nixl_cu13._api")


@cache
def _nixl_api() -> Any | None:
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")  # read once, when NIXL sets up logging
    # UCX's EFA module links the system libefa -> libibverbs -> libnl beside the copies
    # the wheel bundles; two libnl-route copies segfault in their destructors at exit.
    os.environ.setdefault("UCX_MODULES", "^efa")  # IB/RDMA (mlx5) modules still load
    os.environ.setdefault("UCX_LOG_FILE", "stderr")  # UCX's C logs default to stdout
    for module in _MODULES:
        try:
            api = importlib.import_module(module)
        except ImportError:
            continue
        _log_to_stderr(logging.getLogger("nixl"))
        return api
    return None


def _log_to_stderr(logger: logging.Logger) -> None:
    """Move `logger`'s stdout stream handlers to stderr."""
    for handler in logger.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
            handler.setStream(sys.stderr)


def nixl_available() -> bool:
    """Whether a NIXL Python package can be imported here."""
    return _nixl_api() is not None


def pack_meta(address: int, agent_meta: bytes) -> bytes:
    return _ADDR.pack(address) + agent_meta


def unpack_meta(meta: bytes) -> tuple[int, bytes]:
    if len(meta) <= _ADDR.size:
        raise BadRequestError("segment has no NIXL metadata")
    return _ADDR.unpack_from(meta)[0], meta[_ADDR.size :]


class NixlEngine(TransferEngine):
    """One-sided transfers between NIXL agents (UCX: shm/TCP/RDMA as UCX finds)."""

    kind = "nixl"

    def __init__(self, io_timeout: float = 30.0, agent_name: str | None = None) -> None:
        api = _nixl_api()
        if api is None:
            raise BadRequestError("NIXL is not installed (pip install --no-deps nixl-cu12)")
        super().__init__()
        self.io_timeout = io_timeout
        self._api = api
        name = agent_name or f"kvstore-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._agent = api.nixl_agent(name, api.nixl_agent_config(backends=["UCX"]))
        self._addrs: dict[str, int] = {}
        self._regs: list[Any] = []
        self._remotes: dict[bytes, str] = {}
        self._lock = threading.Lock()

    def _register_memory(self, view: memoryview) -> int:
        address = address_of(view)
        self._regs.append(self._agent.register_memory([(address, view.nbytes, 0, "")], "DRAM"))
        return address

    def register(self, name: str, buffer: object) -> BufferDescriptor:
        desc = super().register(name, buffer)
        self._addrs[name] = self._register_memory(self.buffers.view(desc))
        return desc

    def unregister(self, name: str) -> bool:
        """Forget a buffer (its NIXL registration lasts until `close`)."""
        self._addrs.pop(name, None)
        return super().unregister(name)

    def expose(
        self, name: str, buffer: object, base: SegmentDescriptor | None = None
    ) -> SegmentDescriptor:
        """Serve `buffer` to NIXL peers; returns `base` (or a new descriptor) with
        `nixl_meta` filled in."""
        view = byte_view(buffer, writable=True)
        with self._lock:
            address = self._register_memory(view)
            meta = pack_meta(address, self._agent.get_agent_metadata())
        if base is None:
            return SegmentDescriptor(name, view.nbytes, local_host_id(), nixl_meta=meta)
        return replace(base, nixl_meta=meta)

    def _remote_agent(self, meta: bytes) -> str:
        with self._lock:
            agent = self._remotes.get(meta)
            if agent is None:
                agent = self._remotes[meta] = self._agent.add_remote_agent(meta)
            return agent

    def submit(self, batch: Sequence[TransferRequest]) -> TransferHandle:
        self.check_batch(batch)
        groups: dict[tuple[bytes, TransferOp], list[int]] = {}
        for index, req in enumerate(batch):
            unpack_meta(req.remote.nixl_meta)  # validates before any I/O
            groups.setdefault((req.remote.nixl_meta, req.op), []).append(index)
        handle = TransferHandle(len(batch))
        for (meta, op), indices in groups.items():
            self._post(handle, meta, op, [batch[i] for i in indices], indices)
        return handle

    def _post(
        self,
        handle: TransferHandle,
        meta: bytes,
        op: TransferOp,
        reqs: list[TransferRequest],
        indices: list[int],
    ) -> None:
        try:
            base, agent_meta = unpack_meta(meta)
            agent = self._remote_agent(agent_meta)
            local = [(self._addrs[r.local.name] + r.local_offset, r.length, 0) for r in reqs]
            remote = [(base + r.remote_offset, r.length, 0) for r in reqs]
            xfer = self._agent.initialize_xfer(
                op.name,
                self._agent.get_xfer_descs(local, "DRAM"),
                self._agent.get_xfer_descs(remote, "DRAM"),
                agent,
            )
            state = self._agent.transfer(xfer)
        except Exception as e:  # nixl raises its own exception types
            for index in indices:
                handle.complete(index, TransferError(f"NIXL post failed: {e}"))
            return
        threading.Thread(
            target=self._poll, args=(handle, xfer, state, indices), daemon=True
        ).start()

    def _poll(self, handle: TransferHandle, xfer: Any, state: str, indices: list[int]) -> None:
        deadline = time.monotonic() + self.io_timeout
        delay = 0.0
        while state == "PROC" and time.monotonic() < deadline:
            time.sleep(delay)  # NIXL offers only polling; back off to 1 ms
            delay = min(0.001, delay * 2 or 1e-5)
            state = self._agent.check_xfer_state(xfer)
        error = None if state == "DONE" else TransferError(f"NIXL transfer ended in {state}")
        if state != "PROC":
            xfer.release()
        for index in indices:
            handle.complete(index, error)

    def close(self) -> None:
        with self._lock:
            regs, self._regs = self._regs, []
        for reg in regs:
            self._agent.deregister_memory(reg)
