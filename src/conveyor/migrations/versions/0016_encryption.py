"""Encryption at rest: a queue's ``encrypt`` setting and the key id of each task's
sealed values.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 14:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("conveyor_queues") as batch:
        batch.add_column(sa.Column("encrypt", sa.Boolean(), nullable=True))
    # ADD COLUMN on both backends (no table rebuild): a nullable column, NULL in
    # every existing row (plain).
    op.add_column("conveyor_tasks", sa.Column("key_id", sa.String(64), nullable=True))
    op.create_index(
        "ix_conveyor_tasks_key_id",
        "conveyor_tasks",
        ["key_id", "seq"],
        postgresql_where=sa.text("key_id IS NOT NULL"),
        sqlite_where=sa.text("key_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_conveyor_tasks_key_id", table_name="conveyor_tasks")
    with op.batch_alter_table("conveyor_tasks") as batch:
        batch.drop_column("key_id")
    with op.batch_alter_table("conveyor_queues") as batch:
        batch.drop_column("encrypt")
