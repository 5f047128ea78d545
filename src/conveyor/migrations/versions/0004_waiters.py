"""Pending wait() calls: a completion is announced only when someone waits for it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conveyor_waiters",
        sa.Column("task_id", sa.String(length=26), nullable=False),
        sa.Column("token", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("task_id", "token"),
    )


def downgrade() -> None:
    op.drop_table("conveyor_waiters")
