"""Fuzzing (issue 10, point 6), CI-sized: hypothesis builds requests for every Master RPC
(valid, boundary and garbage fields, and raw garbage bytes) against a live master and
storage node, and raw bytes for the TCP data plane; after each case the status is typed,
the master answers, check_integrity holds and a canary object reads back exact.
`python bench/fuzz.py` is the long run (cases tried, statuses seen)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, assume, given, settings

from tests.security.fuzzing import METHODS, SERVICE, FuzzTarget, frames, requests, send_frame
from tests.security.helpers import InProcessMaster

pytestmark = pytest.mark.slow
CI = settings(
    max_examples=400, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)  # fmt: skip
SEEN: Counter[str] = Counter()


@pytest.fixture(scope="module")
def target() -> Iterator[FuzzTarget]:
    with InProcessMaster(
        None, put_timeout_s=1.0, node_ttl_s=60.0, heartbeat_interval_s=1.0
    ) as master:
        t = FuzzTarget(master)
        yield t
        t.close()


def test_every_method_empty_and_garbage(target: FuzzTarget) -> None:
    for method in METHODS:
        empty = SERVICE.methods_by_name[method].input_type
        assert empty is not None
        for raw in (b"", b"\xff\xfe\xfd", b"\x0a\x05abc"):
            if not target.protected(method, raw):
                target.case(method, raw)


@CI
@given(case=requests())
def test_master_rpcs_fuzzed(target: FuzzTarget, case: tuple[str, bytes]) -> None:
    method, raw = case
    assume(not target.protected(method, raw))
    SEEN[target.case(method, raw).name] += 1


@settings(CI, max_examples=300)
@given(data=frames())
def test_data_plane_fuzzed(target: FuzzTarget, data: bytes) -> None:
    send_frame(target.node.endpoint, data)
    target.check()


def test_fuzz_reached_the_servicer(target: FuzzTarget) -> None:
    """The cases were not all refused at the door: some were served, some refused."""
    assert target.cases >= 300
    assert SEEN["OK"] > 0 and SEEN["INVALID_ARGUMENT"] > 0, SEEN
    print(f"fuzz: {target.cases} cases, statuses {dict(SEEN)}")
