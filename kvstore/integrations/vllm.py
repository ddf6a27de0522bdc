"""A native vLLM KV connector on kvstore: `KVStoreConnector` (a KVConnectorBase_V1).

    --kv-transfer-config '{"kv_connector": "KVStoreConnector", "kv_role": "kv_both",
        "kv_connector_module_path": "kvstore.integrations.vllm",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"master": "127.0.0.1:50051"}}'

Identity: vLLM's own block hashes (`request.block_hashes`, the hashes
kvstore.hashing_vllm reproduces), so what the pool holds is what vLLM's prefix
cache and KV events name. One object per (block, layer, K/V part):
`vllm/<model>/<dtype>/tp<r>/<layer>/<part>/<hash hex>`, moved zero-copy between the
registered KV cache tensors and the pool.

Scheduler side: `get_num_new_matched_tokens` is one MatchPrefix over the blocks'
last-layer keys (a block is complete once its last layer is there);
`update_state_after_alloc` records which allocated blocks to load;
`build_connector_meta` hands the worker its loads and the newly full blocks to save.
Worker side: `register_kv_caches` registers the KV tensors; `start_load_kv` reads
every block of every layer in one batched call; `save_kv_layer` writes a layer's new
blocks as the forward pass produces them; `wait_for_save` has nothing left to join
(saves are synchronous). A load that fails (pool lost, key evicted) reports its
blocks through `get_block_ids_with_load_errors`: with kv_load_failure_policy
"recompute" vLLM recomputes them; wrong KV is never read (the read fills a block
only when every byte arrived). Failures are counted and logged once.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from kvstore.compat.mooncake_core import view_at
from kvstore.errors import ExistsError, KVStoreError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)


@dataclass
class BlockMove:
    """One request's blocks to move: (block hash hex, block id) pairs."""

    req_id: str
    blocks: list[tuple[str, int]]


@dataclass
class KVStoreConnectorMetadata(KVConnectorMetadata):
    loads: list[BlockMove] = field(default_factory=list)
    saves: list[BlockMove] = field(default_factory=list)


@dataclass
class _ReqState:
    request: Any
    block_ids: list[int]
    saved: int  # leading blocks already in the pool (loaded or saved)


class KVStoreConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: Any = None) -> None:  # fmt: skip
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        from kvstore.client.client import Client

        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        master = extra.get("master") or os.environ.get("KVSTORE_MASTER", "")
        if not master:
            raise ValueError("KVStoreConnector needs extra_config.master or $KVSTORE_MASTER")
        self.client = Client(str(master), transport=str(extra.get("transport", "auto")),
                             timeout_s=float(extra.get("timeout_s", 10.0)))  # fmt: skip
        self.block_size = vllm_config.cache_config.block_size
        model = vllm_config.model_config
        self.num_layers = model.get_num_layers(vllm_config.parallel_config)
        name = model.model.rstrip("/").split("/")[-1]
        rank = vllm_config.parallel_config.rank
        self.prefix = f"vllm/{name}/{str(model.dtype).removeprefix('torch.')}/tp{rank}"
        self.num_blocks = getattr(kv_cache_config, "num_blocks", 0)
        self.parts = 2
        # scheduler side
        self._reqs: dict[str, _ReqState] = {}
        self._loads: dict[str, BlockMove] = {}
        # worker side
        self._layers: list[str] = []
        self._views: dict[str, list[list[memoryview]]] = {}  # layer -> block -> part views
        self._failed_blocks: set[int] = set()
        self.failures = 0

    # -- keys -------------------------------------------------------------------

    def _key(self, layer: int, part: int, hash_hex: str) -> str:
        return f"{self.prefix}/{layer}/{part}/{hash_hex}"

    def _complete_key(self, hash_hex: str) -> str:
        """A block is in the pool once its last layer is (layers are saved in order; the
        scheduler never sees the KV layout, so part 0 names it)."""
        return self._key(self.num_layers - 1, 0, hash_hex)

    # -- scheduler side -----------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        hashes = [h.hex() for h in request.block_hashes]
        limit = (request.num_prompt_tokens - 1) // self.block_size  # one token must compute
        hashes = hashes[:limit]
        self._reqs[request.request_id] = _ReqState(request, [], 0)
        if not hashes:
            return 0, False
        try:
            hit = self.client.match_prefix([self._complete_key(h) for h in hashes]).pool_length
        except KVStoreError as exc:
            self._failed("lookup", exc)
            return 0, False
        self._reqs[request.request_id].saved = hit
        return max(0, hit * self.block_size - num_computed_tokens), False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:  # fmt: skip
        state = self._reqs.setdefault(request.request_id, _ReqState(request, [], 0))
        state.block_ids = list(blocks.get_block_ids()[0])
        if num_external_tokens <= 0:
            return
        first = request.num_computed_tokens // self.block_size
        last = (request.num_computed_tokens + num_external_tokens) // self.block_size
        hashes = [h.hex() for h in request.block_hashes]
        moves = [(hashes[i], state.block_ids[i]) for i in range(first, last)]
        self._loads[request.request_id] = BlockMove(request.request_id, moves)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = KVStoreConnectorMetadata(loads=list(self._loads.values()))
        self._loads.clear()
        for new in scheduler_output.scheduled_new_reqs:
            state = self._reqs.get(new.req_id)
            if state is not None:
                state.block_ids = list(new.block_ids[0])
                done = new.num_computed_tokens + scheduler_output.num_scheduled_tokens[new.req_id]
                self._add_saves(meta, new.req_id, state, done)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self._reqs.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                if req_id in cached.resumed_req_ids:
                    state.block_ids = list(new_ids[0])
                else:
                    state.block_ids.extend(new_ids[0])
            done = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens[req_id]
            self._add_saves(meta, req_id, state, done)
        return meta

    def _add_saves(self, meta: KVStoreConnectorMetadata, req_id: str, state: _ReqState,
                   done_tokens: int) -> None:  # fmt: skip
        """The prompt's blocks that are full after this step and not yet in the pool."""
        request = state.request
        full = min(done_tokens, request.num_prompt_tokens) // self.block_size
        full = min(full, len(request.block_hashes), len(state.block_ids))
        if full <= state.saved:
            return
        hashes = [h.hex() for h in request.block_hashes]
        moves = [(hashes[i], state.block_ids[i]) for i in range(state.saved, full)]
        meta.saves.append(BlockMove(req_id, moves))
        state.saved = full

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:  # fmt: skip
        self._reqs.pop(request.request_id, None)
        self._loads.pop(request.request_id, None)
        return False, None  # saves are done by the end of each step

    # -- worker side --------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Register each layer's KV tensor; per block, the contiguous view of each part."""
        self._layers = sorted(kv_caches, key=_layer_index)
        seen: set[int] = set()
        for name in self._layers:
            t = kv_caches[name]
            nb = self.num_blocks or t.shape[1]
            dim = next(d for d, n in enumerate(t.shape) if n == nb)
            parts = [t] if dim == 0 else [t[i] for i in range(t.shape[0])]
            if dim > 1:
                raise ValueError(f"unsupported KV layout {tuple(t.shape)} for {name}")
            self.parts = len(parts)
            blocks: list[list[memoryview]] = []
            for b in range(nb):
                row = []
                for p in parts:
                    blk = p[b]
                    if not blk.is_contiguous():
                        raise ValueError(f"KV block {b} of {name} is not contiguous")
                    row.append(view_at(blk.data_ptr(), blk.numel() * blk.element_size()))
                blocks.append(row)
            self._views[name] = blocks
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:  # layers may share one allocation
                seen.add(storage.data_ptr())
                self.client.register_buffer(view_at(storage.data_ptr(), storage.nbytes()))

    def _moves(self, moves: list[BlockMove]) -> tuple[list[str], list[memoryview], list[int]]:
        keys, views, block_of = [], [], []
        for move in moves:
            for hash_hex, block_id in move.blocks:
                for li, name in enumerate(self._layers):
                    for part, view in enumerate(self._views[name][block_id]):
                        keys.append(self._key(li, part, hash_hex))
                        views.append(view)
                        block_of.append(block_id)
        return keys, views, block_of

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVStoreConnectorMetadata)
        if not meta.loads:
            return
        keys, views, block_of = self._moves(meta.loads)
        try:
            results = self.client.batch_get_into(keys, views)
        except KVStoreError as exc:
            self._failed("load", exc)
            self._failed_blocks.update(block_of)
            return
        bad = {b for b, r, v in zip(block_of, results, views, strict=True)
               if not (isinstance(r, int) and r == v.nbytes)}  # fmt: skip
        if bad:
            self._failed("load", KVStoreError(f"{len(bad)} blocks incomplete in the pool"))
            self._failed_blocks.update(bad)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv loaded every layer before the forward pass

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:  # fmt: skip
        meta = self._get_connector_metadata()
        if not isinstance(meta, KVStoreConnectorMetadata) or not meta.saves:
            return
        if layer_name not in self._views:
            return
        li = self._layers.index(layer_name)
        keys, views = [], []
        for move in meta.saves:
            for hash_hex, block_id in move.blocks:
                for part, view in enumerate(self._views[layer_name][block_id]):
                    keys.append(self._key(li, part, hash_hex))
                    views.append(view)
        try:
            errs = self.client.batch_put_from(keys, views)
        except KVStoreError as exc:
            self._failed("save", exc)
            return
        failed = [e for e in errs if e is not None and not isinstance(e, ExistsError)]
        if failed:
            self._failed("save", failed[0])

    def wait_for_save(self) -> None:
        return  # save_kv_layer wrote each layer synchronously

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._failed_blocks = self._failed_blocks, set()
        return out

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        if self.failures == 1:
            log.warning("kvstore %s failed (blocks recomputed; counted from now on): %s",
                        what, exc)  # fmt: skip

    def shutdown(self) -> None:
        self.client.close()


def _layer_index(name: str) -> tuple[int, str]:
    digits = [int(p) for p in name.replace(".", " ").split() if p.isdigit()]
    return (digits[0] if digits else 0, name)
