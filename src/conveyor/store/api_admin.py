"""The store's public API for bus mode, queue settings and upkeep (a base of
:class:`~conveyor.store.base.TaskStore`): subscribe, unsubscribe, groups, stats,
configure_queue, get_queue, recover, maintain, maintenance_history."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from conveyor import _values as v
from conveyor.errors import InvalidArgument
from conveyor.models import Backoff, ConsumerGroup, QueueStats
from conveyor.store.protocol import groups, rekey, upkeep
from conveyor.store.protocol import transactions as tx
from conveyor.store.protocol.stats import stats_tx
from conveyor.store.seam import Seam


class AdminOps(Seam):
    """Bus mode, queue settings and upkeep (a base of TaskStore)."""

    # ------------------------------------------------------------ bus mode
    async def subscribe(
        self,
        queue: str,
        group: str,
        *,
        start: Literal["all", "new"] | datetime = "all",
        _if_missing: bool = False,
    ) -> ConsumerGroup:
        """Register ``group`` on ``queue``: it receives every task from ``start`` on
        (``"all"``: the retained history; ``"new"``: tasks submitted after this call
        returns; a datetime: tasks created since then). Subscribing an active group
        again changes nothing and returns it; subscribing an unsubscribed one starts
        it over from ``start``. A claim as a group never subscribed raises
        :class:`NotFound` unless it is given ``subscribe=`` (see :meth:`claim`)."""
        queue = v.name("queue", queue)
        group = v.name("group", group)
        new, start_at = groups.parse_start("start", start)
        return await groups.subscribe(
            self, queue, group, new=new, start_at=start_at, if_missing=_if_missing
        )

    async def unsubscribe(self, queue: str, group: str) -> bool:
        """Deactivate ``group`` on ``queue`` and drop its delivery state.

        Returns whether the group was subscribed."""
        queue = v.name("queue", queue)
        group = v.name("group", group)
        self._known_groups.discard((queue, group))
        return await tx.run(self, lambda conn: groups.unsubscribe_tx(self, conn, queue, group))

    async def groups(self, queue: str | None = None) -> builtins.list[ConsumerGroup]:
        """Registered consumer groups (active and not), optionally of one queue."""
        name = None if queue is None else v.name("queue", queue)
        return await tx.run(self, lambda conn: groups.list_tx(conn, name), write=False)

    async def stats(self, queue: str | None = None) -> builtins.list[QueueStats]:
        """Per queue: counts by status (queue mode), age in seconds of the oldest
        claimable task, and per group its counts, lag (tasks not yet terminal for
        it) and oldest claimable age — one consistent snapshot, so each view's
        counts add up to its tasks even while others claim and finish them. A
        queue consumed by groups only leaves queue mode out (see
        :class:`~conveyor.models.QueueStats`)."""
        if queue is not None:
            queue = v.name("queue", queue)
        return await tx.run(self, lambda conn: stats_tx(self, conn, queue), write=False)

    # ---------------------------------------------------- settings, upkeep
    async def configure_queue(
        self,
        queue: str,
        *,
        lease: v.Duration | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | dict[str, float] | v.Duration | None = None,
        retention: v.Duration | None = None,
        max_wait: v.Duration | None = None,
        queue_mode: bool | None = None,
        dead_letter: str | None = None,
        delay: v.Duration | None = None,
        encrypt: bool | None = None,
    ) -> dict[str, Any]:
        """Store defaults for ``queue``; arguments left ``None`` keep their value.

        ``lease`` applies when a task is claimed; ``max_attempts`` and ``backoff``
        when it is submitted; ``max_wait`` evicts tasks never claimed that long
        after their run_at; ``retention`` deletes tasks that finished (for queue
        mode and every active group) that long ago — off unless set.
        ``queue_mode=False`` declares a queue consumed by groups only: its
        queue-mode state then never holds retention back.
        ``dead_letter`` names the queue a task goes to when it fails for good
        (attempts exhausted, :class:`~conveyor.Permanent`, its lease lost on the
        last attempt) or is evicted: a new task there, in the same transaction,
        with the original payload and ``metadata["dead_letter"]`` telling what
        happened, the original (its ``parent_id``) left failed or evicted; one per
        task and group. ``""`` clears it. ``delay`` is added to the run_at of
        every submit to the queue that gives neither ``delay`` nor ``run_at``
        (``0`` sets no delay). ``encrypt=True`` stores the payload, metadata,
        result, error and progress message of the queue's tasks sealed with
        AES-256-GCM from then on (see :mod:`conveyor.encryption`): a store without
        keys then refuses to submit to or claim from it (:class:`ConfigurationError`);
        ``conveyor rekey`` seals what was stored before.
        """
        queue = v.name("queue", queue)
        values = upkeep.queue_settings(
            lease=lease,
            max_attempts=max_attempts,
            backoff=backoff,
            retention=retention,
            max_wait=max_wait,
            queue_mode=queue_mode,
            dead_letter=dead_letter,
            queue=queue,
            delay=delay,
            encrypt=encrypt,
        )
        await tx.run(self, lambda conn: upkeep.configure_tx(self, conn, queue, values))
        if encrypt is not None:
            self._keyring.learn([queue], [queue] if encrypt else [])
        return await self.get_queue(queue)

    async def get_queue(self, queue: str) -> dict[str, Any]:
        """The stored settings of ``queue`` (``None`` where the default applies)."""
        queue = v.name("queue", queue)

        return await tx.run(self, lambda conn: upkeep.get_queue_tx(conn, queue), write=False)

    async def rekey(
        self,
        queue: str | None = None,
        *,
        batch: int = 500,
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Seal again under the current key (:class:`~conveyor.Encryption`'s
        ``current``) every task sealed under another one, and every task of an
        encrypted queue stored plain (submitted before the queue was set
        ``encrypt=True``), with their results, errors and progress messages; of
        ``queue`` alone when given. How many tasks were rewritten.

        In batches of ``batch`` tasks in submit order, one transaction each: a run
        cut short keeps the batches it committed, and running it again does the
        rest. ``on_batch(n)`` is called after each batch with the tasks it
        rewrote (a progress bar). Needs the keys of what it opens:
        :class:`~conveyor.DecryptionError` for a value sealed under a key this
        store lacks, :class:`~conveyor.ConfigurationError` without keys."""
        name = None if queue is None else v.name("queue", queue)
        size = v.positive_int("batch", batch)
        if on_batch is not None and not callable(on_batch):
            raise InvalidArgument("on_batch", f"must be a callable or None, got {on_batch!r}")
        return await rekey.run(self, name, size, on_batch)

    async def recover(self) -> tuple[int, int]:
        """Recover every expired lease now: ``(requeued, failed)`` counts."""
        return await tx.run(self, lambda conn: upkeep.recover_tx(self, conn, None, None))

    async def maintain(self) -> dict[str, int]:
        """One pass of upkeep: lease recovery, eviction (``max_wait``) and retention.

        Returns the counts ``{"recovered", "expired", "evicted", "deleted",
        "skipped"}`` and records them in the maintenance history. Safe to call
        from many workers at once: on Postgres one runs while the others skip
        (``skipped`` = 1); on SQLite the write lock serialises the passes.
        Retention deletes in bounded batches, each its own short transaction.
        """
        if self._engine is None:
            await self.open()
        return await upkeep.maintain(self)

    async def maintenance_history(self, limit: int = 20) -> builtins.list[dict[str, Any]]:
        """The most recent :meth:`maintain` passes, newest first.

        Each pass's counts are exact: every step adds what it did to its pass's
        row in the step's own transaction. A pass cut short (its worker stopped,
        the database went away) keeps the counts of the steps that committed and
        a ``duration`` of 0.
        """
        limit = v.positive_int("limit", limit)

        return await tx.run(self, lambda conn: upkeep.history_tx(conn, limit), write=False)
