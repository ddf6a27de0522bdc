"""Generate on a vLLM fleet: place by the engines' KV events, relay the engine's stream.

The servicer (`service.py`) hands a request here when the conductor drives vLLM
engines (`--vllm`) and the request's model is theirs. The prompt (token ids) is
hashed as vLLM hashes it, salted with the request's tenant (vLLM's `cache_salt`,
which the engine is sent too, so a tenant's blocks match only its own requests, in
the conductor's index and in the engine's prefix cache alike); the conductor's
policy places it on a COLOCATED view of the healthy engines (`fleet.py`); the
request goes to that engine's `/v1/completions` as a stream with `return_token_ids`,
and its chunks are relayed as `ConductorGenerateResponse`s. vLLM's usage (the last
event) gives `cached_tokens`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from kvstore.conductor import openai_http
from kvstore.conductor.api import Decision, Request
from kvstore.conductor.base import PolicyBase
from kvstore.conductor.fleet import EngineFleet, EngineSpec
from kvstore.conductor.ledger import Ledger
from kvstore.errors import BadRequestError, KVStoreError, UnavailableError
from kvstore.v1 import conductor_pb2 as cpb
from kvstore.v1 import serving_pb2 as spb

FINISH = {"length": spb.FINISH_REASON_LENGTH, "stop": spb.FINISH_REASON_STOP}


@dataclass(slots=True)
class EnginePlan:
    spec: spb.GenerationSpec
    engine: EngineSpec
    decision: Decision
    policy: str
    tenant: str
    prefill_s: float
    arrival: float
    route_s: float
    timings: cpb.RequestTimings = field(default_factory=cpb.RequestTimings)

    def since(self) -> float:
        return time.perf_counter() - self.arrival


class FleetRunner:
    """Places and runs Generate requests on an `EngineFleet`."""

    def __init__(self, fleet: EngineFleet, ledger: Ledger, timeout_s: float) -> None:
        self.fleet, self.ledger, self.timeout_s = fleet, ledger, timeout_s

    def plan(self, request: cpb.ConductorGenerateRequest, policy: PolicyBase, tenant: str,
             arrival: float) -> EnginePlan:  # fmt: skip
        spec = spb.GenerationSpec()
        spec.CopyFrom(request.spec)
        if spec.prompt_text or not spec.prompt_token_ids:
            raise BadRequestError(
                "a vLLM fleet is routed by token ids: send prompt_token_ids (the conductor "
                "does not hold the engines' tokenizer)"
            )
        if spec.max_tokens < 1:
            raise BadRequestError("max_tokens must be >= 1")
        spec.request_id = spec.request_id or f"conductor-{time.monotonic_ns():x}"
        prompt = list(spec.prompt_token_ids)
        now = time.perf_counter()
        view = self.fleet.view(self.ledger, now)
        req = Request(
            request_id=spec.request_id, arrival_s=now, prompt_tokens=len(prompt),
            output_tokens=spec.max_tokens,
            block_hashes=tuple(self.fleet.hashes(prompt, tenant)),
            ttft_slo_s=request.slo.ttft_s or None, tbt_slo_s=request.slo.tbt_s or None,
        )  # fmt: skip
        decision = policy.place(req, view)
        wait = view.node(decision.prefill_node).est_queue_wait_s
        return EnginePlan(
            spec=spec, engine=self.fleet.specs[decision.decode_node], decision=decision,
            policy=policy.name, tenant=tenant,
            prefill_s=max(decision.predicted_ttft_s - wait, 0.0), arrival=arrival,
            route_s=time.perf_counter() - arrival,
        )  # fmt: skip

    def body(self, plan: EnginePlan) -> dict[str, Any]:
        """The engine's /v1/completions request."""
        s = plan.spec
        body: dict[str, Any] = {
            "prompt": list(s.prompt_token_ids), "max_tokens": s.max_tokens,
            "temperature": s.sampling.temperature, "top_p": s.sampling.top_p or 1.0,
            "stream": True, "return_token_ids": True, "request_id": s.request_id,
            "stream_options": {"include_usage": True},
        }  # fmt: skip
        if s.sampling.seed:
            body["seed"] = s.sampling.seed
        if s.stop_token_ids:
            body["stop_token_ids"] = list(s.stop_token_ids)
        if self.fleet.model:
            body["model"] = self.fleet.model
        if plan.tenant:
            body["cache_salt"] = plan.tenant
        return body

    async def run(self, plan: EnginePlan) -> AsyncGenerator[cpb.ConductorGenerateResponse, None]:
        """Stream the engine's tokens; the first message carries the placement, the last
        the timings (cached tokens from vLLM's usage)."""
        node, rid = plan.engine.node_id, plan.spec.request_id
        prompt_tokens = len(plan.spec.prompt_token_ids)
        self.ledger.start_prefill(node, rid, prompt_tokens, plan.prefill_s, time.perf_counter())
        self.ledger.start_decode(node, rid, prompt_tokens, plan.spec.max_tokens)
        sent, finish = 0, spb.FINISH_REASON_NONE
        url = f"{plan.engine.url}/v1/completions"
        try:
            async for event in openai_http.stream(url, self.body(plan), self.timeout_s):
                self._usage(plan, event)
                for choice in event.get("choices") or ():
                    tokens = [int(t) for t in choice.get("token_ids") or ()]
                    finish = FINISH.get(choice.get("finish_reason") or "", finish)
                    if not tokens:
                        continue
                    message = self._message(plan, sent, tokens)
                    if sent == 0:
                        self.ledger.finish_prefill(node, rid)
                    self.ledger.add_tokens(node, rid, len(tokens))
                    sent += len(tokens)
                    yield message
            yield self._last(plan, sent, finish or spb.FINISH_REASON_LENGTH)
        except UnavailableError as exc:
            self.fleet.set_health(node, str(exc))
            raise
        finally:
            self.ledger.finish_prefill(node, rid)
            self.ledger.finish_decode(node, rid)

    def _message(self, plan: EnginePlan, index: int, tokens: list[int]
                 ) -> cpb.ConductorGenerateResponse:  # fmt: skip
        now = plan.since()
        message = cpb.ConductorGenerateResponse(
            index=index, token_ids=tokens, token_times_s=[now] * len(tokens)
        )
        if index == 0:
            plan.timings.ttft_s = now
            message.placement.CopyFrom(self.placement(plan))
        return message

    @staticmethod
    def _usage(plan: EnginePlan, event: dict[str, Any]) -> None:
        usage = event.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            plan.timings.cached_tokens = int(details["cached_tokens"])

    def _last(self, plan: EnginePlan, index: int, finish: int) -> cpb.ConductorGenerateResponse:
        now = plan.since()
        t = plan.timings
        t.route_s, t.total_s = plan.route_s, now
        t.prompt_tokens = len(plan.spec.prompt_token_ids)
        message = cpb.ConductorGenerateResponse(index=index, finish_reason=finish)  # type: ignore[arg-type]  # proto enum: an int
        if index == 0:  # nothing came back: still say where it ran
            message.placement.CopyFrom(self.placement(plan))
        message.timings.CopyFrom(t)
        return message

    @staticmethod
    def placement(plan: EnginePlan) -> cpb.Placement:
        d = plan.decision
        return cpb.Placement(
            policy=plan.policy, prefill_node=d.prefill_node, decode_node=d.decode_node,
            local_prefill=True, cached_blocks=d.cached_blocks,
            predicted_ttft_s=d.predicted_ttft_s, predicted_tbt_s=d.predicted_tbt_s,
            reason=d.reason, source_node=d.source_node or "",
        )  # fmt: skip

    async def refresh_health(self) -> None:
        """GET /health of every engine (a failed one is left out of placement until it answers)."""
        await asyncio.gather(*(self._check(s) for s in self.fleet.specs.values()))

    async def _check(self, spec: EngineSpec) -> None:
        try:
            await openai_http.get(f"{spec.url}/health", timeout_s=min(self.timeout_s, 2.0))
            self.fleet.set_health(spec.node_id, "")
        except KVStoreError as exc:
            self.fleet.set_health(spec.node_id, str(exc))

    def status(self) -> list[cpb.NodeStatus]:
        """ClusterStatus rows of the engines (role colocated; the conductor's accounting)."""
        out = []
        now = time.perf_counter()
        for node_id, spec in self.fleet.specs.items():
            info = self.fleet.infos[node_id]
            load = self.ledger.load(node_id, now)
            error = self.fleet.errors[node_id]
            out.append(cpb.NodeStatus(
                address=spec.url, node_id=node_id, role="colocated", model_id=info.model_id,
                healthy=not error, error=error, block_tokens=info.block_tokens,
                total_blocks=info.total_blocks, inflight_prefills=load.prefills,
                inflight_prefill_tokens=load.prefill_tokens, inflight_decodes=load.decodes,
                reserved_kv_tokens=load.reserved_tokens, est_queue_wait_s=load.est_queue_wait_s,
                routed_prefills=load.routed_prefills, routed_decodes=load.routed_decodes,
            ))  # fmt: skip
        return out
