"""The index of free streams holds them in claim order.

A claim takes free streams fairest first: highest priority, then the head that has
waited longest. ``ix_conveyor_streams_available`` held a queue's free streams by
``available_at`` alone, so each claim read every free stream of the queue and
sorted them to take a few: with 10,000 partitions, a claim of 50 tasks read 9,925
stream rows and spent 12 of its 12.3 ms of server time there. In claim order
(priority descending, then ``available_at``, then partition) a claim reads the
streams it takes and stops: 50 rows for 50 streams.

The index is built again, which holds writes to ``conveyor_streams`` for as long as
that takes (one row per stream).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 11:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_NAME = "ix_conveyor_streams_available"
_WHERE = "available_at IS NOT NULL"


def _build(columns: list[str | sa.TextClause]) -> None:
    with op.batch_alter_table("conveyor_streams", schema=None) as batch_op:
        batch_op.drop_index(_NAME)
        batch_op.create_index(
            _NAME,
            columns,
            unique=False,
            postgresql_where=sa.text(_WHERE),
            sqlite_where=sa.text(_WHERE),
        )


def upgrade() -> None:
    _build(["grp", "queue", sa.text("priority DESC"), "available_at", "partition"])


def downgrade() -> None:
    _build(["grp", "queue", "available_at"])
