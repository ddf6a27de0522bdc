"""`setup(..., enable_ssd_offload=True)` on the facade: an SSD segment beside the lent DRAM.

Mooncake's client then starts its FileStorage in `ssd_offload_path`, else in
`$MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`, capped at `$MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES`
(2 TB by default there, files grown as objects arrive). Here the client's lent node gets
an SSD segment (kvstore.tiers.ssd_segment) in a directory of its own under that path: the
master offloads the DRAM segment's coldest objects to it past the DRAM watermark and
promotes them back after `promote_after` reads (kvstore.master.tiering), so objects
evicted from DRAM stay readable, as LOCAL_DISK replicas.

The slab file is preallocated (posix_fallocate), so the default capacity is modest:
`DEFAULT_SEGMENTS` times the DRAM segment (at least `MIN_BYTES`), and never more than
half the free space of the filesystem; `$MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES` sets it
(still at most half the free space: it is a limit in Mooncake, a reservation here).

The directory is per client (`kvstore-XXXXXXXX` under the path): an SSD directory records
the node id that owns it and refuses any other, and a facade client has a fresh id each
run, so what it wrote can never be served again by a later client. It is removed at
`close()` (and at interpreter exit for stores never closed); a killed process leaves it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

from kvstore.compat.mooncake_config import parse_size
from kvstore.errors import BadRequestError

ENV_PATH = "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"
ENV_LIMIT = "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"
DEFAULT_SEGMENTS = 4  # default SSD capacity: this many times the lent DRAM segment
MIN_BYTES = 64 << 20  # ... and at least this
ALIGN = 1 << 20  # capacities are whole MiB
PREFIX = "kvstore-"


@dataclass(frozen=True, slots=True)
class SsdOffload:
    """This client's SSD directory (created by `plan`, removed by `remove`) and size."""

    directory: str
    capacity: int


def flag(value: object, name: str) -> bool:
    """A bool argument as Mooncake's setup takes it (a bool, or "true"/"false" from
    the dict form, whose values are all strings there)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "false", "0", ""):
        return value.strip().lower() in ("true", "1")
    raise BadRequestError(f"{name} must be a bool, got {value!r}")


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def capacity_for(path: str, segment_bytes: int, limit: str | None) -> int:
    """The SSD segment's size in `path` (see the module doc); BadRequestError if none fits."""
    cap = (
        parse_size(limit, ENV_LIMIT) if limit else max(DEFAULT_SEGMENTS * segment_bytes, MIN_BYTES)
    )
    cap = min(cap, free_bytes(path) // 2) // ALIGN * ALIGN
    if cap <= 0:
        raise BadRequestError(f"SSD offload: no room in {path!r} ({free_bytes(path)} bytes free)")
    return cap


def check_path(path: str) -> None:
    """Mooncake's FileStorage rules: an absolute path, no "..", an existing writable
    directory (it is not created)."""
    if not path:
        raise BadRequestError(f"enable_ssd_offload needs ssd_offload_path or ${ENV_PATH}")
    if not os.path.isabs(path) or ".." in path.split(os.sep):
        raise BadRequestError(f"SSD offload path {path!r} must be absolute, without '..'")
    if not os.path.isdir(path):
        raise BadRequestError(f"SSD offload path {path!r} is not an existing directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise BadRequestError(f"SSD offload path {path!r} is not writable")


def plan(ssd_offload_path: str, segment_bytes: int) -> SsdOffload:
    """Check the path (the argument, else $MOONCAKE_OFFLOAD_FILE_STORAGE_PATH), size the
    segment and create this client's own directory under it."""
    if not isinstance(ssd_offload_path, str):
        raise BadRequestError(f"ssd_offload_path must be a str, got {ssd_offload_path!r}")
    path = ssd_offload_path or os.environ.get(ENV_PATH, "")
    check_path(path)
    capacity = capacity_for(path, segment_bytes, os.environ.get(ENV_LIMIT) or None)
    try:
        directory = tempfile.mkdtemp(prefix=PREFIX, dir=path)
    except OSError as exc:
        raise BadRequestError(f"SSD offload path {path!r}: {exc}") from exc
    return SsdOffload(directory, capacity)


def remove(offload: SsdOffload | None) -> None:
    """Delete the client's SSD directory (its slab, index and node.json)."""
    if offload is not None:
        shutil.rmtree(offload.directory, ignore_errors=True)
