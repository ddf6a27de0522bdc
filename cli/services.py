"""`kvstore master`, `kvstore node` and `kvstore tiers`: run a pool by hand, inspect it.

    kvstore master --listen 127.0.0.1:50051 [--db PATH]
    kvstore node --master 127.0.0.1:50051 --listen 127.0.0.1:0 --dram-mib 256 \
        [--ssd-dir DIR --ssd-mib 1024]
    kvstore tiers --master 127.0.0.1:50051 [--json]

Each service prints one ready line (its address) and runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import sys

MIB = 1 << 20


def register(sub: argparse._SubParsersAction) -> None:
    _register_master(sub)
    _register_node(sub)
    _register_tiers(sub)


def _register_master(sub: argparse._SubParsersAction) -> None:
    from kvstore.master.launch import add_arguments

    p = sub.add_parser("master", help="run the metadata master (gRPC)")
    add_arguments(p)
    p.set_defaults(handler=run_master_cmd)


def _register_node(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("node", help="run a storage node lending DRAM (and SSD) to the pool")
    p.add_argument("--master", required=True, help="HOST:PORT of the master")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT of its data plane")
    p.add_argument("--node-id", default=None, help="default: <hostname>-<pid>")
    p.add_argument("--dram-mib", type=float, default=64.0, help="DRAM segment size")
    p.add_argument("--ssd-dir", default=None, help="directory of the SSD segment file")
    p.add_argument("--ssd-mib", type=float, default=0.0, help="SSD segment size (0 = none)")
    p.add_argument(
        "--nixl", action="store_true", help="serve DRAM by NIXL too (RDMA-capable; a busy core)"
    )
    p.set_defaults(handler=run_node_cmd)


def _register_tiers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tiers", help="per node and tier: capacity, use, hits, evictions, bytes")
    p.add_argument("--master", default="127.0.0.1:50051", help="HOST:PORT of the master")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--timeout-s", type=float, default=5.0)
    p.set_defaults(handler=run_tiers_cmd)


def split_listen(listen: str) -> tuple[str, int]:
    """ "HOST:PORT" -> (host, port); port 0 means any free port."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise SystemExit(f"bad --listen {listen!r}, want HOST:PORT")
    return host.strip("[]"), int(port)


def run_master_cmd(args: argparse.Namespace) -> int:
    """The same process as `python -m kvstore.master` (flags in kvstore.master.launch)."""
    from kvstore.master.launch import run_from_args

    return run_from_args(args)


def run_node_cmd(args: argparse.Namespace) -> int:
    from kvstore.node import NodeConfig, run_node
    from kvstore.node.config import default_node_id

    host, port = split_listen(args.listen)
    config = NodeConfig(
        master=args.master,
        node_id=args.node_id or default_node_id(),
        listen_host=host,
        tcp_port=port,
        dram_bytes=int(args.dram_mib * MIB),
        ssd_dir=args.ssd_dir,
        ssd_bytes=int(args.ssd_mib * MIB),
        nixl=args.nixl,
    )
    run_node(config)
    return 0


def run_tiers_cmd(args: argparse.Namespace) -> int:
    import grpc

    from cli.tiers_view import pool_row, render_table, tier_rows, to_document
    from kvstore.v1 import master_pb2, master_pb2_grpc

    with grpc.insecure_channel(args.master) as channel:
        try:
            stats = master_pb2_grpc.MasterStub(channel).Stats(
                master_pb2.StatsRequest(), timeout=args.timeout_s
            )
        except grpc.RpcError as exc:
            print(f"kvstore tiers: master {args.master}: {exc.code().name}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(to_document(stats, args.master)))
    else:
        print(render_table(tier_rows(stats), pool_row(stats)))
    return 0
