"""Event loop: time order, FIFO ties, bad schedules."""

from __future__ import annotations

import pytest

from kvstore.errors import BadRequestError
from kvstore.sim.events import EventLoop


def test_runs_in_time_then_schedule_order() -> None:
    loop = EventLoop()
    seen: list[tuple[float, str]] = []
    for t, name in [(2.0, "c"), (1.0, "a"), (2.0, "d"), (1.0, "b")]:
        loop.at(t, lambda t=t, name=name: seen.append((loop.now, name)))
    loop.after(0.5, lambda: loop.after(1.5, lambda: seen.append((loop.now, "e"))))
    assert loop.run() == 6
    assert seen == [(1.0, "a"), (1.0, "b"), (2.0, "c"), (2.0, "d"), (2.0, "e")]


def test_run_until_stops_and_resumes() -> None:
    loop = EventLoop()
    seen: list[int] = []
    for i in range(5):
        loop.at(float(i), lambda i=i: seen.append(i))
    assert loop.run(until=2.0) == 3
    assert (seen, len(loop)) == ([0, 1, 2], 2)
    loop.run()
    assert seen == [0, 1, 2, 3, 4]


def test_rejects_past_and_nan() -> None:
    loop = EventLoop()
    loop.at(1.0, lambda: None)
    loop.run()
    with pytest.raises(BadRequestError):
        loop.at(0.5, lambda: None)
    with pytest.raises(BadRequestError):
        loop.after(float("nan"), lambda: None)
