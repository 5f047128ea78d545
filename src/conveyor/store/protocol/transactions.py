"""Transactions and retries: opening the engine, migrating, running a unit of work
in one transaction, and the store's clock.

Every protocol step runs through :func:`run`, which retries the whole
transaction on errors the dialect calls transient and turns a lost database
into :class:`~conveyor.errors.StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import ColumnElement, select, text
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import (
    DBAPIError,
    MultipleResultsFound,
    NoResultFound,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout

from conveyor import _values as v
from conveyor.errors import (
    ConfigurationError,
    ConveyorError,
    MigrationRequired,
    ProtocolVersionMismatch,
    StoreError,
    StoreUnavailable,
)
from conveyor.migrations import HEAD_REVISION, SCRIPT_LOCATION, VERSION_TABLE
from conveyor.schema import PROTOCOL_VERSION, meta
from conveyor.store.protocol import depth
from conveyor.store.protocol.refusals import (
    check_unrecorded_tables,
    refused_by_pooler,
    refused_login,
)
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger("conveyor.store")

T = TypeVar("T")

TRANSIENT_RETRIES = 8


def safe_url(st: Seam) -> str:
    """The store's URL with any password hidden, for messages."""
    return make_url(st.url).render_as_string(hide_password=True)


async def open_engine(st: Seam) -> AsyncEngine:
    """Create the engine, migrate (or check) the schema, and return the engine."""
    engine = st._create_engine()
    try:
        runner = st._connection_runner()
        if runner is not None:
            await runner.call(lambda sync: migrate_and_check(st, sync))
        else:
            async with engine.connect() as conn:
                conn = await conn.execution_options(conveyor_write=True)
                await conn.run_sync(lambda sync: migrate_and_check(st, sync))
    except ConveyorError:
        await engine.dispose()
        raise
    except (DBAPIError, OSError) as exc:
        await engine.dispose()
        pooled = refused_by_pooler(exc)
        if pooled is not None:
            raise ConfigurationError(f"cannot open {safe_url(st)}: {pooled}") from exc
        refusal = refused_login(exc)
        if refusal is not None:
            # The server answered and said no: waiting will not change its mind.
            raise ConfigurationError(
                f"cannot open {safe_url(st)}: the server refused the connection: {refusal}. "
                "Fix the role, password or database name in the URL (or create them)."
            ) from exc
        raise StoreUnavailable(
            f"cannot open {safe_url(st)}: {exc}. Check that the database "
            "is running and the URL is right."
        ) from exc
    return engine


def migrate_and_check(st: Seam, conn: Connection) -> None:
    """Apply pending migrations (when ``st.migrate``) and check the protocol version."""
    with conn.begin():
        st._lock_for_migration(conn)
        if not _at_head(conn):
            _migrate(st, conn)
        version = conn.execute(
            select(meta.c.value).where(meta.c.key == "protocol_version")
        ).scalar_one_or_none()
    if version is None or int(version) != PROTOCOL_VERSION:
        raise ProtocolVersionMismatch(
            f"the database speaks protocol {version}, this conveyor speaks "
            f"{PROTOCOL_VERSION}: use a matching conveyor version"
        )


def _at_head(conn: Connection) -> bool:
    """Whether the schema is at this version's head revision, read without Alembic:
    the usual case, in which opening a store never imports it (about 80 ms of
    import and a quarter of the objects the garbage collector then walks)."""
    if not sa_inspect(conn).has_table(VERSION_TABLE):
        return False
    found = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    return list(found) == [HEAD_REVISION]


def _migrate(st: Seam, conn: Connection) -> None:
    """Upgrade to head with Alembic (when ``st.migrate``), or say why the schema
    cannot be used as it is."""
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(SCRIPT_LOCATION)
    context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    current = context.get_current_heads()
    known = {rev.revision for rev in script.walk_revisions()}
    unknown = [rev for rev in current if rev not in known]
    if unknown:
        raise ProtocolVersionMismatch(
            f"the database is at schema revision {unknown[0]}, which this version of "
            "conveyor does not know: upgrade conveyor"
        )
    if not current:
        check_unrecorded_tables(conn)
    if st.migrate and set(current) != set(script.get_heads()):
        cfg = Config()
        cfg.set_main_option("script_location", SCRIPT_LOCATION)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    elif not current:
        raise MigrationRequired(
            (),
            HEAD_REVISION,
            "the database has no conveyor schema: run `conveyor migrate` or open "
            "the store with migrate=True",
        )
    elif set(current) != set(script.get_heads()):
        # Behind: this version's statements would meet tables that are not
        # there yet, and fail mid-call. Say so now, with the way out.
        raise MigrationRequired(
            tuple(sorted(current)),
            HEAD_REVISION,
            f"the database's conveyor schema is at revision {', '.join(sorted(current))}, "
            f"and this version of conveyor needs {', '.join(sorted(script.get_heads()))}: "
            "run `conveyor migrate` (or open the store once with migrate=True)",
        )


class InlineConnection:
    """A blocking ``Connection`` behind the awaitable methods the protocol's
    ``work`` functions use. Every method completes without suspending, so a whole
    ``work`` coroutine runs to its end inside one call of :func:`drive`, on the
    thread that owns the connection."""

    __slots__ = ("dialect", "sync_connection")

    def __init__(self, connection: Connection) -> None:
        self.sync_connection = connection
        self.dialect = connection.dialect

    async def execute(
        self, statement: Any, parameters: Any = None, *, execution_options: Any = None
    ) -> Any:
        """Run one statement (as ``AsyncConnection.execute``)."""
        return self.sync_connection.execute(
            statement, parameters, execution_options=execution_options
        )

    async def exec_driver_sql(
        self, statement: str, parameters: Any = None, execution_options: Any = None
    ) -> Any:
        """Run one statement text as it is."""
        return self.sync_connection.exec_driver_sql(statement, parameters, execution_options)

    def run_text(self, sql: str, parameters: dict[str, Any]) -> Rows:
        """Run one built-once text on the driver's own cursor, inside the open
        transaction: SQLAlchemy's execution context and result set-up cost several
        times what SQLite spends on a step (see :func:`conveyor.store.protocol.texts.execute`).
        Driver errors come out as SQLAlchemy's, as from ``exec_driver_sql``."""
        driver = self.sync_connection.connection.driver_connection
        assert driver is not None
        try:
            cursor = driver.execute(sql, parameters)
            description = cursor.description
            if description is None:
                return Rows()
            make = _row_maker(sql, tuple(col[0] for col in description))
            return Rows(map(make, cursor.fetchall()))
        except self.dialect.loaded_dbapi.Error as exc:
            raise DBAPIError.instance(
                sql, parameters, exc, self.dialect.loaded_dbapi.Error
            ) from exc

    def run_text_many(self, sql: str, parameters: list[dict[str, Any]]) -> None:
        """:meth:`run_text` once per parameter set (``executemany``), no rows."""
        driver = self.sync_connection.connection.driver_connection
        assert driver is not None
        try:
            driver.executemany(sql, parameters)
        except self.dialect.loaded_dbapi.Error as exc:
            raise DBAPIError.instance(
                sql, parameters, exc, self.dialect.loaded_dbapi.Error
            ) from exc

    async def scalar(self, statement: Any, parameters: Any = None) -> Any:
        """The first column of the first row."""
        return self.sync_connection.scalar(statement, parameters)

    async def scalars(self, statement: Any, parameters: Any = None) -> Any:
        """The first column of every row."""
        return self.sync_connection.scalars(statement, parameters)

    async def get_raw_connection(self) -> Any:
        """The pooled driver connection."""
        return self.sync_connection.connection

    def get_execution_options(self) -> Any:
        """The connection's execution options."""
        return self.sync_connection.get_execution_options()

    def in_transaction(self) -> bool:
        """Whether a transaction is open."""
        return self.sync_connection.in_transaction()

    @asynccontextmanager
    async def begin_nested(self) -> AsyncIterator[None]:
        """A savepoint: released on success, rolled back on an exception."""
        with self.sync_connection.begin_nested():
            yield


class Rows(list[Any]):
    """The rows of :meth:`InlineConnection.run_text`, with the few result methods
    the protocol uses."""

    def first(self) -> Any:
        """The first row, or ``None``."""
        return self[0] if self else None

    def all(self) -> list[Any]:
        """Every row."""
        return list(self)

    def one(self) -> Any:
        """The only row; raises unless there is exactly one."""
        if len(self) != 1:
            raise (NoResultFound if not self else MultipleResultsFound)(
                f"expected one row, got {len(self)}"
            )
        return self[0]

    def scalar_one(self) -> Any:
        """The first column of the only row."""
        return self.one()[0]

    def scalar(self) -> Any:
        """The first column of the first row, or ``None``."""
        return self[0][0] if self else None


@functools.lru_cache(maxsize=512)
def _row_maker(sql: str, names: tuple[str, ...]) -> Callable[[Any], Any]:
    # Rows as SQLAlchemy's look to the protocol: attributes, positions and a mapping.
    base = collections.namedtuple("Row", names, rename=True)  # type: ignore[misc]
    row: Any = type("Row", (base,), {"__slots__": (), "_mapping": property(base._asdict)})
    make: Callable[[Any], Any] = row._make
    return make


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (one working on an
    :class:`InlineConnection`) to its end, in the calling thread."""
    try:
        coro.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coro.close()
    # Something in the transaction awaited real I/O or time, which cannot happen
    # on the connection's thread: a bug, refused rather than run half.
    raise RuntimeError("a transaction on the SQLite connection thread tried to suspend")


def _inline(
    work: Callable[[AsyncConnection], Awaitable[T]],
    write: bool,
    progress: list[bool],
    sync: Connection,
) -> T:
    """One transaction attempt on the connection's own thread (see :func:`run`)."""
    if sync.get_execution_options().get("conveyor_write") is not write:
        # Set only on a change: setting options dispatches events every time.
        sync.execution_options(conveyor_write=write)
    conn = cast("AsyncConnection", InlineConnection(sync))
    with sync.begin():
        result = drive(cast(Coroutine[Any, Any, T], work(conn)))
        progress[0] = True
    return result


def now(st: Seam) -> ColumnElement[int]:
    """The store's clock (the dialect's, moved by ``clock_offset``) as SQL."""
    clock = st._db_now()
    if st.clock_offset:
        return clock + round(st.clock_offset * v.US)
    return clock


async def now_us(st: Seam, conn: AsyncConnection) -> int:
    """Read the store's clock, in microseconds."""
    return int((await conn.execute(select(now(st)))).scalar_one())


async def run(
    st: Seam,
    work: Callable[[AsyncConnection], Awaitable[T]],
    *,
    write: bool = True,
    autocommit: bool = False,
    alone: Callable[[], Awaitable[T]] | None = None,
    together: Callable[[], Awaitable[T | None]] | None = None,
    inline: bool = False,
    replica: bool = False,
) -> T:
    """Run ``work`` in one transaction, retrying transient failures with backoff.

    A connection found dead before the commit was sent (the server has then
    rolled the transaction back) is replaced and the transaction run once more:
    the pool does not ping connections before use. A connection lost during the
    commit leaves the outcome unknown, so that is reported, not retried.

    ``autocommit``: ``work`` runs a single statement, which may then run without
    BEGIN and COMMIT where the dialect allows (``st.autocommit_single``).
    ``alone``: the same statement run on a driver connection of the dialect's own
    (:meth:`~conveyor.store.seam.Seam._direct_runner`), used instead of ``work``
    when autocommit is allowed; it raises driver errors as SQLAlchemy's
    ``DBAPIError`` so they are retried and translated alike.
    ``together``: the same transaction's statements sent together on a connection
    of the dialect's own (:meth:`~conveyor.store.seam.Seam._steps_runner`,
    :meth:`~conveyor.store.seam.Seam._batch_runner`), tried first; ``None`` from it
    (no connection of its own free) means ``work`` runs as usual.
    ``inline``: ``work`` is a short write the dialect's connection runner may run
    on the caller's thread while the runner is idle (SQLite's inline fast path,
    :mod:`conveyor.store.sqlite.thread`).
    ``replica``: ``work`` only reads, and may read from the store's replica
    (:meth:`~conveyor.store.seam.Seam._create_read_engine`) where it has one,
    which may lag behind the primary.
    """
    if st._engine is None:
        await st.open()
    assert st._engine is not None
    engine = st._engine
    if replica and not write and st._read_engine is not None:
        engine = st._read_engine
    runner = None if engine is not st._engine else st._connection_runner()
    delay = 0.01
    reconnected = False
    attempt = 0
    while True:
        committing = False
        try:
            if alone is not None and autocommit and st.autocommit_single:
                # (outside the transaction gate: see Seam._direct_runner)
                committing = True
                return await alone()
            if together is not None:
                # Sent with its COMMIT: once sent, its outcome is unknown if the
                # connection dies, so it is never re-sent.
                committing = True
                sent = await together()
                if sent is not None:
                    return sent
                committing = False
            if runner is not None:
                # The whole transaction as one function on the dialect's connection
                # thread: one hop from the event loop, none per statement.
                progress = [False]
                try:
                    return await runner.call(
                        partial(_inline, work, write, progress), inline=inline and write
                    )
                finally:
                    committing = progress[0]
            async with st._transaction_gate(write), engine.connect() as conn:
                if autocommit and st.autocommit_single:
                    # The statement commits itself: once sent, its outcome is unknown
                    # if the connection dies, so it is never re-sent.
                    committing = True
                    conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                    return await work(conn)
                conn = await conn.execution_options(conveyor_write=write)
                async with conn.begin():
                    result = await work(conn)
                    committing = True
                return result
        except DBAPIError as exc:
            if st._is_capped(exc):
                # Rolled back, nothing written: the submit goes step by step.
                raise depth.Capped() from exc
            if st._is_transient(exc) and attempt < TRANSIENT_RETRIES:
                log.debug("transient database error, retrying: %s", exc.orig)
                attempt += 1
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 1.0)
                continue
            if st._is_read_only(exc):
                raise StoreUnavailable(
                    f"the database is read-only ({' '.join(str(exc.orig).split())}): the "
                    "server is a standby, and no primary was found in time; nothing of "
                    "this call was written, retry. (List every server in the URL with "
                    "?target_session_attrs=read-write so connections go to the primary.)"
                ) from exc
            if st._is_full(exc):
                raise StoreUnavailable(
                    f"the database is full ({' '.join(str(exc.orig).split())}): nothing of "
                    "this call was written; free disk space (or raise the database's size "
                    "limit) and retry"
                ) from exc
            if exc.connection_invalidated and not committing and not reconnected:
                log.debug("connection found dead, retrying on a new one: %s", exc.orig)
                reconnected = True
                continue
            if exc.connection_invalidated and committing:
                raise StoreUnavailable(
                    f"the database connection was lost while committing ({exc.orig}): "
                    "the call may or may not have taken effect; check before retrying"
                ) from exc
            if isinstance(exc, OperationalError) or exc.connection_invalidated:
                raise StoreUnavailable(
                    f"database error: {exc.orig}. The transaction was rolled back; it is "
                    "safe to try again."
                ) from exc
            raise StoreError(
                f"the database refused the operation: {exc.orig}. The transaction was "
                "rolled back and nothing was written; if the data is valid this is a bug "
                "in conveyor: please report it with this message."
            ) from exc
        except PoolTimeout as exc:
            raise StoreUnavailable(
                f"no database connection became free in time ({exc}). Allow more "
                "connections (engine_options pool_size / max_overflow / pool_timeout) or "
                "make fewer calls at once."
            ) from exc
        except SQLAlchemyError as exc:
            # Whatever else SQLAlchemy raises is translated too: no SQLAlchemy or
            # driver exception ever leaves the public API.
            raise StoreError(
                f"database layer error: {exc}. The transaction was rolled back and "
                "nothing was written."
            ) from exc
    raise AssertionError("unreachable")
