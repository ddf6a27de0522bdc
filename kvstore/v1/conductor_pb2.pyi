from kvstore.v1 import serving_pb2 as _serving_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Objectives(_message.Message):
    __slots__ = ("ttft_s", "tbt_s")
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TBT_S_FIELD_NUMBER: _ClassVar[int]
    ttft_s: float
    tbt_s: float
    def __init__(self, ttft_s: _Optional[float] = ..., tbt_s: _Optional[float] = ...) -> None: ...

class ConductorGenerateRequest(_message.Message):
    __slots__ = ("spec", "slo", "policy")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    spec: _serving_pb2.GenerationSpec
    slo: Objectives
    policy: str
    def __init__(self, spec: _Optional[_Union[_serving_pb2.GenerationSpec, _Mapping]] = ..., slo: _Optional[_Union[Objectives, _Mapping]] = ..., policy: _Optional[str] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("policy", "prefill_node", "decode_node", "local_prefill", "cached_blocks", "predicted_ttft_s", "predicted_tbt_s", "reason", "source_node")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PREFILL_NODE_FIELD_NUMBER: _ClassVar[int]
    DECODE_NODE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PREFILL_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TTFT_S_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TBT_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NODE_FIELD_NUMBER: _ClassVar[int]
    policy: str
    prefill_node: str
    decode_node: str
    local_prefill: bool
    cached_blocks: int
    predicted_ttft_s: float
    predicted_tbt_s: float
    reason: str
    source_node: str
    def __init__(self, policy: _Optional[str] = ..., prefill_node: _Optional[str] = ..., decode_node: _Optional[str] = ..., local_prefill: bool = ..., cached_blocks: _Optional[int] = ..., predicted_ttft_s: _Optional[float] = ..., predicted_tbt_s: _Optional[float] = ..., reason: _Optional[str] = ..., source_node: _Optional[str] = ...) -> None: ...

class RequestTimings(_message.Message):
    __slots__ = ("route_s", "ttft_s", "total_s", "prompt_tokens", "cached_tokens", "prefill", "decode")
    ROUTE_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    route_s: float
    ttft_s: float
    total_s: float
    prompt_tokens: int
    cached_tokens: int
    prefill: _serving_pb2.PrefillTimings
    decode: _serving_pb2.DecodeTimings
    def __init__(self, route_s: _Optional[float] = ..., ttft_s: _Optional[float] = ..., total_s: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., prefill: _Optional[_Union[_serving_pb2.PrefillTimings, _Mapping]] = ..., decode: _Optional[_Union[_serving_pb2.DecodeTimings, _Mapping]] = ...) -> None: ...

class ConductorGenerateResponse(_message.Message):
    __slots__ = ("index", "token_ids", "token_times_s", "finish_reason", "placement", "timings")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TIMES_S_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    index: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    token_times_s: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: _serving_pb2.FinishReason
    placement: Placement
    timings: RequestTimings
    def __init__(self, index: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., token_times_s: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[_Union[_serving_pb2.FinishReason, str]] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., timings: _Optional[_Union[RequestTimings, _Mapping]] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("address", "node_id", "role", "model_id", "healthy", "error", "block_tokens", "total_blocks", "free_blocks", "running", "inflight_prefills", "inflight_prefill_tokens", "inflight_decodes", "reserved_kv_tokens", "est_queue_wait_s", "routed_prefills", "routed_decodes", "report")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_PREFILLS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_DECODES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EST_QUEUE_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    ROUTED_PREFILLS_FIELD_NUMBER: _ClassVar[int]
    ROUTED_DECODES_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    address: str
    node_id: str
    role: str
    model_id: str
    healthy: bool
    error: str
    block_tokens: int
    total_blocks: int
    free_blocks: int
    running: int
    inflight_prefills: int
    inflight_prefill_tokens: int
    inflight_decodes: int
    reserved_kv_tokens: int
    est_queue_wait_s: float
    routed_prefills: int
    routed_decodes: int
    report: _serving_pb2.ServingStatsResponse
    def __init__(self, address: _Optional[str] = ..., node_id: _Optional[str] = ..., role: _Optional[str] = ..., model_id: _Optional[str] = ..., healthy: bool = ..., error: _Optional[str] = ..., block_tokens: _Optional[int] = ..., total_blocks: _Optional[int] = ..., free_blocks: _Optional[int] = ..., running: _Optional[int] = ..., inflight_prefills: _Optional[int] = ..., inflight_prefill_tokens: _Optional[int] = ..., inflight_decodes: _Optional[int] = ..., reserved_kv_tokens: _Optional[int] = ..., est_queue_wait_s: _Optional[float] = ..., routed_prefills: _Optional[int] = ..., routed_decodes: _Optional[int] = ..., report: _Optional[_Union[_serving_pb2.ServingStatsResponse, _Mapping]] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("policy", "policies", "nodes", "requests", "rejected", "failed", "local_prefills", "remote_prefills")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PREFILLS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_PREFILLS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    policies: _containers.RepeatedScalarFieldContainer[str]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    requests: int
    rejected: int
    failed: int
    local_prefills: int
    remote_prefills: int
    def __init__(self, policy: _Optional[str] = ..., policies: _Optional[_Iterable[str]] = ..., nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., requests: _Optional[int] = ..., rejected: _Optional[int] = ..., failed: _Optional[int] = ..., local_prefills: _Optional[int] = ..., remote_prefills: _Optional[int] = ...) -> None: ...
