"""tool_jobs leases: claimed_by, claimed_at (renewed by the worker's heartbeat) and attempts,
so a job whose worker died in building/testing is claimed again, a bounded number of times

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 07:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Jobs already in building/testing have no lease (claimed_at NULL) and workers of older
    # releases never renew one: the first new worker to look claims such a job again (in a
    # rolling upgrade, one an old worker is still running may be built twice).
    op.add_column("tool_jobs", sa.Column("claimed_by", sa.String(length=128), nullable=True))
    op.add_column("tool_jobs", sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "tool_jobs", sa.Column("attempts", sa.Integer(), nullable=False, server_default="0")
    )


def downgrade() -> None:
    with op.batch_alter_table("tool_jobs") as batch:
        batch.drop_column("attempts")
        batch.drop_column("claimed_at")
        batch.drop_column("claimed_by")
