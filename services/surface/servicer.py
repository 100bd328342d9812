"""The surface service's gRPC servicer: converts requests, awaits the core, converts responses."""

from __future__ import annotations

import grpc

from services.surface.core import Caller, SurfaceCore
from shared import convert
from shared.llm.config import ModelConfig
from toolmesh.surface.v1 import surface_pb2 as spb
from toolmesh.surface.v1 import surface_pb2_grpc
from toolmesh.type.v1 import types_pb2 as pb


def model_to_pb(cfg: ModelConfig) -> spb.ModelConfig:
    return spb.ModelConfig(
        provider=cfg.provider,
        model=cfg.model,
        capabilities=sorted(cfg.capabilities),
        max_output_tokens=cfg.max_output_tokens,
        roles=list(cfg.roles),
        input_price_per_mtok=cfg.input_price_per_mtok,
        output_price_per_mtok=cfg.output_price_per_mtok,
        cache_read_price_per_mtok=cfg.cache_read_price_per_mtok,
        cache_write_price_per_mtok=cfg.cache_write_price_per_mtok,
    )


def model_from_pb(m: spb.ModelConfig) -> ModelConfig:
    return ModelConfig(
        model=m.model.strip(),
        provider=m.provider.strip(),
        max_output_tokens=m.max_output_tokens,
        roles=tuple(dict.fromkeys(r.strip() for r in m.roles if r.strip())),
        capabilities=frozenset(c.strip() for c in m.capabilities if c.strip()),
        input_price_per_mtok=m.input_price_per_mtok,
        output_price_per_mtok=m.output_price_per_mtok,
        cache_read_price_per_mtok=m.cache_read_price_per_mtok,
        cache_write_price_per_mtok=m.cache_write_price_per_mtok,
    )


def _mode(mode: int) -> str:
    return convert.MODES.get(mode, "chat") if mode else "chat"


class SurfaceServicer(surface_pb2_grpc.SurfaceServiceServicer):
    def __init__(self, core: SurfaceCore) -> None:
        self._core = core

    async def AssembleTools(
        self, request: spb.AssembleToolsRequest, context: grpc.aio.ServicerContext
    ) -> spb.AssembleToolsResponse:
        convert.check_ids(
            [
                ("tenant_id", request.tenant_id),
                ("conversation_id", request.conversation_id),
                ("namespace_id", request.namespace_id),
                ("model", request.model),
            ]
        )
        surface = await self._core.assemble(
            Caller(
                request.tenant_id,
                frozenset(request.capabilities),
                request.conversation_id,
                request.namespace_id,
                _mode(request.mode),
                request.model,
            )
        )
        return spb.AssembleToolsResponse(
            tools=[
                spb.SurfaceTool(
                    name=t.name,
                    anthropic_json=t.anthropic_json,
                    openai_json=t.openai_json,
                    resident=resident,
                )
                for t, resident in surface.tools
            ],
            skipped=surface.skipped,
            filtered=surface.filtered,
            floor_source=self._core.floor_source,
        )

    async def SearchTools(
        self, request: spb.SearchToolsRequest, context: grpc.aio.ServicerContext
    ) -> spb.SearchToolsResponse:
        ctx: pb.CallContext = request.context
        convert.check_ids([*convert.context_ids(ctx), ("model", request.model)])
        # The request's model, else the context's (a client that only fills the context).
        model = request.model or ctx.model
        outcome = await self._core.search(
            request.query,
            request.limit,
            Caller(
                ctx.tenant_id,
                frozenset(ctx.capabilities),
                ctx.conversation_id,
                ctx.namespace_id,
                _mode(ctx.mode),
                model,
            ),
        )
        catalog = await self._core.catalog()
        return spb.SearchToolsResponse(
            matches=[
                spb.ToolMatch(name=m.name, score=m.score, description=m.description)
                for m in outcome.matches
            ],
            paged_in=outcome.paged_in,
            refusal=outcome.refusal,
            already_available=outcome.already_available,
            hybrid=catalog.index.hybrid,
        )

    async def DeriveTier0(
        self, request: spb.DeriveTier0Request, context: grpc.aio.ServicerContext
    ) -> spb.DeriveTier0Response:
        derivation = await self._core.derive_tier0()
        return spb.DeriveTier0Response(names=derivation.names, warning=derivation.warning)

    async def GetWorkingSet(
        self, request: spb.GetWorkingSetRequest, context: grpc.aio.ServicerContext
    ) -> spb.GetWorkingSetResponse:
        convert.check_ids(
            [
                ("conversation_id", request.conversation_id),
                ("namespace_id", request.namespace_id),
            ]
        )
        names = await self._core.working_set(request.conversation_id, request.namespace_id)
        return spb.GetWorkingSetResponse(names=names)

    async def ListModelConfigs(
        self, request: spb.ListModelConfigsRequest, context: grpc.aio.ServicerContext
    ) -> spb.ListModelConfigsResponse:
        return spb.ListModelConfigsResponse(
            configs=[model_to_pb(c) for c in await self._core.list_models()]
        )

    async def UpsertModelConfig(
        self, request: spb.UpsertModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> spb.UpsertModelConfigResponse:
        stored = await self._core.upsert_model(model_from_pb(request.config))
        return spb.UpsertModelConfigResponse(config=model_to_pb(stored))
