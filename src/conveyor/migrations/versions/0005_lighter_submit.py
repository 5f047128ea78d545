"""A lighter submit: fewer index entries and no foreign-key check per task.

Every submit writes a task row and its delivery rows, so each index of those
tables and each constraint check is paid per task. This revision keeps the ones
some query needs and shrinks or drops the rest:

* ``conveyor_deliveries.task_seq`` loses its FOREIGN KEY to ``conveyor_tasks``
  (ON DELETE CASCADE). Its check ran a trigger and a probe of the task row for
  every delivery row inserted (~18 % of a 1,000-task submit's server time on
  Postgres). Delivery rows are only ever written beside their task, and the one
  delete of tasks (retention) deletes their delivery rows in the same
  transaction, so the constraint guarded nothing the protocol does not.
* ``ix_conveyor_tasks_queue_created`` is dropped: no query needs it (a new
  group's backfill walks the queue by ``seq``, which ``ix_conveyor_tasks_queue_seq``
  serves; its ``created_at`` filter rides along).
* ``ix_conveyor_tasks_parent`` and ``ix_conveyor_tasks_correlation_seq`` become
  partial (``IS NOT NULL``): most tasks have neither, and their lookups
  (``col = :x``) still use them on both backends.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# SQLite reflects the foreign key without a name; batch mode names it by this
# convention so it can be dropped (the table is rebuilt without it).
_SQLITE_NAMES = {"fk": "fk_%(table_name)s_%(column_0_name)s"}
_SQLITE_FK = "fk_conveyor_deliveries_task_seq"
_PG_FK = "conveyor_deliveries_task_seq_fkey"  # Postgres's name for 0001's constraint


# conveyor_deliveries' indexes as 0001 made them, in 0001's order. SQLite drops a
# foreign key by rebuilding the table, and batch mode rebuilds the indexes from
# reflection, which loses ``priority DESC`` of the ready index and reorders them
# (the planner breaks ties between equal-cost indexes by that order); so they are
# built again exactly, after each rebuild.
_DELIVERY_INDEXES: list[tuple[str, list[str | sa.ColumnElement[str]], str | None]] = [
    ("ix_conveyor_deliveries_finished", ["queue", "finished_at"], "finished_at IS NOT NULL"),
    (
        "ix_conveyor_deliveries_leased",
        ["grp", "queue", "lease_expires_at"],
        "status = 'running'",
    ),
    (
        "ix_conveyor_deliveries_ready",
        ["grp", "queue", sa.literal_column("priority DESC"), "run_at", "task_seq"],
        "status = 'queued' AND partition IS NULL",
    ),
    ("ix_conveyor_deliveries_unrolled", ["queue", "grp", "status"], "rolled = 0"),
    ("ix_conveyor_deliveries_status", ["grp", "queue", "status", "task_seq"], None),
    (
        "ix_conveyor_deliveries_stream",
        ["grp", "queue", "partition", "task_seq"],
        "status IN ('queued', 'running') AND partition IS NOT NULL",
    ),
]


def _rebuild_sqlite_deliveries(change: str) -> None:
    """SQLite: rebuild conveyor_deliveries with (``change="add"``) or without its
    foreign key, then its indexes exactly as 0001 made them."""
    with op.batch_alter_table(
        "conveyor_deliveries", schema=None, naming_convention=_SQLITE_NAMES
    ) as batch_op:
        if change == "add":
            batch_op.create_foreign_key(
                _SQLITE_FK, "conveyor_tasks", ["task_seq"], ["seq"], ondelete="CASCADE"
            )
        else:
            batch_op.drop_constraint(_SQLITE_FK, type_="foreignkey")
    for name, _, _ in _DELIVERY_INDEXES:
        op.drop_index(name, table_name="conveyor_deliveries")
    for name, columns, where in _DELIVERY_INDEXES:
        if where is None:
            op.create_index(name, "conveyor_deliveries", columns, unique=False)
        else:
            op.create_index(
                name,
                "conveyor_deliveries",
                columns,
                unique=False,
                sqlite_where=sa.text(where),
            )


def _partial(name: str, columns: list[str], where: str | None) -> None:
    with op.batch_alter_table("conveyor_tasks", schema=None) as batch_op:
        batch_op.drop_index(name)
        if where is None:
            batch_op.create_index(name, columns, unique=False)
        else:
            batch_op.create_index(
                name,
                columns,
                unique=False,
                postgresql_where=sa.text(where),
                sqlite_where=sa.text(where),
            )


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        _rebuild_sqlite_deliveries("drop")
    else:
        for fk in sa.inspect(bind).get_foreign_keys("conveyor_deliveries"):
            op.drop_constraint(fk["name"] or _PG_FK, "conveyor_deliveries", type_="foreignkey")
    with op.batch_alter_table("conveyor_tasks", schema=None) as batch_op:
        batch_op.drop_index("ix_conveyor_tasks_queue_created")
    _partial("ix_conveyor_tasks_parent", ["parent_id"], "parent_id IS NOT NULL")
    _partial(
        "ix_conveyor_tasks_correlation_seq",
        ["correlation_id", "seq"],
        "correlation_id IS NOT NULL",
    )


def downgrade() -> None:
    _partial("ix_conveyor_tasks_correlation_seq", ["correlation_id", "seq"], None)
    _partial("ix_conveyor_tasks_parent", ["parent_id"], None)
    with op.batch_alter_table("conveyor_tasks", schema=None) as batch_op:
        batch_op.create_index(
            "ix_conveyor_tasks_queue_created", ["queue", "created_at"], unique=False
        )
    # A delivery row without its task (none is ever written; this is for safety)
    # would make the constraint fail to build.
    op.execute(
        "DELETE FROM conveyor_deliveries WHERE NOT EXISTS "
        "(SELECT 1 FROM conveyor_tasks AS t WHERE t.seq = conveyor_deliveries.task_seq)"
    )
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        _rebuild_sqlite_deliveries("add")
    else:
        op.create_foreign_key(
            _PG_FK,
            "conveyor_deliveries",
            "conveyor_tasks",
            ["task_seq"],
            ["seq"],
            ondelete="CASCADE",
        )
