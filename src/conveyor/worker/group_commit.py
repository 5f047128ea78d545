"""Group commit for successes (see :class:`Acks`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from conveyor.errors import ConveyorError, StoreUnavailable
from conveyor.models import Task
from conveyor.store.base import TaskStore


class Acks:
    """Group commit for successes: finished tasks are acknowledged together.

    The first finisher becomes the leader and writes every success queued so
    far in one transaction (:meth:`TaskStore.ack_many`: one statement where the
    backend allows, still fenced per task, no task rows read back), and again for
    those that arrived meanwhile, until none are left. Under load one commit serves
    many tasks; alone, a task is acknowledged at once.
    """

    def __init__(self, store: TaskStore, worker_id: str, group: str | None) -> None:
        self.store = store
        self.worker_id = worker_id
        self.group = group
        self.pending: list[tuple[Task, Any, asyncio.Future[ConveyorError | None]]] = []
        self.leading = False
        #: Told the size of each acknowledgement batch (the worker's metrics).
        self.observe: Callable[[int], None] = _ignore

    async def succeed(self, task: Task, result: Any) -> None:
        """Acknowledge ``task``; raises what its own write met (LostLease, ...)."""
        future: asyncio.Future[ConveyorError | None] = asyncio.get_running_loop().create_future()
        self.pending.append((task, result, future))
        if not self.leading:
            self.leading = True
            try:
                while self.pending:
                    batch, self.pending = self.pending, []
                    await self._flush(batch)
            finally:
                self.leading = False
                for _, _, waiting in self.pending:  # only if the leader was cancelled
                    if not waiting.done():
                        waiting.set_exception(StoreUnavailable("acknowledgement interrupted"))
                self.pending = []
        outcome = await future
        if outcome is not None:
            raise outcome

    async def _flush(
        self, batch: list[tuple[Task, Any, asyncio.Future[ConveyorError | None]]]
    ) -> None:
        self.observe(len(batch))
        try:
            # The store's claim gave us these tasks: only their results need checking.
            outcomes = await self.store.internal.ack_claimed(
                [(task, result) for task, result, _ in batch],
                self.worker_id,
                self.group,
                partitioned=any(task.partition is not None for task, _, _ in batch),
            )
        except Exception as exc:
            # Every waiter, the leader included, gets the error from its own future:
            # raising it here as well would leave the leader's future unretrieved.
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:
            # The leader was cancelled mid-write: the others were not, and retry.
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(StoreUnavailable("acknowledgement interrupted"))
            raise
        for (_, _, future), outcome in zip(batch, outcomes, strict=True):
            if not future.done():
                future.set_result(outcome)


def _ignore(size: int) -> None:
    pass


__all__ = ["Acks"]
