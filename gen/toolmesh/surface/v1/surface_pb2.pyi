from toolmesh.type.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AssembleToolsRequest(_message.Message):
    __slots__ = ("tenant_id", "capabilities", "conversation_id", "namespace_id", "mode", "model")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    conversation_id: str
    namespace_id: str
    mode: _types_pb2.Mode
    model: str
    def __init__(self, tenant_id: _Optional[str] = ..., capabilities: _Optional[_Iterable[str]] = ..., conversation_id: _Optional[str] = ..., namespace_id: _Optional[str] = ..., mode: _Optional[_Union[_types_pb2.Mode, str]] = ..., model: _Optional[str] = ...) -> None: ...

class SurfaceTool(_message.Message):
    __slots__ = ("name", "anthropic_json", "openai_json", "resident")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ANTHROPIC_JSON_FIELD_NUMBER: _ClassVar[int]
    OPENAI_JSON_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    anthropic_json: str
    openai_json: str
    resident: bool
    def __init__(self, name: _Optional[str] = ..., anthropic_json: _Optional[str] = ..., openai_json: _Optional[str] = ..., resident: _Optional[bool] = ...) -> None: ...

class AssembleToolsResponse(_message.Message):
    __slots__ = ("tools", "skipped", "filtered", "floor_source")
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    FILTERED_FIELD_NUMBER: _ClassVar[int]
    FLOOR_SOURCE_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[SurfaceTool]
    skipped: _containers.RepeatedScalarFieldContainer[str]
    filtered: _containers.RepeatedScalarFieldContainer[str]
    floor_source: str
    def __init__(self, tools: _Optional[_Iterable[_Union[SurfaceTool, _Mapping]]] = ..., skipped: _Optional[_Iterable[str]] = ..., filtered: _Optional[_Iterable[str]] = ..., floor_source: _Optional[str] = ...) -> None: ...

class SearchToolsRequest(_message.Message):
    __slots__ = ("query", "limit", "context", "model")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    query: str
    limit: int
    context: _types_pb2.CallContext
    model: str
    def __init__(self, query: _Optional[str] = ..., limit: _Optional[int] = ..., context: _Optional[_Union[_types_pb2.CallContext, _Mapping]] = ..., model: _Optional[str] = ...) -> None: ...

class ToolMatch(_message.Message):
    __slots__ = ("name", "score", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    score: float
    description: str
    def __init__(self, name: _Optional[str] = ..., score: _Optional[float] = ..., description: _Optional[str] = ...) -> None: ...

class SearchToolsResponse(_message.Message):
    __slots__ = ("matches", "paged_in", "refusal", "already_available", "hybrid")
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    PAGED_IN_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    ALREADY_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    HYBRID_FIELD_NUMBER: _ClassVar[int]
    matches: _containers.RepeatedCompositeFieldContainer[ToolMatch]
    paged_in: _containers.RepeatedScalarFieldContainer[str]
    refusal: str
    already_available: _containers.RepeatedScalarFieldContainer[str]
    hybrid: bool
    def __init__(self, matches: _Optional[_Iterable[_Union[ToolMatch, _Mapping]]] = ..., paged_in: _Optional[_Iterable[str]] = ..., refusal: _Optional[str] = ..., already_available: _Optional[_Iterable[str]] = ..., hybrid: _Optional[bool] = ...) -> None: ...

class DeriveTier0Request(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeriveTier0Response(_message.Message):
    __slots__ = ("names", "warning")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    WARNING_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    warning: str
    def __init__(self, names: _Optional[_Iterable[str]] = ..., warning: _Optional[str] = ...) -> None: ...

class GetWorkingSetRequest(_message.Message):
    __slots__ = ("conversation_id", "namespace_id")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    namespace_id: str
    def __init__(self, conversation_id: _Optional[str] = ..., namespace_id: _Optional[str] = ...) -> None: ...

class GetWorkingSetResponse(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelConfig(_message.Message):
    __slots__ = ("provider", "model", "capabilities", "max_output_tokens", "roles", "input_price_per_mtok", "output_price_per_mtok", "cache_read_price_per_mtok", "cache_write_price_per_mtok")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    INPUT_PRICE_PER_MTOK_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_PRICE_PER_MTOK_FIELD_NUMBER: _ClassVar[int]
    CACHE_READ_PRICE_PER_MTOK_FIELD_NUMBER: _ClassVar[int]
    CACHE_WRITE_PRICE_PER_MTOK_FIELD_NUMBER: _ClassVar[int]
    provider: str
    model: str
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    max_output_tokens: int
    roles: _containers.RepeatedScalarFieldContainer[str]
    input_price_per_mtok: float
    output_price_per_mtok: float
    cache_read_price_per_mtok: float
    cache_write_price_per_mtok: float
    def __init__(self, provider: _Optional[str] = ..., model: _Optional[str] = ..., capabilities: _Optional[_Iterable[str]] = ..., max_output_tokens: _Optional[int] = ..., roles: _Optional[_Iterable[str]] = ..., input_price_per_mtok: _Optional[float] = ..., output_price_per_mtok: _Optional[float] = ..., cache_read_price_per_mtok: _Optional[float] = ..., cache_write_price_per_mtok: _Optional[float] = ...) -> None: ...

class ListModelConfigsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelConfigsResponse(_message.Message):
    __slots__ = ("configs",)
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    configs: _containers.RepeatedCompositeFieldContainer[ModelConfig]
    def __init__(self, configs: _Optional[_Iterable[_Union[ModelConfig, _Mapping]]] = ...) -> None: ...

class UpsertModelConfigRequest(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: ModelConfig
    def __init__(self, config: _Optional[_Union[ModelConfig, _Mapping]] = ...) -> None: ...

class UpsertModelConfigResponse(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: ModelConfig
    def __init__(self, config: _Optional[_Union[ModelConfig, _Mapping]] = ...) -> None: ...
