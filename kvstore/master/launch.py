"""Command-line arguments of a master process, shared by `python -m kvstore.master` and
`kvstore master`:

    python -m kvstore.master --listen 127.0.0.1:0 [--db PATH] [--lease-ttl-s 5] \
        [--set tick_interval_s=0.05 --set max_batch=1000 ...]
    python -m kvstore.master --listen 10.0.0.1:50051 --etcd 10.0.0.9:2379 --cluster-id pool-a
        # HA: run several; one leads (kvstore.master.ha), the others follow

`--set NAME=VALUE` reaches every numeric MasterConfig field the named flags do not.
The process prints one ready line, "kvstore master listening on HOST:PORT epoch E"
(HA: "... role follower cluster C etcd E", then "kvstore master HOST:PORT is now leader
epoch N" / "... is now follower epoch 0" as its role changes). A failure to start is one
line on stderr, "kvstore master: TypeName: message", exit code 4 (etcd unreachable), 5
(refused: another cluster's etcd prefix) or 2 (bad flags).
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import fields
from typing import Any

from kvstore.errors import BadRequestError, ExistsError, KVStoreError, UnavailableError
from kvstore.master.config import MasterConfig
from kvstore.master.coord import HAConfig
from kvstore.transfer.base import parse_endpoint

# flag -> MasterConfig field, for the knobs an operator sets most.
_NAMED = {
    "lease_ttl_s": "default_lease_ttl_s",
    "node_ttl_s": "node_ttl_s",
    "heartbeat_s": "heartbeat_interval_s",
    "put_timeout_s": "put_timeout_s",
    "high_watermark": "high_watermark",
    "low_watermark": "low_watermark",
}
_DEFAULTS = MasterConfig()


# Numeric fields settable with --set (listen and db_path have their own flags).
def flag(value: str) -> bool:
    """A boolean --set value (bool("false") would be True)."""
    low = value.strip().lower()
    if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
        raise ValueError(value)
    return low in ("1", "true", "yes", "on")


SETTABLE = {
    f.name: flag
    if isinstance(getattr(_DEFAULTS, f.name), bool)
    else type(getattr(_DEFAULTS, f.name))
    for f in fields(MasterConfig)
    if isinstance(getattr(_DEFAULTS, f.name), int | float)
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The master's flags on `p` (defaults are MasterConfig's)."""
    p.add_argument("--listen", default="127.0.0.1:50051", help="HOST:PORT (port 0 = any)")
    p.add_argument("--db", default=None, help="RocksDB journal directory (restart keeps objects)")
    d = _DEFAULTS
    p.add_argument("--lease-ttl-s", type=float, default=d.default_lease_ttl_s, help="read lease")
    p.add_argument("--node-ttl-s", type=float, default=d.node_ttl_s, help="silent nodes die after")
    p.add_argument("--heartbeat-s", type=float, default=d.heartbeat_interval_s, help="node beat")
    p.add_argument("--put-timeout-s", type=float, default=d.put_timeout_s, help="puts expire")
    p.add_argument("--high-watermark", type=float, default=d.high_watermark, help="evict above")
    p.add_argument("--low-watermark", type=float, default=d.low_watermark, help="evict down to")
    p.add_argument("--log-level", default="WARNING", help="logging level of the process")
    h = p.add_argument_group("HA (several masters on etcd; needs the extra kvstore[ha])")
    h.add_argument("--etcd", default=None, help="etcd endpoints HOST:PORT[,HOST:PORT...]")
    h.add_argument("--cluster-id", default=None, help="this pool's id (guards the etcd prefix)")
    h.add_argument("--etcd-prefix", default="/kvstore", help="etcd key prefix of this pool")
    h.add_argument("--ha-lease-s", type=int, default=2, help="leader lease (failover time)")
    h.add_argument("--etcd-wait-s", type=float, default=30.0, help="retry etcd this long")
    h.add_argument("--advertise", default="", help="address clients reach (default: bound)")
    p.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE",
        help=f"any other MasterConfig field: {', '.join(sorted(SETTABLE))}",
    )  # fmt: skip


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """MasterConfig fields from parsed flags (--set wins over a named flag)."""
    out: dict[str, Any] = {field: getattr(args, flag) for flag, field in _NAMED.items()}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or name not in SETTABLE:
            raise SystemExit(f"bad --set {item!r}: want NAME=VALUE, NAME one of {sorted(SETTABLE)}")
        try:
            out[name] = SETTABLE[name](value)
        except ValueError:
            raise SystemExit(
                f"bad --set {item!r}: {value!r} is not a {SETTABLE[name].__name__}"
            ) from None
    return out


def ha_config(args: argparse.Namespace) -> HAConfig | None:
    """The HA settings of `args` (None without --etcd: a single master)."""
    if not getattr(args, "etcd", None):
        return None
    endpoints = tuple(e.strip() for e in args.etcd.split(",") if e.strip())
    for endpoint in endpoints:
        parse_endpoint(endpoint)
    return HAConfig(
        etcd=endpoints, cluster_id=args.cluster_id or "", prefix=args.etcd_prefix,
        lease_ttl_s=args.ha_lease_s, connect_timeout_s=args.etcd_wait_s,
        advertise=args.advertise,
    )  # fmt: skip


_EXIT = ((BadRequestError, 2), (ExistsError, 5), (UnavailableError, 4))


def run_from_args(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM with the configuration `args` describe; a failure to
    start is one line on stderr and an exit code (see the module doc)."""
    from kvstore.master.server import run_master

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        run_master(args.listen, args.db, ha=ha_config(args), **overrides(args))
    except KVStoreError as exc:
        print(f"kvstore master: {type(exc).__name__}: {' '.join(str(exc).split())}",
              file=sys.stderr, flush=True)  # fmt: skip
        return next((code for cls, code in _EXIT if isinstance(exc, cls)), 1)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstore.master", description=__doc__)
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))
