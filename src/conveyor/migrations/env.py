"""Alembic environment: runs on the connection conveyor hands in, or on a URL."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool
from sqlalchemy.engine import Connection

from conveyor.migrations import VERSION_TABLE
from conveyor.schema import metadata


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def _sync_url(url: str) -> str:
    # The command-line alembic runs synchronously: use the sync twins of the async drivers.
    return (
        url.replace("sqlite+aiosqlite://", "sqlite://")
        .replace("postgresql+asyncpg://", "postgresql+psycopg://")
        .replace("postgresql://", "postgresql+psycopg://", 1)
        if url.startswith(("sqlite", "postgresql"))
        else url
    )


def run() -> None:
    """Entry point alembic calls."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
        return
    url = (
        os.environ.get("CONVEYOR_URL")
        or context.config.get_main_option("sqlalchemy.url")
        or "sqlite:///conveyor.db"
    )
    if context.is_offline_mode():
        context.configure(
            url=_sync_url(url),
            target_metadata=metadata,
            version_table=VERSION_TABLE,
            literal_binds=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_sync_url(url), poolclass=pool.NullPool)
    with engine.begin() as conn:
        _configure_and_run(conn)
    engine.dispose()


run()
