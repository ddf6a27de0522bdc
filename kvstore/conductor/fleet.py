"""A fleet of vLLM engines behind the conductor, routed by the KV events they publish.

grpc-free. Each engine is an OpenAI-compatible vLLM server (`vllm serve ...`,
http://HOST:PORT) that may also publish its prefix cache's KV events (ZMQ,
`--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'`). The fleet runs one
`KvEventIngester` per engine into one `DictPrefixIndex` (engine id -> the block hashes
it holds, as vLLM publishes them: 64-bit ints by default), hashes each request's
prompt the way vLLM does (`kvstore.hashing_vllm`: block size, algorithm, NONE_HASH
seed, and the tenant as vLLM's `cache_salt`) and hands the policy a `ClusterView` of
COLOCATED nodes over that index (local caches, not pooled): the policy's prefix match
is each engine's longest run of leading blocks, its load the conductor's own
accounting (`Ledger`).

    fleet = EngineFleet.from_config(config).start()
    view = fleet.view(ledger, now)            # healthy engines only
    hashes = fleet.hashes(prompt, tenant)     # what view.index matches against
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kvstore import hashing_vllm
from kvstore.conductor.api import ClusterView, Role
from kvstore.conductor.index import DictPrefixIndex
from kvstore.conductor.kv_events import IngestStats, KvEventIngester
from kvstore.conductor.ledger import Ledger, NodeInfo
from kvstore.errors import BadRequestError, UnavailableError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One vLLM engine: its id, OpenAI base URL and KV-event endpoints ("" = none)."""

    node_id: str
    url: str
    events: str = ""
    replay: str = ""

    @classmethod
    def parse(cls, text: str, events: str = "", replay: str = "") -> EngineSpec:
        """`[NAME=]http://HOST:PORT`; the id is NAME, else HOST:PORT."""
        name, sep, url = text.strip().partition("=")
        if not sep:
            name, url = "", name
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
            raise BadRequestError(f"bad vLLM engine {text!r}: want [NAME=]http://HOST:PORT")
        for endpoint in (events, replay):
            if endpoint and not endpoint.startswith(("tcp://", "ipc://")):
                raise BadRequestError(f"bad KV-event endpoint {endpoint!r}: want tcp://HOST:PORT")
        return cls(name or parts.netloc, url.rstrip("/"), events, replay)


@dataclass(frozen=True, slots=True)
class VllmHashing:
    """How the engines name their blocks: `--block-size`, `--prefix-caching-hash-algo`
    and the engines' PYTHONHASHSEED (`seed`; None: they run without one, so NONE_HASH is
    vLLM's fixed "vllm-none-hash", whatever this process's own environment says)."""

    block_size: int = 16
    algorithm: str = "sha256"
    seed: str | None = None

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise BadRequestError(f"vllm_block_size must be > 0, got {self.block_size}")
        if self.algorithm not in hashing_vllm.ALGORITHMS:
            raise BadRequestError(
                f"unknown vLLM hash {self.algorithm!r}; valid: {', '.join(hashing_vllm.ALGORITHMS)}"
            )
        if self.algorithm.startswith("xxhash") and self.seed is None:
            raise BadRequestError(
                "vLLM's xxhash hashes need the engines' PYTHONHASHSEED: give vllm_hash_seed"
            )

    def hashes(self, tokens: Sequence[int], tenant: str = "") -> list[int]:
        """The prompt's full-block hashes as vLLM's KV events carry them (salted by tenant)."""
        seed = hashing_vllm.DEFAULT_SEED if self.seed is None else self.seed
        full = hashing_vllm.block_hashes(
            tokens, self.block_size, self.algorithm, seed=seed, cache_salt=tenant or None
        )
        return [hashing_vllm.as_event_int(h) for h in full]


def specs_from(
    urls: Sequence[str], events: Sequence[str], replays: Sequence[str]
) -> tuple[EngineSpec, ...]:
    """Engines paired with their event endpoints by position (one per engine, or none)."""
    for what, values in (("kv_events", events), ("kv_events_replay", replays)):
        if values and len(values) != len(urls):
            raise BadRequestError(
                f"{what}: {len(values)} endpoint(s) for {len(urls)} vLLM engine(s); give one "
                "per engine, in the same order"
            )
    specs = tuple(
        EngineSpec.parse(u, events[i] if events else "", replays[i] if replays else "")
        for i, u in enumerate(urls)
    )
    ids = [s.node_id for s in specs]
    if len(set(ids)) != len(ids):
        raise BadRequestError(f"vLLM engine ids must be distinct: {ids}")
    return specs


class EngineFleet:
    """vLLM engines, what each holds (from its KV events) and whether it answers."""

    def __init__(
        self,
        specs: Sequence[EngineSpec],
        hashing: VllmHashing,
        model: str = "",
        kv_tokens: int = 1 << 20,
        topic: str = "",
    ) -> None:
        if not specs:
            raise BadRequestError("a vLLM fleet needs at least one engine")
        self.specs = {s.node_id: s for s in specs}
        self.hashing, self.model, self.topic = hashing, model, topic
        self.index = DictPrefixIndex()
        blocks = max(kv_tokens // hashing.block_size, 1)
        self.infos = {
            s.node_id: NodeInfo(
                s.url, s.node_id, Role.COLOCATED, model or "vllm", hashing.block_size, blocks
            )
            for s in specs
        }
        self.ingesters: dict[str, KvEventIngester] = {}
        self.errors: dict[str, str] = dict.fromkeys(self.specs, "")

    def start(self) -> EngineFleet:
        """Start one ingester per engine that publishes events (zmq imported here)."""
        if any(s.events for s in self.specs.values()):
            try:
                import msgpack  # noqa: F401
                import zmq  # noqa: F401
            except ImportError as exc:
                raise BadRequestError(
                    f"KV events need pyzmq and msgpack ({exc}): pip install pyzmq msgpack"
                ) from None
        for s in self.specs.values():
            if s.events:
                ingester = KvEventIngester(self.index, s.node_id, s.events, s.replay, self.topic)
                self.ingesters[s.node_id] = ingester.start()
        return self

    def serves(self, model_id: str) -> bool:
        """Whether a request for `model_id` goes to this fleet ("" matches any)."""
        return not model_id or not self.model or model_id == self.model

    def set_health(self, node_id: str, error: str) -> None:
        if self.errors.get(node_id) != error:
            log.info("event=engine_health engine=%s healthy=%s error=%r", node_id, not error, error)
        self.errors[node_id] = error

    def healthy(self) -> list[EngineSpec]:
        return [s for s in self.specs.values() if not self.errors[s.node_id]]

    def view(self, ledger: Ledger, now: float) -> ClusterView:
        """The policy's view of the healthy engines; UnavailableError when none is."""
        engines = self.healthy()
        if not engines:
            why = "; ".join(f"{k}: {v}" for k, v in self.errors.items())
            raise UnavailableError(f"no healthy vLLM engine ({why})")
        nodes = tuple(ledger.node_state(self.infos[s.node_id], now) for s in engines)
        return ClusterView(nodes, self.index, pooled=False, block_tokens=self.hashing.block_size)

    def hashes(self, tokens: Sequence[int], tenant: str = "") -> list[int]:
        return self.hashing.hashes(tokens, tenant)

    def event_stats(self) -> dict[str, IngestStats]:
        return {k: i.stats for k, i in self.ingesters.items()}

    def close(self) -> None:
        for ingester in self.ingesters.values():
            ingester.close()
        self.ingesters.clear()

    def describe(self) -> dict[str, Any]:
        return {k: {"url": s.url, "events": s.events, "error": self.errors[k]}
                for k, s in self.specs.items()}  # fmt: skip
