"""TaskStore: every operation of the protocol, written once for both backends.

The dialect subclasses (:mod:`conveyor.store.sqlite`, :mod:`conveyor.store.postgres`)
supply only the seam: the clock, claim locking, the claimable probe, the wake
channel, and the translation of their driver's transient errors. Everything
else — transactions, validation, state transitions — lives here.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import builtins
import functools
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal, TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import ColumnElement, Select, delete, false, func, select, true, tuple_, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from conveyor import _values as v
from conveyor import statements as q
from conveyor.errors import (
    AlreadyExists,
    ConfigurationError,
    ConveyorError,
    InvalidArgument,
    LostLease,
    NotFound,
    ProtocolVersionMismatch,
    StoreUnavailable,
    TaskCancelled,
)
from conveyor.migrations import SCRIPT_LOCATION, VERSION_TABLE
from conveyor.models import (
    Backoff,
    ConsumerGroup,
    GroupStats,
    Page,
    QueueStats,
    Status,
    Task,
)
from conveyor.schema import PROTOCOL_VERSION, meta
from conveyor.schema import counts as cn
from conveyor.schema import deliveries as d
from conveyor.schema import groups as g
from conveyor.schema import keys as k
from conveyor.schema import maintenance as mt
from conveyor.schema import queues as qs
from conveyor.schema import streams as s
from conveyor.schema import tasks as t

log = logging.getLogger("conveyor.store")

T = TypeVar("T")

CONFLICTS = ("reuse", "reject", "replace")
DEFAULT_MAX_ATTEMPTS = 3
MAX_LIMIT = 10_000
PURGE_BATCH = 1_000
ROLLUP_BATCH = 5_000
TERMINAL = ("succeeded", "failed", "cancelled", "evicted")
TRANSIENT_RETRIES = 8
POLL_CAP = 0.5  # wait() never sleeps longer than this between looks
SUBMIT_FIELDS = frozenset(
    {
        "name",
        "payload",
        "queue",
        "priority",
        "delay",
        "run_at",
        "max_attempts",
        "key",
        "conflict",
        "partition",
        "parent",
        "correlation_id",
        "metadata",
        "backoff",
    }
)


@dataclass(slots=True)
class _Request:
    """A validated submit request."""

    id: str
    name: str
    payload: str
    queue: str
    priority: int
    delay_us: int | None
    run_at_us: int | None
    max_attempts: int | None
    backoff: str | None
    key: str | None
    conflict: str
    partition: str | None
    parent_id: str | None
    correlation_id: str | None
    metadata: str


def _row_to_task(row: Any) -> Task:
    m = row._mapping
    grp = m["grp"]
    return Task(
        id=m["id"],
        name=m["name"],
        queue=m["queue"],
        partition=m["partition"],
        payload=json.loads(m["payload"]),
        metadata=json.loads(m["metadata"]),
        priority=m["priority"],
        status=Status(m["status"]),
        attempt=m["attempt"],
        max_attempts=m["max_attempts"],
        run_at=v.from_us(int(m["run_at"])),
        created_at=v.from_us(int(m["created_at"])),
        started_at=v.from_us(m["started_at"]),
        finished_at=v.from_us(m["finished_at"]),
        lease_expires_at=v.from_us(m["lease_expires_at"]),
        worker_id=m["worker_id"],
        progress=m["progress"],
        progress_message=m["progress_message"],
        result=None if m["result"] is None else json.loads(m["result"]),
        error=None if m["error"] is None else json.loads(m["error"]),
        key=m["key"],
        parent_id=m["parent_id"],
        root_id=m["root_id"],
        correlation_id=m["correlation_id"],
        group=grp or None,
    )


def _group_key(group: str | None) -> str:
    checked = v.opt_name("group", group)
    return checked or q.QUEUE_MODE


def _encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"s": seq}).encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        seq = json.loads(raw)["s"]
        if not isinstance(seq, int):
            raise TypeError
        return seq
    except (ValueError, KeyError, TypeError):
        raise InvalidArgument("cursor", "is not a cursor returned by list()") from None


class _Watch:
    """Interest in some keys (queue names or task ids; ``None``: every key)."""

    __slots__ = ("event", "keys")

    def __init__(self, keys: frozenset[str] | None) -> None:
        self.keys = keys
        self.event = asyncio.Event()

    async def wait(self, timeout: float) -> bool:
        """True once notified (at once if it already was), False after ``timeout``."""
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
            return True
        except TimeoutError:
            return False


class _Waker:
    """In-process wake-ups keyed by queue name or task id.

    A watch registered *before* the caller looks at the database cannot miss a
    notification that arrives while it looks. ``remember=True`` covers callers
    that cannot register first (``wait_for_work`` right after an empty claim): a
    key notified while nobody watched it is kept, and the next wait on it returns
    at once — at worst one extra claim, never a missed wake-up. Remembered keys
    are queue names, so the set stays small.
    """

    def __init__(self, *, remember: bool = False) -> None:
        self._watches: set[_Watch] = set()
        self._remember = remember
        self._pending: set[str] = set()
        self._pending_all = False

    def notify(self, keys: Iterable[str] | None = None) -> None:
        """Wake the watches on any of ``keys`` (``None``: every watch)."""
        wanted = None if keys is None else frozenset(keys)
        hit: set[str] = set()
        for watch in self._watches:
            if wanted is None or watch.keys is None or not wanted.isdisjoint(watch.keys):
                watch.event.set()
                if wanted is not None and watch.keys is not None:
                    hit |= wanted & watch.keys
                elif wanted is not None:
                    hit |= wanted
        if self._remember:
            if wanted is None:
                self._pending_all = self._pending_all or not self._watches
            else:
                self._pending |= wanted - hit

    @contextmanager
    def watch(self, keys: Iterable[str] | None) -> Iterator[_Watch]:
        """Register interest in ``keys`` for the duration of the block."""
        watch = _Watch(None if keys is None else frozenset(keys))
        self._watches.add(watch)
        try:
            yield watch
        finally:
            self._watches.discard(watch)

    async def wait(self, keys: Iterable[str], timeout: float) -> bool:
        """Sleep until one of ``keys`` is notified (True) or ``timeout`` passes (False)."""
        wanted = frozenset(keys)
        if self._pending_all or not self._pending.isdisjoint(wanted):
            self._pending -= wanted
            self._pending_all = False
            return True
        with self.watch(wanted) as watch:
            return await watch.wait(timeout)


class TaskStore(abc.ABC):
    """A durable task queue and message bus on one database.

    Use :func:`conveyor.connect` to make one; ``async with store:`` opens it
    (applying migrations) and closes it. Every method is a coroutine.
    """

    #: Whether ``claim`` asks a cheap read-only probe before taking the write lock.
    probe_before_claim: ClassVar[bool] = False
    #: Whether UPDATE … RETURNING may return columns of a joined table (claims then
    #: lease and read the tasks in one statement).
    returning_joins: ClassVar[bool] = True

    def __init__(
        self,
        url: str,
        *,
        migrate: bool = True,
        statement_timeout: float = 30.0,
        lock_timeout: float = 10.0,
        poll_interval: float = 1.0,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.url = url
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
        self._busy: set[tuple[str, tuple[str, ...], str | None]] = set()
        self._work_waker: _Waker | None = None
        self._done_waker: _Waker | None = None

    # ------------------------------------------------------------------ seam
    @abc.abstractmethod
    def _create_engine(self) -> AsyncEngine:
        """Build the async engine, with the dialect's connection set-up attached.

        The engine must honour the ``conveyor_write`` execution option: a write
        transaction must be able to proceed to commit without a lock upgrade
        failing (SQLite: ``BEGIN IMMEDIATE``).
        """

    @abc.abstractmethod
    def _db_now(self) -> ColumnElement[int]:
        """The clock as a SQL expression in integer microseconds since the epoch."""

    @abc.abstractmethod
    def _lock_candidates(self, stmt: Select[Any]) -> Select[Any]:
        """Make a candidate-selection statement safe against concurrent claimers."""

    @abc.abstractmethod
    def _lock_rows(self, stmt: Select[Any]) -> Select[Any]:
        """Make a read lock the rows it returns until commit, waiting for holders."""

    @abc.abstractmethod
    async def _lock_for_backfill(self, conn: AsyncConnection) -> None:
        """Wait out producers in flight so a new group's backfill misses none of them."""

    @abc.abstractmethod
    def _lock_for_migration(self, conn: Connection) -> None:
        """Serialise migrations of several processes opening the store at once."""

    @abc.abstractmethod
    def _is_transient(self, exc: DBAPIError) -> bool:
        """True for driver errors that a retry of the whole transaction can cure."""

    @abc.abstractmethod
    def _maintenance_lock(self) -> AbstractAsyncContextManager[bool]:
        """Yield whether this caller should run maintenance (others may be at it)."""

    def _upsert(self, table: Any) -> Any:
        """An INSERT that supports ``on_conflict_do_*`` (both dialects spell it alike)."""
        raise NotImplementedError

    async def _start_wake(self) -> None:  # noqa: B027
        """Start the cross-process wake channel, if the backend has one."""

    async def _stop_wake(self) -> None:  # noqa: B027
        """Stop the cross-process wake channel."""

    async def _notify(  # noqa: B027
        self,
        conn: AsyncConnection,
        queues: Iterable[str],
        done: bool,
        task_ids: Iterable[str] = (),
    ) -> None:
        """Announce, inside the committing transaction, new work in ``queues``
        (``done=False``) or tasks that became terminal (``done=True``: ``task_ids``,
        or an empty ``task_ids`` when the caller does not know which — waiters
        then look again). Listeners must hear it only if the transaction commits.
        Whatever arrives from other processes is handed to :meth:`_wake`."""

    # ------------------------------------------------------------- lifecycle
    async def open(self) -> None:
        """Connect, apply pending migrations (unless ``migrate=False``), check the
        protocol version. Called for you by ``async with`` or the first call."""
        if self._engine is not None:
            return
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._engine is not None:
                return
            engine = self._create_engine()
            try:
                async with engine.connect() as conn:
                    conn = await conn.execution_options(conveyor_write=True)
                    await conn.run_sync(self._migrate_and_check)
            except ConveyorError:
                await engine.dispose()
                raise
            except (DBAPIError, OSError) as exc:
                await engine.dispose()
                raise StoreUnavailable(
                    f"cannot open {self._safe_url()}: {exc}. Check that the database "
                    "is running and the URL is right."
                ) from exc
            self._work_waker = _Waker(remember=True)
            self._done_waker = _Waker()
            self._engine = engine
            await self._start_wake()

    async def close(self) -> None:
        """Release every connection. The store can be opened again afterwards."""
        engine, self._engine = self._engine, None
        if engine is not None:
            await self._stop_wake()
            await engine.dispose()

    async def __aenter__(self) -> TaskStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _safe_url(self) -> str:
        from sqlalchemy.engine import make_url

        return make_url(self.url).render_as_string(hide_password=True)

    def _migrate_and_check(self, conn: Connection) -> None:
        with conn.begin():
            self._lock_for_migration(conn)
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
            if self.migrate and set(current) != set(script.get_heads()):
                cfg = Config()
                cfg.set_main_option("script_location", SCRIPT_LOCATION)
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
            elif not current:
                raise ConfigurationError(
                    "the database has no conveyor schema: run `conveyor migrate` or open "
                    "the store with migrate=True"
                )
            version = conn.execute(
                select(meta.c.value).where(meta.c.key == "protocol_version")
            ).scalar_one_or_none()
        if version is None or int(version) != PROTOCOL_VERSION:
            raise ProtocolVersionMismatch(
                f"the database speaks protocol {version}, this conveyor speaks "
                f"{PROTOCOL_VERSION}: use a matching conveyor version"
            )

    # ---------------------------------------------------------- transactions
    def _now(self) -> ColumnElement[int]:
        now = self._db_now()
        if self.clock_offset:
            return now + round(self.clock_offset * v.US)
        return now

    async def _run(
        self, work: Callable[[AsyncConnection], Awaitable[T]], *, write: bool = True
    ) -> T:
        """Run ``work`` in one transaction, retrying transient failures with backoff."""
        if self._engine is None:
            await self.open()
        assert self._engine is not None
        delay = 0.01
        for attempt in range(TRANSIENT_RETRIES + 1):
            try:
                async with self._engine.connect() as conn:
                    conn = await conn.execution_options(conveyor_write=write)
                    async with conn.begin():
                        return await work(conn)
            except DBAPIError as exc:
                if self._is_transient(exc) and attempt < TRANSIENT_RETRIES:
                    log.debug("transient database error, retrying: %s", exc.orig)
                    await asyncio.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, 1.0)
                    continue
                if isinstance(exc, OperationalError) or exc.connection_invalidated:
                    raise StoreUnavailable(f"database error: {exc.orig}") from exc
                raise
        raise AssertionError("unreachable")

    async def _current_now_us(self, conn: AsyncConnection) -> int:
        return int((await conn.execute(select(self._now()))).scalar_one())

    # ------------------------------------------------------------ producer
    def _prepare(self, req: Mapping[str, Any]) -> _Request:
        unknown = set(req) - SUBMIT_FIELDS
        if unknown:
            raise InvalidArgument(sorted(unknown)[0], "is not an argument of submit()")
        if "name" not in req:
            raise InvalidArgument("name", "is required")
        name = v.name("name", req["name"])
        queue = v.name("queue", req.get("queue", "default"))
        payload = v.to_json("payload", req.get("payload"))
        priority = v.integer("priority", req.get("priority", 0))
        delay, run_at = req.get("delay"), req.get("run_at")
        if delay is not None and run_at is not None:
            raise InvalidArgument("delay", "give delay or run_at, not both")
        delay_us = None if delay is None else round(v.duration_seconds("delay", delay) * v.US)
        run_at_us = None if run_at is None else v.to_us(v.aware("run_at", run_at))
        max_attempts = req.get("max_attempts")
        if max_attempts is not None:
            max_attempts = v.positive_int("max_attempts", max_attempts)
        backoff = v.backoff("backoff", req.get("backoff"))
        key = v.opt_name("key", req.get("key"))
        conflict = req.get("conflict", "reuse")
        if conflict not in CONFLICTS:
            raise InvalidArgument(
                "conflict", f"must be one of {', '.join(CONFLICTS)}, got {conflict!r}"
            )
        partition = v.opt_name("partition", req.get("partition"))
        parent = req.get("parent")
        if isinstance(parent, Task):
            parent = parent.id
        parent_id = v.opt_name("parent", parent)
        correlation_id = v.opt_name("correlation_id", req.get("correlation_id"))
        return _Request(
            id=v.new_task_id(),
            name=name,
            payload=payload,
            queue=queue,
            priority=priority,
            delay_us=delay_us,
            run_at_us=run_at_us,
            max_attempts=max_attempts,
            backoff=None if backoff is None else json.dumps(backoff.as_dict()),
            key=key,
            conflict=conflict,
            partition=partition,
            parent_id=parent_id,
            correlation_id=correlation_id,
            metadata=v.metadata(req.get("metadata")),
        )

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
    ) -> Task:
        """Insert one task and return it (queue-mode view).

        With ``key``, an existing task under that key is returned unchanged
        (``conflict="reuse"``), refused with :class:`AlreadyExists` (``"reject"``),
        or cancelled and replaced (``"replace"``).
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
        return (await self.submit_many([request]))[0]

    async def submit_many(self, requests: Iterable[Mapping[str, Any]]) -> builtins.list[Task]:
        """Insert many tasks in one transaction; returns them in request order.

        Each request is a mapping with :meth:`submit`'s argument names. One bad
        request rejects the whole batch before anything is written.
        """
        if isinstance(requests, Mapping):
            raise InvalidArgument("requests", "must be a list of request dicts, not one dict")
        prepared = []
        for i, req in enumerate(requests):
            if not isinstance(req, Mapping):
                raise InvalidArgument(f"requests[{i}]", "must be a dict of submit() arguments")
            prepared.append(self._prepare(req))
        if not prepared:
            return []
        tasks = await self._run(lambda conn: self._submit_tx(conn, prepared))
        self._wake_local(work=True)
        return tasks

    async def _submit_tx(self, conn: AsyncConnection, reqs: list[_Request]) -> builtins.list[Task]:
        # 1. Idempotency keys: claim each key first. A concurrent submit of the same
        #    key waits on the row and then sees it, so one key makes one task.
        chosen: dict[str, str] = {}  # key -> id of the task that answers it
        new: list[_Request] = []
        replaced: list[str] = []
        keyed = [r for r in reqs if r.key is not None]
        if keyed:
            first: dict[str, _Request] = {}
            for r in keyed:
                first.setdefault(r.key, r)  # type: ignore[arg-type]
            ins = (
                self._upsert(k)
                .values([{"key": key, "task_id": r.id} for key, r in first.items()])
                .on_conflict_do_nothing(index_elements=["key"])
                .returning(k.c.key)
            )
            won = set((await conn.execute(ins)).scalars())
            lost = [key for key in first if key not in won]
            existing: dict[str, str] = {}
            if lost:
                rows = await conn.execute(select(k.c.key, k.c.task_id).where(k.c.key.in_(lost)))
                existing = {row.key: row.task_id for row in rows}
            for key, r in first.items():
                if key in won:
                    chosen[key] = r.id
                elif r.conflict == "reject":
                    raise AlreadyExists(key, existing[key])
                elif r.conflict == "reuse":
                    chosen[key] = existing[key]
                else:
                    replaced.append(existing[key])
                    chosen[key] = r.id
                    await conn.execute(update(k).where(k.c.key == key).values(task_id=r.id))
        for r in reqs:
            if r.key is None or (chosen[r.key] == r.id):
                new.append(r)
        if replaced:
            await self._cancel_tx(conn, replaced)

        found: dict[str, Task] = {}
        if new:
            found.update(await self._insert_tasks(conn, new))
        ids = [r.id if r.key is None else chosen[r.key] for r in reqs]
        reused = [i for i in ids if i not in found]
        if reused:
            found.update(await self._fetch_tasks(conn, q.QUEUE_MODE, ids=reused))
        if new:
            await self._notify(conn, {r.queue for r in new}, done=False)
        return [found[i] for i in ids]

    async def _insert_tasks(
        self, conn: AsyncConnection, reqs: builtins.list[_Request]
    ) -> dict[str, Task]:
        """Insert the task rows and their delivery rows; the new tasks by id."""
        parents: dict[str, str] = {}
        parent_ids = sorted({r.parent_id for r in reqs if r.parent_id is not None})
        if parent_ids:
            rows = await conn.execute(select(t.c.id, t.c.root_id).where(t.c.id.in_(parent_ids)))
            parents = {row.id: row.root_id for row in rows}
            missing = [p for p in parent_ids if p not in parents and p not in {r.id for r in reqs}]
            if missing:
                raise InvalidArgument("parent", f"no task has id {missing[0]!r}")
        for r in reqs:  # a parent submitted in the same batch
            if r.parent_id is not None and r.parent_id not in parents:
                parents[r.parent_id] = r.parent_id
        # Producers of one stream serialise on its queue-mode stream row, so within a
        # stream the sequence order is the commit order (a consumer can never see a
        # later task of the stream before an earlier one commits).
        stream_keys = sorted({(r.queue, r.partition) for r in reqs if r.partition is not None})
        if stream_keys:
            lock = self._upsert(s).values(
                [{"queue": qn, "grp": q.QUEUE_MODE, "partition": p} for qn, p in stream_keys]
            )
            # Updates nothing, but Postgres still locks the conflicting row.
            lock = lock.on_conflict_do_update(
                index_elements=["queue", "grp", "partition"],
                set_={"head_seq": lock.excluded.head_seq},
                where=false(),
            )
            await conn.execute(lock)
        context = builtins.list(
            await conn.execute(q.submit_context(sorted({r.queue for r in reqs}), self._now()))
        )
        now = int(context[0].now)
        settings = {row.queue: row for row in context if row.queue is not None}
        params: builtins.list[dict[str, Any]] = []
        for r in reqs:
            root = r.id if r.parent_id is None else parents.get(r.parent_id, r.parent_id)
            conf = settings.get(r.queue)
            max_attempts = r.max_attempts or (conf.max_attempts if conf is not None else None)
            params.append(
                {
                    "id": r.id,
                    "name": r.name,
                    "queue": r.queue,
                    "partition": r.partition,
                    "payload": r.payload,
                    "metadata": r.metadata,
                    "priority": r.priority,
                    "max_attempts": max_attempts or DEFAULT_MAX_ATTEMPTS,
                    "backoff": r.backoff or (conf.backoff if conf is not None else None),
                    "created_at": now,
                    "run_at": r.run_at_us if r.run_at_us is not None else now + (r.delay_us or 0),
                    "key": r.key,
                    "parent_id": r.parent_id,
                    "root_id": root,
                    "correlation_id": r.correlation_id,
                }
            )
        # One multi-row INSERT of plain values.
        result = await conn.execute(t.insert().returning(t.c.seq), params)
        seqs = builtins.list(result.scalars())
        out: dict[str, Task] = {}
        for r, row in zip(reqs, params, strict=True):
            out[r.id] = Task(
                id=r.id,
                name=r.name,
                queue=r.queue,
                partition=r.partition,
                payload=json.loads(r.payload),
                metadata=json.loads(r.metadata),
                priority=r.priority,
                status=Status.QUEUED,
                attempt=0,
                max_attempts=row["max_attempts"],
                run_at=v.from_us(row["run_at"]),
                created_at=v.from_us(now),
                started_at=None,
                finished_at=None,
                lease_expires_at=None,
                worker_id=None,
                progress=None,
                progress_message=None,
                result=None,
                error=None,
                key=r.key,
                parent_id=r.parent_id,
                root_id=row["root_id"],
                correlation_id=r.correlation_id,
            )
        await conn.execute(q.fan_out(seqs))
        if stream_keys:
            touched = await conn.execute(
                select(d.c.queue, d.c.grp, d.c.partition)
                .where(d.c.task_seq.in_(seqs), d.c.partition.is_not(None))
                .distinct()
            )
            await self._refresh_streams(conn, [tuple(row) for row in touched])
        return out

    async def get(self, task_id: str, *, group: str | None = None) -> Task | None:
        """The task as queue mode (or ``group``) sees it; ``None`` if unknown."""
        grp = _group_key(group)
        task_id = v.name("task_id", task_id)
        found = await self._run(
            lambda conn: self._fetch_tasks(conn, grp, ids=[task_id]), write=False
        )
        return found.get(task_id)

    async def get_by_key(self, key: str) -> Task | None:
        """The task currently holding idempotency key ``key``, or ``None``."""
        key = v.name("key", key)

        async def work(conn: AsyncConnection) -> Task | None:
            task_id = (await conn.execute(select(k.c.task_id).where(k.c.key == key))).scalar()
            if task_id is None:
                return None
            return (await self._fetch_tasks(conn, q.QUEUE_MODE, ids=[task_id])).get(task_id)

        return await self._run(work, write=False)

    async def _fetch_tasks(
        self,
        conn: AsyncConnection,
        grp: str,
        *,
        ids: Sequence[str] | None = None,
        seqs: Sequence[int] | None = None,
    ) -> dict[Any, Task]:
        stmt = q.task_view(grp)
        if ids is not None:
            wanted = sorted(set(ids))
            # The delivery side by its primary key too: the plan must not depend on
            # the planner's row estimates (a fresh table has none).
            stmt = stmt.where(
                t.c.id.in_(wanted), d.c.task_seq.in_(select(t.c.seq).where(t.c.id.in_(wanted)))
            )
            keyf = "id"
        else:
            assert seqs is not None
            # Both sides, so the planner can drive the join from either primary key.
            stmt = stmt.where(t.c.seq.in_(seqs), d.c.task_seq.in_(seqs))
            keyf = "seq"
        rows = await conn.execute(stmt)
        return {row._mapping[keyf]: _row_to_task(row) for row in rows}

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
    ) -> Page:
        """A page of tasks in submit order, filtered; keyset-paginated by ``cursor``.

        Pages stay stable while tasks are inserted, and a deep page costs what the
        first one does.
        """
        grp = _group_key(group)
        limit = v.positive_int("limit", limit)
        if limit > MAX_LIMIT:
            raise InvalidArgument("limit", f"must be at most {MAX_LIMIT}, got {limit}")
        stmt = q.task_view(grp)
        if status is not None:
            try:
                stmt = stmt.where(d.c.status == Status(status).value)
            except ValueError:
                raise InvalidArgument(
                    "status", f"must be one of {', '.join(s.value for s in Status)}"
                ) from None
        for field, column, value in (
            ("queue", t.c.queue, queue),
            ("name", t.c.name, name),
            ("partition", t.c.partition, partition),
            ("root_id", t.c.root_id, root_id),
            ("correlation_id", t.c.correlation_id, correlation_id),
        ):
            if value is not None:
                stmt = stmt.where(column == v.name(field, value))
        if queue is not None:
            stmt = stmt.where(d.c.queue == queue)  # lets the status index serve the filter
        if cursor is not None:
            stmt = stmt.where(t.c.seq > _decode_cursor(cursor))
        stmt = stmt.order_by(t.c.seq).limit(limit + 1)

        async def work(conn: AsyncConnection) -> list[Any]:
            return builtins.list(await conn.execute(stmt))

        rows = await self._run(work, write=False)
        more = len(rows) > limit
        rows = rows[:limit]
        items = [_row_to_task(row) for row in rows]
        return Page(items=items, next_cursor=_encode_cursor(rows[-1].seq) if more else None)

    async def cancel(self, task_id: str) -> Task | None:
        """Withdraw a task for queue mode and every group.

        queued -> cancelled; running -> cancelled (the holder's next write raises
        :class:`TaskCancelled`); terminal: unchanged. ``None`` if no such task.
        """
        task_id = v.name("task_id", task_id)

        async def work(conn: AsyncConnection) -> Task | None:
            await self._cancel_tx(conn, [task_id])
            return (await self._fetch_tasks(conn, q.QUEUE_MODE, ids=[task_id])).get(task_id)

        task = await self._run(work)
        self._wake_local(work=False)
        return task

    async def cancel_by_key(self, key: str) -> Task | None:
        """:meth:`cancel` the task holding ``key``; ``None`` if no task has it."""
        task = await self.get_by_key(key)
        return None if task is None else await self.cancel(task.id)

    async def _cancel_tx(self, conn: AsyncConnection, task_ids: Sequence[str]) -> None:
        now = self._now()
        rows = await conn.execute(
            update(d)
            .where(
                d.c.task_seq.in_(select(t.c.seq).where(t.c.id.in_(task_ids))),
                d.c.status.in_(q.ACTIVE),
            )
            .values(status="cancelled", finished_at=now, lease_expires_at=None)
            .returning(d.c.queue, d.c.grp, d.c.partition)
        )
        changed = builtins.list(rows)
        await self._refresh_streams(conn, [tuple(r) for r in changed if r.partition is not None])
        if changed:
            await self._notify(conn, {r.queue for r in changed}, done=True, task_ids=task_ids)

    async def retry(
        self, task_id: str, *, reset_attempts: bool = False, group: str | None = None
    ) -> Task | None:
        """Put a failed, cancelled or evicted task back in the queue (for queue mode
        or ``group``). It runs at least once more. ``reset_attempts`` grants a fresh
        budget of the task's ``max_attempts`` from here (``max_attempts`` grows;
        attempt numbers keep counting, so ``attempt=`` fencing stays sound). Other
        statuses are left unchanged. ``None`` if unknown.
        """
        grp = _group_key(group)
        task_id = v.name("task_id", task_id)

        async def work(conn: AsyncConnection) -> Task | None:
            now = self._now()
            values: dict[str, Any] = {
                "status": q.QUEUED,
                "run_at": now,
                "finished_at": None,
                "lease_expires_at": None,
                "worker_id": None,
            }
            if reset_attempts:
                # A fresh budget of the task's max_attempts, counted on from the current
                # attempt: attempt numbers never repeat, so the fence of a stale run can
                # never match a newer one.
                budget = select(t.c.max_attempts).where(t.c.seq == d.c.task_seq)
                values["max_attempts"] = d.c.attempt + budget.scalar_subquery()
            retryable = (
                d.c.task_seq == q.task_seq_of(task_id),
                d.c.grp == grp,
                d.c.status.in_(("failed", "cancelled", "evicted")),
            )
            # A finished row already rolled up into the counts leaves them again.
            before = (
                await conn.execute(
                    self._lock_rows(select(d.c.queue, d.c.status, d.c.rolled).where(*retryable))
                )
            ).first()
            if before is not None and before.rolled:
                await self._add_counts(conn, {(before.queue, grp, before.status): -1})
            rows = builtins.list(
                await conn.execute(
                    update(d)
                    .where(*retryable)
                    .values(rolled=0, **values)
                    .returning(d.c.queue, d.c.grp, d.c.partition)
                )
            )
            await self._refresh_streams(conn, [tuple(r) for r in rows if r.partition is not None])
            if rows:
                await self._notify(conn, {rows[0].queue}, done=False)
            return (await self._fetch_tasks(conn, grp, ids=[task_id])).get(task_id)

        task = await self._run(work)
        self._wake_local(work=True)
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
        if self._done_waker is None:
            await self.open()
        assert self._done_waker is not None
        # Watch before looking: a completion that commits while get() runs still
        # wakes the nap that follows. Polling (capped at POLL_CAP) covers
        # completions nobody announces to this process.
        with self._done_waker.watch([task_id]) as watch:
            while True:
                watch.event.clear()
                task = await self.get(task_id, group=group)
                if task is None:
                    raise NotFound(f"task {task_id}")
                if task.terminal:
                    return task
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"task {task_id} still {task.status} after {limit} s")
                nap = min(pause, POLL_CAP) if remaining is None else min(pause, POLL_CAP, remaining)
                await watch.wait(nap)
                pause = min(pause * 2, POLL_CAP)

    # ------------------------------------------------------------ consumer
    async def claim(
        self,
        queues: str | Sequence[str],
        *,
        worker_id: str,
        lease: v.Duration | None = None,
        limit: int = 1,
        group: str | None = None,
        partition: str | None = None,
    ) -> builtins.list[Task]:
        """Lease up to ``limit`` claimable tasks, after recovering expired leases.

        Unpartitioned tasks come in claim order (priority, then run_at, then
        submit order). Partitioned tasks come from one stream per claim, in submit
        order, only while no earlier task of the stream is leased or waiting.
        """
        names = v.names("queues", queues)
        worker_id = v.name("worker_id", worker_id)
        lease_s = None if lease is None else v.duration_seconds("lease", lease, allow_zero=False)
        limit = v.positive_int("limit", limit)
        if limit > MAX_LIMIT:
            raise InvalidArgument("limit", f"must be at most {MAX_LIMIT}, got {limit}")
        partition = v.opt_name("partition", partition)
        grp = _group_key(group)
        if group is not None:
            for queue in names:
                if (queue, group) not in self._known_groups:
                    await self.subscribe(queue, group, start="all", _if_missing=True)
        # The probe spares idle claimers the write lock; right after a claim that found
        # work, the next one most likely finds work too, so it goes straight in.
        busy_key = (grp, tuple(names), partition)
        if (
            self.probe_before_claim
            and busy_key not in self._busy
            and not await self._run(
                lambda conn: self._probe(conn, grp, names, partition), write=False
            )
        ):
            return []
        claimed = await self._run(
            lambda conn: self._claim_tx(conn, grp, names, worker_id, lease_s, limit, partition)
        )
        if claimed:
            self._busy.add(busy_key)
        else:
            self._busy.discard(busy_key)
        return claimed

    async def _probe(
        self, conn: AsyncConnection, grp: str, names: Sequence[str], partition: str | None
    ) -> bool:
        """Cheap read: could a claim find anything (ready work or expired leases)?"""
        now = self._now()
        checks = [q.ready_streams(grp, names, now, partition).exists()]
        if partition is None:
            checks.append(q.ready_plain(grp, names, now).limit(1).exists())
        checks.append(select(d.c.task_seq).where(*q.expired(now, grp, names)).exists())
        row = (await conn.execute(select(*checks))).one()
        return any(row)

    async def _claim_tx(
        self,
        conn: AsyncConnection,
        grp: str,
        names: Sequence[str],
        worker_id: str,
        lease: float | None,
        limit: int,
        partition: str | None,
    ) -> builtins.list[Task]:
        await self._recover_tx(conn, grp, names)
        now = self._now()
        stream = (
            await conn.execute(self._lock_candidates(q.ready_streams(grp, names, now, partition)))
        ).first()
        if stream is None and partition is not None:
            return []
        use_stream = stream is not None
        if stream is not None and partition is None:
            # Streams and unpartitioned work compete: priority, then who waited longest.
            plain = (await conn.execute(q.ready_plain(grp, names, now).limit(1))).first()
            use_stream = plain is None or (stream.priority, -stream.available_at) > (
                plain.priority,
                -plain.run_at,
            )
        if use_stream:
            assert stream is not None
            rows = await conn.execute(
                q.stream_rows(stream.queue, grp, stream.partition, limit, self._now())
            )
            seqs = []
            for row in rows:
                if row.status != q.QUEUED or not row.due:
                    break
                seqs.append(row.task_seq)
            if not seqs:
                return []
            taken = await self._take(conn, grp, seqs, worker_id, lease, [stream.queue])
            await self._refresh_streams(conn, [(stream.queue, grp, stream.partition)])
            return [task for _, task in sorted(taken, key=lambda pair: pair[0])]
        # A CTE, not an IN-subquery: Postgres may rescan a subquery once per outer
        # row, and each rescan with SKIP LOCKED would pick further rows past LIMIT.
        pick = self._lock_candidates(q.ready_plain(grp, names, now).limit(limit)).cte("pick")
        taken = await self._take(
            conn, grp, select(pick.c.task_seq).scalar_subquery(), worker_id, lease, names
        )
        taken.sort(key=lambda pair: (-pair[1].priority, pair[1].run_at, pair[0]))
        return [task for _, task in taken]

    async def _take(
        self,
        conn: AsyncConnection,
        grp: str,
        seqs: Any,
        worker_id: str,
        lease: float | None,
        queues: Sequence[str],
    ) -> builtins.list[tuple[int, Task]]:
        """Lease the rows and return ``(seq, task)`` pairs, in one statement where the
        backend's RETURNING can read the joined task row."""
        stmt = q.take(
            grp,
            seqs,
            self._now(),
            worker_id=worker_id,
            lease=lease,
            joined=self.returning_joins,
            queues=queues,
        )
        result = await conn.execute(stmt)
        if self.returning_joins:
            return [(row.seq, _row_to_task(row)) for row in result]
        taken = builtins.list(result.scalars())
        found = await self._fetch_tasks(conn, grp, seqs=taken)
        return builtins.list(found.items())

    async def _recover_tx(
        self, conn: AsyncConnection, grp: str | None, names: Sequence[str] | None
    ) -> tuple[int, int]:
        envelope = json.dumps(
            {
                "type": "LeaseExpired",
                "code": "lease_expired",
                "message": "the lease expired on the last attempt",
                "retryable": False,
                "traceback": None,
            }
        )
        rows = builtins.list(
            await conn.execute(q.recover_expired(self._now(), grp, names, envelope))
        )
        requeued = [r for r in rows if r.status == q.QUEUED]
        failed = [r for r in rows if r.status != q.QUEUED]
        touched = [(r.queue, r.grp, r.partition) for r in rows if r.partition is not None]
        await self._refresh_streams(conn, touched)
        if failed:
            await self._notify(conn, {r.queue for r in failed}, done=True)
        if requeued:
            # Recovered by maintain() (or a claimer of other queues): idle workers
            # should hear of the work rather than wait for their next poll.
            await self._notify(conn, {r.queue for r in requeued}, done=False)
        return len(requeued), len(failed)

    async def _refresh_streams(
        self, conn: AsyncConnection, keys: Iterable[tuple[Any, ...]]
    ) -> None:
        """Recompute head and availability of each (queue, group, partition) stream.

        A stream is available when its first active task is queued and due and no
        task of it is leased. ``available_at`` records when the current head became
        available, which is what fair stream selection orders by.
        """
        for queue, grp, partition in sorted(set(keys)):
            # Lock the stream row before reading its head: a transition committed by
            # another transaction while we wait is then visible to the reads below,
            # so nobody writes back a head computed from a stale view.
            locked = self._lock_rows(q.stream_state(queue, grp, partition))
            state = (await conn.execute(locked)).first()
            if state is None:
                await conn.execute(
                    self._upsert(s)
                    .values(queue=queue, grp=grp, partition=partition)
                    .on_conflict_do_nothing(index_elements=["queue", "grp", "partition"])
                )
                state = (await conn.execute(locked)).first()
            head = (await conn.execute(q.stream_head(queue, grp, partition, self._now()))).first()
            available: int | None = None
            head_seq = None if head is None else head.task_seq
            priority = None if head is None else head.priority
            if head is not None and head.status == q.QUEUED:
                held = (await conn.execute(q.stream_running(queue, grp, partition))).scalar()
                if not held:
                    if state is not None and state.head_seq == head_seq and state.available_at:
                        available = max(state.available_at, head.run_at)
                    else:
                        available = max(head.now, head.run_at)
            if state is None or (state.head_seq, state.available_at) != (head_seq, available):
                await conn.execute(
                    update(s)
                    .where(s.c.queue == queue, s.c.grp == grp, s.c.partition == partition)
                    .values(head_seq=head_seq, priority=priority, available_at=available)
                )

    async def heartbeat(
        self,
        task_id: str,
        *,
        worker_id: str,
        lease: v.Duration | None = None,
        group: str | None = None,
        attempt: int | None = None,
    ) -> Task:
        """Extend the lease by ``lease`` seconds (default: the length it was claimed with)."""
        lease_s = None if lease is None else v.duration_seconds("lease", lease, allow_zero=False)

        def values(now: ColumnElement[int]) -> dict[str, Any]:
            length: Any = d.c.lease if lease_s is None else lease_s
            return {
                "lease_expires_at": now + q.seconds_to_us(length),
                **({"lease": lease_s} if lease_s is not None else {}),
            }

        return await self._owned_write(task_id, worker_id, group, attempt, values)

    async def progress(
        self,
        task_id: str,
        *,
        worker_id: str,
        progress: float | None = None,
        message: str | None = None,
        group: str | None = None,
        attempt: int | None = None,
    ) -> Task:
        """Record progress (a fraction in [0, 1]) and/or a message for a leased task."""
        if progress is not None:
            if (
                isinstance(progress, bool)
                or not isinstance(progress, int | float)
                or not (0.0 <= float(progress) <= 1.0)
            ):
                raise InvalidArgument("progress", f"must be a number in [0, 1], got {progress!r}")
        if message is not None:
            message = v.text("message", message)

        def values(now: ColumnElement[int]) -> dict[str, Any]:
            out: dict[str, Any] = {}
            if progress is not None:
                out["progress"] = float(progress)
            if message is not None:
                out["progress_message"] = message
            return out or {"worker_id": d.c.worker_id}

        return await self._owned_write(task_id, worker_id, group, attempt, values)

    async def succeed(
        self,
        task_id: str,
        *,
        worker_id: str,
        result: Any = None,
        group: str | None = None,
        attempt: int | None = None,
    ) -> Task:
        """Finish a leased task as ``succeeded`` with ``result`` (JSON)."""
        encoded = v.to_json("result", result)

        def values(now: ColumnElement[int]) -> dict[str, Any]:
            return {
                "status": "succeeded",
                "result": encoded,
                "finished_at": now,
                "lease_expires_at": None,
            }

        task = await self._owned_write(task_id, worker_id, group, attempt, values, done=True)
        return task

    async def fail(
        self,
        task_id: str,
        *,
        worker_id: str,
        error: BaseException | str | dict[str, Any],
        retryable: bool = True,
        delay: v.Duration | None = None,
        group: str | None = None,
        attempt: int | None = None,
    ) -> Task:
        """Record a failed attempt. With ``retryable`` and attempts left the task is
        queued again after ``delay`` (default: its backoff); otherwise ``failed``."""
        envelope = v.error_envelope(error, retryable=bool(retryable))
        encoded = v.to_json("error", envelope)
        delay_s = None if delay is None else v.duration_seconds("delay", delay)
        grp = _group_key(group)
        worker_id = v.name("worker_id", worker_id)
        task_id = v.name("task_id", task_id)

        async def work(conn: AsyncConnection) -> tuple[Task, bool]:
            row = (
                await conn.execute(
                    select(d.c.attempt, d.c.max_attempts, t.c.backoff, t.c.queue)
                    .select_from(d.join(t, t.c.seq == d.c.task_seq))
                    .where(*q.owned(task_id, grp, worker_id, attempt))
                )
            ).first()
            if row is None:
                await self._explain_lost(conn, task_id, grp)
            assert row is not None
            again = bool(retryable) and row.attempt < row.max_attempts
            now = self._now()
            if again:
                if delay_s is None:
                    spec = (
                        json.loads(row.backoff)
                        if row.backoff
                        else await self._queue_backoff(conn, row.queue)
                    )
                    wait_s = v.backoff_delay(spec, row.attempt)
                else:
                    wait_s = delay_s
                values: dict[str, Any] = {
                    "status": q.QUEUED,
                    "error": encoded,
                    "lease_expires_at": None,
                    "worker_id": None,
                    "run_at": now + q.seconds_to_us(wait_s),
                }
            else:
                values = {
                    "status": "failed",
                    "error": encoded,
                    "lease_expires_at": None,
                    "finished_at": now,
                }
            task = await self._owned_update(
                conn, task_id, grp, worker_id, attempt, values, done=not again
            )
            return task, again

        task, again = await self._run(work)
        self._wake_local(work=again)
        return task

    async def release(
        self,
        task_id: str,
        *,
        worker_id: str,
        group: str | None = None,
        attempt: int | None = None,
    ) -> Task:
        """Hand a leased task back unfinished: ``queued`` and claimable at once.

        The attempt is given back too (it did not run to an outcome), so a worker
        shutting down costs the task nothing. Ownership-checked like
        :meth:`heartbeat`; raises :class:`LostLease` if the lease is gone.
        """

        def values(now: ColumnElement[int]) -> dict[str, Any]:
            return {
                "status": q.QUEUED,
                # now, not the old run_at: eviction (max_wait) counts from run_at
                # for tasks whose attempt is back at 0.
                "run_at": now,
                "attempt": d.c.attempt - 1,
                "lease_expires_at": None,
                "worker_id": None,
                "progress": None,
                "progress_message": None,
            }

        task = await self._owned_write(task_id, worker_id, group, attempt, values)
        self._wake_local(work=True)
        return task

    async def _queue_backoff(self, conn: AsyncConnection, queue: str) -> dict[str, float] | None:
        raw = (await conn.execute(select(qs.c.backoff).where(qs.c.queue == queue))).scalar()
        return None if raw is None else dict(json.loads(raw))

    async def _owned_write(
        self,
        task_id: str,
        worker_id: str,
        group: str | None,
        attempt: int | None,
        values: Callable[[ColumnElement[int]], dict[str, Any]],
        *,
        done: bool = False,
    ) -> Task:
        grp = _group_key(group)
        task_id = v.name("task_id", task_id)
        worker_id = v.name("worker_id", worker_id)
        if attempt is not None:
            attempt = v.positive_int("attempt", attempt)

        async def work(conn: AsyncConnection) -> Task:
            return await self._owned_update(
                conn, task_id, grp, worker_id, attempt, values(self._now()), done=done
            )

        task = await self._run(work)
        if done:
            self._wake_local(work=False)
        return task

    async def _owned_update(
        self,
        conn: AsyncConnection,
        task_id: str,
        grp: str,
        worker_id: str,
        attempt: int | None,
        values: dict[str, Any],
        *,
        done: bool,
        notify: bool = True,
    ) -> Task:
        stmt = update(d).where(*q.owned(task_id, grp, worker_id, attempt)).values(**values)
        if self.returning_joins:
            stmt = stmt.where(t.c.seq == d.c.task_seq).returning(*q.view_columns())
        else:
            stmt = stmt.returning(d.c.queue, d.c.grp, d.c.partition)
        row = (await conn.execute(stmt)).first()
        if row is None:
            await self._explain_lost(conn, task_id, grp)
        assert row is not None
        if row.partition is not None and "status" in values:
            await self._refresh_streams(conn, [(row.queue, grp, row.partition)])
        if notify:
            if done:
                await self._notify(conn, {row.queue}, done=True, task_ids=[task_id])
            if (done and row.partition is not None) or values.get("status") == q.QUEUED:
                # New work: a retry, or the stream's next task may be claimable now.
                await self._notify(conn, {row.queue}, done=False)
        if self.returning_joins:
            return _row_to_task(row)
        return (await self._fetch_tasks(conn, grp, ids=[task_id]))[task_id]

    async def succeed_many(
        self, items: Iterable[Mapping[str, Any]]
    ) -> builtins.list[Task | ConveyorError]:
        """Acknowledge many leased tasks in one transaction (the worker's fast path).

        Each item is a mapping with :meth:`succeed`'s arguments: ``task_id``,
        ``worker_id``, and optionally ``result``, ``group``, ``attempt``. Each is
        ownership-checked and fenced on its own; the outcome per item, in order,
        is the finished :class:`Task` or the error that item met
        (:class:`LostLease`, :class:`TaskCancelled`, :class:`NotFound`, or
        :class:`InvalidArgument` for a result that is not JSON) — one item's
        failure does not hold back the others.
        """
        outcomes: builtins.list[Task | ConveyorError | None] = []
        todo: builtins.list[tuple[int, str, str, str, int | None, str]] = []
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise InvalidArgument(f"items[{i}]", "must be a dict of succeed() arguments")
            unknown = set(item) - {"task_id", "worker_id", "result", "group", "attempt"}
            if unknown:
                raise InvalidArgument(sorted(unknown)[0], "is not an argument of succeed()")
            task_id = v.name("task_id", item.get("task_id"))
            worker_id = v.name("worker_id", item.get("worker_id"))
            grp = _group_key(item.get("group"))
            attempt = item.get("attempt")
            if attempt is not None:
                attempt = v.positive_int("attempt", attempt)
            try:
                encoded = v.to_json("result", item.get("result"))
            except InvalidArgument as exc:
                outcomes.append(exc)
                continue
            outcomes.append(None)
            todo.append((i, task_id, worker_id, grp, attempt, encoded))
        if not todo:
            return [o for o in outcomes if o is not None]

        async def work(conn: AsyncConnection) -> builtins.list[Task | ConveyorError]:
            out = builtins.list(outcomes)
            ids = sorted({item[1] for item in todo})
            seq_of = {
                row.id: row.seq
                for row in await conn.execute(select(t.c.id, t.c.seq).where(t.c.id.in_(ids)))
            }
            owners: dict[tuple[str, str], builtins.list[tuple[int, str, int | None, str]]] = {}
            for i, task_id, worker_id, grp, attempt, encoded in todo:
                owners.setdefault((worker_id, grp), []).append((i, task_id, attempt, encoded))
            finished: builtins.list[Task] = []
            streams: set[tuple[str, str, str]] = set()
            for (worker_id, grp), mine in owners.items():
                wanted = sorted({seq_of[m[1]] for m in mine if m[1] in seq_of})
                held = {}
                if wanted:
                    locked = self._lock_rows(q.leased_to(grp, worker_id))
                    held = {
                        row.task_seq: row for row in await conn.execute(locked, {"seqs": wanted})
                    }
                # The fence, per task: leased to this worker, on the attempt given.
                ok: dict[int, str] = {}
                for _i, task_id, attempt, encoded in mine:
                    row = held.get(seq_of.get(task_id, -1))
                    if row is not None and (attempt is None or row.attempt == attempt):
                        ok.setdefault(row.task_seq, encoded)
                if ok:
                    await conn.execute(
                        q.finish_row(grp, self._now()),
                        [{"b_seq": seq, "b_result": res} for seq, res in ok.items()],
                    )
                    for seq in ok:
                        if held[seq].partition is not None:
                            streams.add((held[seq].queue, grp, held[seq].partition))
                tasks_by_seq = await self._fetch_tasks(conn, grp, seqs=sorted(ok)) if ok else {}
                for i, task_id, _attempt, _encoded in mine:
                    found = tasks_by_seq.get(seq_of.get(task_id, -1))
                    if found is not None:
                        out[i] = found
                        finished.append(found)
                        continue
                    try:
                        await self._explain_lost(conn, task_id, grp)
                    except (LostLease, NotFound) as exc:
                        out[i] = exc
            await self._refresh_streams(conn, streams)
            if finished:
                queues = {task.queue for task in finished}
                await self._notify(conn, queues, done=True, task_ids=[x.id for x in finished])
                if streams:
                    await self._notify(conn, {key[0] for key in streams}, done=False)
            return [o for o in out if o is not None]

        result = await self._run(work)
        self._wake_local(work=any(isinstance(o, Task) and o.partition for o in result))
        return result

    async def _explain_lost(self, conn: AsyncConnection, task_id: str, grp: str) -> None:
        status = (
            await conn.execute(
                select(d.c.status).where(d.c.task_seq == q.task_seq_of(task_id), d.c.grp == grp)
            )
        ).scalar()
        if status is None:
            raise NotFound(f"task {task_id}" + (f" for group {grp!r}" if grp else ""))
        if status == "cancelled":
            raise TaskCancelled(task_id)
        raise LostLease(task_id)

    # ------------------------------------------------------------ bus mode
    async def subscribe(
        self,
        queue: str,
        group: str,
        *,
        start: Literal["all", "new"] | datetime = "all",
        _if_missing: bool = False,
    ) -> ConsumerGroup:
        """Register ``group`` on ``queue``: it receives every task from ``start`` on
        (``"all"``: the retained history; ``"new"``: tasks submitted after this call
        returns; a datetime: tasks created since then). Subscribing an active group
        again changes nothing and returns it; subscribing an unsubscribed one starts
        it over from ``start``. (A claim subscribes only a group never seen before.)"""
        queue = v.name("queue", queue)
        group = v.name("group", group)
        if isinstance(start, datetime):
            start_at: int | None = v.to_us(v.aware("start", start))
        elif start in ("all", "new"):
            start_at = None
        else:
            raise InvalidArgument("start", f'must be "all", "new" or a datetime, got {start!r}')

        async def register(conn: AsyncConnection) -> tuple[ConsumerGroup, bool]:
            row = (
                await conn.execute(select(g).where(g.c.queue == queue, g.c.name == group))
            ).first()
            if row is not None and (row.active or _if_missing):
                # An unsubscribed group stays so until subscribe() is called: a stray
                # worker's claim must not bring it back and replay the history.
                return self._group(row), False
            now = await self._current_now_us(conn)
            begin = now if start == "new" else start_at
            if row is None:
                await conn.execute(
                    g.insert().values(
                        queue=queue, name=group, start_at=begin, created_at=now, active=True
                    )
                )
            else:
                await conn.execute(
                    update(g)
                    .where(g.c.queue == queue, g.c.name == group)
                    .values(start_at=begin, created_at=now, active=True)
                )
            fresh = (
                await conn.execute(select(g).where(g.c.queue == queue, g.c.name == group))
            ).one()
            return self._group(fresh), True

        registered, created = await self._run(register)
        if created and start != "new":
            start_us = None if registered.start is None else v.to_us(registered.start)

            async def fill(conn: AsyncConnection) -> None:
                await self._lock_for_backfill(conn)
                await conn.execute(q.backfill(queue, group, start_us))
                parts = await conn.execute(
                    select(d.c.partition)
                    .where(
                        d.c.grp == group,
                        d.c.queue == queue,
                        d.c.partition.is_not(None),
                        d.c.status.in_(q.ACTIVE),
                    )
                    .distinct()
                )
                await self._refresh_streams(conn, [(queue, group, p) for p in parts.scalars()])

            await self._run(fill)
        self._known_groups.add((queue, group))
        return registered

    async def unsubscribe(self, queue: str, group: str) -> bool:
        """Deactivate ``group`` on ``queue`` and drop its delivery state.

        Returns whether the group was subscribed."""
        queue = v.name("queue", queue)
        group = v.name("group", group)

        async def work(conn: AsyncConnection) -> bool:
            result = await conn.execute(
                update(g)
                .where(g.c.queue == queue, g.c.name == group, g.c.active.is_(True))
                .values(active=False)
            )
            for stmt in q.delete_group(queue, group):
                await conn.execute(stmt)
            return bool(result.rowcount)

        self._known_groups.discard((queue, group))
        return await self._run(work)

    async def groups(self, queue: str | None = None) -> builtins.list[ConsumerGroup]:
        """Registered consumer groups (active and not), optionally of one queue."""
        stmt = select(g).order_by(g.c.queue, g.c.name)
        if queue is not None:
            stmt = stmt.where(g.c.queue == v.name("queue", queue))

        async def work(conn: AsyncConnection) -> builtins.list[ConsumerGroup]:
            return [self._group(row) for row in await conn.execute(stmt)]

        return await self._run(work, write=False)

    @staticmethod
    def _group(row: Any) -> ConsumerGroup:
        return ConsumerGroup(
            queue=row.queue,
            name=row.name,
            start=v.from_us(row.start_at),
            created_at=v.from_us(row.created_at),
            active=bool(row.active),
        )

    async def stats(self, queue: str | None = None) -> builtins.list[QueueStats]:
        """Per queue: counts by status (queue mode), age in seconds of the oldest
        claimable task, and per group its counts, lag (tasks not yet terminal for
        it) and oldest claimable age."""
        if queue is not None:
            queue = v.name("queue", queue)

        async def work(conn: AsyncConnection) -> builtins.list[QueueStats]:
            now = await self._current_now_us(conn)
            # Totals folded up by maintain(), plus the rows not folded yet (the active
            # ones and the recently finished), read from their partial index.
            live_q = (
                select(d.c.queue, d.c.grp, d.c.status, func.count())
                .where(*q.unrolled())
                .group_by(d.c.queue, d.c.grp, d.c.status)
            )
            rolled_q = select(cn.c.queue, cn.c.grp, cn.c.status, cn.c.n)
            oldest_q = (
                select(d.c.queue, d.c.grp, func.min(d.c.run_at))
                .where(*q.unrolled(), *q.claimable(now))
                .group_by(d.c.queue, d.c.grp)
            )
            if queue is not None:
                live_q = live_q.where(d.c.queue == queue)
                rolled_q = rolled_q.where(cn.c.queue == queue)
                oldest_q = oldest_q.where(d.c.queue == queue)
            counts: dict[tuple[str, str], dict[str, int]] = {}
            for stmt in (live_q, rolled_q):
                for qn, grp, status, n in await conn.execute(stmt):
                    per = counts.setdefault((qn, grp), {st.value: 0 for st in Status})
                    per[status] += int(n)
            counts = {key: c for key, c in counts.items() if any(c.values()) or key[1]}
            oldest = {(qn, grp): (now - m) / v.US for qn, grp, m in await conn.execute(oldest_q)}
            group_rows = await conn.execute(
                select(g.c.queue, g.c.name).where(g.c.active.is_(True))
                if queue is None
                else select(g.c.queue, g.c.name).where(g.c.active.is_(True), g.c.queue == queue)
            )
            for qn, name in group_rows:
                counts.setdefault((qn, name), {st.value: 0 for st in Status})
            out: dict[str, QueueStats] = {}
            for qn, grp in sorted(counts):
                if qn not in out:
                    base = counts.get((qn, q.QUEUE_MODE), {st.value: 0 for st in Status})
                    out[qn] = QueueStats(
                        queue=qn, counts=base, oldest_claimable_age=oldest.get((qn, q.QUEUE_MODE))
                    )
                if grp:
                    c = counts[(qn, grp)]
                    out[qn].groups[grp] = GroupStats(
                        counts=c,
                        lag=c["queued"] + c["running"],
                        oldest_claimable_age=oldest.get((qn, grp)),
                    )
            return builtins.list(out.values())

        return await self._run(work, write=False)

    # ---------------------------------------------------- settings, upkeep
    async def configure_queue(
        self,
        queue: str,
        *,
        lease: v.Duration | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | dict[str, float] | v.Duration | None = None,
        retention: v.Duration | None = None,
        max_wait: v.Duration | None = None,
        queue_mode: bool | None = None,
    ) -> dict[str, Any]:
        """Store defaults for ``queue``; arguments left ``None`` keep their value.

        ``lease`` applies when a task is claimed; ``max_attempts`` and ``backoff``
        when it is submitted; ``max_wait`` evicts tasks never claimed that long
        after their run_at; ``retention`` deletes tasks that finished (for queue
        mode and every active group) that long ago — off unless set.
        ``queue_mode=False`` declares a queue consumed by groups only: its
        queue-mode state then never holds retention back.
        """
        queue = v.name("queue", queue)
        values: dict[str, Any] = {}
        if lease is not None:
            values["lease"] = v.duration_seconds("lease", lease, allow_zero=False)
        if max_attempts is not None:
            values["max_attempts"] = v.positive_int("max_attempts", max_attempts)
        if backoff is not None:
            b = v.backoff("backoff", backoff)
            assert b is not None
            values["backoff"] = json.dumps(b.as_dict())
        if retention is not None:
            values["retention"] = v.duration_seconds("retention", retention)
        if max_wait is not None:
            values["max_wait"] = v.duration_seconds("max_wait", max_wait, allow_zero=False)
        if queue_mode is not None:
            if not isinstance(queue_mode, bool):
                raise InvalidArgument("queue_mode", f"must be True or False, got {queue_mode!r}")
            values["queue_mode"] = queue_mode

        async def work(conn: AsyncConnection) -> None:
            now = await self._current_now_us(conn)
            ins = self._upsert(qs).values(queue=queue, updated_at=now, **values)
            await conn.execute(
                ins.on_conflict_do_update(
                    index_elements=["queue"], set_={"updated_at": now, **values}
                )
            )

        await self._run(work)
        return await self.get_queue(queue)

    async def get_queue(self, queue: str) -> dict[str, Any]:
        """The stored settings of ``queue`` (``None`` where the default applies)."""
        queue = v.name("queue", queue)

        async def work(conn: AsyncConnection) -> Any:
            return (await conn.execute(select(qs).where(qs.c.queue == queue))).first()

        row = await self._run(work, write=False)
        out: dict[str, Any] = {
            "queue": queue,
            "lease": None,
            "max_attempts": None,
            "backoff": None,
            "retention": None,
            "max_wait": None,
            "queue_mode": True,
        }
        if row is not None:
            out.update(
                lease=row.lease,
                max_attempts=row.max_attempts,
                backoff=None if row.backoff is None else json.loads(row.backoff),
                retention=row.retention,
                max_wait=row.max_wait,
                queue_mode=row.queue_mode is not False,
            )
        return out

    async def recover(self) -> tuple[int, int]:
        """Recover every expired lease now: ``(requeued, failed)`` counts."""
        return await self._run(lambda conn: self._recover_tx(conn, None, None))

    async def maintain(self) -> dict[str, int]:
        """One pass of upkeep: lease recovery, eviction (``max_wait``) and retention.

        Returns the counts ``{"recovered", "expired", "evicted", "deleted",
        "skipped"}`` and records them in the maintenance history. Safe to call
        from many workers at once: on Postgres one runs while the others skip
        (``skipped`` = 1); on SQLite the write lock serialises the passes.
        Retention deletes in bounded batches, each its own short transaction.
        """
        if self._engine is None:
            await self.open()
        started = time.monotonic()
        async with self._maintenance_lock() as mine:
            if not mine:
                return {"recovered": 0, "expired": 0, "evicted": 0, "deleted": 0, "skipped": 1}
            requeued, failed = await self._run(lambda conn: self._recover_tx(conn, None, None))
            settings = await self._run(lambda conn: self._all_settings(conn), write=False)
            evicted = 0
            deleted = 0
            for row in settings:
                if row.max_wait is not None:
                    evicted += await self._run(
                        functools.partial(self._evict_tx, queue=row.queue, max_wait=row.max_wait)
                    )
                if row.retention is not None:
                    deleted += await self._purge(row.queue, row.retention, row.queue_mode)
            await self._rollup()
            counts = {
                "recovered": requeued,
                "expired": failed,
                "evicted": evicted,
                "deleted": deleted,
            }

            async def record(conn: AsyncConnection) -> None:
                now = await self._current_now_us(conn)
                await conn.execute(
                    mt.insert().values(ran_at=now, duration=time.monotonic() - started, **counts)
                )

            await self._run(record)
        if evicted or failed:
            self._wake_local(work=False)
        return {**counts, "skipped": 0}

    async def _all_settings(self, conn: AsyncConnection) -> builtins.list[Any]:
        rows = await conn.execute(
            select(qs).where((qs.c.max_wait.is_not(None)) | (qs.c.retention.is_not(None)))
        )
        return builtins.list(rows)

    async def _evict_tx(self, conn: AsyncConnection, queue: str, max_wait: float) -> int:
        """Tasks never claimed ``max_wait`` after their run_at become ``evicted``."""
        now_us = await self._current_now_us(conn)
        cutoff = now_us - round(max_wait * v.US)
        grps = [
            q.QUEUE_MODE,
            *(
                await conn.execute(select(g.c.name).where(g.c.queue == queue, g.c.active.is_(True)))
            ).scalars(),
        ]
        evicted = 0
        touched: builtins.list[tuple[Any, ...]] = []
        for grp in grps:
            rows = builtins.list(
                await conn.execute(
                    update(d)
                    .where(
                        d.c.grp == grp,
                        d.c.queue == queue,
                        d.c.status == q.QUEUED,
                        d.c.attempt == 0,
                        d.c.run_at < cutoff,
                    )
                    .values(status="evicted", finished_at=now_us)
                    .returning(d.c.queue, d.c.grp, d.c.partition)
                )
            )
            evicted += len(rows)
            touched += [tuple(r) for r in rows if r.partition is not None]
        await self._refresh_streams(conn, touched)
        if evicted:
            await self._notify(conn, {queue}, done=True)
        return evicted

    async def _purge(self, queue: str, retention: float, queue_mode: bool | None) -> int:
        """Delete tasks finished for everyone more than ``retention`` seconds ago.

        Walks candidates in (finished_at, task) order with a moving cursor, one
        bounded batch per transaction, so a large purge never holds long locks and
        a task kept back (a slow group) is looked at once per pass.
        """
        cursor: tuple[int, int] = (-1, -1)
        deleted = 0
        while True:
            batch, cursor = await self._run(
                functools.partial(
                    self._purge_batch,
                    queue=queue,
                    retention=retention,
                    queue_mode=queue_mode,
                    cursor=cursor,
                )
            )
            if batch < 0:
                return deleted
            deleted += batch

    async def _purge_batch(
        self,
        conn: AsyncConnection,
        queue: str,
        retention: float,
        queue_mode: bool | None,
        cursor: tuple[int, int],
    ) -> tuple[int, tuple[int, int]]:
        now_us = await self._current_now_us(conn)
        cutoff = now_us - round(retention * v.US)
        # Which delivery rows must be finished: queue mode's unless the queue is
        # declared group-only, and every (active) group's.
        holds = d.c.grp != q.QUEUE_MODE if queue_mode is False else true()
        candidates = builtins.list(
            await conn.execute(
                select(d.c.finished_at, d.c.task_seq)
                .where(
                    d.c.queue == queue,
                    d.c.finished_at.is_not(None),
                    d.c.finished_at < cutoff,
                    tuple_(d.c.finished_at, d.c.task_seq) > tuple_(*cursor),
                    holds,
                )
                .order_by(d.c.finished_at, d.c.task_seq)
                .limit(PURGE_BATCH)
            )
        )
        if not candidates:
            return -1, cursor
        seqs = sorted({row.task_seq for row in candidates})
        pending = d.alias("pending")
        blocked = set(
            (
                await conn.execute(
                    select(pending.c.task_seq).where(
                        pending.c.task_seq.in_(seqs),
                        (pending.c.grp != q.QUEUE_MODE) if queue_mode is False else true(),
                        (pending.c.finished_at.is_(None)) | (pending.c.finished_at >= cutoff),
                    )
                )
            ).scalars()
        )
        doomed = [seq for seq in seqs if seq not in blocked]
        if doomed:
            rolled = await conn.execute(
                select(d.c.queue, d.c.grp, d.c.status, func.count())
                .where(d.c.task_seq.in_(doomed), d.c.rolled == 1)
                .group_by(d.c.queue, d.c.grp, d.c.status)
            )
            await self._add_counts(conn, {(qn, gr, st): -n for qn, gr, st, n in rolled})
            ids = select(t.c.id).where(t.c.seq.in_(doomed))
            await conn.execute(delete(k).where(k.c.task_id.in_(ids)))
            await conn.execute(delete(d).where(d.c.task_seq.in_(doomed)))
            await conn.execute(delete(t).where(t.c.seq.in_(doomed)))
        last = candidates[-1]
        return len(doomed), (last.finished_at, last.task_seq)

    async def _add_counts(
        self, conn: AsyncConnection, deltas: Mapping[tuple[str, str, str], int]
    ) -> None:
        """Add to the rolled-up finished counts of (queue, group, status)."""
        for (queue, grp, status), n in sorted(deltas.items()):
            if n:
                ins = self._upsert(cn).values(queue=queue, grp=grp, status=status, n=n)
                await conn.execute(
                    ins.on_conflict_do_update(
                        index_elements=["queue", "grp", "status"], set_={"n": cn.c.n + n}
                    )
                )

    async def _rollup(self) -> int:
        """Fold finished rows into ``conveyor_counts`` in bounded batches, so stats()
        reads totals plus the few rows finished since, whatever the history."""
        total = 0
        while True:
            rolled = await self._run(self._rollup_batch)
            if not rolled:
                return total
            total += rolled

    async def _rollup_batch(self, conn: AsyncConnection) -> int:
        seqs = builtins.list(
            (
                await conn.execute(
                    select(d.c.task_seq)
                    .where(*q.unrolled(), d.c.status.in_(TERMINAL))
                    .limit(ROLLUP_BATCH)
                )
            ).scalars()
        )
        if not seqs:
            return 0
        rows = await conn.execute(
            update(d)
            .where(*q.unrolled(), d.c.status.in_(TERMINAL), d.c.task_seq.in_(sorted(set(seqs))))
            .values(rolled=1)
            .returning(d.c.queue, d.c.grp, d.c.status)
        )
        deltas: dict[tuple[str, str, str], int] = {}
        n = 0
        for row in rows:
            key = (row.queue, row.grp, row.status)
            deltas[key] = deltas.get(key, 0) + 1
            n += 1
        await self._add_counts(conn, deltas)
        return n

    async def maintenance_history(self, limit: int = 20) -> builtins.list[dict[str, Any]]:
        """The most recent :meth:`maintain` passes, newest first."""
        limit = v.positive_int("limit", limit)

        async def work(conn: AsyncConnection) -> builtins.list[dict[str, Any]]:
            rows = await conn.execute(select(mt).order_by(mt.c.id.desc()).limit(limit))
            return [
                {
                    "ran_at": v.from_us(int(r.ran_at)),
                    "recovered": r.recovered,
                    "expired": r.expired,
                    "evicted": r.evicted,
                    "deleted": r.deleted,
                    "duration": r.duration,
                }
                for r in rows
            ]

        return await self._run(work, write=False)

    # --------------------------------------------------------------- waking
    def _wake_local(self, *, work: bool) -> None:
        # After a commit in this process. It does not say which queues or tasks, so
        # it wakes every waiter here; each looks again, which is cheap.
        self._wake(queues=None if work else (), task_ids=None)

    def _wake(
        self,
        *,
        queues: Iterable[str] | None = (),
        task_ids: Iterable[str] | None = (),
    ) -> None:
        """Wake this process's waiters: idle workers of ``queues`` and ``wait()``
        calls on ``task_ids`` (``None``: all of them). The wake channel calls it
        for what other processes announce."""
        if self._work_waker is not None and (queues is None or queues):
            self._work_waker.notify(queues)
        if self._done_waker is not None and (task_ids is None or task_ids):
            self._done_waker.notify(task_ids)

    async def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Sleep until new work may be claimable in ``queues`` or ``timeout`` passes.

        Returns True when woken by a notification (an in-process commit, or the
        backend's wake channel), False when the timeout ran out. Used by idle
        workers; a notification that arrived since the last wait also counts, so
        one landing between an empty claim and this call is not lost.
        """
        if self._work_waker is None:
            await self.open()
        assert self._work_waker is not None
        return await self._work_waker.wait(v.names("queues", queues), timeout)
