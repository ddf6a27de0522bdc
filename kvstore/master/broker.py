"""Hands the tier moves of `MasterState.tiering` to nodes, paced, and awaits results.

asyncio, no grpc: the servicer calls `poll` for a node's long poll (`NodeTasks`)
and `wait_persisted` in PutEnd. Moves are paced by a byte-rate budget
(asyncio-throttle, one token per MiB) shared by all nodes, so background
offload and promotion never take more than `move_bytes_per_s` from foreground
reads and writes. PERSIST tasks are not paced: a PutEnd waits on them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence

from asyncio_throttle import Throttler

from kvstore.errors import KVStoreError, UnavailableError
from kvstore.master.metadata import MasterState
from kvstore.master.tiering import Move, MoveKind, MoveResult

TOKEN_BYTES = 1 << 20
MAX_WAIT_S = 30.0


class MoveBroker:
    """Per-node wake-ups, the byte budget, and futures of the moves PutEnd waits on."""

    def __init__(self, state: MasterState) -> None:
        self.state = state
        rate = state.config.move_bytes_per_s
        self._throttler = Throttler(max(1, rate // TOKEN_BYTES)) if rate else None
        self._credit = 0  # bytes dispatched not yet charged a whole token
        self._wakeups: dict[str, asyncio.Event] = {}
        self._waiting: dict[int, asyncio.Future[MoveResult]] = {}
        self._pollers: set[str] = set()  # nodes that have long-polled for tasks

    def expect_pollers(self, node_ids: Iterable[str]) -> None:
        """Count these nodes as task pollers before they poll (nodes that registered
        saying they run a task worker, and a new HA leader's restored nodes: a PutEnd
        must wait for their PERSIST)."""
        self._pollers.update(node_ids)

    def wake(self) -> None:
        """Wake the long polls of every node with moves pending (after any state change)."""
        for node_id in self.state.tiering.nodes_with_pending():
            event = self._wakeups.get(node_id)
            if event is not None:
                event.set()

    async def poll(
        self, node_id: str, done: Sequence[MoveResult], wait_s: float, limit: int
    ) -> list[Move]:
        """Apply `done`, then hand out up to `limit` moves (waiting up to `wait_s` for one)."""
        self.state.registry.node(node_id)  # NotFoundError: register first
        self._pollers.add(node_id)
        for res in self.state.complete_moves(node_id, done):
            fut = self._waiting.pop(res.task_id, None)
            if fut is not None and not fut.done():
                fut.set_result(res)
        self.wake()  # a finished move may have freed room for queued ones elsewhere
        moves = self.state.tiering.take(node_id, limit)
        if not moves and wait_s > 0:
            event = self._wakeups.setdefault(node_id, asyncio.Event())
            event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), min(wait_s, MAX_WAIT_S))
            moves = self.state.tiering.take(node_id, limit)
        await self._pace(moves)
        return moves

    async def _pace(self, moves: Sequence[Move]) -> None:
        if self._throttler is None:
            return
        self._credit += sum(m.nbytes for m in moves if m.kind is MoveKind.COPY)
        while self._credit >= TOKEN_BYTES:
            await self._throttler.acquire()
            self._credit -= TOKEN_BYTES

    async def wait_persisted(
        self, task_ids: Sequence[int], timeout_s: float
    ) -> KVStoreError | None:
        """Wait until the nodes report these PERSIST moves; the first error, if any."""
        # Only nodes that run tasks (they long-poll) can be waited for; a node that never
        # polled (a fake in a test, a process without a task worker) is not waited on.
        task_ids = [t for t in task_ids if self.state.tiering.node_of(t) in self._pollers]
        if not task_ids:
            return None
        loop = asyncio.get_running_loop()
        futures = []
        for task_id in task_ids:
            fut: asyncio.Future[MoveResult] = loop.create_future()
            self._waiting[task_id] = fut
            futures.append(fut)
        self.wake()
        try:
            results = await asyncio.wait_for(asyncio.gather(*futures), timeout_s)
        except TimeoutError:
            return UnavailableError(f"storage node did not persist within {timeout_s:.1f} s")
        finally:
            for task_id in task_ids:
                self._waiting.pop(task_id, None)
        return next((r.error for r in results if r.error is not None), None)
