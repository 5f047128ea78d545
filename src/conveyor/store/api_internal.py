"""The store's internal API: what conveyor's own worker, scheduler and CLI call
beyond the public API, as ``store.internal`` (see :class:`Internal`).

These methods are not part of the public API: they are not covered by semantic
versioning and may change or go in any release. Applications use the public
methods of :class:`~conveyor.store.base.TaskStore`; code of conveyor outside
the store package uses these instead of reaching into the store's private
attributes (a test holds it to that).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from conveyor import _values as v
from conveyor.errors import ConveyorError, InvalidArgument
from conveyor.models import SeekResult, Task
from conveyor.store.protocol import acks, bulk, codec, groups, rekey, schedules, seek, upkeep
from conveyor.store.protocol import transactions as tx
from conveyor.store.protocol.schedules import Handled, Registration, ScheduleInfo

if TYPE_CHECKING:
    from conveyor.store.base import TaskStore


class Internal:
    """The internal methods of one store (``store.internal``), for conveyor's
    own worker, scheduler and CLI. Not covered by semantic versioning: each may
    change or go in any release."""

    def __init__(self, store: TaskStore) -> None:
        self._store = store

    # -------------------------------------------------------------- worker
    async def ack_claimed(
        self,
        done: Sequence[tuple[Task, Any]],
        worker_id: str,
        group: str | None,
        *,
        partitioned: bool,
    ) -> builtins.list[ConveyorError | None]:
        """Internal, for conveyor's worker (its group commit); not covered by
        semver. :meth:`~TaskStore.ack_many` for tasks this store's
        :meth:`~TaskStore.claim` returned to ``worker_id``: ``done`` pairs them
        with their results. The ids, worker and group were checked when they were
        claimed, so only each result is encoded and held to ``max_result_size``
        (an error in its place, as :meth:`~TaskStore.ack_many` gives)."""
        st = self._store
        grp = codec.group_key(group)
        outcomes: builtins.list[Task | ConveyorError | None] = []
        todo: builtins.list[acks.AckItem] = []
        for i, (task, result) in enumerate(done):
            try:
                encoded = v.to_json("result", result, max_size=st.max_result_size)
            except InvalidArgument as exc:
                outcomes.append(exc)
                continue
            outcomes.append(None)
            todo.append((i, task.id, worker_id, grp, task.attempt, encoded))
        if not todo:
            return [o if isinstance(o, ConveyorError) else None for o in outcomes]
        return await acks.ack_many(st, outcomes, todo, partitioned=partitioned)

    async def join_groups(
        self,
        queues: Sequence[str],
        group: str,
        subscribe: Literal["all", "new"] | datetime | None = None,
    ) -> None:
        """Internal, for conveyor's worker (before its first claim); not covered by
        semver. The group check of :meth:`~TaskStore.claim` without claiming:
        ``group`` must be subscribed to each of ``queues`` (subscribed first where
        ``subscribe`` asks), else :class:`~conveyor.errors.NotFound` says how to
        subscribe it. Checked once per store and pair, as claims do."""
        st = self._store
        names = v.names("queues", queues)
        group = v.name("group", group)
        for queue in names:
            if (queue, group) not in st._known_groups:
                await groups.join(st, queue, group, subscribe)

    def flow_controlled(self, queues: Sequence[str]) -> bool:
        """Internal, for conveyor's worker; not covered by semver. Whether any of
        ``queues`` was flow-controlled when this store last claimed from it
        (:mod:`conveyor.store.protocol.limits`): an empty claim there may mean the
        queue is at its limit, not that it has no work."""
        limited = self._store._limited
        return any(queue in limited for queue in queues)

    async def maintain_at_start(self) -> dict[str, int]:
        """Internal, for conveyor's worker (its first maintenance pass); not
        covered by semver. :meth:`~TaskStore.maintain` without retention, the
        roll-up of finished rows and idle streams, which wait for the next pass
        (see :func:`conveyor.store.protocol.upkeep.maintain`)."""
        st = self._store
        await st.open()
        return await upkeep.maintain(st, housekeeping=False)

    # ----------------------------------------------------------------- CLI
    async def count_where(
        self,
        action: Literal["retry", "cancel", "purge"],
        *,
        queue: str,
        group: str | None = None,
        status: str | None = None,
        name: str | None = None,
        partition: str | None = None,
        finished_after: datetime | None = None,
        finished_before: datetime | None = None,
        limit: int | None = None,
    ) -> int:
        """Internal, for ``conveyor tasks ... --dry-run`` and the dashboard's
        confirmation; not covered by semver. How many rows ``retry_where``,
        ``cancel_where`` or ``purge_where`` (``action``) with these filters would
        change now (tasks, for a purge), at most ``limit``; writes nothing.
        ``status=None`` means every status the action applies to."""
        if action not in bulk.STATUSES:
            raise InvalidArgument("action", f"must be retry, cancel or purge, got {action!r}")
        sel = bulk.selection(
            action,
            queue=queue,
            group=group,
            status=status,
            name=name,
            partition=partition,
            finished_after=finished_after,
            finished_before=finished_before,
            limit=limit,
        )
        return await tx.run(self._store, lambda conn: bulk.count_tx(conn, sel), write=False)

    async def preview_seek(
        self,
        queue: str,
        group: str,
        *,
        to: datetime | Literal["start", "end"],
        partition: str | None = None,
    ) -> SeekResult:
        """Internal, for the dashboard's confirmation of a seek; not covered by
        semver. What :meth:`~TaskStore.seek` with these arguments would do now
        (rows queued again, skipped, left running); writes nothing."""
        sk = seek.target(queue, group, to, partition)
        return await tx.run(self._store, lambda conn: seek.preview_tx(sk, conn), write=False)

    async def count_rekey(self, queue: str | None = None) -> int:
        """Internal, for ``conveyor rekey`` (its progress bar); not covered by
        semver. How many tasks :meth:`~conveyor.store.base.TaskStore.rekey` would
        rewrite now; writes nothing."""
        name = None if queue is None else v.name("queue", queue)
        return await rekey.count(self._store, name)

    def show_sealed(self) -> None:
        """Internal, for the dashboard; not covered by semver. From now on a value
        this store cannot open reads as :data:`conveyor.encryption.ENCRYPTED`
        instead of raising :class:`~conveyor.DecryptionError` (what it can open
        reads as always)."""
        self._store._keyring.show_sealed = True

    # ----------------------------------------------------------- scheduler
    async def schedules(self) -> builtins.list[ScheduleInfo]:
        """Internal, for conveyor's scheduler and ``conveyor schedules``; not
        covered by semver. Every registered periodic schedule, by name."""
        return await schedules.list_all(self._store)

    async def read_schedules(
        self,
        names: Sequence[str],
        *,
        now: datetime | None = None,
        register: Callable[[datetime], Sequence[Registration]] | None = None,
    ) -> tuple[datetime, dict[str, ScheduleInfo]]:
        """Internal, for conveyor's scheduler (the start of a pass); not covered
        by semver. ``(moment, {name: row})`` for the schedules ``names``, read in
        one transaction: ``moment`` is ``now`` or else the store's clock read in
        that transaction. ``register``, given the moment, returns the schedules to
        register first (new ones inserted, known ones' descriptions refreshed)."""
        return await schedules.read(self._store, names, now, register)

    async def record_schedules(self, marks: Sequence[Handled]) -> None:
        """Internal, for conveyor's scheduler (the end of a pass); not covered by
        semver. Record how far each schedule is handled, in one transaction on
        the store's clock; never moves a schedule back (a faster scheduler's
        record stands)."""
        await schedules.record(self._store, marks)


__all__ = ["Handled", "Internal", "Registration", "ScheduleInfo"]
