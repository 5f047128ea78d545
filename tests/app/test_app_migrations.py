"""An application with its own models and its own Alembic environment, and
conveyor's tables, in one database: docs/guide.md's ``shop.py`` and ``env.py`` run
as pasted, on both backends."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _readme import blocks
from sqlalchemy import create_engine, inspect, pool, text
from sqlalchemy.engine import make_url

import conveyor
from _support import scratch_pg_database
from conveyor.migrations import VERSION_TABLE
from conveyor.schema import metadata

ORDERS_REVISION = '''"""orders

Revision ID: shop0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "shop0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "orders",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("email", sa.String(200), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("orders")
'''


@pytest.fixture(params=["sqlite", "postgres"])
def app_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A sync SQLAlchemy URL of a database that has seen neither the app nor conveyor."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shop.db'}"
        return
    request.getfixturevalue("pg_url")  # skips (or fails in CI) without a server
    with scratch_pg_database("conveyor_shop") as url:
        yield make_url(url).set(drivername="postgresql+psycopg").render_as_string(False)


def alembic(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_one_alembic_upgrade_builds_the_app_and_conveyor(app_db: str, tmp_path: Path) -> None:
    shop, env = blocks("Enqueue in your own transaction")
    (tmp_path / "shop.py").write_text(shop)
    versions = tmp_path / "migrations" / "versions"
    versions.mkdir(parents=True)
    (tmp_path / "migrations" / "env.py").write_text(env)
    (versions / "shop0001_orders.py").write_text(ORDERS_REVISION)
    (tmp_path / "alembic.ini").write_text(
        f"[alembic]\nscript_location = migrations\nsqlalchemy.url = {app_db}\n"
    )

    upgraded = alembic(tmp_path, "upgrade", "head")
    assert upgraded.returncode == 0, upgraded.stderr
    engine = create_engine(app_db, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            app_rev = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            ours = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
    finally:
        engine.dispose()
    assert {"orders", "alembic_version", VERSION_TABLE} | set(metadata.tables) <= tables
    assert app_rev == "shop0001" and ours is not None
    # The app's autogenerate sees its own models only: nothing to add or drop.
    checked = alembic(tmp_path, "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # conveyor is at its head: a store opens without migrating.
    async with conveyor.connect(app_db.replace("+psycopg", ""), migrate=False) as store:
        assert (await store.list()).items == []
    if app_db.startswith("sqlite"):
        # shop.py as pasted: the order and its task commit together, the rolled-back pair
        # leaves nothing.
        ran = subprocess.run(
            [sys.executable, "shop.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert ran.returncode == 0, ran.stderr
        assert "'emails'" in ran.stdout and "'queued': 1" in ran.stdout
        assert "audit" not in ran.stdout
