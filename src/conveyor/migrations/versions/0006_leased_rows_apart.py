"""Postgres: leased rows leave the status and roll-up indexes.

A claim's UPDATE writes a new version of each row it leases, and Postgres adds an
entry for it to every index whose WHERE the new version meets. Two of those
entries served no query: ``ix_conveyor_deliveries_status`` (listing by status)
and ``ix_conveyor_deliveries_unrolled`` (counting rows not yet rolled up). Leased
rows are few, and ``ix_conveyor_deliveries_leased`` holds them all, so listing,
counting and lease recovery read them there. Without the two entries a
``claim(100)`` took 1.9-2.9 ms of server time instead of 3.7-4.2, and wrote 41
instead of 59 kB of WAL.

Both indexes are built again, which holds writes to ``conveyor_deliveries`` for
as long as that takes (seconds per million rows). SQLite keeps both indexes whole
(see schema.py), so this revision changes nothing there.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 03:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_STATUS = ("ix_conveyor_deliveries_status", ["grp", "queue", "status", "task_seq"])
_UNROLLED = ("ix_conveyor_deliveries_unrolled", ["queue", "grp", "status"])


def _rebuild(name: str, columns: list[str], where: str | None) -> None:
    op.drop_index(name, table_name="conveyor_deliveries")
    op.create_index(
        name,
        "conveyor_deliveries",
        columns,
        unique=False,
        postgresql_where=None if where is None else sa.text(where),
    )


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    _rebuild(*_STATUS, "status <> 'running'")
    _rebuild(*_UNROLLED, "rolled = 0 AND status <> 'running'")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    _rebuild(*_STATUS, None)
    _rebuild(*_UNROLLED, "rolled = 0")
