"""Pool-wide admin calls of the Mooncake facade that the client API does not offer.

`remove_all` pages through ListObjects (COMPLETE objects of one tenant) and removes
them in batches; it returns how many were removed, as Mooncake's `remove_all` does.
"""

from __future__ import annotations

import re

import grpc

from kvstore import edge
from kvstore.rpc_errors import raise_from_rpc_error
from kvstore.v1 import master_pb2, master_pb2_grpc

PAGE = 10_000


def remove_all(
    master: str, tenant: str, force: bool, pattern: re.Pattern[str] | None = None,
    timeout_s: float = 30.0,
) -> int:  # fmt: skip
    """Remove every committed object whose wire key belongs to `tenant` ("" = all keys)
    and, with `pattern`, whose key (without the tenant prefix) matches it (re.search)."""
    prefix = f"{tenant}/" if tenant else ""
    removed = 0
    with edge.sync_channel(master) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        try:
            for page in _pages(stub, prefix, timeout_s):
                keys = [k for k in page if pattern is None or pattern.search(k[len(prefix) :])]
                if not keys:
                    continue
                reply = stub.Remove(
                    master_pb2.RemoveRequest(keys=keys, force=force), timeout=timeout_s
                )
                removed += sum(1 for status in reply.results if status.code == 0)
        except grpc.RpcError as exc:
            raise_from_rpc_error(exc)
    return removed


def _pages(stub: master_pb2_grpc.MasterStub, prefix: str, timeout_s: float) -> list[list[str]]:
    """Every COMPLETE key under `prefix`, in pages (listed before any removal)."""
    pages, token = [], ""
    while True:
        request = master_pb2.ListObjectsRequest(page_size=PAGE, page_token=token, prefix=prefix)
        reply = stub.ListObjects(request, timeout=timeout_s)
        keys = [o.key for o in reply.objects if o.state == master_pb2.OBJECT_STATE_COMPLETE]
        if keys:
            pages.append(keys)
        token = reply.next_page_token
        if not token:
            return pages
