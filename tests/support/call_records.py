"""CallRecords for call-log tests: one call of tool `ping` by user u1 in conversation (t1, c1),
answered Ok; a test overrides what it is about."""

from __future__ import annotations

from typing import Any

from services.dispatcher.logstore import CallRecord


def call_record(tool_use_id: str, **overrides: Any) -> CallRecord:
    fields: dict[str, Any] = {
        "tool_name": "ping",
        "tenant_id": "t1",
        "user_id": "u1",
        "conversation_id": "c1",
        "tool_use_id": tool_use_id,
        "args_hash": "0123456789abcdef",
        "input_data": {},
        "output_summary": "ok",
        "success": True,
        "error": None,
        "execution_ms": 1.0,
        "trace_id": "ab" * 16,
    }
    fields.update(overrides)
    return CallRecord(**fields)
