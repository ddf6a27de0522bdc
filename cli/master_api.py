"""The master's RPCs for the admin commands: a blocking stub whose every call has a
deadline and raises the matching KVStoreError (UnavailableError when the master is
down or late), never a raw grpc.RpcError."""

from __future__ import annotations

from typing import Any

import grpc

from kvstore.edge import sync_channel
from kvstore.errors import UnavailableError
from kvstore.rpc_errors import error_for_status
from kvstore.v1 import master_pb2_grpc


class MasterApi:
    """`api.call("Stats", StatsRequest())`; a context manager closing its channel."""

    def __init__(self, address: str, timeout_s: float = 5.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = sync_channel(address)
        self._stub = master_pb2_grpc.MasterStub(self._channel)

    def call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise UnavailableError(
                    f"master {self.address} unavailable ({code.name}, deadline "
                    f"{self.timeout_s:g} s)"
                ) from None
            details = err.details() if hasattr(err, "details") else ""
            # the class of the status's error, with the master's message as it wrote it
            raise type(error_for_status(code, ""))(details or code.name) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> MasterApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
