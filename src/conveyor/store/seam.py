"""The dialect seam: everything a backend supplies, declared in one place.

:class:`Seam` is the whole contract between the protocol (the role modules of
this package, which :class:`~conveyor.store.base.TaskStore` uses) and a dialect
(:mod:`conveyor.store.sqlite`, :mod:`conveyor.store.postgres`). A dialect
implements exactly these abstract methods and nothing else; each docstring
states what the protocol relies on. Where a dialect must supply its own SQL,
the seam asks for a *statement*, never for a different protocol step.

The class also names the per-store state the role modules read (the engine,
the clock offset, the in-process wakers), so they depend on this module and
never on the store class itself.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from sqlalchemy import ColumnElement, Select, Update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from conveyor.store.protocol.sealing import Keyring
    from conveyor.store.protocol.texts import Texts
    from conveyor.store.protocol.wake import Waker

#: Runs one driver statement by itself (autocommit) and returns its rows.
DirectRunner = Callable[[str, Mapping[str, Any]], Awaitable[list[Any]]]
#: Runs statements in order in one transaction on a driver connection of the
#: dialect's own; the rows of the one at the index given (-1: the last), or ``None``
#: when no such connection is free.
StepsRunner = Callable[[Sequence[tuple[str, Mapping[str, Any]]], int], Awaitable[list[Any] | None]]

#: Runs the driver statements of one text (a script's, in order; most often one)
#: once per parameters taken from an iterable, in order, in one transaction; the
#: rows of the last statement of every run, or ``None`` when the dialect has no
#: connection of its own free.
BatchRunner = Callable[[Sequence[str], Iterable[Mapping[str, Any]]], Awaitable[list[Any] | None]]

T = TypeVar("T")


class ConnectionRunner(Protocol):
    """Runs blocking functions on a dialect's own connection, one at a time, in
    arrival order (see :meth:`Seam._connection_runner`)."""

    async def call(self, fn: Callable[[Connection], T], *, inline: bool = False) -> T:
        """Run ``fn(connection)`` and return its result (or raise its exception).
        ``fn`` opens and ends its own transaction. ``inline``: ``fn`` is a short
        write transaction the runner may run on the caller's thread (see
        :mod:`conveyor.store.sqlite.thread`)."""
        ...


@dataclass(frozen=True, slots=True)
class Claim:
    """What a claim asks of the claim hook (:meth:`Seam._claim`)."""

    #: The group key, ``""`` for queue mode.
    grp: str
    #: Distinct queue names, at least one.
    queues: Sequence[str]
    worker_id: str
    #: Seconds, or ``None``: each queue's stored setting, else the default.
    lease: float | None
    #: 1 or more.
    limit: int
    #: Only that partition's streams, or ``None``.
    partition: str | None
    #: A claim across streams taking at most that many tasks of each, or ``None``
    #: (one stream, or unpartitioned work).
    per_stream: int | None
    #: Asked by a flow-controlled claim (:mod:`conveyor.store.protocol.limits`),
    #: which holds the queues' settings rows and gives ``limit`` as their budget:
    #: their streams and (but for key-limited or fair queues) their unpartitioned
    #: rows are claimable. Otherwise a flow-controlled queue leases nothing here.
    flow: bool = False


class Seam(abc.ABC):
    """What a backend supplies to the protocol, and the state the protocol shares."""

    # ------------------------------------------------ state the roles read
    #: Whether the clock is the process's (SQLite), read when a statement runs
    #: rather than by the database: a statement built once then binds it per run
    #: (see :func:`conveyor.store.protocol.texts.now`).
    process_clock: ClassVar[bool] = False
    #: The database URL the store was made with.
    url: str
    #: Whether open() applies pending migrations.
    migrate: bool
    #: Seconds added to the store's clock; lets tests move time without sleeping.
    clock_offset: float
    #: Statement and lock timeouts in seconds (a dialect applies them per transaction).
    statement_timeout: float
    lock_timeout: float
    #: Whether a single-statement operation may run in autocommit mode (no BEGIN and
    #: COMMIT round trips) with the store's timeouts still in force. A dialect sets it.
    autocommit_single: bool = False
    _engine: AsyncEngine | None
    #: The replica's engine (:meth:`_create_read_engine`), while open; ``None``: none.
    _read_engine: AsyncEngine | None = None
    #: The statements built once at open() (:mod:`conveyor.store.protocol.texts`).
    _texts: Texts | None = None
    _work_waker: Waker | None
    _done_waker: Waker | None
    #: The start of the cross-process wake channel, once something waited or claimed
    #: (:func:`conveyor.store.protocol.wake.listen`); ``None`` before that and after close().
    _wake_start: asyncio.Task[None] | None = None
    #: (queue, group) pairs this store has seen subscribed: claims skip the check.
    _known_groups: set[tuple[str, str]]
    #: Claim keys whose last claim found work: the next one skips the probe.
    _busy: set[tuple[str, tuple[str, ...], str | None]]
    #: Queues this store last saw with a max_depth: their submits go step by step
    #: (:mod:`conveyor.store.protocol.depth`).
    _capped: set[str]
    #: Queues this store last saw flow-controlled: claims of them take the limited
    #: path at once (:mod:`conveyor.store.protocol.limits`).
    _limited: set[str]
    #: When this store last wrote each (queue, group)'s claim time (its clock, in
    #: seconds): a group's claims write it at most once a second
    #: (:func:`conveyor.store.protocol.groups.note_claims`).
    _claims_noted: dict[tuple[str, str], float]
    #: The encryption keys and what the store remembers about sealed queues and
    #: tasks (:mod:`conveyor.store.protocol.sealing`).
    _keyring: Keyring

    async def open(self) -> None:  # pragma: no cover - TaskStore implements it
        """Connect and migrate (see :meth:`conveyor.store.base.TaskStore.open`)."""
        raise NotImplementedError

    def _wake(
        self, *, queues: Iterable[str] | None = (), task_ids: Iterable[str] | None = ()
    ) -> None:  # pragma: no cover - TaskStore implements it
        """Wake this process's waiters (see :mod:`conveyor.store.protocol.wake`)."""
        raise NotImplementedError

    # ------------------------------------------------------- connections
    @abc.abstractmethod
    def _create_engine(self) -> AsyncEngine:
        """Build the async engine, with the dialect's connection set-up attached.

        The engine must honour the ``conveyor_write`` execution option: a write
        transaction (``True``) must be able to proceed to commit without a lock
        upgrade failing (SQLite: ``BEGIN IMMEDIATE``); a read (``False``) must not
        block writers. The store's ``statement_timeout`` and ``lock_timeout`` hold
        for every transaction.
        """

    def _create_read_engine(self) -> AsyncEngine | None:
        """An engine on a replica the store's inspection reads may go to (those run
        with ``replica=True`` by :func:`conveyor.store.protocol.transactions.run`),
        set up as :meth:`_create_engine`'s; ``None`` (the default): every read goes
        to the primary. Made at open(), after the primary's; nothing is migrated
        through it."""
        return None

    def _connection_runner(self) -> ConnectionRunner | None:
        """Where the dialect runs a whole transaction as one blocking function on a
        connection of its own (SQLite: in-process, a hop per statement would cost
        more than the statement), the runner of those functions; ``None`` where
        transactions run statement by statement on the async engine. Only valid
        between ``_create_engine`` and close."""
        return None

    @abc.abstractmethod
    def _transaction_gate(self, write: bool) -> AbstractAsyncContextManager[None]:
        """Entered around every transaction attempt the store runs (``write``: whether
        it is a write transaction); where the backend needs transactions of this
        process queued in-process (one SQLite connection to a private in-memory
        database), it makes them wait their turn, in arrival order. Otherwise it
        returns at once."""

    def _is_capped(self, exc: DBAPIError) -> bool:
        """True when ``exc`` is a submit statement's refusal of a queue with a
        ``max_depth`` (``conveyor_capped``, :mod:`conveyor.store.protocol.depth`).
        Must not raise, and must look only at ``exc``."""
        return False

    def _is_full(self, exc: DBAPIError) -> bool:
        """True when ``exc`` says the database ran out of space (a full disk, a file
        at its size limit). Must not raise, and must look only at ``exc``."""
        return False

    def _is_read_only(self, exc: DBAPIError) -> bool:
        """True when ``exc`` says the server is read-only (a standby, a primary
        demoted by a failover): the statement was refused and nothing of it ran.
        Must not raise, and must look only at ``exc``."""
        return False

    @abc.abstractmethod
    async def _database_identity(self, conn: AsyncConnection) -> tuple[Any, ...]:
        """Which database ``conn`` is connected to, as a value equal for any two
        connections to the same database and different otherwise (however the URLs
        spell host names): how ``submit(..., connection=...)`` refuses a caller's
        connection to another database. Raises :class:`ConfigurationError` for a
        database no other connection can share."""

    @abc.abstractmethod
    async def _join_transaction(self, conn: AsyncConnection) -> None:
        """Make sure a caller's connection (not one of the store's) is inside a
        database transaction before the producer reads and writes in it, so that
        its savepoint and its rows belong to the caller's transaction."""

    @abc.abstractmethod
    def _is_transient(self, exc: DBAPIError) -> bool:
        """True for driver errors that a retry of the whole transaction can cure
        (a busy database, a serialization failure, a deadlock); False otherwise.
        Must not raise, and must look only at ``exc`` (no I/O)."""

    # ------------------------------------------------------------- clock
    @abc.abstractmethod
    def _db_now(self) -> ColumnElement[int]:
        """The clock as a SQL expression in integer microseconds since the epoch.

        Every statement of the protocol that depends on time reads it through this
        (plus the store's ``clock_offset``). Within one statement it must be stable,
        so comparisons with it can be index conditions."""

    # ----------------------------------------------------------- locking
    @abc.abstractmethod
    def _lock_candidates(self, stmt: Select[Any]) -> Select[Any]:
        """Make a candidate-selection statement safe against concurrent claimers:
        two transactions running it at once must never both get the same row, and
        neither may wait for the other (Postgres: ``FOR UPDATE SKIP LOCKED``; SQLite:
        the write lock the transaction already holds)."""

    @abc.abstractmethod
    def _lock_rows(self, stmt: Select[Any]) -> Select[Any]:
        """Make a read lock the rows it returns until commit, waiting for holders,
        so that the transaction's later reads and writes of them see no concurrent
        change (Postgres: ``FOR UPDATE``; SQLite: the write lock)."""

    @abc.abstractmethod
    async def _lock_for_backfill(self, conn: AsyncConnection) -> None:
        """The producer barrier, taken first in a subscribe's transaction: wait out
        producers in flight, and hold new ones back until ``conn``'s transaction
        ends, so a new group's backfill sees every task committed before it and every
        later task gets its delivery row at submit. It must exclude other subscribes
        too (they write stream rows), and must not block readers or row locks."""

    @abc.abstractmethod
    def _lock_for_migration(self, conn: Connection) -> None:
        """Serialise migrations: inside ``conn``'s transaction, wait until no other
        process is migrating the same database; the lock ends with the transaction."""

    @abc.abstractmethod
    def _maintenance_lock(self) -> AbstractAsyncContextManager[bool]:
        """Yield whether this caller should run a maintenance pass now. At most one
        caller at a time may get True where passes could collide; the others get
        False at once (they skip) rather than queueing."""

    @abc.abstractmethod
    async def _refresh_statistics(self, conn: AsyncConnection) -> list[str]:
        """Bring the query planner's statistics of the store's busiest tables up to
        date where the database has not (run by a maintenance pass, in ``conn``'s
        transaction); the tables refreshed. Must not wait on locks others hold."""

    # -------------------------------------------------------- statements
    @abc.abstractmethod
    def _upsert(self, table: Any) -> Any:
        """``INSERT`` for ``table`` supporting ``on_conflict_do_nothing`` and
        ``on_conflict_do_update`` (both dialects spell them alike)."""

    @abc.abstractmethod
    def _returning_view(self, stmt: Update) -> Update:
        """Make an ``UPDATE`` of delivery rows return, for each row it changes, every
        column of :func:`conveyor.store.protocol.queries.view_columns` under the same names (the
        joined task row as the updated delivery sees it), in one statement."""

    @abc.abstractmethod
    def _claim_probe(
        self, grp: str, queues: Sequence[str], partition: str | None
    ) -> Select[Any] | None:
        """A cheap read-only statement a claim runs *before* its write transaction,
        returning one row whose columns are truthy when the claim could find work
        (ready rows, free streams, expired leases), its clock read when it runs; or
        ``None`` where an idle claim takes no lock worth sparing and claims go
        straight in."""

    # ------------------------------------------------------------- claim
    @abc.abstractmethod
    async def _claim(self, ask: Claim) -> Sequence[Any] | None:
        """The claim hook (``catalogue.HOOKS["claim"]``): lease up to ``ask.limit``
        tasks of ``ask.queues`` in group ``ask.grp`` to ``ask.worker_id`` (see
        :class:`Claim`), in one transaction of its own, committed before it returns.

        * It reads which of ``queues`` are encrypted and hands them to
          :func:`conveyor.store.protocol.sealing.claimed_from` before it leases:
          a store without keys raises ``ConfigurationError`` there, having leased
          and written nothing.
        * If a lease of ``grp`` in ``queues`` has expired, it leases nothing,
          writes nothing and returns ``None``: the caller recovers the expired
          leases (:func:`conveyor.store.protocol.upkeep.recover_tx`) and asks again.
        * Otherwise it leases exactly the rows
          :func:`conveyor.store.protocol.claim_order.claim_order` chooses (as of
          its own snapshot, at the store's clock): each becomes ``running``,
          ``attempt`` + 1, ``worker_id`` set, ``lease`` and ``lease_expires_at``
          (now + lease) set, ``started_at`` set where unset, progress cleared; each
          stream it took from is marked held (``available_at`` NULL). It returns
          those rows as they are after the lease, each with every column of
          :func:`conveyor.store.protocol.queries.view_columns` under the same
          names, in claim order (possibly none).
        * Concurrent claims never lease the same row, and never wait for each
          other: rows another claim holds are passed over (Postgres: ``SKIP
          LOCKED``; SQLite: the one write lock).
        * The hot path: one round trip to a server (one statement), or one hop to
          the dialect's connection thread. Its statements are the dialect's own,
          named ``claim.<part>`` in its SQL files.
        * Flow control: the queues among ``queues`` with limits
          (``conveyor_queues``: concurrency, key_concurrency, rate, key_rate,
          fair) are handed to :func:`conveyor.store.protocol.limits.claimed_from`
          and lease nothing, unless ``ask.flow`` (see :class:`Claim`).
        """

    @abc.abstractmethod
    async def _claim_in(self, conn: AsyncConnection, ask: Claim) -> Sequence[Any] | None:
        """:meth:`_claim` inside the caller's transaction on ``conn`` (nothing
        committed here): the flow-controlled claim's step, taken while it holds
        the queues' settings rows (:mod:`conveyor.store.protocol.limits`)."""

    @abc.abstractmethod
    def _statement_texts(self) -> Mapping[str, str]:
        """The dialect's SQL of the statements of :mod:`conveyor.store.catalogue`, by
        name, written with ``:name`` bind parameters (read from the dialect's
        ``sql/*.sql`` files with :func:`conveyor.store.protocol.texts.load`); each
        meets the contract its catalogue entry states."""

    @abc.abstractmethod
    def _direct_runner(self) -> DirectRunner | None:
        """A runner of one driver statement by itself, committed on its own, on a
        connection the engine made (pooled, or kept aside by the dialect) but
        without SQLAlchemy's execution layer
        (the statement's per-call cost is then the driver's); or ``None`` (run
        through ``exec_driver_sql``). The store's timeouts must hold, a connection
        found dead must be invalidated, its statements run outside
        :meth:`_transaction_gate` (a dialect with a direct runner has the server
        order its transactions), and driver errors must be raised as
        SQLAlchemy ``DBAPIError`` (``connection_invalidated`` set for a dead
        connection), so that :func:`conveyor.store.protocol.transactions.run` retries and
        translates them as it does its own."""

    @abc.abstractmethod
    def _steps_runner(self) -> StepsRunner | None:
        """Like :meth:`_direct_runner`, for a short transaction of several driver
        statements run in order (each statement sees what the ones before it
        locked and wrote): sent together where the driver can (one round trip),
        the rows of the statement at the index given returned (-1: the last; a
        text appears once among the steps whose rows are read). It may answer
        ``None`` when it has no
        connection of its own free; the caller then runs the same statements in an
        ordinary transaction. ``None`` for a dialect without one."""

    @abc.abstractmethod
    def _batch_runner(self) -> BatchRunner:
        """The runner of a large batch sent in runs
        (:mod:`conveyor.store.protocol.submit_runs`): the statements of one text run
        once per parameters taken from an iterable, in order, in one transaction
        (each run sees what the runs before it wrote), the rows of the last
        statement of every run returned in order. Where the driver can, each run
        goes to the server as soon as its parameters are taken, so what makes the
        next run's parameters overlaps the server's work on this one (Postgres,
        pipelined on a kept connection); where there is no server to overlap with
        (SQLite), it may take every run's parameters first. An exception raised by
        the iterable propagates, nothing of the runs written. It may answer
        ``None`` (nothing taken) when it has no connection of its own free: the
        caller then runs the same runs in an ordinary transaction."""

    # ------------------------------------------------------- wake channel
    @abc.abstractmethod
    async def _start_wake(self) -> None:
        """Start the cross-process wake channel: called once per opening, the first
        time this store claims or waits (:func:`conveyor.store.protocol.wake.listen`), so a
        store that only submits never holds one. What arrives from other processes
        is handed to ``self._wake``; what was announced before the channel started
        is not heard (a claim or wait that starts it looks at the database after
        this returns). A backend without one does nothing: its waiters poll."""

    @abc.abstractmethod
    async def _stop_wake(self) -> None:
        """Stop the cross-process wake channel (called by close(), after the start
        has finished, whether or not it was ever started)."""

    @abc.abstractmethod
    async def _add_waiter(self, task_id: str, token: str, ttl_us: int) -> None:
        """Register (or renew) a ``wait()`` on ``task_id`` under ``token`` for ``ttl_us``
        microseconds, committed on its own, where the wake channel announces
        completions only to registered waiters (Postgres: a ``conveyor_waiters`` row,
        so an acknowledgement nobody waits for costs no NOTIFY). Elsewhere it does
        nothing."""

    @abc.abstractmethod
    async def _drop_waiter(self, task_id: str, token: str) -> None:
        """Drop the registration :meth:`_add_waiter` made (nothing where it made none)."""

    @abc.abstractmethod
    async def _notify(
        self,
        conn: AsyncConnection,
        queues: Iterable[str],
        done: bool,
        task_ids: Iterable[str] = (),
    ) -> None:
        """Announce, inside ``conn``'s committing transaction, new work in ``queues``
        (``done=False``) or tasks that became terminal (``done=True``: ``task_ids``,
        or an empty ``task_ids`` when the caller does not know which — waiters then
        look again). Other processes' listeners must hear it only if the transaction
        commits. (This process's own waiters are woken by the store after commit.)"""
