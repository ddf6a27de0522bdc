"""Mooncake Store's result types: replica descriptors, buffer handles, task records.

A kvstore replica in HBM or DRAM is a Mooncake memory replica; one on SSD is a
local-disk replica (kvstore's SSD tier is a storage node's own disk, which is what
Mooncake's `is_local_disk_replica` names). Every listed replica is COMPLETE: the
master lists only committed objects.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from enum import IntEnum

from kvstore.types import Location, Tier


class ReplicaStatus(IntEnum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class TaskStatus(IntEnum):
    PENDING = 0
    PROCESSING = 1
    FAILED = 2
    SUCCESS = 3


class TaskType(IntEnum):
    REPLICA_COPY = 0
    REPLICA_MOVE = 1


@dataclass(frozen=True, slots=True)
class BufferDescriptor:
    """Where a memory replica lies: the segment (node) and the byte range in it."""

    transport_endpoint_: str
    buffer_address_: int
    size_: int
    tier: str


@dataclass(frozen=True, slots=True)
class MemoryDescriptor:
    buffer_descriptor: BufferDescriptor


@dataclass(frozen=True, slots=True)
class DiskDescriptor:
    file_path: str
    object_size: int


@dataclass(frozen=True, slots=True)
class ReplicaDescriptor:
    """One replica of an object, as Mooncake's `Replica::Descriptor` presents it."""

    location: Location
    status: ReplicaStatus = ReplicaStatus.COMPLETE

    def is_memory_replica(self) -> bool:
        return self.location.tier in (Tier.HBM, Tier.DRAM)

    def is_disk_replica(self) -> bool:
        return self.location.tier == Tier.SSD

    def is_local_disk_replica(self) -> bool:
        return self.location.tier == Tier.SSD

    def get_memory_descriptor(self) -> MemoryDescriptor:
        if not self.is_memory_replica():
            raise RuntimeError("not a memory replica")
        loc = self.location
        return MemoryDescriptor(
            BufferDescriptor(f"{loc.node_id}/{loc.segment}", loc.offset, loc.length, loc.tier.name)
        )

    def get_disk_descriptor(self) -> DiskDescriptor:
        if not self.is_disk_replica():
            raise RuntimeError("not a disk replica")
        loc = self.location
        return DiskDescriptor(f"{loc.node_id}/{loc.segment}@{loc.offset}", loc.length)


class BufferHandle(bytearray):
    """An object's bytes in memory the handle owns, with Mooncake's `ptr()`/`size()`;
    a bytearray, so it has the buffer protocol (`bytes(h)`, `np.frombuffer(h)`)."""

    def ptr(self) -> int:
        if not self:
            return 0
        return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self))

    def size(self) -> int:
        return len(self)
