"""Prometheus metrics of kvstore services (prometheus-client), one registry per server.

    endpoint = MetricsEndpoint.start("127.0.0.1:0", [RpcMetrics("master"), collector])
    endpoint.address          # GET http://ADDRESS/metrics; endpoint.close()

What is exported:

- every gRPC server (kvstore.edge): `kvstore_rpc_seconds{component,method,code}`;
- the master (`MasterCollector`): per node, tier and segment `kvstore_tier_capacity_bytes`,
  `_used_bytes`, `_objects`, `_hits_total`, `_evictions_total`, `_bytes_in_total`,
  `_bytes_out_total`, and the tier-move counters (`_offloads_in_total`,
  `_promotions_in_total`, `_corrupt_total`: read with a default of 0, so a master core
  without them exports zeros); pool totals `kvstore_pool_*`; nodes alive and heartbeat ages;
- serving nodes and the conductor (`ServingMetrics`): TTFT and TBT histograms;
- queue depths, `kvstore_queue_depth{queue}`: a prefill node's `prefill_waiting` /
  `prefill_running` (`QueueCollector`), a decode node's `decode_batch` (sequences in the
  running batch) / `decode_waiting`, the master's tier moves `master_moves_pending` /
  `master_moves_inflight`, the conductor's in-flight `prefill` / `decode`
  (`ConductorCollector`, with the vLLM fleet's KV-event counts);
- a storage node (`NodeCollector`, `kvstore node --metrics-listen`): its segments'
  capacity and use, transfers served, tier moves done and failed.

A collector runs on the HTTP server's thread; the master's state belongs to its asyncio
loop, so `MasterCollector` reads a snapshot computed on that loop (`on_loop`).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvstore.errors import BadRequestError, UnavailableError

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Per-segment counters a master's Stats may carry; absent ones export as 0.
SEGMENT_COUNTERS = (
    "hits", "evictions", "bytes_in", "bytes_out", "offloads_in", "promotions_in", "corrupt",
)  # fmt: skip
POOL_COUNTERS = (
    "hits", "misses", "evictions", "reclaimed_puts", "dead_nodes", "dropped_replicas",
    "offloads", "promotions", "promotions_skipped", "corrupt_replicas", "adopted",
    "failed_moves",
)  # fmt: skip


class RpcMetrics:
    """RPC latency histogram of one server (a Collector: register it in a registry)."""

    def __init__(self, component: str) -> None:
        self.component = component
        self.seconds = Histogram(
            "kvstore_rpc_seconds", "gRPC call latency on the server", ["component", "method",
            "code"], buckets=LATENCY_BUCKETS, registry=None,
        )  # fmt: skip

    def observe(self, method: str, seconds: float, context: Any = None) -> None:
        self.seconds.labels(self.component, method, _code_name(context)).observe(seconds)

    def collect(self) -> Iterator[Metric]:
        yield from self.seconds.collect()


def _code_name(context: Any) -> str:
    try:
        code = context.code() if context is not None else None
    except Exception:  # an aio context before a status is set, or an older grpcio
        code = None
    if code is None:
        return "OK"
    return getattr(code, "name", str(code))


class ServingMetrics:
    """TTFT / TBT histograms and queue depths of a serving node or the conductor."""

    def __init__(self, component: str, queue_depth: Callable[[], dict[str, int]] | None = None):
        self.component = component
        self.queue_depth = queue_depth
        labels = ["component"]
        self.ttft = Histogram(
            "kvstore_ttft_seconds", "time to first token", labels, buckets=TOKEN_BUCKETS,
            registry=None,
        )  # fmt: skip
        self.tbt = Histogram(
            "kvstore_tbt_seconds", "time between tokens", labels, buckets=LATENCY_BUCKETS,
            registry=None,
        )  # fmt: skip

    def observe_request(self, ttft_s: float, token_times_s: Sequence[float]) -> None:
        """One finished request: its TTFT and the gaps between its tokens."""
        if ttft_s >= 0:
            self.ttft.labels(self.component).observe(ttft_s)
        for a, b in itertools.pairwise(token_times_s):
            self.tbt.labels(self.component).observe(max(0.0, b - a))

    def observe_gaps(self, ttft_s: float, gaps_s: Sequence[float]) -> None:
        """One stream: its TTFT and the time between its tokens."""
        self.ttft.labels(self.component).observe(ttft_s)
        tbt = self.tbt.labels(self.component)
        for gap in gaps_s:
            tbt.observe(gap)

    def collect(self) -> Iterator[Metric]:
        yield from self.ttft.collect()
        yield from self.tbt.collect()
        if self.queue_depth is not None:
            yield _queue_gauge(self.queue_depth())


class ConductorCollector:
    """The conductor's queues (`kvstore_queue_depth{queue="prefill"|"decode"}`: prefills
    and decode streams it has in flight) and, per vLLM engine, the KV events it ingested
    (`kvstore_kv_events_total{engine,kind}`) and the blocks it believes the engine holds
    (`kvstore_kv_event_blocks{engine}`). Both callables run on the scrape thread and only
    read plain counters."""

    def __init__(
        self,
        queue_depth: Callable[[], dict[str, int]],
        event_counts: Callable[[], dict[str, dict[str, int]]] = dict,
    ) -> None:
        self.queue_depth, self.event_counts = queue_depth, event_counts

    def collect(self) -> Iterator[Metric]:
        yield _queue_gauge(self.queue_depth())
        counts = self.event_counts()
        events = CounterMetricFamily(
            "kvstore_kv_events", "vLLM KV events ingested", labels=["engine", "kind"]
        )
        held = GaugeMetricFamily(
            "kvstore_kv_event_blocks", "blocks an engine holds, by its events", labels=["engine"]
        )
        for engine, c in sorted(counts.items()):
            for kind in ("stored", "removed", "cleared", "bad", "batches"):
                events.add_metric([engine, kind], c.get(kind, 0))
            held.add_metric([engine], c.get("held", 0))
        yield events
        yield held


def _queue_gauge(depths: dict[str, int]) -> GaugeMetricFamily:
    g = GaugeMetricFamily("kvstore_queue_depth", "requests waiting or in flight", labels=["queue"])
    for name, depth in sorted(depths.items()):
        g.add_metric([name], depth)
    return g


def on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], Any], timeout_s: float = 5.0) -> Any:
    """Run `fn` on `loop` from another thread and return its result."""

    async def call() -> Any:
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout_s)


class MasterCollector:
    """The master's Stats as Prometheus metrics; `snapshot` returns a `queries.MasterStats`."""

    def __init__(self, snapshot: Callable[[], Any]) -> None:
        self.snapshot = snapshot

    @classmethod
    def for_state(cls, state: Any, loop: asyncio.AbstractEventLoop) -> MasterCollector:
        from kvstore.master import queries

        return cls(
            lambda: on_loop(loop, lambda: (queries.stats(state), state.clock(), _moves(state)))
        )

    def collect(self) -> Iterator[Metric]:
        try:
            stats, now, *rest = self.snapshot()
        except Exception:  # the loop is stopping: export nothing rather than fail the scrape
            return
        if rest:  # the tier moves queued for the nodes and handed to them, not yet done
            yield _queue_gauge(rest[0])
        yield from _segment_metrics(stats.segments)
        yield from _pool_metrics(stats)
        ages = GaugeMetricFamily(
            "kvstore_node_heartbeat_age_seconds", "since a node's last heartbeat", labels=["node"]
        )
        for n in stats.nodes:
            ages.add_metric([n.node_id], max(0.0, now - n.last_heartbeat))
        yield ages
        yield GaugeMetricFamily("kvstore_nodes", "nodes alive", value=len(stats.nodes))


def _moves(state: Any) -> dict[str, int]:
    tiering = getattr(state, "tiering", None)
    if tiering is None:
        return {}
    pending = sum(len(q) for q in tiering.pending.values())
    return {"master_moves_pending": pending, "master_moves_inflight": len(tiering.inflight)}


class QueueCollector:
    """`kvstore_queue_depth{queue}` of a serving node: `depths` (a callable run on the scrape
    thread; it must only read counters under their own locks)."""

    def __init__(self, depths: Callable[[], dict[str, int]]) -> None:
        self.depths = depths

    def collect(self) -> Iterator[Metric]:
        yield _queue_gauge(self.depths())


class NodeCollector:
    """A storage node's own view (`kvstore node --metrics-listen`): the bytes each lent
    segment has (`kvstore_node_segment_bytes{node,tier,segment}`), the data-plane
    connections it serves, and the master's tier moves it ran (`kvstore_node_moves_total
    {node,outcome}`). The pool-wide use of each segment is the master's
    `kvstore_tier_used_bytes`."""

    def __init__(self, node: Any) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        node_id = self.node.config.node_id
        sizes = GaugeMetricFamily(
            "kvstore_node_segment_bytes", "bytes a segment lends", labels=_SEG_LABELS
        )
        for seg in self.node.lent():
            tier = getattr(seg, "tier", None)
            sizes.add_metric([node_id, getattr(tier, "name", "SSD"), seg.name], seg.size)
        yield sizes
        conns = GaugeMetricFamily(
            "kvstore_node_connections", "data-plane connections served", labels=["node"]
        )
        conns.add_metric([node_id], self.node.server.connection_count())
        yield conns
        moves = CounterMetricFamily(
            "kvstore_node_moves", "tier moves run for the master", labels=["node", "outcome"]
        )
        worker = self.node.worker
        done, failed = (worker.done, worker.failed) if worker is not None else (0, 0)
        moves.add_metric([node_id, "done"], done - failed)
        moves.add_metric([node_id, "failed"], failed)
        yield moves


_SEG_LABELS = ["node", "tier", "segment"]


def _segment_metrics(segments: Sequence[Any]) -> Iterator[Metric]:
    gauges = {
        name: GaugeMetricFamily(f"kvstore_tier_{name}", help_, labels=_SEG_LABELS)
        for name, help_ in (
            ("capacity_bytes", "bytes lent to the pool"),
            ("used_bytes", "bytes allocated"),
            ("objects", "committed objects with a replica here"),
        )
    }
    counters = {
        name: CounterMetricFamily(f"kvstore_tier_{name}", f"{name} since mount", labels=_SEG_LABELS)
        for name in SEGMENT_COUNTERS
    }
    for s in segments:
        labels = [s.node_id, s.tier.name, s.name]
        gauges["capacity_bytes"].add_metric(labels, s.capacity)
        gauges["used_bytes"].add_metric(labels, s.used)
        gauges["objects"].add_metric(labels, s.objects)
        for name, family in counters.items():
            family.add_metric(labels, getattr(s.counters, name, 0))
    yield from gauges.values()
    yield from counters.values()


def _pool_metrics(stats: Any) -> Iterator[Metric]:
    yield GaugeMetricFamily("kvstore_pool_capacity_bytes", "pool capacity", value=stats.capacity)
    yield GaugeMetricFamily("kvstore_pool_used_bytes", "pool bytes used", value=stats.used)
    yield GaugeMetricFamily("kvstore_pool_objects", "objects known", value=stats.objects)
    yield GaugeMetricFamily("kvstore_pool_writing", "puts in flight", value=stats.writing)
    for name in POOL_COUNTERS:
        value = getattr(stats.counters, name, 0)
        yield CounterMetricFamily(f"kvstore_pool_{name}", f"pool {name}", value=value)


class MetricsEndpoint:
    """An HTTP /metrics server on its own thread with its own registry."""

    def __init__(self, server: Any, thread: threading.Thread, registry: CollectorRegistry):
        self.server = server
        self.thread = thread
        self.registry = registry
        host, port = server.server_address[:2]
        self.address = f"{host}:{port}"

    @classmethod
    def start(cls, listen: str, collectors: Sequence[Any]) -> MetricsEndpoint:
        host, sep, port = listen.rpartition(":")
        if not sep or not port.isdigit():
            raise BadRequestError(f"bad metrics address {listen!r}, want HOST:PORT")
        registry = CollectorRegistry(auto_describe=False)
        for c in collectors:
            registry.register(c)
        try:
            server, thread = start_http_server(int(port), host.strip("[]"), registry=registry)
        except OSError as exc:
            raise UnavailableError(f"cannot serve /metrics on {listen!r}: {exc}") from None
        return cls(server, thread, registry)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
