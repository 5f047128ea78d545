"""Group health: when each consumer group last leased something.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 14:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conveyor_group_claims",
        sa.Column("queue", sa.String(length=255), nullable=False),
        sa.Column("grp", sa.String(length=255), nullable=False),
        sa.Column("claimed_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("queue", "grp"),
    )


def downgrade() -> None:
    op.drop_table("conveyor_group_claims")
