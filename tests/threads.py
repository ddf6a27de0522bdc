"""Running a test's workers in threads at once, their failures reported, every join bounded."""

from __future__ import annotations

import threading
from collections.abc import Callable


def in_threads(fn: Callable[[int], None], n: int, join_s: float = 60.0) -> list[BaseException]:
    """Run fn(0..n-1) in n threads at once; what each raised (none: []). A thread still
    running `join_s` after the start is a hang: AssertionError."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            fn(i)
        except BaseException as e:  # reported to the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    assert not any(t.is_alive() for t in threads), f"a worker still runs after {join_s} s"
    return errors
