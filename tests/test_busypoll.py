"""Busy polling (kvstore.busypoll) on real sockets: a poll returns what arrives, a
miss falls back to sleeping, misses in a row pause polling for a doubling number of
waits, one CPU never polls, and an asyncio loop on a PollingSelector serves requests
and fires its timers as before."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore import busypoll
from kvstore.busypoll import MAX_BACKOFF, MISSES_BEFORE_BACKOFF, PollingSelector, Spinner
from kvstore.client.config import ClientConfig
from kvstore.errors import BadRequestError
from kvstore.master.config import MasterConfig


@pytest.fixture()
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


@pytest.fixture()
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two CPUs, one of them idle (as on a quiet CI host; a loaded one polls less)."""
    monkeypatch.setattr(busypoll, "cpus", lambda: 2)
    monkeypatch.setattr(busypoll, "spare_cpu", lambda: True)


def test_a_poll_returns_what_arrives_and_a_miss_returns_none(
    pair: tuple[socket.socket, socket.socket], two_cpus: None
) -> None:
    a, b = pair
    spinner = Spinner(0.002)
    b.sendall(b"reply")
    assert busypoll.recv_polling(a, 100, spinner) == b"reply"
    assert (spinner.hits, spinner.missed) == (1, 0)
    assert busypoll.recv_polling(a, 100, spinner) is None  # nothing comes: sleep instead
    assert (spinner.hits, spinner.missed) == (1, 1)
    b.close()
    assert busypoll.recv_polling(a, 100, spinner) == b""  # the peer closed


def test_a_reply_sent_while_polling_is_caught(
    pair: tuple[socket.socket, socket.socket], two_cpus: None
) -> None:
    a, b = pair
    spinner = Spinner(30.0)  # returns as soon as the reply lands, never waits this long
    ready = threading.Event()

    def answer() -> None:
        ready.wait(10)
        b.sendall(b"late")

    t = threading.Thread(target=answer)
    t.start()
    ready.set()
    assert busypoll.recv_polling(a, 100, spinner) == b"late"
    t.join(10)
    assert spinner.hits == 1


def test_misses_in_a_row_pause_polling_for_doubling_waits(two_cpus: None) -> None:
    spinner = Spinner(0.001)

    def wait() -> bool:  # one wait whose poll (if any) finds nothing: whether it polled
        polled = spinner.due() > 0
        if polled:
            spinner.miss()
        return polled

    pattern = "".join("P" if wait() else "-" for _ in range(1200))
    runs = [len(r) for r in pattern.split("P") if r]  # the pauses, in order
    assert pattern.startswith("PPP-PPP--PPP----")
    assert runs[:5] == [1, 2, 4, 8, 16] and max(runs) == MAX_BACKOFF
    assert all(len(r) == MISSES_BEFORE_BACKOFF for r in pattern.split("-") if r)
    while not spinner.due():  # the pause ends with a poll...
        pass
    spinner.hit()  # ...that catches its reply: the next pause starts at 1 again
    assert "".join("P" if wait() else "-" for _ in range(8)) == "PPP-PPP-"


def test_no_budget_or_one_cpu_never_polls(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    b.sendall(b"x")
    off = Spinner(0.0)
    assert busypoll.recv_polling(a, 10, off) is None and off.hits == off.missed == 0
    monkeypatch.setattr(busypoll, "cpus", lambda: 1)
    assert Spinner(0.01).budget_s == 0.0 and busypoll.usable(0.01) == 0.0
    assert a.recv(10) == b"x"  # left for the blocking recv


def test_a_polling_loop_serves_and_keeps_its_timers(two_cpus: None) -> None:
    """An echo server on a PollingSelector loop: a stream of requests is answered
    (polls catch most of them), and a timer fires while the loop polls."""
    selector = PollingSelector(0.05)

    async def main() -> tuple[list[bytes], bool]:
        fired = asyncio.Event()
        loop = asyncio.get_running_loop()

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(100):
                writer.write(data)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        def client() -> list[bytes]:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                out = []
                for i in range(50):
                    s.sendall(b"%03d" % i)
                    out.append(s.recv(100))
                return out

        loop.call_later(0.01, fired.set)  # due while requests keep the loop polling
        replies = await asyncio.to_thread(client)
        await asyncio.wait_for(fired.wait(), 10)
        server.close()
        await server.wait_closed()
        return replies, fired.is_set()

    loop = asyncio.SelectorEventLoop(selector)
    try:
        replies, fired = loop.run_until_complete(main())
    finally:
        loop.close()
    assert replies == [b"%03d" % i for i in range(50)]
    assert fired
    assert selector.spinner.hits > 0


@pytest.mark.parametrize(("running", "spare"), [(1, True), (2, True), (3, False), (9, False)])
def test_a_wait_polls_only_while_a_cpu_is_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running: int, spare: bool
) -> None:
    """/proc/loadavg's running tasks (the poller among them) against the host's CPUs:
    a poll that would take a CPU another task needs does not happen, and is no miss."""
    loadavg = tmp_path / "loadavg"
    loadavg.write_text(f"0.50 0.40 0.30 {running}/212 4242\n")
    fd = os.open(loadavg, os.O_RDONLY)
    try:
        monkeypatch.setattr(busypoll, "_loadavg", fd)
        monkeypatch.setattr(busypoll, "_HOST_CPUS", 2)
        monkeypatch.setattr(busypoll, "cpus", lambda: 2)
        assert busypoll.spare_cpu() is spare
        spinner = Spinner(0.001)
        assert spinner.due() == (0.001 if spare else 0.0)
        assert spinner.missed == 0 and spinner.skip == 0
    finally:
        os.close(fd)


def test_a_poll_stops_when_another_task_needs_the_cpu(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host was idle when the wait began, then another task became runnable: the
    poll ends within RECHECK polls (the caller sleeps in recv), and it is no miss."""
    a, _ = pair
    monkeypatch.setattr(busypoll, "cpus", lambda: 2)
    looks = iter([True, True])  # the wait's own look, the first recheck; then busy
    monkeypatch.setattr(busypoll, "spare_cpu", lambda: next(looks, False))
    spinner = Spinner(60.0)
    assert busypoll.recv_polling(a, 10, spinner) is None  # long before 60 s
    assert spinner.missed == spinner.hits == 0
    selector = PollingSelector(60.0)
    try:
        looks = iter([True, True])
        selector._last = time.perf_counter()  # an event just now: the window is open
        assert selector.select(0.2) == []  # polls, then sleeps the rest of the 0.2 s
        assert selector.spinner.missed == selector.spinner.hits == 0  # it stopped early
    finally:
        selector.close()


def test_an_unreadable_load_does_not_stop_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(busypoll, "_loadavg", -1)  # no /proc/loadavg (not Linux)
    assert busypoll.spare_cpu() is True
    r, w = os.pipe()  # readable, but not a loadavg line
    try:
        os.write(w, b"garbage\n")
        monkeypatch.setattr(busypoll, "_loadavg", r)
        assert busypoll.spare_cpu() is True
    finally:
        os.close(r)
        os.close(w)


def test_configs_bound_the_poll() -> None:
    with pytest.raises(BadRequestError, match="busy_poll_us"):
        MasterConfig(busy_poll_us=-1)
    with pytest.raises(BadRequestError, match="busy_poll_us"):
        ClientConfig("127.0.0.1:1", busy_poll_us=200_000)
    assert MasterConfig(busy_poll_us=0).busy_poll_us == 0
