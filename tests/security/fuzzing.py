"""Hypothesis strategies for every Master RPC's request and for the TCP data-plane
protocol, and the invariants checked after each case (tests/security/test_fuzz.py runs a
CI-sized share; bench/fuzz.py the long run).

    requests()      (method, request bytes): a message built field by field from the
                    method's descriptor (valid, boundary and garbage values), or raw bytes
    frames()        bytes for a data-plane connection: a well-formed header with wild
                    fields (and payload) or plain garbage
    FuzzTarget      a master in-process, a storage node and a canary object; `.case(...)`
                    sends one request and asserts: a typed status, the master still
                    answers, check_integrity holds, the canary reads back exact
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import descriptor as _d
from hypothesis import strategies as st

from kvstore.v1 import master_pb2, master_pb2_grpc

SERVICE = master_pb2.DESCRIPTOR.services_by_name["Master"]
METHODS = [m.name for m in SERVICE.methods]
# Statuses a fuzzed request may end with: each is a typed refusal (kvstore.rpc_errors).
TYPED = {
    grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.DATA_LOSS,
}  # fmt: skip
CANARY = f"zz-canary-{uuid.uuid4().hex[:8]}"
FAKE_IDS = ["f1", "f2", "", "x" * 256, "x" * 257, "n\x00", "é" * 100]
BOUNDARY_U64 = [0, 1, 63, 64, 4095, 4096, 2**31 - 1, 2**32 - 1, 2**32, 2**47, 2**63, 2**64 - 1]
BOUNDARY_LEN = [0, 1, 255, 256, 1024, 1025, 4096]

_INT_RANGE = {
    _d.FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), _d.FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    _d.FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    _d.FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
}  # fmt: skip


def _text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=24),
        st.sampled_from(FAKE_IDS),
        st.sampled_from(BOUNDARY_LEN).map(lambda n: "k" * n),
        st.from_regex(r"(alice|bob|default)/[a-z0-9]{0,8}", fullmatch=True),
    )


def _scalar(f: _d.FieldDescriptor) -> st.SearchStrategy[Any]:
    t = f.type
    if f.name == "wait_ms":
        return st.integers(0, 20)  # a long poll's wait (clamped by the master; kept short here)
    if t == f.TYPE_STRING:
        return _text()
    if t == f.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.sampled_from(BOUNDARY_LEN).map(bytes))
    if t == f.TYPE_BOOL:
        return st.booleans()
    if t == f.TYPE_ENUM:
        values = [v.number for v in f.enum_type.values]
        return st.one_of(st.sampled_from(values), st.integers(-3, 40))
    if t in (f.TYPE_DOUBLE, f.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=32 if t == f.TYPE_FLOAT else 64)
    lo, hi = _INT_RANGE.get(t, (0, 2**32 - 1))
    return st.one_of(
        st.integers(lo, hi), st.sampled_from([b for b in BOUNDARY_U64 if lo <= b <= hi])
    )


def _repeated(f: _d.FieldDescriptor) -> bool:
    flag = getattr(f, "is_repeated", None)  # protobuf >= 6.32; `label` before (deprecated)
    return bool(flag) if flag is not None else f.label == f.LABEL_REPEATED


def message(desc: _d.Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    """Instances of `desc` with any subset of its fields set to wild values."""
    from google.protobuf import message_factory

    make = message_factory.GetMessageClass(desc)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in desc.fields:
        if f.type == f.TYPE_MESSAGE:
            if depth >= 2:
                continue
            one = message(f.message_type, depth + 1)
        else:
            one = _scalar(f)
        if _repeated(f):
            fields[f.name] = st.lists(one, max_size=6 if depth == 0 else 3)
        else:
            fields[f.name] = one
    return st.fixed_dictionaries({}, optional=fields).map(lambda kw: _build(make, kw))


def _build(make: Callable[..., Any], kw: dict[str, Any]) -> Any:
    msg = make()
    for name, value in kw.items():
        field = msg.DESCRIPTOR.fields_by_name[name]
        if _repeated(field):
            getattr(msg, name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(msg, name).CopyFrom(value)
        else:
            setattr(msg, name, value)
    return msg


def requests() -> st.SearchStrategy[tuple[str, bytes]]:
    """(method, request bytes) for any Master method: built, or garbage bytes."""
    built = st.sampled_from(METHODS).flatmap(
        lambda m: message(SERVICE.methods_by_name[m].input_type).map(
            lambda msg, m=m: (m, msg.SerializeToString())
        )
    )
    garbage = st.tuples(st.sampled_from(METHODS), st.binary(max_size=128))
    return st.one_of(built, built, built, garbage)


def frames() -> st.SearchStrategy[bytes]:
    """Bytes a hostile peer sends a data-plane connection."""
    names = st.one_of(st.sampled_from([b"scratch", b"", b"nope"]), st.binary(max_size=12))
    header = st.builds(
        lambda op, ver, name, name_len, rid, off, ln, tail: (
            struct.pack("<BBHIQQ", op, ver, name_len if name_len >= 0 else len(name), rid, off, ln)
            + name + tail
        ),
        st.integers(0, 255), st.sampled_from([1, 1, 1, 0, 2, 255]), names,
        st.one_of(st.just(-1), st.integers(0, 65535)), st.integers(0, 2**32 - 1),
        st.sampled_from(BOUNDARY_U64), st.sampled_from([0, 1, 16, 4096, 2**20, 2**63, 2**64 - 1]),
        st.binary(max_size=256),
    )  # fmt: skip
    return st.one_of(header, header, st.binary(max_size=200))


def send_frame(endpoint: str, data: bytes, timeout_s: float = 1.0) -> None:
    """Send `data` on a fresh connection, read what comes back for a moment, close."""
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except OSError:
            pass  # the server may drop a hostile connection: that is allowed


class FuzzTarget:
    """A live master (in-process: its invariants are checked directly) and storage node,
    with a canary object that every case must leave readable, byte for byte."""

    def __init__(self, master: Any) -> None:
        from kvstore.client import Client
        from kvstore.node.config import NodeConfig
        from kvstore.node.node import StorageNode

        self.master = master
        node_id = f"fuzz-node-{uuid.uuid4().hex[:6]}"
        self.node = StorageNode(
            NodeConfig(master=master.address, dram_bytes=8 << 20, node_id=node_id)
        )
        self.node.start()
        self.node.server.expose("scratch", bytearray(1 << 20))
        self.client = Client(master.address, transport="tcp", checksums=True)
        self.canary = bytes(range(256)) * 64
        self.client.put(CANARY, self.canary)
        pin = master_pb2.PinRequest(keys=[CANARY], ttl_ms=3_600_000)
        master_pb2_grpc.MasterStub(master_channel := grpc.insecure_channel(master.address)).Pin(pin)
        master_channel.close()
        ch = grpc.insecure_channel(
            master.address, options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        self.channel = ch
        self.stats_stub = ch.unary_unary(
            "/kvstore.v1.Master/Stats", request_serializer=None, response_deserializer=None
        )
        self.cases = 0
        self.slowest: tuple[float, str, bytes] = (0.0, "", b"")  # (seconds, method, request)

    def protected(self, method: str, raw: bytes) -> bool:
        """Cases that may legitimately destroy the canary in insecure mode, where anyone
        may remove anything: skipped, since the invariant would not be about a bug. (The
        canary is pinned, so watermark evictions pass it by.)"""
        if self.node.config.node_id.encode() in raw or CANARY.encode() in raw:
            return True
        if method != "Evict":
            return False
        try:
            prefix = master_pb2.EvictRequest.FromString(raw).prefix
        except Exception:
            return False  # the master refuses it whole
        return bool(prefix) and CANARY.startswith(prefix)

    def case(self, method: str, raw: bytes) -> grpc.StatusCode:
        """One request; then every invariant. The status is returned for statistics."""
        call = self.channel.unary_unary(f"/kvstore.v1.Master/{method}")
        code = grpc.StatusCode.OK
        started = time.perf_counter()
        try:
            call(raw, timeout=10)
        except grpc.RpcError as err:
            code = err.code()
        took = time.perf_counter() - started
        if took > self.slowest[0]:
            self.slowest = (took, method, raw[:200])
        assert code in TYPED, f"{method}: untyped status {code} for {raw!r}"
        self.check()
        self.cases += 1
        return code

    def check(self, canary: bool = True) -> None:
        self.stats_stub(b"", timeout=10)  # the master still answers
        self.master.check()  # metadata invariants and the guard's ledger
        assert self.node.server.connection_count() >= 0
        if canary:
            assert self.client.get(CANARY) == self.canary

    def close(self) -> None:
        self.client.close()
        self.node.stop()
        self.channel.close()
