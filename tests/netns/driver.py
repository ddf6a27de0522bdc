"""A kvstore client in its own process (inside an emulated host), driven by JSON lines.

    python -m tests.netns.driver --master 10.213.7.1:50051 --timeout-s 2

It prints "driver ready", then answers each request line on stdin with one reply line:

    {"op": "put", "key": K, "path": P, "replicas": R}  store the bytes of file P
    {"op": "get", "key": K, "out": P}                  write the value to file P
    {"op": "stats"}                                     the master's Stats (a dict)
    {"op": "holders"}                                   {key: [node ids]} of every object

Replies are {"ok": true, ...} or {"ok": false, "error": "<class name>", "message": ...},
each with "elapsed_s" and "transfers": the requests this process submitted so far to
each engine kind ("shm", "tcp", "nixl"), counted by a spy on the engines' `submit` (it only
counts; the engines behave as always). `DriverClient` is the test side of the protocol.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the child process imports nothing of the test side
    from tests.netns.hosts import LineReader

READY_LINE = b"driver ready"
TRANSFERS: Counter[str] = Counter()


# -- child side ------------------------------------------------------------------


def spy_engines() -> None:
    """Count the requests submitted to the shm, tcp and nixl engines, and the segments
    mapped for same-host reads (behaviour unchanged)."""
    from kvstore.transfer.nixl import NixlEngine
    from kvstore.transfer.shm import ShmEngine
    from kvstore.transfer.tcp import TcpEngine

    for cls, kind in ((ShmEngine, "shm"), (TcpEngine, "tcp"), (NixlEngine, "nixl")):
        original = cls.submit

        def counted(
            self: Any, batch: Sequence[Any], *args: Any, _o: Any = original, _k: str = kind
        ) -> Any:
            TRANSFERS[_k] += len(batch)
            return _o(self, batch, *args)

        cls.submit = counted  # type: ignore[method-assign]

    # A verified same-host read copies out of the mapped segment itself (one pass that
    # copies and checksums): count each such read as an shm transfer too.
    mapped = ShmEngine.mapped

    def counted_map(self: Any, desc: Any, *args: Any, **kw: Any) -> Any:
        TRANSFERS["shm"] += 1
        return mapped(self, desc, *args, **kw)  # (desc, capability) since capabilities

    ShmEngine.mapped = counted_map  # type: ignore[method-assign]


def holders(client: Any) -> dict[str, list[str]]:
    """Every object's replica node ids, in the master's order (all ListObjects pages)."""
    from kvstore.client.steps import Rpc
    from kvstore.v1 import master_pb2

    out: dict[str, list[str]] = {}
    token = ""
    for _ in range(1000):  # bounded: 100 objects a page
        page = client.call_rpc(Rpc("ListObjects", master_pb2.ListObjectsRequest(page_token=token)))
        out.update({o.key: [r.node_id for r in o.replicas] for o in page.objects})
        token = page.next_page_token
        if not token:
            break
    return out


def handle(client: Any, req: dict[str, Any]) -> dict[str, Any]:
    """Run one request; its reply fields (exceptions propagate to `serve`)."""
    op = req["op"]
    if op == "put":
        client.put(req["key"], Path(req["path"]).read_bytes(), replicas=req["replicas"])
        return {}
    if op == "get":
        value = client.get(req["key"])
        Path(req["out"]).write_bytes(value)
        return {"size": len(value)}
    if op == "stats":
        return {"stats": client.stats()}
    if op == "holders":
        return {"holders": holders(client)}
    raise ValueError(f"unknown op {op!r}")


def serve(master: str, timeout_s: float) -> None:
    """Answer request lines until stdin closes."""
    from kvstore import Client

    spy_engines()
    with Client(master, timeout_s=timeout_s) as client:
        print(READY_LINE.decode(), flush=True)
        for line in sys.stdin:
            start = time.monotonic()
            try:
                reply: dict[str, Any] = {"ok": True, **handle(client, json.loads(line))}
            except Exception as exc:  # reported to the test, which asserts the type
                reply = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
            reply["elapsed_s"] = time.monotonic() - start
            reply["transfers"] = dict(TRANSFERS)
            print(json.dumps(reply), flush=True)
            client.check_integrity()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.netns.driver", description=__doc__)
    p.add_argument("--master", required=True)
    p.add_argument("--timeout-s", type=float, default=2.0)
    args = p.parse_args(argv)
    serve(args.master, args.timeout_s)
    return 0


# -- test side -------------------------------------------------------------------


class DriverClient:
    """Sends requests to a driver process and reads its replies, each within a deadline."""

    def __init__(self, proc: subprocess.Popen[bytes], reader: LineReader) -> None:
        self.proc = proc
        self.reader = reader

    def call(self, timeout_s: float = 20.0, **request: Any) -> dict[str, Any]:
        """One request; TimeoutError if no reply within `timeout_s` (a hang is a failure)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        return dict(json.loads(self.reader.readline(timeout_s)))

    def ok(self, **request: Any) -> dict[str, Any]:
        """`call` that must succeed."""
        reply = self.call(**request)
        assert reply["ok"], reply
        return reply

    def transfers(self) -> Counter[str]:
        """Requests submitted per engine kind so far (asked with a cheap stats call)."""
        return Counter(self.ok(op="stats")["transfers"])


if __name__ == "__main__":
    raise SystemExit(main())
