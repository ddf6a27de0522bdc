"""What names a prompt's KV blocks in the pool, as the serving nodes report it.

grpc-free. A prefill node publishes block `i` of a prompt under a key derived from
its model id, weight seed, batching mode, block size (the hash namespace), its
number of layers and its object shape (`<hash>/L<last>` per layer, `<hash>` per
block). A conductor that hashed prompts with any other value would ask the master
for keys nobody writes, and every prefix match would silently miss. So the
conductor reads each node's `KeyIdentity` from its Stats, pins one per model (the
operator's explicit overrides, else the first node accepted, in command-line
order) and refuses a node whose identity differs: its blocks could never be
shared with the others'.

The hash namespace is computed here from the identity alone (`kvstore.hashing`), the
same bytes as `kvstore.serving.config.namespace`, so that hashing a prompt imports
no torch (tests/conductor/test_boundary.py compares the two).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import cache

from kvstore.errors import BadRequestError
from kvstore.hashing import block_hashes, make_namespace
from kvstore.types import block_key

KV_OBJECTS = ("layer", "block")


@dataclass(frozen=True, slots=True)
class KeyIdentity:
    """Everything that changes the pool key of a block of the same tokens."""

    model_id: str
    seed: int
    batch_invariant: bool
    num_layers: int
    block_tokens: int
    kv_objects: str
    kv_dtype: str  # the KV element type ("float32", "bfloat16", ...)

    def __post_init__(self) -> None:
        if not self.model_id or self.seed < 0:
            raise BadRequestError(f"bad identity {self}: empty model id or negative seed")
        if self.num_layers <= 0 or self.block_tokens <= 0:
            raise BadRequestError(f"bad identity {self}: num_layers and block_tokens must be > 0")
        if self.kv_objects not in KV_OBJECTS:
            raise BadRequestError(f"bad identity {self}: kv_objects must be one of {KV_OBJECTS}")
        if not self.kv_dtype:
            raise BadRequestError(f"bad identity {self}: empty kv_dtype")

    def hashes(self, tokens: Sequence[int], tenant: str = "") -> list[bytes]:
        """The prompt's chained full-block hashes, as its prefill node computes them for
        a request of `tenant` (which salts them)."""
        ns = namespace(
            self.model_id,
            self.seed,
            self.block_tokens,
            self.batch_invariant,
            self.kv_dtype,
            tenant,
        )
        return block_hashes(tokens, self.block_tokens, ns)

    def keys(self, hashes: Sequence[bytes]) -> list[str]:
        """The key a prefill node writes last for each block (what its own match asks for)."""
        if self.kv_objects == "block":
            return [block_key(h) for h in hashes]
        return [block_key(h, f"L{self.num_layers - 1}") for h in hashes]

    def differences(self, other: KeyIdentity) -> list[str]:
        """'field: mine != theirs' for each field that differs."""
        out = []
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if mine != theirs:
                out.append(f"{f.name} {mine!r} != {theirs!r}")
        return out


@dataclass(frozen=True, slots=True)
class IdentityOverrides:
    """Identity fields the operator stated explicitly (None: take the nodes' word)."""

    seed: int | None = None
    batch_invariant: bool | None = None
    kv_objects: str | None = None

    def mismatches(self, identity: KeyIdentity) -> list[str]:
        out = []
        for f in fields(self):
            stated = getattr(self, f.name)
            if stated is not None and stated != getattr(identity, f.name):
                out.append(f"{f.name} {getattr(identity, f.name)!r} (told {stated!r})")
        return out


class IdentityBook:
    """The pinned identity of each model, and the check that admits or refuses a node."""

    def __init__(self, overrides: IdentityOverrides = IdentityOverrides()) -> None:
        self.overrides = overrides
        self._pinned: dict[str, tuple[KeyIdentity, str]] = {}  # model -> (identity, by whom)

    def admit(self, who: str, identity: KeyIdentity) -> str:
        """'' if `who` (an address) may serve with `identity`, else why it is refused.
        The first node admitted for a model pins that model's identity."""
        told = self.overrides.mismatches(identity)
        if told:
            return f"{who} refused: its pool keys would differ: {', '.join(told)}"
        pinned = self._pinned.get(identity.model_id)
        if pinned is None:
            self._pinned[identity.model_id] = (identity, who)
            return ""
        diff = identity.differences(pinned[0])
        if diff:
            return (
                f"{who} refused: its pool keys would differ from {pinned[1]}'s "
                f"(model {identity.model_id!r}): {', '.join(diff)}"
            )
        return ""

    def of(self, model_id: str) -> KeyIdentity | None:
        pinned = self._pinned.get(model_id)
        return None if pinned is None else pinned[0]


@cache
def namespace(
    model_id: str, seed: int, block_tokens: int, batch_invariant: bool, kv_dtype: str,
    tenant: str = "",
) -> bytes:  # fmt: skip
    """The serving nodes' hash namespace (`kvstore.serving.config.namespace`), without torch."""
    mode = "inv" if batch_invariant else "batched"
    return make_namespace(
        f"{model_id}@seed{seed}", tenant=tenant, kv_dtype=kv_dtype,
        kv_layout=f"paged/bt{block_tokens}/{mode}",
    )  # fmt: skip
