"""SQLite's claim (the seam's claim hook, :meth:`conveyor.store.seam.Seam._claim`):
a few statements in one transaction, run as one function on the store's
connection thread (one hop from the event loop), the single writer lock standing
in for row locks.

SQLite has no data-modifying CTEs, arrays or LATERAL, so the claim reads its
candidates, chooses in Python and writes what it chose: per queue one read of
the candidates (``claim.candidates``: free streams with their runs, ready
unpartitioned rows, whether a lease expired), the choice
(:func:`conveyor.store.protocol.claim_order.choose`, the claim order stated
once), per queue one lease of the rows chosen (``claim.lease``), one read of
them back (``claim.view``), and per queue one update marking the streams taken
as held (``claim.hold``: what recomputing them would write, their heads leased
now). A fixed number of statements per queue, however many streams it takes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from conveyor.store.protocol import claim_order, limits, sealing, texts
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Claim, Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: ``kind`` of the candidate rows (see ``claim.candidates``).
_PLAIN, _STREAM, _EXPIRED, _SEALED, _LIMITED = 0, 1, 2, 3, 4
_QUEUED = "queued"


async def claim(st: Seam, ask: Claim) -> list[Any] | None:
    """The claim hook: see :meth:`conveyor.store.seam.Seam._claim`.

    Returns the leased rows (the task view), not Tasks: the caller builds those
    after the commit, so JSON decoding and Task construction do not run while
    this transaction holds SQLite's one write lock, which every other process's
    claims and acknowledgements wait for."""
    built = await texts.of(st)

    async def work(conn: AsyncConnection) -> list[Any] | None:
        return await claim_tx(st, conn, built, ask)

    return await tx.run(st, work)


#: The hook's statements, in the order :func:`claim_tx` unpacks them.
_STEPS = ("claim.candidates", "claim.lease", "claim.view", "claim.hold")


async def claim_tx(
    st: Seam, conn: AsyncConnection, built: texts.Texts, ask: Claim
) -> list[Any] | None:
    """The claim inside the caller's transaction: the leased rows in claim order,
    or ``None`` (nothing written) when a lease of these queues has expired."""
    grp, queues, limit, partition = ask.grp, ask.queues, ask.limit, ask.partition
    per_stream, worker_id, lease = ask.per_stream, ask.worker_id, ask.lease
    params: dict[str, Any] = {
        "grp": grp,
        "queue": queues[0],
        "partition": partition,
        "limit": limit,
        "streams": claim_order.streams_wanted(limit, partition, per_stream),
        "per_stream": claim_order.run_cap(limit, per_stream),
        "flow": ask.flow,
    }
    candidates, lease_step, view_step, hold = (built.get(name) for name in _STEPS)
    assert candidates and lease_step and view_step and hold, "the SQLite SQL files hold them"
    rows = list(await texts.execute(conn, st, candidates, params))
    for queue in queues[1:]:
        # Each queue read by its own index range: the union of every queue's first
        # ``limit`` rows and ``streams`` streams holds the claim's whole choice.
        rows += await texts.execute(conn, st, candidates, {**params, "queue": queue})
    # Raises when this store has no keys and a queue is encrypted: nothing leased.
    sealing.claimed_from(st, queues, [row.queue for row in rows if row.kind == _SEALED])
    if not ask.flow:
        limits.claimed_from(st, queues, [row.queue for row in rows if row.kind == _LIMITED])
    if any(row.kind == _EXPIRED for row in rows):
        return None
    picked = claim_order.choose(_units(rows), limit, claim_order.mixes(partition, per_stream))
    if not picked:
        return []
    base = {"grp": grp, "w_id": worker_id, "lease": lease}
    seqs = json.dumps(picked)
    if len(queues) == 1:
        await texts.execute(conn, st, lease_step, {**base, "queue": queues[0], "seqs": seqs})
    else:
        chosen = set(picked)
        of_queue: dict[str, list[int]] = {}
        for row in rows:
            if row.task_seq in chosen:
                of_queue.setdefault(row.queue, []).append(row.task_seq)
        for queue, mine in of_queue.items():
            await texts.execute(
                conn, st, lease_step, {**base, "queue": queue, "seqs": json.dumps(mine)}
            )
    view = {"grp": grp, "seqs": seqs, "w_id": worker_id}
    read = await texts.execute(conn, st, view_step, view)
    taken = {row.seq: row for row in read}
    held: dict[str, set[str]] = {}
    for row in taken.values():
        if row.partition is not None:
            held.setdefault(row.queue, set()).add(row.partition)
    for queue, partitions in held.items():
        streams = {"grp": grp, "queue": queue, "partitions": json.dumps(sorted(partitions))}
        await texts.execute(conn, st, hold, streams)
    return [taken[seq] for seq in picked if seq in taken]


def _units(rows: Sequence[Any]) -> list[claim_order.Unit]:
    """The claim's candidate units: each free stream's run (its rows from the head,
    while queued and due), and each ready unpartitioned row."""
    units: list[claim_order.Unit] = []
    found: dict[tuple[str, str], list[Any]] = {}
    for row in rows:
        if row.kind == _PLAIN:
            key = claim_order.plain_key(row.priority, row.at, row.task_seq)
            units.append((key, [row.task_seq]))
        elif row.kind == _STREAM:
            found.setdefault((row.queue, row.partition), []).append(row)
    for (queue, partition), stream in found.items():
        first = stream[0]
        if first.task_seq != first.head_seq:
            continue  # the stream row names another head: not a run to take
        # A leased or waiting row holds the rest of the stream back.
        run: list[int] = []
        for row in stream:
            if row.status != _QUEUED or not row.due:
                break
            run.append(row.task_seq)
        if run:
            units.append((claim_order.stream_key(first.priority, first.at, queue, partition), run))
    return units
