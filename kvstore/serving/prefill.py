"""The prefill worker: prefix match, load hits, chunked compute, layer-wise publish.

Per request (one at a time, on the caller's thread):

1. hash the prompt's full blocks; MatchPrefix in the store (at least the last prompt
   token is always computed, for its logits);
2. pull the hit blocks into the local KV pool (a block that fails is recomputed);
3. prefill the rest in chunks of `chunk_tokens`; after layer i of a chunk, the
   blocks that chunk completed (and, on the last chunk, the partial tail block
   under a request-scoped key) are handed to the `KVPublisher`, which writes them
   while layers i+1.. compute (whole blocks: after the chunk's last layer, while the
   next chunk computes);
4. sample the first token, wait for the publisher, free the local blocks;
5. remember the handed-off tail, removed if not consumed within `tail_ttl_s`
   (`TailSweeper`; expired tails are swept before each prefill and by the node).
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvstore.errors import KVStoreError, NoSpaceError
from kvstore.hashing import block_hashes
from kvstore.model import Engine
from kvstore.serving.config import ServingConfig, kv_layout, namespace
from kvstore.serving.kv_io import (
    object_keys,
    pull_blocks,
    register_layers,
    snapshot,
    unregister_layers,
)
from kvstore.serving.publisher import KVPublisher
from kvstore.serving.request import Handoff, Request, sample_token
from kvstore.serving.store import BlockStore
from kvstore.serving.tails import TailSweeper
from kvstore.tiers.kv_layout import HbmConfig
from kvstore.tiers.kv_pool import HbmKVPool


@dataclass(frozen=True, slots=True)
class PrefillTimings:
    match_s: float = 0.0
    load_s: float = 0.0
    compute_s: float = 0.0
    publish_s: float = 0.0
    publish_wait_s: float = 0.0
    total_s: float = 0.0
    published_bytes: int = 0


@dataclass(frozen=True, slots=True)
class PrefillResult:
    request_id: str
    first_token: int
    cached_tokens: int
    handoff: Handoff
    timings: PrefillTimings


class PrefillWorker:
    """Runs prefills against one engine, one local KV pool and one store; one request
    at a time (the node calls it from a single compute thread)."""

    def __init__(
        self,
        config: ServingConfig,
        engine: Engine,
        store: BlockStore,
        *,
        publish_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.engine = engine
        self.store = store
        self.layout = kv_layout(config)
        self.kv = HbmKVPool(HbmConfig(self.layout, config.num_blocks, device=config.device))
        self.namespace = namespace(config)
        self.publisher = KVPublisher(store)
        self._registered = register_layers(store, self.kv)
        self.layered = config.layered
        self.publish_timeout_s = publish_timeout_s
        ttl = config.tail_ttl_s
        self.tails = TailSweeper(store, ttl, clock) if ttl > 0 else None

    def prefill(self, req: Request) -> PrefillResult:
        start = time.perf_counter()
        req.check_fits(self.engine.config)
        self.sweep_tails()
        bt = self.config.block_tokens
        space = namespace(self.config, req.tenant) if req.tenant else self.namespace
        hashes = block_hashes(req.prompt, bt, space)
        n_blocks = -(-len(req.prompt) // bt)
        ids = self.kv.pool.allocate(n_blocks)
        if ids is None:
            raise NoSpaceError(f"prompt needs {n_blocks} KV blocks, {self.kv.pool.free_count} free")
        try:
            result = self._run(req, hashes, ids, start)
        finally:
            for b in ids:
                self.kv.pool.decref(b)
        if self.tails is not None and result.handoff.tail_key:
            self.tails.track(self._keys(result.handoff.tail_key))
        return result

    def sweep_tails(self) -> int:
        """Remove handed-off tails past their TTL; how many were still in the store."""
        return 0 if self.tails is None else self.tails.sweep()

    def _run(
        self, req: Request, hashes: list[bytes], ids: list[int], start: float
    ) -> PrefillResult:
        t0 = time.perf_counter()
        refs = [h.hex() for h in hashes]
        matched = self.store.match_prefix([self._keys(r)[-1] for r in refs])  # written last
        usable = min(matched, (len(req.prompt) - 1) // self.config.block_tokens)
        t1 = time.perf_counter()
        pulled = pull_blocks(self.store, self.kv, refs[:usable], ids[:usable], self.layered)
        hit = pulled.complete_blocks
        t2 = time.perf_counter()
        tail_key = f"tail/{req.request_id}/{uuid.uuid4().hex[:12]}"
        in_store = matched if hit == usable else hit  # a block that vanished is republished
        try:
            logits = self._compute(
                req, hashes, ids, hit * self.config.block_tokens, in_store, tail_key
            )
            t3 = time.perf_counter()
            first = sample_token(req.sampling, logits, 0)
            stats = self.publisher.flush(self.publish_timeout_s)
            if stats.errors:
                raise stats.errors[0]
        except BaseException:
            self._abandon(tail_key)
            raise
        end = time.perf_counter()
        tail_tokens = len(req.prompt) % self.config.block_tokens
        handoff = Handoff(
            block_tokens=self.config.block_tokens,
            num_layers=self.layout.num_layers,
            block_hashes=tuple(hashes),
            tail_key=tail_key if tail_tokens else "",
            tail_tokens=tail_tokens,
            layered=self.layered,
        )
        timings = PrefillTimings(
            match_s=t1 - t0,
            load_s=t2 - t1,
            compute_s=t3 - t2,
            publish_s=stats.put_s,
            publish_wait_s=end - t3,
            total_s=end - start,
            published_bytes=stats.bytes,
        )
        cached = hit * self.config.block_tokens
        return PrefillResult(req.request_id, first, cached, handoff, timings)

    def _compute(
        self,
        req: Request,
        hashes: list[bytes],
        ids: list[int],
        start_pos: int,
        in_store: int,
        tail_key: str,
    ) -> torch.Tensor:
        """Chunked prefill from start_pos; publish each completed block layer by layer."""
        bt, n = self.config.block_tokens, len(req.prompt)
        logits = None
        for pos in range(start_pos, n, self.config.chunk_tokens):
            end = min(pos + self.config.chunk_tokens, n)
            first_new = max(pos // bt, in_store)  # full blocks this chunk completes
            full = list(range(first_new, end // bt))
            tail = end == n and n % bt != 0
            logits = self.engine.prefill(
                req.prompt[pos:end],
                ids,
                pos,
                self.kv.layers,
                functools.partial(
                    self._publish_layer,
                    full=full,
                    hashes=hashes,
                    ids=ids,
                    tail_key=tail_key if tail else "",
                ),
            )
        assert logits is not None
        return logits

    def _keys(self, ref: str) -> list[str]:
        return object_keys(ref, self.layout.num_layers, self.layered)

    def _publish_layer(
        self, layer: int, full: list[int], hashes: list[bytes], ids: list[int], tail_key: str
    ) -> None:
        """on_layer_done: hand layer `layer` (or, per-block objects, the whole blocks after
        the last layer) of the chunk's completed blocks to the publisher."""
        if not self.layered and layer != self.layout.num_layers - 1:
            return
        refs = [hashes[b].hex() for b in full] + ([tail_key] if tail_key else [])
        blocks = [ids[b] for b in full] + ([ids[len(hashes)]] if tail_key else [])
        if refs:
            pick = layer if self.layered else 0
            keys = [self._keys(r)[pick] for r in refs]
            tensors = snapshot(self.kv, blocks, layer if self.layered else None)
            self.publisher.submit(keys, tensors, refs[0])  # a group per chunk: evicted together

    def _abandon(self, tail_key: str) -> None:
        """A failed request: let queued writes finish (they read our blocks), drop the tail."""
        with contextlib.suppress(KVStoreError):
            self.publisher.flush(self.publish_timeout_s)
        for key in self._keys(tail_key):
            with contextlib.suppress(KVStoreError):
                self.store.remove(key)

    def close(self) -> None:
        self.publisher.close()
        unregister_layers(self.store, self._registered)
        self.kv.close()
