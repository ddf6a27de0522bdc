"""A Mooncake-compatible facade: `MooncakeDistributedStore` on top of `kvstore.Client`.

Same method names, arguments and integer return codes as `mooncake.store.
MooncakeDistributedStore` (0 = success, negative = Mooncake's ErrorCode), so the
Mooncake connectors of vLLM, SGLang and LMCache run on kvstore by swapping the
import. Memory is passed as (address, size) integers, as in Mooncake. What
differs is listed in docs/mooncake_compat.md.

    store = MooncakeDistributedStore()
    store.setup("127.0.0.1", "P2PHANDSHAKE", 512 << 20, 0, "tcp", "", "127.0.0.1:50051")
    store.register_buffer(ptr, size); store.put_from("k", ptr, n); store.get_into("k", ptr, n)
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvstore.compat import mooncake_admin
from kvstore.compat.mooncake_codes import ErrorCode, code_of, put_code, remove_code
from kvstore.compat.mooncake_pool import BufferLease, BufferPool
from kvstore.errors import BadRequestError, KVStoreError, NotFoundError

__all__ = [
    "BufferLease", "BufferPool", "ErrorCode", "MooncakeDistributedStore", "ReplicateConfig",
    "get_alloc_func_addr", "get_free_func_addr",
]  # fmt: skip
log = logging.getLogger(__name__)
T = TypeVar("T")
MiB = 1 << 20
NOT_READY = int(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS)
SOFT_PIN_TTL_MS = 30 * 60 * 1000  # Mooncake's default soft-pin TTL


@dataclass
class ReplicateConfig:
    """Mooncake's ReplicateConfig: a mutable record, as callers set fields one by one.

    The facade honours `replica_num` and the pins; the other fields are accepted and
    ignored (any object with these attributes works, Mooncake's own class included).
    """

    replica_num: int = 1
    with_soft_pin: bool = False
    with_hard_pin: bool = False
    soft_pin_ttl_ms: int = 0
    preferred_segment: str = ""
    preferred_segments: list[str] = field(default_factory=list)
    prefer_alloc_in_same_node: bool = False
    nof_replica_num: int = 0


def _libc_address(name: str) -> int:
    return int(ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value or 0)


def get_alloc_func_addr() -> int:
    """Address of a C `void *alloc(size_t)` for buffers (Mooncake: hugepage alloc; here malloc)."""
    return _libc_address("malloc")


def get_free_func_addr() -> int:
    """Address of the C `void free(void *)` matching `get_alloc_func_addr`."""
    return _libc_address("free")


def view_at(address: int, size: int) -> memoryview:
    """A writable byte view of `size` bytes at `address` (no copy, no ownership)."""
    if not isinstance(address, int) or not isinstance(size, int):
        raise BadRequestError("buffer address and size must be ints")
    if address <= 0 or size <= 0:
        raise BadRequestError(f"bad memory range address={address:#x} size={size}")
    return memoryview((ctypes.c_ubyte * size).from_address(address)).cast("B")


def transport_for(protocol: str) -> str:
    """Mooncake's protocol -> kvstore transport; $KVSTORE_TRANSPORT overrides.

    "tcp" and "rdma" -> "auto" (shared memory to segments on this host, TCP to others):
    storage nodes do not publish NIXL metadata yet, so "nixl" is only taken by name.
    """
    forced = os.environ.get("KVSTORE_TRANSPORT", "")
    if forced:
        return forced
    if protocol in ("tcp", "rdma", "", "auto"):
        return "auto"
    if protocol in ("shm", "nixl"):
        return protocol
    raise BadRequestError(f"unknown protocol {protocol!r}")


def _connect(master: str, protocol: str, segment_bytes: int, tenant_id: str) -> Any:
    """A kvstore Client on `master`, checked with one Stats call (fail at setup, as Mooncake)."""
    from kvstore.client.client import Client
    from kvstore.client.config import ClientConfig

    config = ClientConfig(
        master=master,
        transport=transport_for(protocol),
        segment_bytes=int(segment_bytes),
        tenant="" if tenant_id in ("", "default") else tenant_id,
    )
    client = Client(config)
    try:
        client.stats()
    except BaseException:
        client.close()
        raise
    return client


def _put_kwargs(config: object | None) -> dict[str, Any]:
    """Client put options from a (Mooncake or facade) ReplicateConfig."""
    if config is None:
        return {}
    kw: dict[str, Any] = {"replicas": max(1, int(getattr(config, "replica_num", 1) or 1))}
    if getattr(config, "with_hard_pin", False):
        kw["pin_ttl_s"] = 3600.0  # the master's longest pin
    elif getattr(config, "with_soft_pin", False):
        ttl_ms = int(getattr(config, "soft_pin_ttl_ms", 0) or SOFT_PIN_TTL_MS)
        kw["pin_ttl_s"] = min(ttl_ms / 1000, 3600.0)
    return kw


class MooncakeDistributedStore:
    """Mooncake Store's Python API over kvstore. Every method returns, never raises."""

    def __init__(self) -> None:
        self._client: Any = None
        self._master = ""
        self._tenant = ""
        self._hostname = ""
        self._lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------

    def setup(
        self,
        local_hostname: str | dict[str, Any],
        metadata_server: str = "P2PHANDSHAKE",
        global_segment_size: int = 16 * MiB,
        local_buffer_size: int = 16 * MiB,
        protocol: str = "tcp",
        rdma_devices: str = "",
        master_server_addr: str = "127.0.0.1:50051",
        engine: object = None,
        enable_ssd_offload: bool = False,
        ssd_offload_path: str = "",
        tenant_id: str = "default",
        enable_client_http_server: bool = False,
        client_http_port: int = 9300,
    ) -> int:
        """Connect to the master at `master_server_addr`; lend `global_segment_size` bytes.

        `metadata_server`, `local_buffer_size`, `rdma_devices`, `engine`, SSD offload
        and the HTTP server are accepted and ignored (see docs/mooncake_compat.md).
        """
        if isinstance(local_hostname, dict):
            return self._setup_dict(local_hostname)
        with self._lock:
            if self._client is not None:
                return int(ErrorCode.INVALID_PARAMS)
            try:
                client = _connect(master_server_addr, protocol, global_segment_size, tenant_id)
            except Exception as exc:  # the API reports codes, never raises
                log.warning("setup failed: %s", exc)
                return code_of(exc)
            self._client, self._master = client, master_server_addr
            self._tenant, self._hostname = client.config.tenant, local_hostname
        return int(ErrorCode.OK)

    def _setup_dict(self, cfg: dict[str, Any]) -> int:
        keys = ("metadata_server", "global_segment_size", "local_buffer_size", "protocol",
                "rdma_devices", "master_server_addr", "tenant_id")  # fmt: skip
        kw = {k: cfg[k] for k in keys if k in cfg}
        for k in ("global_segment_size", "local_buffer_size"):
            if k in kw:
                kw[k] = int(kw[k])
        return self.setup(str(cfg.get("local_hostname", "")), **kw)

    def close(self) -> int:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except KVStoreError as exc:
                return code_of(exc)
        return int(ErrorCode.OK)

    def get_hostname(self) -> str:
        """The `local_hostname` given to setup ("" before setup)."""
        return self._hostname

    # -- helpers ------------------------------------------------------------------

    def _call(self, fn: Callable[[Any], T], on_error: Callable[[BaseException], int]) -> T | int:
        client = self._client
        if client is None:
            return NOT_READY
        try:
            return fn(client)
        except (KVStoreError, ValueError, TypeError) as exc:
            return on_error(exc)

    # -- writes -----------------------------------------------------------------

    def put(self, key: str, value: Any, config: object | None = None) -> int:
        kw = _put_kwargs(config)
        res = self._call(lambda c: c.put(key, value, **kw), put_code)
        return int(res or 0)

    def put_from(self, key: str, buffer_ptr: int, size: int, config: object | None = None) -> int:
        kw = _put_kwargs(config)
        res = self._call(lambda c: c.put_from(key, view_at(buffer_ptr, size), **kw), put_code)
        return int(res or 0)

    def put_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: object | None = None
    ) -> int:
        """Store many values; 0, or the first key's error code (one int, as Mooncake)."""
        kw = _put_kwargs(config)

        def run(c: Any) -> int:
            codes = [put_code(e) for e in c.batch_put(list(zip(keys, values, strict=True)), **kw)]
            return next((code for code in codes if code), 0)

        return int(self._call(run, put_code))

    def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: object | None = None,
    ) -> list[int]:
        kw = _put_kwargs(config)

        def run(c: Any) -> list[int]:
            views, out = _views(keys, buffer_ptrs, sizes)
            good = [i for i, v in enumerate(views) if isinstance(v, memoryview)]
            results = c.batch_put_from([keys[i] for i in good], [views[i] for i in good], **kw)
            for i, err in zip(good, results, strict=True):
                out[i] = put_code(err)
            return out

        return _per_key(self._call(run, put_code), len(keys))

    # -- reads ------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        """The value, or b"" when absent or on any error (as Mooncake does)."""
        res = self._call(lambda c: c.get(key), code_of)
        return res if isinstance(res, bytes) else b""

    def get_batch(self, keys: Sequence[str]) -> list[bytes]:
        """A value per key; b"" where absent or failed."""
        res = self._call(lambda c: c.batch_get(list(keys)), code_of)
        if not isinstance(res, list):
            return [b""] * len(keys)
        return [bytes(v) if v is not None else b"" for v in res]

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Bytes read into (buffer_ptr, size), or a negative code."""
        return int(self._call(lambda c: c.get_into(key, view_at(buffer_ptr, size)), code_of))

    def batch_get_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        def run(c: Any) -> list[int]:
            views, out = _views(keys, buffer_ptrs, sizes)
            good = [i for i, v in enumerate(views) if isinstance(v, memoryview)]
            results = c.batch_get_into([keys[i] for i in good], [views[i] for i in good])
            for i, r in zip(good, results, strict=True):
                out[i] = r if isinstance(r, int) else code_of(r)
            return out

        return _per_key(self._call(run, code_of), len(keys))

    def is_exist(self, key: str) -> int:
        """1 present, 0 absent, negative on error."""
        return int(self._call(lambda c: int(c.exists(key)), code_of))

    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        res = self._call(lambda c: [int(b) for b in c.batch_exists(list(keys))], code_of)
        return _per_key(res, len(keys))

    def get_size(self, key: str) -> int:
        def run(c: Any) -> int:
            size = c.size_of(key)
            return int(ErrorCode.OBJECT_NOT_FOUND) if size is None else int(size)

        return int(self._call(run, code_of))

    # -- buffers ----------------------------------------------------------------

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Register memory for zero-copy *_from / *_into (overlap -> INVALID_PARAMS)."""
        res = self._call(lambda c: c.register_buffer(view_at(buffer_ptr, size)), code_of)
        return int(res or 0)

    def unregister_buffer(self, buffer_ptr: int) -> int:
        def unregister_code(exc: BaseException) -> int:
            if isinstance(exc, NotFoundError):
                return int(ErrorCode.INVALID_PARAMS)  # Mooncake's answer for an unknown buffer
            return code_of(exc)

        res = self._call(lambda c: c.unregister_buffer(view_at(buffer_ptr, 1)), unregister_code)
        return int(res or 0)

    # -- removal ----------------------------------------------------------------

    def remove(self, key: str, force: bool = False) -> int:
        def run(c: Any) -> int:
            return 0 if c.remove(key, force=force) else int(ErrorCode.OBJECT_NOT_FOUND)

        return int(self._call(run, remove_code))

    def remove_all(self, force: bool = False) -> int:
        """Remove every object of this tenant; the number removed (leased ones stay
        unless `force`), or a negative code."""
        if self._client is None:
            return NOT_READY
        try:
            return mooncake_admin.remove_all(self._master, self._tenant, force)
        except KVStoreError as exc:
            return code_of(exc)


def _views(
    keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
) -> tuple[list[memoryview | None], list[int]]:
    """A view per key (None where its range is bad) and the per-key codes so far."""
    if not len(keys) == len(ptrs) == len(sizes):
        raise BadRequestError(f"{len(keys)} keys, {len(ptrs)} buffers, {len(sizes)} sizes")
    views: list[memoryview | None] = []
    out = [int(ErrorCode.OK)] * len(keys)
    for i, (ptr, size) in enumerate(zip(ptrs, sizes, strict=True)):
        try:
            views.append(view_at(ptr, size))
        except BadRequestError:
            views.append(None)
            out[i] = int(ErrorCode.INVALID_PARAMS)
    return views, out


def _per_key(res: list[int] | int, n: int) -> list[int]:
    """A whole-call failure (an int code) becomes that code for every key."""
    return res if isinstance(res, list) else [int(res)] * n
