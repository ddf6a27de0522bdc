"""What a serving benchmark records per request, and the percentiles it reports.

Every time is in seconds on the load generator's clock (`time.perf_counter`).

    TTFT = first token in the client's hands - request sent
    TBT  = gaps between consecutive tokens of one request (token 1 on)

A streamed chunk may carry several tokens; each token's client time is then the
chunk's receipt time shifted back by the server-side gap to the chunk's last token,
so batching in the transport neither hides a gap nor invents a zero one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvstore.errors import BadRequestError


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it, plus the nodes' timing fields."""

    request_id: str
    kind: str  # workload class, e.g. "stream", "burst", "light", "turn"
    prompt_tokens: int
    sent_s: float
    token_s: list[float] = field(default_factory=list)  # client time of each new token
    tokens: list[int] = field(default_factory=list)
    prefill_done_s: float | None = None  # disaggregated: prefill response received
    cached_tokens: int = 0
    node_queue_s: float = 0.0  # waiting on the node that prefilled, before its compute
    compute_s: float = 0.0  # prefill compute on the node that prefilled
    publish_s: float = 0.0  # prefill node: time inside KV writes (overlaps compute)
    publish_wait_s: float = 0.0  # prefill node: waiting for KV writes after compute
    pull_s: float = 0.0  # decode node: reading the handoff's KV
    kv_bytes: int = 0  # bytes the prefill node published for this request
    pulled_bytes: int = 0  # bytes the decode node read from the pool
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.token_s)

    @property
    def ttft_s(self) -> float:
        return self.token_s[0] - self.sent_s

    def tbt_s(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.token_s)]

    def add_chunk(
        self, received_s: float, tokens: Sequence[int], server_times_s: Sequence[float]
    ) -> None:
        """Record the tokens of one streamed chunk (server times since its arrival;
        without them every token counts as received with the chunk)."""
        self.tokens.extend(tokens)
        if len(server_times_s) != len(tokens):
            self.token_s.extend(received_s for _ in tokens)
            return
        last = server_times_s[-1] if server_times_s else 0.0
        self.token_s.extend(received_s - (last - t) for t in server_times_s)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated q-th percentile (0..100) of a non-empty sample."""
    if not values:
        raise BadRequestError("percentile of an empty sample")
    if not 0.0 <= q <= 100.0:
        raise BadRequestError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


@dataclass(frozen=True, slots=True)
class Dist:
    """p50 / p99 / max of a sample, and its size."""

    n: int
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Dist:
        if not values:
            return cls(0, math.nan, math.nan, math.nan)
        return cls(len(values), percentile(values, 50), percentile(values, 99), max(values))

    def as_dict(self, scale: float = 1000.0) -> dict[str, float | int | None]:
        """Milliseconds by default; NaN becomes None so the JSON stays valid."""

        def num(x: float) -> float | None:
            return None if math.isnan(x) else round(x * scale, 3)

        return {"n": self.n, "p50": num(self.p50), "p99": num(self.p99), "max": num(self.max)}


@dataclass(frozen=True, slots=True)
class Summary:
    """TTFT and TBT of the chosen requests, how many failed, and KV handoff costs.

    kv_fraction: (time inside KV writes + KV pull) / prefill compute, per request;
    kv_exposed: the part that adds latency, (write wait after compute + pull) / compute.
    """

    requests: int
    failed: int
    ttft: Dist
    tbt: Dist
    prefill_ttft: Dist
    compute: Dist  # prefill compute on the node that prefilled
    node_queue: Dist  # waiting on that node before the compute (TTFT = queue + compute + ...)
    handoff: Dist  # disaggregated: prefill response -> first token from the decode node
    kv_fraction: Dist
    kv_exposed: Dist
    kv_bytes: int

    def as_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "failed": self.failed,
            "ttft_ms": self.ttft.as_dict(),
            "tbt_ms": self.tbt.as_dict(),
            "prefill_ttft_ms": self.prefill_ttft.as_dict(),
            "prefill_compute_ms": self.compute.as_dict(),
            "node_queue_ms": self.node_queue.as_dict(),
            "handoff_ms": self.handoff.as_dict(),
            "kv_fraction": self.kv_fraction.as_dict(scale=1.0),
            "kv_exposed_fraction": self.kv_exposed.as_dict(scale=1.0),
            "kv_bytes": self.kv_bytes,
        }


def kv_fractions(record: RequestRecord) -> tuple[float, float] | None:
    """(total, exposed) KV handoff time over prefill compute; None when nothing moved."""
    if record.kv_bytes <= 0 or record.compute_s <= 0:
        return None
    total = (record.publish_s + record.pull_s) / record.compute_s
    exposed = (record.publish_wait_s + record.pull_s) / record.compute_s
    return total, exposed


def summarize(records: Iterable[RequestRecord], kinds: Sequence[str] = ()) -> Summary:
    """Summary over the records of the given kinds (all kinds when empty)."""
    chosen = [r for r in records if not kinds or r.kind in kinds]
    ok = [r for r in chosen if r.ok]
    fractions = [f for r in ok if (f := kv_fractions(r)) is not None]
    handoff = [r for r in ok if r.prefill_done_s is not None]
    return Summary(
        requests=len(chosen),
        failed=len(chosen) - len(ok),
        ttft=Dist.of([r.ttft_s for r in ok]),
        tbt=Dist.of([gap for r in ok for gap in r.tbt_s()]),
        prefill_ttft=Dist.of(
            [d - r.sent_s for r in handoff if (d := r.prefill_done_s) is not None]
        ),
        compute=Dist.of([r.compute_s for r in ok if r.compute_s > 0]),
        node_queue=Dist.of([r.node_queue_s for r in ok if r.compute_s > 0]),
        handoff=Dist.of([r.token_s[0] - d for r in handoff if (d := r.prefill_done_s) is not None]),
        kv_fraction=Dist.of([f[0] for f in fractions]),
        kv_exposed=Dist.of([f[1] for f in fractions]),
        kv_bytes=sum(r.kv_bytes for r in ok),
    )
