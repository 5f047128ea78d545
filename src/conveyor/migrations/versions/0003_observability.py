"""Observability roll-ups: finished tasks per minute, and finished totals per task name.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 06:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conveyor_throughput",
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("grp", sa.String(length=255), nullable=False),
        sa.Column("minute", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("queue", "grp", "minute", "status"),
    )
    op.create_table(
        "conveyor_totals",
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("grp", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("queue", "grp", "name", "status"),
    )


def downgrade() -> None:
    op.drop_table("conveyor_totals")
    op.drop_table("conveyor_throughput")
