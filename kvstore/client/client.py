"""kvstore.Client: the synchronous client of the pool.

    with Client("127.0.0.1:50051") as c:
        c.put("k", b"value")                 # PutStart -> one-sided WRITE -> PutEnd
        assert c.get("k") == b"value"        # BatchLookup (leased) -> one-sided READ
        n = c.get_into("k", out_array)       # straight into the caller's memory

Metadata goes to the master over gRPC (every call bounded by `timeout_s`); bytes move
one-sided between this process and the nodes (shared memory on the same host, TCP
otherwise, or as `transport=` forces). Thread-safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from kvstore import failover
from kvstore.client.config import ClientConfig
from kvstore.client.context import OpContext
from kvstore.client.datapath import DataPath
from kvstore.client.directory import SegmentDirectory
from kvstore.client.ops import ClientOps, PrefixMatchResult
from kvstore.client.segments import contributed_node
from kvstore.client.steps import Op, Rpc, run_sync
from kvstore.client.writes import PutOptions, end_writer_leases_op, release_op
from kvstore.errors import BadRequestError, KVStoreError
from kvstore.fastlane import SyncRouter
from kvstore.node.node import StorageNode
from kvstore.rpc_errors import raise_from_rpc_error
from kvstore.types import Tier
from kvstore.v1 import master_pb2_grpc

T = TypeVar("T")


def make_config(master: str | ClientConfig, options: dict[str, Any]) -> ClientConfig:
    """A ClientConfig from an address ("host:port", or "h1:p1,h2:p2,..." for the masters
    of an HA pool) or a config, with `options` overriding fields."""
    if isinstance(master, ClientConfig):
        return dataclasses.replace(master, **options) if options else master
    if not isinstance(master, str):
        raise BadRequestError(f"master must be 'host:port' or a ClientConfig, got {master!r}")
    if "," in master:
        addresses = failover.split_masters(master)
        options = {"masters": tuple(addresses), **options}
        master = addresses[0]
    return ClientConfig(master=master, **options)


def master_addresses(config: ClientConfig) -> list[str]:
    """Every master address a client may call (the HA leader is found among them)."""
    return failover.split_masters([config.master, *config.masters])


class Client:
    """Sync client; `Client("HOST:PORT", transport="tcp", segment_bytes=..., tenant=...)`."""

    def __init__(self, master: str | ClientConfig, **options: Any) -> None:
        self.config = make_config(master, options)
        self._data = DataPath.for_config(self.config)
        self._ctx = OpContext(self.config, SegmentDirectory(), self._data)
        self._ops = ClientOps(self._ctx)
        self._channel = failover.sync_channel(
            master_addresses(self.config), self.config.credentials,
            self.config.failover_timeout_s,
        )  # fmt: skip
        self._stub = master_pb2_grpc.MasterStub(self._channel)
        # Hot-path calls over the master's fast lane when it has one (kvstore.fastlane).
        self._router = SyncRouter(
            self.config.timeout_s, self._ctx.directory.update, self.config.busy_poll_us / 1e6
        )
        if not self.config.fast_lane or self.config.credentials is not None:
            self._router.disable()
        self._node: StorageNode | None = None
        self._closed = False
        try:
            self._contribute()
        except BaseException:
            self.close()
            raise

    def _contribute(self) -> None:
        if self.config.segment_bytes or self.config.hbm_segment_bytes:
            node = contributed_node(self.config)
            node.start()
            self._node = node
            self._ctx.node_id = self.config.id
            for seg in node.segments:  # our own DRAM: reached by memcpy, not an engine
                self._data.adopt_local(seg.name, seg.buffer)

    def call_rpc(self, step: Rpc) -> Any:
        """One master call, bounded by `timeout_s`; gRPC errors become KVStoreErrors."""
        try:
            return getattr(self._stub, step.method)(step.request, timeout=self.config.timeout_s)
        except grpc.RpcError as err:
            raise_from_rpc_error(err)

    def run(self, op: Op[T], call: Callable[[Rpc], Any] | None = None) -> T:
        """Run one operation of `ops`; `call` wraps `call_rpc` (fault injection, counting)."""
        if self._closed:
            raise BadRequestError("client is closed")
        return run_sync(op, call or self._route)

    def _route(self, step: Rpc) -> Any:
        return self._router.call(step.method, step.request, self._grpc)

    def _grpc(self, method: str, request: object) -> Any:
        return self.call_rpc(Rpc(method, request))

    @property
    def ops(self) -> ClientOps:
        return self._ops

    # -- writes ---------------------------------------------------------------

    def put(
        self, key: str, value: object, *, group: str = "", replicas: int | None = None,
        pin_ttl_s: float = 0.0, tier: Tier | None = None,
    ) -> None:  # fmt: skip
        """Store `value` (bytes-like, numpy array, CPU tensor) under `key`; ExistsError if taken."""
        self.run(self._ops.put(key, value, PutOptions(group, replicas, pin_ttl_s, tier)))

    def put_from(
        self, key: str, buffer: object, offset: int = 0, length: int | None = None, **kw: Any
    ) -> None:
        """Store `buffer[offset:offset+length]` (zero-copy from a registered buffer)."""
        self.run(self._ops.put_from(key, buffer, offset, length, PutOptions(**kw)))

    def batch_put(
        self, items: Sequence[tuple[str, object]], **kw: Any
    ) -> list[KVStoreError | None]:
        """Store many values in one PutStart / transfer batch / PutEnd; a result per key."""
        return self.run(self._ops.batch_put(items, PutOptions(**kw)))

    def batch_put_from(
        self, keys: Sequence[str], buffers: Sequence[object], **kw: Any
    ) -> list[KVStoreError | None]:
        """`batch_put` from whole buffers (registered ones, or slices of them: zero-copy)."""
        return self.run(self._ops.batch_put_from(keys, buffers, PutOptions(**kw)))

    # -- reads ----------------------------------------------------------------

    def get(self, key: str) -> bytes:
        """The value of `key`; NotFoundError when absent."""
        return self.run(self._ops.get(key))

    def get_into(self, key: str, out: object) -> int:
        """Read `key` into `out`; bytes written. TooLargeError if `out` is too small."""
        if not self._closed:  # a cached location in mapped memory: a copy, no step
            done = self._ops.get_into_now(key, out)
            if done is not None:
                return done
        return self.run(self._ops.get_into(key, out))

    def batch_get(self, keys: Sequence[str]) -> list[bytes | None]:
        """Values (None when absent); raises the first fault after the whole batch ran."""
        return self.run(self._ops.batch_get(keys))

    def batch_get_into(
        self, keys: Sequence[str], outs: Sequence[object]
    ) -> list[int | KVStoreError]:
        """Read each key into its buffer: bytes written, or that key's error."""
        return self.run(self._ops.batch_get_into(keys, outs))

    def exists(self, key: str) -> bool:
        """Whether `key` is committed (no side effect: no lease, no LRU touch)."""
        return self.run(self._ops.batch_exists([key]))[0]

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        return self.run(self._ops.batch_exists(keys))

    def size_of(self, key: str) -> int | None:
        """The size of committed `key`, None when absent."""
        return self.run(self._ops.batch_size_of([key]))[0]

    # -- admin ----------------------------------------------------------------

    def remove(self, key: str, *, force: bool = False, node_id: str = "") -> bool:
        """True if removed, False if absent; NotReadyError while leased/pinned (unless force).
        `node_id`: drop only the replicas on that node (the object goes with its last)."""
        return self.run(self._ops.remove(key, force, node_id))

    def end_writer_leases(self) -> None:
        """End the writer leases this client's puts were granted (and forget what its
        location cache knows): another client may then remove what it put at once."""
        self.run(end_writer_leases_op(self._ctx))

    def match_prefix(self, keys: Sequence[str]) -> PrefixMatchResult:
        """How many leading `keys` the pool holds, overall and per (node, tier)."""
        return self.run(self._ops.match_prefix(keys))

    def stats(self) -> dict[str, Any]:
        """The master's Stats as a plain dict."""
        return self.run(self._ops.stats())

    def register_buffer(self, buffer: object) -> None:
        """Register memory for zero-copy *_from / *_into (slices of it qualify too)."""
        self._data.register(buffer)

    def unregister_buffer(self, buffer: object) -> None:
        self._data.unregister(buffer)

    def check_integrity(self) -> None:
        """Assert the registered-buffer table is consistent and nothing leaked."""
        self._data.check_integrity()

    # -- lifecycle ------------------------------------------------------------

    def close(self) -> None:
        """Unmount a contributed segment, close connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(KVStoreError):  # its lease would end anyway
            run_sync(release_op(self._ctx), self._route)
        self._data.drop_local()  # before the node unmaps it
        if self._node is not None:
            self._node.stop()
        self._data.close()
        self._router.close()
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
