"""`python -m kvstore.node --master HOST:PORT --dram-mib N [...]`: run one storage node.

Bad input (a missing --ssd-dir, a full disk, a master that cannot be reached in
--join-timeout-s) ends in one line on stderr and the `kvstore` command's exit codes
(2 usage, 4 unavailable, ...), no traceback (KVSTORE_DEBUG=1 shows one).
`--metrics-listen HOST:PORT` serves /metrics (`kvstore.metrics.NodeCollector`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Sequence

from kvstore.failover import split_masters
from kvstore.node.config import NodeConfig, default_node_id
from kvstore.node.node import StorageNode, run_node

MIB = 1 << 20


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvstore.node", description=__doc__)
    p.add_argument("--master", required=True, help="host:port of the master (HA: h1:p1,h2:p2,...)")
    p.add_argument("--node-id", default=None, help="default: <hostname>-<pid>")
    p.add_argument("--host", default="127.0.0.1", help="TCP transfer listen address")
    p.add_argument("--port", type=int, default=0, help="TCP transfer port (0 = any free)")
    p.add_argument("--dram-mib", type=float, default=64.0, help="DRAM segment size")
    p.add_argument("--ssd-dir", default=None, help="directory of the SSD segment file")
    p.add_argument("--ssd-mib", type=float, default=0.0, help="SSD segment size (0 = none)")
    p.add_argument("--hbm-mib", type=float, default=0.0, help="device memory lent (0 = none)")
    p.add_argument("--hbm-device", default="cuda", help="torch device of the HBM segment")
    p.add_argument("--buffered-ssd", action="store_true", help="no O_DIRECT on the SSD slab")
    p.add_argument(
        "--no-ssd-fd", action="store_true",
        help="same-host peers reach the SSD slab over TCP only, never by its fd",
    )  # fmt: skip
    p.add_argument("--heartbeat-s", type=float, default=0.0, help="0 = the master's interval")
    p.add_argument("--join-timeout-s", type=float, default=30.0, help="wait for the master")
    p.add_argument(
        "--nixl", action=argparse.BooleanOptionalAction, default=False,
        help="serve the DRAM segment by NIXL too (RDMA-capable; costs a spinning core)",
    )  # fmt: skip
    p.add_argument("--metrics-listen", default=None, help="HOST:PORT of /metrics (none: off)")
    p.add_argument(
        "--shm-peer-uid", type=int, action="append", default=[],
        help="secured mode: another uid whose processes may map the DRAM segment (repeatable)",
    )  # fmt: skip
    p.add_argument("--log-level", default="WARNING")
    return p


def run_with_metrics(config: NodeConfig, metrics_listen: str | None) -> None:
    """`run_node`, plus /metrics on `metrics_listen` while the node serves (None: none)."""
    if not metrics_listen:
        run_node(config)
        return
    from kvstore.metrics import MetricsEndpoint, NodeCollector

    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    node = StorageNode(config)
    try:
        node.start()  # on failure it has stopped itself
        try:
            endpoint = MetricsEndpoint.start(metrics_listen, [NodeCollector(node)])
        except BaseException:
            node.stop()
            raise
        names = ",".join(s.name for s in node.lent())
        print(f"kvstore node {config.node_id} ready on {node.endpoint} segments {names} "
              f"metrics {endpoint.address}", flush=True)  # fmt: skip
        try:
            stop.wait()
        finally:
            endpoint.close()
            node.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    from cli.errors import entry_point

    args = build_parser().parse_args(argv)
    return entry_point("kvstore node", lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    masters = split_masters(args.master)  # HA: every master; the leader is found among them
    config = NodeConfig(
        master=masters[0],
        masters=tuple(masters[1:]),
        node_id=args.node_id or default_node_id(),
        listen_host=args.host,
        tcp_port=args.port,
        dram_bytes=int(args.dram_mib * MIB),
        ssd_dir=args.ssd_dir,
        ssd_bytes=int(args.ssd_mib * MIB),
        heartbeat_s=args.heartbeat_s,
        join_timeout_s=args.join_timeout_s,
        nixl=args.nixl,
        hbm_bytes=int(args.hbm_mib * MIB),
        hbm_device=args.hbm_device,
        ssd_direct_io=not args.buffered_ssd,
        ssd_fd_peers=not args.no_ssd_fd,
        shm_peer_uids=tuple(args.shm_peer_uid),
    )
    run_with_metrics(config, args.metrics_listen)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
