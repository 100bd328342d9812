"""tool_definitions.annotations: an MCP tool's title and behaviour hints (readOnly, destructive,
idempotent, openWorld) as the bridge accepted them from the server

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing rows get NULL: the bridge fills the column in on its next listing of each
    # connection (restore, reconnect or an announced change); their definition hashes, which
    # have always counted the annotations, stay valid.
    op.add_column("tool_definitions", sa.Column("annotations", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tool_definitions") as batch:
        batch.drop_column("annotations")
