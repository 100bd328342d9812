"""surface: working sets, surface misses, the pinned seed log (issue 6)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 17:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "working_set_entries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("conversation_id", sa.String(length=128), nullable=False),
        sa.Column("namespace_id", sa.String(length=128), nullable=False),
        sa.Column("tool_name", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_working_set_entries")),
        sa.UniqueConstraint(
            "conversation_id", "namespace_id", "tool_name", name="uq_working_set_entries_key"
        ),
    )
    op.create_table(
        "surface_misses",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tool_name", sa.String(length=128), nullable=False),
        sa.Column("day", sa.DateTime(timezone=True), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_surface_misses")),
        sa.UniqueConstraint("tool_name", "day", name="uq_surface_misses_key"),
    )
    op.create_table(
        "seed_log",
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("pinned", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_seed_log")),
    )


def downgrade() -> None:
    op.drop_table("seed_log")
    op.drop_table("surface_misses")
    op.drop_table("working_set_entries")
