"""Pause and resume: the paused queues and consumer groups.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 14:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conveyor_pauses",
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("grp", sa.String(length=255), nullable=False),
        sa.Column("paused_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("queue", "grp"),
    )


def downgrade() -> None:
    op.drop_table("conveyor_pauses")
