from google.protobuf import struct_pb2 as _struct_pb2
from toolmesh.type.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Transport(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSPORT_UNSPECIFIED: _ClassVar[Transport]
    TRANSPORT_STDIO: _ClassVar[Transport]
    TRANSPORT_STREAMABLE_HTTP: _ClassVar[Transport]

class ConnectionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONNECTION_STATE_UNSPECIFIED: _ClassVar[ConnectionState]
    CONNECTION_STATE_CONNECTED: _ClassVar[ConnectionState]
    CONNECTION_STATE_CONNECTING: _ClassVar[ConnectionState]
    CONNECTION_STATE_FAILED: _ClassVar[ConnectionState]
    CONNECTION_STATE_DISCONNECTED: _ClassVar[ConnectionState]
TRANSPORT_UNSPECIFIED: Transport
TRANSPORT_STDIO: Transport
TRANSPORT_STREAMABLE_HTTP: Transport
CONNECTION_STATE_UNSPECIFIED: ConnectionState
CONNECTION_STATE_CONNECTED: ConnectionState
CONNECTION_STATE_CONNECTING: ConnectionState
CONNECTION_STATE_FAILED: ConnectionState
CONNECTION_STATE_DISCONNECTED: ConnectionState

class ServerConfig(_message.Message):
    __slots__ = ("name", "transport", "command", "args", "env", "url", "headers", "tenant_id")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    transport: Transport
    command: str
    args: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    url: str
    headers: _containers.ScalarMap[str, str]
    tenant_id: str
    def __init__(self, name: _Optional[str] = ..., transport: _Optional[_Union[Transport, str]] = ..., command: _Optional[str] = ..., args: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., url: _Optional[str] = ..., headers: _Optional[_Mapping[str, str]] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class ConnectRequest(_message.Message):
    __slots__ = ("server",)
    SERVER_FIELD_NUMBER: _ClassVar[int]
    server: ServerConfig
    def __init__(self, server: _Optional[_Union[ServerConfig, _Mapping]] = ...) -> None: ...

class ConnectResponse(_message.Message):
    __slots__ = ("tools_discovered", "tool_names", "renamed", "held", "skipped")
    TOOLS_DISCOVERED_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAMES_FIELD_NUMBER: _ClassVar[int]
    RENAMED_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    tools_discovered: int
    tool_names: _containers.RepeatedScalarFieldContainer[str]
    renamed: _containers.RepeatedScalarFieldContainer[str]
    held: _containers.RepeatedScalarFieldContainer[str]
    skipped: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tools_discovered: _Optional[int] = ..., tool_names: _Optional[_Iterable[str]] = ..., renamed: _Optional[_Iterable[str]] = ..., held: _Optional[_Iterable[str]] = ..., skipped: _Optional[_Iterable[str]] = ...) -> None: ...

class DisconnectRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DisconnectResponse(_message.Message):
    __slots__ = ("removed_tools",)
    REMOVED_TOOLS_FIELD_NUMBER: _ClassVar[int]
    removed_tools: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, removed_tools: _Optional[_Iterable[str]] = ...) -> None: ...

class ReconnectRequest(_message.Message):
    __slots__ = ("name", "server")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    name: str
    server: ServerConfig
    def __init__(self, name: _Optional[str] = ..., server: _Optional[_Union[ServerConfig, _Mapping]] = ...) -> None: ...

class ReconnectResponse(_message.Message):
    __slots__ = ("added", "removed", "changed", "tool_names", "renamed")
    ADDED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAMES_FIELD_NUMBER: _ClassVar[int]
    RENAMED_FIELD_NUMBER: _ClassVar[int]
    added: _containers.RepeatedScalarFieldContainer[str]
    removed: _containers.RepeatedScalarFieldContainer[str]
    changed: _containers.RepeatedScalarFieldContainer[str]
    tool_names: _containers.RepeatedScalarFieldContainer[str]
    renamed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, added: _Optional[_Iterable[str]] = ..., removed: _Optional[_Iterable[str]] = ..., changed: _Optional[_Iterable[str]] = ..., tool_names: _Optional[_Iterable[str]] = ..., renamed: _Optional[_Iterable[str]] = ...) -> None: ...

class ListConnectionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Connection(_message.Message):
    __slots__ = ("server", "state", "server_name", "server_version", "protocol_version", "tool_names", "last_error", "session_id", "restarts", "tool_list_changes", "last_tool_change")
    SERVER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SERVER_NAME_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAMES_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    TOOL_LIST_CHANGES_FIELD_NUMBER: _ClassVar[int]
    LAST_TOOL_CHANGE_FIELD_NUMBER: _ClassVar[int]
    server: ServerConfig
    state: ConnectionState
    server_name: str
    server_version: str
    protocol_version: str
    tool_names: _containers.RepeatedScalarFieldContainer[str]
    last_error: str
    session_id: str
    restarts: int
    tool_list_changes: int
    last_tool_change: ReconnectResponse
    def __init__(self, server: _Optional[_Union[ServerConfig, _Mapping]] = ..., state: _Optional[_Union[ConnectionState, str]] = ..., server_name: _Optional[str] = ..., server_version: _Optional[str] = ..., protocol_version: _Optional[str] = ..., tool_names: _Optional[_Iterable[str]] = ..., last_error: _Optional[str] = ..., session_id: _Optional[str] = ..., restarts: _Optional[int] = ..., tool_list_changes: _Optional[int] = ..., last_tool_change: _Optional[_Union[ReconnectResponse, _Mapping]] = ...) -> None: ...

class ListConnectionsResponse(_message.Message):
    __slots__ = ("connections",)
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    connections: _containers.RepeatedCompositeFieldContainer[Connection]
    def __init__(self, connections: _Optional[_Iterable[_Union[Connection, _Mapping]]] = ...) -> None: ...

class CallToolRequest(_message.Message):
    __slots__ = ("connection", "tool", "arguments_json", "context", "timeout_seconds")
    CONNECTION_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    connection: str
    tool: str
    arguments_json: str
    context: _types_pb2.CallContext
    timeout_seconds: float
    def __init__(self, connection: _Optional[str] = ..., tool: _Optional[str] = ..., arguments_json: _Optional[str] = ..., context: _Optional[_Union[_types_pb2.CallContext, _Mapping]] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("progress", "total", "message")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    progress: float
    total: float
    message: str
    def __init__(self, progress: _Optional[float] = ..., total: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class CallToolResponse(_message.Message):
    __slots__ = ("progress", "result", "structured_content", "structured_content_json")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_CONTENT_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_CONTENT_JSON_FIELD_NUMBER: _ClassVar[int]
    progress: Progress
    result: _types_pb2.ToolResult
    structured_content: _struct_pb2.Struct
    structured_content_json: str
    def __init__(self, progress: _Optional[_Union[Progress, _Mapping]] = ..., result: _Optional[_Union[_types_pb2.ToolResult, _Mapping]] = ..., structured_content: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., structured_content_json: _Optional[str] = ...) -> None: ...

class CallToolUnaryRequest(_message.Message):
    __slots__ = ("connection", "tool", "arguments_json", "context", "timeout_seconds")
    CONNECTION_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    connection: str
    tool: str
    arguments_json: str
    context: _types_pb2.CallContext
    timeout_seconds: float
    def __init__(self, connection: _Optional[str] = ..., tool: _Optional[str] = ..., arguments_json: _Optional[str] = ..., context: _Optional[_Union[_types_pb2.CallContext, _Mapping]] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class CallToolUnaryResponse(_message.Message):
    __slots__ = ("result", "structured_content_json")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_CONTENT_JSON_FIELD_NUMBER: _ClassVar[int]
    result: _types_pb2.ToolResult
    structured_content_json: str
    def __init__(self, result: _Optional[_Union[_types_pb2.ToolResult, _Mapping]] = ..., structured_content_json: _Optional[str] = ...) -> None: ...
