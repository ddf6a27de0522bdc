"""The prefill node's bookkeeping without processes: the queue its Stats report, and
the sweep that removes handed-off tails no decode node consumed (an injected clock:
no test waits on a wall-clock timer)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvstore.errors import BadRequestError
from kvstore.model import Engine
from kvstore.serving.config import ServingConfig, build_engine
from kvstore.serving.kv_io import object_keys
from kvstore.serving.prefill import PrefillWorker
from kvstore.serving.prefill_queue import PrefillQueue
from kvstore.serving.request import Request
from kvstore.serving.store import LocalBlockStore
from kvstore.serving.tails import TailSweeper
from kvstore.tiers.dram import DramTier
from kvstore.tiers.dram_parts import DramConfig
from kvstore.tiers.tiered import TieredStore

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
