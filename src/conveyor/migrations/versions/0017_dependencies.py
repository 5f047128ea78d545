"""Task dependencies and batches: ``conveyor_dependencies``, ``conveyor_batches``,
the ``waiting_on`` and ``has_dependents`` columns of the deliveries, and the
release trigger.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 01:30:00

The release is a trigger on ``conveyor_deliveries``: when a queue-mode row that
has dependents (``has_dependents``, set by the submit of a child) moves from
waiting, queued or running to a terminal status, its unresolved edges are
resolved in that same statement's transaction: each waiting child counts one
parent less and is queued when none is left; a child whose parent did not
succeed is cancelled, with an error naming the parent, unless the edge runs on
failure. Every path that finishes a row (the acknowledgements, a final failure,
a lease recovered on the last attempt, eviction, cancel, a replaced key's
holder, the bulk actions) releases through it, whatever statement it runs, so
no path can forget to; a row without dependents meets only the WHEN clause. A
cancelled child's own update fires the trigger again: the cascade (SQLite needs
``PRAGMA recursive_triggers``, which every store connection sets).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_TERMINAL = "('succeeded', 'failed', 'cancelled', 'evicted')"
_FROM = "('waiting', 'queued', 'running')"

_PG_FUNCTION = """
CREATE FUNCTION conveyor_release_dependents() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    parent_id text := (SELECT t.id FROM conveyor_tasks AS t WHERE t.seq = NEW.task_seq);
    at bigint := coalesce(NEW.finished_at, 0);
    told bigint;
BEGIN
    WITH edges AS (
        UPDATE conveyor_dependencies AS e SET resolved = true
        WHERE e.parent_seq = NEW.task_seq AND NOT e.resolved
        RETURNING e.task_seq, (NEW.status <> 'succeeded' AND NOT e.run_on_failure) AS cancel
    ),
    moved AS (
        UPDATE conveyor_deliveries AS c SET
            waiting_on = c.waiting_on - 1,
            status = CASE WHEN x.cancel THEN 'cancelled'
                          WHEN c.waiting_on <= 1 THEN 'queued' ELSE 'waiting' END,
            run_at = CASE WHEN NOT x.cancel AND c.waiting_on <= 1
                          THEN greatest(c.run_at, at) ELSE c.run_at END,
            finished_at = CASE WHEN x.cancel THEN at ELSE c.finished_at END,
            error = CASE WHEN x.cancel THEN json_build_object(
                'type', 'ParentFailed', 'code', 'parent_failed',
                'message', 'parent ' || parent_id || ' ' || NEW.status,
                'parent_id', parent_id, 'parent_status', NEW.status)::text
                ELSE c.error END
        FROM edges AS x
        WHERE c.task_seq = x.task_seq AND c.grp = '' AND c.status = 'waiting'
        RETURNING c.task_seq, c.queue, c.status
    )
    SELECT count(pg_notify('conveyor_work', w.queue))
        + (SELECT count(pg_notify('conveyor_done', t.id))
           FROM moved AS m JOIN conveyor_tasks AS t ON t.seq = m.task_seq
           WHERE m.status = 'cancelled'
             AND EXISTS (SELECT 1 FROM conveyor_waiters AS k WHERE k.task_id = t.id))
    INTO told
    FROM (SELECT DISTINCT queue FROM moved WHERE status = 'queued') AS w;
    RETURN NULL;
END
$$
"""

_PG_TRIGGER = f"""
CREATE TRIGGER conveyor_release AFTER UPDATE OF status ON conveyor_deliveries
FOR EACH ROW
WHEN (NEW.grp = '' AND NEW.has_dependents AND OLD.status IN {_FROM}
      AND NEW.status IN {_TERMINAL})
EXECUTE FUNCTION conveyor_release_dependents()
"""

# SQLite evaluates every SET expression on the row as it was, as Postgres does;
# the children are updated before their edges are marked resolved.
_SQLITE_TRIGGER = f"""
CREATE TRIGGER conveyor_release AFTER UPDATE OF status ON conveyor_deliveries
FOR EACH ROW
WHEN NEW.grp = '' AND NEW.has_dependents = 1 AND OLD.status IN {_FROM}
     AND NEW.status IN {_TERMINAL}
BEGIN
    UPDATE conveyor_deliveries SET
        waiting_on = waiting_on - 1,
        status = CASE
            WHEN NEW.status <> 'succeeded' AND NOT (
                SELECT e.run_on_failure FROM conveyor_dependencies AS e
                WHERE e.task_seq = conveyor_deliveries.task_seq AND e.parent_seq = NEW.task_seq)
            THEN 'cancelled'
            WHEN waiting_on <= 1 THEN 'queued' ELSE 'waiting' END,
        run_at = CASE
            WHEN (NEW.status = 'succeeded' OR (
                SELECT e.run_on_failure FROM conveyor_dependencies AS e
                WHERE e.task_seq = conveyor_deliveries.task_seq AND e.parent_seq = NEW.task_seq))
                AND waiting_on <= 1
            THEN max(run_at, coalesce(NEW.finished_at, 0)) ELSE run_at END,
        finished_at = CASE
            WHEN NEW.status <> 'succeeded' AND NOT (
                SELECT e.run_on_failure FROM conveyor_dependencies AS e
                WHERE e.task_seq = conveyor_deliveries.task_seq AND e.parent_seq = NEW.task_seq)
            THEN NEW.finished_at ELSE finished_at END,
        error = CASE
            WHEN NEW.status <> 'succeeded' AND NOT (
                SELECT e.run_on_failure FROM conveyor_dependencies AS e
                WHERE e.task_seq = conveyor_deliveries.task_seq AND e.parent_seq = NEW.task_seq)
            THEN (SELECT json_object(
                'type', 'ParentFailed', 'code', 'parent_failed',
                'message', 'parent ' || t.id || ' ' || NEW.status,
                'parent_id', t.id, 'parent_status', NEW.status)
                FROM conveyor_tasks AS t WHERE t.seq = NEW.task_seq)
            ELSE error END
    WHERE grp = '' AND status = 'waiting' AND task_seq IN (
        SELECT e.task_seq FROM conveyor_dependencies AS e
        WHERE e.parent_seq = NEW.task_seq AND e.resolved = 0);
    UPDATE conveyor_dependencies SET resolved = 1
    WHERE parent_seq = NEW.task_seq AND resolved = 0;
END
"""


def upgrade() -> None:
    # ADD COLUMN on both backends (no table rebuild): nullable, NULL in every row.
    op.add_column("conveyor_deliveries", sa.Column("waiting_on", sa.Integer(), nullable=True))
    op.add_column("conveyor_deliveries", sa.Column("has_dependents", sa.Boolean(), nullable=True))
    seq = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "conveyor_dependencies",
        sa.Column("task_seq", seq, primary_key=True),
        sa.Column("parent_seq", seq, primary_key=True),
        sa.Column("run_on_failure", sa.Boolean(), nullable=False),
        sa.Column("resolved", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_conveyor_dependencies_parent", "conveyor_dependencies", ["parent_seq"])
    op.create_table(
        "conveyor_batches",
        sa.Column("id", sa.String(26), primary_key=True),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("callback_seq", seq, nullable=False),
        sa.Column("callback_id", sa.String(26), nullable=False),
        sa.Column("closed", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_FUNCTION)
        op.execute(_PG_TRIGGER)
    else:
        op.execute(_SQLITE_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER conveyor_release ON conveyor_deliveries")
        op.execute("DROP FUNCTION conveyor_release_dependents()")
    else:
        op.execute("DROP TRIGGER conveyor_release")
    op.drop_table("conveyor_batches")
    op.drop_index("ix_conveyor_dependencies_parent", table_name="conveyor_dependencies")
    op.drop_table("conveyor_dependencies")
    # DROP COLUMN itself on both (SQLite 3.35+), not a batch rebuild of the table,
    # which would lose its indexes' DESC columns.
    op.execute("ALTER TABLE conveyor_deliveries DROP COLUMN has_dependents")
    op.execute("ALTER TABLE conveyor_deliveries DROP COLUMN waiting_on")
