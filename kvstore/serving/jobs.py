"""A decode node's unit of work (`DecodeJob`) and what it reports (`JobEvent`).

    WAITING --admit--> LOADING --pulled--> READY --> RUNNING --> (SAVING) --> DONE
       |                  |                  ^
       |                  +--missing--+      | computed
       |                              v      |
       +--admit (Generate)-------> PREFILL --+
    any state --cancel / error--> DONE (blocks freed, tail key removed)

Admission takes every block the job can need; SAVING (on_finish="publish") writes
a finished sequence's blocks to the store before they are freed.

Only the scheduler thread changes `state` and `blocks`; the loader thread writes
KV into a LOADING job's blocks and reports back through the scheduler.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvstore.errors import BadRequestError, KVStoreError
from kvstore.serving.request import Handoff, Request, sample_token


class JobState(enum.Enum):
    WAITING = "waiting"
    LOADING = "loading"
    PREFILL = "prefill"
    READY = "ready"
    RUNNING = "running"
    SAVING = "saving"  # finished; blocks being published (on_finish="publish")
    DONE = "done"


class Finish(enum.Enum):
    LENGTH = "length"
    STOP = "stop"


@dataclass(slots=True)
class DecodeTimings:
    queue_s: float = 0.0
    pull_s: float = 0.0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    recomputed: bool = False
    pulled_bytes: int = 0


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One new token (index among the new tokens, seconds since arrival), the end of
    the stream (`finish`; with token None when the end was deferred past the last
    token), or a failure (`error`, always the last event)."""

    index: int = 0
    token: int | None = None
    time_s: float = 0.0
    finish: Finish | None = None
    timings: DecodeTimings | None = None
    error: KVStoreError | None = None


Sink = Callable[[JobEvent], None]


@dataclass(eq=False, slots=True)
class DecodeJob:
    """One sequence on a decode node. `handoff` None means: prefill it here."""

    req: Request
    sink: Sink
    first_token: int | None = None
    handoff: Handoff | None = None
    arrival: float = field(default_factory=time.perf_counter)
    state: JobState = JobState.WAITING
    blocks: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    timings: DecodeTimings = field(default_factory=DecodeTimings)
    prefilled: int = 0  # prompt tokens computed here so far (local prefill)
    tail_pending: bool = False  # the handoff's tail key is still in the store
    cancel_event: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        if (self.handoff is None) != (self.first_token is None):
            raise BadRequestError("a handoff comes with its first token")
        self.tail_pending = self.handoff is not None and bool(self.handoff.tail_key)

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    @property
    def position(self) -> int:
        """Position of the last token (the one the next step feeds)."""
        return len(self.req.prompt) + len(self.tokens) - 1

    def blocks_needed(self, block_tokens: int) -> int:
        """Blocks for every position ever written: prompt + max_tokens - 1."""
        return -(-(self.req.total_tokens - 1) // block_tokens)

    def sample(self, logits: torch.Tensor) -> int:
        """Draw the job's next new token from its logits [vocab]."""
        return sample_token(self.req.sampling, logits, len(self.tokens))

    def emit_token(self, token: int, *, defer_finish: bool = False) -> Finish | None:
        """Record a new token and report it; returns why the job ends, if it does.
        With `defer_finish` the end is reported later, by `end`."""
        self.tokens.append(token)
        finish = None
        if token in self.req.stop_ids:
            finish = Finish.STOP
        elif len(self.tokens) >= self.req.max_tokens:
            finish = Finish.LENGTH
        now = time.perf_counter() - self.arrival
        first = len(self.tokens) == 1
        if first:
            self.timings.ttft_s = now
        timings = self.timings if first else None
        shown = None if defer_finish else finish
        self.sink(JobEvent(len(self.tokens) - 1, token, now, shown, timings))
        return finish

    def end(self, finish: Finish) -> None:
        """Report a deferred end: an event with no token."""
        now = time.perf_counter() - self.arrival
        self.sink(JobEvent(len(self.tokens), None, now, finish))

    def fail(self, error: KVStoreError) -> None:
        self.sink(JobEvent(index=len(self.tokens), error=error))
