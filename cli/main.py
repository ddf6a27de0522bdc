"""`kvstore` command: run the demo or a cluster, start services, administer the pool.

Each subcommand lives in its own module and registers itself here; heavy imports
happen inside the handlers so `kvstore --help` stays instant. Every subcommand turns
a failure into one line on stderr and a documented exit code (cli/errors.py): 0 ok,
1 internal, 2 usage, 3 not found, 4 unavailable, 5 refused, 6 no space, 7 corrupt/IO,
130 interrupted; `--debug` adds the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

if "--debug" not in sys.argv:  # grpc's C core logs bind failures itself: one line is ours
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
from collections.abc import Sequence

from cli import (
    admin,
    certs_cmd,
    cluster_demo,
    config_cmd,
    errors,
    serve,
    services,
    store_demo,
    top,
    up,
)

OneLineParser = errors.OneLineParser  # a bad flag is one line and exit code 2


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="kvstore", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    cluster_demo.register(sub)
    store_demo.register(sub)
    services.register(sub)
    admin.register(sub)
    serve.register(sub)
    config_cmd.register(sub)
    up.register(sub)
    top.register(sub)
    certs_cmd.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = args.handler
    if not getattr(handler, "guarded", False):
        handler = errors.guarded(f"kvstore {args.command}", handler)
    return int(handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
