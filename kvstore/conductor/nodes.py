"""The conductor's model of its serving nodes: one `NodeEntry` per node named on the command
line (its stubs and what its Stats said last) and the `NodeDirectory` that refreshes them.

Each refresh reads every node's serving identity (what names its pool keys) and
admits the nodes in command-line order: the first node of a model pins the model's
identity (after the operator's explicit overrides); a node that differs is refused,
logged and left out of placement until it agrees (see `identity.py`).

Its own module so that `plan` (a placed request names its nodes), `service` (the
servicer drives them) and `server` (starts it all) import it and not each other.
Placement never reads it: the policies see `NodeState`s built from `NodeInfo`
(`ledger.py`), the same type the simulator builds.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import grpc

from kvstore import edge
from kvstore.conductor.api import Role
from kvstore.conductor.identity import IdentityBook, KeyIdentity
from kvstore.conductor.ledger import NodeInfo
from kvstore.conductor.rpc import rpc_error
from kvstore.conductor.service_config import ConductorConfig
from kvstore.errors import (
    BadRequestError,
    KVStoreError,
    NotFoundError,
    NotReadyError,
    UnavailableError,
)
from kvstore.v1 import serving_pb2, serving_pb2_grpc

log = logging.getLogger("kvstore.conductor")
ROLES = {"prefill": Role.PREFILL, "decode": Role.DECODE, "colocated": Role.COLOCATED}


@dataclass(slots=True)
class NodeEntry:
    """One serving node: its stubs, what its Stats said last, and whether that worked."""

    address: str
    channel: grpc.aio.Channel
    prefill: serving_pb2_grpc.PrefillServiceStub | None
    decode: serving_pb2_grpc.DecodeServiceStub | None
    info: NodeInfo | None = None
    stats: serving_pb2.ServingStatsResponse | None = None
    error: str = "not contacted yet"

    @property
    def healthy(self) -> bool:
        return self.info is not None and not self.error


class NodeDirectory:
    """The serving nodes named on the command line, refreshed from their Stats."""

    def __init__(self, config: ConductorConfig) -> None:
        self.timeout_s = config.match_timeout_s
        self.local_prefill_tokens = config.local_prefill_tokens  # None: each node's own
        self.identities = IdentityBook(config.overrides)
        self.entries: list[NodeEntry] = []
        for address in config.prefill:
            self.entries.append(self._entry(address, prefill=True))
        for address in (*config.decode, *config.colocated):
            self.entries.append(self._entry(address, prefill=False))

    @staticmethod
    def _entry(address: str, prefill: bool) -> NodeEntry:
        channel = edge.aio_channel(address)
        if prefill:
            return NodeEntry(address, channel, serving_pb2_grpc.PrefillServiceStub(channel), None)
        return NodeEntry(address, channel, None, serving_pb2_grpc.DecodeServiceStub(channel))

    async def refresh(self) -> None:
        """Ask every node for its Stats at once, then admit them in command-line order; a
        node that fails to answer, or whose identity differs, is marked unhealthy."""
        answers = await asyncio.gather(*(self._stats(e) for e in self.entries))
        for entry, answer in zip(self.entries, answers, strict=True):
            self._admit(entry, answer)

    async def _stats(self, entry: NodeEntry) -> serving_pb2.ServingStatsResponse | str:
        stub = entry.prefill if entry.prefill is not None else entry.decode
        assert stub is not None
        try:
            return await stub.Stats(serving_pb2.ServingStatsRequest(), timeout=self.timeout_s)
        except grpc.RpcError as err:
            return str(rpc_error(err))

    def _admit(self, entry: NodeEntry, answer: serving_pb2.ServingStatsResponse | str) -> None:
        if isinstance(answer, str):
            self._set_error(entry, answer)
            return
        entry.stats = answer
        try:
            info = _node_info(entry, answer, self.local_prefill_tokens)
        except KVStoreError as exc:
            self._set_error(entry, str(exc))
            return
        entry.info = info
        assert info.identity is not None
        self._set_error(entry, self.identities.admit(entry.address, info.identity))

    @staticmethod
    def _set_error(entry: NodeEntry, error: str) -> None:
        """Record a node's state; log when it changes (not at every refresh)."""
        if error != entry.error:
            if error:
                log.warning("serving node %s left out: %s", entry.address, error)
            else:
                log.info("serving node %s admitted", entry.address)
        entry.error = error

    def identity(self, model_id: str) -> KeyIdentity:
        """The pinned identity of `model_id` (after `healthy` found a node serving it)."""
        identity = self.identities.of(model_id)
        if identity is None:
            raise NotFoundError(f"no serving node serves model {model_id!r}")
        return identity

    def mark_failed(self, node_id: str, why: str) -> None:
        """A call to the node failed as unavailable: leave it out until its Stats answer."""
        for entry in self.entries:
            if entry.info is not None and entry.info.node_id == node_id:
                entry.error = why

    def healthy(self, model_id: str) -> list[NodeEntry]:
        """Healthy nodes serving `model_id`; UnavailableError / NotFoundError when none."""
        if not self.entries:
            raise NotReadyError(
                "empty cluster: the conductor was started without serving nodes "
                "(give --prefill/--decode/--colocated addresses)"
            )
        up = [e for e in self.entries if e.healthy]
        if not up:
            reasons = "; ".join(f"{e.address}: {e.error}" for e in self.entries)
            raise UnavailableError(f"no serving node is reachable ({reasons})")
        found = [e for e in up if e.info is not None and e.info.model_id == model_id]
        if not found:
            served = sorted({e.info.model_id for e in up if e.info is not None})
            raise NotFoundError(f"no serving node serves model {model_id!r}; served: {served}")
        self._check_roles(found)
        return found

    def _check_roles(self, found: list[NodeEntry]) -> None:
        """UnavailableError when every node of a role the cluster was given is down (a
        prefill node SIGKILLed, say): the request may succeed later, so it is not the
        policies' "cluster has no PREFILL node" (a bad request: none was ever given)."""
        roles = {e.info.role for e in found if e.info is not None}
        down = [e for e in self.entries if not e.healthy]
        for role, can, given in (
            ("PREFILL", {Role.PREFILL, Role.COLOCATED}, lambda e: e.prefill is not None),
            ("DECODE", {Role.DECODE, Role.COLOCATED}, lambda e: e.decode is not None),
        ):
            gone = [e for e in down if given(e)]
            if gone and not roles & can:
                reasons = "; ".join(f"{e.address}: {e.error}" for e in gone)
                raise UnavailableError(f"no {role} node is reachable ({reasons})")

    def by_id(self, node_id: str) -> NodeEntry:
        for entry in self.entries:
            if entry.info is not None and entry.info.node_id == node_id:
                return entry
        raise NotFoundError(f"unknown node {node_id!r}")

    async def close(self) -> None:
        for entry in self.entries:
            await entry.channel.close()


def _node_info(
    entry: NodeEntry, stats: serving_pb2.ServingStatsResponse, local_prefill: int | None
) -> NodeInfo:
    role = ROLES.get(stats.role)
    if role is None:
        raise BadRequestError(f"{entry.address} reports an unknown role {stats.role!r}")
    if (role == Role.PREFILL) != (entry.prefill is not None):
        listed = "prefill" if entry.prefill is not None else "decode/colocated"
        raise BadRequestError(f"{entry.address} was listed as {listed} but is {stats.role}")
    return NodeInfo(
        address=entry.address,
        node_id=stats.node_id,
        role=role,
        model_id=stats.model_id,
        block_tokens=stats.block_tokens,
        total_blocks=stats.total_blocks,
        identity=_identity(entry.address, stats),
        local_prefill_tokens=_local_limit(stats.local_prefill_tokens, local_prefill),
    )


def _local_limit(reported: int, override: int | None) -> int:
    """A decode node's local-prefill limit: its own, lowered by the override (a node
    refuses Generate over its own limit, so an override can never raise it)."""
    return reported if override is None else min(reported, override)


def _identity(address: str, stats: serving_pb2.ServingStatsResponse) -> KeyIdentity:
    if not stats.num_layers or not stats.kv_objects or not stats.kv_dtype:
        raise BadRequestError(f"{address} reports no serving identity (an older node?)")
    return KeyIdentity(
        model_id=stats.model_id,
        seed=stats.seed,
        batch_invariant=stats.batch_invariant,
        num_layers=stats.num_layers,
        block_tokens=stats.block_tokens,
        kv_objects=stats.kv_objects,
        kv_dtype=stats.kv_dtype,
    )
