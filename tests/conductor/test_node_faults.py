"""Serving nodes that die under a request (issue 11's fault matrix), with real
processes: a master and a storage node (tests/cluster.py), a prefill node, a decode
node and `python -m kvstore.conductor` in front of them.

- a prefill node SIGKILLed while the conductor's Prefill call is on it: the request
  ends with a typed status naming the failure (it is not retried: its KV never
  existed), in bounded time, and the conductor stops placing there;
- a decode node SIGKILLed while it streams: the stream ends with a typed status
  after the tokens already sent, never a hang.

"Mid-request" is made certain without timers: the prefill node is stopped (SIGSTOP)
before the request is sent, so the call is on it, unanswered, when it is killed; the
decode node is killed after the first tokens arrived and before the last could."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from kvstore.serving.client import make_spec
from kvstore.v1 import conductor_pb2 as cpb
from kvstore.v1 import conductor_pb2_grpc
from tests.cluster import Cluster, stop_process
from tests.conductor.test_service import node_args, spawn, wait_for

pytestmark = pytest.mark.slow

PROMPT = [(11 * i + 5) % 250 + 1 for i in range(200)]  # past the decode node's local limit
LOCAL = 64
FAIL_WITHIN_S = 30.0  # the conductor's node calls end by their RPC timeout at the latest


@dataclass
class Serving:
    prefill: subprocess.Popen[bytes]
    decode: subprocess.Popen[bytes]
    conductor: str

    def stub(self, channel: grpc.Channel) -> conductor_pb2_grpc.ConductorStub:
        return conductor_pb2_grpc.ConductorStub(channel)

    def status(self) -> cpb.ClusterStatusResponse:
        with grpc.insecure_channel(self.conductor) as channel:
            return self.stub(channel).ClusterStatus(cpb.ClusterStatusRequest(), timeout=10)


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Serving]:
    started: list[subprocess.Popen[bytes]] = []
    with Cluster(workdir=tmp_path, nodes=1, dram_bytes=32 << 20) as pool:
        try:
            master = ["--master", pool.address]
            pre, pre_addr = spawn(node_args("prefill_node", *master), b"prefill node",
                                  tmp_path / "p.log")  # fmt: skip
            started.append(pre)
            dec_args = node_args("decode_node", *master, "--local-prefill-tokens", str(LOCAL))
            dec, dec_addr = spawn(dec_args, b"decode node", tmp_path / "d.log")
            started.append(dec)
            args = ["-m", "kvstore.conductor", "--master", pool.address, "--prefill", pre_addr,
                    "--decode", dec_addr, "--timeout-s", "20"]  # fmt: skip
            cond, cond_addr = spawn(args, b"conductor listening", tmp_path / "conductor.log")
            started.append(cond)
            yield Serving(pre, dec, cond_addr)
        finally:
            for proc in reversed(started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)  # a stopped process cannot exit
                stop_process(proc)


def _request(max_tokens: int) -> cpb.ConductorGenerateRequest:
    return cpb.ConductorGenerateRequest(spec=make_spec("", PROMPT, max_tokens))


def test_prefill_node_sigkill_mid_request_fails_typed_in_bounded_time(serving: Serving) -> None:
    with grpc.insecure_channel(serving.conductor) as channel:  # a warm path first
        first = list(serving.stub(channel).Generate(_request(4), timeout=60))
    assert sum(len(m.token_ids) for m in first) == 4
    before = serving.status().requests
    os.kill(serving.prefill.pid, signal.SIGSTOP)
    outcome: dict[str, object] = {}
    done = threading.Event()

    def run() -> None:
        try:
            with grpc.insecure_channel(serving.conductor) as channel:
                outcome["messages"] = list(serving.stub(channel).Generate(_request(8), timeout=120))
        except grpc.RpcError as err:
            outcome["error"] = err
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    wait_for(lambda: serving.status().requests > before)  # placed: its Prefill is in flight
    assert not done.is_set()  # the stopped node cannot have answered
    killed = time.monotonic()
    serving.prefill.kill()
    serving.prefill.wait(10)
    assert done.wait(FAIL_WITHIN_S + 10), "the request hung after its prefill node died"
    assert time.monotonic() - killed < FAIL_WITHIN_S
    err = outcome.get("error")
    assert isinstance(err, grpc.RpcError), outcome  # no KV was made: nothing to reroute
    assert err.code() == grpc.StatusCode.UNAVAILABLE, (err.code(), err.details())
    assert err.details()
    # the failure is counted, and the next request is refused at once, not sent there
    assert serving.status().failed >= 1
    t0 = time.monotonic()
    with grpc.insecure_channel(serving.conductor) as channel, pytest.raises(grpc.RpcError) as again:
        list(serving.stub(channel).Generate(_request(4), timeout=60))
    assert again.value.code() == grpc.StatusCode.UNAVAILABLE  # retryable, not a bad request
    assert "no PREFILL node is reachable" in (again.value.details() or "")
    assert time.monotonic() - t0 < FAIL_WITHIN_S


def test_decode_node_sigkill_mid_stream_ends_the_stream_typed(serving: Serving) -> None:
    got: list[int] = []
    with grpc.insecure_channel(serving.conductor) as channel:
        stream = serving.stub(channel).Generate(_request(400), timeout=120)
        with pytest.raises(grpc.RpcError) as ended:
            for message in stream:
                got.extend(message.token_ids)
                if got and serving.decode.poll() is None:
                    serving.decode.kill()  # after the first tokens, long before the 400th
                    serving.decode.wait(10)
    assert 0 < len(got) < 400
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value.code()
    assert ended.value.details()
    assert serving.status().failed >= 1
    with grpc.insecure_channel(serving.conductor) as channel, pytest.raises(grpc.RpcError) as again:
        list(serving.stub(channel).Generate(_request(4), timeout=60))
    assert again.value.code() == grpc.StatusCode.UNAVAILABLE  # retryable, not a bad request
    assert "no DECODE node is reachable" in (again.value.details() or "")
