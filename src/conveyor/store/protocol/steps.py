"""Claim and submit step by step, each step a statement built once.

A dialect without a one-statement claim (SQLite: no data-modifying CTEs, no
arrays) runs it as several statements in one transaction. Built with SQLAlchemy
Core on every call, those statements cost far more client time than the database
spends on them; here each is built once per store
(:mod:`conveyor.store.protocol.texts`), with the per-call values as named bind
parameters. The claim makes the choice :func:`.consumer.claim_tx` makes, but as
sets: a fixed number of statements however many streams it takes (the dialect
supplies the texts that read candidates and take lists; the choice is
:func:`choose`, here).

Lease recovery is off the claim path: a claim's candidates read also asks
whether any lease of this queue has expired, and recovers only when one has, so
an expired lease is still recovered by the next claim of its queue.

Covered: claims of one queue (plain work and streams), and the submit of plain
tasks, one (:func:`.producer.submit_one_tx`) or many
(:func:`.producer.submit_plain_tx`). The rest (several queues at once; keys,
partitions, parents) takes the Core path.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sqlalchemy import bindparam
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.errors import InvalidArgument
from conveyor.models import Task
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import streams, texts, upkeep
from conveyor.store.protocol.requests import Request
from conveyor.store.seam import Seam

#: Bind parameters of the built-once steps (typed ``Any``: they stand where the
#: Core builders of :mod:`conveyor.store.protocol.queries` take Python values).
_GRP: Any = bindparam("grp")
_QUEUE: Any = bindparam("queue")

#: The task columns a submit writes (the rest take their defaults).
_TASK_COLUMNS = (
    "id",
    "name",
    "queue",
    "partition",
    "payload",
    "metadata",
    "priority",
    "max_attempts",
    "backoff",
    "created_at",
    "run_at",
    "key",
    "parent_id",
    "root_id",
    "correlation_id",
)


def insert_params(row: dict[str, Any]) -> dict[str, Any]:
    """The parameters of ``step_submit_insert`` for a task row (named apart from the
    columns: a bind parameter may not share a column's name in VALUES)."""
    return {f"v_{name}": row[name] for name in _TASK_COLUMNS}


async def refresh_after(st: Seam, conn: AsyncConnection, after: int) -> None:
    """Recompute the streams the delivery rows of the tasks above ``after`` joined
    (those this transaction inserted, under the single writer lock), read with the
    built ``step_touched_after``; a missing stream row is created."""
    touched = st._texts.get("step_touched_after") if st._texts is not None else None
    assert touched is not None
    rows = await texts.execute(conn, st, touched, {"after": after})
    await streams.refresh(st, conn, [tuple(row) for row in rows])


async def parent_roots(st: Seam, conn: AsyncConnection, reqs: list[Request]) -> dict[str, str]:
    """The root of each parent of ``reqs``, by parent id, read with the built
    ``step_parent_root``; a parent that is not a task raises, as
    :func:`.producer.insert_tasks` does (the first missing one in sorted order)."""
    parents = sorted({r.parent_id for r in reqs if r.parent_id is not None})
    if not parents:
        return {}
    lookup = st._texts.get("step_parent_root") if st._texts is not None else None
    assert lookup is not None
    roots: dict[str, str] = {}
    for parent in parents:
        root = (await texts.execute(conn, st, lookup, {"parent": parent})).scalar()
        if root is None:
            raise InvalidArgument("parent", f"no task has id {parent!r}")
        roots[parent] = root
    return roots


async def ready(st: Seam, names: Sequence[str]) -> bool:
    """Whether a claim of ``names`` can take the built-once steps."""
    built = await texts.of(st)
    return len(names) == 1 and "step_candidates" in built


async def claim_rounds(
    once: Callable[[int, int], Awaitable[tuple[list[Task], bool]]],
    limit: int,
    partition: str | None,
    per_stream: int | None,
) -> list[Task]:
    """The rounds of a step-by-step claim (both paths, built once or not): ``once(
    left, cap)`` takes one stream (at most ``cap`` tasks) or plain work and says
    whether free streams remain; with ``per_stream`` the claim goes on choosing
    until ``limit`` is used up or nothing is left."""
    claimed: list[Task] = []
    left = limit
    while left > 0:
        cap = left if per_stream is None else min(left, per_stream)
        got, streams_left = await once(left, cap)
        claimed += got
        left -= len(got)
        if not got or not streams_left or per_stream is None or partition is not None:
            break
    return claimed


async def claim_tx(
    st: Seam,
    conn: AsyncConnection,
    grp: str,
    queue: str,
    worker_id: str,
    lease: float | None,
    limit: int,
    partition: str | None,
    per_stream: int | None,
) -> list[Any]:
    """:func:`.consumer.claim_tx` for one queue, on the built-once steps (see
    :func:`ready`): the same choice, as sets — a fixed number of statements
    however many streams the claim takes. One read of the candidates (free
    streams with their runs, ready unpartitioned rows, an expired lease), the
    choice (:func:`choose`), one lease of every row chosen, one read of them back,
    and one update marking the streams taken as held (what recomputing them would
    write: their heads are leased now).

    Returns the leased rows (the task view, in claim order), not Tasks: the caller
    builds those after the commit, so JSON decoding and Task construction do not
    run while this transaction holds SQLite's one write lock, which every other
    process's claims and acknowledgements wait for (three consumer groups' workers
    on one file queue there)."""
    built = st._texts
    assert built is not None

    def step(name: str) -> texts.Text:
        text = built.get(name)
        assert text is not None
        return text

    base = {"grp": grp, "queue": queue}
    mix = per_stream is not None and partition is None
    params = {
        **base,
        "partition": partition,
        "limit": limit,
        # Without per_stream a claim is one unit: one stream (up to ``limit`` of its
        # tasks) or plain work; with it, several streams, each capped.
        "streams": limit if mix else 1,
        "per_stream": limit if per_stream is None else min(per_stream, limit),
    }
    rows = list(await texts.execute(conn, st, step("step_candidates"), params))
    if any(row.kind == _EXPIRED for row in rows):
        # Recovery changes streams and ready rows: choose from what it leaves.
        await upkeep.recover_tx(st, conn, grp, [queue])
        rows = list(await texts.execute(conn, st, step("step_candidates"), params))
    picked = choose(_units(rows), limit, mix)
    if not picked:
        return []
    seqs = json.dumps(picked)
    lease_params = {**base, "seqs": seqs, "w_id": worker_id, "lease": lease}
    await texts.execute(conn, st, step("step_lease_seqs"), lease_params)
    view = {"grp": grp, "seqs": seqs, "w_id": worker_id}
    taken = {row.seq: row for row in await texts.execute(conn, st, step("step_view_seqs"), view)}
    held = sorted({row.partition for row in taken.values() if row.partition is not None})
    if held:
        hold = {**base, "partitions": json.dumps(held)}
        await texts.execute(conn, st, step("step_hold_streams"), hold)
    return [taken[seq] for seq in picked if seq in taken]


#: ``kind`` of the candidate rows (see the dialect's ``step_candidates``).
_PLAIN, _STREAM, _EXPIRED = 0, 1, 2

#: A unit of a claim: its place in claim order, and the rows it would lease.
_Unit = tuple[tuple[Any, ...], list[int]]


def _units(rows: Sequence[Any]) -> list[_Unit]:
    """The claim's candidate units: each free stream's run (its rows from the head,
    while queued and due), and each ready unpartitioned row, keyed by claim order
    (priority, then who waited longest, plain first on a tie)."""
    units: list[_Unit] = []
    found: dict[tuple[str, str], list[Any]] = {}
    for row in rows:
        if row.kind == _PLAIN:
            units.append(((-row.priority, row.at, 0, row.task_seq, "", ""), [row.task_seq]))
        elif row.kind == _STREAM:
            found.setdefault((row.queue, row.partition), []).append(row)
    for stream in found.values():
        first = stream[0]
        if first.task_seq != first.head_seq:
            continue  # the stream row names another head: not a run to take
        # A leased or waiting row holds the rest of the stream back.
        run: list[int] = []
        for row in stream:
            if row.status != q.QUEUED or not row.due:
                break
            run.append(row.task_seq)
        if run:
            units.append(((-first.priority, first.at, 1, 0, first.queue, first.partition), run))
    return units


def choose(units: list[_Unit], limit: int, mix: bool) -> list[int]:
    """The rows a claim leases from its candidate ``units``, in claim order: with
    ``mix``, units in order while ``limit`` allows (the last stream's run cut
    short); without, the first unit if it is a stream, else every unpartitioned
    row (a claim without ``per_stream`` takes one stream or plain work)."""
    units.sort(key=lambda unit: unit[0])
    if not units:
        return []
    if not mix:
        first_key, first_rows = units[0]
        if first_key[2] == _STREAM:
            return first_rows[:limit]
        return [rows[0] for key, rows in units if key[2] == _PLAIN][:limit]
    picked: list[int] = []
    for _, rows in units:
        picked += rows[: limit - len(picked)]
        if len(picked) >= limit:
            break
    return picked
