"""gRPC odds and ends every conductor module that talks to nodes shares: channel options and
the kvstore error of a failed downstream call (kvstore.rpc_errors' one mapping)."""

from __future__ import annotations

import grpc

from kvstore.errors import KVStoreError
from kvstore.rpc_errors import error_for_status

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.so_reuseport", 0),
]


def rpc_error(err: grpc.RpcError) -> KVStoreError:
    """The kvstore error of a failed downstream RPC (kvstore.rpc_errors' mapping)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    return error_for_status(code, details or "")
