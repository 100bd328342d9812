import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from toolmesh.type.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExecuteToolRequest(_message.Message):
    __slots__ = ("name", "input_json", "context")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    name: str
    input_json: str
    context: _types_pb2.CallContext
    def __init__(self, name: _Optional[str] = ..., input_json: _Optional[str] = ..., context: _Optional[_Union[_types_pb2.CallContext, _Mapping]] = ...) -> None: ...

class ExecuteToolResponse(_message.Message):
    __slots__ = ("result", "tool_type", "execution_ms")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    TOOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_MS_FIELD_NUMBER: _ClassVar[int]
    result: _types_pb2.ToolResult
    tool_type: _types_pb2.ToolType
    execution_ms: float
    def __init__(self, result: _Optional[_Union[_types_pb2.ToolResult, _Mapping]] = ..., tool_type: _Optional[_Union[_types_pb2.ToolType, str]] = ..., execution_ms: _Optional[float] = ...) -> None: ...

class ExecuteToolStreamRequest(_message.Message):
    __slots__ = ("name", "input_json", "context")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    name: str
    input_json: str
    context: _types_pb2.CallContext
    def __init__(self, name: _Optional[str] = ..., input_json: _Optional[str] = ..., context: _Optional[_Union[_types_pb2.CallContext, _Mapping]] = ...) -> None: ...

class ToolProgress(_message.Message):
    __slots__ = ("message", "fraction", "data_json")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    message: str
    fraction: float
    data_json: str
    def __init__(self, message: _Optional[str] = ..., fraction: _Optional[float] = ..., data_json: _Optional[str] = ...) -> None: ...

class ExecuteToolStreamResponse(_message.Message):
    __slots__ = ("progress", "result")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    progress: ToolProgress
    result: ExecuteToolResponse
    def __init__(self, progress: _Optional[_Union[ToolProgress, _Mapping]] = ..., result: _Optional[_Union[ExecuteToolResponse, _Mapping]] = ...) -> None: ...

class GetToolsForLLMRequest(_message.Message):
    __slots__ = ("tenant_id",)
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    def __init__(self, tenant_id: _Optional[str] = ...) -> None: ...

class LlmTool(_message.Message):
    __slots__ = ("name", "description", "input_schema_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    input_schema_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ...) -> None: ...

class GetToolsForLLMResponse(_message.Message):
    __slots__ = ("tools",)
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[LlmTool]
    def __init__(self, tools: _Optional[_Iterable[_Union[LlmTool, _Mapping]]] = ...) -> None: ...

class ListToolsRequest(_message.Message):
    __slots__ = ("tenant_id", "tool_type", "include_deleted", "category", "created_by")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DELETED_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    tool_type: _types_pb2.ToolType
    include_deleted: bool
    category: str
    created_by: str
    def __init__(self, tenant_id: _Optional[str] = ..., tool_type: _Optional[_Union[_types_pb2.ToolType, str]] = ..., include_deleted: _Optional[bool] = ..., category: _Optional[str] = ..., created_by: _Optional[str] = ...) -> None: ...

class ListToolsResponse(_message.Message):
    __slots__ = ("tools",)
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[_types_pb2.ToolDefinition]
    def __init__(self, tools: _Optional[_Iterable[_Union[_types_pb2.ToolDefinition, _Mapping]]] = ...) -> None: ...

class GetToolRequest(_message.Message):
    __slots__ = ("name", "tenant_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    tenant_id: str
    def __init__(self, name: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class GetToolResponse(_message.Message):
    __slots__ = ("tool",)
    TOOL_FIELD_NUMBER: _ClassVar[int]
    tool: _types_pb2.ToolDefinition
    def __init__(self, tool: _Optional[_Union[_types_pb2.ToolDefinition, _Mapping]] = ...) -> None: ...

class SeedSystemToolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SeedSystemToolsResponse(_message.Message):
    __slots__ = ("created", "updated", "unchanged", "retired", "unknown")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    created: _containers.RepeatedScalarFieldContainer[str]
    updated: _containers.RepeatedScalarFieldContainer[str]
    unchanged: _containers.RepeatedScalarFieldContainer[str]
    retired: _containers.RepeatedScalarFieldContainer[str]
    unknown: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, created: _Optional[_Iterable[str]] = ..., updated: _Optional[_Iterable[str]] = ..., unchanged: _Optional[_Iterable[str]] = ..., retired: _Optional[_Iterable[str]] = ..., unknown: _Optional[_Iterable[str]] = ...) -> None: ...

class UpsertToolsRequest(_message.Message):
    __slots__ = ("tools", "mcp_listing")
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    MCP_LISTING_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[_types_pb2.ToolDefinition]
    mcp_listing: bool
    def __init__(self, tools: _Optional[_Iterable[_Union[_types_pb2.ToolDefinition, _Mapping]]] = ..., mcp_listing: _Optional[bool] = ...) -> None: ...

class UpsertToolsResponse(_message.Message):
    __slots__ = ("tools",)
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[_types_pb2.ToolDefinition]
    def __init__(self, tools: _Optional[_Iterable[_Union[_types_pb2.ToolDefinition, _Mapping]]] = ...) -> None: ...

class DeleteToolsRequest(_message.Message):
    __slots__ = ("names", "created_by")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    created_by: str
    def __init__(self, names: _Optional[_Iterable[str]] = ..., created_by: _Optional[str] = ...) -> None: ...

class DeleteToolsResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, deleted: _Optional[_Iterable[str]] = ...) -> None: ...

class SetToolStatusRequest(_message.Message):
    __slots__ = ("name", "status", "reason", "enabled")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    name: str
    status: _types_pb2.ToolStatus
    reason: str
    enabled: bool
    def __init__(self, name: _Optional[str] = ..., status: _Optional[_Union[_types_pb2.ToolStatus, str]] = ..., reason: _Optional[str] = ..., enabled: _Optional[bool] = ...) -> None: ...

class SetToolStatusResponse(_message.Message):
    __slots__ = ("tool",)
    TOOL_FIELD_NUMBER: _ClassVar[int]
    tool: _types_pb2.ToolDefinition
    def __init__(self, tool: _Optional[_Union[_types_pb2.ToolDefinition, _Mapping]] = ...) -> None: ...

class GetContractStatsRequest(_message.Message):
    __slots__ = ("tool_name",)
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    tool_name: str
    def __init__(self, tool_name: _Optional[str] = ...) -> None: ...

class ContractStats(_message.Message):
    __slots__ = ("tool_name", "ok_count", "hint_count", "err_count", "hint_kinds", "err_kinds", "contract_violation_count", "coerced_count")
    class HintKindsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ErrKindsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    OK_COUNT_FIELD_NUMBER: _ClassVar[int]
    HINT_COUNT_FIELD_NUMBER: _ClassVar[int]
    ERR_COUNT_FIELD_NUMBER: _ClassVar[int]
    HINT_KINDS_FIELD_NUMBER: _ClassVar[int]
    ERR_KINDS_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_VIOLATION_COUNT_FIELD_NUMBER: _ClassVar[int]
    COERCED_COUNT_FIELD_NUMBER: _ClassVar[int]
    tool_name: str
    ok_count: int
    hint_count: int
    err_count: int
    hint_kinds: _containers.ScalarMap[str, int]
    err_kinds: _containers.ScalarMap[str, int]
    contract_violation_count: int
    coerced_count: int
    def __init__(self, tool_name: _Optional[str] = ..., ok_count: _Optional[int] = ..., hint_count: _Optional[int] = ..., err_count: _Optional[int] = ..., hint_kinds: _Optional[_Mapping[str, int]] = ..., err_kinds: _Optional[_Mapping[str, int]] = ..., contract_violation_count: _Optional[int] = ..., coerced_count: _Optional[int] = ...) -> None: ...

class GetContractStatsResponse(_message.Message):
    __slots__ = ("stats", "counting_since", "instance")
    STATS_FIELD_NUMBER: _ClassVar[int]
    COUNTING_SINCE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    stats: _containers.RepeatedCompositeFieldContainer[ContractStats]
    counting_since: _timestamp_pb2.Timestamp
    instance: str
    def __init__(self, stats: _Optional[_Iterable[_Union[ContractStats, _Mapping]]] = ..., counting_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., instance: _Optional[str] = ...) -> None: ...

class GetUsageStatsRequest(_message.Message):
    __slots__ = ("group_by", "since", "tool_name", "tenant_id")
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    group_by: str
    since: _timestamp_pb2.Timestamp
    tool_name: str
    tenant_id: str
    def __init__(self, group_by: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tool_name: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class UsageStats(_message.Message):
    __slots__ = ("key", "calls", "errors", "error_rate", "p50_ms", "p95_ms", "cost_usd", "llm_calls", "tokens")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P95_MS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    LLM_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    key: str
    calls: int
    errors: int
    error_rate: float
    p50_ms: float
    p95_ms: float
    cost_usd: float
    llm_calls: int
    tokens: int
    def __init__(self, key: _Optional[str] = ..., calls: _Optional[int] = ..., errors: _Optional[int] = ..., error_rate: _Optional[float] = ..., p50_ms: _Optional[float] = ..., p95_ms: _Optional[float] = ..., cost_usd: _Optional[float] = ..., llm_calls: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class GetUsageStatsResponse(_message.Message):
    __slots__ = ("stats", "since", "total_cost_usd")
    STATS_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COST_USD_FIELD_NUMBER: _ClassVar[int]
    stats: _containers.RepeatedCompositeFieldContainer[UsageStats]
    since: _timestamp_pb2.Timestamp
    total_cost_usd: float
    def __init__(self, stats: _Optional[_Iterable[_Union[UsageStats, _Mapping]]] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., total_cost_usd: _Optional[float] = ...) -> None: ...
