"""`kvstore up` as a real process (master, storage node, prefill, decode, conductor), then
`kvstore generate`, `chat`, `lookup`, `status`, `top` against it as subprocesses, its
/metrics endpoints, and a clean stop on SIGINT (no process, no shm segment left)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvstore.client.conductor import ConductorClient
from kvstore.serving_bench.launch import shm_entries

from .procs import REPO, env, kvstore_cmd, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]


@dataclass
class Up:
    proc: subprocess.Popen[str]
    conductor: str
    master: str
    metrics_port: int
    lines: list[str]


def _free_port_block(n: int) -> int:
    """A base port with n free ports after it (checked by binding each)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        try:
            socks = []
            for i in range(n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", base + i))
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
        return base
    raise AssertionError("no free port block")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    port = _free_port_block(5)
    logs = tmp_path_factory.mktemp("up-logs")
    proc = subprocess.Popen(
        kvstore_cmd("up", "--ssd-mib", "8", "--metrics-port", str(port), "--log-dir", str(logs)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env(),
    )  # fmt: skip
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        # Blocking reads (the announcement comes as one burst of lines, which a select()
        # per line would miss once Python buffered them): bounded by kvstore up's own
        # per-process ready deadlines, after which it exits and readline returns "".
        while not (lines and lines[-1].startswith("kvstore up: ready")):
            line = proc.stdout.readline()
            assert line, f"kvstore up exited ({proc.wait(30)}): {proc.stderr.read()[-2000:]}"  # type: ignore[union-attr]
            lines.append(line.strip())
        words = lines[-1].split()
        yield Up(proc, words[words.index("conductor") + 1], words[-1], port, lines)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def test_generate_streams_text_and_stats(up: Up) -> None:
    res = run("generate", "Hello, pool!", "--conductor", up.conductor, "--max-tokens", "12",
              "--json", "--stats", timeout_s=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert len(doc["token_ids"]) == 12 and doc["finish"] == "length"
    assert doc["placement"]["policy"] == "cache_load"
    assert doc["ttft_s"] > 0 and doc["conductor_ttft_s"] > 0
    assert res.stderr.startswith("ttft ") and "12 tokens, length" in res.stderr
    # the same greedy reply through the Python client, text decoded the same way
    with ConductorClient(up.conductor, model="tiny") as c:
        again = c.generate("Hello, pool!", max_tokens=12)
    assert again.token_ids == doc["token_ids"] and again.text == doc["text"]


def test_async_client_and_typed_failures(up: Up) -> None:
    import asyncio

    from kvstore.client.conductor import AsyncConductorClient
    from kvstore.errors import NotFoundError, UnavailableError

    async def body() -> None:
        async with AsyncConductorClient(up.conductor, model="tiny") as c:
            got = await c.generate([256, 72, 105], max_tokens=5)
            assert len(got.token_ids) == 5 and got.finish == "length" and got.ttft_s > 0
            chunks = [ch async for ch in c.stream("streamed", max_tokens=4)]
            assert sum(len(ch.token_ids) for ch in chunks) == 4 and chunks[-1].finish
            with pytest.raises(NotFoundError, match="no-such-model"):
                await c.generate("x", model="no-such-model")
            with pytest.raises(UnavailableError):
                await c.generate("x" * 200, max_tokens=64, deadline_s=0.001)

    asyncio.run(body())
    res = run("generate", "hi", "--conductor", "127.0.0.1:1", "--deadline-s", "2")
    assert res.returncode == 4 and len(res.stderr.strip().splitlines()) == 1
    assert res.stderr.startswith("kvstore generate: UNAVAILABLE")


def test_chat_reuses_the_pool_turn_after_turn(up: Up) -> None:
    turns = "".join(f"turn {i}: tell me about KV caches, at some length please\n" for i in range(3))
    res = subprocess.run(
        kvstore_cmd("chat", "--conductor", up.conductor, "--max-tokens", "8", "--json"),
        input=turns, capture_output=True, text=True, cwd=REPO, env=env(), timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    replies = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(replies) == 3 and all(len(r["token_ids"]) == 8 for r in replies)
    cached = [r["placement"]["cached_blocks"] for r in replies]
    assert cached[2] > cached[0], cached  # later turns' prefixes are in the pool


def test_lookup_finds_a_served_prompt(up: Up) -> None:
    prompt = "A prompt long enough to fill a few sixteen-token blocks of the pool."
    assert run("generate", prompt, "--conductor", up.conductor, "--max-tokens", "2").returncode == 0
    res = run("lookup", "--prompt", prompt, "--conductor", up.conductor, "--master", up.master,
              "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["blocks"] == (len(prompt) + 1) // 16 and doc["pool_blocks"] == doc["blocks"]
    assert doc["matches"][0]["tier"] == "DRAM" and doc["matches"][0]["blocks"] == doc["blocks"]
    miss = run("lookup", "--prompt", "never sent " * 5, "--conductor", up.conductor,
               "--master", up.master, "--json")  # fmt: skip
    assert json.loads(miss.stdout)["pool_blocks"] == 0


def test_status_and_top(up: Up) -> None:
    res = run("status", "--master", up.master)
    assert res.returncode == 0 and "nodes 1 alive" in res.stdout
    top = run("top", "--master", up.master, "--iterations", "2", "--interval-s", "0.2")
    assert top.returncode == 0 and top.stdout.count("health OK") == 2
    assert "lookups/s" in top.stdout


def test_every_service_serves_metrics(up: Up) -> None:
    assert run("generate", "metrics please", "--conductor", up.conductor).returncode == 0
    texts = {}
    for offset, name in enumerate(("master", "prefill", "decode", "conductor", "store")):
        url = f"http://127.0.0.1:{up.metrics_port + offset}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            texts[name] = resp.read().decode()
        if name != "store":  # the storage node serves no gRPC
            assert "kvstore_rpc_seconds_count" in texts[name], name
    assert "kvstore_tier_capacity_bytes" in texts["master"]
    assert 'kvstore_ttft_seconds_count{component="conductor"}' in texts["conductor"]
    assert "kvstore_tbt_seconds_bucket" in texts["decode"]
    # queue depths, idle after the request: every gauge present and 0
    for name, queues in (("master", ("master_moves_pending", "master_moves_inflight")),
                         ("prefill", ("prefill_waiting", "prefill_running")),
                         ("decode", ("decode_batch", "decode_waiting")),
                         ("conductor", ("prefill", "decode"))):  # fmt: skip
        for queue in queues:
            assert f'kvstore_queue_depth{{queue="{queue}"}} 0.0' in texts[name], (name, queue)
    assert 'kvstore_node_segment_bytes{node="store-' in texts["store"]
    assert 'tier="DRAM"' in texts["store"] and 'tier="SSD"' in texts["store"]
    assert "kvstore_node_moves_total{" in texts["store"]


def test_ctrl_c_stops_everything_cleanly(up: Up) -> None:
    children = subprocess.run(
        ["pgrep", "-P", str(up.proc.pid)], capture_output=True, text=True
    ).stdout.split()
    assert len(children) == 5  # master, store, prefill, decode, conductor
    up.proc.send_signal(signal.SIGINT)
    out, _ = up.proc.communicate(timeout=60)
    assert up.proc.returncode == 0
    assert out.splitlines()[-1] == "kvstore up: stopped cleanly"
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), pid
    assert not shm_entries(f"store-{up.proc.pid}")


def _zombie(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_up_rejects_a_bad_config(tmp_path: Path) -> None:
    cfg = tmp_path / "kvstore.toml"
    cfg.write_text("[up]\ndram_mib = 'lots'\n")
    res = run("up", "--config", str(cfg))
    assert res.returncode == 2 and os.fspath(cfg) in res.stderr
    assert res.stderr.strip().endswith("up.dram_mib: 'lots' is not a float")
