from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MetadataEntry(_message.Message):
    __slots__ = ("key", "text", "binary")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    BINARY_FIELD_NUMBER: _ClassVar[int]
    key: str
    text: str
    binary: bytes
    def __init__(self, key: _Optional[str] = ..., text: _Optional[str] = ..., binary: _Optional[bytes] = ...) -> None: ...

class CallsRequest(_message.Message):
    __slots__ = ("calls",)
    CALLS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[Call]
    def __init__(self, calls: _Optional[_Iterable[_Union[Call, _Mapping]]] = ...) -> None: ...

class CallsResponse(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[Reply]
    def __init__(self, replies: _Optional[_Iterable[_Union[Reply, _Mapping]]] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("call_id", "method", "request", "metadata", "timeout_seconds", "cancel")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    method: str
    request: bytes
    metadata: _containers.RepeatedCompositeFieldContainer[MetadataEntry]
    timeout_seconds: float
    cancel: bool
    def __init__(self, call_id: _Optional[int] = ..., method: _Optional[str] = ..., request: _Optional[bytes] = ..., metadata: _Optional[_Iterable[_Union[MetadataEntry, _Mapping]]] = ..., timeout_seconds: _Optional[float] = ..., cancel: _Optional[bool] = ...) -> None: ...

class Reply(_message.Message):
    __slots__ = ("call_id", "code", "response", "message", "trailing_metadata", "more")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRAILING_METADATA_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    call_id: int
    code: int
    response: bytes
    message: str
    trailing_metadata: _containers.RepeatedCompositeFieldContainer[MetadataEntry]
    more: bool
    def __init__(self, call_id: _Optional[int] = ..., code: _Optional[int] = ..., response: _Optional[bytes] = ..., message: _Optional[str] = ..., trailing_metadata: _Optional[_Iterable[_Union[MetadataEntry, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...
