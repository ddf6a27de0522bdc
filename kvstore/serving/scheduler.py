"""The decode scheduler: admission by free KV blocks, KV pulls, continuous batching.

One scheduler thread owns the block pool and runs the loop

    drop cancelled jobs -> admit waiting jobs (FIFO) while their blocks fit ->
    one chunk of local prefill (Generate, recompute) -> READY jobs join -> one decode step

so sequences join and leave the batch at every step. A job is admitted only when
all the blocks it can ever need (prompt + max_tokens - 1 positions) are free, so a
running sequence never runs out of KV memory. Pulls of handoff blocks run on a
loader thread and overlap the decode steps of the running batch. A finished job's
blocks are freed, or (on_finish="publish") first written to the store under their
prefix hashes, so the conversation's next turn finds them. Store calls run on the
loader thread, except the tail removal of a cancelled or failed job.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kvstore.errors import BadRequestError, KVStoreError, NoSpaceError, NotFoundError
from kvstore.model import Engine, SeqState
from kvstore.serving.config import ServingConfig, kv_layout, namespace
from kvstore.serving.jobs import DecodeJob, Finish, JobEvent, JobState
from kvstore.serving.kv_io import (
    object_keys,
    publish_sequence,
    pull_blocks,
    register_layers,
    unregister_layers,
)
from kvstore.serving.store import BlockStore
from kvstore.tiers.kv_layout import HbmConfig
from kvstore.tiers.kv_pool import HbmKVPool

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    free_blocks: int
    total_blocks: int
    running: int
    waiting: int
    done: int
    failed: int
    steps: int


class DecodeScheduler:
    """Continuous-batching decode over one engine and one paged KV pool."""

    def __init__(self, config: ServingConfig, engine: Engine, store: BlockStore | None) -> None:
        self.config = config
        self.engine = engine
        self.store = store
        self.layout = kv_layout(config)
        self.kv = HbmKVPool(HbmConfig(self.layout, config.num_blocks, device=config.device))
        self._registered = register_layers(store, self.kv) if store is not None else []
        self._cond = threading.Condition()
        self._waiting: deque[DecodeJob] = deque()
        self._active: list[DecodeJob] = []  # admitted: LOADING, PREFILL, READY, RUNNING
        self._done = self._failed = self._steps = 0
        self._stopping = False
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="kv-loader")
        self._thread = threading.Thread(target=self._loop, name="decode-scheduler", daemon=True)
        self._thread.start()

    # -- API (any thread) --------------------------------------------------------------

    def submit(self, job: DecodeJob) -> None:
        """Queue a job; its events go to job.sink. Bad requests raise here."""
        job.req.check_fits(self.engine.config)
        if job.handoff is not None:
            self._check_handoff(job)
        need = job.blocks_needed(self.config.block_tokens)
        if need > self.config.num_blocks:
            raise NoSpaceError(f"request needs {need} KV blocks; node has {self.config.num_blocks}")
        with self._cond:
            if self._stopping:
                raise KVStoreError("decode scheduler is stopped")
            self._waiting.append(job)
            self._cond.notify_all()

    def _check_handoff(self, job: DecodeJob) -> None:
        handoff = job.handoff
        assert handoff is not None
        if handoff.block_tokens != self.config.block_tokens:
            raise BadRequestError(
                f"handoff blocks of {handoff.block_tokens} tokens; node uses "
                f"{self.config.block_tokens}"
            )
        if handoff.num_layers != self.layout.num_layers:
            layers = self.layout.num_layers
            raise BadRequestError(f"handoff has {handoff.num_layers} layers, model has {layers}")
        if handoff.prompt_tokens != len(job.req.prompt):
            raise BadRequestError(
                f"handoff covers {handoff.prompt_tokens} tokens, prompt has {len(job.req.prompt)}"
            )
        if self.store is None:
            raise BadRequestError("this node has no KV store: use Generate")

    def cancel(self, job: DecodeJob) -> None:
        """Stop a job: its blocks are freed at the scheduler's next iteration."""
        job.cancel_event.set()
        with self._cond:
            self._cond.notify_all()

    def stats(self) -> SchedulerStats:
        with self._cond:
            running = sum(j.state is JobState.RUNNING for j in self._active)
            return SchedulerStats(
                free_blocks=self.kv.pool.free_count,
                total_blocks=self.kv.pool.num_blocks,
                running=running,
                waiting=len(self._waiting) + len(self._active) - running,
                done=self._done,
                failed=self._failed,
                steps=self._steps,
            )

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no job is queued or admitted (every block freed); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._waiting and not self._active, timeout_s)

    def check_integrity(self) -> None:
        """Every used pool block belongs to exactly one admitted job."""
        with self._cond:
            self.kv.pool.check_integrity()
            owned = [b for j in self._active for b in j.blocks]
            if len(owned) != len(set(owned)):
                raise AssertionError("two jobs share a KV block")
            if len(owned) != self.kv.pool.used_count:
                raise AssertionError(
                    f"{self.kv.pool.used_count} blocks used, jobs own {len(owned)}"
                )

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=10.0)
        self._loader.shutdown(wait=True, cancel_futures=True)
        if self.store is not None:
            unregister_layers(self.store, self._registered)
        self.kv.close()

    # -- the loop (scheduler thread) ------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(self._has_work, timeout=1.0)
                if self._stopping:
                    self._fail_all(KVStoreError("decode node is shutting down"))
                    return
                self._reap_cancelled()
                self._admit()
                prefills = [j for j in self._active if j.state is JobState.PREFILL]
            self._prefill_chunks(prefills)
            with self._cond:
                for job in [j for j in self._active if j.state is JobState.READY]:
                    self._start(job)
                batch = [j for j in self._active if j.state is JobState.RUNNING]
            if batch:
                self._step(batch[: self.config.max_batch])

    def _has_work(self) -> bool:
        ready = (JobState.PREFILL, JobState.READY, JobState.RUNNING)
        return (
            self._stopping
            or any(j.state in ready for j in self._active)
            or any(j.cancelled for j in self._waiting)
            or (bool(self._waiting) and self._fits(self._waiting[0]))
        )

    def _fits(self, job: DecodeJob) -> bool:
        return job.blocks_needed(self.config.block_tokens) <= self.kv.pool.free_count

    def _admit(self) -> None:
        while self._waiting and self._fits(self._waiting[0]) and self._has_slot():
            job = self._waiting.popleft()
            job.blocks = self.kv.pool.allocate(job.blocks_needed(self.config.block_tokens)) or []
            job.timings.queue_s = time.perf_counter() - job.arrival
            self._active.append(job)
            if job.handoff is None:
                job.state = JobState.PREFILL
            else:
                job.state = JobState.LOADING
                self._loader.submit(self._pull, job)

    def _has_slot(self) -> bool:
        return len(self._active) < self.config.max_batch

    def _reap_cancelled(self) -> None:
        for job in [j for j in self._waiting if j.cancelled]:
            self._waiting.remove(job)
            self._finish(job, failed=True)
        busy = (JobState.LOADING, JobState.SAVING)
        for job in [j for j in self._active if j.cancelled and j.state not in busy]:
            self._finish(job, failed=True)

    @property
    def _saves(self) -> bool:
        """Finished sequences are published (their stream ends once that is done)."""
        return self.config.on_finish == "publish" and self.store is not None

    def _finish(self, job: DecodeJob, *, failed: bool, finish: Finish | None = None) -> None:
        """End a job (under the lock): publish its blocks first if the policy says so."""
        if finish is not None and self._saves:
            job.state = JobState.SAVING
            self._loader.submit(self._save, job, finish)
            return
        self._release(job, failed=failed)

    def _save(self, job: DecodeJob, finish: Finish) -> None:
        """Loader thread: write the sequence's full blocks to the store for later turns,
        then end its stream, so a client's next turn finds them."""
        assert self.store is not None
        known = len(job.handoff.block_hashes) if job.handoff is not None else 0
        written = (*job.req.prompt, *job.tokens[:-1])  # positions whose KV is in the blocks
        try:
            space = namespace(self.config, job.req.tenant)
            # the shape the prefill side reads: the handoff's, else this node's own
            layered = job.handoff.layered if job.handoff is not None else self.config.layered
            publish_sequence(self.store, self.kv, space, written, job.blocks, known, layered)
        except Exception:
            log.exception("publishing the blocks of %r failed", job.req.request_id)
        job.end(finish)
        with self._cond:
            self._release(job, failed=False)

    def _release(self, job: DecodeJob, *, failed: bool) -> None:
        """Free the job's blocks and drop its tail key (under the lock)."""
        if job in self._active:
            self._active.remove(job)
        for b in job.blocks:
            self.kv.pool.decref(b)
        job.blocks = []
        job.state = JobState.DONE
        self._drop_tail(job)
        if failed:
            self._failed += 1
        else:
            self._done += 1
        self._cond.notify_all()

    def _fail_all(self, error: KVStoreError) -> None:
        for job in [*self._waiting, *self._active]:
            job.fail(error)
        self._waiting.clear()

    def _guard(self, job: DecodeJob, fn: Callable[[DecodeJob], None]) -> None:
        """Run fn(job); a failure ends only this job, with its error sent to the client."""
        try:
            fn(job)
        except Exception as exc:
            error = exc if isinstance(exc, KVStoreError) else KVStoreError(f"internal: {exc!r}")
            with self._cond:
                self._finish(job, failed=True)
            job.fail(error)

    # -- KV: pull, local prefill -------------------------------------------------------------

    def _pull(self, job: DecodeJob) -> None:
        """Loader thread: read the handoff's blocks into the job's pool blocks."""
        start = time.perf_counter()
        handoff = job.handoff
        assert handoff is not None and self.store is not None
        refs = handoff.refs
        try:
            blocks = job.blocks[: len(refs)]
            result = pull_blocks(self.store, self.kv, refs, blocks, handoff.layered)
            complete, error = result.complete_blocks, result.first_error
            job.timings.pulled_bytes = result.bytes
        except KVStoreError as exc:
            complete, error = 0, exc
        job.timings.pull_s = time.perf_counter() - start
        if complete == len(refs) and not job.cancelled:
            self._drop_tail(job)  # only this thread touches a LOADING job's tail
        with self._cond:
            self._after_pull(job, complete == len(refs), error)
            self._cond.notify_all()

    def _after_pull(self, job: DecodeJob, whole: bool, error: KVStoreError | None) -> None:
        if job.cancelled:
            self._finish(job, failed=True)
        elif whole:
            job.state = JobState.READY
        elif self.config.on_missing == "recompute":
            job.timings.recomputed = True
            job.state = JobState.PREFILL
        else:
            self._finish(job, failed=True)
            why = f"(evicted or node gone): {error}"
            job.fail(
                NotFoundError(f"KV blocks of request {job.req.request_id!r} unavailable {why}")
            )

    def _drop_tail(self, job: DecodeJob) -> None:
        if not job.tail_pending or self.store is None or job.handoff is None:
            return
        job.tail_pending = False
        h = job.handoff
        for key in object_keys(h.tail_key, h.num_layers, h.layered):
            with contextlib.suppress(KVStoreError):
                self.store.remove(key)

    def _prefill_chunks(self, jobs: list[DecodeJob]) -> None:
        """Scheduler thread: up to `chunk_tokens` prompt tokens of local prefill (Generate,
        or a recompute), oldest job first, then back to a decode step: a long prompt
        delays the running batch by one chunk per step, not by its whole prefill."""
        budget = self.config.chunk_tokens
        for job in jobs:
            if budget <= 0:
                return
            take = min(budget, len(job.req.prompt) - job.prefilled)
            self._guard(job, functools.partial(self._local_prefill, tokens=take))
            budget -= take

    def _local_prefill(self, job: DecodeJob, tokens: int) -> None:
        start, pos = time.perf_counter(), job.prefilled
        chunk = job.req.prompt[pos : pos + tokens]
        logits = self.engine.prefill(chunk, job.blocks, pos, self.kv.layers)
        job.prefilled += len(chunk)
        job.timings.prefill_s += time.perf_counter() - start
        if job.prefilled < len(job.req.prompt):
            return
        if job.first_token is None:
            job.first_token = job.sample(logits)
        with self._cond:
            job.state = JobState.READY

    # -- decoding ---------------------------------------------------------------------------

    def _start(self, job: DecodeJob) -> None:
        """READY -> RUNNING: send the first token (it may already end the job)."""
        assert job.first_token is not None
        job.state = JobState.RUNNING
        finish = job.emit_token(job.first_token, defer_finish=self._saves)
        if finish is not None:
            self._finish(job, failed=False, finish=finish)

    def _step(self, batch: list[DecodeJob]) -> None:
        seqs = [SeqState(j.tokens[-1], j.position, tuple(j.blocks)) for j in batch]
        try:
            logits = self.engine.decode_step(seqs, self.kv.layers)
        except (BadRequestError, RuntimeError) as exc:
            with self._cond:
                for job in batch:
                    self._finish(job, failed=True)
                    job.fail(KVStoreError(f"decode step failed: {exc}"))
            return
        with self._cond:
            self._steps += 1
            for job, row in zip(batch, logits, strict=True):
                if job.cancelled:
                    continue
                finish = job.emit_token(job.sample(row), defer_finish=self._saves)
                if finish is not None:
                    self._finish(job, failed=False, finish=finish)


__all__ = ["DecodeScheduler", "JobEvent", "SchedulerStats"]
