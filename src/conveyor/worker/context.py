"""A handler's side of the worker: the :class:`Context` it receives first, and
how it is called (:func:`start_handler`)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from conveyor.models import BatchInfo, Task
from conveyor.store.base import TaskStore
from conveyor.store.protocol import dependencies
from conveyor.task_functions import TaskCall, TaskFunction, TaskHost, payload_for

T = TypeVar("T")

FROM_THREAD_TIMEOUT = 60.0  # a sync handler's ctx call waits this long for the loop


class Context:
    """What a handler receives first: the claimed task and ways to report on it.

    Coroutine handlers use ``await ctx.progress(...)`` and ``await
    ctx.submit_child(...)``. Plain (sync) handlers run in a thread and use the
    blocking twins :meth:`progress_sync` and :meth:`submit_child_sync`, which
    carry the call over to the worker's event loop.
    """

    def __init__(
        self,
        task: Task,
        *,
        host: TaskHost,
        store: TaskStore,
        worker_id: str,
        group: str | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._task = task
        self._host = host
        self._store = store
        self._worker_id = worker_id
        self._group = group
        self._loop = loop

    @property
    def task(self) -> Task:
        """The claimed task (``ctx.task.attempt`` tells which attempt this is)."""
        return self._task

    @property
    def worker_id(self) -> str:
        """The id of the worker running this task."""
        return self._worker_id

    @property
    def store(self) -> TaskStore:
        """The store the worker claims from."""
        return self._store

    async def progress(self, fraction: float | None = None, message: str | None = None) -> None:
        """Record progress (a fraction in [0, 1]) and/or a message.

        Raises :class:`LostLease` (or :class:`TaskCancelled`) when the task is no
        longer this worker's; let it propagate and the worker drops the task.
        """
        task = self._task
        await self._store.progress(
            task.id,
            worker_id=self._worker_id,
            progress=fraction,
            message=message,
            group=self._group,
            attempt=task.attempt,
        )

    async def submit_child(
        self, task: TaskFunction[Any, Any] | TaskCall[Any] | str, *args: Any, **kwargs: Any
    ) -> Task:
        """Submit a task whose parent is this one (``parent_id``/``root_id`` set,
        ``correlation_id`` inherited). ``task`` is a task function, one with
        options bound, or a task name (a name unknown to the app goes to the
        ``default`` queue)."""
        if isinstance(task, str):
            known = self._host.tasks.get(task)
            call: TaskCall[Any] | None = None if known is None else TaskCall(known, {})
        elif isinstance(task, TaskFunction):
            call = TaskCall(task, {})
        else:
            call = task
        parent = self._task
        if call is None:
            assert isinstance(task, str)
            request: dict[str, Any] = {"name": task, "payload": payload_for(args, kwargs)}
        else:
            request = call.request(args, kwargs)
        request["parent"] = parent.id
        if request.get("correlation_id") is None and parent.correlation_id is not None:
            request["correlation_id"] = parent.correlation_id
        return await self._store.submit(**request)

    async def parent_results(self) -> dict[str, Any]:
        """The result of each task this one was submitted ``after`` (for a batch's
        callback: of each task of the batch), by task id, in submit order;
        ``None`` for one that did not succeed (``on_parent_failure="run"``)."""
        return await self._store.parent_results(self._task.id)

    async def batch_summary(self) -> BatchInfo | None:
        """For a batch's callback, what became of the batch's tasks
        (:class:`~conveyor.BatchInfo`: ``succeeded``, ``failed``, ``cancelled``
        ids and counts by status); ``None`` for any other task."""
        return await dependencies.batch_of(self._store, self._task.id)

    def parent_results_sync(self) -> dict[str, Any]:
        """:meth:`parent_results` for a sync handler (called from its thread)."""
        return self._from_thread(self.parent_results())

    def batch_summary_sync(self) -> BatchInfo | None:
        """:meth:`batch_summary` for a sync handler (called from its thread)."""
        return self._from_thread(self.batch_summary())

    def progress_sync(self, fraction: float | None = None, message: str | None = None) -> None:
        """:meth:`progress` for a sync handler (called from its thread)."""
        self._from_thread(self.progress(fraction, message))

    def submit_child_sync(
        self, task: TaskFunction[Any, Any] | TaskCall[Any] | str, *args: Any, **kwargs: Any
    ) -> Task:
        """:meth:`submit_child` for a sync handler (called from its thread)."""
        return self._from_thread(self.submit_child(task, *args, **kwargs))

    def _from_thread(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            coro.close()
            raise RuntimeError("on the worker's event loop, await the async method instead")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(FROM_THREAD_TIMEOUT)


def start_handler(
    fn: TaskFunction[Any, Any], ctx: Context, args: list[Any], kwargs: dict[str, Any]
) -> asyncio.Future[Any]:
    """Start one run of ``fn``: a coroutine handler on this loop, a plain one in a
    thread of its own. Whatever the call raises, even before the handler's first
    line (wrong arguments, say), comes out of the returned future, so every
    failure takes the same path."""
    if fn.is_async:
        return asyncio.ensure_future(_call_async(fn.func, ctx, args, kwargs))
    return in_thread(fn.func, ctx, *args, **kwargs)


def call_async(
    fn: TaskFunction[Any, Any], ctx: Context, args: list[Any], kwargs: dict[str, Any]
) -> Coroutine[Any, Any, Any]:
    """One run of the coroutine handler ``fn``, to await in the caller's own task
    (no task of its own: the worker's runner of an unpartitioned task is that
    task's alone). Like :func:`start_handler`, wrong arguments raise from the
    await, not from this call."""
    return _call_async(fn.func, ctx, args, kwargs)


async def _call_async(
    func: Callable[..., Any], ctx: Context, args: list[Any], kwargs: dict[str, Any]
) -> Any:
    # Calling a coroutine function checks its arguments: do it inside the task.
    return await func(ctx, *args, **kwargs)


def in_thread(func: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
    """Run ``func`` in a new daemon thread; a future of its result on this loop.

    Not ``asyncio.to_thread``: a timed-out handler cannot be stopped, and in the
    shared executor it would hold a slot (and keep the interpreter from exiting)
    until it returns. A daemon thread of its own blocks neither.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():  # timed out or cancelled meanwhile: nobody is listening
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def target() -> None:
        try:
            result = context.run(func, *args, **kwargs)
        except BaseException as exc:
            outcome: tuple[T | None, BaseException | None] = (None, exc)
        else:
            outcome = (result, None)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop is gone (the worker exited): drop it
            pass

    threading.Thread(target=target, name="conveyor-task", daemon=True).start()
    return future


__all__ = ["FROM_THREAD_TIMEOUT", "Context", "in_thread", "start_handler"]
