import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_TYPE_UNSPECIFIED: _ClassVar[ToolType]
    TOOL_TYPE_SYSTEM: _ClassVar[ToolType]
    TOOL_TYPE_CUSTOM: _ClassVar[ToolType]
    TOOL_TYPE_MCP: _ClassVar[ToolType]

class ToolStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_STATUS_UNSPECIFIED: _ClassVar[ToolStatus]
    TOOL_STATUS_DRAFT: _ClassVar[ToolStatus]
    TOOL_STATUS_TESTING: _ClassVar[ToolStatus]
    TOOL_STATUS_APPROVED: _ClassVar[ToolStatus]
    TOOL_STATUS_REJECTED: _ClassVar[ToolStatus]

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_CHAT: _ClassVar[Mode]
    MODE_AGENTIC: _ClassVar[Mode]
    MODE_DELEGATE: _ClassVar[Mode]

class DtypeProvenance(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_PROVENANCE_UNSPECIFIED: _ClassVar[DtypeProvenance]
    DTYPE_PROVENANCE_MEASURED: _ClassVar[DtypeProvenance]
    DTYPE_PROVENANCE_INFERRED: _ClassVar[DtypeProvenance]

class HintKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HINT_KIND_UNSPECIFIED: _ClassVar[HintKind]
    HINT_KIND_SCHEMA: _ClassVar[HintKind]
    HINT_KIND_FETCH: _ClassVar[HintKind]
    HINT_KIND_AMBIGUOUS: _ClassVar[HintKind]
TOOL_TYPE_UNSPECIFIED: ToolType
TOOL_TYPE_SYSTEM: ToolType
TOOL_TYPE_CUSTOM: ToolType
TOOL_TYPE_MCP: ToolType
TOOL_STATUS_UNSPECIFIED: ToolStatus
TOOL_STATUS_DRAFT: ToolStatus
TOOL_STATUS_TESTING: ToolStatus
TOOL_STATUS_APPROVED: ToolStatus
TOOL_STATUS_REJECTED: ToolStatus
MODE_UNSPECIFIED: Mode
MODE_CHAT: Mode
MODE_AGENTIC: Mode
MODE_DELEGATE: Mode
DTYPE_PROVENANCE_UNSPECIFIED: DtypeProvenance
DTYPE_PROVENANCE_MEASURED: DtypeProvenance
DTYPE_PROVENANCE_INFERRED: DtypeProvenance
HINT_KIND_UNSPECIFIED: HintKind
HINT_KIND_SCHEMA: HintKind
HINT_KIND_FETCH: HintKind
HINT_KIND_AMBIGUOUS: HintKind

class ToolDefinition(_message.Message):
    __slots__ = ("id", "name", "description", "input_schema_json", "implementation", "handler_path", "tool_type", "status", "enabled", "category", "domain", "replaced_by_model_capability", "status_message", "large_output", "parent_tool", "dependencies", "version", "tenant_id", "created_by", "rejection_reason", "test_results_json", "deleted_at", "created_at", "updated_at", "required_capabilities", "timeout_seconds", "definition_hash", "annotations")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    IMPLEMENTATION_FIELD_NUMBER: _ClassVar[int]
    HANDLER_PATH_FIELD_NUMBER: _ClassVar[int]
    TOOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    REPLACED_BY_MODEL_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LARGE_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    PARENT_TOOL_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    REJECTION_REASON_FIELD_NUMBER: _ClassVar[int]
    TEST_RESULTS_JSON_FIELD_NUMBER: _ClassVar[int]
    DELETED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_HASH_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    description: str
    input_schema_json: str
    implementation: str
    handler_path: str
    tool_type: ToolType
    status: ToolStatus
    enabled: bool
    category: str
    domain: str
    replaced_by_model_capability: str
    status_message: str
    large_output: bool
    parent_tool: str
    dependencies: _containers.RepeatedScalarFieldContainer[str]
    version: int
    tenant_id: str
    created_by: str
    rejection_reason: str
    test_results_json: str
    deleted_at: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    required_capabilities: _containers.RepeatedScalarFieldContainer[str]
    timeout_seconds: float
    definition_hash: str
    annotations: ToolAnnotations
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ..., implementation: _Optional[str] = ..., handler_path: _Optional[str] = ..., tool_type: _Optional[_Union[ToolType, str]] = ..., status: _Optional[_Union[ToolStatus, str]] = ..., enabled: _Optional[bool] = ..., category: _Optional[str] = ..., domain: _Optional[str] = ..., replaced_by_model_capability: _Optional[str] = ..., status_message: _Optional[str] = ..., large_output: _Optional[bool] = ..., parent_tool: _Optional[str] = ..., dependencies: _Optional[_Iterable[str]] = ..., version: _Optional[int] = ..., tenant_id: _Optional[str] = ..., created_by: _Optional[str] = ..., rejection_reason: _Optional[str] = ..., test_results_json: _Optional[str] = ..., deleted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., required_capabilities: _Optional[_Iterable[str]] = ..., timeout_seconds: _Optional[float] = ..., definition_hash: _Optional[str] = ..., annotations: _Optional[_Union[ToolAnnotations, _Mapping]] = ...) -> None: ...

class ToolAnnotations(_message.Message):
    __slots__ = ("title", "read_only", "destructive", "idempotent", "open_world")
    TITLE_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    DESTRUCTIVE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    OPEN_WORLD_FIELD_NUMBER: _ClassVar[int]
    title: str
    read_only: bool
    destructive: bool
    idempotent: bool
    open_world: bool
    def __init__(self, title: _Optional[str] = ..., read_only: _Optional[bool] = ..., destructive: _Optional[bool] = ..., idempotent: _Optional[bool] = ..., open_world: _Optional[bool] = ...) -> None: ...

class CallContext(_message.Message):
    __slots__ = ("tenant_id", "user_id", "conversation_id", "namespace_id", "capabilities", "mode", "tool_use_id", "reasoning", "budget", "user_message", "dataset_id", "parent_tool_use_id", "depth", "model")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TOOL_USE_ID_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    USER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_TOOL_USE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    user_id: str
    conversation_id: str
    namespace_id: str
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    mode: Mode
    tool_use_id: str
    reasoning: str
    budget: Budget
    user_message: str
    dataset_id: str
    parent_tool_use_id: str
    depth: int
    model: str
    def __init__(self, tenant_id: _Optional[str] = ..., user_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., namespace_id: _Optional[str] = ..., capabilities: _Optional[_Iterable[str]] = ..., mode: _Optional[_Union[Mode, str]] = ..., tool_use_id: _Optional[str] = ..., reasoning: _Optional[str] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., user_message: _Optional[str] = ..., dataset_id: _Optional[str] = ..., parent_tool_use_id: _Optional[str] = ..., depth: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class Budget(_message.Message):
    __slots__ = ("limit_usd", "spent_usd")
    LIMIT_USD_FIELD_NUMBER: _ClassVar[int]
    SPENT_USD_FIELD_NUMBER: _ClassVar[int]
    limit_usd: float
    spent_usd: float
    def __init__(self, limit_usd: _Optional[float] = ..., spent_usd: _Optional[float] = ...) -> None: ...

class ToolUse(_message.Message):
    __slots__ = ("id", "name", "input_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    input_json: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., input_json: _Optional[str] = ...) -> None: ...

class Dataset(_message.Message):
    __slots__ = ("name", "arrow_ipc", "rows", "columns")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    name: str
    arrow_ipc: bytes
    rows: int
    columns: _containers.RepeatedCompositeFieldContainer[ColumnSpec]
    def __init__(self, name: _Optional[str] = ..., arrow_ipc: _Optional[bytes] = ..., rows: _Optional[int] = ..., columns: _Optional[_Iterable[_Union[ColumnSpec, _Mapping]]] = ...) -> None: ...

class Export(_message.Message):
    __slots__ = ("filename", "path", "mime_type", "size_bytes", "source_tool", "original_filename", "file_id")
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TOOL_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_FILENAME_FIELD_NUMBER: _ClassVar[int]
    FILE_ID_FIELD_NUMBER: _ClassVar[int]
    filename: str
    path: str
    mime_type: str
    size_bytes: int
    source_tool: str
    original_filename: str
    file_id: str
    def __init__(self, filename: _Optional[str] = ..., path: _Optional[str] = ..., mime_type: _Optional[str] = ..., size_bytes: _Optional[int] = ..., source_tool: _Optional[str] = ..., original_filename: _Optional[str] = ..., file_id: _Optional[str] = ...) -> None: ...

class ColumnSpec(_message.Message):
    __slots__ = ("name", "dtype", "null_count", "distinct_count", "dtype_provenance")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NULL_COUNT_FIELD_NUMBER: _ClassVar[int]
    DISTINCT_COUNT_FIELD_NUMBER: _ClassVar[int]
    DTYPE_PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    null_count: int
    distinct_count: int
    dtype_provenance: DtypeProvenance
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., null_count: _Optional[int] = ..., distinct_count: _Optional[int] = ..., dtype_provenance: _Optional[_Union[DtypeProvenance, str]] = ...) -> None: ...

class Warning(_message.Message):
    __slots__ = ("kind", "message", "details")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    message: str
    details: _struct_pb2.Struct
    def __init__(self, kind: _Optional[str] = ..., message: _Optional[str] = ..., details: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class Effects(_message.Message):
    __slots__ = ("cards", "datasets", "exports", "cost_usd")
    CARDS_FIELD_NUMBER: _ClassVar[int]
    DATASETS_FIELD_NUMBER: _ClassVar[int]
    EXPORTS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    cards: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    datasets: _containers.RepeatedCompositeFieldContainer[Dataset]
    exports: _containers.RepeatedCompositeFieldContainer[Export]
    cost_usd: float
    def __init__(self, cards: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., datasets: _Optional[_Iterable[_Union[Dataset, _Mapping]]] = ..., exports: _Optional[_Iterable[_Union[Export, _Mapping]]] = ..., cost_usd: _Optional[float] = ...) -> None: ...

class Ok(_message.Message):
    __slots__ = ("rows", "schema", "data_json", "warnings", "effects", "table")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    EFFECTS_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    rows: int
    schema: _containers.RepeatedCompositeFieldContainer[ColumnSpec]
    data_json: str
    warnings: _containers.RepeatedCompositeFieldContainer[Warning]
    effects: Effects
    table: Dataset
    def __init__(self, rows: _Optional[int] = ..., schema: _Optional[_Iterable[_Union[ColumnSpec, _Mapping]]] = ..., data_json: _Optional[str] = ..., warnings: _Optional[_Iterable[_Union[Warning, _Mapping]]] = ..., effects: _Optional[_Union[Effects, _Mapping]] = ..., table: _Optional[_Union[Dataset, _Mapping]] = ...) -> None: ...

class Alternative(_message.Message):
    __slots__ = ("label", "score", "details")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    details: _struct_pb2.Struct
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ..., details: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class Hint(_message.Message):
    __slots__ = ("hint_kind", "message", "alternatives")
    HINT_KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    hint_kind: HintKind
    message: str
    alternatives: _containers.RepeatedCompositeFieldContainer[Alternative]
    def __init__(self, hint_kind: _Optional[_Union[HintKind, str]] = ..., message: _Optional[str] = ..., alternatives: _Optional[_Iterable[_Union[Alternative, _Mapping]]] = ...) -> None: ...

class Err(_message.Message):
    __slots__ = ("message", "err_kind")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERR_KIND_FIELD_NUMBER: _ClassVar[int]
    message: str
    err_kind: str
    def __init__(self, message: _Optional[str] = ..., err_kind: _Optional[str] = ...) -> None: ...

class Envelope(_message.Message):
    __slots__ = ("ok", "hint", "err")
    OK_FIELD_NUMBER: _ClassVar[int]
    HINT_FIELD_NUMBER: _ClassVar[int]
    ERR_FIELD_NUMBER: _ClassVar[int]
    ok: Ok
    hint: Hint
    err: Err
    def __init__(self, ok: _Optional[_Union[Ok, _Mapping]] = ..., hint: _Optional[_Union[Hint, _Mapping]] = ..., err: _Optional[_Union[Err, _Mapping]] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ("content", "cards", "cost_usd", "datasets", "exports", "error", "envelope")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CARDS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    DATASETS_FIELD_NUMBER: _ClassVar[int]
    EXPORTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    content: str
    cards: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    cost_usd: float
    datasets: _containers.RepeatedCompositeFieldContainer[Dataset]
    exports: _containers.RepeatedCompositeFieldContainer[Export]
    error: str
    envelope: Envelope
    def __init__(self, content: _Optional[str] = ..., cards: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., cost_usd: _Optional[float] = ..., datasets: _Optional[_Iterable[_Union[Dataset, _Mapping]]] = ..., exports: _Optional[_Iterable[_Union[Export, _Mapping]]] = ..., error: _Optional[str] = ..., envelope: _Optional[_Union[Envelope, _Mapping]] = ...) -> None: ...
