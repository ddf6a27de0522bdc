"""Shared pieces of the security tests: a throw-away PKI, a master served in-process on a
background event loop (so tests can call check_integrity between RPCs), secured child
processes, and stubs that present a given credential (or none).

    pki = make_pki(tmp_path)                  # CA + certificates for every test identity
    with InProcessMaster(pki.server("master")) as m:   # or security=None: insecure
        stub = m.stub(pki.creds("alice-1"))   # a MasterStub presenting alice's certificate
        m.on_loop(m.handle.state.check_integrity)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from kvstore.edge import GRPC_OPTIONS
from kvstore.master.config import MasterConfig
from kvstore.security import certs, tokens
from kvstore.security.config import SecurityConfig, to_env
from kvstore.security.credentials import channel_credentials
from kvstore.security.identity import Identity
from kvstore.v1 import master_pb2_grpc
from tests.cluster import START_TIMEOUT_S, _read_line, child_env, stop_process

IDENTITIES = {
    "master": Identity("admin", "master"),
    "ops": Identity("admin", "ops"),
    "n1": Identity("node", "n1"),
    "n2": Identity("node", "n2"),
    "alice-1": Identity("client", "alice-1", "alice"),
    "alice-2": Identity("client", "alice-2", "alice"),
    "bob-1": Identity("client", "bob-1", "bob"),
    "plain-1": Identity("client", "plain-1"),  # no tenant: the "default" tenant
}


@dataclass
class Pki:
    """A CA directory with a certificate per IDENTITIES entry, a second CA (for wrong-CA
    probes), an expired certificate, and a token secret with its tokens."""

    dir: Path
    other: Path = field(init=False)
    secret_file: Path = field(init=False)

    def __post_init__(self) -> None:
        certs.init_ca(self.dir)
        for name, ident in IDENTITIES.items():
            certs.issue(self.dir, ident, name=name)
        certs.issue(self.dir, IDENTITIES["alice-1"], name="expired", days=1, valid_from_days=-3)
        certs.issue(self.dir, IDENTITIES["alice-1"], name="revoked")
        self.other = self.dir / "other-ca"
        certs.init_ca(self.other)
        certs.issue(self.other, IDENTITIES["alice-1"], name="alice-1")
        self.secret_file = self.dir / "token.secret"
        self.secret_file.write_bytes(tokens.new_secret())
        (self.dir / "revoked.list").write_text(
            certs.fingerprint((self.dir / "revoked.crt").read_bytes()) + "\n"
        )

    def tls(self, name: str, ca_dir: Path | None = None) -> SecurityConfig:
        d = ca_dir or self.dir
        return SecurityConfig(
            ca_file=str(self.dir / "ca.crt"), cert_file=str(d / f"{name}.crt"),
            key_file=str(d / f"{name}.key"),
        )  # fmt: skip

    def server(self, name: str = "master") -> SecurityConfig:
        """A server's TLS settings (with the revocation list)."""
        cfg = self.tls(name)
        return SecurityConfig(
            ca_file=cfg.ca_file, cert_file=cfg.cert_file, key_file=cfg.key_file,
            revoked_file=str(self.dir / "revoked.list"),
        )  # fmt: skip

    def token(self, name: str, ttl_s: float = 3600.0, now: float | None = None) -> str:
        return tokens.issue(self.secret_file.read_bytes().strip(), IDENTITIES[name], ttl_s, now)

    def token_file(self, name: str) -> Path:
        path = self.dir / f"{name}.token"
        if not path.exists():
            path.write_text(self.token(name))
        return path

    def token_server(self) -> SecurityConfig:
        return SecurityConfig(mode="token", secret_file=str(self.secret_file))

    def token_client(self, name: str) -> SecurityConfig:
        return SecurityConfig(mode="token", token_file=str(self.token_file(name)))


def make_pki(directory: Path) -> Pki:
    return Pki(directory)


def channel(address: str, sec: SecurityConfig | None) -> grpc.Channel:
    """A sync channel presenting `sec`'s credential (None: plaintext, no credential)."""
    creds = channel_credentials(sec) if sec is not None else None
    if creds is None:
        return grpc.insecure_channel(address, options=GRPC_OPTIONS)
    return grpc.secure_channel(address, creds, options=GRPC_OPTIONS)


def code_of(call: Callable[[], Any]) -> grpc.StatusCode:
    """The status code a call ends with (OK when it succeeds)."""
    try:
        call()
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@contextlib.contextmanager
def process_env(sec: SecurityConfig | None) -> Iterator[None]:
    """KVSTORE_SECURITY_* of `sec` in os.environ for the duration (servers read it)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("KVSTORE_SECURITY_")}
    for k in saved:
        del os.environ[k]
    os.environ.update(to_env(sec) if sec is not None else {})
    try:
        yield
    finally:
        for k in [k for k in os.environ if k.startswith("KVSTORE_SECURITY_")]:
            del os.environ[k]
        os.environ.update(saved)


class InProcessMaster:
    """A master served by `kvstore.master.server.serve` on a background event loop."""

    def __init__(self, security: SecurityConfig | None = None, **config: Any) -> None:
        self.security = security
        self.config = MasterConfig(listen="127.0.0.1:0", tick_interval_s=0.05, **config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.handle: Any = None
        self.channels: list[grpc.Channel] = []

    def __enter__(self) -> InProcessMaster:
        from kvstore.master.server import serve

        self.thread.start()
        with process_env(self.security):
            self.handle = self.run(serve(self.config))
        return self

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def on_loop(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the master's loop (its state is not thread-safe)."""

        async def call() -> Any:
            return fn()

        return self.run(call())

    def check(self) -> None:
        """Every invariant of the master: its metadata and the guard's ledger."""

        def both() -> None:
            self.handle.state.check_integrity()
            self.guard.check_integrity()

        self.on_loop(both)

    @property
    def guard(self) -> Any:
        from kvstore.security.guard import MasterGuard

        return MasterGuard.of(self.handle.state)

    @property
    def address(self) -> str:
        return str(self.handle.address)

    def stub(self, sec: SecurityConfig | None) -> master_pb2_grpc.MasterStub:
        ch = channel(self.address, sec)
        self.channels.append(ch)
        return master_pb2_grpc.MasterStub(ch)

    def __exit__(self, *exc: object) -> None:
        for ch in self.channels:
            ch.close()
        if self.handle is not None:
            self.run(self.handle.stop(0.1))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@dataclass
class SecureProcess:
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> int:
        return stop_process(self.proc)


def start_master(
    workdir: Path, sec: SecurityConfig | None, *flags: str
) -> tuple[str, SecureProcess]:
    """`python -m kvstore.master` with `sec` in its environment; (address, process)."""
    env = {k: v for k, v in child_env().items() if not k.startswith("KVSTORE_SECURITY_")}
    env.update(to_env(sec) if sec is not None else {})
    args = [sys.executable, "-m", "kvstore.master", "--listen", "127.0.0.1:0",
            "--set", "tick_interval_s=0.05", "--set", "heartbeat_interval_s=0.2", "--node-ttl-s",
            "2", *flags]  # fmt: skip
    log = workdir / "master.log"
    with open(log, "ab") as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, env=env)
    line = _read_line(proc, b"kvstore master listening on ", START_TIMEOUT_S)
    return line.split()[4].decode(), SecureProcess(proc, log)


def start_node(
    workdir: Path, master: str, sec: SecurityConfig | None, node_id: str = "", dram_mib: float = 4
) -> SecureProcess:
    """A storage-node process with `sec` in its environment (node_id "": its credential's)."""
    env = {k: v for k, v in child_env().items() if not k.startswith("KVSTORE_SECURITY_")}
    env.update(to_env(sec) if sec is not None else {})
    args = [sys.executable, "-m", "kvstore.node", "--master", master, "--dram-mib", str(dram_mib),
            "--heartbeat-s", "0.2"]  # fmt: skip
    args += ["--node-id", node_id] if node_id else []
    log = workdir / f"node-{node_id or 'cred'}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=out, env=env)
    return SecureProcess(proc, log)
