"""Jepsen-style histories of put/get/remove and a linearizability checker for them.

    rec = Recorder(process=3, path=Path("h3.jsonl"))  # one per client process
    t = rec.invoke("put", "k1", "3:17")                 # {"type": "invoke", ...}
    rec.complete(t, "ok")                              # or "fail" / "info", with a result
    ops = load_ops([Path("h0.jsonl"), ...])            # invoke/complete pairs -> Op
    report = check(ops)                                # per key: Wing-Gong-Lowe search

Every event is one JSON line with a CLOCK_MONOTONIC timestamp (system-wide, so the lines
of processes on one machine, in any network namespace, are comparable). An op is `ok`
(it happened, with its result), `fail` (it certainly did not happen) or `info` (its
outcome is unknown: a timeout, a lost reply; it may have taken effect at any time after
its invocation, or never; an invocation with no completion is info too).

The model is kvstore's object: one register per key, initially absent. `put(k, v)`
creates the key only if absent (ok) and else refuses (ExistsError, nothing changes);
`get(k)` returns its value or None (NotFoundError); `remove(k)` returns True if it
removed the key, False if it was absent. Keys are independent, so each is checked on
its own (Herlihy & Wing's locality): the search of Wing & Gong with Lowe's cache of
(linearized set, state) pairs, as Knossos and porcupine do it.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

FUNCTIONS = ("put", "get", "remove")
OUTCOMES = ("ok", "fail", "info")


class Recorder:
    """Appends one client process's events to a JSONL file, one flushed line each."""

    def __init__(self, process: int, path: Path) -> None:
        self.process = process
        self._out: IO[str] = open(path, "a")  # noqa: SIM115 - closed by close()
        self._next = 0

    def invoke(self, f: str, key: str, value: Any = None) -> int:
        """Record the start of an op; its id (for `complete`)."""
        assert f in FUNCTIONS, f
        op_id, self._next = self._next, self._next + 1
        self._write({"type": "invoke", "id": op_id, "f": f, "key": key, "value": value})
        return op_id

    def complete(self, op_id: int, outcome: str, result: Any = None, error: str = "") -> None:
        assert outcome in OUTCOMES, outcome
        self._write({"type": outcome, "id": op_id, "result": result, "error": error})

    def _write(self, event: dict[str, Any]) -> None:
        event["process"] = self.process
        event["time"] = time.monotonic()
        self._out.write(json.dumps(event) + "\n")
        self._out.flush()

    def close(self) -> None:
        self._out.close()


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: invoked at `call`, completed at `ret` (inf when the outcome is
    unknown); `result` is what an ok op returned."""

    process: int
    f: str
    key: str
    value: Any
    call: float
    ret: float
    outcome: str
    result: Any = None
    error: str = ""


def pair(events: Iterable[dict[str, Any]], grace_s: float = math.inf) -> list[Op]:
    """Ops from the events of any number of processes (an unanswered invoke is info).

    An info op may take effect until `grace_s` after its client stopped waiting (inf:
    at any time). A finite bound is a claim about the store: kvstore's is the leader's
    lease (a write of a leader that lost its lease is fenced off in etcd), see
    tests/ha/jepsen.py."""
    open_: dict[tuple[int, int], dict[str, Any]] = {}
    ops: list[Op] = []
    for e in events:
        k = (e["process"], e["id"])
        if e["type"] == "invoke":
            open_[k] = e
            continue
        inv = open_.pop(k)
        info = e["type"] == "info"
        ops.append(Op(e["process"], inv["f"], inv["key"], inv["value"], inv["time"],
                      e["time"] + grace_s if info else e["time"], e["type"], e.get("result"),
                      e.get("error", "")))  # fmt: skip
    for inv in open_.values():
        ops.append(Op(inv["process"], inv["f"], inv["key"], inv["value"], inv["time"],
                      math.inf, "info", None, "no completion"))  # fmt: skip
    return ops


def load_ops(paths: Sequence[Path], grace_s: float = math.inf) -> list[Op]:
    """Ops of the JSONL files `paths` (a torn last line, from a killed writer, is skipped)."""
    events: list[dict[str, Any]] = []
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return pair(events, grace_s)


# ---- the model --------------------------------------------------------------------


def step(state: Any, op: Op) -> list[Any]:
    """The states `op` may leave `state` in, given what it returned ([]: it cannot have
    happened there). An op of unknown outcome may also have had no effect."""
    if op.f == "put":
        new, out = (op.value, "ok") if state is None else (state, "exists")
        ok = out == "ok"
    elif op.f == "get":
        new, ok = state, op.result == state
    else:  # remove
        new, ok = None, op.result == (state is not None)
    if op.outcome == "info":
        return [new] if new == state else [new, state]
    return [new] if ok else []


# ---- the search -------------------------------------------------------------------


class _Entry:
    __slots__ = ("call", "id", "match", "next", "op", "prev")

    def __init__(self, op: Op | None, id_: int, call: bool) -> None:
        self.op = op
        self.id = id_
        self.call = call
        self.match: _Entry | None = None
        self.prev: _Entry | None = None
        self.next: _Entry | None = None


def _entries(ops: Sequence[Op]) -> _Entry:
    """The doubly linked list of call and return events of `ops`, in time order (a call
    before a return at the same instant: such ops count as concurrent); its head."""
    events: list[tuple[float, int, _Entry]] = []
    for i, op in enumerate(ops):
        c, r = _Entry(op, i, True), _Entry(op, i, False)
        c.match = r
        events += [(op.call, 0, c), (op.ret, 1, r)]
    events.sort(key=lambda t: (t[0], t[1]))
    head = prev = _Entry(None, -1, False)
    for _, _, e in events:
        prev.next, e.prev = e, prev
        prev = e
    return head


def _lift(e: _Entry) -> None:
    for x in (e, e.match):
        assert x is not None and x.prev is not None
        x.prev.next = x.next
        if x.next is not None:
            x.next.prev = x.prev


def _unlift(e: _Entry) -> None:
    for x in (e.match, e):
        assert x is not None and x.prev is not None
        x.prev.next = x
        if x.next is not None:
            x.next.prev = x


@dataclass(slots=True)
class KeyResult:
    key: str
    ops: int
    linearizable: bool | None  # None: the search gave up (`max_steps`)
    steps: int
    prefix: int = 0  # the most ops linearized at once (where a violation stuck)
    stuck_at: Op | None = None  # the op whose completion could not be passed


def check_key(key: str, ops: Sequence[Op], max_steps: int = 2_000_000) -> KeyResult:
    """Is the history of one key linearizable (fail ops dropped: they did not happen)?"""
    ops = [op for op in ops if op.outcome != "fail"]
    head = _entries(ops)
    cache: set[tuple[int, Any]] = set()
    stack: list[tuple[_Entry, Any, list[Any]]] = []  # lifted call, state before, choices left
    state: Any = None
    linearized = 0
    entry = head.next
    steps = best = 0
    stuck: Op | None = None
    while head.next is not None:
        steps += 1
        if steps > max_steps:
            return KeyResult(key, len(ops), None, steps, best, stuck)
        assert entry is not None
        if entry.call:
            assert entry.op is not None
            lin = linearized | (1 << entry.id)
            choices = [s for s in step(state, entry.op) if (lin, s) not in cache]
            if choices:
                cache.add((lin, choices[0]))
                stack.append((entry, state, choices[1:]))
                state, linearized = choices[0], lin
                _lift(entry)
                best = max(best, len(stack))
                entry = head.next
                continue
            entry = entry.next
        else:  # a completion no pending op can pass: undo the last choice
            if len(stack) >= best:
                stuck = entry.op
            if not stack:
                return KeyResult(key, len(ops), False, steps, best, stuck)
            entry, before, left = stack.pop()
            left = [s for s in left if (linearized, s) not in cache]
            if left:  # the same op, with its other possible outcome
                cache.add((linearized, left[0]))
                stack.append((entry, before, left[1:]))
                state = left[0]
                entry = head.next
                continue
            state = before
            linearized &= ~(1 << entry.id)
            _unlift(entry)
            entry = entry.next
    return KeyResult(key, len(ops), True, steps, best)


@dataclass(slots=True)
class Report:
    ops: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    keys: list[KeyResult] = field(default_factory=list)

    @property
    def violations(self) -> list[KeyResult]:
        return [k for k in self.keys if k.linearizable is False]

    @property
    def unknown(self) -> list[KeyResult]:
        return [k for k in self.keys if k.linearizable is None]

    def summary(self) -> dict[str, Any]:
        return {
            "ops": self.ops, "outcomes": self.outcomes, "keys": len(self.keys),
            "violations": len(self.violations), "unknown": len(self.unknown),
            "violating_keys": [k.key for k in self.violations],
        }  # fmt: skip


def check(ops: Sequence[Op], max_steps: int = 2_000_000) -> Report:
    """Check every key's history on its own."""
    by_key: dict[str, list[Op]] = defaultdict(list)
    outcomes: dict[str, int] = defaultdict(int)
    for op in ops:
        by_key[op.key].append(op)
        outcomes[f"{op.f}:{op.outcome}"] += 1
    report = Report(len(ops), dict(sorted(outcomes.items())))
    for key in sorted(by_key):
        report.keys.append(check_key(key, by_key[key], max_steps))
    return report


def explain(result: KeyResult, ops: Sequence[Op], around: int = 12) -> str:
    """The ops of a violating key near where the search stuck, one per line."""
    mine = sorted((op for op in ops if op.key == result.key), key=lambda o: o.call)
    at = mine.index(result.stuck_at) if result.stuck_at in mine else 0
    t0 = mine[0].call if mine else 0.0
    lines = [f"key {result.key}: {result.ops} ops, stuck after {result.prefix} linearized"]
    for op in mine[max(0, at - around) : at + around]:
        mark = ">>" if op is result.stuck_at else "  "
        ret = "inf" if math.isinf(op.ret) else f"{op.ret - t0:8.3f}"
        lines.append(
            f"{mark} p{op.process} {op.call - t0:8.3f}..{ret} {op.f}({op.value!r}) "
            f"{op.outcome} {op.result!r} {op.error}"
        )
    return "\n".join(lines)
