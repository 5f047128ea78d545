"""The store's public API for bulk actions by filter (a base of
:class:`~conveyor.store.base.TaskStore`): retry_where, cancel_where, purge_where.

Each acts on the delivery rows of one view of one queue, queue mode
(``group=None``) or a group, that its filters select, in batches of
:data:`~conveyor.store.protocol.bulk.BATCH` rows, one transaction each, and
returns how many rows it changed (see :mod:`conveyor.store.protocol.bulk`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from conveyor.errors import InvalidArgument
from conveyor.models import Status
from conveyor.store.protocol import bulk
from conveyor.store.seam import Seam

OnBatch = Callable[[int], None]


def _on_batch(value: Any) -> OnBatch | None:
    if value is not None and not callable(value):
        raise InvalidArgument("on_batch", f"must be a callable or None, got {value!r}")
    return value  # type: ignore[no-any-return]


class BulkOps(Seam):
    """Bulk actions by filter (a base of TaskStore)."""

    async def retry_where(
        self,
        *,
        queue: str,
        group: str | None = None,
        status: Status | str | None = "failed",
        name: str | None = None,
        partition: str | None = None,
        finished_after: datetime | None = None,
        finished_before: datetime | None = None,
        limit: int | None = None,
        reset_attempts: bool = False,
        on_batch: OnBatch | None = None,
    ) -> int:
        """Queue again, as :meth:`retry` does one task, every row of ``queue`` for
        queue mode (``group=None``) or ``group`` that the filters select; how many.

        ``status`` is ``"failed"``, ``"cancelled"``, ``"evicted"`` or ``"skipped"``,
        or ``None`` for all four; ``name`` and ``partition`` match the task's;
        ``finished_after <= finished_at < finished_before`` (aware datetimes);
        ``limit`` caps the rows changed. Tasks submitted after the call started are
        left alone. Rows go back in batches of 500, each its own transaction, in
        submit order: a partition's tasks stay in it in their order. A run cut
        short keeps the batches it committed; running it again does the rest.
        ``reset_attempts`` as for :meth:`retry`; ``on_batch(n)`` is called after
        each batch with the rows it changed (a progress bar)."""
        sel = bulk.selection(
            "retry",
            queue=queue,
            group=group,
            status=status,
            name=name,
            partition=partition,
            finished_after=finished_after,
            finished_before=finished_before,
            limit=limit,
        )
        if not isinstance(reset_attempts, bool):
            raise InvalidArgument(
                "reset_attempts", f"must be True or False, got {reset_attempts!r}"
            )
        callback = _on_batch(on_batch)
        return await bulk.run(self, sel, bulk.retrying(self, reset_attempts), callback)

    async def cancel_where(
        self,
        *,
        queue: str,
        group: str | None = None,
        status: Status | str | None = None,
        name: str | None = None,
        partition: str | None = None,
        finished_after: datetime | None = None,
        finished_before: datetime | None = None,
        limit: int | None = None,
        on_batch: OnBatch | None = None,
    ) -> int:
        """Cancel every queued or running row of ``queue`` for queue mode
        (``group=None``) or ``group`` that the filters select; how many.

        Unlike :meth:`cancel`, which withdraws one task for queue mode and every
        group, this changes one view only: the other groups' rows stay as they
        are. A running row's holder learns it at its next write
        (:class:`TaskCancelled`). ``status`` narrows it to ``"queued"`` or
        ``"running"``; the ``finished_*`` filters are refused (these rows have
        not finished). Batches, ``limit`` and ``on_batch`` as for
        :meth:`retry_where`."""
        sel = bulk.selection(
            "cancel",
            queue=queue,
            group=group,
            status=status,
            name=name,
            partition=partition,
            finished_after=finished_after,
            finished_before=finished_before,
            limit=limit,
        )
        callback = _on_batch(on_batch)
        return await bulk.run(self, sel, bulk.cancelling(self), callback)

    async def purge_where(
        self,
        *,
        queue: str,
        group: str | None = None,
        status: Status | str | None = None,
        name: str | None = None,
        partition: str | None = None,
        finished_after: datetime | None = None,
        finished_before: datetime | None = None,
        limit: int | None = None,
        on_batch: OnBatch | None = None,
    ) -> int:
        """Delete the tasks of ``queue`` whose row for queue mode (``group=None``)
        or ``group`` the filters select, once every one of their rows (queue
        mode's and every group's) is finished; how many tasks.

        A task goes with its delivery rows and its idempotency key (``get`` and
        ``get_by_key`` then return ``None``), and :meth:`stats` counts it no more.
        ``status``: a terminal status, or ``None`` for any. Batches, ``limit`` (of
        tasks deleted) and ``on_batch`` as for :meth:`retry_where`."""
        sel = bulk.selection(
            "purge",
            queue=queue,
            group=group,
            status=status,
            name=name,
            partition=partition,
            finished_after=finished_after,
            finished_before=finished_before,
            limit=limit,
        )
        callback = _on_batch(on_batch)
        return await bulk.run(self, sel, bulk.purging(self), callback)
