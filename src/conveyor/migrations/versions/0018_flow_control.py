"""Flow control: per-queue concurrency, key concurrency, rate limits and fair
claims (conveyor.store.protocol.limits); each task's concurrency key, copied to
its delivery rows; the rate limits' state.

Revision ID: 0018
Revises: 0017
Create Date: 2027-01-12 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_QUEUE_COLUMNS = (
    ("concurrency", sa.Integer),
    ("key_concurrency", sa.Integer),
    ("rate_limit", sa.Integer),
    ("rate_per", sa.Float),
    ("key_rate_limit", sa.Integer),
    ("key_rate_per", sa.Float),
    ("fair", sa.Boolean),
)


def upgrade() -> None:
    # ADD COLUMN on both backends (no table rebuild): nullable columns, NULL in
    # every existing row (no limit, no key).
    for name, kind in _QUEUE_COLUMNS:
        op.add_column("conveyor_queues", sa.Column(name, kind(), nullable=True))
    op.add_column("conveyor_tasks", sa.Column("concurrency_key", sa.String(255), nullable=True))
    op.add_column(
        "conveyor_deliveries", sa.Column("concurrency_key", sa.String(255), nullable=True)
    )
    op.create_index(
        "ix_conveyor_deliveries_ready_key",
        "conveyor_deliveries",
        ["grp", "queue", "concurrency_key", sa.text("priority DESC"), "run_at", "task_seq"],
        postgresql_where=sa.text("status = 'queued' AND partition IS NULL"),
        sqlite_where=sa.text("status = 'queued' AND partition IS NULL"),
    )
    op.create_index(
        "ix_conveyor_deliveries_running_key",
        "conveyor_deliveries",
        ["grp", "queue", "concurrency_key", "lease_expires_at"],
        postgresql_where=sa.text("status = 'running' AND concurrency_key IS NOT NULL"),
        sqlite_where=sa.text("status = 'running' AND concurrency_key IS NOT NULL"),
    )
    op.create_table(
        "conveyor_rate_state",
        sa.Column("queue", sa.String(255), primary_key=True),
        sa.Column("grp", sa.String(255), primary_key=True),
        sa.Column("scope", sa.SmallInteger(), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("tat", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("conveyor_rate_state")
    op.drop_index("ix_conveyor_deliveries_running_key", table_name="conveyor_deliveries")
    op.drop_index("ix_conveyor_deliveries_ready_key", table_name="conveyor_deliveries")
    # DROP COLUMN in place on both backends (SQLite >= 3.35): a batch-mode table
    # rebuild would recreate the delivery indexes without their DESC columns, and
    # on SQLite its rename of the rebuilt task table fails on the dependency
    # release trigger (revision 0017), which names that table.
    op.execute("ALTER TABLE conveyor_deliveries DROP COLUMN concurrency_key")
    op.execute("ALTER TABLE conveyor_tasks DROP COLUMN concurrency_key")
    for name, _ in reversed(_QUEUE_COLUMNS):
        op.execute(f"ALTER TABLE conveyor_queues DROP COLUMN {name}")
