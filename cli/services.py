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
    p = sub.add_parser("master", help="run the metadata master (gRPC)")
    p.add_argument("--listen", default="127.0.0.1:50051", help="HOST:PORT (port 0 = any)")
    p.add_argument("--db", default=None, help="RocksDB journal directory (restart keeps objects)")
    p.add_argument("--lease-ttl-s", type=float, default=5.0, help="default read lease")
    p.add_argument("--node-ttl-s", type=float, default=10.0, help="silent nodes die after")
    p.add_argument("--heartbeat-s", type=float, default=2.0, help="interval asked of nodes")
    p.add_argument("--put-timeout-s", type=float, default=30.0, help="uncommitted puts expire")
    p.add_argument("--high-watermark", type=float, default=0.95, help="evict above (fraction)")
    p.add_argument("--low-watermark", type=float, default=0.85, help="evict down to (fraction)")
    p.set_defaults(handler=run_master_cmd)


def _register_node(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("node", help="run a storage node lending DRAM (and SSD) to the pool")
    p.add_argument("--master", required=True, help="HOST:PORT of the master")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT of its data plane")
    p.add_argument("--node-id", default=None, help="default: <hostname>-<pid>")
    p.add_argument("--dram-mib", type=float, default=64.0, help="DRAM segment size")
    p.add_argument("--ssd-dir", default=None, help="directory of the SSD segment file")
    p.add_argument("--ssd-mib", type=float, default=0.0, help="SSD segment size (0 = none)")
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
    from kvstore.master.server import run_master

    run_master(
        args.listen,
        args.db,
        default_lease_ttl_s=args.lease_ttl_s,
        node_ttl_s=args.node_ttl_s,
        heartbeat_interval_s=args.heartbeat_s,
        put_timeout_s=args.put_timeout_s,
        high_watermark=args.high_watermark,
        low_watermark=args.low_watermark,
    )
    return 0


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
