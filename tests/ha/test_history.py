"""The linearizability checker of tests/ha/history.py on hand-made histories: what a
correct store may answer passes, a stale read, a lost write and a split brain fail, and
an op of unknown outcome may have happened or not."""

from __future__ import annotations

import math
import random
from pathlib import Path

from tests.ha.history import Op, Recorder, check, check_key, explain, load_ops

INF = math.inf


def op(f: str, call: float, ret: float, value: object = None, result: object = None,
       outcome: str = "ok", p: int = 0, key: str = "k") -> Op:  # fmt: skip
    return Op(p, f, key, value, call, ret, outcome, result)


def lin(*ops: Op) -> bool | None:
    return check_key("k", ops).linearizable


def test_sequential_history_passes() -> None:
    assert lin(
        op("get", 0, 1, result=None), op("put", 2, 3, "a"), op("get", 4, 5, result="a"),
        op("put", 6, 7, "b", outcome="info"), op("remove", 8, 9, result=True),
        op("get", 10, 11, result=None), op("remove", 12, 13, result=False),
    )  # fmt: skip


def test_stale_read_after_remove_fails() -> None:
    assert not lin(op("put", 0, 1, "a"), op("remove", 2, 3, result=True),
                   op("get", 4, 5, result="a"))  # fmt: skip


def test_lost_acknowledged_put_fails() -> None:
    assert not lin(op("put", 0, 1, "a"), op("get", 2, 3, result=None))


def test_two_acknowledged_creates_of_one_key_fail() -> None:  # split brain
    assert not lin(op("put", 0, 2, "a", p=0), op("put", 1, 3, "b", p=1),
                   op("get", 4, 5, result="a"))  # fmt: skip


def test_concurrent_ops_may_take_either_order() -> None:
    assert lin(op("put", 0, 10, "a", p=0), op("get", 1, 2, result=None, p=1),
               op("get", 3, 4, result="a", p=2), op("remove", 5, 11, result=True, p=1),
               op("get", 12, 13, result=None))  # fmt: skip


def test_an_unknown_put_may_happen_late_or_never() -> None:
    late = [op("put", 0, INF, "a", outcome="info"), op("get", 1, 2, result=None),
            op("get", 30, 31, result="a")]  # fmt: skip
    assert lin(*late)
    never = [op("put", 0, INF, "a", outcome="info"), op("get", 30, 31, result=None)]
    assert lin(*never)
    # but once seen it cannot vanish without a remove
    assert not lin(*late, op("get", 40, 41, result=None))
    # an unknown op bounded in time (a grace after its client gave up) may still not
    # have happened at all
    bounded = [op("put", 0, 1, "a"), op("remove", 2, 5, outcome="info"),
               op("get", 6, 7, result="a"), op("remove", 8, 9, result=True)]  # fmt: skip
    assert lin(*bounded)
    assert not lin(*bounded, op("get", 10, 11, result="a"))


def test_failed_ops_did_not_happen() -> None:
    assert not lin(op("put", 0, 1, "a", outcome="fail"), op("get", 2, 3, result="a"))


def test_keys_are_checked_apart_and_the_violation_is_explained(tmp_path: Path) -> None:
    paths = []
    for p in range(2):
        path = tmp_path / f"h{p}.jsonl"
        rec = Recorder(p, path)
        t = rec.invoke("put", f"k{p}", f"v{p}")
        rec.complete(t, "ok")
        t = rec.invoke("get", f"k{p}")
        rec.complete(t, "ok", f"v{p}" if p == 0 else None)  # k1's put is lost
        rec.invoke("remove", f"k{p}")  # never answered: info
        rec.close()
        paths.append(path)
    ops = load_ops(paths)
    report = check(ops)
    assert report.ops == 6 and report.outcomes["remove:info"] == 2
    assert [(k.key, k.linearizable) for k in report.keys] == [("k0", True), ("k1", False)]
    assert "get(None) ok None" in explain(report.violations[0], ops)


def test_random_sequential_histories_of_a_real_register_pass() -> None:
    rng = random.Random(7)
    for _ in range(50):
        state, t, ops = None, 0.0, []
        for i in range(60):
            f = rng.choice(("put", "get", "remove"))
            if f == "put":
                res, value = ("ok" if state is None else "fail"), f"v{i}"
                state = value if state is None else state
                ops.append(op("put", t, t + 1, value, outcome=res))
            elif f == "get":
                ops.append(op("get", t, t + 1, result=state))
            else:
                ops.append(op("remove", t, t + 1, result=state is not None))
                state = None
            t += 2
        assert check_key("k", ops).linearizable
