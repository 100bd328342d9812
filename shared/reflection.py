"""Server reflection under both of its names: `grpc.reflection.v1alpha.ServerReflection` (what
grpcio-reflection serves) and `grpc.reflection.v1.ServerReflection`, the stable name that
current clients ask for first (grpcurl, buf curl, grpc-go's and grpc-java's reflection clients,
Postman) and some ask for only.

The two protocols are the same on the wire: v1 is v1alpha under a new package, with the same
messages and field numbers. So the one servicer answers both, and the v1 file descriptor is made
from v1alpha's by renaming its package, so that a client can also describe the v1 service."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

V1ALPHA_SERVICE = reflection.SERVICE_NAME  # grpc.reflection.v1alpha.ServerReflection
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE = f"{V1_PACKAGE}.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"
_ALPHA_PACKAGE = "grpc.reflection.v1alpha"


def _v1_file() -> descriptor_pb2.FileDescriptorProto:
    """v1alpha's reflection.proto as v1: same messages, package and type references renamed."""
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = V1_FILE
    proto.package = V1_PACKAGE
    proto.options.Clear()
    proto.options.java_package = "io.grpc.reflection.v1"
    proto.options.java_multiple_files = True
    proto.options.java_outer_classname = "ServerReflectionProto"
    alpha, v1 = f".{_ALPHA_PACKAGE}.", f".{V1_PACKAGE}."

    def rename(messages: Any) -> None:
        for message in messages:
            for field in message.field:
                if field.type_name.startswith(alpha):
                    field.type_name = v1 + field.type_name[len(alpha) :]
            rename(message.nested_type)

    rename(proto.message_type)
    for service in proto.service:
        for method in service.method:
            method.input_type = v1 + method.input_type[len(alpha) :]
            method.output_type = v1 + method.output_type[len(alpha) :]
    return proto


def register_v1_descriptor(pool: descriptor_pool.DescriptorPool | None = None) -> None:
    """Add the v1 file to `pool` (the default pool, which reflection answers from), once."""
    pool = pool or descriptor_pool.Default()
    try:
        pool.FindFileByName(V1_FILE)
        return
    except KeyError:
        pass
    pool.AddSerializedFile(_v1_file().SerializeToString())


def enable(service_names: Sequence[str], server: Any) -> None:
    """Serve reflection of `service_names` (plus both reflection services) on `server` (a
    grpc.aio server, or anything with its add_* methods), under v1alpha and v1."""
    register_v1_descriptor()
    names = [*service_names, V1_SERVICE, V1ALPHA_SERVICE]
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE, {"ServerReflectionInfo": v1}),)
    )
