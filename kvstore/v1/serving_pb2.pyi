from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_NONE: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
FINISH_REASON_NONE: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP: FinishReason

class SamplingOptions(_message.Message):
    __slots__ = ("temperature", "top_p", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class GenerationSpec(_message.Message):
    __slots__ = ("request_id", "model_id", "prompt_token_ids", "prompt_text", "sampling", "max_tokens", "stop_token_ids", "tenant")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_text: str
    sampling: SamplingOptions
    max_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    tenant: str
    def __init__(self, request_id: _Optional[str] = ..., model_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., prompt_text: _Optional[str] = ..., sampling: _Optional[_Union[SamplingOptions, _Mapping]] = ..., max_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., tenant: _Optional[str] = ...) -> None: ...

class KVHandoff(_message.Message):
    __slots__ = ("block_tokens", "num_layers", "block_hashes", "tail_key", "tail_tokens", "layered")
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TAIL_KEY_FIELD_NUMBER: _ClassVar[int]
    TAIL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LAYERED_FIELD_NUMBER: _ClassVar[int]
    block_tokens: int
    num_layers: int
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    tail_key: str
    tail_tokens: int
    layered: bool
    def __init__(self, block_tokens: _Optional[int] = ..., num_layers: _Optional[int] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., tail_key: _Optional[str] = ..., tail_tokens: _Optional[int] = ..., layered: bool = ...) -> None: ...

class PrefillTimings(_message.Message):
    __slots__ = ("queue_s", "match_s", "load_s", "compute_s", "publish_s", "publish_wait_s", "total_s", "published_bytes")
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    MATCH_S_FIELD_NUMBER: _ClassVar[int]
    LOAD_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_S_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    queue_s: float
    match_s: float
    load_s: float
    compute_s: float
    publish_s: float
    publish_wait_s: float
    total_s: float
    published_bytes: int
    def __init__(self, queue_s: _Optional[float] = ..., match_s: _Optional[float] = ..., load_s: _Optional[float] = ..., compute_s: _Optional[float] = ..., publish_s: _Optional[float] = ..., publish_wait_s: _Optional[float] = ..., total_s: _Optional[float] = ..., published_bytes: _Optional[int] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: GenerationSpec
    def __init__(self, spec: _Optional[_Union[GenerationSpec, _Mapping]] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("request_id", "first_token", "prompt_tokens", "cached_tokens", "handoff", "timings", "prompt_token_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    first_token: int
    prompt_tokens: int
    cached_tokens: int
    handoff: KVHandoff
    timings: PrefillTimings
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., first_token: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., handoff: _Optional[_Union[KVHandoff, _Mapping]] = ..., timings: _Optional[_Union[PrefillTimings, _Mapping]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("spec", "first_token", "handoff")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_FIELD_NUMBER: _ClassVar[int]
    spec: GenerationSpec
    first_token: int
    handoff: KVHandoff
    def __init__(self, spec: _Optional[_Union[GenerationSpec, _Mapping]] = ..., first_token: _Optional[int] = ..., handoff: _Optional[_Union[KVHandoff, _Mapping]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: GenerationSpec
    def __init__(self, spec: _Optional[_Union[GenerationSpec, _Mapping]] = ...) -> None: ...

class DecodeTimings(_message.Message):
    __slots__ = ("queue_s", "pull_s", "prefill_s", "ttft_s", "recomputed", "pulled_bytes")
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    PULL_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTED_FIELD_NUMBER: _ClassVar[int]
    PULLED_BYTES_FIELD_NUMBER: _ClassVar[int]
    queue_s: float
    pull_s: float
    prefill_s: float
    ttft_s: float
    recomputed: bool
    pulled_bytes: int
    def __init__(self, queue_s: _Optional[float] = ..., pull_s: _Optional[float] = ..., prefill_s: _Optional[float] = ..., ttft_s: _Optional[float] = ..., recomputed: bool = ..., pulled_bytes: _Optional[int] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("index", "token_ids", "token_times_s", "finish_reason", "timings")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TIMES_S_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    index: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    token_times_s: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: FinishReason
    timings: DecodeTimings
    def __init__(self, index: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., token_times_s: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., timings: _Optional[_Union[DecodeTimings, _Mapping]] = ...) -> None: ...

class ServingStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServingStatsResponse(_message.Message):
    __slots__ = ("node_id", "role", "model_id", "free_blocks", "total_blocks", "running", "waiting", "requests_done", "requests_failed", "steps", "block_tokens", "seed", "batch_invariant", "num_layers", "kv_objects", "local_prefill_tokens", "waiting_tokens", "pool_segment", "kv_dtype")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_DONE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FAILED_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    BATCH_INVARIANT_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    KV_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WAITING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    POOL_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    KV_DTYPE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    role: str
    model_id: str
    free_blocks: int
    total_blocks: int
    running: int
    waiting: int
    requests_done: int
    requests_failed: int
    steps: int
    block_tokens: int
    seed: int
    batch_invariant: bool
    num_layers: int
    kv_objects: str
    local_prefill_tokens: int
    waiting_tokens: int
    pool_segment: bool
    kv_dtype: str
    def __init__(self, node_id: _Optional[str] = ..., role: _Optional[str] = ..., model_id: _Optional[str] = ..., free_blocks: _Optional[int] = ..., total_blocks: _Optional[int] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., requests_done: _Optional[int] = ..., requests_failed: _Optional[int] = ..., steps: _Optional[int] = ..., block_tokens: _Optional[int] = ..., seed: _Optional[int] = ..., batch_invariant: bool = ..., num_layers: _Optional[int] = ..., kv_objects: _Optional[str] = ..., local_prefill_tokens: _Optional[int] = ..., waiting_tokens: _Optional[int] = ..., pool_segment: bool = ..., kv_dtype: _Optional[str] = ...) -> None: ...
