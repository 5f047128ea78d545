"""The consumer's half of the store's public API: claiming, and the lease holder's
fenced writes (heartbeat, progress, succeed, fail, release, snooze, batch acks).

:class:`LeaseOps` is a base of :class:`~conveyor.store.base.TaskStore`; each method
validates its arguments and delegates to :mod:`.consumer` and :mod:`.acks`, where the
protocol lives.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from conveyor import _values as v
from conveyor.encryption import MARK
from conveyor.errors import ConveyorError, InvalidArgument
from conveyor.models import Task
from conveyor.store.protocol import acks, codec, consumer, groups, sealing, wake
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

#: The most tasks one claim (or one page of list()) may ask for.
MAX_LIMIT = 10_000


class LeaseOps(Seam):
    """Claim tasks and write to them while holding their lease (a base of TaskStore)."""

    #: Largest result accepted by succeed(), in bytes of JSON; None: no limit.
    max_result_size: int | None

    async def claim(
        self,
        queues: str | Sequence[str],
        *,
        worker_id: str,
        lease: v.Duration | None = None,
        limit: int = 1,
        group: str | None = None,
        partition: str | None = None,
        per_stream: int | None = None,
        subscribe: Literal["all", "new"] | datetime | None = None,
    ) -> builtins.list[Task]:
        """Lease up to ``limit`` claimable tasks, after recovering expired leases.

        Unpartitioned tasks come in claim order (priority, then run_at, then
        submit order). Partitioned tasks come in submit order, only while no
        earlier task of their stream is leased or waiting: from one stream per
        claim, or with ``per_stream`` at most that many from each of several
        streams (each stream's tasks together), until ``limit`` is used up.

        With ``group``, the group must be subscribed to each queue, else
        :class:`NotFound` says how to subscribe it: a claim never creates a group
        on its own, so a misspelt name cannot start a new group that replays the
        whole history. ``subscribe`` (``"all"``, ``"new"`` or a datetime, as
        :meth:`subscribe`'s ``start``) asks the claim to subscribe a group never
        registered, from there; an unsubscribed group stays so either way. A
        group's claim that leased something records when, for
        :meth:`groups`' ``last_claim_at`` (after the claim committed, at most
        once a second per queue and store).
        """
        names = v.names("queues", queues)
        worker_id = v.name("worker_id", worker_id)
        lease_s = None if lease is None else v.duration_seconds("lease", lease, allow_zero=False)
        limit = v.positive_int("limit", limit)
        if limit > MAX_LIMIT:
            raise InvalidArgument("limit", f"must be at most {MAX_LIMIT}, got {limit}")
        partition = v.opt_name("partition", partition)
        if per_stream is not None:
            per_stream = v.positive_int("per_stream", per_stream)
        grp = codec.group_key(group)
        if subscribe is not None:
            if group is None:
                raise InvalidArgument("subscribe", "subscribes a group: give group= too")
            groups.parse_start("subscribe", subscribe)
        # Listening before the claim looks: work announced after it is heard.
        await wake.listen(self)
        if group is not None:
            for queue in names:
                if (queue, group) not in self._known_groups:
                    await groups.join(self, queue, group, subscribe)
        claimed = await consumer.claim(
            self, grp, names, worker_id, lease_s, limit, partition, per_stream
        )
        await groups.note_claims(self, grp, claimed)
        return claimed

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

        values = consumer.heartbeat_values(lease_s)
        return await consumer.owned_write(self, task_id, worker_id, group, attempt, values)

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
            if message.startswith(MARK):
                # Stored as given, it would read as a sealed value.
                raise InvalidArgument("message", f"must not start with {MARK!r}")
            message = await sealing.sealed_write(self, task_id, "progress", message)

        values = consumer.progress_values(progress, message)
        return await consumer.owned_write(self, task_id, worker_id, group, attempt, values)

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
        encoded = v.to_json("result", result, max_size=self.max_result_size)
        return await acks.succeed(self, task_id, worker_id, group, attempt, encoded)

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
        encoded = await sealing.sealed_write(
            self, task_id, "error", v.to_json("error", envelope), forget=True
        )
        assert encoded is not None
        delay_s = None if delay is None else v.duration_seconds("delay", delay)
        grp = codec.group_key(group)
        worker_id = v.name("worker_id", worker_id)
        task_id = v.name("task_id", task_id)
        if attempt is not None:
            attempt = v.positive_int("attempt", attempt)
        task, again = await tx.run(
            self,
            lambda conn: consumer.fail_tx(
                self, conn, task_id, grp, worker_id, attempt, encoded, bool(retryable), delay_s
            ),
        )
        wake.wake_local(self, work=again)
        self._keyring.release([task_id])
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

        The run reached no outcome, so it costs the task nothing: its budget
        (``max_attempts``) grows by one. The attempt number stays — attempt numbers
        only grow, so the released run's ``attempt=`` fence never matches a later
        run. Ownership-checked like :meth:`heartbeat`; raises :class:`LostLease` if
        the lease is gone.
        """

        values = consumer.release_values
        task = await consumer.owned_write(self, task_id, worker_id, group, attempt, values)
        wake.wake_local(self, work=True)
        return task

    async def snooze(
        self,
        task_id: str,
        *,
        worker_id: str,
        delay: v.Duration,
        group: str | None = None,
        attempt: int | None = None,
    ) -> Task:
        """Put a leased task back to run again ``delay`` from now, without
        spending an attempt: ``queued`` with ``run_at`` = now + ``delay``. The
        attempt number keeps counting (it fences writes) and ``max_attempts``
        grows by one, so the attempts left are unchanged. A snoozed head of a
        partition holds its stream, like a retry. Ownership-checked like
        :meth:`heartbeat`; raises :class:`LostLease` if the lease is gone.
        """
        delay_s = v.duration_seconds("delay", delay)
        values = consumer.snooze_values(delay_s)
        task = await consumer.owned_write(self, task_id, worker_id, group, attempt, values)
        wake.wake_local(self, work=True)
        return task

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
        outcomes, todo = acks.validate_acks(items, max_size=self.max_result_size)
        if not todo:
            return [o for o in outcomes if o is not None]
        return await acks.succeed_many(self, outcomes, todo)

    async def ack_many(
        self, items: Iterable[Mapping[str, Any]], *, partitioned: bool | None = None
    ) -> builtins.list[ConveyorError | None]:
        """:meth:`succeed_many` for callers that do not need the tasks back (the
        worker's group commit): per item, in order, ``None`` when it was
        acknowledged, else the error it met. Unpartitioned tasks are finished in one
        statement where the backend allows, without reading task rows back.

        ``partitioned``: whether some item is a task of a partition, when the caller
        knows (the worker does); ``True`` goes straight to the path that also moves
        streams. It only picks the path: the outcome is the same either way."""
        outcomes, todo = acks.validate_acks(items, max_size=self.max_result_size)
        if not todo:
            return [o if isinstance(o, ConveyorError) else None for o in outcomes]
        return await acks.ack_many(self, outcomes, todo, partitioned=partitioned is True)
