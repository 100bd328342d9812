import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from toolmesh.type.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATUS_UNSPECIFIED: _ClassVar[JobStatus]
    JOB_STATUS_QUEUED: _ClassVar[JobStatus]
    JOB_STATUS_BUILDING: _ClassVar[JobStatus]
    JOB_STATUS_TESTING: _ClassVar[JobStatus]
    JOB_STATUS_APPROVED: _ClassVar[JobStatus]
    JOB_STATUS_REJECTED: _ClassVar[JobStatus]
    JOB_STATUS_FAILED: _ClassVar[JobStatus]

class JobType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_TYPE_UNSPECIFIED: _ClassVar[JobType]
    JOB_TYPE_BUILD: _ClassVar[JobType]
    JOB_TYPE_AUDIT: _ClassVar[JobType]
    JOB_TYPE_REBUILD: _ClassVar[JobType]
JOB_STATUS_UNSPECIFIED: JobStatus
JOB_STATUS_QUEUED: JobStatus
JOB_STATUS_BUILDING: JobStatus
JOB_STATUS_TESTING: JobStatus
JOB_STATUS_APPROVED: JobStatus
JOB_STATUS_REJECTED: JobStatus
JOB_STATUS_FAILED: JobStatus
JOB_TYPE_UNSPECIFIED: JobType
JOB_TYPE_BUILD: JobType
JOB_TYPE_AUDIT: JobType
JOB_TYPE_REBUILD: JobType

class ExecutionLimits(_message.Message):
    __slots__ = ("wall_seconds", "cpu_seconds", "memory_bytes", "output_bytes", "max_tool_calls")
    WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    wall_seconds: float
    cpu_seconds: float
    memory_bytes: int
    output_bytes: int
    max_tool_calls: int
    def __init__(self, wall_seconds: _Optional[float] = ..., cpu_seconds: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., output_bytes: _Optional[int] = ..., max_tool_calls: _Optional[int] = ...) -> None: ...

class ExecuteRequest(_message.Message):
    __slots__ = ("tool_name", "code", "input_json", "context", "limits", "df")
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    DF_FIELD_NUMBER: _ClassVar[int]
    tool_name: str
    code: str
    input_json: str
    context: _types_pb2.CallContext
    limits: ExecutionLimits
    df: _types_pb2.Dataset
    def __init__(self, tool_name: _Optional[str] = ..., code: _Optional[str] = ..., input_json: _Optional[str] = ..., context: _Optional[_Union[_types_pb2.CallContext, _Mapping]] = ..., limits: _Optional[_Union[ExecutionLimits, _Mapping]] = ..., df: _Optional[_Union[_types_pb2.Dataset, _Mapping]] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("result", "execution_ms", "tool_calls")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_MS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    result: _types_pb2.ToolResult
    execution_ms: float
    tool_calls: int
    def __init__(self, result: _Optional[_Union[_types_pb2.ToolResult, _Mapping]] = ..., execution_ms: _Optional[float] = ..., tool_calls: _Optional[int] = ...) -> None: ...

class RegisterCustomToolRequest(_message.Message):
    __slots__ = ("tool",)
    TOOL_FIELD_NUMBER: _ClassVar[int]
    tool: _types_pb2.ToolDefinition
    def __init__(self, tool: _Optional[_Union[_types_pb2.ToolDefinition, _Mapping]] = ...) -> None: ...

class RegisterCustomToolResponse(_message.Message):
    __slots__ = ("tool",)
    TOOL_FIELD_NUMBER: _ClassVar[int]
    tool: _types_pb2.ToolDefinition
    def __init__(self, tool: _Optional[_Union[_types_pb2.ToolDefinition, _Mapping]] = ...) -> None: ...

class SetCustomToolStatusRequest(_message.Message):
    __slots__ = ("name", "tenant_id", "status", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    tenant_id: str
    status: _types_pb2.ToolStatus
    reason: str
    def __init__(self, name: _Optional[str] = ..., tenant_id: _Optional[str] = ..., status: _Optional[_Union[_types_pb2.ToolStatus, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class SetCustomToolStatusResponse(_message.Message):
    __slots__ = ("tool",)
    TOOL_FIELD_NUMBER: _ClassVar[int]
    tool: _types_pb2.ToolDefinition
    def __init__(self, tool: _Optional[_Union[_types_pb2.ToolDefinition, _Mapping]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "tool_name", "job_type", "status", "spec_json", "result_json", "progress_pct", "tenant_id", "conversation_id", "created_at", "updated_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_PCT_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    tool_name: str
    job_type: JobType
    status: JobStatus
    spec_json: str
    result_json: str
    progress_pct: int
    tenant_id: str
    conversation_id: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., tool_name: _Optional[str] = ..., job_type: _Optional[_Union[JobType, str]] = ..., status: _Optional[_Union[JobStatus, str]] = ..., spec_json: _Optional[str] = ..., result_json: _Optional[str] = ..., progress_pct: _Optional[int] = ..., tenant_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SubmitBuildJobRequest(_message.Message):
    __slots__ = ("request", "tool_name", "context", "request_id")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request: str
    tool_name: str
    context: _types_pb2.CallContext
    request_id: str
    def __init__(self, request: _Optional[str] = ..., tool_name: _Optional[str] = ..., context: _Optional[_Union[_types_pb2.CallContext, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class SubmitBuildJobResponse(_message.Message):
    __slots__ = ("job", "replayed")
    JOB_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    job: Job
    replayed: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("id", "tenant_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant_id: str
    def __init__(self, id: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("tenant_id", "limit")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    limit: int
    def __init__(self, tenant_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...
