"""Tasks as Python functions: the :class:`App`, its ``@app.task`` decorator, and
the submit helpers the decorated functions grow.

::

    app = conveyor.App("postgresql://...")

    @app.task(queue="emails", max_attempts=5, timeout=60)
    async def send_email(ctx, to: str, subject: str) -> dict:
        await ctx.progress(0.5, "rendered")
        return {"sent": True}

    task = await send_email.submit(to="a@b.c", subject="hi")
    task = await send_email.with_options(partition="cust-7", delay=10).submit(to="x@y.z")

A submitted task's payload is ``{"args": [...], "kwargs": {...}}``. Workers also
accept payloads written by other producers (see :func:`payload_arguments`).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import signal
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Literal, ParamSpec, TypeVar, overload

from conveyor import _values as v
from conveyor.connect import SyncStore, connect
from conveyor.errors import ConfigurationError, InvalidArgument
from conveyor.models import Backoff, Task
from conveyor.store.base import TaskStore

if TYPE_CHECKING:
    from conveyor.worker import Context, Worker

P = ParamSpec("P")
R = TypeVar("R")

#: What ``partition=`` of ``@app.task`` accepts: a fixed name, or a function of the
#: task's arguments that names the stream (``lambda order_id, **_: order_id``).
PartitionSpec = str | Callable[..., str | None] | None

_OPTIONS = frozenset(
    {
        "partition",
        "key",
        "delay",
        "run_at",
        "priority",
        "queue",
        "conflict",
        "correlation_id",
        "parent",
        "metadata",
        "max_attempts",
    }
)


def payload_arguments(payload: Any) -> tuple[list[Any], dict[str, Any]]:
    """The ``(args, kwargs)`` a handler is called with, from a task's payload.

    ``{"args": [...], "kwargs": {...}}`` (what :meth:`TaskFunction.submit` writes;
    either key may be missing) is unpacked; any other dict is passed as keyword
    arguments (so ``conveyor submit NAME --payload '{"to": "a@b.c"}'`` works); a
    list as positional arguments; ``None`` as no arguments; anything else as the
    single positional argument.
    """
    if payload is None:
        return [], {}
    if isinstance(payload, dict):
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
        if (
            set(payload) <= {"args", "kwargs"}
            and isinstance(args, list)
            and isinstance(kwargs, dict)
        ):
            return list(args), dict(kwargs)
        return [], dict(payload)
    if isinstance(payload, list):
        return list(payload), {}
    return [payload], {}


class TaskCall(Generic[P]):
    """A task function with per-call submit options bound; see
    :meth:`TaskFunction.with_options`."""

    def __init__(self, fn: TaskFunction[P, Any], options: dict[str, Any]) -> None:
        self.fn = fn
        self.options = options

    async def submit(self, *args: P.args, **kwargs: P.kwargs) -> Task:
        """Submit one run with the function's arguments; returns the queued task."""
        return await self.fn.app.store.submit(**self.request(args, kwargs))

    def submit_sync(self, *args: P.args, **kwargs: P.kwargs) -> Task:
        """:meth:`submit`, blocking (for scripts and sync web handlers)."""
        return self.fn.app.sync_store.submit(**self.request(args, kwargs))

    def request(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of :meth:`TaskStore.submit` for one call."""
        fn = self.fn
        request: dict[str, Any] = {
            "name": fn.name,
            "payload": {"args": list(args), "kwargs": dict(kwargs)},
            "queue": fn.queue,
            "priority": fn.priority,
            "max_attempts": fn.max_attempts,
            "backoff": fn.backoff,
        }
        if "partition" not in self.options and fn.partition is not None:
            request["partition"] = (
                fn.partition(*args, **kwargs) if callable(fn.partition) else fn.partition
            )
        request.update(self.options)
        return request


class TaskFunction(Generic[P, R]):
    """A function registered with :meth:`App.task`.

    Calling it runs the function directly (handy in tests); :meth:`submit` queues
    a run instead. The function receives a :class:`~conveyor.worker.Context` first.
    """

    def __init__(
        self,
        app: App,
        func: Callable[..., R],
        *,
        name: str,
        queue: str,
        max_attempts: int | None,
        timeout: float | None,
        backoff: Backoff | None,
        priority: int,
        partition: PartitionSpec,
    ) -> None:
        self.app = app
        self.func = func
        self.name = name
        self.queue = queue
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.backoff = backoff
        self.priority = priority
        self.partition = partition
        #: Coroutine functions run on the worker's event loop, others in a thread.
        self.is_async = inspect.iscoroutinefunction(func)
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", name)
        self.__qualname__ = getattr(func, "__qualname__", name)
        self.__module__ = getattr(func, "__module__", __name__)
        self.__wrapped__ = func

    def __call__(self, ctx: Context, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function now, in this process (no queue involved)."""
        return self.func(ctx, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<TaskFunction {self.name} queue={self.queue!r}>"

    def with_options(
        self,
        *,
        partition: str | None = None,
        key: str | None = None,
        delay: v.Duration | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
        conflict: Literal["reuse", "reject", "replace"] | None = None,
        correlation_id: str | None = None,
        parent: Task | str | None = None,
        metadata: dict[str, Any] | None = None,
        max_attempts: int | None = None,
    ) -> TaskCall[P]:
        """Submit options for one call: ``fn.with_options(partition="c7").submit(...)``.

        Options left ``None`` keep the task's defaults.
        """
        given = {
            "partition": partition,
            "key": key,
            "delay": delay,
            "run_at": run_at,
            "priority": priority,
            "queue": queue,
            "conflict": conflict,
            "correlation_id": correlation_id,
            "parent": parent,
            "metadata": metadata,
            "max_attempts": max_attempts,
        }
        return TaskCall(self, {k: val for k, val in given.items() if val is not None})

    async def submit(self, *args: P.args, **kwargs: P.kwargs) -> Task:
        """Queue one run with these arguments; returns the queued task."""
        return await TaskCall(self, {}).submit(*args, **kwargs)

    def submit_sync(self, *args: P.args, **kwargs: P.kwargs) -> Task:
        """:meth:`submit`, blocking."""
        return TaskCall(self, {}).submit_sync(*args, **kwargs)


class App:
    """A set of task functions and the store they are queued in.

    ``url`` defaults to ``$CONVEYOR_URL``, else ``sqlite:///conveyor.db``;
    ``connect_options`` go to :func:`conveyor.connect`. Nothing connects until
    the first submit or worker.
    """

    def __init__(self, url: str | None = None, **connect_options: Any) -> None:
        self.url = url
        self.connect_options = connect_options
        #: Registered task functions by name.
        self.tasks: dict[str, TaskFunction[Any, Any]] = {}
        self._store: TaskStore | None = None
        self._sync_store: SyncStore | None = None

    def __repr__(self) -> str:
        return f"<App url={self.url!r} tasks={sorted(self.tasks)}>"

    @property
    def store(self) -> TaskStore:
        """The app's async store, made on first use; its first call opens it.

        Like every async store it belongs to the event loop that opened it.
        """
        if self._store is None:
            self._store = connect(self.url, **self.connect_options)
        return self._store

    @property
    def sync_store(self) -> SyncStore:
        """A blocking store for ``submit_sync`` (its own connection pool and loop)."""
        if self._sync_store is None:
            self._sync_store = SyncStore(connect(self.url, **self.connect_options))
        return self._sync_store

    async def close(self) -> None:
        """Close the stores the app opened. They reopen on next use."""
        if self._store is not None:
            await self._store.close()
        sync, self._sync_store = self._sync_store, None
        if sync is not None:
            await asyncio.to_thread(sync.close)

    async def __aenter__(self) -> App:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @overload
    def task(self, func: Callable[..., R], /) -> TaskFunction[..., R]: ...

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
    ) -> Callable[[Callable[..., R]], TaskFunction[..., R]]: ...

    def task(
        self,
        func: Callable[..., R] | None = None,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int | None = None,
        timeout: v.Duration | None = None,
        backoff: Backoff | dict[str, float] | v.Duration | None = None,
        priority: int = 0,
        partition: PartitionSpec = None,
    ) -> TaskFunction[..., R] | Callable[[Callable[..., R]], TaskFunction[..., R]]:
        """Register a task function (``@app.task`` or ``@app.task(...)``).

        ``name`` defaults to ``module.qualname`` — give one explicitly when producers
        and workers may import the function under different module names (a script
        run as ``__main__``). ``max_attempts`` and ``backoff``
        are stored with each submitted task (``None``: the queue's setting, else
        the store default); ``timeout`` is enforced by the worker per attempt;
        ``partition`` puts every run in one stream, or names the stream from the
        arguments when it is a function.
        """
        checked_queue = v.name("queue", queue)
        checked_max = None if max_attempts is None else v.positive_int("max_attempts", max_attempts)
        checked_timeout = (
            None if timeout is None else v.duration_seconds("timeout", timeout, allow_zero=False)
        )
        checked_backoff = v.backoff("backoff", backoff)
        checked_priority = v.integer("priority", priority)
        if isinstance(partition, str):
            v.name("partition", partition)
        elif partition is not None and not callable(partition):
            raise InvalidArgument("partition", "must be a name or a function of the arguments")

        def register(fn: Callable[..., R]) -> TaskFunction[..., R]:
            task_name = v.name(
                "name", name or f"{getattr(fn, '__module__', '?')}.{fn.__qualname__}"
            )
            if task_name in self.tasks and self.tasks[task_name].func is not fn:
                raise ConfigurationError(f"two task functions are named {task_name!r}")
            registered: TaskFunction[..., R] = TaskFunction(
                self,
                fn,
                name=task_name,
                queue=checked_queue,
                max_attempts=checked_max,
                timeout=checked_timeout,
                backoff=checked_backoff,
                priority=checked_priority,
                partition=partition,
            )
            self.tasks[task_name] = registered
            return registered

        return register if func is None else register(func)

    def worker(
        self,
        queues: str | Sequence[str] = "default",
        *,
        concurrency: int = 10,
        group: str | None = None,
        lease: v.Duration | None = None,
        poll_interval: v.Duration = 1.0,
        grace: v.Duration = 30.0,
        maintain_interval: v.Duration | None = 30.0,
        worker_id: str | None = None,
        store: TaskStore | None = None,
    ) -> Worker:
        """A :class:`~conveyor.worker.Worker` running this app's tasks; ``await
        worker.run()`` until ``worker.stop()``. ``store`` defaults to :attr:`store`."""
        from conveyor.worker import Worker

        return Worker(
            self,
            queues,
            store=store,
            concurrency=concurrency,
            group=group,
            lease=lease,
            poll_interval=poll_interval,
            grace=grace,
            maintain_interval=maintain_interval,
            worker_id=worker_id,
        )

    def run_worker(
        self,
        queues: str | Sequence[str] = "default",
        *,
        concurrency: int = 10,
        group: str | None = None,
        lease: v.Duration | None = None,
        poll_interval: v.Duration = 1.0,
        grace: v.Duration = 30.0,
        maintain_interval: v.Duration | None = 30.0,
        worker_id: str | None = None,
        url: str | None = None,
    ) -> None:
        """Run a worker in this thread until SIGINT or SIGTERM, then return.

        The first signal stops claiming, lets running tasks finish within
        ``grace`` seconds and hands the rest back; a second one skips what is left
        of the grace period. ``url`` overrides the app's URL for this worker.
        """

        async def serve() -> None:
            store = connect(url, **self.connect_options) if url is not None else self.store
            worker = self.worker(
                queues,
                concurrency=concurrency,
                group=group,
                lease=lease,
                poll_interval=poll_interval,
                grace=grace,
                maintain_interval=maintain_interval,
                worker_id=worker_id,
                store=store,
            )
            loop = asyncio.get_running_loop()
            installed = []
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.add_signal_handler(sig, worker.stop)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError):  # pragma: no cover - Windows
                    signal.signal(sig, lambda *_: loop.call_soon_threadsafe(worker.stop))
            try:
                await worker.run()
            finally:
                for sig in installed:
                    loop.remove_signal_handler(sig)
                # The store belongs to this loop, which ends here.
                await store.close()

        asyncio.run(serve())


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


__all__ = ["App", "PartitionSpec", "TaskCall", "TaskFunction", "load_app", "payload_arguments"]
