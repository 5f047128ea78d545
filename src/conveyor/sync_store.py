"""The blocking facade over the async store: :class:`SyncStore`.

Its own module so that :mod:`conveyor.connect` (URLs and the store factories)
imports nothing heavy: the facade's methods are made from :class:`TaskStore`'s,
which needs SQLAlchemy.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

from conveyor.encryption import Encryption
from conveyor.errors import ConfigurationError
from conveyor.models import BatchInfo, SeekResult, Task
from conveyor.store.api_dependencies import Batch
from conveyor.store.api_internal import ScheduleInfo
from conveyor.store.base import TaskStore

P = ParamSpec("P")
R = TypeVar("R")


def _blocking(
    method: Callable[Concatenate[TaskStore, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[SyncStore, P], R]:
    """The blocking twin of an async store method: same signature, same docstring."""

    @functools.wraps(method)
    def call(self: SyncStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if kwargs.get("connection") is not None:
            joined: R = self._in_callers_transaction(method.__name__, args, kwargs)
            return joined
        bound: Callable[P, Coroutine[Any, Any, R]] = getattr(self.store, method.__name__)
        return self._call(bound(*args, **kwargs))

    return call


class SyncInternal:
    """The blocking twin of the store's internal methods that conveyor's CLI
    calls (see :class:`conveyor.store.api_internal.Internal`); not covered by
    semver."""

    def __init__(self, store: TaskStore, call: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self._store = store
        self._call = call

    def schedules(self) -> list[ScheduleInfo]:
        """Internal, for ``conveyor schedules``; not covered by semver. Every
        registered periodic schedule, by name."""
        found: list[ScheduleInfo] = self._call(self._store.internal.schedules())
        return found

    def count_rekey(self, queue: str | None = None) -> int:
        """Internal, for ``conveyor rekey``; not covered by semver. How many tasks
        a rekey would rewrite now (see
        :meth:`conveyor.store.api_internal.Internal.count_rekey`)."""
        found: int = self._call(self._store.internal.count_rekey(queue))
        return found

    def count_where(self, action: Literal["retry", "cancel", "purge"], **filters: Any) -> int:
        """Internal, for ``conveyor tasks ... --dry-run``; not covered by semver.
        How many rows the bulk action would change now (see
        :meth:`conveyor.store.api_internal.Internal.count_where`)."""
        found: int = self._call(self._store.internal.count_where(action, **filters))
        return found

    def preview_seek(self, queue: str, group: str, **options: Any) -> SeekResult:
        """Internal, for a seek's confirmation; not covered by semver. What the
        seek would do now (see
        :meth:`conveyor.store.api_internal.Internal.preview_seek`)."""
        found: SeekResult = self._call(self._store.internal.preview_seek(queue, group, **options))
        return found


class SyncStore:
    """The same API as :class:`TaskStore`, blocking.

    The async store runs on a private event loop in a background thread; each
    call is handed to it and waited for. There is one implementation of the
    protocol — this class only carries calls across.
    """

    def __init__(self, store: TaskStore) -> None:
        self.store = store
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: The blocking twin of ``store.internal`` (conveyor's CLI; not covered by semver).
        self.internal = SyncInternal(store, self._call)

    @property
    def encryption(self) -> Encryption | None:
        """The store's encryption keys (see :attr:`TaskStore.encryption`)."""
        return self.store.encryption

    def _call(self, coro: Coroutine[Any, Any, R]) -> R:
        loop = self._ensure_loop()
        future: Future[R] = asyncio.run_coroutine_threadsafe(coro, loop)
        return future.result()

    def _in_callers_transaction(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``submit``/``submit_many`` with ``connection=``: a blocking Connection or
        Session is used in the caller's thread, where it belongs; the store's one
        submit path runs on it without ever waiting on the store's loop."""
        from conveyor.store.protocol import caller_conn

        sync = caller_conn.sync_connection_of(kwargs["connection"])
        if sync is None:
            raise ConfigurationError(
                "connection: the sync store takes a SQLAlchemy Connection or Session "
                f"(got {type(kwargs['connection']).__name__}); pass an AsyncConnection or "
                "AsyncSession to the async store"
            )
        loop = self._ensure_loop()
        self._call(caller_conn.store_identity(self.store))  # opens the store on its loop
        joined = {**kwargs, "connection": caller_conn.SyncConnection(sync, loop)}
        return caller_conn.run_inline(getattr(self.store, method)(*args, **joined))

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="conveyor-sync", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def open(self) -> None:
        """Connect and migrate (done for you by ``with`` or the first call)."""
        self._call(self.store.open())

    def close(self) -> None:
        """Close the store and stop the background loop."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.store.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    def __enter__(self) -> SyncStore:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    submit = _blocking(TaskStore.submit)
    submit_many = _blocking(TaskStore.submit_many)
    get = _blocking(TaskStore.get)
    get_by_key = _blocking(TaskStore.get_by_key)
    list = _blocking(TaskStore.list)
    cancel = _blocking(TaskStore.cancel)
    cancel_by_key = _blocking(TaskStore.cancel_by_key)
    retry = _blocking(TaskStore.retry)
    retry_by_key = _blocking(TaskStore.retry_by_key)
    retry_where = _blocking(TaskStore.retry_where)
    cancel_where = _blocking(TaskStore.cancel_where)
    purge_where = _blocking(TaskStore.purge_where)
    wait = _blocking(TaskStore.wait)
    claim = _blocking(TaskStore.claim)
    heartbeat = _blocking(TaskStore.heartbeat)
    progress = _blocking(TaskStore.progress)
    succeed = _blocking(TaskStore.succeed)
    succeed_many = _blocking(TaskStore.succeed_many)
    ack_many = _blocking(TaskStore.ack_many)
    fail = _blocking(TaskStore.fail)
    release = _blocking(TaskStore.release)
    snooze = _blocking(TaskStore.snooze)
    subscribe = _blocking(TaskStore.subscribe)
    seek = _blocking(TaskStore.seek)
    unsubscribe = _blocking(TaskStore.unsubscribe)
    pause = _blocking(TaskStore.pause)
    resume = _blocking(TaskStore.resume)
    groups = _blocking(TaskStore.groups)
    stats = _blocking(TaskStore.stats)
    configure_queue = _blocking(TaskStore.configure_queue)
    get_queue = _blocking(TaskStore.get_queue)
    rekey = _blocking(TaskStore.rekey)
    recover = _blocking(TaskStore.recover)
    maintain = _blocking(TaskStore.maintain)
    maintenance_history = _blocking(TaskStore.maintenance_history)
    workers = _blocking(TaskStore.workers)
    announce_worker = _blocking(TaskStore.announce_worker)
    retire_worker = _blocking(TaskStore.retire_worker)
    deliveries = _blocking(TaskStore.deliveries)
    children = _blocking(TaskStore.children)
    queue_settings = _blocking(TaskStore.queue_settings)
    streams = _blocking(TaskStore.streams)
    throughput = _blocking(TaskStore.throughput)
    finished_totals = _blocking(TaskStore.finished_totals)
    get_batch = _blocking(TaskStore.get_batch)
    parent_results = _blocking(TaskStore.parent_results)
    parents = _blocking(TaskStore.parents)
    batch_of_callback = _blocking(TaskStore.batch_of_callback)
    dependency_graph = _blocking(TaskStore.dependency_graph)

    def batch(
        self, on_complete: str | tuple[str, Any], *, queue: str = "default", **options: Any
    ) -> SyncBatch:
        """:meth:`TaskStore.batch`, blocking: the batch is open when this returns;
        ``with store.batch(...) as b:`` closes it when the block ends."""
        opened = self.store.batch(on_complete, queue=queue, **options)

        async def open_() -> Batch:
            return await opened

        return SyncBatch(self._call(open_()), self._call)


class CallerLoopStore(SyncStore):
    """Internal, for conveyor's command line; not covered by semver.
    :class:`SyncStore` with the async store run on an event loop in the caller's
    own thread, one call at a time, instead of on a loop in a thread of its own.

    For a process that makes a few calls from one thread and exits, paired with a
    store whose transactions run on the calling thread
    (:class:`conveyor.store.sqlite.oneshot.OneShotSQLiteStore`): no thread to start,
    and no hop to it and back per call (on a busy machine each waits its turn for
    a CPU). Not for use from several threads, nor from inside a running event
    loop; ``connection=`` is refused (a caller's transaction wants
    :class:`SyncStore`)."""

    def _call(self, coro: Coroutine[Any, Any, R]) -> R:
        return self._ensure_loop().run_until_complete(coro)

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            return self._loop

    def _in_callers_transaction(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        raise ConfigurationError(
            "connection: this store runs on the caller's thread and cannot join a "
            "caller's transaction; use conveyor.connect_sync"
        )

    def close(self) -> None:
        """Close the store and its event loop."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            loop.run_until_complete(self.store.close())
        finally:
            loop.close()


class SyncBatch:
    """The blocking twin of :class:`~conveyor.Batch` (:meth:`SyncStore.batch`)."""

    def __init__(self, batch: Batch, call: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self._run = call  # the sync store's: runs a coroutine on its loop
        self._batch = batch
        #: The batch's id.
        self.id = batch.id
        #: The callback task as written (``waiting``).
        self.callback = batch.callback

    def submit(self, name: str, payload: Any = None, **options: Any) -> Task:
        """:meth:`Batch.submit`, blocking."""
        task: Task = self._run(self._batch.submit(name, payload, **options))
        return task

    def submit_many(self, requests: Iterable[Mapping[str, Any]]) -> builtins.list[Task]:
        """:meth:`Batch.submit_many`, blocking."""
        tasks: builtins.list[Task] = self._run(self._batch.submit_many(requests))
        return tasks

    def close(self) -> None:
        """:meth:`Batch.close`, blocking."""
        self._run(self._batch.close())

    def info(self) -> BatchInfo:
        """:meth:`Batch.info`, blocking."""
        info: BatchInfo = self._run(self._batch.info())
        return info

    def __enter__(self) -> SyncBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["CallerLoopStore", "SyncBatch", "SyncInternal", "SyncStore"]
