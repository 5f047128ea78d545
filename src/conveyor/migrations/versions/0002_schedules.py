"""Registry of periodic schedules (``@app.periodic``), listed by ``conveyor schedules``.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 06:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conveyor_schedules",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("task", sa.String(length=255), nullable=False),
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("catch_up", sa.String(length=8), nullable=False),
        sa.Column("handled_until", sa.BigInteger(), nullable=True),
        sa.Column("last_tick", sa.BigInteger(), nullable=True),
        sa.Column("last_task_id", sa.String(length=26), nullable=True),
        sa.Column("next_tick", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("conveyor_schedules")
