"""ConductorClient against a real gRPC server that rejects every request: the typed
error comes back, and a rejected request leaves no reference cycle behind (grpc
raises the call object itself, which the client's frame holds; kept, its traceback
made a cycle per rejection that only a full collection freed: bench/soak.py)."""

from __future__ import annotations

import gc
import types
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from kvstore.client.conductor import ConductorClient
from kvstore.errors import NoSpaceError
from kvstore.v1 import conductor_pb2_grpc


class _Rejecting(conductor_pb2_grpc.ConductorServicer):
    def Generate(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded: retry in 50 ms")
        yield from ()


@pytest.fixture()
def address() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(2))
    conductor_pb2_grpc.add_ConductorServicer_to_server(_Rejecting(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0).wait(5)


def _in_cycles(objects: list[Any]) -> list[str]:
    """What of the rejections' own making the cycle collector had to free: the typed
    errors, grpc's call objects and the client's frames. Other tests' threads (grpc
    pollers, event loops) may make garbage of their own meanwhile; it is not counted."""
    client_file = ConductorClient.generate.__code__.co_filename
    found = []
    for obj in objects:
        if isinstance(obj, (NoSpaceError, grpc.RpcError)):
            found.append(type(obj).__name__)
        elif isinstance(obj, types.FrameType) and obj.f_code.co_filename == client_file:
            found.append(f"frame {obj.f_code.co_name}")
    return found


def test_a_rejection_is_typed_and_leaves_no_cycle(address: str) -> None:
    with ConductorClient(address, model="tiny") as c:
        with pytest.raises(NoSpaceError, match="retry in 50 ms"):
            c.generate("warm", max_tokens=2)  # channel and stubs made once
        gc.collect()
        gc.disable()
        try:
            for _ in range(20):
                with pytest.raises(NoSpaceError):
                    c.generate("x", max_tokens=2)
            gc.set_debug(gc.DEBUG_SAVEALL)  # keep what a collection frees, to look at
            gc.collect()
            found = _in_cycles(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert not found, f"in cycles after 20 rejections: {sorted(set(found))} ({len(found)})"
