"""The store's public API for bus mode, queue settings and upkeep (a base of
:class:`~conveyor.store.base.TaskStore`): subscribe, unsubscribe, groups, stats,
seek, configure_queue, get_queue, recover, maintain, maintenance_history."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from conveyor import _values as v
from conveyor.errors import InvalidArgument
from conveyor.models import Backoff, ConsumerGroup, QueueStats, Rate, SeekResult
from conveyor.store.protocol import groups, health, limits, pauses, rekey, seek, upkeep, wake
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

    async def seek(
        self,
        queue: str,
        group: str,
        *,
        to: datetime | Literal["start", "end"],
        partition: str | None = None,
    ) -> SeekResult:
        """Move ``group``'s position in ``queue``: replay its tasks from ``to``, or
        skip what waits before it. Queue mode and the other groups are untouched.

        Tasks created at or after ``to`` (an aware datetime; ``"start"``: every
        retained task) that have finished for the group are queued again for it
        afresh: a new budget of attempts (attempt numbers keep counting), result,
        error and progress cleared. Tasks created before ``to`` (``"end"``:
        every task) still queued for the group become ``skipped``, a terminal
        status (:meth:`retry` or ``retry_where`` queue them again). A delivery a
        worker holds is left to finish as it was: neither queued again nor
        skipped, counted in ``left_running``. ``partition`` limits the seek to
        that partition's tasks.

        FIFO holds across it: once it returns, each partition is delivered to the
        group in submit order from its earliest replayed task (a partition's
        running delivery holds it, as ever, until it finishes). The seek runs in
        batches of 500 rows, one transaction each, over the tasks the queue had
        when it started (later ones are queued as usual); a run cut short leaves
        the rest of a replay held back and is finished by calling it again. Run
        one seek of a group at a time. ``NotFound`` if the group is not
        subscribed to the queue."""
        sk = seek.target(queue, group, to, partition)
        return await seek.run(self, sk)

    async def pause(self, queue: str, *, group: str | None = None) -> bool:
        """Pause ``queue`` (every consumer of it: queue mode and each group), or
        only ``group``'s claims of it: while paused, submits are accepted and
        claims return nothing; workers keep running and pick the work up at
        :meth:`resume`. Holds for every process from the commit on, and survives
        restarts. Returns whether it was not paused so already. A ``group`` must
        be subscribed (:class:`NotFound`)."""
        queue = v.name("queue", queue)
        grp = None if group is None else v.name("group", group)
        return await tx.run(self, lambda conn: pauses.pause_tx(self, conn, queue, grp))

    async def resume(self, queue: str, *, group: str | None = None) -> bool:
        """Lift a :meth:`pause` of ``queue`` (``group`` None) or of ``group``'s
        claims of it, and wake the idle workers of the queue in every process.
        Returns whether it was paused so. A pause of the whole queue and one of a
        group are separate: resuming one leaves the other."""
        queue = v.name("queue", queue)
        grp = None if group is None else v.name("group", group)
        resumed = await tx.run(self, lambda conn: pauses.resume_tx(self, conn, queue, grp))
        if resumed:
            wake.wake(self, queues=[queue])
        return resumed

    async def groups(
        self, queue: str | None = None, *, lagging_after: v.Duration | None = None
    ) -> builtins.list[ConsumerGroup]:
        """Registered consumer groups (active and not), optionally of one queue, each
        with its health: ``lag``, ``oldest_age``, ``last_claim_at`` and ``state``
        (see :class:`~conveyor.models.ConsumerGroup`). ``lagging_after`` (seconds
        or a timedelta) is how long the oldest claimable task may wait before the
        group is ``"lagging"`` (or ``"stalled"``, when it has not claimed for that
        long either); by default ten times each queue's lease."""
        name = None if queue is None else v.name("queue", queue)
        after = (
            None
            if lagging_after is None
            else v.duration_seconds("lagging_after", lagging_after, allow_zero=False)
        )
        return await tx.run(
            self, lambda conn: health.groups_tx(self, conn, name, after), write=False, replica=True
        )

    async def stats(self, queue: str | None = None) -> builtins.list[QueueStats]:
        """Per queue: counts by status (queue mode), age in seconds of the oldest
        claimable task, and per group its counts, lag (tasks not yet terminal for
        it) and oldest claimable age — one consistent snapshot, so each view's
        counts add up to its tasks even while others claim and finish them. A
        queue consumed by groups only leaves queue mode out (see
        :class:`~conveyor.models.QueueStats`)."""
        if queue is not None:
            queue = v.name("queue", queue)
        return await tx.run(
            self, lambda conn: stats_tx(self, conn, queue), write=False, replica=True
        )

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
        max_depth: int | None = None,
        debounce: v.Duration | None = None,
        encrypt: bool | None = None,
        concurrency: int | None = None,
        key_concurrency: int | None = None,
        rate: Rate | int | None = None,
        key_rate: Rate | int | None = None,
        fair: bool | None = None,
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
        (``0`` sets no delay). ``max_depth`` is the most tasks the queue may hold
        queued (in queue mode, delayed ones included): a submit beyond it raises
        :class:`~conveyor.QueueFull` and writes nothing (``0`` clears it; not on a
        queue consumed by groups only). ``debounce`` is a quiet period: a
        partition's head is claimable only once the partition's newest task is
        that old (a burst to one partition is handled together), an unpartitioned
        task once it is itself that old (``0`` clears it).
        ``encrypt=True`` stores the payload, metadata,
        result, error and progress message of the queue's tasks sealed with
        AES-256-GCM from then on (see :mod:`conveyor.encryption`): a store without
        keys then refuses to submit to or claim from it (:class:`ConfigurationError`);
        ``conveyor rekey`` seals what was stored before.

        Flow control (see :mod:`conveyor.store.protocol.limits`), enforced in the
        database for every worker of every host: ``concurrency=N`` lets at most N
        of the queue's tasks run at once (leased, the lease not expired), per
        consumer group (queue mode is one); ``key_concurrency=N`` at most N per
        concurrency key (``submit(..., concurrency_key=...)``; tasks without one
        are not limited by it); ``rate=conveyor.Rate(limit, per=seconds)`` at
        most ``limit`` claims (starts) per ``per`` seconds, per group;
        ``key_rate`` the same per key; ``fair=True`` makes a claim take tasks
        round-robin across keys (the tasks without a key are one more), so a key
        with a long backlog delays another key's task by one claim at most.
        ``0`` clears ``concurrency``, ``key_concurrency``, ``rate`` and
        ``key_rate``; ``fair=False`` clears ``fair``.
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
            max_depth=max_depth,
            debounce=debounce,
            encrypt=encrypt,
            concurrency=concurrency,
            key_concurrency=key_concurrency,
            rate=rate,
            key_rate=key_rate,
            fair=fair,
        )
        await tx.run(self, lambda conn: upkeep.configure_tx(self, conn, queue, values))
        if encrypt is not None:
            self._keyring.learn([queue], [queue] if encrypt else [])
        settings = await self.get_queue(queue)
        limits.learn(self, queue, settings)
        return settings

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
        The pass also deletes flow control's rate state that limits nothing any
        more (a rate's or a fair turn's row whose time passed over an hour ago).
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

        return await tx.run(
            self, lambda conn: upkeep.history_tx(conn, limit), write=False, replica=True
        )
