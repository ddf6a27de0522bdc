"""The launcher with real child processes: ready lines, failures, shutdown."""

from __future__ import annotations

import pytest

from kvstore.errors import UnavailableError
from kvstore.serving_bench.launch import Launcher, serving_argv, storage_argv

SERVE = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGINT, lambda *a: sys.exit(0))\n"
    "print('x listening on 127.0.0.1:4242', flush=True)\n"
    "time.sleep(60)\n"
)


def test_ready_line_address_and_clean_close() -> None:
    with Launcher(ready_timeout_s=20) as procs:
        a, b = procs.start_many([("a", ["-c", SERVE]), ("b", ["-c", SERVE])])
        assert (a, b) == ("127.0.0.1:4242", "127.0.0.1:4242")
        live = [p for _, p in procs.procs]
        assert procs.named_pids() == {"a": live[0].pid, "b": live[1].pid}
        assert procs.close() == []
    assert all(p.returncode == 0 for p in live) and procs.procs == []


def test_process_that_dies_or_hangs_is_an_error() -> None:
    with Launcher(ready_timeout_s=20) as procs, pytest.raises(UnavailableError, match="exited"):
        procs.start("dies", ["-c", "raise SystemExit(3)"])
    deaf = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"
    with Launcher(ready_timeout_s=3) as procs:
        with pytest.raises(UnavailableError, match="not ready"):
            procs.start("deaf", ["-c", deaf])
        assert procs.close(timeout_s=1) == ["deaf (exit -9)"]  # killed after the timeout


def test_unexpected_ready_line() -> None:
    with Launcher(ready_timeout_s=20) as procs, pytest.raises(UnavailableError, match="ready"):
        procs.start("odd", ["-c", "print('hello', flush=True)"])


def test_argv_builders() -> None:
    assert serving_argv("decode_node", model="small", cpus=(1,), extra=["--colocated"]) == [
        "-m", "decode_node", "--model", "small", "--batched", "--colocated",
        "--cpus", "1", "--torch-threads", "1",
    ]  # fmt: skip
    assert storage_argv("h:1", 8, "s0") == [
        "-m", "kvstore.node", "--master", "h:1", "--dram-mib", "8", "--node-id", "s0",
        "--no-nixl",
    ]  # fmt: skip
    assert storage_argv("h:1", 8, "s0", nixl=True)[-1] == "--nixl"
