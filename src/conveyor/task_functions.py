"""Task functions and the payload convention they share with the worker.

This module is what both sides of a queue agree on, with no knowledge of the
:class:`~conveyor.app.App` or of the worker:

* :class:`TaskFunction`: a function registered with ``@app.task``, with its
  submit options, and :class:`TaskCall`, the same with per-call options bound;
* the naming rule (:func:`default_task_name`): ``module.qualname`` unless
  ``@app.task(name=...)`` says otherwise;
* the payload convention: :func:`payload_for` writes ``{"args": [...],
  "kwargs": {...}}`` and :func:`payload_arguments` reads it back (and reads
  payloads written by other producers too);
* :class:`TaskHost`: the little a task function needs from whoever registered
  it (a registry of tasks and a store to submit to). :class:`~conveyor.app.App`
  is one; the worker depends on this protocol, not on the App.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Concatenate, Generic, Literal, ParamSpec, Protocol, TypeVar

from conveyor import _values as v
from conveyor.errors import InvalidArgument
from conveyor.models import Backoff, Task
from conveyor.outcomes import ExceptionTypes, exception_types

if TYPE_CHECKING:
    from conveyor.store.base import TaskStore
    from conveyor.sync_store import SyncStore

P = ParamSpec("P")
R = TypeVar("R")

#: What ``partition=`` of ``@app.task`` accepts: a fixed name, or a function of the
#: task's arguments that names the stream (``lambda order_id, **_: order_id``).
PartitionSpec = str | Callable[..., str | None] | None


class TaskHost(Protocol):
    """What a task function needs from the object that registered it."""

    #: Registered task functions by name.
    tasks: dict[str, TaskFunction[Any, Any]]

    @property
    def store(self) -> TaskStore:
        """The async store task functions submit to."""
        ...

    @property
    def sync_store(self) -> SyncStore:
        """The blocking store behind ``submit_sync``."""
        ...


def default_task_name(func: Callable[..., Any]) -> str:
    """The name a task function gets without ``name=``: ``module.qualname``.

    Producers and workers must agree on it, so a function defined in a script
    run as ``__main__`` (or imported under two module names) needs an explicit
    ``@app.task(name=...)``.
    """
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}"


def payload_for(args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The payload :meth:`TaskFunction.submit` writes for one call."""
    return {"args": list(args), "kwargs": dict(kwargs)}


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


def _connection_of(kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """Split a caller's SQLAlchemy connection or session (``connection=``) from a
    task function's own keyword arguments (a connection is never a task argument:
    it could not be stored as JSON)."""
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    found = kwargs.get("connection")
    if isinstance(found, AsyncConnection | AsyncSession | Connection | Session):
        return found, {name: value for name, value in kwargs.items() if name != "connection"}
    return None, kwargs


class TaskCall(Generic[P]):
    """A task function with per-call submit options bound; see
    :meth:`TaskFunction.with_options`.

    ``submit`` and ``submit_sync`` take the handler's own parameters (without its
    first, the context), so a type checker checks every call against them.
    """

    def __init__(
        self, fn: TaskFunction[P, Any], options: dict[str, Any], connection: Any = None
    ) -> None:
        self.fn = fn
        self.options = options
        #: The caller's connection or session the submit writes in (``None``: its own).
        self.connection = connection

    async def submit(self, *args: P.args, **kwargs: P.kwargs) -> Task:
        """Submit one run with the function's arguments; returns the queued task.

        A connection bound with ``with_options(connection=...)`` (an
        ``AsyncConnection`` or ``AsyncSession``) writes it in the caller's
        transaction, as :meth:`TaskStore.submit` does; so does a ``connection=``
        keyword here, which type checkers do not know of (it is not the handler's)."""
        connection, own = self._connection(kwargs)
        request = self.request(args, own)
        return await self.fn.app.store.submit(**request, connection=connection)

    def submit_sync(self, *args: P.args, **kwargs: P.kwargs) -> Task:
        """:meth:`submit`, blocking (for scripts and sync web handlers); the
        connection is a blocking ``Connection`` or ``Session``."""
        connection, own = self._connection(kwargs)
        request = self.request(args, own)
        return self.fn.app.sync_store.submit(**request, connection=connection)

    def _connection(self, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        connection, kwargs = _connection_of(kwargs)
        return (self.connection if connection is None else connection), kwargs

    def request(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of :meth:`TaskStore.submit` for one call."""
        fn = self.fn
        request: dict[str, Any] = {
            "name": fn.name,
            "payload": payload_for(args, kwargs),
            "queue": fn.queue,
            "priority": fn.priority,
            "max_attempts": fn.max_attempts,
            "backoff": fn.backoff,
        }
        if "partition" not in self.options and fn.partition is not None:
            request["partition"] = (
                fn.partition(*args, **kwargs) if callable(fn.partition) else fn.partition
            )
        if "concurrency_key" not in self.options and fn.concurrency_key is not None:
            spec = fn.concurrency_key
            key = spec(*args, **kwargs) if callable(spec) else spec
            if key is not None:
                request["concurrency_key"] = key
        request.update(self.options)
        return request


class TaskFunction(Generic[P, R]):
    """A function registered with ``@app.task``.

    Calling it runs the function directly (handy in tests); :meth:`submit` queues
    a run instead. The function receives a :class:`~conveyor.Context` first;
    ``P`` is the rest of its parameters, which :meth:`submit`, :meth:`submit_sync`
    and ``with_options(...).submit`` take, so a type checker checks their
    arguments (``R`` is what it returns). Build one with :func:`task_factory`,
    which checks the options.
    """

    def __init__(
        self,
        app: TaskHost,
        func: Callable[Concatenate[Any, P], R],
        *,
        name: str,
        queue: str,
        max_attempts: int | None,
        timeout: float | None,
        backoff: Backoff | None,
        priority: int,
        partition: PartitionSpec,
        retry_on: ExceptionTypes = (),
        no_retry_on: ExceptionTypes = (),
        concurrency_key: PartitionSpec = None,
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
        #: The flow-control key of each run: a fixed name, or a function of the
        #: arguments (see :meth:`conveyor.TaskStore.submit`).
        self.concurrency_key = concurrency_key
        #: Only these exceptions are retried (empty: all are), see
        #: :func:`conveyor.outcomes.is_retryable`.
        self.retry_on = retry_on
        #: These exceptions fail the task for good.
        self.no_retry_on = no_retry_on
        #: Coroutine functions run on the worker's event loop, others in a thread.
        self.is_async = inspect.iscoroutinefunction(func)
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", name)
        self.__qualname__ = getattr(func, "__qualname__", name)
        self.__module__ = getattr(func, "__module__", __name__)
        self.__wrapped__ = func

    def __call__(self, ctx: Any, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function now, in this process (no queue involved); ``ctx`` is
        what the worker would pass (a :class:`~conveyor.worker.Context`)."""
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
        after: Sequence[Task | str] | None = None,
        on_parent_failure: Literal["cancel", "run"] | None = None,
        batch: Any = None,
        connection: Any = None,
        concurrency_key: str | None = None,
    ) -> TaskCall[P]:
        """Submit options for one call: ``fn.with_options(partition="c7").submit(...)``.

        Options left ``None`` keep the task's defaults. ``connection`` is the
        caller's SQLAlchemy connection or session to write the task in (async for
        ``submit``, blocking for ``submit_sync``); see :meth:`TaskStore.submit`.
        ``after``, ``on_parent_failure`` and ``batch``: the task waits for others
        (see :meth:`TaskStore.submit`).
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
            "after": after,
            "on_parent_failure": on_parent_failure,
            "batch": batch,
            "concurrency_key": concurrency_key,
        }
        options = {k: val for k, val in given.items() if val is not None}
        return TaskCall(self, options, connection)

    async def submit(self, *args: P.args, **kwargs: P.kwargs) -> Task:
        """Queue one run with these arguments; returns the queued task."""
        return await TaskCall(self, {}).submit(*args, **kwargs)

    def submit_sync(self, *args: P.args, **kwargs: P.kwargs) -> Task:
        """:meth:`submit`, blocking."""
        return TaskCall(self, {}).submit_sync(*args, **kwargs)


def task_factory(
    host: TaskHost,
    *,
    name: str | None,
    queue: str,
    max_attempts: int | None,
    timeout: v.Duration | None,
    backoff: Backoff | dict[str, float] | v.Duration | None,
    priority: int,
    partition: PartitionSpec,
    retry_on: object = None,
    no_retry_on: object = None,
    concurrency_key: PartitionSpec = None,
) -> Callable[[Callable[Concatenate[Any, P], R]], TaskFunction[P, R]]:
    """Check ``@app.task``'s options now; the returned function wraps one handler.

    It does not register the result: the host does (it knows its own registry).
    """
    checked_queue = v.name("queue", queue)
    checked_max = None if max_attempts is None else v.positive_int("max_attempts", max_attempts)
    checked_timeout = (
        None if timeout is None else v.duration_seconds("timeout", timeout, allow_zero=False)
    )
    checked_backoff = v.backoff("backoff", backoff)
    checked_priority = v.integer("priority", priority)
    checked_retry_on = exception_types("retry_on", retry_on)
    checked_no_retry_on = exception_types("no_retry_on", no_retry_on)
    if isinstance(partition, str):
        v.name("partition", partition)
    elif partition is not None and not callable(partition):
        raise InvalidArgument("partition", "must be a name or a function of the arguments")
    if isinstance(concurrency_key, str):
        v.name("concurrency_key", concurrency_key)
    elif concurrency_key is not None and not callable(concurrency_key):
        raise InvalidArgument("concurrency_key", "must be a name or a function of the arguments")

    def make(fn: Callable[Concatenate[Any, P], R]) -> TaskFunction[P, R]:
        return TaskFunction(
            host,
            fn,
            name=v.name("name", name or default_task_name(fn)),
            queue=checked_queue,
            max_attempts=checked_max,
            timeout=checked_timeout,
            backoff=checked_backoff,
            priority=checked_priority,
            partition=partition,
            retry_on=checked_retry_on,
            no_retry_on=checked_no_retry_on,
            concurrency_key=concurrency_key,
        )

    return make


__all__ = [
    "PartitionSpec",
    "TaskCall",
    "TaskFunction",
    "TaskHost",
    "default_task_name",
    "payload_arguments",
    "payload_for",
    "task_factory",
]
