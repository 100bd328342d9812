"""tool_execution_log.model: the conversation's model as the agent back end named it in the
call's context (empty when it named none), so the log answers "which model's calls fail, cost,
loop" without joining traces

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 03:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rows logged before it get "" (no model was recorded for them).
    op.add_column(
        "tool_execution_log",
        sa.Column("model", sa.String(128), nullable=False, server_default=""),
    )


def downgrade() -> None:
    with op.batch_alter_table("tool_execution_log") as batch:
        batch.drop_column("model")
