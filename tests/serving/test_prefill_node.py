"""The prefill node's bookkeeping without processes: the queue its Stats report, and
the sweep that removes handed-off tails no decode node consumed (an injected clock:
no test waits on a wall-clock timer)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import replace

import pytest

from kvstore.errors import BadRequestError, KVStoreError
from kvstore.model import Engine
from kvstore.serving.config import ServingConfig, build_engine
from kvstore.serving.kv_io import object_keys
from kvstore.serving.prefill import PrefillWorker
from kvstore.serving.prefill_queue import PrefillQueue
from kvstore.serving.request import Request
from kvstore.serving.store import LocalBlockStore
from kvstore.serving.tails import TailSweeper
from kvstore.tiers.dram import DramConfig, DramTier
from kvstore.tiers.tiered import TieredStore
from kvstore.v1 import serving_pb2 as pb
from prefill_node.server import PrefillServicer
from tests.serving.helpers import RecordingStore

CONFIG = ServingConfig(num_blocks=32, tail_ttl_s=30.0)
PROMPT = tuple((3 * i + 5) % 256 for i in range(40))  # 2 full blocks + an 8-token tail


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def dram_store() -> LocalBlockStore:
    return LocalBlockStore(TieredStore([DramTier(DramConfig(capacity_bytes=4 << 20))]))


@pytest.fixture(scope="module")
def engine() -> Engine:
    return build_engine(CONFIG)


def test_queue_counts_waiting_running_and_dropped_requests() -> None:
    q = PrefillQueue()
    a, b, c = q.add(40), q.add(100), q.add(7)
    assert (q.counts().waiting, q.counts().waiting_tokens, q.counts().running) == (3, 147, 0)
    q.start(a)
    assert (q.counts().waiting, q.counts().waiting_tokens, q.counts().running) == (2, 107, 1)
    q.drop(a)  # its caller left while it computes: still running
    q.drop(c)  # left while queued: no longer counted
    q.drop(c)
    assert (q.counts().waiting, q.counts().waiting_tokens, q.counts().running) == (1, 100, 1)
    q.end(a)
    q.start(b)
    q.end(b)
    q.end(b)
    assert (q.counts().waiting, q.counts().waiting_tokens, q.counts().running) == (0, 0, 0)
    q.check_integrity()


def test_sweeper_removes_expired_tails_in_handoff_order() -> None:
    store, clock = dram_store(), Clock()
    sweeper = TailSweeper(store, ttl_s=10.0, clock=clock)
    for key in ("t1/L0", "t1/L1", "t2/L0", "t3/L0"):
        assert store.batch_put_from([key], [memoryview(b"x" * 64)]) == [None]
    sweeper.track(["t1/L0", "t1/L1"])
    clock.now += 5.0
    sweeper.track(["t2/L0"])
    sweeper.track(["t3/L0"])
    assert store.remove("t3/L0")  # a decode node consumed t3
    clock.now += 4.999
    assert sweeper.sweep() == 0 and sweeper.pending() == 3
    clock.now += 0.001  # t1's deadline
    assert sweeper.sweep() == 1
    assert store.batch_exists(["t1/L0", "t1/L1", "t2/L0"]) == [False, False, True]
    clock.now += 5.0
    assert sweeper.sweep() == 1  # t2; t3 was already gone
    assert sweeper.pending() == 0 and sweeper.removed == 2
    assert store.batch_exists(["t2/L0"]) == [False]
    sweeper.check_integrity()
    with pytest.raises(BadRequestError):
        TailSweeper(store, ttl_s=0.0)


def test_worker_sweeps_unconsumed_tails_after_their_ttl(engine: Engine) -> None:
    store, clock = dram_store(), Clock()
    worker = PrefillWorker(CONFIG, engine, store, clock=clock)
    try:
        first = worker.prefill(Request("r1", PROMPT, 4))
        tail = object_keys(first.handoff.tail_key, 4, layered=True)
        blocks = [k for h in first.handoff.block_hashes for k in object_keys(h.hex(), 4, True)]
        assert all(store.batch_exists(tail)) and all(store.batch_exists(blocks))
        clock.now += 29.9
        assert worker.sweep_tails() == 0
        clock.now += 0.1
        other = worker.prefill(Request("r2", PROMPT[:20], 4))  # sweeps before it runs
        assert store.batch_exists(tail) == [False] * 4
        assert all(store.batch_exists(blocks))  # shared blocks stay
        other_tail = object_keys(other.handoff.tail_key, 4, layered=True)
        assert all(store.batch_exists(other_tail)) and worker.tails is not None
        assert worker.tails.removed == 1 and worker.tails.pending() == 1
    finally:
        worker.close()
        store.store.check_integrity()
        store.close()


def test_zero_ttl_keeps_tails(engine: Engine) -> None:
    store = dram_store()
    worker = PrefillWorker(replace(CONFIG, tail_ttl_s=0.0), engine, store)
    try:
        pre = worker.prefill(Request("r", PROMPT, 2))
        assert worker.tails is None and worker.sweep_tails() == 0
        assert all(store.batch_exists(object_keys(pre.handoff.tail_key, 4, layered=True)))
    finally:
        worker.close()
        store.close()


class GatedStore(RecordingStore):
    """Holds every write until `gate` opens (so the compute thread stays busy, waiting
    for its publisher); `entered` is set at the first write."""

    def __init__(self, inner: LocalBlockStore) -> None:
        super().__init__(inner)
        self.gate, self.entered = threading.Event(), threading.Event()

    def batch_put_from(
        self, keys: Sequence[str], buffers: Sequence[memoryview], group: str = ""
    ) -> list[KVStoreError | None]:
        self.entered.set()
        assert self.gate.wait(30.0), "the test never opened the gate"
        return super().batch_put_from(keys, buffers, group)


def prefill_request(rid: str, n: int) -> pb.PrefillRequest:
    spec = pb.GenerationSpec(request_id=rid, model_id="tiny", max_tokens=2)
    spec.prompt_token_ids.extend(PROMPT[:n])
    return pb.PrefillRequest(spec=spec)


def test_stats_report_the_prefill_queue_and_identity() -> None:
    store = GatedStore(dram_store())
    servicer = PrefillServicer(replace(CONFIG, role="prefill", node_id="p-1"), store)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        busy = asyncio.create_task(servicer.Prefill(prefill_request("a", 40), None))
        assert await loop.run_in_executor(None, store.entered.wait, 30.0)
        queued = [
            asyncio.create_task(servicer.Prefill(prefill_request(rid, n), None))
            for rid, n in (("b", 20), ("c", 33))
        ]
        for _ in range(100):  # bounded: each task queues at its first step
            if servicer.queue.counts().waiting == 2:
                break
            await asyncio.sleep(0)
        stats = await servicer.Stats(pb.ServingStatsRequest(), None)
        assert (stats.running, stats.waiting, stats.waiting_tokens) == (1, 2, 53)
        assert (stats.node_id, stats.role, stats.seed, stats.num_layers) == ("p-1", "prefill", 0, 4)
        assert (stats.kv_objects, stats.batch_invariant, stats.pool_segment) == (
            "layer",
            True,
            False,
        )
        store.gate.set()
        done = await asyncio.gather(busy, *queued)
        assert [r.request_id for r in done] == ["a", "b", "c"]
        stats = await servicer.Stats(pb.ServingStatsRequest(), None)
        assert (stats.running, stats.waiting, stats.waiting_tokens) == (0, 0, 0)
        assert stats.requests_done == 3

    try:
        asyncio.run(run())
        servicer.queue.check_integrity()
    finally:
        store.gate.set()
        servicer.close()
        store.close()
