"""The store's public API for task dependencies and batches (a base of
:class:`~conveyor.store.base.TaskStore`): ``batch``, ``get_batch``,
``parent_results``; ``submit(..., after=..., batch=...)`` is the producer's.

See :mod:`conveyor.store.protocol.dependencies` for how a waiting task is
released.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping
from typing import Any

from conveyor import _values as v
from conveyor.errors import InvalidArgument
from conveyor.models import Task
from conveyor.store.protocol import dependencies
from conveyor.store.protocol.dependencies import BatchInfo
from conveyor.store.protocol.requests import prepare
from conveyor.store.seam import Seam

#: The submit() arguments a batch's callback may not take: it waits for the
#: batch, not for parents of its own, and is queue mode's.
_NOT_FOR_CALLBACK = ("after", "on_parent_failure", "batch", "partition", "key")


class Batch:
    """An open batch (:meth:`DependencyOps.batch`): tasks submitted into it
    (:meth:`submit`, :meth:`submit_many`, or ``store.submit(..., batch=b)``) are
    counted in; once it is closed (:meth:`close`, or leaving ``async with``) and
    every one of them is terminal, its callback task is queued, exactly once.
    The callback reads what became of them with ``ctx.batch_summary()`` (or
    :meth:`~DependencyOps.get_batch`).
    """

    def __init__(self, store: DependencyOps, batch_id: str, callback: Task) -> None:
        self._store = store
        #: The batch's id (for :meth:`~DependencyOps.get_batch`).
        self.id = batch_id
        #: The callback task as written (``waiting``).
        self.callback = callback

    async def submit(self, name: str, payload: Any = None, **options: Any) -> Task:
        """``store.submit(name, payload, batch=self, **options)``; the batch's
        queue unless ``queue=`` says otherwise."""
        options.setdefault("queue", self.callback.queue)
        submit: Any = getattr(self._store, "submit")  # noqa: B009 - the mixin's host
        task: Task = await submit(name, payload, batch=self, **options)
        return task

    async def submit_many(self, requests: Iterable[Mapping[str, Any]]) -> list[Task]:
        """``store.submit_many`` of ``requests``, each into this batch (the batch's
        queue unless a request says otherwise)."""
        reqs = [{"queue": self.callback.queue, **r, "batch": self} for r in requests]
        submit_many: Any = getattr(self._store, "submit_many")  # noqa: B009
        tasks: list[Task] = await submit_many(reqs)
        return tasks

    async def close(self) -> None:
        """No task may join any more; the callback is queued as soon as every task
        of the batch is terminal (now, if they are). Closing twice is harmless."""
        await dependencies.close_batch(self._store, self.id)

    async def info(self) -> BatchInfo:
        """The batch's progress now (:meth:`DependencyOps.get_batch`)."""
        found = await dependencies.get_batch(self._store, self.id)
        assert found is not None  # a batch row is deleted only with its callback
        return found

    async def __aenter__(self) -> Batch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        # Closed also when the block raised: the tasks already submitted are
        # durable and will run; the callback then sees what they came to.
        await self.close()

    def __repr__(self) -> str:
        return f"Batch(id={self.id!r}, callback={self.callback.id!r})"


class OpeningBatch:
    """What :meth:`DependencyOps.batch` returns: await it for the :class:`Batch`,
    or use it as ``async with store.batch(...) as b:`` (closed on exit)."""

    def __init__(self, store: DependencyOps, name: str, payload: Any, options: dict[str, Any]):
        self._store, self._name, self._payload, self._options = store, name, payload, options
        self._batch: Batch | None = None

    async def _open(self) -> Batch:
        request = {"name": self._name, "payload": self._payload, **self._options}
        callback = prepare(request, max_size=getattr(self._store, "max_payload_size", None))
        batch_id, task = await dependencies.open_batch(self._store, callback)
        self._batch = Batch(self._store, batch_id, task)
        return self._batch

    def __await__(self) -> Generator[Any, None, Batch]:
        return self._open().__await__()

    async def __aenter__(self) -> Batch:
        return await self._open()

    async def __aexit__(self, *exc: object) -> None:
        assert self._batch is not None
        await self._batch.close()


class DependencyOps(Seam):
    """Batches and what a task's parents returned (a base of TaskStore)."""

    def batch(
        self,
        on_complete: str | tuple[str, Any],
        *,
        queue: str = "default",
        **options: Any,
    ) -> OpeningBatch:
        """Open a batch whose callback is the task ``on_complete`` (a task name,
        or ``(name, payload)``), submitted now on ``queue`` (with any other
        :meth:`submit` ``options``: ``priority``, ``max_attempts``, ``metadata``…)
        and held ``waiting`` until the batch is closed and every task submitted
        into it is terminal, whether it succeeded or not; then queued, once.
        ``queue`` is also where :meth:`Batch.submit` puts tasks by default.

        ``b = await store.batch(...)`` then ``await b.close()``, or
        ``async with store.batch(...) as b:`` (closed when the block ends). A
        batch that is never closed never runs its callback."""
        if isinstance(on_complete, tuple):
            if len(on_complete) != 2:
                raise InvalidArgument("on_complete", "must be a task name or (name, payload)")
            name, payload = on_complete
        else:
            name, payload = on_complete, None
        for option in _NOT_FOR_CALLBACK:
            if option in options:
                raise InvalidArgument(option, "is not an option of a batch's callback")
        return OpeningBatch(self, name, payload, {"queue": queue, **options})

    async def get_batch(self, batch_id: str) -> BatchInfo | None:
        """A batch's progress (:class:`~conveyor.BatchInfo`: its tasks by status,
        whether it is closed, its callback and the callback's status); ``None``
        if there is no such batch (or retention deleted its callback)."""
        return await dependencies.get_batch(self, v.name("batch_id", batch_id))

    async def parent_results(self, task_id: str) -> dict[str, Any]:
        """The result of each parent of ``task_id`` (the tasks it was submitted
        ``after``, or a batch callback's tasks), by parent id, in submit order:
        ``None`` for a parent that did not succeed. :class:`NotFound` if there is
        no such task."""
        parents = await dependencies.parents_of(self, v.name("task_id", task_id))
        return {pid: p.result if p.status == "succeeded" else None for pid, p in parents.items()}

    async def batch_of_callback(self, task_id: str) -> BatchInfo | None:
        """The batch whose callback is ``task_id`` (what ``ctx.batch_summary()``
        reads); ``None`` for a task that is no batch's callback."""
        return await dependencies.batch_of(self, v.name("task_id", task_id))

    async def dependency_graph(
        self, task_id: str, *, limit: int = 200
    ) -> tuple[dict[str, Task], list[tuple[str, str]]]:
        """The dependency graph around ``task_id`` (its ancestors and descendants
        through ``after`` and batch edges), at most ``limit`` tasks, nearest first:
        the tasks by id and the edges as ``(parent_id, child_id)``; empty for a
        task without any."""
        return await dependencies.graph(
            self, v.name("task_id", task_id), limit=v.positive_int("limit", limit)
        )

    async def parents(self, task_id: str) -> list[Task]:
        """The parents of ``task_id`` as queue mode sees them, in submit order."""
        return list((await dependencies.parents_of(self, v.name("task_id", task_id))).values())


__all__ = ["Batch", "BatchInfo", "DependencyOps", "OpeningBatch"]
