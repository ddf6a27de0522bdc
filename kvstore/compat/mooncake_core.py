"""The Mooncake facade's core: lifecycle, object puts/gets, queries, buffers, removal.

`StoreCore` holds one kvstore `Client` and turns every outcome into Mooncake's
integer codes (never an exception through the caller). The multi-buffer and
tensor forms build on it (mooncake_multi.py, mooncake_tensor_api.py).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import random
import re
import socket
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any, TypeVar

from kvstore.compat import mooncake_admin, mooncake_ssd
from kvstore.compat.mooncake_codes import ErrorCode, code_of, put_code, remove_code
from kvstore.compat.mooncake_config import parse_size, put_options
from kvstore.compat.mooncake_mempool import MemPool
from kvstore.compat.mooncake_types import BufferHandle, ReplicaDescriptor
from kvstore.errors import BadRequestError, ExistsError, KVStoreError, NotFoundError

log = logging.getLogger("kvstore.compat.mooncake")
T = TypeVar("T")
MiB = 1 << 20
OK = int(ErrorCode.OK)
BAD = int(ErrorCode.INVALID_PARAMS)
NOT_READY = int(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS)
PORT_RANGE = (12300, 14300)  # where Mooncake picks a port when the hostname names none
_SETUP_KEYS = ("metadata_server", "global_segment_size", "local_buffer_size", "protocol",
               "rdma_devices", "master_server_addr", "tenant_id", "enable_ssd_offload",
               "ssd_offload_path")  # fmt: skip


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
    storage nodes do not publish NIXL metadata to the facade, so "nixl" is taken by name.
    """
    forced = os.environ.get("KVSTORE_TRANSPORT", "")
    if forced:
        return forced
    if protocol in ("tcp", "rdma", "", "auto"):
        return "auto"
    if protocol in ("shm", "nixl"):
        return protocol
    raise BadRequestError(f"unknown protocol {protocol!r}")


def _free_port(host: str) -> int:
    """A port in Mooncake's range that nothing on `host` listens on now (a name only)."""
    ports = list(range(*PORT_RANGE))
    random.shuffle(ports)
    for port in ports[:64]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1" if host in ("localhost", "") else host, port))
            except OSError:
                continue
            return port
    return ports[0]


def _connect(
    master: str, protocol: str, segment_bytes: int, tenant_id: str,
    ssd: mooncake_ssd.SsdOffload | None = None,
) -> Any:  # fmt: skip
    """A kvstore Client on `master`, checked with one Stats call (fail at setup, as
    Mooncake); with `ssd`, its lent node has an SSD segment there too."""
    from kvstore.client.client import Client
    from kvstore.client.config import ClientConfig

    extra: dict[str, Any] = {}
    poll = os.environ.get("KVSTORE_BUSY_POLL_US", "").strip()  # setup() has no such knob
    if poll:
        try:
            extra["busy_poll_us"] = int(poll)
        except ValueError:
            raise BadRequestError(f"KVSTORE_BUSY_POLL_US={poll!r}: want microseconds") from None
    config = ClientConfig(
        master=master,
        transport=transport_for(protocol),
        segment_bytes=int(segment_bytes),
        tenant="" if tenant_id in ("", "default") else tenant_id,
        ssd_dir=ssd.directory if ssd else None,
        ssd_bytes=ssd.capacity if ssd else 0,
        **extra,
    )
    client = Client(config)
    try:
        client.stats()
    except BaseException:
        client.close()
        raise
    return client


# Stores still set up at interpreter exit are closed then: a client that lent a
# segment must unmount it and free its shared memory even when the caller (as
# Mooncake's own tests do) never calls close().
_LIVE: weakref.WeakSet[StoreCore] = weakref.WeakSet()


@atexit.register
def _close_live() -> None:
    for store in list(_LIVE):
        store.close()


def per_key(res: list[int] | int, n: int) -> list[int]:
    """A whole-call failure (an int code) becomes that code for every key."""
    return res if isinstance(res, list) else [int(res)] * n


class StoreCore:
    """Mooncake Store's object API over kvstore. Every method returns, never raises."""

    def __init__(self) -> None:
        self._client: Any = None
        self._master = ""
        self._tenant = ""
        self._hostname = ""
        self._local_buffer = 0
        self._ssd: mooncake_ssd.SsdOffload | None = None  # enable_ssd_offload's directory
        self._regions: dict[int, int] = {}  # registered buffers: address -> size
        self._mem = MemPool()  # alloc_from_mem_pool's mappings, unmapped at close
        # Mooncake leases an object to its writer too: keys put here, by put time. Its
        # own lock: callers' threads put at once (an OrderedDict iterated while another
        # thread mutates it raises RuntimeError, out of put(); a worker of Mooncake's
        # test_concurrent_stress_with_barrier that raises never reaches its barrier)
        self._written: OrderedDict[str, float] = OrderedDict()
        self._written_lock = threading.Lock()
        self._lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """`setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
        protocol, rdma_devices, master_server_addr, engine=None, enable_ssd_offload=False,
        ssd_offload_path="", tenant_id="default", enable_client_http_server=False,
        client_http_port=9300)` or `setup(config: dict)`. 0, or a negative code: bad
        arguments are -600, never an exception."""
        try:
            if len(args) == 1 and not kwargs and isinstance(args[0], dict):
                return self._setup(**_from_dict(args[0]))
            return self._setup(*args, **kwargs)
        except (BadRequestError, TypeError, ValueError) as exc:
            log.warning("setup: bad arguments: %s", exc)
            return BAD

    def _setup(
        self,
        local_hostname: str,
        metadata_server: str,
        global_segment_size: int | str,
        local_buffer_size: int | str,
        protocol: str,
        rdma_devices: str,
        master_server_addr: str,
        engine: object = None,
        enable_ssd_offload: bool = False,
        ssd_offload_path: str = "",
        tenant_id: str = "default",
        enable_client_http_server: bool = False,
        client_http_port: int = 9300,
    ) -> int:
        for name, value in (("local_hostname", local_hostname), ("protocol", protocol),
                            ("master_server_addr", master_server_addr),
                            ("tenant_id", tenant_id)):  # fmt: skip
            if not isinstance(value, str):
                raise BadRequestError(f"{name} must be a str, got {value!r}")
        segment = parse_size(global_segment_size, "global_segment_size")
        local = parse_size(local_buffer_size, "local_buffer_size")
        offload = mooncake_ssd.flag(enable_ssd_offload, "enable_ssd_offload")
        if offload and not segment:
            log.warning("setup: enable_ssd_offload without a global segment: no SSD is lent")
            offload = False
        with self._lock:
            if self._client is not None:
                return BAD
            ssd = mooncake_ssd.plan(ssd_offload_path, segment) if offload else None
            try:
                client = _connect(master_server_addr, protocol, segment, tenant_id, ssd)
            except Exception as exc:  # the API reports codes, never raises
                mooncake_ssd.remove(ssd)  # nothing is left behind
                log.warning("setup failed: %s", exc)
                return code_of(exc)
            self._client, self._master, self._local_buffer = client, master_server_addr, local
            self._ssd = ssd
            _LIVE.add(self)
            self._tenant = client.config.tenant
            host = local_hostname or "localhost"
            self._hostname = host if ":" in host else f"{host}:{_free_port(host)}"
        return OK

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """A client that lends no memory, as Mooncake's dummy client: here
        `server_address` is the kvstore master that the local store process (a
        `kvstore node` beside it) serves. Nothing is allocated for either size (Mooncake
        maps and populates `local_buffer_size` of shared memory): the larger is the
        staging limit of the non-zero-copy calls; `alloc_from_mem_pool` maps on demand."""
        return self.setup(
            "localhost", "P2PHANDSHAKE", 0, max(int(mem_pool_size), int(local_buffer_size)),
            "tcp", "", server_address,
        )  # fmt: skip

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int) -> int:
        """Mooncake's legacy one-call init on its default master (127.0.0.1:50051)."""
        return self.setup(
            "localhost", "P2PHANDSHAKE", mount_segment_size, 16 * MiB, protocol, device_name,
            os.environ.get("MOONCAKE_MASTER", "127.0.0.1:50051"),
        )  # fmt: skip

    def close(self) -> int:
        with self._lock:
            client, self._client = self._client, None
            ssd, self._ssd = self._ssd, None
        if client is not None:
            try:
                client.close()
            except Exception as exc:  # never raise through the engine
                log.warning("close: %s", exc)
                return code_of(exc)
            finally:
                mooncake_ssd.remove(ssd)  # its node is stopped: no later client serves it
                self._mem.release()  # no client reads or writes them any more
        return OK

    def alloc_from_mem_pool(self, size: int) -> int:
        """The address of `size` zeroed bytes of host memory, valid until `close()`, for
        `register_buffer` and the zero-copy calls; 0 before setup or when it cannot be
        mapped (Mooncake's "no memory"). Backed lazily: pages get memory when touched."""
        if self._client is None:
            return 0
        return self._mem.alloc(size)

    def get_offload_rpc_read_count(self) -> int:
        """Reads this store served from a LOCAL_DISK (SSD) replica since setup (Mooncake:
        its reads through the offload RPC of a FileStorage); 0 before setup."""
        client = self._client
        return 0 if client is None else int(client.ops.ctx.ssd_reads)

    def get_hostname(self) -> str:
        """ "host:port" as set up (a port in 12300..14300 when none was given); "" before."""
        return self._hostname

    def health_check(self) -> int:
        """0 when the master answers, else a negative code."""
        res = self._call(lambda c: c.stats(), code_of)
        return res if isinstance(res, int) else OK

    # -- helpers ------------------------------------------------------------------

    def _call(self, fn: Callable[[Any], T], on_error: Callable[[BaseException], int]) -> T | int:
        client = self._client
        if client is None:
            return NOT_READY
        try:
            return fn(client)
        except (KVStoreError, ValueError, TypeError, OverflowError) as exc:
            return on_error(exc)

    def _staged(self, nbytes: int) -> None:
        """Non-zero-copy calls stage through the local buffer in Mooncake: a value
        larger than `local_buffer_size` fails there with INVALID_PARAMS, and here."""
        if nbytes > self._local_buffer:
            raise BadRequestError(f"{nbytes} bytes exceed local_buffer_size {self._local_buffer}")

    def _write(
        self, c: Any, keys: Sequence[str], views: Sequence[Any], config: object, upsert: bool
    ) -> list[int]:
        """Put (or upsert) each key; a code per key. Keys are batched per option set."""
        if len(keys) != len(views):
            raise BadRequestError(f"{len(keys)} keys, {len(views)} values")
        opts = put_options(config, len(keys))
        out = [OK] * len(keys)
        for kw in _distinct(opts):
            idx = [i for i, o in enumerate(opts) if o == kw]
            errs = c.batch_put_from([keys[i] for i in idx], [views[i] for i in idx], **kw)
            again = []
            for i, err in zip(idx, errs, strict=True):
                if upsert and isinstance(err, ExistsError):
                    again.append(i)
                out[i] = put_code(err)
            for i in again:  # insert or update: replace the committed value
                c.remove(keys[i], force=True)
                errs = c.batch_put_from([keys[i]], [views[i]], **kw)
                out[i] = put_code(errs[0])
        self._note_written(c, [k for k, code in zip(keys, out, strict=True) if code == OK])
        return out

    def _note_written(self, c: Any, keys: Sequence[str]) -> None:
        now = time.monotonic()
        ttl = c.config.lease_ttl_s
        written = self._written
        with self._written_lock:
            for k in keys:
                written.pop(k, None)
                written[k] = now
            while written and next(iter(written.values())) < now - ttl:
                written.popitem(last=False)

    def _write_leased(self, key: str) -> bool:
        """Whether `key` was put here within a lease TTL (Mooncake's put lease)."""
        client = self._client
        t = self._written.get(key)
        return (
            client is not None
            and t is not None
            and t >= time.monotonic() - client.config.lease_ttl_s
        )

    def _write_one(self, key: str, view: Callable[[], Any], config: object, upsert: bool) -> int:
        return int(self._call(lambda c: self._write(c, [key], [view()], config, upsert)[0],
                              put_code))  # fmt: skip

    # -- writes -----------------------------------------------------------------

    def put(self, key: str, value: Any, config: object | None = None) -> int:
        return self._write_one(key, lambda: self._staged_view(value), config, False)

    def upsert(self, key: str, value: Any, config: object | None = None) -> int:
        return self._write_one(key, lambda: self._staged_view(value), config, True)

    def _staged_view(self, value: Any) -> memoryview:
        view = memoryview(value).cast("B")
        self._staged(view.nbytes)
        return view

    def put_from(self, key: str, buffer_ptr: int, size: int, config: object | None = None) -> int:
        return self._write_one(key, lambda: view_at(buffer_ptr, size), config, False)

    def upsert_from(
        self, key: str, buffer_ptr: int, size: int, config: object | None = None
    ) -> int:
        return self._write_one(key, lambda: view_at(buffer_ptr, size), config, True)

    def put_parts(self, key: str, *parts: Any, config: object | None = None) -> int:
        """Store the concatenation of `parts` (bytes-like) as one object."""
        return self._write_one(key, lambda: self._staged_view(_join(parts)), config, False)

    def upsert_parts(self, key: str, *parts: Any, config: object | None = None) -> int:
        return self._write_one(key, lambda: self._staged_view(_join(parts)), config, True)

    def put_from_with_metadata(
        self, key: str, buffer_ptr: int, metadata_buffer_ptr: int, size: int,
        metadata_size: int, config: object | None = None,
    ) -> int:  # fmt: skip
        """One object: the metadata bytes, then the data bytes (Mooncake's layout)."""
        return self._write_one(key, lambda: _join(
            [view_at(metadata_buffer_ptr, metadata_size), view_at(buffer_ptr, size)]
        ), config, False)  # fmt: skip

    def _batch(self, keys: Sequence[str], make: Callable[[], list[Any]], config: object,
               upsert: bool) -> list[int]:  # fmt: skip
        if len(keys) == 0:
            return []
        res = self._call(lambda c: self._write(c, keys, make(), config, upsert), put_code)
        return per_key(res, len(keys))

    def put_batch(self, keys: Sequence[str], values: Sequence[Any], config: object = None) -> int:
        """Store many values; 0, or the first failing key's code (one int, as Mooncake)."""
        codes = self._batch(keys, lambda: [self._staged_view(v) for v in values], config, False)
        return next((code for code in codes if code), OK)

    def upsert_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: object = None
    ) -> int:
        codes = self._batch(keys, lambda: [self._staged_view(v) for v in values], config, True)
        return next((code for code in codes if code), OK)

    def batch_put_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int],
        config: object = None,
    ) -> list[int]:  # fmt: skip
        return self._batch_from(keys, buffer_ptrs, sizes, config, False)

    def batch_upsert_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int],
        config: object = None,
    ) -> list[int]:  # fmt: skip
        return self._batch_from(keys, buffer_ptrs, sizes, config, True)

    def _batch_from(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int],
                    config: object, upsert: bool) -> list[int]:  # fmt: skip
        if not len(keys) == len(ptrs) == len(sizes):
            return [BAD] * len(keys)
        groups = getattr(config, "group_ids", None)
        if groups is not None and len(groups) != len(keys):
            return [BAD] * len(keys)  # one group id per key
        views, out = views_at(ptrs, sizes)
        good = [i for i, v in enumerate(views) if v is not None]
        codes = self._batch([keys[i] for i in good], lambda: [views[i] for i in good],
                            _config_for(config, good), upsert)  # fmt: skip
        for i, code in zip(good, codes, strict=True):
            out[i] = code
        return out

    # -- reads ------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        """The value, or b"" when absent or on any error (as Mooncake does)."""
        res = self._call(lambda c: self._checked(c.get(key)), code_of)
        return bytes(res) if isinstance(res, bytes | bytearray) else b""

    def _checked(self, value: bytes) -> bytes:
        self._staged(len(value))
        return value

    def get_batch(self, keys: Sequence[str]) -> list[bytes]:
        """A value per key; b"" where absent or failed."""
        res = self._call(lambda c: c.batch_get(list(keys)), code_of)
        if not isinstance(res, list):
            return [b""] * len(keys)
        return [bytes(v) if v is not None and len(v) <= self._local_buffer else b"" for v in res]

    def get_buffer(self, key: str) -> BufferHandle | None:
        """The value in a BufferHandle (buffer protocol, ptr(), size()); None when absent."""
        return self.batch_get_buffer([key])[0]

    def batch_get_buffer(self, keys: Sequence[str]) -> list[BufferHandle | None]:
        res = self._call(lambda c: self._get_handles(c, keys), code_of)
        return res if isinstance(res, list) else [None] * len(keys)

    def _get_handles(self, c: Any, keys: Sequence[str]) -> list[BufferHandle | None]:
        if not keys:
            return []
        sizes = _sizes(c, keys)
        handles = [BufferHandle(s) if s else None for s in sizes]
        idx = [i for i, h in enumerate(handles) if h is not None]
        results = c.batch_get_into([keys[i] for i in idx], [handles[i] for i in idx])
        for i, r in zip(idx, results, strict=True):
            if not isinstance(r, int) or r != sizes[i]:
                handles[i] = None  # gone or replaced between the size query and the read
        return handles

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Bytes read into (buffer_ptr, size), or a negative code."""
        return int(self._call(lambda c: c.get_into(key, view_at(buffer_ptr, size)), code_of))

    def batch_get_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [BAD] * len(keys)

        def run(c: Any) -> list[int]:
            views, out = views_at(buffer_ptrs, sizes)
            good = [i for i, v in enumerate(views) if v is not None]
            if good:
                results = c.batch_get_into([keys[i] for i in good], [views[i] for i in good])
                for i, r in zip(good, results, strict=True):
                    out[i] = r if isinstance(r, int) else code_of(r)
            return out

        return per_key(self._call(run, code_of), len(keys))

    # -- queries ------------------------------------------------------------------

    def is_exist(self, key: str) -> int:
        """1 present, 0 absent, negative on error."""
        return int(self._call(lambda c: int(c.exists(key)), code_of))

    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        if len(keys) == 0:
            return []
        res = self._call(lambda c: [int(b) for b in c.batch_exists(list(keys))], code_of)
        return per_key(res, len(keys))

    def get_size(self, key: str) -> int:
        def run(c: Any) -> int:
            size = c.size_of(key)
            return int(ErrorCode.OBJECT_NOT_FOUND) if size is None else int(size)

        return int(self._call(run, code_of))

    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        """The replicas of `key` with their tiers ([] when absent or on error)."""
        return self.batch_get_replica_desc([key]).get(key, [])

    def batch_get_replica_desc(self, keys: Sequence[str]) -> dict[str, list[ReplicaDescriptor]]:
        """Key -> its replicas, for the keys that exist (a pure query: no lease)."""
        res = self._call(lambda c: _replicas(c, keys), code_of)
        return res if isinstance(res, dict) else {}

    # -- buffers ----------------------------------------------------------------

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Register memory for zero-copy *_from / *_into (overlap -> INVALID_PARAMS)."""
        res = self._call(lambda c: c.register_buffer(view_at(buffer_ptr, size)), code_of)
        if not res:
            self._regions[buffer_ptr] = size
        return int(res or 0)

    def _room(self, ptr: int) -> int:
        """Bytes from `ptr` to the end of the registered buffer it lies in (unbounded
        for unregistered memory: the caller vouches for it, as with *_into)."""
        for base, size in tuple(self._regions.items()):  # (others register meanwhile)
            if base <= ptr < base + size:
                return base + size - ptr
        return 1 << 62

    def unregister_buffer(self, buffer_ptr: int) -> int:
        def unregister_code(exc: BaseException) -> int:
            if isinstance(exc, NotFoundError):
                return BAD  # Mooncake's answer for an unknown buffer
            return code_of(exc)

        res = self._call(lambda c: c.unregister_buffer(view_at(buffer_ptr, 1)), unregister_code)
        if not res:
            self._regions.pop(buffer_ptr, None)
        return int(res or 0)

    # -- removal ----------------------------------------------------------------

    def remove(self, key: str, force: bool = False) -> int:
        def run(c: Any) -> int:
            return 0 if c.remove(key, force=force) else int(ErrorCode.OBJECT_NOT_FOUND)

        return int(self._call(run, remove_code))

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]:
        """A code per key: 0 removed, -704 absent, -706 leased/pinned (unless force)."""
        return [self.remove(k, force) for k in keys]

    def remove_all(self, force: bool = False) -> int:
        """Remove every object of this tenant; how many were removed (leased ones stay
        unless `force`), or a negative code."""
        self._end_writer_leases()
        return self._admin(lambda: mooncake_admin.remove_all(self._master, self._tenant, force))

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Remove the keys matching `regex_pattern` (re.search); how many, or a code."""
        try:
            pattern = re.compile(regex_pattern)
        except (re.error, TypeError):
            return BAD
        self._end_writer_leases()
        return self._admin(
            lambda: mooncake_admin.remove_all(self._master, self._tenant, force, pattern)
        )

    def _end_writer_leases(self) -> None:
        """Before a remove_all: this store's writer leases end (Mooncake keeps no lease
        on a put, so its removeAll takes what this store just put; its reads' leases
        still keep theirs), and with them what its cache knows."""
        client = self._client
        if client is not None:
            with contextlib.suppress(KVStoreError):
                client.end_writer_leases()

    def _admin(self, fn: Callable[[], int]) -> int:
        if self._client is None:
            return NOT_READY
        try:
            return fn()
        except KVStoreError as exc:
            return code_of(exc)

    def batch_replica_clear(self, keys: Sequence[str], segment_name: str = "") -> list[str]:
        """Drop the replicas of `keys` whose leases expired; the keys cleared.

        `segment_name` "" clears each key with all its replicas; a segment name (a node
        id, or this client's own `get_hostname()`) drops only the key's replicas there,
        its other replicas stay readable (the object goes with its last one); a name
        holding none of a key's replicas clears nothing.
        """
        client = self._client
        if client is None or not keys:
            return []
        node = ""
        if segment_name:
            node = client.config.id if segment_name == self._hostname else segment_name
        cleared = []
        for key in keys:
            if self._write_leased(key):
                continue

            def run(c: Any, key: str = key) -> int:
                return 0 if c.remove(key, node_id=node) else int(ErrorCode.OBJECT_NOT_FOUND)

            if self._call(run, remove_code) == OK:
                cleared.append(key)
        return cleared


def _from_dict(cfg: dict[str, Any]) -> dict[str, Any]:
    """setup(dict): `local_hostname` and `metadata_server` required, Mooncake's defaults."""
    for required in ("local_hostname", "metadata_server"):
        if required not in cfg:
            raise BadRequestError(f"setup config needs {required!r}")
    kw: dict[str, Any] = {"global_segment_size": 16 * MiB, "local_buffer_size": 16 * MiB,
                          "protocol": "tcp", "rdma_devices": "",
                          "master_server_addr": "127.0.0.1:50051"}  # fmt: skip
    # aliases some callers write (LMCache 0.5's config names); Mooncake's own keys win
    for alias, key in (("master_server_address", "master_server_addr"),
                       ("device_name", "rdma_devices")):  # fmt: skip
        if alias in cfg and key not in cfg:
            kw[key] = cfg[alias]
    kw.update({k: cfg[k] for k in _SETUP_KEYS if k in cfg})
    if isinstance(kw.get("tenant_id"), str) and not kw["tenant_id"].strip():
        kw["tenant_id"] = "default"
    return {"local_hostname": cfg["local_hostname"], **kw}


_CONFIG_FIELDS = ("replica_num", "soft_pin_action", "soft_pin_ttl_ms", "with_soft_pin",
                  "with_hard_pin")  # what put_options reads, besides group_ids  # fmt: skip


def _config_for(config: object, idx: Sequence[int]) -> object:
    """`config` for the keys `idx` of a batch: its group ids picked per key (the other
    settings are the batch's)."""
    groups = getattr(config, "group_ids", None)
    if config is None or groups is None:
        return config
    fields = {f: getattr(config, f) for f in _CONFIG_FIELDS if hasattr(config, f)}
    return SimpleNamespace(**fields, group_ids=[groups[i] for i in idx])


def _distinct(opts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    for o in opts:
        if o not in seen:
            seen.append(o)
    return seen


def _join(parts: Sequence[Any]) -> memoryview:
    out = bytearray()
    for p in parts:
        out += memoryview(p).cast("B")
    return memoryview(out)


def _sizes(c: Any, keys: Sequence[str]) -> list[int]:
    return [s or 0 for s in c.run(c.ops.batch_size_of(list(keys)))]


def _replicas(c: Any, keys: Sequence[str]) -> dict[str, list[ReplicaDescriptor]]:
    from kvstore.client.reads import lookup_op
    from kvstore.edge import from_pb_location

    if not keys:
        return {}
    wire = [c.config.wire_key(k) for k in keys]
    found = c.run(lookup_op(c.ops.ctx, wire, 0))
    out: dict[str, list[ReplicaDescriptor]] = {}
    for key, res in zip(keys, found, strict=True):
        if res.status.code == 0:
            out[key] = [ReplicaDescriptor(from_pb_location(r)) for r in res.replicas]
    return out


def views_at(ptrs: Sequence[int], sizes: Sequence[int]) -> tuple[list[Any], list[int]]:
    """A view per (ptr, size) (None where the range is bad) and the per-key codes so far."""
    views: list[Any] = []
    out = [OK] * len(ptrs)
    for i, (ptr, size) in enumerate(zip(ptrs, sizes, strict=True)):
        try:
            views.append(view_at(ptr, size))
        except BadRequestError:
            views.append(None)
            out[i] = BAD
    return views, out
