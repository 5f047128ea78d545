"""Debounce: a queue's quiet period, and the moment each stream's ends.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 15:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("conveyor_queues") as batch:
        batch.add_column(sa.Column("debounce", sa.Float(), nullable=True))
    with op.batch_alter_table("conveyor_streams") as batch:
        batch.add_column(sa.Column("quiet_until", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("conveyor_streams") as batch:
        batch.drop_column("quiet_until")
    with op.batch_alter_table("conveyor_queues") as batch:
        batch.drop_column("debounce")
