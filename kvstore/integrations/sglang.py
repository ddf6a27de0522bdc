"""A native SGLang HiCache storage backend on kvstore (`--hicache-storage-backend dynamic`).

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config '{
        "backend_name": "kvstore", "module_path": "kvstore.integrations.sglang",
        "class_name": "KVStoreHiCacheStorage", "master_server_address": "127.0.0.1:50051"}'

SGLang's host KV pool (page_first / page_first_direct layout) is registered once;
each page's K and V (MHA) or its one latent (MLA) is an object keyed like SGLang's
own Mooncake backend does (`<key>_<tp_rank>_k`, `<key>_<tp_rank>_v`; `<key>_k`), so
the two backends can share a pool. Every batch call is one existence query and one
batched zero-copy transfer from/to the pool's memory. Failures are results (False,
or a shorter prefix count), never exceptions into SGLang's cache controller.

SGLang itself needs a CUDA torch and sgl-kernel: it cannot be installed on a CPU-only
machine. The class subclasses SGLang's `HiCacheStorage` when SGLang is importable
(the dynamic factory requires it) and stands alone otherwise (for tests).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from kvstore.compat.mooncake_core import view_at
from kvstore.errors import ExistsError, KVStoreError

log = logging.getLogger(__name__)
PAGE_FIRST = ("page_first", "page_first_direct")

try:  # pragma: no cover - SGLang is not installable here
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except ImportError:  # SGLang absent: a plain base, same methods
    _Base = object


class KVStoreHiCacheStorage(_Base):  # type: ignore[misc, valid-type]
    """HiCacheStorage over a kvstore pool (batch_get_v1 / batch_set_v1 / batch_exists)."""

    def __init__(self, storage_config: Any = None, **_kwargs: Any) -> None:
        from kvstore.client.client import Client

        extra = dict(getattr(storage_config, "extra_config", None) or {})
        master = extra.get("master_server_address") or os.environ.get("KVSTORE_MASTER", "")
        if not master:
            raise ValueError("master_server_address (extra_config) or $KVSTORE_MASTER required")
        self.client = Client(str(master), transport=extra.get("transport", "auto"))
        self.tp_rank = int(getattr(storage_config, "tp_rank", 0) or 0)
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))
        self.prefix = str(extra.get("extra_backend_tag") or "")
        self.mem_pool_host: Any = None
        self.failures = 0

    # -- setup ------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        if getattr(mem_pool_host, "layout", "page_first") not in PAGE_FIRST:
            raise ValueError("kvstore HiCache backend needs a page_first(_direct) host pool")
        self.mem_pool_host = mem_pool_host
        buf = mem_pool_host.kv_buffer
        self.client.register_buffer(view_at(buf.data_ptr(), buf.numel() * buf.element_size()))

    # -- keys -------------------------------------------------------------------

    def _object_keys(self, keys: Sequence[str]) -> list[str]:
        keys = [f"{self.prefix}_{k}" if self.prefix else k for k in keys]
        if self.is_mla:
            return [f"{k}_k" for k in keys]
        return [f"{k}_{self.tp_rank}_{part}" for k in keys for part in ("k", "v")]

    def _per_page(self, ok: list[bool]) -> list[bool]:
        if self.is_mla:
            return ok
        return [a and b for a, b in zip(ok[::2], ok[1::2], strict=True)]

    def _views(self, host_indices: Any) -> list[memoryview]:
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        return [view_at(int(p), int(s)) for p, s in zip(ptrs, sizes, strict=True)]

    # -- v1 batch API -----------------------------------------------------------

    def batch_set_v1(
        self, keys: list[str], host_indices: Any, extra_info: Any = None
    ) -> list[bool]:
        """Store each page not already in the pool; per page, whether it is there now."""
        okeys = self._object_keys(keys)
        try:
            views = self._views(host_indices)
            present = self.client.batch_exists(okeys)
            todo = [i for i, p in enumerate(present) if not p]
            ok = list(present)
            if todo:
                errs = self.client.batch_put_from(
                    [okeys[i] for i in todo], [views[i] for i in todo]
                )
                for i, err in zip(todo, errs, strict=True):
                    ok[i] = err is None or isinstance(err, ExistsError)
        except (KVStoreError, ValueError) as exc:
            return self._failed("batch_set_v1", exc, len(keys))
        return self._per_page(ok)

    def batch_get_v1(
        self, keys: list[str], host_indices: Any, extra_info: Any = None
    ) -> list[bool]:
        """Read each page into the host pool; per page, whether all its bytes arrived."""
        okeys = self._object_keys(keys)
        try:
            views = self._views(host_indices)
            got = self.client.batch_get_into(okeys, views)
        except (KVStoreError, ValueError) as exc:
            return self._failed("batch_get_v1", exc, len(keys))
        ok = [isinstance(r, int) and r == v.nbytes for r, v in zip(got, views, strict=True)]
        return self._per_page(ok)

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many leading pages are all in the pool (one query)."""
        okeys = self._object_keys(keys)
        try:
            present = self._per_page(self.client.batch_exists(okeys))
        except KVStoreError as exc:
            self._failed("batch_exists", exc, 0)
            return 0
        return next((i for i, p in enumerate(present) if not p), len(present))

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def clear(self) -> None:
        from kvstore.compat import mooncake_admin

        mooncake_admin.remove_all(self.client.config.master, self.client.config.tenant, True)

    def close(self) -> None:
        self.client.close()

    def _failed(self, what: str, exc: BaseException, n: int) -> list[bool]:
        self.failures += 1
        if self.failures == 1:  # logged once; counted always
            log.warning("%s failed (pages treated as misses): %s", what, exc)
        return [False] * n
