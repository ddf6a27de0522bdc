"""LMCache's own Mooncake backend (`MooncakestoreConnector`) on kvstore, driven standalone.

Run with the LMCache venv's python, kvstore's mooncake.store shim first on PYTHONPATH
and MOONCAKE_CONFIG_PATH naming a config on a kvstore master:

    python tests/integrations/lmcache_driver.py --save-chunk-meta {true,false} [--chunks N]

LMCache's vLLM connector has no CPU path, so the connector gets what its engine
would give it: an LMCacheEngineConfig, LMCacheMetadata of a small model and a CPU
backend (a host-memory allocator; LocalCPUBackend itself wants the engine). Prints
`RESULT {json}`: what exists/get returned and whether every chunk came back exactly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_allocators.host_memory_allocator import HostMemoryAllocator
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.connector.mooncakestore_connector import (
    MooncakestoreConnector,
)

CHUNK = 256
KV_SHAPE = (2, 2, CHUNK, 2, 64)  # layers, K/V, tokens, kv heads, head size


class CpuBackend:
    """The part of LocalCPUBackend the remote connector uses: config, metadata, allocate."""

    def __init__(self, config: Any, metadata: LMCacheMetadata, size: int) -> None:
        self.config, self.metadata = config, metadata
        self.memory_allocator = HostMemoryAllocator(size)

    def allocate(self, shapes: Any, dtypes: Any, fmt: Any = MemoryFormat.KV_2LTD) -> Any:
        return self.memory_allocator.allocate(shapes, dtypes, fmt)


async def run(save_chunk_meta: bool, chunks: int) -> dict[str, Any]:
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, remote_url=None, extra_config={"save_chunk_meta": save_chunk_meta}
    )
    metadata = LMCacheMetadata(model_name="tiny", world_size=1, local_world_size=1,
                               worker_id=0, local_worker_id=0, kv_dtype=torch.bfloat16,
                               kv_shape=KV_SHAPE, chunk_size=CHUNK)  # fmt: skip
    backend = CpuBackend(config, metadata, 64 << 20)
    conn = MooncakestoreConnector(asyncio.get_running_loop(), backend, config)  # type: ignore[arg-type]
    torch.manual_seed(1 + int(save_chunk_meta))
    keys, objs, originals = [], [], []
    for i in range(chunks):
        obj = backend.allocate(metadata.get_shapes(), metadata.get_dtypes())
        obj.raw_tensor.copy_(torch.randint(0, 256, obj.raw_tensor.shape, dtype=torch.uint8))
        originals.append(obj.raw_tensor.clone())
        keys.append(CacheEngineKey("tiny", 1, 0, 1000 * int(save_chunk_meta) + i, torch.bfloat16))
        objs.append(obj)
    await conn.batched_put(keys[:-1], objs[:-1])
    await conn.put(keys[-1], objs[-1])
    missing = CacheEngineKey("tiny", 1, 0, 999_999, torch.bfloat16)
    exists = [bool(await conn.exists(k)) for k in [*keys, missing]]
    contains = await conn.batched_async_contains("lookup", [*keys, missing])
    got = await conn.batched_get([*keys, missing])
    exact = [_same(g, o) for g, o in zip(got, originals, strict=False)]
    await conn.close()
    return {"save_chunk_meta": conn.save_chunk_meta, "exists": exists, "contains": contains,
            "exact": exact, "missing_is_none": got[-1] is None,
            "store_module": type(conn.store).__module__}  # fmt: skip


def _same(got: Any, original: torch.Tensor) -> bool:
    if got is None:
        return False
    raw = got.raw_tensor.view(torch.uint8).flatten()[: original.numel()]
    return bool(torch.equal(raw, original.flatten()))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--save-chunk-meta", choices=("true", "false"), required=True)
    ap.add_argument("--chunks", type=int, default=4)
    args = ap.parse_args(argv)
    result = asyncio.run(run(args.save_chunk_meta == "true", args.chunks))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
