"""Configuration of a client: one frozen dataclass, validated at construction."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

from kvstore.errors import BadRequestError
from kvstore.transfer.base import parse_endpoint
from kvstore.transfer.select import ENGINE_KINDS

_CPUS = os.cpu_count() or 1  # read once: os.cpu_count() reads sysfs each call


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Where the master is and how this client moves bytes.

    `segment_bytes` > 0 contributes a DRAM segment of that size to the pool (the client
    becomes a node named `client_id`; its puts prefer it), `ssd_dir` + `ssd_bytes` an SSD
    segment beside it. `tenant` namespaces every
    key and group ("<tenant>/<key>" on the wire). `credentials` (grpc.ChannelCredentials)
    makes the master channel secure. `timeout_s` bounds every RPC and every transfer.
    `checksums` records an xxh3_64 per object at put and verifies it on every read.
    """

    master: str
    client_id: str | None = None  # None: a fresh "client-<uuid>"
    transport: str = "auto"
    segment_bytes: int = 0
    hbm_segment_bytes: int = 0  # device memory lent to the pool too (an HBM segment)
    hbm_device: str = "cuda"  # its torch device ("cpu" runs the same path without a GPU)
    # An SSD segment lent beside them (kvstore.tiers.ssd_segment): a slab file of
    # `ssd_bytes` (preallocated) and its index in `ssd_dir`, an existing directory of this
    # client id only (it records the id). The master offloads cold objects of the lent
    # DRAM there past its watermark and promotes them back on reads (master/tiering.py).
    ssd_dir: str | None = None
    ssd_bytes: int = 0
    tenant: str = ""
    credentials: object | None = None
    replicas: int = 1
    timeout_s: float = 10.0
    lease_ttl_s: float = 5.0
    listen_host: str = "127.0.0.1"  # where a contributed segment's TCP endpoint listens
    # Checksums (xxh3_64): recorded with every put, verified on every read; a replica
    # that fails is never returned (the next one is tried) and is reported to the
    # master. `verify_dram` False skips the check for DRAM/HBM replicas only.
    checksums: bool = True
    verify_dram: bool = True
    # HA (kvstore.master.ha): every master of the pool; calls follow the leader among
    # them (kvstore.failover) for up to `failover_timeout_s`. () = `master` alone.
    # `Client("a:1,b:2,c:3")` fills both: master = the first, masters = all.
    masters: tuple[str, ...] = ()
    failover_timeout_s: float = 15.0
    # The master's hot-path calls over its fast lane (kvstore.fastlane) when it offers
    # one; never with `credentials` (the lane is plaintext).
    fast_lane: bool = True
    # Where recently looked-up or written keys are (kvstore.client.locations): a get of
    # one reads it with no master call, checked against its checksum. 0 entries = off.
    location_cache_entries: int = 16384
    location_cache_ttl_s: float = 2.0
    # Puts of objects up to `extent_max_object` bytes go into an extent of up to
    # `extent_bytes` the master leases to this client (kvstore.client.extents): one
    # master round trip per put instead of two. 0 = off.
    extent_bytes: int = 32 << 20
    extent_max_object: int = 4 << 20
    # Threads (this one included) that copy and checksum a same-host read of at least
    # 4 MiB out of mapped memory: one memcpy is bound by one core's memory latency, two
    # move ~2x the bytes (kvstore.client.reads). 0 = min(4, CPUs); 1 = this thread only.
    copy_threads: int = 0
    # Fault a same-host node's segment into this process's page tables on a background
    # thread when it is first mapped (kvstore.tiers.prefault), so that copies into it
    # mostly find their pages mapped (~1 us a page otherwise, on first touch). Off: the
    # mapping is lazy, and no thread runs beside the caller's (a busy host's choice).
    shm_prefault: bool = True
    # After sending a master call over the fast lane, poll for its reply this long before
    # sleeping in recv (kvstore.busypoll): a sleeping thread's wake-up costs tens of us,
    # more than the master's work. Adaptive (it stops polling while polls keep missing),
    # never on one CPU; 0 = off (every wait sleeps).
    busy_poll_us: int = 200

    # This client's credential (kvstore.security; "" = the process's KVSTORE_SECURITY_*):
    # mTLS files or a token file. It fills `credentials`, and client_id and tenant when
    # they are left unset (the master checks both against the credential).
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    token_file: str = ""

    def __post_init__(self) -> None:
        parse_endpoint(self.master)
        from kvstore.security.process import resolve

        resolve(self, "client_id", "tenant")
        if self.client_id is None:  # frozen: fill the default once, at construction
            object.__setattr__(self, "client_id", f"client-{uuid.uuid4().hex[:12]}")
        if not isinstance(self.client_id, str) or not 0 < len(self.client_id) <= 256:
            raise BadRequestError("client_id must be 1..256 characters")
        if self.transport not in ENGINE_KINDS:
            raise BadRequestError(
                f"unknown transport {self.transport!r}; valid: {', '.join(ENGINE_KINDS)}"
            )
        if self.segment_bytes < 0 or self.hbm_segment_bytes < 0:
            raise BadRequestError("segment_bytes and hbm_segment_bytes must be >= 0")
        if self.ssd_bytes < 0:
            raise BadRequestError("ssd_bytes must be >= 0")
        if self.ssd_bytes and not self.ssd_dir:
            raise BadRequestError("ssd_bytes > 0 needs ssd_dir")
        if self.ssd_bytes and not (self.segment_bytes or self.hbm_segment_bytes):
            raise BadRequestError(
                "an SSD segment is lent beside segment_bytes or hbm_segment_bytes"
            )
        if "/" in self.tenant:
            raise BadRequestError("tenant must not contain '/'")
        if not 1 <= self.replicas <= 16:
            raise BadRequestError(f"replicas must be in [1, 16], got {self.replicas}")
        if self.timeout_s <= 0 or self.lease_ttl_s <= 0:
            raise BadRequestError("timeout_s and lease_ttl_s must be > 0")
        if self.extent_bytes < 0 or self.extent_max_object < 0:
            raise BadRequestError("extent_bytes and extent_max_object must be >= 0")
        if not 0 <= self.busy_poll_us <= 100_000:
            raise BadRequestError(f"busy_poll_us must be in [0, 100000], got {self.busy_poll_us}")
        if not 0 <= self.copy_threads <= 64:
            raise BadRequestError(f"copy_threads must be in [0, 64], got {self.copy_threads}")
        if self.location_cache_entries < 0 or self.location_cache_ttl_s <= 0:
            raise BadRequestError(
                "location_cache_entries must be >= 0 and location_cache_ttl_s > 0"
            )

    @property
    def copy_lanes(self) -> int:
        """Threads a large same-host read is copied and checksummed on."""
        return self.copy_threads or min(4, _CPUS)

    @property
    def id(self) -> str:
        """The client id (never None after construction)."""
        assert self.client_id is not None
        return self.client_id

    def wire_key(self, key: str) -> str:
        """The key as the master sees it: namespaced by tenant."""
        return f"{self.tenant}/{key}" if self.tenant else key
