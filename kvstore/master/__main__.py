"""`python -m kvstore.master --listen HOST:PORT [--db PATH] [...]`: run one master
(flags in `kvstore.master.launch`). Bad input is one line on stderr and the `kvstore`
command's exit codes (cli/errors.py); KVSTORE_DEBUG=1 shows the traceback."""

from __future__ import annotations

import sys

from cli.errors import OneLineParser, entry_point, quiet_grpc

quiet_grpc()  # before grpc loads: a failed bind is our one line, not grpc's log too

from kvstore.master import launch  # noqa: E402

if __name__ == "__main__":
    parser = OneLineParser(prog="python -m kvstore.master", description=launch.__doc__)
    launch.add_arguments(parser)
    args = parser.parse_args()
    sys.exit(entry_point("kvstore master", lambda: launch.run_from_args(args)))
