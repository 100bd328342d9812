"""effects: generated_files and the export catalog (issue 3: effects of a result)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 18:15:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "generated_files",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("file_id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("conversation_id", sa.String(length=128), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("tool_use_id", sa.String(length=128), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("mime_type", sa.String(length=255), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("source_tool", sa.String(length=128), nullable=False),
        sa.Column("original_filename", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_generated_files")),
        sa.UniqueConstraint("file_id", name=op.f("uq_generated_files_file_id")),
    )
    op.create_index(
        "ix_generated_files_conv",
        "generated_files",
        ["tenant_id", "conversation_id", "id"],
        unique=False,
    )
    op.create_table(
        "export_catalog",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("conversation_id", sa.String(length=128), nullable=False),
        sa.Column("namespace_id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("file_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_export_catalog")),
    )
    op.create_index(
        "ix_export_catalog_name",
        "export_catalog",
        ["tenant_id", "conversation_id", "namespace_id", "name"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_export_catalog_name", table_name="export_catalog")
    op.drop_table("export_catalog")
    op.drop_index("ix_generated_files_conv", table_name="generated_files")
    op.drop_table("generated_files")
