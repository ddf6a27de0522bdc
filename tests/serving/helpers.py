"""Shared helpers of the serving tests: a job runner that waits on events."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from kvstore.serving.jobs import DecodeJob, DecodeTimings, JobEvent
from kvstore.serving.prefill import PrefillResult
from kvstore.serving.request import Request
from kvstore.serving.scheduler import DecodeScheduler


@dataclass
class Collected:
    """Events of one job, in order; `done` is set at its last event."""

    events: list[JobEvent] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def sink(self, event: JobEvent) -> None:
        self.events.append(event)
        if event.finish is not None or event.error is not None:
            self.done.set()

    @property
    def tokens(self) -> list[int]:
        return [e.token for e in self.events if e.token is not None]

    @property
    def timings(self) -> DecodeTimings:
        first = self.events[0].timings
        assert first is not None
        return first

    def wait(self, timeout_s: float = 30.0) -> Collected:
        assert self.done.wait(timeout_s), "job did not finish in time"
        return self


def submit(
    sched: DecodeScheduler, req: Request, pre: PrefillResult | None = None
) -> tuple[DecodeJob, Collected]:
    out = Collected()
    if pre is None:
        job = DecodeJob(req, out.sink)
    else:
        job = DecodeJob(req, out.sink, first_token=pre.first_token, handoff=pre.handoff)
    sched.submit(job)
    return job, out
