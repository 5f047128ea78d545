"""The values conveyor hands back: tasks, pages, groups, statuses."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal


class Status(enum.StrEnum):
    """Where a task stands, for queue mode or for one consumer group."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EVICTED = "evicted"
    #: Passed over for a group by :meth:`~conveyor.TaskStore.seek`: queued for the
    #: group before the point it moved to, and never delivered there since.
    SKIPPED = "skipped"
    #: Submitted with ``after=`` (or a batch's callback): held until its parents
    #: are done (queue mode only), then queued, or cancelled when a parent fails.
    #: Never claimable; not terminal.
    WAITING = "waiting"

    def __str__(self) -> str:
        return self.value

    @property
    def terminal(self) -> bool:
        """True for the statuses a task only leaves through ``retry``."""
        return self not in (Status.QUEUED, Status.RUNNING, Status.WAITING)


TERMINAL_STATUSES = frozenset(s for s in Status if s.terminal)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry delay: ``base * factor ** (attempt - 1)``, capped at ``max``, with jitter.

    ``jitter`` is the fraction of the delay that is randomised (0.2 means the delay
    lands uniformly in [0.8 d, d]).
    """

    base: float = 1.0
    factor: float = 2.0
    max: float = 3600.0
    jitter: float = 0.2

    def as_dict(self) -> dict[str, float]:
        """The JSON form stored with the task."""
        return {"base": self.base, "factor": self.factor, "max": self.max, "jitter": self.jitter}


@dataclass(frozen=True, slots=True)
class Rate:
    """A rate limit: at most ``limit`` claims (task starts) per ``per`` seconds.

    Given to :meth:`~conveyor.TaskStore.configure_queue` as ``rate=`` (per queue
    and consumer group) or ``key_rate=`` (per concurrency key). Starts may come in
    a burst of up to ``limit`` after a quiet period, then one every
    ``per / limit`` seconds. Checked when made: ``limit`` a whole number >= 1,
    ``per`` seconds > 0 (an ``int``, ``float`` or ``timedelta``, kept as a float).
    """

    limit: int
    per: float = 1.0

    def __post_init__(self) -> None:
        from conveyor import _values as v
        from conveyor.errors import InvalidArgument

        limit, per = self.limit, self.per
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgument("Rate.limit", f"must be a whole number >= 1, got {limit!r}")
        if limit >= 2**31:
            raise InvalidArgument("Rate.limit", f"must fit in 32 bits, got {limit!r}")
        seconds = v.duration_seconds("Rate.per", per, allow_zero=False)
        object.__setattr__(self, "per", seconds)


@dataclass(frozen=True, slots=True)
class Task:
    """An immutable snapshot of a task as seen by queue mode or by one group."""

    id: str
    name: str
    queue: str
    partition: str | None
    payload: Any
    metadata: dict[str, Any]
    priority: int
    status: Status
    attempt: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    lease_expires_at: datetime | None
    worker_id: str | None
    progress: float | None
    progress_message: str | None
    result: Any
    error: dict[str, Any] | None
    key: str | None
    parent_id: str | None
    root_id: str
    correlation_id: str | None
    group: str | None = None
    #: Seconds the current (or last) lease was granted for: what a holder's
    #: heartbeats must keep ahead of. ``None`` before the first claim.
    lease: float | None = None

    @property
    def terminal(self) -> bool:
        """True when the task has finished for this view (queue mode or group)."""
        return self.status.terminal

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (times as ISO 8601 strings)."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, Status):
                value = value.value
            out[name] = value
        return out


@dataclass(frozen=True, slots=True)
class Page:
    """One page of :meth:`TaskStore.list`; pass ``next_cursor`` back for the next."""

    items: list[Task]
    next_cursor: str | None


#: The health of a consumer group (:attr:`ConsumerGroup.state`).
GroupState = Literal["ok", "lagging", "stalled"]


@dataclass(frozen=True, slots=True)
class ConsumerGroup:
    """A registered consumer group of one queue, and its health as
    :meth:`TaskStore.groups` read it.

    ``lag`` is the number of tasks not yet terminal for the group (queued or
    running: the same number as ``stats()``'s :attr:`GroupStats.lag`).
    ``oldest_age`` is how many seconds ago the oldest of its queued, due tasks
    became claimable for it (its run_at, the moment the group subscribed for a
    task older than the group, or for a partitioned task the moment it became its
    stream's free head); ``None`` when none is claimable. ``last_claim_at`` is when
    a claim of the group last leased a task, to about a second (claims record it
    at most once a second per store); ``None`` if none has since it subscribed.

    ``state`` is ``"ok"``; ``"lagging"`` when the oldest claimable task has waited
    longer than the threshold (``groups(lagging_after=...)``, by default ten
    times the queue's lease) while the group still claims; ``"stalled"`` when it
    has waited that long and no claim of the group leased anything for that long
    either (or ever). An unsubscribed group has no work: ``lag`` 0 and ``"ok"``.
    The defaults are what a group with no work reads as.
    """

    queue: str
    name: str
    start: datetime | None
    created_at: datetime
    active: bool
    lag: int = 0
    oldest_age: float | None = None
    last_claim_at: datetime | None = None
    state: GroupState = "ok"
    #: Its claims lease nothing: it, or its whole queue, is paused (:meth:`TaskStore.pause`).
    paused: bool = False


@dataclass(frozen=True, slots=True)
class SeekResult:
    """What :meth:`~conveyor.TaskStore.seek` did to one group's rows.

    ``requeued``: finished rows from the seek point on, queued again afresh;
    ``skipped``: rows queued before it, now ``skipped``; ``left_running``: rows
    leased to a worker when the seek came to them, left to finish as they were.
    """

    queue: str
    group: str
    partition: str | None
    requeued: int
    skipped: int
    left_running: int

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "queue": self.queue,
            "group": self.group,
            "partition": self.partition,
            "requeued": self.requeued,
            "skipped": self.skipped,
            "left_running": self.left_running,
        }


@dataclass(frozen=True, slots=True)
class QueueStats:
    """What :meth:`TaskStore.stats` reports for one queue.

    ``counts`` and ``oldest_claimable_age`` are queue mode's. On a queue consumed
    by groups only (``configure_queue(queue_mode=False)``) queue mode is left out:
    ``queue_mode`` is False, ``counts`` empty and ``oldest_claimable_age`` None.
    ``paused``: the whole queue is paused (:meth:`TaskStore.pause`); a paused
    group shows in its own :class:`GroupStats`.
    """

    queue: str
    counts: dict[str, int]
    oldest_claimable_age: float | None
    groups: dict[str, GroupStats] = field(default_factory=dict)
    queue_mode: bool = True
    paused: bool = False

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "queue": self.queue,
            "counts": dict(self.counts),
            "oldest_claimable_age": self.oldest_claimable_age,
            "groups": {name: g.as_dict() for name, g in self.groups.items()},
            "queue_mode": self.queue_mode,
            "paused": self.paused,
        }


@dataclass(frozen=True, slots=True)
class GroupStats:
    """Per-group numbers inside :class:`QueueStats`. ``paused``: the group's
    claims lease nothing (it is paused, or its whole queue is)."""

    counts: dict[str, int]
    lag: int
    oldest_claimable_age: float | None
    paused: bool = False

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "counts": dict(self.counts),
            "lag": self.lag,
            "oldest_claimable_age": self.oldest_claimable_age,
            "paused": self.paused,
        }


@dataclass(frozen=True, slots=True)
class WorkerLeases:
    """A live worker and the leases it holds (see :meth:`TaskStore.workers`).

    A worker is live while its announcement (:meth:`TaskStore.announce_worker`,
    which every :class:`~conveyor.worker.Worker` makes) has not expired, or while
    it holds a lease. ``last_seen`` is the latest of its announcement, claims and
    heartbeats. ``queues``, ``group``, ``concurrency``, ``host``, ``pid`` and
    ``started_at`` are what it announced; empty or ``None`` for a worker known
    only by its leases (one that claims through the store's methods itself).
    """

    worker_id: str
    tasks: list[Task]
    last_seen: datetime
    queues: list[str] = field(default_factory=list)
    group: str | None = None
    concurrency: int | None = None
    host: str | None = None
    pid: int | None = None
    started_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (times as ISO 8601 strings, each held task as a dict)."""
        return {
            "worker_id": self.worker_id,
            "host": self.host,
            "pid": self.pid,
            "queues": list(self.queues),
            "group": self.group,
            "concurrency": self.concurrency,
            "started_at": None if self.started_at is None else self.started_at.isoformat(),
            "last_seen": self.last_seen.isoformat(),
            "tasks": [t.as_dict() for t in self.tasks],
        }


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """One ordered stream (queue, group, partition) and what holds it up.

    ``depth`` counts its queued and running tasks; ``head`` is its first one.
    ``blocked`` says why the head cannot be claimed now: ``"leased"`` (a worker
    holds it), ``"retry"`` (waiting for its retry), ``"run_at"`` (not due yet),
    or ``None`` when it is free. ``until`` is when that wait ends, where known.
    """

    queue: str
    group: str | None
    partition: str
    depth: int
    head: Task | None
    blocked: str | None
    until: datetime | None


@dataclass(frozen=True, slots=True)
class StreamReport:
    """The busiest and the most-blocked streams of a queue (see :meth:`TaskStore.streams`)."""

    busiest: list[StreamInfo]
    blocked: list[StreamInfo]


@dataclass(frozen=True, slots=True)
class ThroughputPoint:
    """Tasks that finished in one minute, by terminal status."""

    minute: datetime
    counts: dict[str, int]


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """A batch's progress (:meth:`~conveyor.TaskStore.get_batch`), or the summary
    its callback reads (:meth:`~conveyor.worker.Context.batch_summary`).

    ``total``: tasks submitted into it; ``counts``: how many are in each status;
    ``succeeded``, ``failed`` (failed or evicted) and ``cancelled``: their ids;
    ``closed``: no task may join it any more; ``callback_id`` and
    ``callback_status``: the task submitted with ``on_complete``, queued once the
    batch is closed and every task of it is terminal.
    """

    id: str
    queue: str
    closed: bool
    total: int
    counts: dict[str, int]
    callback_id: str
    callback_status: Status
    created_at: datetime
    succeeded: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """Closed, and every task of it terminal."""
        return self.closed and all(Status(s).terminal for s in self.counts if self.counts[s])

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "id": self.id,
            "queue": self.queue,
            "closed": self.closed,
            "total": self.total,
            "counts": dict(self.counts),
            "callback_id": self.callback_id,
            "callback_status": self.callback_status.value,
            "created_at": self.created_at.isoformat(),
            "succeeded": list(self.succeeded),
            "failed": list(self.failed),
            "cancelled": list(self.cancelled),
        }
