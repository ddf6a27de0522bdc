"""A store module for Mooncake's store_kv_bench that times the store's own calls.

`bench/mooncake_side_by_side.py --in-call` runs the harness with
MOONCAKE_STORE_MODULE=store_timer and $KVS_TIMED_STORE_MODULE naming the real module
(`mooncake.store` or `kvstore.compat.mooncake`). Everything of the real module is
re-exported; its `MooncakeDistributedStore` is subclassed (a real instance, so
Mooncake's native BufferPool accepts it) to add up the wall time spent inside
`put_from` / `get_into` and their batch forms. At exit the sums go to the JSON file
$KVS_STORE_TIMES: {"put": [calls, seconds], "get": [calls, seconds]}.

Why: one object per call, the harness's own work per operation (building a fresh
payload, copying it into the registered buffer, zeroing and copying out the read
buffer, comparing) is paid by every store alike. The time inside the store's call
against the harness's whole operation says how far any store can get ahead: a store
whose call took no time at all would be (operation) / (operation - the other's call)
times faster, no more.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import time
from typing import Any

_real = importlib.import_module(os.environ.get("KVS_TIMED_STORE_MODULE", "kvstore.compat.mooncake"))
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})

_TIMES: dict[str, list[float]] = {"put": [0, 0.0], "get": [0, 0.0]}


def _timed(kind: str, name: str) -> Any:
    base = getattr(_real.MooncakeDistributedStore, name)

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return base(self, *args, **kwargs)
        finally:
            acc = _TIMES[kind]
            acc[0] += 1
            acc[1] += time.perf_counter() - t0

    call.__name__ = name
    return call


MooncakeDistributedStore = type(  # replaces the re-exported class
    "MooncakeDistributedStore",
    (_real.MooncakeDistributedStore,),
    {
        "put_from": _timed("put", "put_from"),
        "batch_put_from": _timed("put", "batch_put_from"),
        "get_into": _timed("get", "get_into"),
        "batch_get_into": _timed("get", "batch_get_into"),
    },
)


@atexit.register
def _write() -> None:
    path = os.environ.get("KVS_STORE_TIMES")
    if path:
        with open(path, "w") as f:
            json.dump(_TIMES, f)
