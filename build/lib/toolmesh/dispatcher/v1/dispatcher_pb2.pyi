import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from toolmesh.type.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DispatchToolCallRequest(_message.Message):
    __slots__ = ("tool_use", "context")
    TOOL_USE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    tool_use: _types_pb2.ToolUse
    context: _types_pb2.CallContext
    def __init__(self, tool_use: _Optional[_Union[_types_pb2.ToolUse, _Mapping]] = ..., context: _Optional[_Union[_types_pb2.CallContext, _Mapping]] = ...) -> None: ...

class DispatchToolCallResponse(_message.Message):
    __slots__ = ("result", "duration_ms", "warnings", "args_hash", "tool_use_id")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    ARGS_HASH_FIELD_NUMBER: _ClassVar[int]
    TOOL_USE_ID_FIELD_NUMBER: _ClassVar[int]
    result: _types_pb2.ToolResult
    duration_ms: float
    warnings: _containers.RepeatedScalarFieldContainer[str]
    args_hash: str
    tool_use_id: str
    def __init__(self, result: _Optional[_Union[_types_pb2.ToolResult, _Mapping]] = ..., duration_ms: _Optional[float] = ..., warnings: _Optional[_Iterable[str]] = ..., args_hash: _Optional[str] = ..., tool_use_id: _Optional[str] = ...) -> None: ...

class DispatchToolCallsRequest(_message.Message):
    __slots__ = ("tool_uses", "context")
    TOOL_USES_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    tool_uses: _containers.RepeatedCompositeFieldContainer[_types_pb2.ToolUse]
    context: _types_pb2.CallContext
    def __init__(self, tool_uses: _Optional[_Iterable[_Union[_types_pb2.ToolUse, _Mapping]]] = ..., context: _Optional[_Union[_types_pb2.CallContext, _Mapping]] = ...) -> None: ...

class DispatchToolCallsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DispatchToolCallResponse]
    def __init__(self, results: _Optional[_Iterable[_Union[DispatchToolCallResponse, _Mapping]]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("conversation_id", "tenant_id")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    tenant_id: str
    def __init__(self, conversation_id: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("cancelled_calls", "message")
    CANCELLED_CALLS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    cancelled_calls: int
    message: str
    def __init__(self, cancelled_calls: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ListExecutionLogRequest(_message.Message):
    __slots__ = ("tool_name", "tenant_id", "conversation_id", "limit")
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    tool_name: str
    tenant_id: str
    conversation_id: str
    limit: int
    def __init__(self, tool_name: _Optional[str] = ..., tenant_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ExecutionLogEntry(_message.Message):
    __slots__ = ("id", "tool_name", "tenant_id", "input_json", "output_summary", "success", "error", "execution_ms", "created_at", "conversation_id", "user_id", "tool_use_id", "args_hash", "trace_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_USE_ID_FIELD_NUMBER: _ClassVar[int]
    ARGS_HASH_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    tool_name: str
    tenant_id: str
    input_json: str
    output_summary: str
    success: bool
    error: str
    execution_ms: float
    created_at: _timestamp_pb2.Timestamp
    conversation_id: str
    user_id: str
    tool_use_id: str
    args_hash: str
    trace_id: str
    def __init__(self, id: _Optional[int] = ..., tool_name: _Optional[str] = ..., tenant_id: _Optional[str] = ..., input_json: _Optional[str] = ..., output_summary: _Optional[str] = ..., success: _Optional[bool] = ..., error: _Optional[str] = ..., execution_ms: _Optional[float] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., conversation_id: _Optional[str] = ..., user_id: _Optional[str] = ..., tool_use_id: _Optional[str] = ..., args_hash: _Optional[str] = ..., trace_id: _Optional[str] = ...) -> None: ...

class ListExecutionLogResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[ExecutionLogEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[ExecutionLogEntry, _Mapping]]] = ...) -> None: ...

class ListConversationEventsRequest(_message.Message):
    __slots__ = ("conversation_id", "tenant_id", "event_type", "limit")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    tenant_id: str
    event_type: str
    limit: int
    def __init__(self, conversation_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., event_type: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ConversationEvent(_message.Message):
    __slots__ = ("id", "event_type", "data_json", "created_at", "tool_use_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    TOOL_USE_ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    event_type: str
    data_json: str
    created_at: _timestamp_pb2.Timestamp
    tool_use_id: str
    def __init__(self, id: _Optional[int] = ..., event_type: _Optional[str] = ..., data_json: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tool_use_id: _Optional[str] = ...) -> None: ...

class ListConversationEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[ConversationEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[ConversationEvent, _Mapping]]] = ...) -> None: ...
