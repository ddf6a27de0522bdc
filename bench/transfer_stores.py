"""Store-level runners for bench/transfer.py: kvstore clients and Mooncake Store.

`start_pools` starts, on 127.0.0.1, a `kvstore master` + one `kvstore node` lending
DRAM, and when `mooncake` imports, a `mooncake_master` + a Mooncake client process
holding a segment. The bench process is then a pure client of each (it lends no
memory), so every put and get crosses processes. A run moves `total` bytes as one
series of batches of at most CHUNK objects (batch_put_from / batch_get_into from a
registered buffer; Mooncake's TCP transport times out on one batch of 4096
64 KiB objects here, so both stores get the same chunks). Puts use fresh
keys every run (Mooncake's put of an existing key is a silent no-op); the keys of
the previous run are removed, untimed, in `prepare`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from kvstore.transfer.nixl import nixl_available
from kvstore.v1 import master_pb2, master_pb2_grpc

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
START_TIMEOUT_S = 60.0
CHUNK = 256  # objects per batch call


def chunks(n: int) -> list[slice]:
    return [slice(i, min(i + CHUNK, n)) for i in range(0, n, CHUNK)]


@dataclass(frozen=True, slots=True)
class StoreRunner:
    """Same fields as transfer.Runner, plus `prepare` (untimed, before every run)."""

    transport: str
    op: str
    baseline: str
    run: Callable[[], None]
    close: Callable[[], None]
    prepare: Callable[[], None]


@dataclass
class Pools:
    kv_master: str
    mc_master: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    mc_store: Any = None  # one Mooncake client for the whole run

    def close(self) -> None:
        if self.mc_store is not None:
            self.mc_store.close()
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)


def mooncake_available() -> bool:
    try:
        import mooncake.store  # noqa: F401
    except ImportError:
        return False
    return shutil.which("mooncake_master") is not None


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), MC_TCP_BIND_ADDRESS="127.0.0.1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(pools: Pools, cmd: list[str], stdin: bool = False) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE if stdin else None, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=_env(),
    )  # fmt: skip
    pools.procs.append(proc)
    return proc


def _ready_line(proc: subprocess.Popen[bytes], prefix: bytes) -> bytes:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return line
    raise RuntimeError(f"{proc.args!r} exited ({proc.wait()}) before printing {prefix!r}")


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)  # polling another process's listener
    raise RuntimeError(f"mooncake_master is not listening on {port}")


def start_pools(
    kv_bytes: int, mc_bytes: int, with_mooncake: bool, with_nixl: bool | None = None
) -> Pools:
    """kvstore master + node lending `kv_bytes` (and Mooncake master + a `mc_bytes` holder);
    the node serves NIXL too with `with_nixl` (None: when installed). A NIXL agent spins
    a core while alive: rows that do not use it should run against a node without one."""
    kv = [sys.executable, "-m", "cli.main"]
    pools = Pools(kv_master="")
    try:
        master = _spawn(pools, [*kv, "master", "--listen", "127.0.0.1:0"])
        pools.kv_master = _ready_line(master, b"kvstore master").split()[4].decode()
        serve_nixl = nixl_available() if with_nixl is None else with_nixl
        nixl = ["--nixl"] if serve_nixl else []  # for the kv-nixl rows
        node = _spawn(pools, [*kv, "node", "--master", pools.kv_master,
                              "--dram-mib", str(kv_bytes / MiB), *nixl])  # fmt: skip
        _ready_line(node, b"kvstore node ")
        if with_mooncake:
            _start_mooncake(pools, mc_bytes)
    except BaseException:
        pools.close()
        raise
    return pools


def _start_mooncake(pools: Pools, capacity: int) -> None:
    os.environ["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"  # before this process loads Mooncake
    port = _free_port()
    _spawn(pools, [shutil.which("mooncake_master") or "mooncake_master",
                   "-rpc_address=127.0.0.1", f"-rpc_port={port}",
                   "-metrics_host=127.0.0.1", f"-metrics_port={_free_port()}"])  # fmt: skip
    _wait_port(port)
    pools.mc_master = f"127.0.0.1:{port}"
    code = (
        "import sys\nfrom mooncake.store import MooncakeDistributedStore as S\n"
        f"s = S(); rc = s.setup('127.0.0.1', 'P2PHANDSHAKE', {capacity}, {16 * MiB}, "
        f"'tcp', '', {pools.mc_master!r})\nprint('holder', rc, flush=True)\n"
        "sys.stdin.read(); s.close()\n"
    )
    _ready_line(_spawn(pools, [sys.executable, "-c", code], stdin=True), b"holder 0")
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", pools.mc_master)
    if rc != 0:
        raise RuntimeError(f"Mooncake client setup failed: {rc}")
    pools.mc_store = store


# -- kvstore ---------------------------------------------------------------------


def _remove(master: str, keys: list[str]) -> None:
    with grpc.insecure_channel(master) as ch:
        reply = master_pb2_grpc.MasterStub(ch).Remove(
            master_pb2.RemoveRequest(keys=keys, force=True), timeout=30
        )
    assert all(s.code == 0 for s in reply.results), "remove failed"


def _check_puts(errors: list[Any]) -> None:
    bad = [e for e in errors if e is not None]
    if bad:
        raise RuntimeError(f"{len(bad)} puts failed, first: {bad[0]!r}")


def kvstore_runners(pools: Pools, total: int, size: int, transport: str) -> list[StoreRunner]:
    """A put and a get runner through one `kvstore.Client` on `transport`."""
    from kvstore.client.client import Client

    client = Client(pools.kv_master, transport=transport, timeout_s=60.0)
    local = np.ones(total, dtype=np.uint8)
    client.register_buffer(local)
    views = [memoryview(local)[i : i + size] for i in range(0, total, size)]
    name = f"kv-{transport}"
    get_keys = [f"{name}-get-{size}-{i}" for i in range(len(views))]
    parts = chunks(len(views))
    put_keys: list[str] = []
    runs = itertools.count()

    def put_all(keys: list[str]) -> None:
        for part in parts:
            _check_puts(client.batch_put_from(keys[part], views[part]))

    put_all(get_keys)

    def prepare_put() -> None:
        if put_keys:
            _remove(pools.kv_master, put_keys)
        run = next(runs)
        put_keys[:] = [f"{name}-put-{size}-{run}-{i}" for i in range(len(views))]

    def get() -> None:
        for part in parts:
            got = client.batch_get_into(get_keys[part], views[part])
            if any(n != size for n in got):
                raise RuntimeError(f"failed get: {next(n for n in got if n != size)!r}")

    def close() -> None:
        _remove(pools.kv_master, get_keys + put_keys)
        client.close()

    baseline = "raw socket" if transport == "tcp" else "memcpy"
    put = StoreRunner(name, "put", baseline, lambda: put_all(put_keys), lambda: None, prepare_put)
    return [put, StoreRunner(name, "get", baseline, get, close, lambda: None)]


# -- Mooncake ----------------------------------------------------------------------


def mooncake_runners(pools: Pools, total: int, size: int) -> list[StoreRunner]:
    """A put and a get runner through Mooncake's own client (protocol tcp)."""
    store = pools.mc_store
    local = np.ones(total, dtype=np.uint8)
    base = int(local.ctypes.data)
    if store.register_buffer(base, total) != 0:
        raise RuntimeError("Mooncake register_buffer failed")
    ptrs = list(range(base, base + total, size))
    sizes = [size] * len(ptrs)
    get_keys = [f"mc-get-{size}-{i}" for i in range(len(ptrs))]
    parts = chunks(len(ptrs))
    put_keys: list[str] = []
    runs = itertools.count()

    def put_all(keys: list[str]) -> None:
        for part in parts:
            codes = store.batch_put_from(keys[part], ptrs[part], sizes[part])
            if any(codes):
                raise RuntimeError(f"Mooncake put failed: {next(c for c in codes if c)}")

    put_all(get_keys)

    def prepare_put() -> None:
        if put_keys:
            store.batch_remove(put_keys, True)
        run = next(runs)
        put_keys[:] = [f"mc-put-{size}-{run}-{i}" for i in range(len(ptrs))]

    def get() -> None:
        for part in parts:
            got = store.batch_get_into(get_keys[part], ptrs[part], sizes[part])
            if any(n != size for n in got):
                raise RuntimeError(f"Mooncake get failed: {next(n for n in got if n != size)}")

    def close() -> None:
        store.batch_remove(get_keys + put_keys, True)
        store.unregister_buffer(base)
        local.fill(0)  # keep `local` alive until unregistered

    return [
        StoreRunner(
            "mooncake", "put", "raw socket", lambda: put_all(put_keys), lambda: None, prepare_put
        ),
        StoreRunner("mooncake", "get", "raw socket", get, close, lambda: None),
    ]
