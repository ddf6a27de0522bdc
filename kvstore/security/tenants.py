"""Tenants: whose keys are whose, and how much each holds.

A tenant's keys are its wire keys "T/..." (kvstore.client.config.ClientConfig.wire_key
already prefixes every key and group); a client credential names its tenant, and the
master's guard confines that client to the prefix (kvstore.security.authz).

`Ledger` admits a PutStart, CommitExtent or GrantExtent against the tenant quotas and
`max_metadata_bytes`. It keeps nothing itself: the master's object table counts, as
objects are born and dropped, the estimated metadata memory and, when a quota is
configured, each tenant's bytes (size x replicas asked; kvstore.master.objects.Usage),
so admission is O(1) per tenant in a batch and exact the moment space is freed.
"""

from __future__ import annotations

from typing import Any

from kvstore.errors import NoSpaceError
from kvstore.master.objects import OBJECT_BYTES, REPLICA_BYTES, tenant_of
from kvstore.security.limits import Items

__all__ = ["Ledger", "tenant_of"]


class Ledger:
    """Quota and metadata admission of one master (see the module docstring)."""

    def __init__(self, state: Any, config: Any) -> None:
        self.usage = state.objects.usage
        self.quota_default = config.tenant_quota_bytes
        self.quotas = {t: int(b) for t, b in config.tenant_quotas}
        self.max_metadata = config.max_metadata_bytes

    @property
    def metadata_bytes(self) -> int:
        """The master's estimated metadata memory now."""
        return int(self.usage.metadata)

    @property
    def tenant_bytes(self) -> dict[str, int]:
        """Bytes held per tenant (empty when no quota is configured: nothing is counted)."""
        return self.usage.tenant_bytes or {}

    def quota(self, tenant: str) -> int:
        """The tenant's quota in bytes (0 = none)."""
        return self.quotas.get(tenant, self.quota_default)

    def admit(self, cols: Items) -> None:
        """Refuse a PutStart or CommitExtent batch (its columns) that would pass a tenant's
        quota or the metadata bound (NoSpaceError, RESOURCE_EXHAUSTED, naming the limit);
        nothing is reserved here."""
        n = len(cols.keys)
        copies = cols.copies()
        meta = OBJECT_BYTES * n + sum(map(len, cols.keys)) + REPLICA_BYTES * (copies - n)
        if self.usage.metadata + meta > self.max_metadata:
            raise NoSpaceError(
                f"the master's metadata would pass max_metadata_bytes {self.max_metadata} "
                f"(~{self.usage.metadata} held)"
            )
        if self.usage.tenant_bytes is None:
            return
        asked: dict[str, int] = {}
        for key, size, replicas in zip(cols.keys, cols.sizes, cols.replicas, strict=True):
            tenant = tenant_of(key)
            asked[tenant] = asked.get(tenant, 0) + size * min(max(1, replicas), 16)
        for tenant, want in asked.items():
            self.admit_bytes(tenant, want, "put")

    def admit_bytes(self, tenant: str, want: int, what: str = "extent") -> None:
        """Refuse `want` more bytes for `tenant` past its quota."""
        quota = self.quota(tenant)
        held = self.tenant_bytes.get(tenant, 0)
        if quota and held + want > quota:
            raise NoSpaceError(
                f"tenant {tenant!r} over its quota of {quota} bytes: holds {held}, "
                f"this {what} asks {want}"
            )
