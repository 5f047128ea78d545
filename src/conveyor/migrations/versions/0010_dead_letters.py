"""Dead-letter queues: a queue's setting naming where its tasks go when they fail
for good or are evicted.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 19:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("conveyor_queues") as batch:
        batch.add_column(sa.Column("dead_letter", sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("conveyor_queues") as batch:
        batch.drop_column("dead_letter")
