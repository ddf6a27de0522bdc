"""`kvstore master`, `kvstore node` and `kvstore tiers`: run a pool by hand, inspect it.

    kvstore master --listen 127.0.0.1:50051 [--db PATH] [--config kvstore.toml] \
        [--metrics-listen 127.0.0.1:9100]
    kvstore node --master 127.0.0.1:50051 --listen 127.0.0.1:0 --dram-mib 256 \
        [--ssd-dir DIR --ssd-mib 1024] [--config kvstore.toml] [--metrics-listen 127.0.0.1:9101]
    kvstore tiers --master 127.0.0.1:50051 [--json]

Settings come from the TOML file's [master] / [node] section, then KVSTORE_MASTER_* /
KVSTORE_NODE_* variables, then the flags given (kvstore.config). Each service prints
one ready line (its address) and runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Any

from cli.common import admin_parent, base_parent, cli_settings, master_api
from cli.errors import guarded
from kvstore.edge import split_address
from kvstore.errors import BadRequestError

MIB = 1 << 20
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def register(sub: argparse._SubParsersAction) -> None:
    _register_master(sub)
    _register_node(sub)
    _register_tiers(sub)


def _register_master(sub: argparse._SubParsersAction) -> None:
    from kvstore.master.launch import _NAMED, add_arguments

    p = sub.add_parser("master", help="run the metadata master (gRPC)", parents=[base_parent()])
    add_arguments(p)
    p.add_argument("--metrics-listen", default=None, help="HOST:PORT of /metrics (none: off)")
    # Unset flags must not hide the config file: None = "not given on the command line".
    p.set_defaults(listen=None, db=None, **dict.fromkeys(_NAMED, None))
    p.set_defaults(log_level="INFO")  # the event lines (node registered, objects dropped)
    p.set_defaults(handler=guarded("kvstore master", run_master_cmd))


def _register_node(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "node", help="run a storage node lending DRAM (and SSD) to the pool",
        parents=[base_parent()],
    )  # fmt: skip
    p.add_argument("--master", default=None, help="HOST:PORT of the master")
    p.add_argument("--listen", default=None, help="HOST:PORT of its data plane (127.0.0.1:0)")
    p.add_argument("--node-id", default=None, help="default: <hostname>-<pid>")
    p.add_argument("--dram-mib", type=float, default=None, help="DRAM segment size (64)")
    p.add_argument("--ssd-dir", default=None, help="directory of the SSD segment file")
    p.add_argument("--ssd-mib", type=float, default=None, help="SSD segment size (0 = none)")
    p.add_argument(
        "--nixl", action="store_true", default=None,
        help="serve DRAM by NIXL too (RDMA-capable; a busy core)",
    )  # fmt: skip
    p.add_argument("--hbm-mib", type=float, default=None, help="device memory lent (0 = none)")
    p.add_argument("--hbm-device", default=None, help="torch device of the HBM segment (cuda)")
    p.add_argument("--metrics-listen", default=None, help="HOST:PORT of /metrics (none: off)")
    p.add_argument("--log-level", default="WARNING")
    p.set_defaults(handler=guarded("kvstore node", run_node_cmd))


def _register_tiers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tiers", help="per node and tier: capacity, use, hits, evictions, bytes",
        parents=[admin_parent()],
    )  # fmt: skip
    p.set_defaults(handler=guarded("kvstore tiers", run_tiers_cmd))


def split_listen(listen: str) -> tuple[str, int]:
    """ "HOST:PORT" -> (host, port); port 0 means any free port."""
    try:
        return split_address(listen)
    except BadRequestError:
        raise BadRequestError(f"bad --listen {listen!r}, want HOST:PORT") from None


def master_flags(args: argparse.Namespace) -> dict[str, Any]:
    """MasterConfig fields given on the command line (--set wins over a named flag)."""
    from kvstore.master.launch import _NAMED, SETTABLE

    flags: dict[str, Any] = {field: getattr(args, flag) for flag, field in _NAMED.items()}
    flags.update(listen=args.listen, db_path=args.db)
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or name not in SETTABLE:
            raise BadRequestError(f"bad --set {item!r}: want NAME=VALUE, NAME one of "
                                  f"{', '.join(sorted(SETTABLE))}")  # fmt: skip
        try:
            flags[name] = SETTABLE[name](value)
        except ValueError:
            raise BadRequestError(
                f"bad --set {item!r}: {value!r} is not a {SETTABLE[name].__name__}"
            ) from None
    return flags


def run_master_cmd(args: argparse.Namespace) -> int:
    """The same process as `python -m kvstore.master`, configured by kvstore.config."""
    from kvstore.config import apply_security, load
    from kvstore.master.launch import ha_config
    from kvstore.master.server import run_master

    layers = load(args.config)
    config = layers.section("master", master_flags(args)).build()
    apply_security(layers)  # [security]: this process's credentials and checks
    split_listen(config.listen)
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    ha = ha_config(args)  # --etcd: one master of an HA pool (kvstore.master.ha)
    run_master(config.listen, config=config, metrics_listen=args.metrics_listen, ha=ha)
    return 0


def node_flags(args: argparse.Namespace) -> dict[str, Any]:
    flags: dict[str, Any] = {
        "master": args.master, "node_id": args.node_id, "ssd_dir": args.ssd_dir,
        "nixl": args.nixl,
        "dram_bytes": None if args.dram_mib is None else int(args.dram_mib * MIB),
        "ssd_bytes": None if args.ssd_mib is None else int(args.ssd_mib * MIB),
        "hbm_bytes": None if args.hbm_mib is None else int(args.hbm_mib * MIB),
        "hbm_device": args.hbm_device,
    }  # fmt: skip
    if args.listen is not None:
        flags["listen_host"], flags["tcp_port"] = split_listen(args.listen)
    return flags


def run_node_cmd(args: argparse.Namespace) -> int:
    from kvstore.config import apply_security, load
    from kvstore.node.__main__ import run_with_metrics

    layers = load(args.config)
    eff = layers.section("node", node_flags(args))
    apply_security(layers)
    config = eff.build(master=cli_settings(args).master)
    if config.ssd_dir is not None and not os.path.isdir(config.ssd_dir):
        raise BadRequestError(f"--ssd-dir {config.ssd_dir!r} is not a directory")
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    run_with_metrics(config, args.metrics_listen)
    return 0


def run_tiers_cmd(args: argparse.Namespace) -> int:
    from cli.tiers_view import pool_row, render_table, tier_rows, to_document
    from kvstore.v1 import master_pb2

    with master_api(args) as api:
        stats = api.call("Stats", master_pb2.StatsRequest())
        address = api.address
    if args.json:
        print(json.dumps(to_document(stats, address)))
    else:
        print(render_table(tier_rows(stats), pool_row(stats)))
    return 0
