"""`kvstore up`: master + storage node + prefill node + decode node + conductor on this
host from one command (and one config file, section [up]), the same cluster the demo
uses, left running for the user with its addresses printed; Ctrl-C (or SIGTERM) stops
every process cleanly, newest first, and removes the SSD directory it made.

    kvstore up [--config kvstore.toml] [--model tiny] [--dram-mib 64] [--ssd-mib 256]
               [--conductor-listen 127.0.0.1:7000] [--metrics-port 9100]

`--metrics-port P` serves /metrics of the master on P, the prefill node on P+1, the
decode node on P+2, the conductor on P+3 and the storage node on P+4 (127.0.0.1).

The last line printed is "kvstore up: ready; conductor HOST:PORT master HOST:PORT":
scripts wait for it. Each process's stderr goes to a log file in the printed log dir.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from cli.common import base_parent
from cli.errors import guarded
from kvstore.edge import METRICS_ENV
from kvstore.errors import BadRequestError


@dataclass(frozen=True, slots=True)
class UpConfig:
    """The local cluster `kvstore up` starts."""

    model: str = "tiny"
    dram_mib: float = 64.0
    ssd_mib: float = 0.0  # 0: no SSD segment
    ssd_dir: str = ""  # "": a temporary directory, removed at exit
    conductor_listen: str = "127.0.0.1:0"
    policy: str = "cache_load"
    metrics_port: int = 0  # master P, prefill P+1, decode P+2, conductor P+3, store P+4; 0 = off
    log_dir: str = ""  # "": a temporary directory, kept and printed

    def __post_init__(self) -> None:
        if self.dram_mib <= 0 or self.ssd_mib < 0:
            raise BadRequestError("up.dram_mib must be > 0 and up.ssd_mib >= 0")
        if not 0 <= self.metrics_port <= 65531:
            raise BadRequestError(f"up.metrics_port must be in 0..65531, got {self.metrics_port}")
        if self.model not in ("tiny", "small"):
            raise BadRequestError(f"up.model must be tiny or small, got {self.model!r}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="run a whole local cluster until Ctrl-C", parents=[base_parent()])
    p.add_argument("--model", default=None)
    p.add_argument("--dram-mib", type=float, default=None)
    p.add_argument("--ssd-mib", type=float, default=None)
    p.add_argument("--ssd-dir", default=None)
    p.add_argument("--conductor-listen", default=None)
    p.add_argument("--policy", default=None)
    p.add_argument("--metrics-port", type=int, default=None, help="first /metrics port")
    p.add_argument("--log-dir", default=None)
    p.set_defaults(handler=guarded("kvstore up", run))


def _flags(args: argparse.Namespace) -> dict[str, object]:
    names = ("model", "dram_mib", "ssd_mib", "ssd_dir", "conductor_listen", "policy",
             "metrics_port", "log_dir")  # fmt: skip
    return {n: getattr(args, n) for n in names}


def run(args: argparse.Namespace) -> int:
    from kvstore.config import apply_security, load

    layers = load(args.config)
    config = layers.section("up", _flags(args)).build()
    apply_security(layers)  # every process of the cluster inherits [security]
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve(config, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def serve(config: UpConfig, stop: threading.Event) -> None:
    """Start the cluster, print its addresses, wait for `stop`, stop it."""
    from kvstore.serving_bench.launch import Launcher

    log_dir = config.log_dir or tempfile.mkdtemp(prefix="kvstore-up-logs-")
    ssd = tempfile.TemporaryDirectory(prefix="kvstore-up-ssd-") if not config.ssd_dir else None
    ssd_dir = config.ssd_dir or (ssd.name if ssd is not None else "")
    started = time.perf_counter()
    env_before = os.environ.get(METRICS_ENV)
    try:
        with Launcher(log_dir=log_dir) as procs:
            addresses = _start(procs, config, ssd_dir)
            _announce(config, *addresses, log_dir, started)
            stop.wait()
            print("kvstore up: stopping", flush=True)
            trouble = procs.close()
    finally:
        if ssd is not None:
            ssd.cleanup()
        _restore_env(METRICS_ENV, env_before)
    print(f"kvstore up: stopped{'; trouble: ' + ', '.join(trouble) if trouble else ' cleanly'}")


def _metrics_at(config: UpConfig, offset: int) -> None:
    """The /metrics address of the next process started (children read it at start)."""
    if config.metrics_port:
        os.environ[METRICS_ENV] = f"127.0.0.1:{config.metrics_port + offset}"


def _start(procs: Any, config: UpConfig, ssd_dir: str) -> tuple[str, str, str, str]:
    from kvstore.serving_bench.launch import serving_argv, storage_argv

    _metrics_at(config, 0)
    master = procs.master()
    store = storage_argv(master, config.dram_mib, f"store-{os.getpid()}")
    if config.ssd_mib:
        store += ["--ssd-dir", ssd_dir, "--ssd-mib", str(config.ssd_mib)]
    if config.metrics_port:
        store += ["--metrics-listen", f"127.0.0.1:{config.metrics_port + 4}"]
    prefill_argv = serving_argv("prefill_node", model=config.model, master=master)
    decode_argv = serving_argv(
        "decode_node", model=config.model, master=master, extra=["--on-finish", "publish"]
    )
    if config.metrics_port:  # one /metrics port each: start them one after the other
        _metrics_at(config, 1)
        _, prefill = procs.start_many([("store", store), ("prefill", prefill_argv)])
        _metrics_at(config, 2)
        decode = procs.start("decode", decode_argv)
    else:  # in parallel: a random model takes seconds to initialise
        named = [("store", store), ("prefill", prefill_argv), ("decode", decode_argv)]
        _, prefill, decode = procs.start_many(named)
    _metrics_at(config, 3)
    conductor = procs.start(
        "conductor",
        ["-m", "kvstore.conductor", "--listen", config.conductor_listen, "--master", master,
         "--prefill", prefill, "--decode", decode, "--policy", config.policy],
    )  # fmt: skip
    return master, prefill, decode, conductor


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _announce(
    config: UpConfig, master: str, prefill: str, decode: str, conductor: str, log_dir: str,
    started: float,
) -> None:  # fmt: skip
    lines = [
        f"master     {master}",
        f"storage    DRAM {config.dram_mib:g} MiB" + (f" + SSD {config.ssd_mib:g} MiB"
                                                      if config.ssd_mib else ""),
        f"prefill    {prefill}  (model {config.model})",
        f"decode     {decode}",
        f"conductor  {conductor}  (policy {config.policy})",
        f"logs       {log_dir}",
        *(
            [f"metrics    http://127.0.0.1:{config.metrics_port}/metrics (master; +1 prefill, "
             "+2 decode, +3 conductor, +4 storage node)"]
            if config.metrics_port else []
        ),
        f'try:       kvstore generate "Hello" --conductor {conductor} --stats',
        f"           kvstore status --master {master}",
        f"kvstore up: ready in {time.perf_counter() - started:.1f} s; conductor {conductor} "
        f"master {master}",
    ]  # fmt: skip
    print("\n".join(lines), flush=True)
