"""sandbox: custom tools and the tool-building pipeline (issue 4)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 17:45:00
"""

from collections.abc import Sequence

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nothing to add: the sandbox stores custom tools in tool_definitions and build jobs in
    # tool_jobs, both created by 0001 with every column and index it uses (jobs are claimed by
    # status and created_at: ix_tool_jobs_status_created). The revision keeps the chain intact.
    pass


def downgrade() -> None:
    pass
