import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from toolmesh.type.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PolicyRuleKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_RULE_KIND_UNSPECIFIED: _ClassVar[PolicyRuleKind]
    POLICY_RULE_KIND_DENY_TOOL: _ClassVar[PolicyRuleKind]
    POLICY_RULE_KIND_REQUIRE_PRIOR_TOOL: _ClassVar[PolicyRuleKind]
    POLICY_RULE_KIND_ARG_CONSTRAINT: _ClassVar[PolicyRuleKind]
    POLICY_RULE_KIND_RATE_LIMIT: _ClassVar[PolicyRuleKind]

class PolicyMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_MODE_UNSPECIFIED: _ClassVar[PolicyMode]
    POLICY_MODE_BLOCKING: _ClassVar[PolicyMode]
    POLICY_MODE_ADVISORY: _ClassVar[PolicyMode]
POLICY_RULE_KIND_UNSPECIFIED: PolicyRuleKind
POLICY_RULE_KIND_DENY_TOOL: PolicyRuleKind
POLICY_RULE_KIND_REQUIRE_PRIOR_TOOL: PolicyRuleKind
POLICY_RULE_KIND_ARG_CONSTRAINT: PolicyRuleKind
POLICY_RULE_KIND_RATE_LIMIT: PolicyRuleKind
POLICY_MODE_UNSPECIFIED: PolicyMode
POLICY_MODE_BLOCKING: PolicyMode
POLICY_MODE_ADVISORY: PolicyMode

class DispatchToolCallRequest(_message.Message):
    __slots__ = ("tool_use", "context")
    TOOL_USE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    tool_use: _types_pb2.ToolUse
    context: _types_pb2.CallContext
    def __init__(self, tool_use: _Optional[_Union[_types_pb2.ToolUse, _Mapping]] = ..., context: _Optional[_Union[_types_pb2.CallContext, _Mapping]] = ...) -> None: ...

class DispatchToolCallResponse(_message.Message):
    __slots__ = ("result", "duration_ms", "warnings", "args_hash", "tool_use_id", "replayed")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    ARGS_HASH_FIELD_NUMBER: _ClassVar[int]
    TOOL_USE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    result: _types_pb2.ToolResult
    duration_ms: float
    warnings: _containers.RepeatedScalarFieldContainer[str]
    args_hash: str
    tool_use_id: str
    replayed: bool
    def __init__(self, result: _Optional[_Union[_types_pb2.ToolResult, _Mapping]] = ..., duration_ms: _Optional[float] = ..., warnings: _Optional[_Iterable[str]] = ..., args_hash: _Optional[str] = ..., tool_use_id: _Optional[str] = ..., replayed: _Optional[bool] = ...) -> None: ...

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

class DispatchToolCallStreamRequest(_message.Message):
    __slots__ = ("tool_use", "context")
    TOOL_USE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    tool_use: _types_pb2.ToolUse
    context: _types_pb2.CallContext
    def __init__(self, tool_use: _Optional[_Union[_types_pb2.ToolUse, _Mapping]] = ..., context: _Optional[_Union[_types_pb2.CallContext, _Mapping]] = ...) -> None: ...

class ProgressUpdate(_message.Message):
    __slots__ = ("tool_use_id", "message", "fraction", "data_json")
    TOOL_USE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    tool_use_id: str
    message: str
    fraction: float
    data_json: str
    def __init__(self, tool_use_id: _Optional[str] = ..., message: _Optional[str] = ..., fraction: _Optional[float] = ..., data_json: _Optional[str] = ...) -> None: ...

class TextDelta(_message.Message):
    __slots__ = ("tool_use_id", "text")
    TOOL_USE_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    tool_use_id: str
    text: str
    def __init__(self, tool_use_id: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class ExportReady(_message.Message):
    __slots__ = ("file_id", "filename", "size_bytes", "mime_type")
    FILE_ID_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    file_id: str
    filename: str
    size_bytes: int
    mime_type: str
    def __init__(self, file_id: _Optional[str] = ..., filename: _Optional[str] = ..., size_bytes: _Optional[int] = ..., mime_type: _Optional[str] = ...) -> None: ...

class DispatchToolCallStreamResponse(_message.Message):
    __slots__ = ("progress", "card", "text_delta", "export_ready", "result")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CARD_FIELD_NUMBER: _ClassVar[int]
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    EXPORT_READY_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    progress: ProgressUpdate
    card: _struct_pb2.Struct
    text_delta: TextDelta
    export_ready: ExportReady
    result: DispatchToolCallResponse
    def __init__(self, progress: _Optional[_Union[ProgressUpdate, _Mapping]] = ..., card: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., text_delta: _Optional[_Union[TextDelta, _Mapping]] = ..., export_ready: _Optional[_Union[ExportReady, _Mapping]] = ..., result: _Optional[_Union[DispatchToolCallResponse, _Mapping]] = ...) -> None: ...

class ExportFile(_message.Message):
    __slots__ = ("file_id", "filename", "path", "mime_type", "size_bytes", "source_tool", "original_filename", "conversation_id", "tool_use_id", "created_at", "tenant_id")
    FILE_ID_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TOOL_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_FILENAME_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_USE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    file_id: str
    filename: str
    path: str
    mime_type: str
    size_bytes: int
    source_tool: str
    original_filename: str
    conversation_id: str
    tool_use_id: str
    created_at: _timestamp_pb2.Timestamp
    tenant_id: str
    def __init__(self, file_id: _Optional[str] = ..., filename: _Optional[str] = ..., path: _Optional[str] = ..., mime_type: _Optional[str] = ..., size_bytes: _Optional[int] = ..., source_tool: _Optional[str] = ..., original_filename: _Optional[str] = ..., conversation_id: _Optional[str] = ..., tool_use_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class ListExportsRequest(_message.Message):
    __slots__ = ("conversation_id", "tenant_id", "limit")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    tenant_id: str
    limit: int
    def __init__(self, conversation_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListExportsResponse(_message.Message):
    __slots__ = ("exports",)
    EXPORTS_FIELD_NUMBER: _ClassVar[int]
    exports: _containers.RepeatedCompositeFieldContainer[ExportFile]
    def __init__(self, exports: _Optional[_Iterable[_Union[ExportFile, _Mapping]]] = ...) -> None: ...

class GetExportRequest(_message.Message):
    __slots__ = ("file_id", "tenant_id")
    FILE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    file_id: str
    tenant_id: str
    def __init__(self, file_id: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class GetExportResponse(_message.Message):
    __slots__ = ("info", "chunk")
    INFO_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    info: ExportFile
    chunk: bytes
    def __init__(self, info: _Optional[_Union[ExportFile, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("conversation_id", "tenant_id")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    tenant_id: str
    def __init__(self, conversation_id: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("cancelled_calls", "message", "cancelled_tool_use_ids", "known_conversation", "cancel_epoch")
    CANCELLED_CALLS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_TOOL_USE_IDS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_CONVERSATION_FIELD_NUMBER: _ClassVar[int]
    CANCEL_EPOCH_FIELD_NUMBER: _ClassVar[int]
    cancelled_calls: int
    message: str
    cancelled_tool_use_ids: _containers.RepeatedScalarFieldContainer[str]
    known_conversation: bool
    cancel_epoch: int
    def __init__(self, cancelled_calls: _Optional[int] = ..., message: _Optional[str] = ..., cancelled_tool_use_ids: _Optional[_Iterable[str]] = ..., known_conversation: _Optional[bool] = ..., cancel_epoch: _Optional[int] = ...) -> None: ...

class ListExecutionLogRequest(_message.Message):
    __slots__ = ("tool_name", "tenant_id", "conversation_id", "limit", "before_id", "model")
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BEFORE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    tool_name: str
    tenant_id: str
    conversation_id: str
    limit: int
    before_id: int
    model: str
    def __init__(self, tool_name: _Optional[str] = ..., tenant_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., limit: _Optional[int] = ..., before_id: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class ExecutionLogEntry(_message.Message):
    __slots__ = ("id", "tool_name", "tenant_id", "input_json", "output_summary", "success", "error", "execution_ms", "created_at", "conversation_id", "user_id", "tool_use_id", "args_hash", "trace_id", "input_truncated", "model")
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
    INPUT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
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
    input_truncated: bool
    model: str
    def __init__(self, id: _Optional[int] = ..., tool_name: _Optional[str] = ..., tenant_id: _Optional[str] = ..., input_json: _Optional[str] = ..., output_summary: _Optional[str] = ..., success: _Optional[bool] = ..., error: _Optional[str] = ..., execution_ms: _Optional[float] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., conversation_id: _Optional[str] = ..., user_id: _Optional[str] = ..., tool_use_id: _Optional[str] = ..., args_hash: _Optional[str] = ..., trace_id: _Optional[str] = ..., input_truncated: _Optional[bool] = ..., model: _Optional[str] = ...) -> None: ...

class ListExecutionLogResponse(_message.Message):
    __slots__ = ("entries", "next_before_id")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_BEFORE_ID_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[ExecutionLogEntry]
    next_before_id: int
    def __init__(self, entries: _Optional[_Iterable[_Union[ExecutionLogEntry, _Mapping]]] = ..., next_before_id: _Optional[int] = ...) -> None: ...

class ListConversationEventsRequest(_message.Message):
    __slots__ = ("conversation_id", "tenant_id", "event_type", "limit", "after_id")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    tenant_id: str
    event_type: str
    limit: int
    after_id: int
    def __init__(self, conversation_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., event_type: _Optional[str] = ..., limit: _Optional[int] = ..., after_id: _Optional[int] = ...) -> None: ...

class ConversationEvent(_message.Message):
    __slots__ = ("id", "event_type", "data_json", "created_at", "tool_use_id", "data_truncated", "data_bytes")
    ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    TOOL_USE_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    DATA_BYTES_FIELD_NUMBER: _ClassVar[int]
    id: int
    event_type: str
    data_json: str
    created_at: _timestamp_pb2.Timestamp
    tool_use_id: str
    data_truncated: bool
    data_bytes: int
    def __init__(self, id: _Optional[int] = ..., event_type: _Optional[str] = ..., data_json: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tool_use_id: _Optional[str] = ..., data_truncated: _Optional[bool] = ..., data_bytes: _Optional[int] = ...) -> None: ...

class GetConversationEventDataRequest(_message.Message):
    __slots__ = ("tenant_id", "conversation_id", "event_id")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    conversation_id: str
    event_id: int
    def __init__(self, tenant_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., event_id: _Optional[int] = ...) -> None: ...

class GetConversationEventDataResponse(_message.Message):
    __slots__ = ("chunk",)
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    chunk: bytes
    def __init__(self, chunk: _Optional[bytes] = ...) -> None: ...

class ListConversationEventsResponse(_message.Message):
    __slots__ = ("events", "next_after_id")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[ConversationEvent]
    next_after_id: int
    def __init__(self, events: _Optional[_Iterable[_Union[ConversationEvent, _Mapping]]] = ..., next_after_id: _Optional[int] = ...) -> None: ...

class PolicyRule(_message.Message):
    __slots__ = ("id", "tenant_id", "name", "kind", "tool_name", "mode", "params_json", "message", "enabled", "created_by", "created_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: int
    tenant_id: str
    name: str
    kind: PolicyRuleKind
    tool_name: str
    mode: PolicyMode
    params_json: str
    message: str
    enabled: bool
    created_by: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[int] = ..., tenant_id: _Optional[str] = ..., name: _Optional[str] = ..., kind: _Optional[_Union[PolicyRuleKind, str]] = ..., tool_name: _Optional[str] = ..., mode: _Optional[_Union[PolicyMode, str]] = ..., params_json: _Optional[str] = ..., message: _Optional[str] = ..., enabled: _Optional[bool] = ..., created_by: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class AddPolicyRuleRequest(_message.Message):
    __slots__ = ("rule",)
    RULE_FIELD_NUMBER: _ClassVar[int]
    rule: PolicyRule
    def __init__(self, rule: _Optional[_Union[PolicyRule, _Mapping]] = ...) -> None: ...

class AddPolicyRuleResponse(_message.Message):
    __slots__ = ("rule",)
    RULE_FIELD_NUMBER: _ClassVar[int]
    rule: PolicyRule
    def __init__(self, rule: _Optional[_Union[PolicyRule, _Mapping]] = ...) -> None: ...

class ListPolicyRulesRequest(_message.Message):
    __slots__ = ("tenant_id", "include_disabled")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DISABLED_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    include_disabled: bool
    def __init__(self, tenant_id: _Optional[str] = ..., include_disabled: _Optional[bool] = ...) -> None: ...

class ListPolicyRulesResponse(_message.Message):
    __slots__ = ("rules",)
    RULES_FIELD_NUMBER: _ClassVar[int]
    rules: _containers.RepeatedCompositeFieldContainer[PolicyRule]
    def __init__(self, rules: _Optional[_Iterable[_Union[PolicyRule, _Mapping]]] = ...) -> None: ...

class DisablePolicyRuleRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class DisablePolicyRuleResponse(_message.Message):
    __slots__ = ("rule",)
    RULE_FIELD_NUMBER: _ClassVar[int]
    rule: PolicyRule
    def __init__(self, rule: _Optional[_Union[PolicyRule, _Mapping]] = ...) -> None: ...
