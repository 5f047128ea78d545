"""TaskStore: the public face of the protocol, written once for both backends.

Each public method validates its arguments and delegates to the module that
holds its part of the protocol:

* :mod:`.transactions` — opening, migrating, one transaction per call, retries;
* :mod:`.producer` — submit, idempotency keys, cancel, retry;
* :mod:`.streams` — the FIFO state machine of partitioned work;
* :mod:`.consumer` — claim, the lease holder's fenced writes, batch acks
  (their public methods are :class:`.leases.LeaseOps`, a base of this class);
* :mod:`.groups` — consumer groups (bus mode);
* :mod:`.upkeep` — recovery, eviction, retention, rolled-up counts;
* :mod:`.wake` — in-process wake-ups;
* :mod:`.codec` — rows to tasks, cursors.

The dialect subclasses (:mod:`conveyor.store.sqlite`, :mod:`conveyor.store.postgres`)
implement only the seam declared in :mod:`conveyor.store.seam`.

Public, internal, private. The methods of :class:`TaskStore` without a leading
underscore are the public API, covered by semantic versioning. What conveyor's
own worker, scheduler and CLI need beyond it lives in one place,
``store.internal`` (:class:`~conveyor.store.api_internal.Internal`): each of
its docstrings starts with "Internal, for conveyor's ...; not covered by
semver", and applications should not call it. Names with a leading underscore
are private to the store package: code of conveyor outside ``conveyor.store``
never reads them (``tests/test_no_back_doors.py`` fails if it does).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from sqlalchemy import ColumnElement, select

from conveyor import _values as v
from conveyor import tracing
from conveyor.collector import settle_collector
from conveyor.encryption import Encryption
from conveyor.errors import ConfigurationError, ConveyorError, InvalidArgument, NotFound
from conveyor.models import Backoff, Page, Status, Task
from conveyor.schema import keys as k
from conveyor.store.api_admin import AdminOps
from conveyor.store.api_bulk import BulkOps
from conveyor.store.api_dependencies import Batch, DependencyOps
from conveyor.store.api_internal import Internal
from conveyor.store.api_leases import MAX_LIMIT, LeaseOps
from conveyor.store.api_reads import InspectReads
from conveyor.store.api_workers import WorkerOps
from conveyor.store.protocol import (
    caller_tx,
    codec,
    dependencies,
    depth,
    producer,
    sealing,
    streams,
    submit_runs,
    submit_together,
    texts,
    wake,
    withdraw,
)
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.protocol.requests import Preparing, Request

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

T = TypeVar("T")

POLL_CAP = 0.5  # wait() never sleeps longer than this between looks
WAITER_TTL = 3600.0  # seconds a wait() without timeout stays registered unrenewed
WAITER_SLACK = 60.0  # a wait() with a timeout stays registered that much longer


class TaskStore(LeaseOps, InspectReads, WorkerOps, AdminOps, BulkOps, DependencyOps):
    """A durable task queue and message bus on one database.

    Use :func:`conveyor.connect` to make one; ``async with store:`` opens it
    (applying migrations) and closes it. Every method is a coroutine.
    """

    def __init__(
        self,
        url: str,
        *,
        migrate: bool = True,
        statement_timeout: float = 30.0,
        lock_timeout: float = 10.0,
        poll_interval: float = 1.0,
        engine_options: Mapping[str, Any] | None = None,
        max_payload_size: int | None = v.DEFAULT_MAX_SIZE,
        max_result_size: int | None = v.DEFAULT_MAX_SIZE,
        gc_freeze: bool = False,
        encryption: Encryption | None = None,
    ) -> None:
        self.url = url
        if encryption is None:
            encryption = Encryption.from_env()
        elif not isinstance(encryption, Encryption):
            raise InvalidArgument("encryption", "must be a conveyor.Encryption")
        #: The keys of encryption at rest (``None``: none; see :mod:`conveyor.encryption`):
        #: ``encryption=`` given to connect(), else ``$CONVEYOR_ENCRYPTION_KEYS``.
        self.encryption = encryption
        self._keyring = sealing.Keyring(encryption)
        if not isinstance(gc_freeze, bool):
            raise InvalidArgument("gc_freeze", "must be True or False")
        #: Settle the process's garbage collector at the first open (see open()).
        self.gc_freeze = gc_freeze
        #: The internal methods of conveyor's own worker, scheduler and CLI (not
        #: covered by semver; see the module docs).
        self.internal = Internal(self)
        #: Largest payload (and metadata) accepted, in bytes of JSON; None: no limit.
        self.max_payload_size = v.size_limit("max_payload_size", max_payload_size)
        #: Largest result accepted by succeed(), in bytes of JSON; None: no limit.
        self.max_result_size = v.size_limit("max_result_size", max_result_size)
        self.migrate = migrate
        self.statement_timeout = v.duration_seconds("statement_timeout", statement_timeout)
        self.lock_timeout = v.duration_seconds("lock_timeout", lock_timeout)
        self.poll_interval = v.duration_seconds("poll_interval", poll_interval, allow_zero=False)
        self.engine_options = dict(engine_options or {})
        #: Seconds added to the store's clock; lets tests move time without sleeping.
        self.clock_offset = 0.0
        self._engine: AsyncEngine | None = None
        self._open_lock: asyncio.Lock | None = None
        self._known_groups: set[tuple[str, str]] = set()
        self._capped: set[str] = set()
        self._limited: set[str] = set()
        self._busy: set[tuple[str, tuple[str, ...], str | None]] = set()
        self._claims_noted: dict[tuple[str, str], float] = {}
        self._work_waker: wake.Waker | None = None
        self._done_waker: wake.Waker | None = None

    # ------------------------------------------------------------- lifecycle
    async def open(self) -> None:
        """Connect, apply pending migrations (unless ``migrate=False``), check the
        protocol version. Called for you by ``async with`` or the first call.

        With ``gc_freeze=True``, opening also settles the garbage collector, once
        per process (:func:`conveyor.collector.settle_collector`), as a worker's
        start does. By default the collector is left alone: freezing a process's
        objects is the application's choice, not a side effect of opening a store."""
        if self._engine is not None:
            return
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._engine is not None:
                return
            engine = await tx.open_engine(self)
            self._read_engine = self._create_read_engine()
            self._texts = texts.build(self, engine.dialect)
            self._work_waker = wake.Waker(remember=True)
            self._done_waker = wake.Waker()
            self._engine = engine
            # The wake channel starts with the first claim or wait (wake.listen).
        if self.gc_freeze:
            # Once per process: what is alive now (modules, SQLAlchemy, the driver,
            # the app) is frozen out of the collector's full passes, each of which
            # otherwise walks it all: 30-60 ms stalls every few thousand tasks
            # submitted or claimed, up to half the client CPU of a batch submit.
            settle_collector()

    async def close(self) -> None:
        """Release every connection. The store can be opened again afterwards."""
        engine, self._engine = self._engine, None
        if engine is not None:
            start, self._wake_start = self._wake_start, None
            if start is not None and not start.done():
                start.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await start
            await self._stop_wake()
            await engine.dispose()
        replica, self._read_engine = self._read_engine, None
        if replica is not None:
            await replica.dispose()

    async def __aenter__(self) -> TaskStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(
        self, work: Callable[[AsyncConnection], Awaitable[T]], *, write: bool = True
    ) -> T:
        """Run ``work`` in one transaction, retrying transient failures."""
        return await tx.run(self, work, write=write)

    def _now(self) -> ColumnElement[int]:
        """The store's clock as SQL (the dialect's clock plus ``clock_offset``)."""
        return tx.now(self)

    async def _current_now_us(self, conn: AsyncConnection) -> int:
        """Read the store's clock in microseconds (inside ``conn``'s transaction)."""
        return await tx.now_us(self, conn)

    async def _refresh_streams(
        self, conn: AsyncConnection, keys: Iterable[tuple[Any, ...]]
    ) -> None:
        """Recompute the given streams (see :func:`conveyor.store.protocol.streams.refresh`)."""
        await streams.refresh(self, conn, keys)

    # ------------------------------------------------------------ producer
    async def submit(
        self,
        name: str,
        payload: Any = None,
        *,
        queue: str = "default",
        priority: int = 0,
        delay: v.Duration | None = None,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        key: str | None = None,
        conflict: Literal["reuse", "reject", "replace"] = "reuse",
        partition: str | None = None,
        parent: Task | str | None = None,
        correlation_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        backoff: Backoff | dict[str, float] | v.Duration | None = None,
        after: Iterable[Task | str] | None = None,
        on_parent_failure: Literal["cancel", "run"] = "cancel",
        batch: Batch | str | None = None,
        connection: Any = None,
        concurrency_key: str | None = None,
    ) -> Task:
        """Insert one task and return it (queue-mode view).

        With ``key``, an existing task under that key is returned unchanged
        (``conflict="reuse"``), refused with :class:`AlreadyExists` (``"reject"``),
        or cancelled and replaced (``"replace"``). With ``connection`` (the caller's
        SQLAlchemy ``AsyncConnection`` or ``AsyncSession``), the task is written in
        the caller's transaction and exists only once the caller commits.

        With ``after`` (tasks or task ids, of any queue), the task is ``waiting``
        until every one of them has succeeded in queue mode, then queued (in the
        transaction that finished the last); if one fails for good, is cancelled
        or evicted, it is cancelled with an error naming that parent (and so are
        its own dependents), unless ``on_parent_failure="run"``: then it is
        queued once every parent is terminal. A parent already finished counts
        at once. ``batch`` submits it into a batch (:meth:`batch`).

        ``concurrency_key`` names the task's tenant for its queue's flow control
        (``key_concurrency``, ``key_rate`` and ``fair`` of
        :meth:`configure_queue`; one key for all three); not with a ``partition``.
        """
        request = {
            "name": name,
            "payload": payload,
            "queue": queue,
            "priority": priority,
            "delay": delay,
            "run_at": run_at,
            "max_attempts": max_attempts,
            "key": key,
            "conflict": conflict,
            "partition": partition,
            "parent": parent,
            "correlation_id": correlation_id,
            "metadata": metadata,
            "backoff": backoff,
        }
        if after is not None or on_parent_failure != "cancel" or batch is not None:
            request.update(after=after, on_parent_failure=on_parent_failure, batch=batch)
        if concurrency_key is not None:
            request["concurrency_key"] = concurrency_key
        return (await self.submit_many([request], connection=connection))[0]

    async def submit_many(
        self, requests: Iterable[Mapping[str, Any]], *, connection: Any = None
    ) -> builtins.list[Task]:
        """Insert many tasks in one transaction; returns them in request order.

        Each request is a mapping with :meth:`submit`'s argument names. One bad
        request rejects the whole batch before anything is written. With
        ``connection`` (an ``AsyncConnection`` or ``AsyncSession``), the transaction
        is the caller's: nothing is committed here, keys, partitions and groups
        behave as always, and :class:`ConfigurationError` refuses a connection in
        autocommit mode or to another database than the store's.
        """
        if isinstance(requests, Mapping):
            raise InvalidArgument("requests", "must be a list of request dicts, not one dict")
        preparing = Preparing(requests, self.max_payload_size)
        recording = tracing.recording()
        if connection is None and not recording:
            # A large plain batch in runs, validated as they go (none: the usual path).
            tasks = await submit_runs.submit(self, preparing)
            if tasks is not None:
                wake.wake_local(self, work=True)
                return tasks
        prepared = preparing.rest()
        if not prepared:
            return []
        if not recording:  # no span to make: no context manager either
            return await self._submit(prepared, connection)
        with tracing.producer_span(prepared):
            return await self._submit(prepared, connection)

    async def _submit(
        self, prepared: builtins.list[Request], connection: Any
    ) -> builtins.list[Task]:
        if connection is not None:
            return await caller_tx.submit(self, connection, prepared)
        if any(r.linked for r in prepared):
            return await dependencies.submit(self, prepared)
        encrypted = self._keyring.encrypted
        tasks = None
        try:
            if encrypted and producer.touches(prepared, encrypted):
                # Known encrypted: straight to the submit that seals (see sealing).
                tasks = await producer.submit_sealed(self, prepared)
            elif not depth.known_capped(self, prepared):
                try:
                    sent = await submit_together.submit(self, prepared)
                    tasks = sent if sent is not None else await producer.submit(self, prepared)
                except sealing.Refused:
                    # A queue of the batch is encrypted: nothing was written.
                    tasks = await producer.submit_sealed(self, prepared)
        except depth.Capped:
            tasks = None  # a queue with a max_depth: rolled back, nothing written
        except ConfigurationError:
            # An encrypted queue and no keys: nothing written but, maybe, the keys a
            # plain statement claimed before it refused (their tasks do not exist).
            await producer.drop_orphan_keys(self, prepared)
            raise
        if tasks is None:
            # A queue with a max_depth: step by step, its depth counted first.
            tasks = await self._run(lambda conn: producer.submit_tx(self, conn, prepared))
        wake.wake_local(self, work=True)
        return tasks

    async def get(
        self, task_id: str, *, group: str | None = None, replica: bool = False
    ) -> Task | None:
        """The task as queue mode (or ``group``) sees it; ``None`` if unknown.

        Read from the primary, so it sees the caller's own writes; ``replica=True``
        reads it from the store's ``read_url`` instead (where there is one), which
        may lag behind."""
        grp = codec.group_key(group)
        task_id = v.name("task_id", task_id)
        if not isinstance(replica, bool):
            raise InvalidArgument("replica", f"must be True or False, got {replica!r}")
        found = await tx.run(
            self,
            lambda conn: codec.fetch_tasks(conn, grp, ids=[task_id], keyring=self._keyring),
            write=False,
            replica=replica,
        )
        return found.get(task_id)

    async def get_by_key(self, key: str) -> Task | None:
        """The task currently holding idempotency key ``key``, or ``None``."""
        key = v.name("key", key)

        async def work(conn: AsyncConnection) -> Task | None:
            task_id = (await conn.execute(select(k.c.task_id).where(k.c.key == key))).scalar()
            if task_id is None:
                return None
            keyring = self._keyring
            found = await codec.fetch_tasks(conn, q.QUEUE_MODE, ids=[task_id], keyring=keyring)
            return found.get(task_id)

        return await self._run(work, write=False)

    async def list(
        self,
        *,
        status: Status | str | None = None,
        queue: str | None = None,
        name: str | None = None,
        partition: str | None = None,
        root_id: str | None = None,
        correlation_id: str | None = None,
        group: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
        order: Literal["oldest", "newest"] = "oldest",
    ) -> Page:
        """A page of tasks in submit order, filtered; keyset-paginated by ``cursor``.

        ``order="oldest"`` starts from the first task submitted, ``"newest"`` from
        the last one and goes back in time; a cursor continues in the order of the
        page that returned it (passing it with the other order is refused). Pages
        stay stable while tasks are inserted, and a deep page costs what the first
        one does.
        """
        grp = codec.group_key(group)
        limit = v.positive_int("limit", limit)
        if limit > MAX_LIMIT:
            raise InvalidArgument("limit", f"must be at most {MAX_LIMIT}, got {limit}")
        if order not in ("oldest", "newest"):
            raise InvalidArgument("order", f"must be 'oldest' or 'newest', got {order!r}")
        filters = {
            "queue": queue,
            "name": name,
            "partition": partition,
            "root_id": root_id,
            "correlation_id": correlation_id,
        }
        stmt = codec.list_statement(grp, status, filters, cursor, limit + 1, order=order)

        async def work(conn: AsyncConnection) -> list[Any]:
            return builtins.list(await conn.execute(stmt))

        rows = await tx.run(self, work, write=False, replica=True)
        more = len(rows) > limit
        rows = rows[:limit]
        items = [codec.row_to_task(row, self._keyring) for row in rows]
        after = codec.encode_cursor(rows[-1].seq, order=order) if more else None
        return Page(items=items, next_cursor=after)

    async def cancel(self, task_id: str) -> Task | None:
        """Withdraw a task for queue mode and every group.

        queued -> cancelled; running -> cancelled (the holder's next write raises
        :class:`TaskCancelled`); terminal: unchanged. ``None`` if no such task.
        """
        task_id = v.name("task_id", task_id)

        async def work(conn: AsyncConnection) -> Task | None:
            await withdraw.cancel_tx(self, conn, [task_id])
            keyring = self._keyring
            found = await codec.fetch_tasks(conn, q.QUEUE_MODE, ids=[task_id], keyring=keyring)
            return found.get(task_id)

        task = await self._run(work)
        wake.wake_local(self, work=False)
        return task

    async def cancel_by_key(self, key: str) -> Task | None:
        """:meth:`cancel` the task holding ``key``; ``None`` if no task has it."""
        task = await self.get_by_key(key)
        return None if task is None else await self.cancel(task.id)

    async def retry(
        self, task_id: str, *, reset_attempts: bool = False, group: str | None = None
    ) -> Task | None:
        """Put a failed, cancelled, evicted or skipped task back in the queue (for
        queue mode or ``group``). It runs at least once more. ``reset_attempts`` grants a fresh
        budget of the task's ``max_attempts`` from here (``max_attempts`` grows;
        attempt numbers keep counting, so ``attempt=`` fencing stays sound). Other
        statuses are left unchanged. ``None`` if unknown.
        """
        grp = codec.group_key(group)
        task_id = v.name("task_id", task_id)

        task = await self._run(
            lambda conn: withdraw.retry_tx(self, conn, task_id, grp, reset_attempts)
        )
        wake.wake_local(self, work=True)
        return task

    async def retry_by_key(
        self, key: str, *, reset_attempts: bool = False, group: str | None = None
    ) -> Task | None:
        """:meth:`retry` the task holding ``key``; ``None`` if no task has it."""
        task = await self.get_by_key(key)
        if task is None:
            return None
        return await self.retry(task.id, reset_attempts=reset_attempts, group=group)

    async def wait(
        self, task_id: str, *, timeout: v.Duration | None = None, group: str | None = None
    ) -> Task:
        """Return the task once it is terminal; raise :class:`TimeoutError` after
        ``timeout`` seconds, :class:`NotFound` if there is no such task."""
        limit = None if timeout is None else v.duration_seconds("timeout", timeout)
        deadline = None if limit is None else time.monotonic() + limit
        pause = 0.05
        await wake.listen(self)
        assert self._done_waker is not None
        # Registered before the first look (where the wake channel announces
        # completions only to registered waiters): a completion committed after that
        # is announced.
        token = uuid.uuid4().hex
        ttl = WAITER_TTL if limit is None else limit + WAITER_SLACK
        renew_at = time.monotonic() + ttl / 2
        await self._add_waiter(task_id, token, round(ttl * v.US))
        # Watch before looking: a completion that commits while get() runs still
        # wakes the nap that follows. Polling (capped at POLL_CAP) covers
        # completions nobody announces to this process.
        try:
            with self._done_waker.watch([task_id]) as watch:
                while True:
                    watch.event.clear()
                    if time.monotonic() > renew_at:
                        await self._add_waiter(task_id, token, round(ttl * v.US))
                        renew_at = time.monotonic() + ttl / 2
                    task = await self.get(task_id, group=group)
                    if task is None:
                        raise NotFound(f"task {task_id}")
                    if task.terminal:
                        return task
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError(f"task {task_id} still {task.status} after {limit} s")
                    nap = (
                        min(pause, POLL_CAP)
                        if remaining is None
                        else min(pause, POLL_CAP, remaining)
                    )
                    await watch.wait(nap)
                    pause = min(pause * 2, POLL_CAP)
        finally:
            # The registration only speeds up wake-ups; a failure to drop it leaves
            # one that expires, never a wrong answer.
            with contextlib.suppress(ConveyorError):
                await self._drop_waiter(task_id, token)

    # --------------------------------------------------------------- waking
    def _wake(
        self,
        *,
        queues: Iterable[str] | None = (),
        task_ids: Iterable[str] | None = (),
    ) -> None:
        """Wake this process's waiters: idle workers of ``queues`` and ``wait()``
        calls on ``task_ids`` (``None``: all of them). The wake channel calls it
        for what other processes announce."""
        wake.wake(self, queues=queues, task_ids=task_ids)

    async def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Sleep until new work may be claimable in ``queues`` or ``timeout`` passes.

        Returns True when woken by a notification (an in-process commit, or the
        backend's wake channel), False when the timeout ran out. Used by idle
        workers; a notification that arrived since the last wait also counts, so
        one landing between an empty claim and this call is not lost.
        """
        names = v.names("queues", queues)
        await wake.listen(self)
        assert self._work_waker is not None
        return await self._work_waker.wait(names, timeout)
