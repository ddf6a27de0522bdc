"""Tenants in the conductor: a tenant's prefix matches count only its own blocks.

grpc-free. A request's tenant is the `kvstore-tenant` metadata the client sends
(`kvstore.ConductorClient(tenant=...)`, `kvstore generate --tenant`). On a vLLM
fleet the tenant is vLLM's `cache_salt` (fleet.py): it changes the hash of the first
block and so of the whole chain, in the conductor's index and in the engine's own
prefix cache alike. On kvstore's serving nodes the tenant goes into the request
(`GenerationSpec.tenant`) and salts the nodes' block hashes the same way
(kvstore.serving.config.namespace; the conductor hashes with it too), so the pool
never matches another tenant's blocks. The `TenantBook` (the block hashes each named
tenant's requests have put in the pool; the pool's answer is capped at the longest
prefix its tenant owns) stays as a second bound. Requests without a tenant ("") are
not tracked and share the unsalted space, as before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvstore.conductor.api import BlockId
from kvstore.errors import BadRequestError

TENANT_METADATA = "kvstore-tenant"  # the same key as kvstore.client.conductor's


class TenantBook:
    """tenant -> the block hashes its requests wrote (LRU, `max_blocks` per tenant)."""

    def __init__(self, max_blocks: int = 1 << 20) -> None:
        if max_blocks <= 0:
            raise BadRequestError("max_blocks must be > 0")
        self.max_blocks = max_blocks
        self._owned: dict[str, OrderedDict[BlockId, None]] = {}

    def owned_prefix(self, tenant: str, hashes: Sequence[BlockId]) -> int:
        """How many leading blocks of `hashes` the tenant owns (all of them for "")."""
        if not tenant:
            return len(hashes)
        owned = self._owned.get(tenant)
        if owned is None:
            return 0
        count = 0
        for h in hashes:
            if h not in owned:
                break
            owned.move_to_end(h)
            count += 1
        return count

    def record(self, tenant: str, hashes: Sequence[BlockId]) -> None:
        """The tenant's request wrote (or will write) these blocks."""
        if not tenant:
            return
        owned = self._owned.setdefault(tenant, OrderedDict())
        for h in hashes:
            owned[h] = None
            owned.move_to_end(h)
        while len(owned) > self.max_blocks:
            owned.popitem(last=False)

    def tenants(self) -> dict[str, int]:
        return {t: len(o) for t, o in self._owned.items()}


def tenant_of(metadata: Sequence[tuple[str, str | bytes]] | None) -> str:
    """The request's tenant from its invocation metadata ("" when none)."""
    for key, value in metadata or ():
        if key == TENANT_METADATA:
            text = value.decode() if isinstance(value, bytes) else value
            if "/" in text or len(text) > 256:
                raise BadRequestError(f"bad tenant {text[:40]!r}: no '/', at most 256 characters")
            return text
    return ""
