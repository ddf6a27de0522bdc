"""Ingest vLLM's KV events so the conductor knows what each vLLM engine holds.

A vLLM engine started with `--kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'`
publishes on a ZMQ PUB socket frames (topic, seq: u64 big-endian, payload), the
payload a msgpack `KVEventBatch` = [ts, [event, ...], dp_rank?], each event a map
tagged by "type": BlockStored (block_hashes, medium "GPU"/"CPU", ...), BlockRemoved
(block_hashes, medium), AllBlocksCleared. Its ROUTER replay socket answers
[b"", start_seq] with every buffered batch from start_seq, then an end marker.

`apply_batch` folds one payload into a prefix index (anything with add/remove, e.g.
DictPrefixIndex); `KvEventIngester` runs the SUB loop for one engine in a thread,
replays what it missed (at start and on a sequence gap), and counts what it saw.
Hashes stay as vLLM sends them (64-bit ints by default; `kvstore.hashing_vllm`
computes the same ones from token ids). pyzmq and msgpack are imported lazily.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvstore.errors import BadRequestError
from kvstore.types import Tier

log = logging.getLogger(__name__)
END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM_TIER = {"GPU": Tier.HBM, "CPU": Tier.DRAM, "STORAGE": Tier.SSD, None: Tier.HBM}


class BlockIndex(Protocol):
    def add(self, node_id: str, blocks: Any, tier: Tier = ...) -> None: ...
    def remove(self, node_id: str, blocks: Any) -> None: ...


@dataclass
class IngestStats:
    batches: int = 0
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    replayed: int = 0
    bad: int = 0
    last_seq: int = -1
    held: dict[Any, Tier] = field(default_factory=dict)  # what the engine holds now


def apply_batch(index: BlockIndex, node_id: str, payload: bytes, stats: IngestStats) -> None:
    """Fold one msgpack KVEventBatch into `index` for `node_id`; BadRequestError on junk
    (nothing applied from a batch that does not decode)."""
    import msgpack

    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        events = batch[1]
        if not isinstance(events, list):
            raise TypeError("events is not a list")
    except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
        stats.bad += 1
        raise BadRequestError(f"not a KVEventBatch: {exc}") from exc
    for event in events:
        _apply(index, node_id, event, stats)
    stats.batches += 1


def _apply(index: BlockIndex, node_id: str, event: Any, stats: IngestStats) -> None:
    kind = event.get("type") if isinstance(event, dict) else None
    if kind == "BlockStored":
        tier = MEDIUM_TIER.get(event.get("medium"), Tier.HBM)
        hashes = list(event.get("block_hashes") or ())
        index.add(node_id, hashes, tier)
        stats.held.update(dict.fromkeys(hashes, tier))
        stats.stored += len(hashes)
    elif kind == "BlockRemoved":
        hashes = list(event.get("block_hashes") or ())
        index.remove(node_id, hashes)
        for h in hashes:
            stats.held.pop(h, None)
        stats.removed += len(hashes)
    elif kind == "AllBlocksCleared":
        index.remove(node_id, list(stats.held))
        stats.held.clear()
        stats.cleared += 1
    else:
        stats.bad += 1
        log.warning("unknown KV event %r from %s", kind, node_id)


class KvEventIngester:
    """One engine's event stream -> `index` (under `node_id`), in a daemon thread."""

    def __init__(self, index: BlockIndex, node_id: str, endpoint: str,
                 replay_endpoint: str = "", topic: str = "") -> None:  # fmt: skip
        self.index, self.node_id = index, node_id
        self.endpoint, self.replay_endpoint, self.topic = endpoint, replay_endpoint, topic
        self.stats = IngestStats()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._applied = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def start(self) -> KvEventIngester:
        import zmq

        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        self._sub.connect(self.endpoint)
        self._thread = threading.Thread(target=self._run, name=f"kv-events-{self.node_id}",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        return self

    def wait_for(self, predicate: Any, timeout_s: float) -> bool:
        """Block until `predicate(stats)` holds (re-checked after each batch) or timeout."""
        with self._applied:
            return self._applied.wait_for(lambda: predicate(self.stats), timeout_s)

    def replay(self, start_seq: int = 0, timeout_s: float = 5.0) -> int:
        """Ask the engine's ROUTER for every buffered batch from `start_seq`; how many
        were applied (batches already seen are skipped)."""
        import zmq

        if not self.replay_endpoint:
            return 0
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.replay_endpoint)
        applied = 0
        try:
            sock.send_multipart((b"", start_seq.to_bytes(8, "big")))
            while sock.poll(int(timeout_s * 1000)):
                frames = sock.recv_multipart()
                if len(frames) != 4 or frames[2] == END_SEQ:
                    break
                applied += self._take(int.from_bytes(frames[2], "big"), frames[3])
        finally:
            sock.close()
        with self._lock:
            self.stats.replayed += applied
        return applied

    def _take(self, seq: int, payload: bytes) -> int:
        with self._applied:
            if seq <= self.stats.last_seq:
                return 0
            try:
                apply_batch(self.index, self.node_id, payload, self.stats)
            except BadRequestError as exc:
                log.warning("dropped a KV event batch from %s: %s", self.node_id, exc)
            self.stats.last_seq = seq
            self._applied.notify_all()
        return 1

    def _run(self) -> None:
        if self.replay_endpoint:
            self.replay(0)
        while not self._stop.is_set():
            if not self._sub.poll(100):  # wakes to see a stop request
                continue
            frames = self._sub.recv_multipart()
            if len(frames) != 3:
                continue
            seq = int.from_bytes(frames[1], "big")
            if seq > self.stats.last_seq + 1 and self.replay_endpoint:
                self.replay(self.stats.last_seq + 1)  # missed some: fetch them first
            self._take(seq, frames[2])

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self._sub.close(0)
        self._ctx.term()
