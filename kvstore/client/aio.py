"""kvstore.AsyncClient: the asyncio client. Same methods as `Client`, `async def`.

Metadata goes over grpc.aio on the running loop; bulk transfers (and the blocking
start/stop of a contributed segment) run in the loop's default executor, so no
call blocks the loop. The channel is made on first use, inside the loop.

    async with AsyncClient("127.0.0.1:50051") as c:
        await c.put("k", b"v")
        value = await c.get("k")
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from kvstore import failover
from kvstore.client.client import make_config, master_addresses
from kvstore.client.config import ClientConfig
from kvstore.client.context import OpContext
from kvstore.client.datapath import DataPath
from kvstore.client.directory import SegmentDirectory
from kvstore.client.ops import ClientOps, PrefixMatchResult
from kvstore.client.segments import contributed_node
from kvstore.client.steps import Op, Rpc, run_async
from kvstore.client.writes import PutOptions, end_writer_leases_op, release_op
from kvstore.errors import BadRequestError, KVStoreError
from kvstore.fastlane import AsyncRouter
from kvstore.node.node import StorageNode
from kvstore.rpc_errors import raise_from_rpc_error
from kvstore.types import Tier
from kvstore.v1 import master_pb2_grpc

T = TypeVar("T")


class AsyncClient:
    """Async client; `await start()` (or `async with`) is optional: first use starts it."""

    def __init__(self, master: str | ClientConfig, **options: Any) -> None:
        self.config = make_config(master, options)
        self._data = DataPath.for_config(self.config)
        self._ctx = OpContext(self.config, SegmentDirectory(), self._data)
        self._ops = ClientOps(self._ctx)
        self._channel: grpc.aio.Channel | None = None
        self._stub: master_pb2_grpc.MasterStub | None = None
        self._node: StorageNode | None = None
        self._start_lock = asyncio.Lock()
        self._closed = False
        self._router = AsyncRouter(self.config.timeout_s, self._ctx.directory.update)
        if not self.config.fast_lane or self.config.credentials is not None:
            self._router.disable()

    async def start(self) -> AsyncClient:
        """Open the master channel; contribute the segment if configured."""
        async with self._start_lock:
            if self._closed:
                raise BadRequestError("client is closed")
            if self._stub is None:
                self._channel = self._make_channel()
                if self.config.segment_bytes or self.config.hbm_segment_bytes:
                    node = contributed_node(self.config)
                    await asyncio.to_thread(node.start)
                    self._node = node
                    self._ctx.node_id = self.config.id
                    for seg in node.segments:  # our own DRAM: reached by memcpy
                        self._data.adopt_local(seg.name, seg.buffer)
                self._stub = master_pb2_grpc.MasterStub(self._channel)
        return self

    def _make_channel(self) -> grpc.aio.Channel:
        return failover.aio_failover_channel(
            master_addresses(self.config), self.config.credentials,
            self.config.failover_timeout_s,
        )  # fmt: skip

    async def _call(self, step: Rpc) -> Any:
        assert self._stub is not None
        try:
            method = getattr(self._stub, step.method)
            return await method(step.request, timeout=self.config.timeout_s)
        except grpc.RpcError as err:
            raise_from_rpc_error(err)

    @staticmethod
    async def _io(fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    async def run(self, op: Op[T]) -> T:
        """Run one operation of kvstore.client.ops on this loop."""
        if self._stub is None or self._closed:
            await self.start()
        return await run_async(op, self._route, self._io)

    async def _route(self, step: Rpc) -> Any:
        return await self._router.call(step.method, step.request, self._grpc)

    async def _grpc(self, method: str, request: object) -> Any:
        return await self._call(Rpc(method, request))

    # -- writes ---------------------------------------------------------------

    async def put(
        self, key: str, value: object, *, group: str = "", replicas: int | None = None,
        pin_ttl_s: float = 0.0, tier: Tier | None = None,
    ) -> None:  # fmt: skip
        await self.run(self._ops.put(key, value, PutOptions(group, replicas, pin_ttl_s, tier)))

    async def put_from(
        self, key: str, buffer: object, offset: int = 0, length: int | None = None, **kw: Any
    ) -> None:
        await self.run(self._ops.put_from(key, buffer, offset, length, PutOptions(**kw)))

    async def batch_put(
        self, items: Sequence[tuple[str, object]], **kw: Any
    ) -> list[KVStoreError | None]:
        return await self.run(self._ops.batch_put(items, PutOptions(**kw)))

    async def batch_put_from(
        self, keys: Sequence[str], buffers: Sequence[object], **kw: Any
    ) -> list[KVStoreError | None]:
        return await self.run(self._ops.batch_put_from(keys, buffers, PutOptions(**kw)))

    # -- reads ----------------------------------------------------------------

    async def get(self, key: str) -> bytes:
        return await self.run(self._ops.get(key))

    async def get_into(self, key: str, out: object) -> int:
        return await self.run(self._ops.get_into(key, out))

    async def batch_get(self, keys: Sequence[str]) -> list[bytes | None]:
        return await self.run(self._ops.batch_get(keys))

    async def batch_get_into(
        self, keys: Sequence[str], outs: Sequence[object]
    ) -> list[int | KVStoreError]:
        return await self.run(self._ops.batch_get_into(keys, outs))

    async def exists(self, key: str) -> bool:
        return (await self.run(self._ops.batch_exists([key])))[0]

    async def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        return await self.run(self._ops.batch_exists(keys))

    async def size_of(self, key: str) -> int | None:
        return (await self.run(self._ops.batch_size_of([key])))[0]

    # -- admin ----------------------------------------------------------------

    async def remove(self, key: str, *, force: bool = False, node_id: str = "") -> bool:
        return await self.run(self._ops.remove(key, force, node_id))

    async def end_writer_leases(self) -> None:
        """As Client.end_writer_leases."""
        await self.run(end_writer_leases_op(self._ctx))

    async def match_prefix(self, keys: Sequence[str]) -> PrefixMatchResult:
        return await self.run(self._ops.match_prefix(keys))

    async def stats(self) -> dict[str, Any]:
        return await self.run(self._ops.stats())

    def register_buffer(self, buffer: object) -> None:
        self._data.register(buffer)

    def unregister_buffer(self, buffer: object) -> None:
        self._data.unregister(buffer)

    def check_integrity(self) -> None:
        """Assert the registered-buffer table is consistent and nothing leaked."""
        self._data.check_integrity()

    # -- lifecycle ------------------------------------------------------------

    async def close(self) -> None:
        """Unmount a contributed segment, close connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._stub is not None:
            with contextlib.suppress(KVStoreError):  # its lease would end anyway
                await run_async(release_op(self._ctx), self._route, self._io)
        self._data.drop_local()  # before the node unmaps it
        if self._node is not None:
            await asyncio.to_thread(self._node.stop)
        await asyncio.to_thread(self._data.close)
        self._router.close()
        if self._channel is not None:
            await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
