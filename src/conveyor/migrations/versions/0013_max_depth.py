"""Queue depth limits: a queue's max_depth setting, and on PostgreSQL the function
by which a one-statement submit refuses a queue that has one.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# Raised by a submit statement that meets a queue with a max_depth: the submit
# then goes the step-by-step way, which counts the queue's depth under a lock
# (SQLSTATE CVQ01: conveyor.store.postgres's error classification knows it).
# SQLite's twin is a function its connections register (conveyor.store.sqlite).
_CAPPED = """
CREATE OR REPLACE FUNCTION conveyor_capped(queue text) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'queue % has a max_depth: its submits are counted step by step', queue
        USING ERRCODE = 'CVQ01';
END
$$
"""


def upgrade() -> None:
    with op.batch_alter_table("conveyor_queues") as batch:
        batch.add_column(sa.Column("max_depth", sa.BigInteger(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_CAPPED)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS conveyor_capped(text)")
    with op.batch_alter_table("conveyor_queues") as batch:
        batch.drop_column("max_depth")
