"""The node side of tier moves: long-poll the master for tasks, run them locally.

Each task moves bytes between two of this node's own segments (see
kvstore.master.tiering): COPY src -> dst (offload DRAM -> SSD, promotion
SSD -> DRAM, HBM <-> DRAM), PERSIST (record a put's SSD replica in the index) or
FORGET (drop one from it). Bytes are checksummed on the way; a source whose bytes
fail the object's checksum is reported CORRUPT and nothing is written to the
index. The tasks of one poll run IO_DEPTH at a time (those of one key in order);
the master paces how many bytes it hands out, so background moves stay within
their budget.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from kvstore.errors import CorruptError, KVStoreError, NotFoundError, UnavailableError
from kvstore.fastlane import SyncRouter
from kvstore.rpc_errors import code_for, raise_from_rpc_error
from kvstore.tiers.direct_io import copy_bytes
from kvstore.tiers.hbm_segment import HbmSegment
from kvstore.tiers.ssd_index import checksum_of
from kvstore.tiers.ssd_segment import SsdSegment
from kvstore.v1 import common_pb2, master_pb2, master_pb2_grpc

log = logging.getLogger(__name__)

POLL_MS = 1000
MAX_TASKS = 256  # a batched put's PERSISTs come back in one poll
IO_DEPTH = 4  # moves run at once (SSD queue depth)
Release = Callable[[], None]
_COPY = master_pb2.TASK_KIND_COPY


class TaskWorker:
    """Runs the master's moves on this node's `segments` (objects with `name`)."""

    def __init__(
        self, channel: grpc.Channel, node_id: str, segments: Sequence[Any], rpc_timeout_s: float
    ) -> None:
        self._stub = master_pb2_grpc.MasterStub(channel)
        # The long poll goes over the master's fast lane when it has one: a PERSIST a
        # PutEnd waits on is handed out and reported back without two gRPC calls.
        self._router = SyncRouter(rpc_timeout_s + POLL_MS / 1000)
        self.node_id = node_id
        self._segments = {s.name: s for s in segments}
        self._timeout = rpc_timeout_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._call: Any = None  # the long poll in flight (a grpc future)
        self._pool = ThreadPoolExecutor(IO_DEPTH, thread_name_prefix=f"kvstore-move-{node_id}")
        self.done = 0  # tasks completed (ok or failed): for tests and logs
        self.failed = 0

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name=f"kvstore-tasks-{self.node_id}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop after the task in hand (its result is not reported: the master's
        incarnation check or node TTL voids it)."""
        self._stop.set()
        self._router.close()  # a long poll on the lane ends with its socket
        call = self._call
        if call is not None:
            call.cancel()  # end the long poll now rather than at its timeout
        if self._thread is not None:
            self._thread.join(self._timeout + POLL_MS / 1000 + 1)
        self._pool.shutdown(wait=True)

    def _loop(self) -> None:
        results: list[master_pb2.TaskResult] = []
        pause = self._stop.wait
        while not self._stop.is_set():
            try:
                tasks = self._poll(results)
            except KVStoreError as exc:  # master away or restarting: retry, keep results
                log.debug("task poll of %s failed: %s", self.node_id, exc)
                if pause(0.5):
                    return
                continue
            results = self._run_all(tasks)
            if self._stop.is_set():
                return

    def _poll(self, results: list[master_pb2.TaskResult]) -> list[master_pb2.NodeTask]:
        request = master_pb2.NodeTasksRequest(
            node_id=self.node_id, done=results, wait_ms=POLL_MS, max_tasks=MAX_TASKS
        )
        reply = self._router.call("NodeTasks", request, self._grpc)
        return list(reply.tasks)

    def _grpc(self, method: str, request: Any) -> Any:
        """One master call over gRPC (the lane's fallback, and its Stats probe)."""
        if self._stop.is_set():
            raise UnavailableError("stopped")
        if method != "NodeTasks":
            try:
                return getattr(self._stub, method)(request, timeout=self._timeout)
            except grpc.RpcError as err:
                raise_from_rpc_error(err)
        try:
            call = self._stub.NodeTasks.future(request, timeout=self._timeout + POLL_MS / 1000)
            self._call = call
            if self._stop.is_set():  # stop() ran between the check and the call
                call.cancel()
            reply = call.result()
        except grpc.FutureCancelledError as err:
            raise UnavailableError("stopped") from err
        except grpc.RpcError as err:
            raise_from_rpc_error(err)
        except ValueError as err:  # the channel was closed under us (stop)
            raise UnavailableError(str(err)) from err
        return reply

    def _run_all(self, tasks: Sequence[master_pb2.NodeTask]) -> list[master_pb2.TaskResult]:
        """Run one poll's tasks, IO_DEPTH at a time (SSD I/O overlaps); the tasks of one
        key run in order on one thread (a FORGET and a PERSIST of a key never race)."""
        by_key: dict[str, list[master_pb2.NodeTask]] = {}
        for task in tasks:
            by_key.setdefault(task.key, []).append(task)
        if len(by_key) == 1:
            return [self.run(t) for t in tasks]
        # Index-only groups (PERSIST, FORGET: a RocksDB write, no bytes moved) run here,
        # while the groups with a COPY run on the pool: a thread hand-off per PERSIST
        # would cost more than the PERSIST itself (a batched SSD put waits on them all).
        inline: list[list[master_pb2.NodeTask]] = []
        moving: list[list[master_pb2.NodeTask]] = []
        for group in by_key.values():
            (moving if any(t.kind == _COPY for t in group) else inline).append(group)
        futures = [self._pool.submit(self._run_in_order, group) for group in moving]
        done = [r for group in inline for r in self._run_in_order(group)]
        return done + [r for f in futures for r in f.result()]

    def _run_in_order(self, group: list[master_pb2.NodeTask]) -> list[master_pb2.TaskResult]:
        return [self.run(t) for t in group if not self._stop.is_set()]

    # ---- one task -----------------------------------------------------------------

    def run(self, task: master_pb2.NodeTask) -> master_pb2.TaskResult:
        """Execute one task; its result (an error status rather than an exception)."""
        result = master_pb2.TaskResult(task_id=task.task_id)
        try:
            result.checksum = self._execute(task)
        except KVStoreError as exc:
            self.failed += 1
            result.status.code = code_for(exc)
            result.status.message = str(exc)
            log.warning("task %d (%s) on %s failed: %s", task.task_id, task.key, self.node_id, exc)
        except OSError as exc:
            self.failed += 1
            result.status.code = code_for(UnavailableError(str(exc)))
            result.status.message = str(exc)
        self.done += 1
        return result

    def _execute(self, task: master_pb2.NodeTask) -> int:
        dst = self._segment(task.dst)
        if task.kind == master_pb2.TASK_KIND_FORGET:
            if isinstance(dst, SsdSegment):
                dst.forget(task.key, task.dst.offset)
            return 0
        if task.kind == master_pb2.TASK_KIND_PERSIST:
            if not isinstance(dst, SsdSegment):
                return task.checksum
            return dst.persist(task.key, task.dst.offset, task.dst.length, task.checksum)
        return self._copy(task, self._segment(task.src), dst)

    def _copy(self, task: master_pb2.NodeTask, src: Any, dst: Any) -> int:
        view, release = _read(src, task.src)
        try:
            checksum = checksum_of(view)
            if task.checksum and checksum != task.checksum:
                raise CorruptError(
                    f"{task.key!r}: source bytes in {task.src.segment!r} fail their checksum"
                )
            _write(dst, task.dst, view)
        finally:
            release()
        if isinstance(dst, SsdSegment):  # listed only once indexed: restart-safe
            dst.persist(task.key, task.dst.offset, task.dst.length, checksum)
        return checksum

    def _segment(self, loc: common_pb2.Location) -> Any:
        seg = self._segments.get(loc.segment)
        if seg is None or loc.node_id != self.node_id:
            raise NotFoundError(f"segment {loc.segment!r} is not lent by {self.node_id!r}")
        return seg


def _read(seg: Any, loc: common_pb2.Location) -> tuple[memoryview, Release]:
    """The bytes at `loc` as host memory (a slice of memory, or staged)."""
    if isinstance(seg, SsdSegment) or (isinstance(seg, HbmSegment) and seg.buffer is None):
        return seg.read_range(loc.offset, loc.length)
    buffer = seg.buffer
    _check(buffer, loc)
    return buffer[loc.offset : loc.offset + loc.length], lambda: None


def _write(seg: Any, loc: common_pb2.Location, data: memoryview) -> None:
    if isinstance(seg, SsdSegment):
        seg.write_from(loc.offset, data)
        return
    if isinstance(seg, HbmSegment) and seg.buffer is None:
        seg.write_range(loc.offset, loc.length, lambda out: copy_bytes(out, data))
        return
    buffer = seg.buffer
    _check(buffer, loc)
    copy_bytes(buffer[loc.offset : loc.offset + loc.length], data)


def _check(buffer: memoryview, loc: common_pb2.Location) -> None:
    if loc.offset + loc.length > buffer.nbytes:
        raise NotFoundError(f"range [{loc.offset}, +{loc.length}) is outside {loc.segment!r}")
