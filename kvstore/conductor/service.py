"""The Conductor gRPC service: place each request with a policy, drive the nodes, relay tokens.

Generate: tokenize and validate the request (the serving nodes' own checks),
ask the master which prefix of the prompt the pool holds (MatchPrefix, as a
`MatchAnswerIndex`), build a `ClusterView` from the healthy nodes and the
conductor's own in-flight accounting (`Ledger`), and let the policy place it
(the code the simulator runs). Then either

- remote prefill: Prefill on the prefill node (its first token is relayed at
  once), then Decode on the decode node with the KV handoff, or
- local prefill: Generate on the decode node (a colocated node, or a decode node
  within its local-prefill limit: the policy reads that limit from the node's
  `NodeState`, so the simulator applies the same rule),

relaying tokens as they come. A cancelled client stream cancels the node calls
(grpc.aio cancels the handler; `finally` cancels what is open). An early rejection
ends the stream with RESOURCE_EXHAUSTED and, when a retry helps, trailing metadata
`retry-after-ms`.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator

import grpc

from kvstore.conductor.api import ClusterView, Decision, Request
from kvstore.conductor.base import PolicyBase
from kvstore.conductor.errors import RejectedError
from kvstore.conductor.fleet import EngineFleet
from kvstore.conductor.fleet_service import FleetRunner
from kvstore.conductor.index import MatchAnswerIndex, Run
from kvstore.conductor.ledger import Ledger
from kvstore.conductor.nodes import NodeDirectory, NodeEntry
from kvstore.conductor.plan import Counters, Plan, placement, retry_metadata
from kvstore.conductor.profiles import load_profile
from kvstore.conductor.registry import POLICIES, make_policy
from kvstore.conductor.rpc import GRPC_OPTIONS, rpc_error
from kvstore.conductor.service_config import ConductorConfig
from kvstore.conductor.tenants import TenantBook, tenant_of
from kvstore.errors import BadRequestError, KVStoreError, UnavailableError
from kvstore.rpc_errors import status_for
from kvstore.types import Tier
from kvstore.v1 import conductor_pb2 as cpb
from kvstore.v1 import conductor_pb2_grpc, master_pb2, master_pb2_grpc
from kvstore.v1 import serving_pb2 as spb

__all__ = ["GRPC_OPTIONS", "ConductorServicer", "rpc_error"]


class ConductorServicer(conductor_pb2_grpc.ConductorServicer):
    """Generate and ClusterStatus over the nodes of a `NodeDirectory`."""

    def __init__(
        self,
        config: ConductorConfig,
        directory: NodeDirectory,
        master: master_pb2_grpc.MasterStub | None,
        fleet: EngineFleet | None = None,
    ) -> None:
        self.config = config
        self.directory = directory
        self.master = master
        self.ledger = Ledger()
        self.counters = Counters()
        self._profile = load_profile(config.profile)
        self._policies: dict[str, PolicyBase] = {}
        self._fleet_policies: dict[str, PolicyBase] = {}
        self.tenants = TenantBook()  # policies keep per-cluster state
        self.fleet_runner = (
            None if fleet is None else FleetRunner(fleet, self.ledger, config.rpc_timeout_s)
        )

    def warm_up(self) -> None:
        """Build the default policy and load the tokenizer and namespaces before serving."""
        self.policy("")
        from kvstore.serving import convert  # noqa: F401  (imports torch once, up front)

    def policy(self, name: str, fleet: bool = False) -> PolicyBase:
        """The (stateful) policy instance of `name` ("" = the default) for the kvstore
        nodes or the vLLM fleet; BadRequestError listing the valid names for an unknown one."""
        name = name or self.config.policy
        policies = self._fleet_policies if fleet else self._policies
        if name not in policies:
            policies[name] = make_policy(
                name,
                latency=self._profile.latency,
                transfer=self._profile.transfer,
                tbt_budget_s=self.config.tbt_budget_s,
            )
        return policies[name]

    async def Generate(
        self, request: cpb.ConductorGenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cpb.ConductorGenerateResponse]:
        arrival = time.perf_counter()
        self.counters.requests += 1
        try:
            runner = await self._placed(request, context, arrival)
            async with contextlib.aclosing(runner):  # node calls end with this stream
                async for message in runner:
                    yield message
        except RejectedError as exc:
            self.counters.rejected += 1
            # The status is set and the stream ends without raising: `context.abort` would
            # raise an AbortError into grpc, whose handler keeps it in a reference cycle
            # (the call's state, the error, its traceback) together with this
            # rejection's chain through the policy's frames (~80 objects a rejection,
            # thousands in a burst) that only a full collection frees; those waiting
            # in between are what raised this process's RSS in the soak's bursts
            # (docs/reliability.md, "bench/soak.py"). Dropping the traceback breaks the
            # cycles a frame keeps to its own exception (a policy that holds one).
            context.set_trailing_metadata(retry_metadata(exc))
            context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
            context.set_details(str(exc))
            exc.__traceback__ = None
        except KVStoreError as exc:
            self.counters.failed += 1
            await context.abort(status_for(exc), str(exc))

    async def _placed(
        self,
        request: cpb.ConductorGenerateRequest,
        context: grpc.aio.ServicerContext,
        arrival: float,
    ) -> AsyncGenerator[cpb.ConductorGenerateResponse, None]:
        """Place the request; the token stream of where it runs."""
        tenant = tenant_of(context.invocation_metadata())
        fleet = self.fleet_runner
        if fleet is not None and fleet.fleet.serves(request.spec.model_id):
            policy = self.policy(request.policy, fleet=True)
            self.counters.local_prefills += 1
            return fleet.run(fleet.plan(request, policy, tenant, arrival))
        plan = await self._plan(request, arrival, tenant)
        return self._run_local(plan) if plan.local else self._run_remote(plan)

    def queue_depths(self) -> dict[str, int]:
        """In-flight prefills and decode streams over every node (the /metrics gauges)."""
        now = time.perf_counter()
        loads = [self.ledger.load(n, now) for n in self.ledger.node_ids()]
        return {"prefill": sum(x.prefills for x in loads),
                "decode": sum(x.decodes for x in loads)}  # fmt: skip

    def event_counts(self) -> dict[str, dict[str, int]]:
        """Per vLLM engine: KV events ingested (stored, removed, cleared) and blocks held."""
        if self.fleet_runner is None:
            return {}
        return {engine: {"stored": s.stored, "removed": s.removed, "cleared": s.cleared,
                         "held": len(s.held), "bad": s.bad, "batches": s.batches}
                for engine, s in self.fleet_runner.fleet.event_stats().items()}  # fmt: skip

    async def ClusterStatus(
        self, request: cpb.ClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> cpb.ClusterStatusResponse:
        c = self.counters
        return cpb.ClusterStatusResponse(
            policy=self.config.policy,
            policies=sorted(POLICIES),
            nodes=[self._node_status(e) for e in self.directory.entries]
            + (self.fleet_runner.status() if self.fleet_runner is not None else []),
            requests=c.requests,
            rejected=c.rejected,
            failed=c.failed,
            local_prefills=c.local_prefills,
            remote_prefills=c.remote_prefills,
        )

    def _node_status(self, entry: NodeEntry) -> cpb.NodeStatus:
        out = cpb.NodeStatus(address=entry.address, healthy=entry.healthy, error=entry.error)
        if entry.stats is not None:
            s = entry.stats
            out.node_id, out.role, out.model_id = s.node_id, s.role, s.model_id
            out.block_tokens, out.total_blocks = s.block_tokens, s.total_blocks
            out.free_blocks, out.running = s.free_blocks, s.running
            out.report.CopyFrom(s)
        if entry.info is not None:
            load = self.ledger.load(entry.info.node_id, time.perf_counter())
            out.inflight_prefills = load.prefills
            out.inflight_prefill_tokens = load.prefill_tokens
            out.inflight_decodes = load.decodes
            out.reserved_kv_tokens = load.reserved_tokens
            out.est_queue_wait_s = load.est_queue_wait_s
            out.routed_prefills = load.routed_prefills
            out.routed_decodes = load.routed_decodes
        return out

    # -- placement ---------------------------------------------------------------------

    async def _plan(
        self, request: cpb.ConductorGenerateRequest, arrival: float, tenant: str = ""
    ) -> Plan:
        from kvstore.serving.convert import request_from_spec

        policy = self.policy(request.policy)
        spec = spb.GenerationSpec()
        spec.CopyFrom(request.spec)
        prompt = request_from_spec(spec).prompt  # tokenizes prompt_text; validates
        spec.prompt_text = ""
        spec.prompt_token_ids[:] = list(prompt)
        spec.request_id = spec.request_id or f"conductor-{uuid.uuid4().hex[:12]}"
        # the caller's tenant salts the nodes' block hashes (kvstore.serving.config.namespace)
        if tenant and spec.tenant and spec.tenant != tenant:
            raise BadRequestError(f"spec.tenant {spec.tenant!r} is not the caller's {tenant!r}")
        tenant = spec.tenant = tenant or spec.tenant
        entries = self.directory.healthy(spec.model_id)
        identity = self.directory.identity(spec.model_id)  # the same for every healthy node
        block_tokens = identity.block_tokens
        hashes = identity.hashes(prompt, tenant)
        index = await self._match(identity.keys(hashes))
        # a named tenant's match counts only the blocks its own requests wrote (tenants.py)
        index = index.capped(self.tenants.owned_prefix(tenant, hashes))
        self.tenants.record(tenant, hashes)
        now = time.perf_counter()
        nodes = tuple(self.ledger.node_state(e.info, now) for e in entries if e.info)
        view = ClusterView(nodes, index, pooled=True, block_tokens=block_tokens)
        req = Request(
            request_id=spec.request_id,
            arrival_s=now,
            prompt_tokens=len(prompt),
            output_tokens=spec.max_tokens,
            block_hashes=tuple(hashes),
            ttft_slo_s=request.slo.ttft_s or None,
            tbt_slo_s=request.slo.tbt_s or None,
        )
        decision = policy.place(req, view)
        return self._to_plan(spec, len(prompt), decision, policy.name, view, arrival)

    async def _match(self, keys: list[str]) -> MatchAnswerIndex:
        """The pool's prefix of these keys; an empty index when there is no master or it
        does not answer in time (placement then goes by load alone)."""
        if self.master is None or not keys:
            return MatchAnswerIndex([], 0)
        try:
            answer = await self.master.MatchPrefix(
                master_pb2.MatchPrefixRequest(keys=keys), timeout=self.config.match_timeout_s
            )
        except grpc.RpcError:
            return MatchAnswerIndex([], 0)
        runs = [Run(m.node_id, Tier(m.tier), m.length) for m in answer.matches]
        return MatchAnswerIndex(runs, answer.pool_length)

    def _to_plan(
        self,
        spec: spb.GenerationSpec,
        prompt_tokens: int,
        decision: Decision,
        policy: str,
        view: ClusterView,
        arrival: float,
    ) -> Plan:
        prefill = self.directory.by_id(decision.prefill_node)
        decode = self.directory.by_id(decision.decode_node)
        # the policy decided everything (the simulator runs the same code): a local prefill
        # is a Generate on the decode node, a remote one a Prefill on a PREFILL node
        local = decision.local_prefill
        if not local and prefill.prefill is None:
            raise KVStoreError(
                f"policy {policy} chose a remote prefill on {prefill.address}, which serves "
                "no Prefill RPC"
            )
        wait = view.node(decision.prefill_node).est_queue_wait_s
        return Plan(
            spec=spec,
            prompt_tokens=prompt_tokens,
            decision=decision,
            policy=policy,
            prefill=decode if local else prefill,
            decode=decode,
            local=local,
            prefill_s=max(decision.predicted_ttft_s - wait, 0.0),
            arrival=arrival,
            route_s=time.perf_counter() - arrival,
        )

    # -- driving the nodes -------------------------------------------------------------

    async def _run_remote(self, plan: Plan) -> AsyncGenerator[cpb.ConductorGenerateResponse, None]:
        """Prefill on the prefill node, relay its first token, then relay Decode's stream."""
        self.counters.remote_prefills += 1
        pre = await self._prefill(plan)
        plan.timings.prefill.CopyFrom(pre.timings)
        plan.timings.cached_tokens = pre.cached_tokens
        first = cpb.ConductorGenerateResponse(index=0, token_ids=[pre.first_token])
        first.token_times_s.append(plan.since())
        first.placement.CopyFrom(placement(plan))
        plan.timings.ttft_s = first.token_times_s[0]
        yield first
        decode_request = spb.DecodeRequest(
            spec=plan.spec, first_token=pre.first_token, handoff=pre.handoff
        )
        assert plan.decode.decode is not None
        call = plan.decode.decode.Decode(decode_request, timeout=self.config.rpc_timeout_s)
        async with contextlib.aclosing(self._relay(plan, call, skip_first=True)) as relay:
            async for message in relay:
                yield message

    async def _prefill(self, plan: Plan) -> spb.PrefillResponse:
        node = plan.prefill
        assert node.prefill is not None and node.info is not None
        rid = plan.spec.request_id
        self.ledger.start_prefill(
            node.info.node_id, rid, plan.prompt_tokens, plan.prefill_s, time.perf_counter()
        )
        call = node.prefill.Prefill(
            spb.PrefillRequest(spec=plan.spec), timeout=self.config.rpc_timeout_s
        )
        try:
            return await call
        except grpc.RpcError as err:
            raise self._failed(node, err) from None
        finally:
            call.cancel()  # a no-op once done; stops the prefill when the client went away
            self.ledger.finish_prefill(node.info.node_id, rid)

    async def _run_local(self, plan: Plan) -> AsyncGenerator[cpb.ConductorGenerateResponse, None]:
        """Generate on the decode node: it prefills the prompt itself, then decodes."""
        self.counters.local_prefills += 1
        node = plan.decode
        assert node.decode is not None and node.info is not None
        rid = plan.spec.request_id
        self.ledger.start_prefill(
            node.info.node_id, rid, plan.prompt_tokens, plan.prefill_s, time.perf_counter()
        )
        try:
            call = node.decode.Generate(
                spb.GenerateRequest(spec=plan.spec), timeout=self.config.rpc_timeout_s
            )
            async with contextlib.aclosing(self._relay(plan, call, skip_first=False)) as relay:
                async for message in relay:
                    if message.index == 0:  # the first token: the local prefill is done
                        self.ledger.finish_prefill(node.info.node_id, rid)
                    yield message
        finally:
            self.ledger.finish_prefill(node.info.node_id, rid)

    async def _relay(
        self, plan: Plan, call: grpc.aio.UnaryStreamCall, skip_first: bool
    ) -> AsyncGenerator[cpb.ConductorGenerateResponse, None]:
        """Relay a node's token stream; the last message carries the timings."""
        node = plan.decode
        assert node.info is not None
        node_id, rid = node.info.node_id, plan.spec.request_id
        self.ledger.start_decode(node_id, rid, plan.prompt_tokens, plan.spec.max_tokens)
        sent_first = skip_first
        try:
            async for chunk in call:
                message = self._message(plan, chunk, skip_first)
                if message is None:
                    continue
                self.ledger.add_tokens(node_id, rid, len(message.token_ids))
                if not sent_first:
                    message.placement.CopyFrom(placement(plan))
                    plan.timings.ttft_s = message.token_times_s[0] if message.token_ids else 0.0
                    sent_first = True
                yield message
        except grpc.RpcError as err:
            raise self._failed(node, err) from None
        finally:
            call.cancel()
            self.ledger.finish_decode(node_id, rid)

    def _message(
        self, plan: Plan, chunk: spb.TokenChunk, skip_first: bool
    ) -> cpb.ConductorGenerateResponse | None:
        """The relayed form of `chunk` (None when nothing is left to send)."""
        if chunk.HasField("timings"):
            plan.timings.decode.CopyFrom(chunk.timings)
        start = 1 if skip_first and chunk.index == 0 else 0
        tokens = list(chunk.token_ids)[start:]
        if not tokens and chunk.finish_reason == spb.FINISH_REASON_NONE:
            return None
        now = plan.since()
        message = cpb.ConductorGenerateResponse(
            index=chunk.index + start,
            token_ids=tokens,
            token_times_s=[now] * len(tokens),
            finish_reason=chunk.finish_reason,
        )
        if chunk.finish_reason != spb.FINISH_REASON_NONE:
            plan.timings.route_s = plan.route_s
            plan.timings.total_s = now
            plan.timings.prompt_tokens = plan.prompt_tokens
            message.timings.CopyFrom(plan.timings)
        return message

    def _failed(self, node: NodeEntry, err: grpc.RpcError) -> KVStoreError:
        error = rpc_error(err)
        if isinstance(error, UnavailableError) and node.info is not None:
            self.directory.mark_failed(node.info.node_id, str(error))
        return error
