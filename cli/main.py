"""`kvstore` command: run the demo, start services, inspect tiers.

Each subcommand lives in its own module and registers itself here; heavy
imports happen inside the handlers so `kvstore --help` stays instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cli import cluster_demo, services, store_demo


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvstore", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cluster_demo.register(sub)
    store_demo.register(sub)
    services.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
