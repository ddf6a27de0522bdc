"""Protobuf <-> serving dataclasses, in one place (no grpc import).

Every check of a request lives in `Request` / `Handoff`; this module only maps
fields, tokenizes `prompt_text` and rejects a spec that names both or neither.
"""

from __future__ import annotations

from kvstore.errors import BadRequestError
from kvstore.model import ByteTokenizer, SamplingParams
from kvstore.serving.jobs import DecodeTimings, Finish, JobEvent
from kvstore.serving.prefill import PrefillResult
from kvstore.serving.request import Handoff, Request
from kvstore.v1 import serving_pb2 as pb

_TOKENIZER = ByteTokenizer()
_FINISH = {
    None: pb.FINISH_REASON_NONE,
    Finish.LENGTH: pb.FINISH_REASON_LENGTH,
    Finish.STOP: pb.FINISH_REASON_STOP,
}


def request_from_spec(spec: pb.GenerationSpec) -> Request:
    if spec.prompt_token_ids and spec.prompt_text:
        raise BadRequestError("give prompt_token_ids or prompt_text, not both")
    if spec.prompt_text:
        prompt = tuple(_TOKENIZER.encode(spec.prompt_text))
    else:
        prompt = tuple(spec.prompt_token_ids)
    s = spec.sampling
    sampling = SamplingParams(temperature=s.temperature, top_p=s.top_p or 1.0, seed=s.seed)
    return Request(
        request_id=spec.request_id or "anonymous",
        prompt=prompt,
        max_tokens=spec.max_tokens,
        sampling=sampling,
        stop_ids=frozenset(spec.stop_token_ids),
        tenant=spec.tenant,
    )


def handoff_from_pb(h: pb.KVHandoff) -> Handoff:
    return Handoff(
        block_tokens=h.block_tokens,
        num_layers=h.num_layers,
        block_hashes=tuple(h.block_hashes),
        tail_key=h.tail_key,
        tail_tokens=h.tail_tokens,
        layered=h.layered,
    )


def handoff_to_pb(h: Handoff) -> pb.KVHandoff:
    return pb.KVHandoff(
        block_tokens=h.block_tokens,
        num_layers=h.num_layers,
        block_hashes=list(h.block_hashes),
        tail_key=h.tail_key,
        tail_tokens=h.tail_tokens,
        layered=h.layered,
    )


def prefill_response(result: PrefillResult, req: Request, queue_s: float) -> pb.PrefillResponse:
    t = result.timings
    timings = pb.PrefillTimings(
        queue_s=queue_s,
        match_s=t.match_s,
        load_s=t.load_s,
        compute_s=t.compute_s,
        publish_s=t.publish_s,
        publish_wait_s=t.publish_wait_s,
        total_s=queue_s + t.total_s,
        published_bytes=t.published_bytes,
    )
    return pb.PrefillResponse(
        request_id=result.request_id,
        first_token=result.first_token,
        prompt_tokens=len(req.prompt),
        cached_tokens=result.cached_tokens,
        handoff=handoff_to_pb(result.handoff),
        timings=timings,
        prompt_token_ids=list(req.prompt),
    )


def token_chunk(event: JobEvent) -> pb.TokenChunk:
    """One token, or (token None) the deferred end of the stream."""
    chunk = pb.TokenChunk(index=event.index, finish_reason=_FINISH[event.finish])
    if event.token is not None:
        chunk.token_ids.append(event.token)
        chunk.token_times_s.append(event.time_s)
    if event.timings is not None:
        chunk.timings.CopyFrom(decode_timings(event.timings))
    return chunk


def decode_timings(t: DecodeTimings) -> pb.DecodeTimings:
    return pb.DecodeTimings(
        queue_s=t.queue_s,
        pull_s=t.pull_s,
        prefill_s=t.prefill_s,
        ttft_s=t.ttft_s,
        recomputed=t.recomputed,
        pulled_bytes=t.pulled_bytes,
    )
