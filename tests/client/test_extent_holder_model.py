"""kvstore.client.extents.ExtentHolder under a hypothesis state machine: puts on many
threads interleave their takes, commits (that may bring the next extent), grants and
failures in any order. Whatever the order, every extent the master granted is given
back exactly once (for a release: by a grant, a commit, the last put in it, or the
close) or deliberately left to its lease (abandoned), and never while a put is still
writing into it. A put that moved on to a next extent while a GrantExtent was in
flight once lost that extent (neither current nor released: its lease ran on)."""

from __future__ import annotations

import time

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvstore.client.extents import ExtentHolder
from kvstore.v1 import common_pb2, master_pb2

EXTENT = 4096


def _grant(extent_id: int) -> master_pb2.GrantExtentResponse:
    reply = master_pb2.GrantExtentResponse(extent_id=extent_id, ttl_ms=600_000, alignment=64)
    reply.location.CopyFrom(
        common_pb2.Location(node_id="n", segment="s", offset=extent_id * EXTENT, length=EXTENT)
    )
    return reply


class HolderMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = ExtentHolder(EXTENT, EXTENT, 0.0)
        self.ids = 0
        self.granted: set[int] = set()
        self.given_back: list[int] = []  # for a release, in order
        self.abandoned: set[int] = set()
        self.writing: list[tuple[int, int]] = []  # puts holding a range: (extent, ask)
        self.granting = False

    def _fresh(self) -> int:
        self.ids += 1
        self.granted.add(self.ids)
        return self.ids

    def _give_back(self, extent_id: int) -> None:
        assert extent_id in self.granted, extent_id
        assert all(e != extent_id for e, _ in self.writing), "released under a put"
        self.given_back.append(extent_id)

    @rule(size=st.sampled_from([64, 500, 1024, 3000, 4096]))
    def take(self, size: int) -> None:
        taken = self.h.take_one(size)
        if taken is not None:
            extent_id, loc, ask = taken
            start = extent_id * EXTENT
            assert start <= loc.offset and loc.offset + size <= start + EXTENT
            self.writing.append((extent_id, ask))

    @precondition(lambda self: self.writing)
    @rule(i=st.integers(0, 63), brings_next=st.booleans(), fails=st.booleans())
    def commit(self, i: int, brings_next: bool, fails: bool) -> None:
        """A put's commit ends (it asked: a next extent or none; `fails`: no reply),
        and the put is done; with it go the releases it carried."""
        extent_id, asked = self.writing.pop(i % len(self.writing))
        for other in self.h.take_released():
            self._give_back(other)
        if asked:
            reply = None
            if not fails:
                reply = master_pb2.CommitExtentResponse()
                if brings_next:
                    reply.next.CopyFrom(_grant(self._fresh()))
            self.h.answered(asked, reply, time.monotonic())
        if self.h.done(extent_id, asked):
            self._give_back(extent_id)

    @precondition(lambda self: self.writing)
    @rule(i=st.integers(0, 63))
    def write_fails(self, i: int) -> None:
        """A put's write met an error of unknown fate: the extent is never released."""
        extent_id, asked = self.writing.pop(i % len(self.writing))
        self.h.abandon(extent_id)
        self.abandoned.add(extent_id)
        self.h.done(extent_id, asked)  # no commit carried its ask: it ends here

    @precondition(lambda self: not self.granting)
    @rule()
    def begin_grant(self) -> None:
        release = self.h.begin_grant()
        assert release is not None  # none in flight
        self.granting = True
        if release:
            self._give_back(release)

    @precondition(lambda self: self.granting)
    @rule(ok=st.booleans())
    def end_grant(self, ok: bool) -> None:
        self.granting = False
        if ok:
            self.h.install(_grant(self._fresh()), time.monotonic())
        else:
            self.h.end_grant()

    @invariant()
    def one_grant_at_a_time(self) -> None:
        if self.granting:
            assert self.h.begin_grant() is None

    @invariant()
    def an_ask_is_held_by_a_put_still_writing(self) -> None:
        """At most one ask is out, and only while the put that carries it has not
        ended: an ask left behind would stop every later put from asking ahead."""
        asks = [a for _, a in self.writing if a]
        assert len(asks) <= 1
        assert self.h._asking in (0, *asks)

    @invariant()
    def nothing_given_back_twice(self) -> None:
        assert len(self.given_back) == len(set(self.given_back))

    @invariant()
    def every_extent_is_accounted_for(self) -> None:
        """Each granted extent is the current or the next one, replaced but still
        written into, waiting for a commit to release it, given back, or abandoned."""
        h = self.h
        held = {lease.extent_id for lease in (h._lease, h._next) if lease is not None}
        known = held | set(h._retiring) | set(h._released) | set(self.given_back)
        assert self.granted <= known | self.abandoned, self.granted - known - self.abandoned

    def teardown(self) -> None:
        """Every put ends, then the close: every extent was given back once or left to
        its lease (abandoned), none lost."""
        while self.writing:
            self.commit(0, False, False)
        if self.granting:
            self.end_grant(False)
        for extent_id in self.h.detach():
            self._give_back(extent_id)
        back = set(self.given_back)
        assert len(back) == len(self.given_back)
        assert self.granted == back | self.abandoned, (self.granted, back, self.abandoned)


HolderMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)
TestHolder = HolderMachine.TestCase
