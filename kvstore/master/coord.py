"""Coordination of HA masters: one small interface, an in-memory fake, the etcd adapter.

    coord = EtcdCoordinator(("127.0.0.1:2379",), "/kvstore")   # or MemoryCoordinator(store)
    await coord.connect()                        # UnavailableError naming the endpoint
    await coord.claim_cluster("pool-a")          # ExistsError: the prefix is another pool's
    lease = await coord.grant(2)                 # seconds; the leader key lives on it
    epoch = await coord.campaign(lease, b"...")  # an int (we lead) or None (someone does)
    await coord.commit(epoch, [(b"o/k", b"{...}"), (b"o/gone", None)])   # fenced batch
    ttl = await coord.keepalive(lease)           # 0: the lease is gone, so is leadership

The leader key is created on the candidate's lease only if absent (one etcd txn); its
create revision is the leader's *epoch*, which grows with every new leader. Every
metadata write is a txn that first compares the leader key's create revision with the
writer's epoch: a deposed leader's write is refused by etcd itself (DeposedError),
whatever that process believes. Keys under `<prefix>/`:

    cluster        the pool's id (first master writes it; others must match)
    leader         JSON {"id", "address"} of the leader, on its lease
    m/<record>     one journal record (kvstore.master.journal keys: n/..., s/..., o/...)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvstore.errors import BadRequestError, ExistsError, NotLeaderError, UnavailableError

Ops = Sequence[tuple[bytes, bytes | None]]  # (record key, value) puts, (key, None) deletes


class DeposedError(NotLeaderError):
    """A write under an epoch that no longer leads (etcd refused it: fencing)."""


@dataclass(frozen=True, slots=True)
class HAConfig:
    """How a master takes part in an HA pool (composed with MasterConfig).

    `lease_ttl_s`: the leader's etcd lease; a dead leader is replaced about this long
    after it stopped renewing. `advertise`: the address followers hand to clients
    ("" = the address the master bound). `connect_timeout_s`: how long a starting
    master retries an unreachable etcd (backoff) before failing with a typed error.
    A batch of journal records is split into txns of `max_txn_ops` puts/deletes and at
    most `max_txn_bytes` (etcd's defaults: --max-txn-ops 128, one op is the fence;
    --max-request-bytes 1.5 MiB), `txns_in_flight` at a time.
    """

    etcd: tuple[str, ...]
    cluster_id: str
    prefix: str = "/kvstore"
    lease_ttl_s: int = 2
    advertise: str = ""
    connect_timeout_s: float = 30.0
    poll_s: float = 0.1
    rpc_timeout_s: float = 2.0
    max_txn_ops: int = 127
    max_txn_bytes: int = 1 << 20
    txns_in_flight: int = 8
    compact_every_s: float = 30.0  # the leader compacts etcd's history this often (0 = never)

    def __post_init__(self) -> None:
        if not self.etcd:
            raise BadRequestError("HA needs at least one etcd endpoint")
        if not self.cluster_id or "/" in self.cluster_id:
            raise BadRequestError("HA needs a --cluster-id (no '/'): it guards the etcd prefix")
        if not self.prefix.startswith("/") or self.prefix.endswith("/"):
            raise BadRequestError(f"etcd prefix {self.prefix!r}: want /name, no trailing '/'")
        if self.lease_ttl_s < 1 or self.poll_s <= 0 or self.rpc_timeout_s <= 0:
            raise BadRequestError("lease_ttl_s >= 1, poll_s > 0 and rpc_timeout_s > 0 needed")
        if self.max_txn_ops < 1 or self.max_txn_bytes < 1024 or self.txns_in_flight < 1:
            raise BadRequestError("max_txn_ops, max_txn_bytes, txns_in_flight too small")


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """Who leads: its candidate id, advertised address, epoch and lease."""

    id: str
    address: str
    epoch: int
    lease: int

    @staticmethod
    def value(candidate_id: str, address: str) -> bytes:
        return json.dumps({"id": candidate_id, "address": address}).encode()


class Coordinator(Protocol):
    """What an HA master needs of a coordination service (etcd, or the fake)."""

    endpoint: str  # for messages: where the service is

    async def connect(self) -> None: ...
    async def claim_cluster(self, cluster_id: str) -> None: ...
    async def grant(self, ttl_s: int) -> int: ...
    async def keepalive(self, lease: int) -> int: ...
    async def revoke(self, lease: int) -> None: ...
    async def campaign(self, lease: int, value: bytes) -> int | None: ...
    async def leader(self) -> LeaderInfo | None: ...
    async def load(self) -> list[tuple[bytes, bytes]]: ...
    async def commit(self, epoch: int, ops: Ops) -> None: ...
    async def compact(self) -> None: ...
    async def close(self) -> None: ...


def _leader_info(value: bytes, epoch: int, lease: int) -> LeaderInfo:
    rec = json.loads(value)
    return LeaderInfo(rec.get("id", ""), rec.get("address", ""), epoch, lease)


def _mismatch(endpoint: str, prefix: str, theirs: bytes, ours: str) -> ExistsError:
    return ExistsError(
        f"etcd prefix {prefix!r} at {endpoint} belongs to cluster {theirs.decode()!r}, "
        f"not {ours!r}: refusing to join (another pool's metadata)"
    )


# ---- the fake ---------------------------------------------------------------------


@dataclass
class MemoryEtcd:
    """The etcd that MemoryCoordinators share: keys with create revisions and leases,
    a clock to expire leases by, and switches to inject faults."""

    clock: Callable[[], float] = field(default=lambda: 0.0)
    data: dict[bytes, tuple[bytes, int, int]] = field(default_factory=dict)  # value, rev, lease
    leases: dict[int, tuple[float, int]] = field(default_factory=dict)  # id -> expiry, ttl
    revision: int = 0
    down: bool = False  # every call fails UnavailableError while set
    commits: int = 0  # txns that wrote metadata
    compactions: int = 0

    def check(self) -> None:
        if self.down:
            raise UnavailableError("etcd (memory) unreachable: down")
        now = self.clock()
        for lease, (expiry, _) in list(self.leases.items()):
            if expiry <= now:
                self.drop_lease(lease)

    def drop_lease(self, lease: int) -> None:
        self.leases.pop(lease, None)
        for key in [k for k, (_, _, le) in self.data.items() if le == lease]:
            del self.data[key]

    def put(self, key: bytes, value: bytes, lease: int = 0) -> None:
        self.revision += 1
        old = self.data.get(key)
        self.data[key] = (value, old[1] if old else self.revision, lease)


class MemoryCoordinator:
    """A Coordinator over a MemoryEtcd: several of them on one store are several masters."""

    def __init__(self, store: MemoryEtcd, prefix: str = "/kvstore") -> None:
        self.store = store
        self.prefix = prefix.encode()
        self.endpoint = "memory"
        self.cut = False  # this master alone cut off from the store (a partition)

    def _check(self) -> None:
        if self.cut:
            raise UnavailableError("etcd (memory) unreachable: cut off")
        self.store.check()

    async def connect(self) -> None:
        self._check()

    async def claim_cluster(self, cluster_id: str) -> None:
        self._check()
        key = self.prefix + b"/cluster"
        if key not in self.store.data:
            self.store.put(key, cluster_id.encode())
        theirs = self.store.data[key][0]
        if theirs != cluster_id.encode():
            raise _mismatch(self.endpoint, self.prefix.decode(), theirs, cluster_id)

    async def grant(self, ttl_s: int) -> int:
        self._check()
        self.store.revision += 1
        lease = 1000 + self.store.revision
        self.store.leases[lease] = (self.store.clock() + ttl_s, ttl_s)
        return lease

    async def keepalive(self, lease: int) -> int:
        self._check()
        entry = self.store.leases.get(lease)
        if entry is None:
            return 0
        self.store.leases[lease] = (self.store.clock() + entry[1], entry[1])
        return entry[1]

    async def revoke(self, lease: int) -> None:
        if not self.store.down and not self.cut:
            self.store.drop_lease(lease)

    async def campaign(self, lease: int, value: bytes) -> int | None:
        self._check()
        key = self.prefix + b"/leader"
        if key in self.store.data or lease not in self.store.leases:
            return None
        self.store.put(key, value, lease)
        return self.store.data[key][1]

    async def leader(self) -> LeaderInfo | None:
        self._check()
        got = self.store.data.get(self.prefix + b"/leader")
        return None if got is None else _leader_info(got[0], got[1], got[2])

    async def load(self) -> list[tuple[bytes, bytes]]:
        self._check()
        start = self.prefix + b"/m/"
        items = sorted((k, v[0]) for k, v in self.store.data.items() if k.startswith(start))
        return [(k[len(start) :], v) for k, v in items]

    async def commit(self, epoch: int, ops: Ops) -> None:
        self._check()
        got = self.store.data.get(self.prefix + b"/leader")
        if got is None or got[1] != epoch:
            raise DeposedError(f"not leader: epoch {epoch} was deposed")
        for key, value in ops:
            full = self.prefix + b"/m/" + key
            if value is None:
                self.store.data.pop(full, None)
            else:
                self.store.put(full, value)
        self.store.commits += 1

    async def compact(self) -> None:
        self._check()
        self.store.compactions += 1

    async def close(self) -> None:
        pass


# ---- etcd -------------------------------------------------------------------------


class EtcdCoordinator:
    """The Coordinator on a real etcd v3, through `etcd3aio` (extra `ha`)."""

    PAGE = 2000  # keys per range read while loading (etcd3aio's channel takes 4 MiB)

    def __init__(
        self, endpoints: Sequence[str], prefix: str = "/kvstore", rpc_timeout_s: float = 2.0
    ) -> None:
        self.endpoints = tuple(endpoints)
        self.endpoint = ",".join(self.endpoints)
        self.prefix = prefix.encode()
        self.timeout = rpc_timeout_s
        self._client: Any = None

    async def connect(self) -> None:
        """Open the channel and read once (UnavailableError naming the endpoint)."""
        try:
            from etcd3aio import Etcd3Client
        except ImportError:
            raise UnavailableError(
                "HA needs the etcd client: pip install 'kvstore[ha]' (etcd3aio)"
            ) from None
        if self._client is None:
            client = Etcd3Client(list(self.endpoints), rpc_max_attempts=1)
            # Reconnect within a second of etcd coming back (gRPC's default backoff grows
            # to 120 s); ConnectionManager has no parameter for it.
            client._manager.grpc_options += [
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ]
            await client.connect()
            self._client = client
        await self._call(self._client.kv.get, self.prefix + b"/cluster")

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One etcd call, bounded; its failures as UnavailableError naming the endpoint."""
        import grpc
        from etcd3aio import EtcdError

        try:
            return await fn(*args, timeout=self.timeout, **kwargs)
        except (EtcdError, grpc.RpcError, TimeoutError, OSError) as exc:
            detail = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise UnavailableError(f"etcd at {self.endpoint} unreachable: {detail}") from None

    async def claim_cluster(self, cluster_id: str) -> None:
        kv = self._client.kv
        key = self.prefix + b"/cluster"
        put = kv.txn_op_put(key, cluster_id.encode())
        resp = await self._call(
            kv.txn, [kv.txn_compare_create_revision(key, 0)], [put], [kv.txn_op_get(key)]
        )
        if resp.succeeded:
            return
        theirs = resp.responses[0].response_range.kvs[0].value
        if theirs != cluster_id.encode():
            raise _mismatch(self.endpoint, self.prefix.decode(), theirs, cluster_id)

    async def grant(self, ttl_s: int) -> int:
        resp = await self._call(self._client.lease.grant, ttl_s)
        return int(resp.ID)

    async def keepalive(self, lease: int) -> int:
        """Renew `lease` once; its TTL now (0 when etcd no longer has it)."""
        stream = self._client.lease.keep_alive(lease)

        async def first() -> int:
            async for resp in stream:
                return int(resp.TTL)
            return 0

        try:
            return await self._call(lambda timeout: asyncio.wait_for(first(), timeout))
        finally:
            stream.cancel()

    async def revoke(self, lease: int) -> None:
        """Best effort: an expired lease or an unreachable etcd is no error here."""
        with contextlib.suppress(UnavailableError):
            await self._call(self._client.lease.revoke, lease)

    async def campaign(self, lease: int, value: bytes) -> int | None:
        kv = self._client.kv
        key = self.prefix + b"/leader"
        resp = await self._call(
            kv.txn, [kv.txn_compare_create_revision(key, 0)],
            [kv.txn_op_put(key, value, lease=lease), kv.txn_op_get(key)],
        )  # fmt: skip
        if not resp.succeeded:
            return None
        return int(resp.responses[1].response_range.kvs[0].create_revision)

    async def leader(self) -> LeaderInfo | None:
        resp = await self._call(self._client.kv.get, self.prefix + b"/leader")
        if not resp.kvs:
            return None
        kv = resp.kvs[0]
        return _leader_info(kv.value, int(kv.create_revision), int(kv.lease))

    async def load(self) -> list[tuple[bytes, bytes]]:
        start = self.prefix + b"/m/"
        end = self.prefix + b"/m0"  # "0" follows "/"
        out: list[tuple[bytes, bytes]] = []
        key = start
        while True:
            resp = await self._call(self._client.kv.get, key, range_end=end, limit=self.PAGE)
            out += [(kv.key[len(start) :], kv.value) for kv in resp.kvs]
            if not resp.more or not resp.kvs:
                return out
            key = resp.kvs[-1].key + b"\x00"

    async def commit(self, epoch: int, ops: Ops) -> None:
        kv = self._client.kv
        base = self.prefix + b"/m/"
        fence = kv.txn_compare_create_revision(self.prefix + b"/leader", epoch)
        writes = [
            kv.txn_op_delete(base + k) if v is None else kv.txn_op_put(base + k, v) for k, v in ops
        ]
        resp = await self._call(kv.txn, [fence], writes)
        if not resp.succeeded:
            raise DeposedError(f"not leader: etcd refused a write of epoch {epoch} (deposed)")

    async def compact(self) -> None:
        """Drop the history before now: every journal write is a revision, and etcd keeps
        them all (memory and disk grow) until compacted."""
        resp = await self._call(self._client.kv.get, self.prefix + b"/leader", keys_only=True)
        with contextlib.suppress(UnavailableError):  # "already compacted" is no error here
            await self._call(self._client.kv.compact, int(resp.header.revision))

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
