"""Postgres behind a connection pooler (PgBouncer) and beside a streaming replica.

What a pooler changes, by its mode (the store's ``pooler`` option, or
``?pooler=`` in the URL):

* ``"session"`` — a client keeps one server connection for as long as it is
  connected, so session state holds; but PgBouncer refuses the ``options``
  startup parameter, which is how the store sets its timeouts otherwise. They
  are set by a statement when each connection is made instead
  (:func:`set_on_connect`): one round trip per connection, none per transaction.
* ``"transaction"`` — each transaction may run on another server connection,
  and whatever outlives a transaction lands on a connection someone else gets
  next. So: no server-side prepared statements (psycopg's ``prepare_threshold``
  off: a statement prepared on one server connection is unknown on the next),
  the timeouts set with ``SET LOCAL`` semantics in every transaction
  (:func:`set_per_transaction`), no connections kept in autocommit with session
  settings, the maintenance pass's lock held as a transaction lock for the pass
  (:func:`maintenance_lock_in_transaction`), and no ``LISTEN`` through the
  pooler (a ``LISTEN`` is accepted there and then hears nothing, because the
  server connection that listens goes back to the pool): wake-ups listen on a
  direct connection given as ``listen_url``, or the store polls
  (:func:`listen_conninfo` says which, once, in the log).

The URL option is taken out of the URL before it reaches the driver (psycopg
would refuse an unknown connection parameter).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from conveyor.errors import InvalidArgument

log = logging.getLogger("conveyor.store")

#: The modes of the ``pooler`` option (``None``: no pooler, a direct connection).
POOLER_MODES = ("session", "transaction")
#: The URL query parameter naming the pooler mode.
POOLER_PARAMETER = "pooler"
#: The environment variables read when ``listen_url`` / ``read_url`` are not given.
LISTEN_URL_VARIABLE = "CONVEYOR_LISTEN_URL"
READ_URL_VARIABLE = "CONVEYOR_READ_URL"


def split_pooler(url: str, given: str | None) -> tuple[str, str | None]:
    """``(url without ?pooler=, the pooler mode)`` from the URL's query and the
    ``pooler`` argument; InvalidArgument for an unknown mode or the two disagreeing."""
    parsed = make_url(url)
    in_url = parsed.query.get(POOLER_PARAMETER)
    if isinstance(in_url, tuple):
        in_url = in_url[-1]
    for field, mode in (("pooler", given), ("url", in_url)):
        if mode is not None and mode not in POOLER_MODES:
            where = "?pooler= in the URL" if field == "url" else "pooler"
            raise InvalidArgument(
                field,
                f'{where} must be "transaction" or "session" (PgBouncer\'s pool_mode), or '
                f"left out for a direct connection; got {mode!r}",
            )
    if given is not None and in_url is not None and given != in_url:
        raise InvalidArgument(
            "pooler", f"is {given!r} but the URL says ?pooler={in_url}: give one of them"
        )
    if in_url is None:
        return url, given
    stripped = parsed.difference_update_query([POOLER_PARAMETER])
    return stripped.render_as_string(hide_password=False), in_url


def driver_url(field: str, url: str) -> str:
    """``url`` (a ``listen_url`` or ``read_url``) as the psycopg SQLAlchemy URL the
    store uses; InvalidArgument unless it is a PostgreSQL URL."""
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise InvalidArgument(
            field, f"cannot parse {url!r}: use postgresql://user@host/db"
        ) from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend not in ("postgresql", "postgres") or driver not in ("", "psycopg", "psycopg_async"):
        raise InvalidArgument(
            field, f"must be a postgresql:// URL, got scheme {parsed.drivername!r}"
        )
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def from_env(given: str | None, variable: str) -> str | None:
    """``given``, else the environment variable's value (unset or empty: None)."""
    if given is not None:
        return given
    return os.environ.get(variable) or None


def set_on_connect(engine: AsyncEngine, settings: dict[str, str]) -> None:
    """Set ``settings`` (name: value) on every connection the engine makes, by a
    statement committed at once (a session-mode pooler refuses startup options)."""

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            names = list(settings)
            sql = ", ".join("set_config(%s, %s, false)" for _ in names)
            params: list[str] = []
            for name in names:
                params += [name, settings[name]]
            cursor.execute(f"SELECT {sql}", params)
        finally:
            cursor.close()
        # Out of autocommit, the statement opened a transaction: a rollback would
        # undo the settings with it.
        dbapi_connection.commit()


def set_per_transaction(engine: AsyncEngine, settings: dict[str, str]) -> None:
    """Set ``settings`` at the start of every transaction the engine begins, for
    that transaction only (``set_config(..., true)``: ``SET LOCAL``)."""
    names = list(settings)
    sql = "SELECT " + ", ".join(f"set_config('{n}', %({n})s, true)" for n in names)

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # The limits die with the transaction: they hold behind a transaction-mode
        # pooler and never leak to whoever gets the server connection next.
        conn.exec_driver_sql(sql, settings)


@contextlib.asynccontextmanager
async def maintenance_lock_in_transaction(engine: AsyncEngine, key: int) -> AsyncIterator[bool]:
    """Whether this caller got the maintenance lock, held for the ``async with``
    block as a transaction-level advisory lock in a transaction kept open on one
    connection: behind a transaction-mode pooler, a session-level lock would stay
    on a server connection the pool hands to others, and its unlock could run on
    another one, leaving it held for good. (READ COMMITTED: the idle transaction
    holds no snapshot, so it keeps nothing from vacuum.)"""
    async with engine.connect() as conn:
        trans = await conn.begin()
        try:
            got = bool(
                (
                    await conn.execute(text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": key})
                ).scalar()
            )
        except BaseException:
            await trans.rollback()
            raise
        try:
            yield got
        finally:
            # The lock goes with the transaction; nothing was written in it. A
            # connection lost meanwhile (an idle-in-transaction timeout) has already
            # released it.
            with contextlib.suppress(DBAPIError):
                await trans.rollback()


def listen_conninfo(
    own: Callable[[], str], listen_url: str | None, pooler: str | None
) -> str | None:
    """The psycopg connection string the wake-up listener uses, or None when the
    store must poll: ``listen_url`` when given, else the store's own (``own()``:
    every host of a multi-host URL, as the engine's dialect reads it) unless it
    goes through a transaction-mode pooler (said once, in the log, with the fix)."""
    if listen_url is not None:
        return make_url(listen_url).set(drivername="postgresql").render_as_string(False)
    if pooler == "transaction":
        log.warning(
            "behind a transaction-mode pooler (pooler=transaction) LISTEN cannot work, so "
            "wake-ups are off and workers poll; give a direct connection to the database "
            "for LISTEN as listen_url= (or $%s) to have them",
            LISTEN_URL_VARIABLE,
        )
        return None
    return own()
