from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_HBM: _ClassVar[Tier]
    TIER_DRAM: _ClassVar[Tier]
    TIER_SSD: _ClassVar[Tier]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_OK: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_ARGUMENT: _ClassVar[ErrorCode]
    ERROR_CODE_TOO_LARGE: _ClassVar[ErrorCode]
    ERROR_CODE_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_ALREADY_EXISTS: _ClassVar[ErrorCode]
    ERROR_CODE_NOT_READY: _ClassVar[ErrorCode]
    ERROR_CODE_NO_SPACE: _ClassVar[ErrorCode]
    ERROR_CODE_CORRUPT: _ClassVar[ErrorCode]
    ERROR_CODE_TRANSFER: _ClassVar[ErrorCode]
    ERROR_CODE_UNAVAILABLE: _ClassVar[ErrorCode]
    ERROR_CODE_INTERNAL: _ClassVar[ErrorCode]
    ERROR_CODE_UNAUTHENTICATED: _ClassVar[ErrorCode]
    ERROR_CODE_PERMISSION_DENIED: _ClassVar[ErrorCode]
TIER_HBM: Tier
TIER_DRAM: Tier
TIER_SSD: Tier
ERROR_CODE_OK: ErrorCode
ERROR_CODE_INVALID_ARGUMENT: ErrorCode
ERROR_CODE_TOO_LARGE: ErrorCode
ERROR_CODE_NOT_FOUND: ErrorCode
ERROR_CODE_ALREADY_EXISTS: ErrorCode
ERROR_CODE_NOT_READY: ErrorCode
ERROR_CODE_NO_SPACE: ErrorCode
ERROR_CODE_CORRUPT: ErrorCode
ERROR_CODE_TRANSFER: ErrorCode
ERROR_CODE_UNAVAILABLE: ErrorCode
ERROR_CODE_INTERNAL: ErrorCode
ERROR_CODE_UNAUTHENTICATED: ErrorCode
ERROR_CODE_PERMISSION_DENIED: ErrorCode

class Location(_message.Message):
    __slots__ = ("node_id", "tier", "segment", "offset", "length", "capability")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    tier: Tier
    segment: str
    offset: int
    length: int
    capability: bytes
    def __init__(self, node_id: _Optional[str] = ..., tier: _Optional[_Union[Tier, str]] = ..., segment: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., capability: _Optional[bytes] = ...) -> None: ...

class NodeEndpoint(_message.Message):
    __slots__ = ("tcp_address", "shm_host_id", "rpc_address", "nixl_metadata", "shm_socket")
    TCP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SHM_HOST_ID_FIELD_NUMBER: _ClassVar[int]
    RPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NIXL_METADATA_FIELD_NUMBER: _ClassVar[int]
    SHM_SOCKET_FIELD_NUMBER: _ClassVar[int]
    tcp_address: str
    shm_host_id: str
    rpc_address: str
    nixl_metadata: bytes
    shm_socket: str
    def __init__(self, tcp_address: _Optional[str] = ..., shm_host_id: _Optional[str] = ..., rpc_address: _Optional[str] = ..., nixl_metadata: _Optional[bytes] = ..., shm_socket: _Optional[str] = ...) -> None: ...
