"""Postgres single statements run by themselves (``texts.alone``), on the psycopg
connection directly: without SQLAlchemy's execution layer, and mostly without
its pool.

A statement that commits on its own runs in autocommit. Taking a connection out
of SQLAlchemy's pool for it, switching the driver to autocommit and back, and
handing it back (the pool's reset runs a rollback through the greenlet bridge)
cost about as much client CPU as the statement itself (~80 of ~170 µs for a
one-row ``SELECT``). So a store keeps connections of its own
for these statements, already in autocommit, and reuses them: :data:`KEEP`
always, and more while more statements run at once, up to the store's
``direct_connections`` (default :data:`MOST`); those beyond :data:`KEEP` are
closed once idle for :data:`IDLE_CLOSE` seconds. A statement that finds all of
them busy takes one from the pool as before.

The kept connections are made by the engine's pool (its creator, connect
arguments and connect events, hence the store's timeouts in the startup options)
and then detached from it: they do not count against the pool's size, and the
pool never hands them to a transaction. A kept connection that fails is closed,
and another is made when needed; ``close()`` closes them all.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import pq
from psycopg.types.array import ListBinaryDumper
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

#: Connections a store keeps for single statements (beyond its pool) however idle.
#: Two: one producer or worker loop uses one at a time; a second covers an
#: acknowledgement overlapping a claim.
KEEP = 2
#: The default most a store keeps while statements run concurrently (the
#: ``direct_connections`` option). Why more than KEEP: at ten concurrent callers, a
#: pooled connection per statement (checkout through SQLAlchemy's greenlet bridge,
#: autocommit on and off, the pool's reset) cost a quarter to a third more client
#: CPU per claim + ack than a kept one. Why a cap: each is a server connection.
MOST = 10
#: Seconds a kept connection beyond KEEP may stay idle before it is closed.
IDLE_CLOSE = 10.0

Conn = psycopg.AsyncConnection[Any]

#: Run once on each kept connection. The statements run there (claims, batch
#: acknowledgements, submits) each read or change a handful of rows found by
#: index, and must do so however small the table is when the server plans them,
#: with or without statistics: a prepared statement keeps its generic plan, and
#: one planned on a young table of a few hundred rows chose to read the table
#: whole (each claim's and acknowledgement's UPDATE walked every delivery row),
#: and kept doing so as the table grew. Scans of the whole table stay possible
#: where no index serves (the waiters' expiry); they are only priced out of every
#: choice. That price would make such a plan look costly enough to compile to
#: machine code (JIT: ~100 ms per run of a statement that takes 0.2 ms), so JIT is
#: off here too: none of these statements runs long enough to gain from it.
#:
#: And each prepared statement runs its generic plan from its first prepared run
#: (``plan_cache_mode``): planned once, as :data:`PREPARE_THRESHOLD
#: <conveyor.store.postgres.PREPARE_THRESHOLD>` means it to be. Every text run here
#: is written for its generic plan (see the estimates in
#: :mod:`conveyor.store.postgres.claim`). By default the server plans the first five runs
#: for their values, compares their cost with the generic plan's, and when the
#: generic one looks dearer by a tenth goes on planning every run anew. The claim
#: is a long statement whose planning (~0.7 ms) costs about what its run does: in
#: drains of 6,000 tasks through one worker, it was planned 107 times in 105 claims
#: in one run, 18-31 times in others, and the run that re-planned every claim drained
#: 15,400 tasks/s against 17,200-17,800; forced generic, 6-7 plans and 18,600-19,100.
NO_SEQSCAN = (
    "SELECT set_config('enable_seqscan', 'off', false), set_config('jit', 'off', false),"
    " set_config('plan_cache_mode', 'force_generic_plan', false)"
)


@functools.lru_cache(maxsize=256)
def _row_class(names: tuple[str, ...]) -> Any:
    # Rows as SQLAlchemy's look to the protocol: attributes, positions and a mapping.
    base = collections.namedtuple("Row", names, rename=True)  # type: ignore[misc]
    return type("Row", (base,), {"__slots__": (), "_mapping": property(base._asdict)})


#: The row maker of each built-once text: its columns never change, so they are
#: read once (psycopg's ``description`` builds a column object per column per call).
_row_makers: dict[str, Callable[[Sequence[Any]], Any]] = {}


def row_factory(sql: str) -> Callable[[Any], Callable[[Sequence[Any]], Any]]:
    """psycopg's row factory for ``sql``: named tuples, their class made once."""
    known = _row_makers.get(sql)
    if known is not None:
        return lambda cursor: known

    def first(cursor: Any) -> Callable[[Sequence[Any]], Any]:
        # psycopg calls this on every result of the cursor it was given to: once the
        # text's row maker exists, return it (reading the names costs ~5 % of a
        # claim + ack at concurrency 10).
        known = _row_makers.get(sql)
        if known is not None:
            return known
        result = cursor.pgresult
        if result is None or result.nfields == 0:
            return tuple
        names = tuple(result.fname(i).decode() for i in range(result.nfields))
        make: Callable[[Sequence[Any]], Any] = _row_class(names)._make
        if len(_row_makers) < 1024:
            _row_makers[sql] = make
        return make

    return first


_NAMED = re.compile(r"%\((\w+)\)s|%%")


@functools.lru_cache(maxsize=256)
def native(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with its ``%(name)s`` parameters as Postgres's own ``$n`` (one number
    per name), and the names in number order. Converted once per text: psycopg would
    otherwise re-parse the text on every call, and does not cache texts over 4 kB
    (the claim's is longer)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _NAMED.sub(number, sql), tuple(names)


async def _execute(
    cur: psycopg.AsyncRawCursor[Any], sql: str, params: Mapping[str, Any]
) -> list[Any]:
    text, names = native(sql)
    await cur.execute(text, [params[name] for name in names])
    result = cur.pgresult
    return await cur.fetchall() if result is not None and result.nfields else []


class _Kept:
    """A kept connection and a cursor per statement text run on it (reused: a
    cursor's adaptation context keeps the dumpers it looked up, and its row
    factory is the text's)."""

    __slots__ = ("cursors", "driver", "idle_since")

    def __init__(self, driver: Conn) -> None:
        self.driver = driver
        self.cursors: dict[str, psycopg.AsyncRawCursor[Any]] = {}
        self.idle_since = 0.0

    def cursor(self, sql: str) -> psycopg.AsyncRawCursor[Any]:
        cur = self.cursors.get(sql)
        if cur is None:
            cur = psycopg.AsyncRawCursor(self.driver, row_factory=row_factory(sql))
            if len(self.cursors) < 64:
                self.cursors[sql] = cur
        return cur


#: The server refused a write as read-only: it is a standby now (a failover or
#: switchover demoted it), and so is every connection kept to it.
READ_ONLY = "25006"


def _read_only(exc: psycopg.Error) -> bool:
    return getattr(exc, "sqlstate", None) == READ_ONLY


def _error(sql: str, params: Mapping[str, Any], exc: psycopg.Error, dead: bool) -> Exception:
    # As SQLAlchemy raises driver errors, so transactions.run retries and
    # translates them as its own.
    return DBAPIError.instance(sql, params, exc, psycopg.Error, connection_invalidated=dead)


_IDLE = pq.TransactionStatus.IDLE


class Direct:
    """The single-statement runner of one store (one engine)."""

    def __init__(self, engine: AsyncEngine, most: int = MOST) -> None:
        self._engine = engine
        # Most recently used last: taken from the end, so under a lighter load the
        # ones at the front stay idle and are the ones closed.
        self._idle: list[_Kept] = []
        self._made = 0  # kept connections in existence (idle or in use)
        self._most = most
        self._keep = min(KEEP, most)  # never closed for being idle
        self._closed = False
        self._trimmer: asyncio.TimerHandle | None = None
        self._closing: set[asyncio.Task[None]] = set()

    async def run(self, sql: str, params: Mapping[str, Any]) -> list[Any]:
        """Run ``sql`` by itself in autocommit; its rows."""
        kept = await self._take(sql, params)
        if kept is None:
            return await self._pooled(sql, params)
        try:
            rows = await _execute(kept.cursor(sql), sql, params)
        except psycopg.Error as exc:
            dead = kept.driver.closed
            await self._put_back(kept, dead or await self._standby(exc))
            raise _error(sql, params, exc, dead) from exc
        except BaseException:
            # Cancelled mid-statement: a result may still be on its way.
            await self._put_back(kept, True)
            raise
        await self._put_back(kept, False)
        return rows

    async def run_steps(
        self, steps: Sequence[tuple[str, Mapping[str, Any]]], rows_of: int = -1
    ) -> list[Any] | None:
        """Run ``steps`` (statement, parameters) in order in one transaction on a kept
        connection, pipelined with its BEGIN and COMMIT (one round trip; each
        statement still starts after the one before it has finished, so it sees
        what that one locked); the rows of the statement at index ``rows_of`` (its
        text must appear once among the steps: a cursor per text keeps only its last
        result). ``None`` when no kept connection is free: the caller runs an
        ordinary transaction instead."""
        kept = await self._take(*steps[0])
        if kept is None:
            return None

        async def send(at: list[Any]) -> None:
            for sql, params in steps:
                at[:] = [sql, params]
                text, names = native(sql)
                await kept.cursor(sql).execute(text, [params[name] for name in names])

        async def read() -> list[Any]:
            chosen = kept.cursor(steps[rows_of][0])
            result = chosen.pgresult
            return await chosen.fetchall() if result is not None and result.nfields else []

        return await self._transaction(kept, send, read)

    async def run_batch(
        self, statements: Sequence[str], runs: Iterable[Mapping[str, Any]]
    ) -> list[Any] | None:
        """Run ``statements`` (in order) once per parameters in ``runs``, in order, in
        one transaction on a kept connection, pipelined: each run goes to the server
        as soon as its parameters are taken, so the work that makes the next run's
        parameters overlaps the server's work on this one. The last statement's
        rows of every run, in order. ``None`` when no kept connection is free
        (nothing of ``runs`` taken). An exception from ``runs`` itself (the caller
        refusing its own input) leaves the connection closed, its transaction
        rolled back, and propagates."""
        *before, sql = statements
        kept = await self._take(sql, {})
        if kept is None:
            return None
        text, names = native(sql)
        earlier = [(one, *native(one)) for one in before]
        make = row_factory(sql)
        cursors: list[psycopg.AsyncRawCursor[Any]] = []

        async def send(at: list[Any]) -> None:
            for params in runs:
                for one, one_text, one_names in earlier:
                    at[:] = [one, params]
                    await kept.cursor(one).execute(one_text, [params[n] for n in one_names])
                at[:] = [sql, params]
                # A cursor per run: in a pipeline a cursor keeps only its last result.
                cur = psycopg.AsyncRawCursor(kept.driver, row_factory=make)
                await cur.execute(text, [params[name] for name in names])
                cursors.append(cur)

        async def read() -> list[Any]:
            rows: list[Any] = []
            for cur in cursors:
                result = cur.pgresult
                if result is not None and result.nfields:
                    rows.extend(await cur.fetchall())
            return rows

        return await self._transaction(kept, send, read)

    async def _transaction(
        self,
        kept: _Kept,
        send: Callable[[list[Any]], Awaitable[None]],
        read: Callable[[], Awaitable[list[Any]]],
    ) -> list[Any]:
        """BEGIN, what ``send`` sends, and COMMIT on ``kept``, in one pipeline; then
        ``read``'s rows. ``send`` keeps the statement it is sending (and its
        parameters) in its argument, so an error names it. The connection goes back
        to the idle ones afterwards, or is closed after any failure."""
        at: list[Any] = ["BEGIN", {}]
        driver = kept.driver
        try:
            async with driver.pipeline():
                await kept.cursor("BEGIN").execute("BEGIN")
                await send(at)
                await kept.cursor("COMMIT").execute("COMMIT")
            rows = await read()
        except psycopg.Error as exc:
            # A failed statement aborts the transaction: the connection is left in it
            # and closed below (never reused half-done).
            dead = driver.closed
            await self._put_back(kept, True)
            await self._standby(exc)
            raise _error(at[0], at[1], exc, dead) from exc
        except BaseException:
            # Cancelled, or the caller's own exception from ``send``: a result may
            # still be on its way, and the transaction is open.
            await self._put_back(kept, True)
            raise
        await self._put_back(kept, False)
        return rows

    async def _standby(self, exc: psycopg.Error) -> bool:
        """Whether ``exc`` is a read-only refusal; if so, close the idle kept
        connections too (all to the same server), so the retry connects anew and a
        multi-host URL finds the new primary."""
        if not _read_only(exc):
            return False
        idle, self._idle = self._idle, []
        for stale in idle:
            self._made -= 1
            await stale.driver.close()
        return True

    async def close(self) -> None:
        """Close the kept connections (those in use are closed when they return)."""
        self._closed = True
        if self._trimmer is not None:
            self._trimmer.cancel()
            self._trimmer = None
        idle, self._idle = self._idle, []
        for kept in idle:
            self._made -= 1
            await kept.driver.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def _take(self, sql: str, params: Mapping[str, Any]) -> _Kept | None:
        """An idle kept connection, or a new one while fewer than the most exist;
        ``None`` when all are busy (``sql`` and ``params`` name what failed to
        connect)."""
        if self._idle:
            return self._idle.pop()
        if self._made < self._most and not self._closed:
            return await self._connect(sql, params)
        return None

    async def _connect(self, sql: str, params: Mapping[str, Any]) -> _Kept:
        self._made += 1  # before the await: concurrent callers must not overshoot
        try:
            raw = await self._engine.raw_connection()
        except psycopg.Error as exc:
            self._made -= 1
            raise _error(sql, params, exc, False) from exc
        except BaseException:
            self._made -= 1
            raise
        driver: Conn = raw.driver_connection  # type: ignore[assignment]
        # Ours from now on: the pool forgets it (and makes another when it needs one).
        raw.detach()
        # Lists go over the wire in binary: psycopg's text form quotes and escapes
        # every element in Python (a regex per element; ~30 us per task for a
        # submit_many's eleven 1,000-element arrays), the binary form only packs
        # lengths. Same array types either way (a list of only None stays text).
        driver.adapters.register_dumper(list, ListBinaryDumper)
        try:
            await driver.set_autocommit(True)
            await driver.execute(NO_SEQSCAN)
        except BaseException as exc:
            self._made -= 1
            await driver.close()
            if isinstance(exc, psycopg.Error):
                # Lost while being set up (nothing of ``sql`` was sent): as a failure
                # to connect, which the caller retries.
                raise _error(sql, params, exc, False) from exc
            raise
        return _Kept(driver)

    async def _put_back(self, kept: _Kept, broken: bool) -> None:
        driver = kept.driver
        if broken or self._closed or driver.closed or driver.pgconn.transaction_status != _IDLE:
            self._made -= 1
            # psycopg's close() never suspends (it finishes the libpq connection), so
            # it completes even in a cancelled task.
            await driver.close()
            return
        kept.idle_since = time.monotonic()
        self._idle.append(kept)
        if self._made > self._keep and self._trimmer is None:
            self._trimmer = asyncio.get_running_loop().call_later(IDLE_CLOSE, self._trim)

    def _trim(self) -> None:
        """Close the kept connections beyond KEEP that have been idle IDLE_CLOSE
        seconds (oldest first), and look again later while more than KEEP exist."""
        self._trimmer = None
        if self._closed:
            return
        moment = time.monotonic()
        while self._made > self._keep and self._idle:
            if moment - self._idle[0].idle_since < IDLE_CLOSE:
                break
            stale = self._idle.pop(0)
            self._made -= 1
            closing = asyncio.ensure_future(stale.driver.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        if self._made > self._keep:
            wait = IDLE_CLOSE
            if self._idle:
                wait = max(IDLE_CLOSE - (moment - self._idle[0].idle_since), 0.01)
            self._trimmer = asyncio.get_running_loop().call_later(wait, self._trim)

    async def _pooled(self, sql: str, params: Mapping[str, Any]) -> list[Any]:
        # Every kept connection is busy: a pooled one, switched to autocommit for the
        # statement and back.
        try:
            raw = await self._engine.raw_connection()
        except psycopg.Error as exc:
            # No connection could be made: nothing was sent.
            raise _error(sql, params, exc, False) from exc
        dead = False
        try:
            driver: Conn = raw.driver_connection  # type: ignore[assignment]
            await driver.set_autocommit(True)
            try:
                cur = psycopg.AsyncRawCursor(driver, row_factory=row_factory(sql))
                return await _execute(cur, sql, params)
            finally:
                if not driver.closed:
                    await driver.set_autocommit(False)
        except psycopg.Error as exc:
            dead = raw.driver_connection is None or raw.driver_connection.closed
            if _read_only(exc):
                dead = True  # to a standby: the pool must not hand it out again
            raise _error(sql, params, exc, dead) from exc
        finally:
            # Both may do driver I/O through SQLAlchemy's async adapter, which must
            # run inside its greenlet.
            if dead:
                await greenlet_spawn(raw.invalidate)
            await greenlet_spawn(raw.close)
