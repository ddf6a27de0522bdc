"""Tenants: whose keys are whose, and how much each holds.

A tenant's keys are its wire keys "T/..." (kvstore.client.config.ClientConfig.wire_key
already prefixes every key and group); a client credential names its tenant, and the
master's guard confines that client to the prefix (kvstore.security.authz).

`Ledger` keeps, per tenant, the bytes its objects reserved (size x replicas asked at
PutStart, size at CommitExtent) and an estimate of the master's metadata memory, so that
PutStart can refuse a tenant over its quota, or any put past `max_metadata_bytes`,
without walking every object. It learns of new objects from the guard (each admitted
put, commit and announcement) and of gone ones by reconciling against `state.objects`
(only key membership, so it needs no hook in the metadata core): a tenant before it
is refused (at most every `RECONCILE_S`), and everything whenever the ledger has
grown to twice the objects. A tenant that freed space may so be refused for up to
RECONCILE_S after; never one under its quota by the master's own count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from kvstore.errors import NoSpaceError

OBJECT_BYTES = 800  # measured: ~730 B of metadata per object with a 40-byte key, + ledger
REPLICA_BYTES = 160
RECONCILE_S = 0.25


def tenant_of(key: str) -> str:
    """The tenant of a wire key ("" for a key without a "T/" prefix)."""
    head, sep, _ = key.partition("/")
    return head if sep else ""


def object_cost(key: str, group: str, size: int, replicas: int) -> tuple[int, int]:
    """(bytes reserved in the pool, estimated metadata bytes) of one object."""
    meta = OBJECT_BYTES + len(key) + (len(group) if group and group != key else 0)
    return size * max(1, replicas), meta + REPLICA_BYTES * max(0, replicas - 1)


class Ledger:
    """Per-tenant reserved bytes and metadata estimate of one master's objects."""

    def __init__(self, state: Any, config: Any, clock: Callable[[], float] = time.monotonic):
        self.state = state
        self.clock = clock
        self.quota_default = config.tenant_quota_bytes
        self.quotas = {t: int(b) for t, b in config.tenant_quotas}
        self.max_metadata = config.max_metadata_bytes
        self.entries: dict[str, tuple[int, int]] = {}  # key -> (bytes, meta)
        self.by_tenant: dict[str, set[str]] = {}
        self.tenant_bytes: dict[str, int] = {}
        self.metadata_bytes = 0
        self._reconciled: dict[str, float] = {}
        for key in list(state.objects):  # what a restart restored
            obj = state.objects.get(key)
            if obj is not None:
                self.record(key, getattr(obj, "group", ""), obj.size, len(obj.replicas))

    # ---- bookkeeping ------------------------------------------------------------

    def record(self, key: str, group: str, size: int, replicas: int) -> None:
        """An object the master now holds (replacing what the ledger had for its key)."""
        self.forget(key)
        held, meta = object_cost(key, group, size, replicas)
        tenant = tenant_of(key)
        self.entries[key] = (held, meta)
        self.by_tenant.setdefault(tenant, set()).add(key)
        self.tenant_bytes[tenant] = self.tenant_bytes.get(tenant, 0) + held
        self.metadata_bytes += meta
        if len(self.entries) > 2 * len(self.state.objects) + 1024:
            self.reconcile()

    def forget(self, key: str) -> None:
        entry = self.entries.pop(key, None)
        if entry is None:
            return
        tenant = tenant_of(key)
        keys = self.by_tenant[tenant]
        keys.discard(key)
        left = self.tenant_bytes[tenant] - entry[0]
        if keys:
            self.tenant_bytes[tenant] = left
        else:
            del self.by_tenant[tenant], self.tenant_bytes[tenant]
        self.metadata_bytes -= entry[1]

    def reconcile(self, tenant: str | None = None) -> None:
        """Forget the entries (of `tenant`, or all) whose objects the master dropped."""
        objects = self.state.objects
        keys: Iterable[str] = self.entries if tenant is None else self.by_tenant.get(tenant, ())
        for key in [k for k in keys if k not in objects]:
            self.forget(key)

    def _fresh(self, tenant: str) -> None:
        now = self.clock()
        if now - self._reconciled.get(tenant, -1e18) >= RECONCILE_S:
            self._reconciled[tenant] = now
            self.reconcile(None if tenant == "\x00all" else tenant)

    def recorder(self, items: Any) -> Callable[[list[bool]], None]:
        """What to call with each item's success once the servicer answered."""
        snapshot = [(it.key, it.group, it.size, getattr(it, "replicas", 1)) for it in items]

        def done(ok: list[bool]) -> None:
            for (key, group, size, replicas), good in zip(snapshot, ok, strict=False):
                if good:
                    self.record(key, group, size, min(max(1, replicas), 16))

        return done

    # ---- admission --------------------------------------------------------------

    def quota(self, tenant: str) -> int:
        """The tenant's quota in bytes (0 = none)."""
        return self.quotas.get(tenant, self.quota_default)

    def admit(self, items: Any) -> None:
        """Refuse a PutStart batch that would pass a tenant's quota or the metadata bound
        (NoSpaceError, RESOURCE_EXHAUSTED, naming the limit); nothing is reserved here."""
        asked: dict[str, int] = {}
        meta = 0
        for it in items:
            replicas = min(max(1, getattr(it, "replicas", 1)), 16)
            held, m = object_cost(it.key, it.group, it.size, replicas)
            tenant = tenant_of(it.key)
            asked[tenant] = asked.get(tenant, 0) + held
            meta += m
        if self.metadata_bytes + meta > self.max_metadata:
            self._fresh("\x00all")
            if self.metadata_bytes + meta > self.max_metadata:
                raise NoSpaceError(
                    f"the master's metadata would pass max_metadata_bytes {self.max_metadata} "
                    f"(~{self.metadata_bytes} held)"
                )
        for tenant, want in asked.items():
            self.admit_bytes(tenant, want, "put")

    def admit_bytes(self, tenant: str, want: int, what: str = "extent") -> None:
        """Refuse `want` more bytes for `tenant` past its quota."""
        quota = self.quota(tenant)
        if not quota or self.tenant_bytes.get(tenant, 0) + want <= quota:
            return
        self._fresh(tenant)
        held = self.tenant_bytes.get(tenant, 0)
        if held + want > quota:
            raise NoSpaceError(
                f"tenant {tenant!r} over its quota of {quota} bytes: holds {held}, "
                f"this {what} asks {want}"
            )

    def check_integrity(self) -> None:
        """After a reconcile, the ledger holds exactly the master's objects."""
        self.reconcile()
        assert set(self.entries) == set(self.state.objects), "ledger keys != objects"
        per: dict[str, int] = {}
        meta = 0
        for key, (held, m) in self.entries.items():
            assert key in self.by_tenant[tenant_of(key)], key
            per[tenant_of(key)] = per.get(tenant_of(key), 0) + held
            meta += m
        assert per == self.tenant_bytes, "per-tenant bytes drifted"
        assert meta == self.metadata_bytes, "metadata estimate drifted"
