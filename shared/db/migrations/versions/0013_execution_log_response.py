"""tool_execution_log.response: the response a call the client named (by tool_use id, in a
conversation) was answered with, so a retried call is answered from the log instead of running
its tool again; indexed by conversation and tool_use id for that lookup

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rows logged before it have none: their calls are not replayed.
    op.add_column("tool_execution_log", sa.Column("response", sa.LargeBinary(), nullable=True))
    op.create_index(
        "ix_tool_execution_log_tool_use",
        "tool_execution_log",
        ["conversation_id", "tool_use_id"],
        sqlite_where=sa.text("response IS NOT NULL"),
        postgresql_where=sa.text("response IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_tool_execution_log_tool_use", table_name="tool_execution_log")
    with op.batch_alter_table("tool_execution_log") as batch:
        batch.drop_column("response")
