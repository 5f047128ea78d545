"""Queue delay: a queue's default delay for submits that give no delay or run_at.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 19:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("conveyor_queues") as batch:
        batch.add_column(sa.Column("delay", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("conveyor_queues") as batch:
        batch.drop_column("delay")
