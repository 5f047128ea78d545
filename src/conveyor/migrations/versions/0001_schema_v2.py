"""Schema v2: immutable tasks, per-group delivery state, streams, groups, keys,
queue settings, maintenance history, and the protocol version.

Revision ID: 0001
Revises:
Create Date: 2026-11-29 13:10:45.928336
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conveyor_counts",
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("grp", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("queue", "grp", "status"),
    )
    op.create_table(
        "conveyor_groups",
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("start_at", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("queue", "name"),
    )
    op.create_table(
        "conveyor_maintenance",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("ran_at", sa.BigInteger(), nullable=False),
        sa.Column("recovered", sa.Integer(), nullable=False),
        sa.Column("expired", sa.Integer(), nullable=False),
        sa.Column("evicted", sa.Integer(), nullable=False),
        sa.Column("deleted", sa.Integer(), nullable=False),
        sa.Column("duration", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("conveyor_maintenance", schema=None) as batch_op:
        batch_op.create_index("ix_conveyor_maintenance_ran_at", ["ran_at"], unique=False)

    op.create_table(
        "conveyor_meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_table(
        "conveyor_queues",
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("lease", sa.Float(), nullable=True),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("backoff", sa.Text(), nullable=True),
        sa.Column("retention", sa.Float(), nullable=True),
        sa.Column("max_wait", sa.Float(), nullable=True),
        sa.Column("queue_mode", sa.Boolean(), nullable=True),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("queue"),
    )
    op.create_table(
        "conveyor_streams",
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("grp", sa.String(length=255), nullable=False),
        sa.Column("partition", sa.String(length=255), nullable=False),
        sa.Column("head_seq", sa.BigInteger(), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=True),
        sa.Column("available_at", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("queue", "grp", "partition"),
    )
    with op.batch_alter_table("conveyor_streams", schema=None) as batch_op:
        batch_op.create_index(
            "ix_conveyor_streams_available",
            ["grp", "queue", "available_at"],
            unique=False,
            postgresql_where=sa.text("available_at IS NOT NULL"),
            sqlite_where=sa.text("available_at IS NOT NULL"),
        )

    op.create_table(
        "conveyor_tasks",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("id", sa.String(length=26), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("partition", sa.String(length=255), nullable=True),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("metadata", sa.Text(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("backoff", sa.Text(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("run_at", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=True),
        sa.Column("parent_id", sa.String(length=26), nullable=True),
        sa.Column("root_id", sa.String(length=26), nullable=False),
        sa.Column("correlation_id", sa.String(length=255), nullable=True),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("id"),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("conveyor_tasks", schema=None) as batch_op:
        batch_op.create_index(
            "ix_conveyor_tasks_correlation_seq", ["correlation_id", "seq"], unique=False
        )
        batch_op.create_index("ix_conveyor_tasks_name_seq", ["name", "seq"], unique=False)
        batch_op.create_index("ix_conveyor_tasks_parent", ["parent_id"], unique=False)
        batch_op.create_index(
            "ix_conveyor_tasks_queue_created", ["queue", "created_at"], unique=False
        )
        batch_op.create_index("ix_conveyor_tasks_queue_seq", ["queue", "seq"], unique=False)
        batch_op.create_index("ix_conveyor_tasks_root_seq", ["root_id", "seq"], unique=False)

    op.create_table(
        "conveyor_deliveries",
        sa.Column("task_seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("grp", sa.String(length=255), nullable=False),
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("partition", sa.String(length=255), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("run_at", sa.BigInteger(), nullable=False),
        sa.Column("lease_expires_at", sa.BigInteger(), nullable=True),
        sa.Column("lease", sa.Float(), nullable=True),
        sa.Column("worker_id", sa.String(length=255), nullable=True),
        sa.Column("started_at", sa.BigInteger(), nullable=True),
        sa.Column("finished_at", sa.BigInteger(), nullable=True),
        sa.Column("progress", sa.Float(), nullable=True),
        sa.Column("progress_message", sa.Text(), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("rolled", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.ForeignKeyConstraint(["task_seq"], ["conveyor_tasks.seq"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("task_seq", "grp"),
    )
    with op.batch_alter_table("conveyor_deliveries", schema=None) as batch_op:
        batch_op.create_index(
            "ix_conveyor_deliveries_finished",
            ["queue", "finished_at"],
            unique=False,
            postgresql_where=sa.text("finished_at IS NOT NULL"),
            sqlite_where=sa.text("finished_at IS NOT NULL"),
        )
        batch_op.create_index(
            "ix_conveyor_deliveries_leased",
            ["grp", "queue", "lease_expires_at"],
            unique=False,
            postgresql_where=sa.text("status = 'running'"),
            sqlite_where=sa.text("status = 'running'"),
        )
        batch_op.create_index(
            "ix_conveyor_deliveries_ready",
            ["grp", "queue", sa.literal_column("priority DESC"), "run_at", "task_seq"],
            unique=False,
            postgresql_where=sa.text("status = 'queued' AND partition IS NULL"),
            sqlite_where=sa.text("status = 'queued' AND partition IS NULL"),
        )
        batch_op.create_index(
            "ix_conveyor_deliveries_unrolled",
            ["queue", "grp", "status"],
            unique=False,
            postgresql_where=sa.text("rolled = 0"),
            sqlite_where=sa.text("rolled = 0"),
        )
        batch_op.create_index(
            "ix_conveyor_deliveries_status", ["grp", "queue", "status", "task_seq"], unique=False
        )
        batch_op.create_index(
            "ix_conveyor_deliveries_stream",
            ["grp", "queue", "partition", "task_seq"],
            unique=False,
            postgresql_where=sa.text("status IN ('queued', 'running') AND partition IS NOT NULL"),
            sqlite_where=sa.text("status IN ('queued', 'running') AND partition IS NOT NULL"),
        )

    op.create_table(
        "conveyor_keys",
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("task_id", sa.String(length=26), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    with op.batch_alter_table("conveyor_keys", schema=None) as batch_op:
        batch_op.create_index("ix_conveyor_keys_task", ["task_id"], unique=False)

    meta = sa.table("conveyor_meta", sa.column("key", sa.String), sa.column("value", sa.Text))
    op.bulk_insert(meta, [{"key": "protocol_version", "value": "2"}])


def downgrade() -> None:
    with op.batch_alter_table("conveyor_keys", schema=None) as batch_op:
        batch_op.drop_index("ix_conveyor_keys_task")

    op.drop_table("conveyor_keys")
    with op.batch_alter_table("conveyor_deliveries", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_conveyor_deliveries_stream",
            postgresql_where=sa.text("status IN ('queued', 'running') AND partition IS NOT NULL"),
            sqlite_where=sa.text("status IN ('queued', 'running') AND partition IS NOT NULL"),
        )
        batch_op.drop_index("ix_conveyor_deliveries_status")
        batch_op.drop_index("ix_conveyor_deliveries_unrolled")
        batch_op.drop_index(
            "ix_conveyor_deliveries_ready",
            postgresql_where=sa.text("status = 'queued' AND partition IS NULL"),
            sqlite_where=sa.text("status = 'queued' AND partition IS NULL"),
        )
        batch_op.drop_index(
            "ix_conveyor_deliveries_leased",
            postgresql_where=sa.text("status = 'running'"),
            sqlite_where=sa.text("status = 'running'"),
        )
        batch_op.drop_index(
            "ix_conveyor_deliveries_finished",
            postgresql_where=sa.text("finished_at IS NOT NULL"),
            sqlite_where=sa.text("finished_at IS NOT NULL"),
        )

    op.drop_table("conveyor_deliveries")
    with op.batch_alter_table("conveyor_tasks", schema=None) as batch_op:
        batch_op.drop_index("ix_conveyor_tasks_root_seq")
        batch_op.drop_index("ix_conveyor_tasks_queue_seq")
        batch_op.drop_index("ix_conveyor_tasks_queue_created")
        batch_op.drop_index("ix_conveyor_tasks_parent")
        batch_op.drop_index("ix_conveyor_tasks_name_seq")
        batch_op.drop_index("ix_conveyor_tasks_correlation_seq")

    op.drop_table("conveyor_tasks")
    with op.batch_alter_table("conveyor_streams", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_conveyor_streams_available",
            postgresql_where=sa.text("available_at IS NOT NULL"),
            sqlite_where=sa.text("available_at IS NOT NULL"),
        )

    op.drop_table("conveyor_streams")
    op.drop_table("conveyor_queues")
    op.drop_table("conveyor_meta")
    with op.batch_alter_table("conveyor_maintenance", schema=None) as batch_op:
        batch_op.drop_index("ix_conveyor_maintenance_ran_at")

    op.drop_table("conveyor_maintenance")
    op.drop_table("conveyor_groups")
    op.drop_table("conveyor_counts")
