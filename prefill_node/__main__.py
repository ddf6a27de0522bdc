import sys

from cli.errors import quiet_grpc

quiet_grpc()  # before grpc loads: a failed bind is our one line, not grpc's log too

from prefill_node.server import main  # noqa: E402

sys.exit(main())
