"""tool_definitions.listing_capabilities: of an MCP tool's required capabilities, those the MCP
bridge's last listing added (its destructive gate), so that the next listing can take them off
again and leave an administrator's alone

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07 00:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing rows get NULL (nothing recorded): at its next listing the bridge counts the
    # capabilities it asks for that a row already has as its own (the repository's
    # _listing_values), and every other capability as an administrator's.
    op.add_column("tool_definitions", sa.Column("listing_capabilities", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tool_definitions") as batch:
        batch.drop_column("listing_capabilities")
