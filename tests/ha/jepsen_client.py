"""One Jepsen client process: random put/get/remove on a few keys of an HA pool, every
op recorded (tests/ha/history.py) with its monotonic invoke and completion times.

    python -m tests.ha.jepsen_client --master A,B,C --process 2 --seconds 20 --keys 6 \
        --seed 9 --out h2.jsonl [--pause-s 0.1] [--timeout-s 2] [--failover-s 8]

It prints "jepsen client ready" once connected, then runs ops back to back until
`--seconds` have passed (or stdin closes) and exits 0. Outcomes: put ok, get ok (its
value, or None for NotFoundError), remove ok (True/False); an error of a read is a
`fail` (a read changes nothing); an error of a put or a remove is `info`: a timeout or a
lost reply may hide an op that took effect (a put retried after its commit answers
ExistsError, for one), so the checker lets it have happened or not.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

READY = b"jepsen client ready"
WEIGHTS = (("put", 4), ("get", 4), ("remove", 3))


def run(args: argparse.Namespace) -> int:
    from kvstore.client import Client
    from kvstore.client.config import ClientConfig
    from kvstore.errors import KVStoreError, NotFoundError
    from tests.ha.history import Recorder

    rng = random.Random(args.seed)
    masters = tuple(args.master.split(","))
    cfg = ClientConfig(master=masters[0], masters=masters, timeout_s=args.timeout_s,
                       failover_timeout_s=args.failover_s, lease_ttl_s=args.lease_s)  # fmt: skip
    rec = Recorder(args.process, Path(args.out))
    fs = [f for f, w in WEIGHTS for _ in range(w)]
    with Client(cfg) as c:
        c.stats()
        print(READY.decode(), flush=True)
        deadline, n = time.monotonic() + args.seconds, 0
        while time.monotonic() < deadline:
            f, key = rng.choice(fs), f"{args.prefix}{rng.randrange(args.keys)}"
            value = f"{args.process}:{n}" if f == "put" else None
            n += 1
            t = rec.invoke(f, key, value)
            try:
                if f == "put":
                    c.put(key, value.encode() * 8)  # type: ignore[union-attr]
                    rec.complete(t, "ok")
                elif f == "get":
                    try:
                        got = c.get(key)
                    except NotFoundError:
                        rec.complete(t, "ok", None)
                    else:
                        rec.complete(t, "ok", got[: len(got) // 8].decode())
                else:
                    rec.complete(t, "ok", c.remove(key))
            except KVStoreError as exc:
                outcome = "fail" if f == "get" else "info"
                rec.complete(t, outcome, None, f"{type(exc).__name__}: {exc}"[:300])
            time.sleep(rng.uniform(0, 2 * args.pause_s))  # a think time, so keys see each op
    rec.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.ha.jepsen_client", description=__doc__)
    p.add_argument("--master", required=True)
    p.add_argument("--process", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--keys", type=int, default=6)
    p.add_argument("--prefix", default="j")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--pause-s", type=float, default=0.1, help="mean pause between ops")
    p.add_argument("--timeout-s", type=float, default=2.0)
    p.add_argument(
        "--lease-s", type=float, default=0.3, help="read lease (a held key refuses removes)"
    )
    p.add_argument("--failover-s", type=float, default=8.0)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
