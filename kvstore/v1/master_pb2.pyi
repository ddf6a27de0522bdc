from kvstore.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ObjectState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OBJECT_STATE_WRITING: _ClassVar[ObjectState]
    OBJECT_STATE_COMPLETE: _ClassVar[ObjectState]

class TaskKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_KIND_COPY: _ClassVar[TaskKind]
    TASK_KIND_PERSIST: _ClassVar[TaskKind]
    TASK_KIND_FORGET: _ClassVar[TaskKind]
OBJECT_STATE_WRITING: ObjectState
OBJECT_STATE_COMPLETE: ObjectState
TASK_KIND_COPY: TaskKind
TASK_KIND_PERSIST: TaskKind
TASK_KIND_FORGET: TaskKind

class KeyStatus(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: _common_pb2.ErrorCode
    message: str
    def __init__(self, code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node_id", "endpoint", "incarnation", "runs_tasks")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    RUNS_TASKS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    endpoint: _common_pb2.NodeEndpoint
    incarnation: str
    runs_tasks: bool
    def __init__(self, node_id: _Optional[str] = ..., endpoint: _Optional[_Union[_common_pb2.NodeEndpoint, _Mapping]] = ..., incarnation: _Optional[str] = ..., runs_tasks: bool = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("master_epoch", "node_ttl_ms", "heartbeat_interval_ms", "capability_key", "capability_key_id", "capability_clock_ms")
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NODE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_KEY_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_CLOCK_MS_FIELD_NUMBER: _ClassVar[int]
    master_epoch: str
    node_ttl_ms: int
    heartbeat_interval_ms: int
    capability_key: bytes
    capability_key_id: int
    capability_clock_ms: int
    def __init__(self, master_epoch: _Optional[str] = ..., node_ttl_ms: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., capability_key: _Optional[bytes] = ..., capability_key_id: _Optional[int] = ..., capability_clock_ms: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("master_epoch", "capability_clock_ms")
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_CLOCK_MS_FIELD_NUMBER: _ClassVar[int]
    master_epoch: str
    capability_clock_ms: int
    def __init__(self, master_epoch: _Optional[str] = ..., capability_clock_ms: _Optional[int] = ...) -> None: ...

class MountSegmentRequest(_message.Message):
    __slots__ = ("node_id", "segment", "tier", "capacity", "alignment", "shm")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    SHM_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    segment: str
    tier: _common_pb2.Tier
    capacity: int
    alignment: int
    shm: bool
    def __init__(self, node_id: _Optional[str] = ..., segment: _Optional[str] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., capacity: _Optional[int] = ..., alignment: _Optional[int] = ..., shm: bool = ...) -> None: ...

class MountSegmentResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnmountSegmentRequest(_message.Message):
    __slots__ = ("node_id", "segment")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    segment: str
    def __init__(self, node_id: _Optional[str] = ..., segment: _Optional[str] = ...) -> None: ...

class UnmountSegmentResponse(_message.Message):
    __slots__ = ("dropped_replicas", "removed_objects")
    DROPPED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    dropped_replicas: int
    removed_objects: int
    def __init__(self, dropped_replicas: _Optional[int] = ..., removed_objects: _Optional[int] = ...) -> None: ...

class PutStartItem(_message.Message):
    __slots__ = ("key", "size", "replicas", "preferred_node", "group", "tier", "pin_ttl_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_NODE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    PIN_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    key: str
    size: int
    replicas: int
    preferred_node: str
    group: str
    tier: _common_pb2.Tier
    pin_ttl_ms: int
    def __init__(self, key: _Optional[str] = ..., size: _Optional[int] = ..., replicas: _Optional[int] = ..., preferred_node: _Optional[str] = ..., group: _Optional[str] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., pin_ttl_ms: _Optional[int] = ...) -> None: ...

class PutStartRequest(_message.Message):
    __slots__ = ("client_id", "client_node", "items")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NODE_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    client_node: str
    items: _containers.RepeatedCompositeFieldContainer[PutStartItem]
    def __init__(self, client_id: _Optional[str] = ..., client_node: _Optional[str] = ..., items: _Optional[_Iterable[_Union[PutStartItem, _Mapping]]] = ...) -> None: ...

class PutStartResult(_message.Message):
    __slots__ = ("status", "locations")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    status: KeyStatus
    locations: _containers.RepeatedCompositeFieldContainer[_common_pb2.Location]
    def __init__(self, status: _Optional[_Union[KeyStatus, _Mapping]] = ..., locations: _Optional[_Iterable[_Union[_common_pb2.Location, _Mapping]]] = ...) -> None: ...

class PutStartResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutStartResult]
    def __init__(self, results: _Optional[_Iterable[_Union[PutStartResult, _Mapping]]] = ...) -> None: ...

class PutEndRequest(_message.Message):
    __slots__ = ("client_id", "keys", "checksums", "read_lease_ms")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    READ_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    read_lease_ms: int
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., checksums: _Optional[_Iterable[int]] = ..., read_lease_ms: _Optional[int] = ...) -> None: ...

class PutEndResponse(_message.Message):
    __slots__ = ("results", "read_lease_ms", "promote_after")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    READ_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_AFTER_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[KeyStatus]
    read_lease_ms: int
    promote_after: int
    def __init__(self, results: _Optional[_Iterable[_Union[KeyStatus, _Mapping]]] = ..., read_lease_ms: _Optional[int] = ..., promote_after: _Optional[int] = ...) -> None: ...

class PutRevokeRequest(_message.Message):
    __slots__ = ("client_id", "keys")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class PutRevokeResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[KeyStatus]
    def __init__(self, results: _Optional[_Iterable[_Union[KeyStatus, _Mapping]]] = ...) -> None: ...

class BatchLookupRequest(_message.Message):
    __slots__ = ("keys", "lease_ttl_ms", "pin_ttl_ms", "no_lease", "client_id", "cached_keys", "cached_reads")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    PIN_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    NO_LEASE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CACHED_KEYS_FIELD_NUMBER: _ClassVar[int]
    CACHED_READS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    lease_ttl_ms: int
    pin_ttl_ms: int
    no_lease: bool
    client_id: str
    cached_keys: _containers.RepeatedScalarFieldContainer[str]
    cached_reads: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., lease_ttl_ms: _Optional[int] = ..., pin_ttl_ms: _Optional[int] = ..., no_lease: bool = ..., client_id: _Optional[str] = ..., cached_keys: _Optional[_Iterable[str]] = ..., cached_reads: _Optional[_Iterable[int]] = ...) -> None: ...

class LookupResult(_message.Message):
    __slots__ = ("status", "size", "replicas", "group", "checksum")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    status: KeyStatus
    size: int
    replicas: _containers.RepeatedCompositeFieldContainer[_common_pb2.Location]
    group: str
    checksum: int
    def __init__(self, status: _Optional[_Union[KeyStatus, _Mapping]] = ..., size: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[_common_pb2.Location, _Mapping]]] = ..., group: _Optional[str] = ..., checksum: _Optional[int] = ...) -> None: ...

class BatchLookupResponse(_message.Message):
    __slots__ = ("results", "lease_ttl_ms", "promote_after", "moving")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_AFTER_FIELD_NUMBER: _ClassVar[int]
    MOVING_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[LookupResult]
    lease_ttl_ms: int
    promote_after: int
    moving: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, results: _Optional[_Iterable[_Union[LookupResult, _Mapping]]] = ..., lease_ttl_ms: _Optional[int] = ..., promote_after: _Optional[int] = ..., moving: _Optional[_Iterable[int]] = ...) -> None: ...

class MatchPrefixRequest(_message.Message):
    __slots__ = ("keys", "by_group")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    BY_GROUP_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    by_group: bool
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., by_group: bool = ...) -> None: ...

class PrefixMatch(_message.Message):
    __slots__ = ("node_id", "tier", "length")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    tier: _common_pb2.Tier
    length: int
    def __init__(self, node_id: _Optional[str] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., length: _Optional[int] = ...) -> None: ...

class MatchPrefixResponse(_message.Message):
    __slots__ = ("pool_length", "matches")
    POOL_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    pool_length: int
    matches: _containers.RepeatedCompositeFieldContainer[PrefixMatch]
    def __init__(self, pool_length: _Optional[int] = ..., matches: _Optional[_Iterable[_Union[PrefixMatch, _Mapping]]] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("keys", "force", "client_id", "node_id")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    force: bool
    client_id: str
    node_id: str
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., force: bool = ..., client_id: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[KeyStatus]
    def __init__(self, results: _Optional[_Iterable[_Union[KeyStatus, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SegmentStats(_message.Message):
    __slots__ = ("node_id", "segment", "tier", "capacity", "used", "replicas", "hits", "evictions", "bytes_in", "bytes_out", "objects", "shm", "offloads_in", "promotions_in", "corrupt", "high_watermark_bytes")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    SHM_FIELD_NUMBER: _ClassVar[int]
    OFFLOADS_IN_FIELD_NUMBER: _ClassVar[int]
    PROMOTIONS_IN_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_BYTES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    segment: str
    tier: _common_pb2.Tier
    capacity: int
    used: int
    replicas: int
    hits: int
    evictions: int
    bytes_in: int
    bytes_out: int
    objects: int
    shm: bool
    offloads_in: int
    promotions_in: int
    corrupt: int
    high_watermark_bytes: int
    def __init__(self, node_id: _Optional[str] = ..., segment: _Optional[str] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., replicas: _Optional[int] = ..., hits: _Optional[int] = ..., evictions: _Optional[int] = ..., bytes_in: _Optional[int] = ..., bytes_out: _Optional[int] = ..., objects: _Optional[int] = ..., shm: bool = ..., offloads_in: _Optional[int] = ..., promotions_in: _Optional[int] = ..., corrupt: _Optional[int] = ..., high_watermark_bytes: _Optional[int] = ...) -> None: ...

class NodeStats(_message.Message):
    __slots__ = ("node_id", "endpoint", "ms_since_heartbeat")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    MS_SINCE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    endpoint: _common_pb2.NodeEndpoint
    ms_since_heartbeat: int
    def __init__(self, node_id: _Optional[str] = ..., endpoint: _Optional[_Union[_common_pb2.NodeEndpoint, _Mapping]] = ..., ms_since_heartbeat: _Optional[int] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("nodes", "segments", "objects", "writing", "capacity", "used", "hits", "misses", "evictions", "reclaimed_puts", "dead_nodes", "dropped_replicas", "master_epoch", "complete", "offloads", "promotions", "promotions_skipped", "corrupt_replicas", "moves_in_flight", "adopted", "failed_moves", "fast_lane", "extents", "extent_bytes", "fenced_nodes", "writer_leases", "writer_lease_refusals", "fast_lane_local")
    NODES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    WRITING_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    RECLAIMED_PUTS_FIELD_NUMBER: _ClassVar[int]
    DEAD_NODES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    OFFLOADS_FIELD_NUMBER: _ClassVar[int]
    PROMOTIONS_FIELD_NUMBER: _ClassVar[int]
    PROMOTIONS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MOVES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_FIELD_NUMBER: _ClassVar[int]
    FAILED_MOVES_FIELD_NUMBER: _ClassVar[int]
    FAST_LANE_FIELD_NUMBER: _ClassVar[int]
    EXTENTS_FIELD_NUMBER: _ClassVar[int]
    EXTENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    FENCED_NODES_FIELD_NUMBER: _ClassVar[int]
    WRITER_LEASES_FIELD_NUMBER: _ClassVar[int]
    WRITER_LEASE_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    FAST_LANE_LOCAL_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStats]
    segments: _containers.RepeatedCompositeFieldContainer[SegmentStats]
    objects: int
    writing: int
    capacity: int
    used: int
    hits: int
    misses: int
    evictions: int
    reclaimed_puts: int
    dead_nodes: int
    dropped_replicas: int
    master_epoch: str
    complete: int
    offloads: int
    promotions: int
    promotions_skipped: int
    corrupt_replicas: int
    moves_in_flight: int
    adopted: int
    failed_moves: int
    fast_lane: str
    extents: int
    extent_bytes: int
    fenced_nodes: int
    writer_leases: int
    writer_lease_refusals: int
    fast_lane_local: str
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStats, _Mapping]]] = ..., segments: _Optional[_Iterable[_Union[SegmentStats, _Mapping]]] = ..., objects: _Optional[int] = ..., writing: _Optional[int] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., evictions: _Optional[int] = ..., reclaimed_puts: _Optional[int] = ..., dead_nodes: _Optional[int] = ..., dropped_replicas: _Optional[int] = ..., master_epoch: _Optional[str] = ..., complete: _Optional[int] = ..., offloads: _Optional[int] = ..., promotions: _Optional[int] = ..., promotions_skipped: _Optional[int] = ..., corrupt_replicas: _Optional[int] = ..., moves_in_flight: _Optional[int] = ..., adopted: _Optional[int] = ..., failed_moves: _Optional[int] = ..., fast_lane: _Optional[str] = ..., extents: _Optional[int] = ..., extent_bytes: _Optional[int] = ..., fenced_nodes: _Optional[int] = ..., writer_leases: _Optional[int] = ..., writer_lease_refusals: _Optional[int] = ..., fast_lane_local: _Optional[str] = ...) -> None: ...

class ListObjectsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "prefix")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    prefix: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., prefix: _Optional[str] = ...) -> None: ...

class ObjectInfo(_message.Message):
    __slots__ = ("key", "size", "state", "group", "replicas", "lease_ms_left", "pin_ms_left", "checksum", "slow_hits")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_LEFT_FIELD_NUMBER: _ClassVar[int]
    PIN_MS_LEFT_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    SLOW_HITS_FIELD_NUMBER: _ClassVar[int]
    key: str
    size: int
    state: ObjectState
    group: str
    replicas: _containers.RepeatedCompositeFieldContainer[_common_pb2.Location]
    lease_ms_left: int
    pin_ms_left: int
    checksum: int
    slow_hits: int
    def __init__(self, key: _Optional[str] = ..., size: _Optional[int] = ..., state: _Optional[_Union[ObjectState, str]] = ..., group: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[_common_pb2.Location, _Mapping]]] = ..., lease_ms_left: _Optional[int] = ..., pin_ms_left: _Optional[int] = ..., checksum: _Optional[int] = ..., slow_hits: _Optional[int] = ...) -> None: ...

class ListObjectsResponse(_message.Message):
    __slots__ = ("objects", "next_page_token")
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    objects: _containers.RepeatedCompositeFieldContainer[ObjectInfo]
    next_page_token: str
    def __init__(self, objects: _Optional[_Iterable[_Union[ObjectInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class NodeTask(_message.Message):
    __slots__ = ("task_id", "kind", "key", "src", "dst", "checksum")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    kind: TaskKind
    key: str
    src: _common_pb2.Location
    dst: _common_pb2.Location
    checksum: int
    def __init__(self, task_id: _Optional[int] = ..., kind: _Optional[_Union[TaskKind, str]] = ..., key: _Optional[str] = ..., src: _Optional[_Union[_common_pb2.Location, _Mapping]] = ..., dst: _Optional[_Union[_common_pb2.Location, _Mapping]] = ..., checksum: _Optional[int] = ...) -> None: ...

class TaskResult(_message.Message):
    __slots__ = ("task_id", "status", "checksum")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    status: KeyStatus
    checksum: int
    def __init__(self, task_id: _Optional[int] = ..., status: _Optional[_Union[KeyStatus, _Mapping]] = ..., checksum: _Optional[int] = ...) -> None: ...

class NodeTasksRequest(_message.Message):
    __slots__ = ("node_id", "done", "wait_ms", "max_tasks")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_TASKS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    done: _containers.RepeatedCompositeFieldContainer[TaskResult]
    wait_ms: int
    max_tasks: int
    def __init__(self, node_id: _Optional[str] = ..., done: _Optional[_Iterable[_Union[TaskResult, _Mapping]]] = ..., wait_ms: _Optional[int] = ..., max_tasks: _Optional[int] = ...) -> None: ...

class NodeTasksResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[NodeTask]
    def __init__(self, tasks: _Optional[_Iterable[_Union[NodeTask, _Mapping]]] = ...) -> None: ...

class AnnouncedObject(_message.Message):
    __slots__ = ("key", "offset", "length", "checksum", "group")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    key: str
    offset: int
    length: int
    checksum: int
    group: str
    def __init__(self, key: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ..., group: _Optional[str] = ...) -> None: ...

class AnnounceObjectsRequest(_message.Message):
    __slots__ = ("node_id", "segment", "objects", "complete")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    segment: str
    objects: _containers.RepeatedCompositeFieldContainer[AnnouncedObject]
    complete: bool
    def __init__(self, node_id: _Optional[str] = ..., segment: _Optional[str] = ..., objects: _Optional[_Iterable[_Union[AnnouncedObject, _Mapping]]] = ..., complete: bool = ...) -> None: ...

class AnnounceObjectsResponse(_message.Message):
    __slots__ = ("adopted", "known", "dropped", "refused")
    ADOPTED_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    adopted: int
    known: int
    dropped: int
    refused: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, adopted: _Optional[int] = ..., known: _Optional[int] = ..., dropped: _Optional[int] = ..., refused: _Optional[_Iterable[str]] = ...) -> None: ...

class ReportCorruptRequest(_message.Message):
    __slots__ = ("keys", "replicas")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    replicas: _containers.RepeatedCompositeFieldContainer[_common_pb2.Location]
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., replicas: _Optional[_Iterable[_Union[_common_pb2.Location, _Mapping]]] = ...) -> None: ...

class ReportCorruptResponse(_message.Message):
    __slots__ = ("dropped",)
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    dropped: int
    def __init__(self, dropped: _Optional[int] = ...) -> None: ...

class EvictRequest(_message.Message):
    __slots__ = ("keys", "prefix", "tier", "watermark", "force", "dry_run")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    prefix: str
    tier: _common_pb2.Tier
    watermark: float
    force: bool
    dry_run: bool
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., prefix: _Optional[str] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., watermark: _Optional[float] = ..., force: bool = ..., dry_run: bool = ...) -> None: ...

class EvictResponse(_message.Message):
    __slots__ = ("evicted", "freed_bytes", "skipped", "missing", "keys")
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    evicted: int
    freed_bytes: int
    skipped: int
    missing: int
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, evicted: _Optional[int] = ..., freed_bytes: _Optional[int] = ..., skipped: _Optional[int] = ..., missing: _Optional[int] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("keys", "ttl_ms")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    ttl_ms: int
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class PinResponse(_message.Message):
    __slots__ = ("results", "ttl_ms")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[KeyStatus]
    ttl_ms: int
    def __init__(self, results: _Optional[_Iterable[_Union[KeyStatus, _Mapping]]] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class UnpinRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[str]] = ...) -> None: ...

class UnpinResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[KeyStatus]
    def __init__(self, results: _Optional[_Iterable[_Union[KeyStatus, _Mapping]]] = ...) -> None: ...

class InspectRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class InspectResponse(_message.Message):
    __slots__ = ("object", "age_ms", "hits", "writer", "group_members", "lease_holder")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    GROUP_MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    object: ObjectInfo
    age_ms: int
    hits: int
    writer: str
    group_members: int
    lease_holder: str
    def __init__(self, object: _Optional[_Union[ObjectInfo, _Mapping]] = ..., age_ms: _Optional[int] = ..., hits: _Optional[int] = ..., writer: _Optional[str] = ..., group_members: _Optional[int] = ..., lease_holder: _Optional[str] = ...) -> None: ...

class CordonRequest(_message.Message):
    __slots__ = ("node_id", "cordon")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CORDON_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    cordon: bool
    def __init__(self, node_id: _Optional[str] = ..., cordon: bool = ...) -> None: ...

class CordonResponse(_message.Message):
    __slots__ = ("cordoned",)
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    cordoned: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cordoned: _Optional[_Iterable[str]] = ...) -> None: ...

class GrantExtentRequest(_message.Message):
    __slots__ = ("client_id", "client_node", "size", "min_size", "release_extent")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NODE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_EXTENT_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    client_node: str
    size: int
    min_size: int
    release_extent: int
    def __init__(self, client_id: _Optional[str] = ..., client_node: _Optional[str] = ..., size: _Optional[int] = ..., min_size: _Optional[int] = ..., release_extent: _Optional[int] = ...) -> None: ...

class GrantExtentResponse(_message.Message):
    __slots__ = ("extent_id", "location", "alignment", "ttl_ms")
    EXTENT_ID_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    extent_id: int
    location: _common_pb2.Location
    alignment: int
    ttl_ms: int
    def __init__(self, extent_id: _Optional[int] = ..., location: _Optional[_Union[_common_pb2.Location, _Mapping]] = ..., alignment: _Optional[int] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class CommitItem(_message.Message):
    __slots__ = ("key", "offset", "size", "checksum", "group")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    key: str
    offset: int
    size: int
    checksum: int
    group: str
    def __init__(self, key: _Optional[str] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., checksum: _Optional[int] = ..., group: _Optional[str] = ...) -> None: ...

class CommitExtentRequest(_message.Message):
    __slots__ = ("client_id", "extent_id", "items", "release", "read_lease_ms", "end_writer_leases", "next_size", "next_min_size", "client_node", "release_extents")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EXTENT_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    READ_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    END_WRITER_LEASES_FIELD_NUMBER: _ClassVar[int]
    NEXT_SIZE_FIELD_NUMBER: _ClassVar[int]
    NEXT_MIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NODE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_EXTENTS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    extent_id: int
    items: _containers.RepeatedCompositeFieldContainer[CommitItem]
    release: bool
    read_lease_ms: int
    end_writer_leases: bool
    next_size: int
    next_min_size: int
    client_node: str
    release_extents: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[str] = ..., extent_id: _Optional[int] = ..., items: _Optional[_Iterable[_Union[CommitItem, _Mapping]]] = ..., release: bool = ..., read_lease_ms: _Optional[int] = ..., end_writer_leases: bool = ..., next_size: _Optional[int] = ..., next_min_size: _Optional[int] = ..., client_node: _Optional[str] = ..., release_extents: _Optional[_Iterable[int]] = ...) -> None: ...

class CommitExtentResponse(_message.Message):
    __slots__ = ("results", "ttl_ms", "capability", "read_lease_ms", "next")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    READ_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[KeyStatus]
    ttl_ms: int
    capability: bytes
    read_lease_ms: int
    next: GrantExtentResponse
    def __init__(self, results: _Optional[_Iterable[_Union[KeyStatus, _Mapping]]] = ..., ttl_ms: _Optional[int] = ..., capability: _Optional[bytes] = ..., read_lease_ms: _Optional[int] = ..., next: _Optional[_Union[GrantExtentResponse, _Mapping]] = ...) -> None: ...

class ReportUnreachableRequest(_message.Message):
    __slots__ = ("client_id", "node_ids")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_id: _Optional[str] = ..., node_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReportUnreachableResponse(_message.Message):
    __slots__ = ("fenced",)
    FENCED_FIELD_NUMBER: _ClassVar[int]
    fenced: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, fenced: _Optional[_Iterable[str]] = ...) -> None: ...
