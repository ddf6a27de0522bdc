"""The master's guard: a server interceptor that runs, before each Master RPC, the limits
(kvstore.security.limits), the authorization rule of the caller's identity
(kvstore.security.authz) and, for PutStart, the tenant quota and metadata bound
(kvstore.security.tenants). A refused call aborts with its typed status and the servicer
never runs, so nothing changes.

    guard = MasterGuard(state)                # kvstore.master.server installs it
    await edge.start_server(..., interceptors=[guard])
    await guard.call("BatchLookup", servicer.BatchLookup, request, context)  # other front ends
    guard.check_integrity()                   # the master's usage counts equal a recount
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import grpc

from kvstore.errors import KVStoreError, NoSpaceError
from kvstore.master.batch import PREPARED
from kvstore.master.extents import PREPARED_COMMIT, CommitItem, commit_items
from kvstore.master.service import put_request_columns
from kvstore.rpc_errors import status_for
from kvstore.security import identity
from kvstore.security.authz import Answer, Call, Post, authorize
from kvstore.security.limits import Items, Limits
from kvstore.security.tenants import Ledger

PREFIX = "/kvstore.v1.Master/"
_KEYED = frozenset({"BatchLookup", "PutEnd", "PutRevoke", "Remove", "MatchPrefix", "Pin", "Unpin"})
_GUARDS: weakref.WeakValueDictionary[int, MasterGuard] = weakref.WeakValueDictionary()


class MasterGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Limits, authorization and quotas of one master (see the module docstring)."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.limits = Limits(state.config, state)
        self.ledger = Ledger(state, state.config)
        self.refused = 0  # calls refused so far (metrics, tests)
        _GUARDS[id(state)] = self

    @staticmethod
    def of(state: Any) -> MasterGuard | None:
        """The guard of a master's state (debugging and tests), if it has one."""
        return _GUARDS.get(id(state))

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:  # fmt: skip
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None or not details.method.startswith(PREFIX):
            return handler
        name = details.method[len(PREFIX) :]
        behavior = handler.unary_unary

        async def guarded(request: Any, context: Any) -> Any:
            return await self.call(name, behavior, request, context)

        return grpc.unary_unary_rpc_method_handler(
            guarded, handler.request_deserializer, handler.response_serializer
        )

    async def call(
        self, name: str, behavior: Callable[..., Any], request: Any, context: Any
    ) -> Any:
        """Admit `request` to `behavior` (a servicer method) as the current identity."""
        try:
            post = self.admit(name, request)
        except Answer as answered:
            return answered.reply
        except KVStoreError as exc:
            self.refused += 1
            await context.abort(status_for(exc), str(exc))
            raise  # abort raises; this only satisfies type checkers
        reply = await behavior(request, context)
        return reply if post is None else post(reply)

    def admit(self, name: str, request: Any) -> Post | None:
        """Raise the typed error of a refused call; else the reply's finishing step."""
        keys = list(request.keys) if name in _KEYED else None  # built once, checked twice
        items = None
        if name == "PutStart":  # the servicer's own columns, read once for both (PREPARED)
            cols = put_request_columns(request)
            PREPARED.set((request, cols))
            items = Items.of_put(cols)
        elif name == "CommitExtent":  # likewise (extents.PREPARED_COMMIT)
            commits = commit_items(request.items)
            PREPARED_COMMIT.set((request, commits))
            items = _commit_columns(commits)
        self.limits.check(name, request, keys, items)
        ident = identity.current()
        if ident.source == "insecure":  # every rule passes (authz.Call.free): none runs
            post = None  # (the limits above and the quota ledger below run in every mode)
        else:
            post = authorize(Call(ident, name, request, self.state, keys, items))
        if items is not None:
            self.ledger.admit(items)
        if name == "GrantExtent" and ident.scoped:
            self.ledger.admit_bytes(identity.tenant_of(ident), request.size)
        elif name == "CommitExtent" and request.next_size and ident.scoped:
            try:
                self.ledger.admit_bytes(identity.tenant_of(ident), request.next_size)
            except NoSpaceError:  # the commit is admitted on its own; no next extent
                request.next_size = 0
        return post

    def check_integrity(self) -> None:
        """The usage the ledger admits by equals a recount of the objects."""
        self.state.objects.check_integrity()


_ONE, _NO_NODE = (1,), ("",)


def _commit_columns(commits: list[CommitItem]) -> Items:
    """A CommitExtent's items as the columns the limits and the ledger check (as
    `Items.of`, from the items the servicer then commits)."""
    if len(commits) == 1:  # a single put's commit
        (c,) = commits
        return Items((c.key,), (c.group,), (c.size,), _ONE, _NO_NODE)
    n = len(commits)
    keys = tuple(c.key for c in commits)
    return Items(keys, tuple(c.group for c in commits), tuple(c.size for c in commits),
                 (1,) * n, ("",) * n)  # fmt: skip
