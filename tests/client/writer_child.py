"""A writer process of the fault tests.

    python -m tests.client.writer_child MODE ADDR KEY SIZE SEED

MODE "hang": write every replica, print "WRITTEN", then block before PutEnd until
             killed (a writer dying mid-put).
MODE "hang-extent": the same for a put into the client's extent lease (its bytes
             written, CommitExtent never sent).
MODE "race": print "READY", wait for a line on stdin, put, print "OK" or "EXISTS".
The value is `SIZE` bytes of `bytes([SEED])`: a torn object would mix seeds.
"""

from __future__ import annotations

import sys
from typing import Any

from kvstore.client import Client
from kvstore.client.steps import Rpc
from kvstore.client.writes import PutOptions
from kvstore.errors import ExistsError


def main(argv: list[str]) -> int:
    mode, address, key, size, seed = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    value = bytes([seed]) * size
    timeout_s = float(argv[5]) if len(argv) > 5 else 5.0
    client = Client(address, transport="tcp", timeout_s=timeout_s)
    if mode in ("hang", "hang-extent"):
        commit = "PutEnd" if mode == "hang" else "CommitExtent"

        def call(step: Rpc) -> Any:
            if step.method == commit:
                print("WRITTEN", flush=True)
                sys.stdin.read()  # blocks until the parent kills us
            return client.call_rpc(step)

        client.run(
            client.ops.put(key, value, PutOptions(replicas=2 if mode == "hang" else 1)), call
        )
        return 1
    print("READY", flush=True)
    sys.stdin.readline()
    try:
        client.put(key, value)
    except ExistsError:
        print("EXISTS", flush=True)
        return 0
    print("OK", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
