"""Tasks as Python functions: the :class:`App`, its ``@app.task`` decorator, and
the submit helpers the decorated functions grow.

::

    app = conveyor.App()        # $CONVEYOR_URL, else sqlite:///conveyor.db

    @app.task(queue="emails", max_attempts=5, timeout=60)
    async def send_email(ctx, to: str, subject: str) -> dict:
        await ctx.progress(0.5, "rendered")
        return {"sent": True}

    task = await send_email.submit(to="a@b.c", subject="hi")
    task = await send_email.with_options(partition="cust-7", delay=10).submit(to="x@y.z")

Task functions, the naming rule and the payload convention live in
:mod:`conveyor.task_functions` (re-exported here); the worker in :mod:`conveyor.worker`.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, overload

from conveyor import _values as v
from conveyor.connect import ChosenUrl, choose_url, connect
from conveyor.errors import ConfigurationError, InvalidArgument
from conveyor.models import Backoff
from conveyor.store.api_dependencies import OpeningBatch
from conveyor.store.base import TaskStore
from conveyor.sync_store import SyncStore
from conveyor.task_functions import (
    PartitionSpec,
    TaskCall,
    TaskFunction,
    default_task_name,
    payload_arguments,
    payload_for,
    task_factory,
)
from conveyor.worker import Worker
from conveyor.worker import signals as stop_signals
from conveyor.worker.startup import Start
from conveyor.worker.unknown import Policy

if TYPE_CHECKING:
    from conveyor.schedule import Schedule
    from conveyor.worker.context import Context

P = ParamSpec("P")
R = TypeVar("R")
#: A handler: it takes the :class:`~conveyor.Context` first, then its own arguments.
Handler = Callable[Concatenate["Context", P], R]

#: Where a URL came from, as a worker's start line says it (nothing for a URL
#: given to this very worker: whoever gave it knows).
URL_ORIGINS: dict[str, str | None] = {
    "given": None,
    "env": "$CONVEYOR_URL",
    "app": "the App's URL",
    "default": "the default",
}


class App:
    """A set of task functions and the store they are queued in.

    The database is ``$CONVEYOR_URL`` when it is set, else ``url``, else
    ``sqlite:///conveyor.db``: the deployment's setting wins over the code's, so
    producers, workers and every ``conveyor`` command reach one database (a
    ``url=`` given to :meth:`run_worker`, like ``--url``, wins over both; see
    :func:`conveyor.connect.choose_url`). ``connect_options`` go to
    :func:`conveyor.connect`. Nothing connects until the first submit or worker.
    """

    def __init__(self, url: str | None = None, **connect_options: Any) -> None:
        #: The URL given here (used when ``$CONVEYOR_URL`` is not set).
        self.url = url
        self.connect_options = connect_options
        #: Registered task functions by name.
        self.tasks: dict[str, TaskFunction[Any, Any]] = {}
        #: Periodic schedules by name (see :meth:`periodic`).
        self.schedules: dict[str, Schedule] = {}
        self._store: TaskStore | None = None
        self._sync_store: SyncStore | None = None
        # Where the URL of the store the app made came from (None: a store handed in).
        self._origin: str | None = None

    def __repr__(self) -> str:
        return f"<App url={self.url!r} tasks={sorted(self.tasks)}>"

    def database(self, url: str | None = None) -> ChosenUrl:
        """The URL this app's store uses (or a worker given ``url``), and where it
        comes from, by the rule in the class docstring."""
        return choose_url(url, self.url)

    @property
    def store(self) -> TaskStore:
        """The app's async store, made on first use; its first call opens it.

        Like every async store it belongs to the event loop that opened it.
        """
        if self._store is None:
            chosen = self.database()
            self._store = connect(chosen.url, **self.connect_options)
            self._origin = URL_ORIGINS[chosen.origin]
        return self._store

    @property
    def sync_store(self) -> SyncStore:
        """A blocking store for ``submit_sync`` (its own connection pool and loop)."""
        if self._sync_store is None:
            url = self.database().url if self._store is None else self._store.url
            self._sync_store = SyncStore(connect(url, **self.connect_options))
        return self._sync_store

    def batch(
        self,
        on_complete: TaskFunction[Any, Any] | str | tuple[TaskFunction[Any, Any] | str, Any],
        *,
        queue: str | None = None,
        **options: Any,
    ) -> OpeningBatch:
        """:meth:`TaskStore.batch` on the app's store, the callback a task function
        (or a name, or ``(function, kwargs)``: the function's keyword arguments);
        on the function's queue unless ``queue`` says otherwise. Submit into it
        with ``fn.with_options(batch=b).submit(...)`` or ``b.submit(name, ...)``."""
        target, kwargs = on_complete if isinstance(on_complete, tuple) else (on_complete, None)
        payload: Any = kwargs
        if isinstance(target, TaskFunction):
            name, default_queue = target.name, target.queue
            payload = payload_for((), dict(kwargs or {}))
        else:
            name, default_queue = target, "default"
        chosen = default_queue if queue is None else queue
        return self.store.batch((name, payload), queue=chosen, **options)

    async def close(self) -> None:
        """Close the stores the app opened. They reopen on next use."""
        if self._store is not None:
            await self._store.close()
        sync, self._sync_store = self._sync_store, None
        if sync is not None:
            await asyncio.to_thread(sync.close)

    @contextmanager
    def using(self, store: TaskStore) -> Iterator[App]:
        """Make ``store`` this app's store inside the ``with`` block (and a blocking
        store on the same database its :attr:`sync_store`): how a test points an
        application's own app at a test database. The stores before come back after.

        Task functions and schedules registered inside the block by a function
        defined inside another function (a test's own ``@app.task``) are
        unregistered at its end, so the next test may define its own under the
        same name; those of modules imported meanwhile stay, as their module
        is not imported again.
        """
        saved = self._store, self._sync_store, self._origin
        tasks, schedules = set(self.tasks), set(self.schedules)
        self._store, self._sync_store, self._origin = store, None, None
        try:
            yield self
        finally:
            sync = self._sync_store
            self._store, self._sync_store, self._origin = saved
            self._forget_local(tasks, schedules)
            if sync is not None:
                sync.close()

    def _forget_local(self, tasks: set[str], schedules: set[str]) -> None:
        """Unregister the task functions (and their schedules) registered since
        ``tasks``/``schedules`` were the names, whose handler was defined inside a
        function."""

        def local(fn: TaskFunction[Any, Any]) -> bool:
            return "<locals>" in getattr(fn.func, "__qualname__", "")

        for name in [n for n in self.schedules if n not in schedules]:
            if local(self.schedules[name].task):
                del self.schedules[name]
        for name in [n for n in self.tasks if n not in tasks]:
            if local(self.tasks[name]):
                del self.tasks[name]

    async def __aenter__(self) -> App:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @overload
    def task(self, func: Handler[P, R], /) -> TaskFunction[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int | None = None,
        timeout: v.Duration | None = None,
        backoff: Backoff | dict[str, float] | v.Duration | None = None,
        priority: int = 0,
        partition: PartitionSpec = None,
        retry_on: type[BaseException] | Sequence[type[BaseException]] | None = None,
        no_retry_on: type[BaseException] | Sequence[type[BaseException]] | None = None,
        concurrency_key: PartitionSpec = None,
    ) -> Callable[[Handler[P, R]], TaskFunction[P, R]]: ...

    def task(
        self,
        func: Handler[P, R] | None = None,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int | None = None,
        timeout: v.Duration | None = None,
        backoff: Backoff | dict[str, float] | v.Duration | None = None,
        priority: int = 0,
        partition: PartitionSpec = None,
        retry_on: type[BaseException] | Sequence[type[BaseException]] | None = None,
        no_retry_on: type[BaseException] | Sequence[type[BaseException]] | None = None,
        concurrency_key: PartitionSpec = None,
    ) -> TaskFunction[P, R] | Callable[[Handler[P, R]], TaskFunction[P, R]]:
        """Register a task function (``@app.task`` or ``@app.task(...)``).

        ``name`` defaults to ``module.qualname`` — give one explicitly when producers
        and workers may import the function under different module names (a script
        run as ``__main__``). ``max_attempts`` and ``backoff``
        are stored with each submitted task (``None``: the queue's setting, else
        the store default); ``timeout`` is enforced by the worker per attempt;
        ``partition`` puts every run in one stream, or names the stream from the
        arguments when it is a function. ``retry_on`` (only these exceptions are
        retried) and ``no_retry_on`` (these fail the task for good) are exception
        classes, or tuples of them; ``raise conveyor.Permanent(...)`` always fails
        for good, and ``conveyor.Snooze(seconds)`` runs the task again later
        without spending an attempt (:mod:`conveyor.outcomes`).
        ``concurrency_key`` names each run's flow-control key (a name, or a
        function of the arguments like ``partition``; see
        :meth:`conveyor.TaskStore.configure_queue`).
        """
        make = task_factory(
            self,
            name=name,
            queue=queue,
            max_attempts=max_attempts,
            timeout=timeout,
            backoff=backoff,
            priority=priority,
            partition=partition,
            retry_on=retry_on,
            no_retry_on=no_retry_on,
            concurrency_key=concurrency_key,
        )

        def register(fn: Handler[P, R]) -> TaskFunction[P, R]:
            registered = make(fn)
            known = self.tasks.get(registered.name)
            if known is not None and known.func is not fn:
                raise ConfigurationError(
                    f"two task functions are named {registered.name!r}: give one of them "
                    "another name with @app.task(name=...)"
                )
            self.tasks[registered.name] = registered
            return registered

        return register if func is None else register(func)

    def periodic(
        self,
        *,
        cron: str | None = None,
        tz: str | None = None,
        every: v.Duration | None = None,
        catch_up: bool | None = None,
        name: str | None = None,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **task_options: Any,
    ) -> Callable[[Handler[P, R]], TaskFunction[P, R]]:
        """Run a task on a schedule: ``@app.periodic(cron="0 3 * * *", tz="Europe/Paris")``
        or ``@app.periodic(every=timedelta(minutes=5))``.

        Put it on a plain function (``task_options`` then go to :meth:`task`:
        ``queue=``, ``timeout=``, ...) or on top of ``@app.task``. Every worker of
        the app runs the scheduler, and each tick is submitted once whatever
        their number (see :mod:`conveyor.schedule`). ``catch_up`` decides what
        happens to ticks missed while no worker ran: ``None`` runs the latest one
        once, ``True`` all of them, ``False`` none. ``args``/``kwargs`` are the
        arguments of each run; ``name`` names the schedule (default: the task's
        name), needed when one task has several schedules.
        """
        from conveyor.schedule import Schedule

        def register(fn: Handler[P, R]) -> TaskFunction[P, R]:
            if isinstance(fn, TaskFunction):
                if task_options:
                    raise InvalidArgument(
                        sorted(task_options)[0], "belongs on @app.task when it is applied too"
                    )
                registered: TaskFunction[P, R] = fn
            else:
                registered = self.task(**task_options)(fn)
            try:
                schedule = Schedule.build(
                    registered,
                    cron=cron,
                    tz=tz,
                    every=every,
                    catch_up=catch_up,
                    name=name,
                    args=args,
                    kwargs=kwargs,
                )
            except InvalidArgument:
                if registered is not fn:  # leave the app as it was
                    self.tasks.pop(registered.name, None)
                raise
            if schedule.name in self.schedules:
                raise ConfigurationError(
                    f"two schedules are named {schedule.name!r}: give one of them name=..."
                )
            self.schedules[schedule.name] = schedule
            return registered

        return register

    def worker(
        self,
        queues: str | Sequence[str] = "default",
        *,
        concurrency: int = 10,
        group: str | None = None,
        subscribe: Start | None = None,
        lease: v.Duration | None = None,
        poll_interval: v.Duration = 1.0,
        grace: v.Duration = 30.0,
        maintain_interval: v.Duration | None = 30.0,
        worker_id: str | None = None,
        store: TaskStore | None = None,
        gc_freeze: bool = True,
        unknown: Policy = "release",
    ) -> Worker:
        """A :class:`~conveyor.worker.Worker` running this app's tasks; ``await
        worker.run()`` until ``worker.stop()``. ``store`` defaults to :attr:`store`.
        ``group`` must be subscribed to the queues unless ``subscribe`` says where a
        new group starts; ``unknown`` is what happens to a task whose name has no
        handler here (see :class:`~conveyor.worker.Worker`)."""
        made = Worker(
            self,
            queues,
            store=store,
            concurrency=concurrency,
            group=group,
            subscribe=subscribe,
            lease=lease,
            poll_interval=poll_interval,
            grace=grace,
            maintain_interval=maintain_interval,
            worker_id=worker_id,
            gc_freeze=gc_freeze,
            unknown=unknown,
        )
        if store is None:
            made.database_origin = self._origin
        return made

    def run_worker(
        self,
        queues: str | Sequence[str] = "default",
        *,
        concurrency: int = 10,
        group: str | None = None,
        subscribe: Start | None = None,
        lease: v.Duration | None = None,
        poll_interval: v.Duration = 1.0,
        grace: v.Duration = 30.0,
        maintain_interval: v.Duration | None = 30.0,
        worker_id: str | None = None,
        url: str | None = None,
        wait_for_db: v.Duration = 60.0,
        gc_freeze: bool = True,
        unknown: Policy = "release",
    ) -> None:
        """Run a worker in this thread until SIGINT or SIGTERM, then return.

        The first signal stops claiming, lets running tasks finish within
        ``grace`` seconds and hands the rest back; a second one skips what is left
        of the grace period. ``url`` overrides ``$CONVEYOR_URL`` and the app's URL
        for this worker.
        A database that does not answer at start is waited for, with backoff,
        up to ``wait_for_db`` seconds (then :class:`StoreUnavailable`).
        """
        wait = v.duration_seconds("wait_for_db", wait_for_db)
        # The process's stop signals: already installed by the CLI (covering the
        # application's import); installed here otherwise, for the whole run, so
        # that a signal while starting or closing stops the worker rather than
        # killing the process.
        signals = stop_signals.PROCESS
        ours = not signals.installed
        signals.install()

        async def serve() -> None:
            # Without url=, the app's own store, so the worker says where its URL came from.
            own = connect(url, **self.connect_options) if url else None
            worker = self.worker(
                queues,
                concurrency=concurrency,
                group=group,
                subscribe=subscribe,
                lease=lease,
                poll_interval=poll_interval,
                grace=grace,
                maintain_interval=maintain_interval,
                worker_id=worker_id,
                store=own,
                gc_freeze=gc_freeze,
                unknown=unknown,
            )
            worker.wait_for_db = wait
            worker.close_store = True  # the store belongs to this loop, which ends with it
            loop = asyncio.get_running_loop()
            signals.forward(lambda: loop.call_soon_threadsafe(worker.stop))
            try:
                await worker.run()
            finally:
                signals.forward(None)

        try:
            asyncio.run(serve())
        finally:
            if ours:
                signals.restore()


def load_app(path: str) -> App:
    """The :class:`App` named by ``"package.module:attribute"``.

    Import errors propagate as they are; a malformed path or an attribute that
    is not an App raises :class:`ConfigurationError`.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"{path!r} is not MODULE:ATTRIBUTE, e.g. myapp.tasks:app")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, App):
        raise ConfigurationError(f"{path!r} is a {type(obj).__name__}, not a conveyor.App")
    return obj


__all__ = [
    "App",
    "PartitionSpec",
    "TaskCall",
    "TaskFunction",
    "default_task_name",
    "load_app",
    "payload_arguments",
    "payload_for",
]
