"""Attribute and metric names used on spans and metrics, in one place. Most follow the
OpenTelemetry GenAI and MCP semantic conventions; the cost attributes follow a convention
that is still a proposal, so they live here and nowhere else."""

from __future__ import annotations

# GenAI operation / tool attributes.
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_TOOL_DESCRIPTION = "gen_ai.tool.description"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
ERROR_TYPE = "error.type"

OPERATION_EXECUTE_TOOL = "execute_tool"
OPERATION_CHAT = "chat"

# Cost (proposed convention): recorded on leaf spans only — LLM calls and paid tools.
GEN_AI_USAGE_COST_AMOUNT = "gen_ai.usage.cost.amount"
GEN_AI_USAGE_COST_CURRENCY = "gen_ai.usage.cost.currency"
COST_CURRENCY = "USD"
# The rollup of a call's leaves, on its execute_tool span: a separate attribute, so summing
# the leaf attribute over a trace never counts a cost twice.
TOOLMESH_COST_ROLLUP_AMOUNT = "toolmesh.cost.rollup.amount"

# toolmesh attributes.
TOOLMESH_TENANT_ID = "toolmesh.tenant.id"
TOOLMESH_USER_ID = "toolmesh.user.id"
TOOLMESH_ENVELOPE_KIND = "toolmesh.envelope.kind"

# W3C baggage keys the mesh propagates — the allowlist copied onto every span (as attributes
# of the same name). The dispatcher sets them from the caller it serves and drops any baggage
# a client sent; nothing else is copied.
BAGGAGE_TENANT_ID = TOOLMESH_TENANT_ID
BAGGAGE_CONVERSATION_ID = GEN_AI_CONVERSATION_ID
BAGGAGE_ALLOWLIST = frozenset({BAGGAGE_TENANT_ID, BAGGAGE_CONVERSATION_ID})

# Metric instruments.
METRIC_EXECUTE_TOOL_DURATION = "gen_ai.execute_tool.duration"
METRIC_CLIENT_TOKEN_USAGE = "gen_ai.client.token.usage"
METRIC_CLIENT_OPERATION_DURATION = "gen_ai.client.operation.duration"
METRIC_MCP_CLIENT_OPERATION_DURATION = "mcp.client.operation.duration"
METRIC_TOOL_CALLS = "toolmesh.tool.calls"
METRIC_COST = "toolmesh.cost"
