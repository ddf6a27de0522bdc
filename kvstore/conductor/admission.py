"""Early rejection: refuse a request now when its objective would be missed anyway.

A rejection is a `RejectedError` (RESOURCE_EXHAUSTED) whose `retry_after_s` is
the predicted wait until the objective could be met: for TTFT, how much the
queue must drain; for TBT or KV memory, about one decode of this request (the
time for running streams to finish and free their slots). `None` when even an
idle node misses the objective: no wait helps.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.conductor.api import Request
from kvstore.conductor.errors import RejectedError
from kvstore.conductor.estimate import DecodeEstimate


def check_ttft(req: Request, ttft_s: float, floor_s: float) -> None:
    """Reject when the predicted TTFT misses the request's TTFT objective."""
    slo = req.ttft_slo_s
    if slo is None or ttft_s <= slo:
        return
    retry = None if floor_s > slo else ttft_s - slo
    raise RejectedError(
        f"request {req.request_id}: predicted TTFT {ttft_s:.3f}s > objective {slo:.3f}s",
        retry_after_s=retry,
    )


def check_tbt(req: Request, dec: DecodeEstimate) -> None:
    """Reject when the predicted time between tokens misses the TBT objective."""
    slo = req.tbt_slo_s
    if slo is None or dec.tbt_s <= slo:
        return
    retry = None if dec.idle_tbt_s > slo else dec.tbt_s * max(req.output_tokens, 1)
    raise RejectedError(
        f"request {req.request_id}: predicted TBT {dec.tbt_s:.4f}s > objective {slo:.4f}s",
        retry_after_s=retry,
    )


def no_decode_space(req: Request, estimates: Sequence[DecodeEstimate]) -> RejectedError:
    """The error for a request whose KV fits on no decode node now."""
    need = req.prompt_tokens + req.output_tokens
    biggest = max((e.kv_capacity for e in estimates), default=0)
    retry = None
    if need <= biggest:
        retry = min(e.tbt_s for e in estimates) * max(req.output_tokens, 1)
    return RejectedError(
        f"request {req.request_id}: no decode node has {need} free KV tokens "
        f"(largest node holds {biggest})",
        retry_after_s=retry,
    )


def pick_decode(estimates: Sequence[DecodeEstimate], tbt_budget_s: float) -> DecodeEstimate | None:
    """The fitting node with the lowest pressure, max(TBT / budget, KV used fraction after).

    None when the request's KV fits nowhere.
    """
    fits = [e for e in estimates if e.fits]
    if not fits:
        return None
    return min(fits, key=lambda e: (decode_pressure(e, tbt_budget_s), e.node_id))


def decode_pressure(e: DecodeEstimate, tbt_budget_s: float) -> float:
    """How close a node is to its TBT budget or KV capacity, whichever is nearer (0..1+)."""
    used = 1.0 - e.kv_free_after / e.kv_capacity if e.kv_capacity else 1.0
    return max(e.tbt_s / tbt_budget_s, used)
