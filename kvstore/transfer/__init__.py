"""kvstore.transfer: the data plane, one-sided READ/WRITE between registered memory.

    engine = make_engine("auto")              # or "shm" / "tcp" / "nixl"
    buf = engine.register("staging", array)   # local memory
    engine.read(segment_descriptor, offset, length, buf)
    handle = engine.submit([TransferRequest(...), ...]); handle.wait(timeout)

A node serves its segments with `TransferServer` (TCP) and publishes their
`SegmentDescriptor`s; same-host peers map shared-memory segments directly (by fd).
"""

from kvstore.transfer.base import (
    BufferDescriptor,
    SegmentDescriptor,
    TransferEngine,
    TransferHandle,
    TransferOp,
    TransferRequest,
    local_host_id,
    raise_first,
)
from kvstore.transfer.select import ENGINE_KINDS, AutoEngine, choose_kind, make_engine
from kvstore.transfer.tcp import TcpConfig
from kvstore.transfer.tcp_server import ServerConfig, TransferServer

__all__ = [
    "ENGINE_KINDS",
    "AutoEngine",
    "BufferDescriptor",
    "SegmentDescriptor",
    "ServerConfig",
    "TcpConfig",
    "TransferEngine",
    "TransferHandle",
    "TransferOp",
    "TransferRequest",
    "TransferServer",
    "choose_kind",
    "local_host_id",
    "make_engine",
    "raise_first",
]
