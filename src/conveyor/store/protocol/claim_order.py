"""The claim order, stated once: which tasks a claim takes, and in which order.

Every dialect's claim (the seam's ``claim`` hook, :meth:`conveyor.store.seam.Seam._claim`)
meets :func:`claim_order`: SQLite's chooses with :func:`choose` from the
candidates its statements read; Postgres's one statement says the same in SQL;
and a test drives both with random queue states and checks every claim against
:func:`claim_order`, which reads nothing but the rows it is given.

A claim of some queues (in one consumer group, or queue mode) chooses among
*units*:

* each **ready unpartitioned row** (queued, ``run_at`` reached) is a unit of one
  task;
* each **free stream** is a unit. A stream is the rows of one partition of one
  queue; its *head* is its first active (queued or leased) row in submit order.
  It is free when its head is queued and due and none of its rows is leased.
  Its unit is its *run*: the rows from the head on, in submit order, while they
  are queued and due, at most ``per_stream`` of them (or ``limit``).

With a ``partition``, only that partition's streams are units (no unpartitioned
rows).

Units go in **claim order**: higher priority first (a stream's is its head's);
then whoever waited longest (a row since its ``run_at``, a stream since its head
became claimable: the stream row's ``available_at``); then unpartitioned rows
before streams; then submit order (rows), or queue and partition name (streams;
by the database's collation, which is code point order under ``C``).

What a claim takes:

* without ``per_stream`` (or with a ``partition``) a claim takes one kind of
  work: the first unit's run if the first unit is a stream, else the first
  ``limit`` unpartitioned rows in order (streams passed over);
* with ``per_stream`` (and no ``partition``) it takes units in order, each
  stream's run cut to what is left of ``limit``, until ``limit`` tasks.

The tasks come back unit by unit in that order, a stream's run in submit order.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

#: The statuses of the rows a claim looks at: a stream's active rows.
QUEUED = "queued"
RUNNING = "running"

#: The unit kinds, in the order a tie between them falls.
PLAIN, STREAM = 0, 1

#: A unit's place in claim order: (-priority, waited since (µs), kind, seq of an
#: unpartitioned row (0 for a stream), queue, partition) — compared as a tuple.
Key = tuple[int, int, int, int, str, str]
#: A unit of a claim: its place in claim order, and the task seqs it would lease.
Unit = tuple[Key, list[int]]


def plain_key(priority: int, run_at: int, seq: int) -> Key:
    """The place in claim order of a ready unpartitioned row."""
    return (-priority, run_at, PLAIN, seq, "", "")


def stream_key(priority: int, since: int, queue: str, partition: str) -> Key:
    """The place in claim order of a free stream: its head's ``priority``, and
    ``since``, when that head became claimable (the stream row's ``available_at``)."""
    return (-priority, since, STREAM, 0, queue, partition)


def mixes(partition: str | None, per_stream: int | None) -> bool:
    """Whether a claim takes several units (streams and unpartitioned rows mixed)
    rather than one stream or unpartitioned rows only."""
    return per_stream is not None and partition is None


def run_cap(limit: int, per_stream: int | None) -> int:
    """The most tasks a claim takes from one stream."""
    return limit if per_stream is None else min(per_stream, limit)


def streams_wanted(limit: int, partition: str | None, per_stream: int | None) -> int:
    """The most streams a claim takes from (each gives at least one task)."""
    return limit if mixes(partition, per_stream) else 1


def choose(units: list[Unit], limit: int, mix: bool) -> list[int]:
    """The task seqs a claim leases from its candidate ``units`` (sorted here, in
    place), in claim order: with ``mix``, units in order while ``limit`` allows
    (the last stream's run cut short); without, the first unit's run if it is a
    stream, else the first ``limit`` unpartitioned rows."""
    if not units:
        return []
    units.sort(key=lambda unit: unit[0])
    if not mix:
        first_key, first_seqs = units[0]
        if first_key[2] == STREAM:
            return first_seqs[:limit]
        return [seqs[0] for key, seqs in units if key[2] == PLAIN][:limit]
    picked: list[int] = []
    for _, seqs in units:
        picked += seqs[: limit - len(picked)]
        if len(picked) >= limit:
            break
    return picked


@dataclass(frozen=True, slots=True)
class Row:
    """One delivery row as the claim order sees it (one group's view of a task)."""

    seq: int
    queue: str
    partition: str | None
    priority: int
    #: µs since the epoch, on the store's clock.
    run_at: int
    #: ``queued``, ``running`` or a terminal status.
    status: str


def free_streams(rows: Iterable[Row], now: int) -> dict[tuple[str, str], list[Row]]:
    """The free streams among ``rows`` (see the module's rules), by (queue,
    partition): each with its active rows in submit order."""
    active: dict[tuple[str, str], list[Row]] = {}
    for row in sorted(rows, key=lambda r: r.seq):
        if row.partition is not None and row.status in (QUEUED, RUNNING):
            active.setdefault((row.queue, row.partition), []).append(row)
    return {
        key: stream
        for key, stream in active.items()
        if stream[0].status == QUEUED
        and stream[0].run_at <= now
        and all(row.status != RUNNING for row in stream)
    }


def claim_order(
    rows: Iterable[Row],
    since: Mapping[tuple[str, str], int],
    *,
    queues: Collection[str],
    now: int,
    limit: int,
    partition: str | None = None,
    per_stream: int | None = None,
) -> list[int]:
    """The task seqs a claim of ``queues`` takes from ``rows`` (one group's delivery
    rows) at ``now`` (µs), in the order it returns them: the rules of this module.
    ``since`` gives, for each free stream (queue, partition), when its head became
    claimable."""
    mine = [row for row in rows if row.queue in queues]
    units: list[Unit] = []
    if partition is None:
        units += [
            (plain_key(row.priority, row.run_at, row.seq), [row.seq])
            for row in mine
            if row.partition is None and row.status == QUEUED and row.run_at <= now
        ]
    cap = run_cap(limit, per_stream)
    for (queue, part), stream in free_streams(mine, now).items():
        if partition is not None and part != partition:
            continue
        run: list[int] = []
        for row in stream[:cap]:
            if row.status != QUEUED or row.run_at > now:
                break
            run.append(row.seq)
        head = stream[0]
        units.append((stream_key(head.priority, since[(queue, part)], queue, part), run))
    return choose(units, limit, mixes(partition, per_stream))
