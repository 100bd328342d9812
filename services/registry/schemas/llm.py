"""Schemas of the "llm" system tools: `call_llm` (a sub-question answered by a model, charged
to the call) and `query_telemetry` (calls, error rates, durations and cost from the logs).
Handlers live in services/registry/tools/llm.py."""

from __future__ import annotations

from typing import Any

_HANDLERS = "services.registry.tools.llm"

TOOLS: list[dict[str, Any]] = [
    {
        "name": "call_llm",
        "description": (
            "Ask a language model a focused sub-question and get its text answer, e.g. to "
            "summarise, classify or rewrite a passage. The model is the one configured for the "
            "`call_llm` role; the call's token usage and USD cost are recorded and count "
            "against the call's budget."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "prompt": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 200000,
                    "description": "The question or instruction, with any text it is about.",
                },
                "system": {
                    "type": "string",
                    "maxLength": 20000,
                    "description": "Optional system prompt replacing the default one.",
                },
                "max_output_tokens": {
                    "type": "integer",
                    "minimum": 1,
                    "description": (
                        "Upper bound on the answer's length in tokens; capped by the model "
                        "config's max_output_tokens."
                    ),
                },
            },
            "required": ["prompt"],
            "additionalProperties": False,
        },
        "category": "llm",
        "handler_path": f"{_HANDLERS}.call_llm",
        "status_message": "Asking the model",
        "large_output": False,
    },
    {
        "name": "query_telemetry",
        "description": (
            "Operational statistics of tool calls from the execution and usage logs: calls, "
            "error rate, p50/p95 duration and USD cost, grouped by tool, tenant, user or "
            "conversation, over a recent window. Answers questions such as 'which tools fail "
            "most this week' or 'what did tenant X spend today'. Only the caller's own tenant "
            "is visible unless the caller holds the `telemetry_admin` capability."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "group_by": {
                    "type": "string",
                    "enum": ["tool", "tenant", "user", "conversation", "model"],
                    "description": (
                        "How to group the statistics (default tool); model: calls by the "
                        "conversation's model, LLM cost and tokens by the model that answered."
                    ),
                },
                "since_hours": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": 8784,
                    "description": "Look back this many hours (default 24).",
                },
                "tool": {"type": "string", "description": "Only this tool."},
                "tenant": {
                    "type": "string",
                    "description": "Only this tenant (needs telemetry_admin unless it's yours).",
                },
            },
            "additionalProperties": False,
        },
        "category": "llm",
        "handler_path": f"{_HANDLERS}.query_telemetry",
        "status_message": "Reading telemetry",
        "large_output": False,
    },
]
