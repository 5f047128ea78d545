"""Live workers: a row per worker, written at its start and every few seconds.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conveyor_workers",
        sa.Column("worker_id", sa.String(length=255), nullable=False),
        sa.Column("queues", sa.Text(), nullable=False),
        sa.Column("grp", sa.String(length=255), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("seen_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("worker_id"),
    )


def downgrade() -> None:
    op.drop_table("conveyor_workers")
