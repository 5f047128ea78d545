"""Large plain batches: submitted in runs of :data:`RUN` tasks, validated as they go.

A ``submit_many`` of thousands of plain tasks (no key, partition or parent) used
to validate every request, then send one statement for all of them, then build
the answering tasks: the client and the server took turns, each idle while the
other worked. Here the batch goes as the same one-statement submit run once per
:data:`RUN` requests, all in one transaction, by the dialect's
:meth:`~conveyor.store.seam.Seam._batch_runner`: where it pipelines (Postgres),
each run is sent as soon as its requests are validated, so the next run's
validation overlaps the server's work on this one; SQLite, with no server to
overlap with, validates them all first and runs the runs in one hop to its
connection thread. It is still one transaction: one bad request anywhere rolls
back every run sent before it, so nothing is written; a request that is not
plain ends the attempt the same way and the batch goes the usual way instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from conveyor.models import Task
from conveyor.store.protocol import depth, producer, texts
from conveyor.store.protocol import transactions as tx
from conveyor.store.protocol.requests import Preparing, Request
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: Tasks per run. Why 250: batches of 1,000 plain tasks, in alternating runs on a
#: 2-core machine, went 18,300–21,000/s as one statement, 18,300–20,600/s as four
#: runs validated first, and 20,700–23,400/s as four runs validated as they went
#: (benchmarks/PROFILE.md); shorter runs add statements for no further overlap.
RUN = 250
#: Tasks in the first run: fewer, so the server starts sooner (until the first run
#: is sent, only the client works).
FIRST = 50


def _params(st: Seam, part: list[Request], sealed: bool) -> dict[str, Any]:
    """The parameters of one run: ``submit_plain``'s, or, ``sealed``, the requests
    sealed and ``submit_sealed``'s (ConfigurationError without keys: nothing of
    the runs is written)."""
    if not sealed:
        return producer.many_params(part)
    key_id = st._keyring.require(part[0].queue).current
    sealed_part = [producer.seal_request(st, r) for r in part]
    return {**producer.many_params(sealed_part), "key_id": key_id}


class _NotPlain(Exception):
    """A request with a key, partition or parent, or to a queue the first run did
    not have, turned up: the usual path takes over."""


async def submit(st: Seam, preparing: Preparing) -> list[Task] | None:
    """Submit the requests of ``preparing`` in runs, or ``None`` when this path does
    not serve them: at most one run's worth, or one not plain. The requests taken
    so far stay in ``preparing.done`` for the usual path."""
    if preparing.total <= RUN:
        return None
    first = preparing.take(FIRST)
    if not producer.is_plain(first) or depth.known_capped(st, first):
        return None
    # Queues all known encrypted: every run sealed and written by submit_sealed;
    # none known encrypted: submit_plain; some of each: the usual path.
    known = st._keyring.encrypted
    sealed = producer.touches(first, known)
    if sealed and not all(r.queue in known for r in first):
        return None
    text = (st._texts or await texts.of(st))["submit_sealed" if sealed else "submit_plain"]
    runner = st._batch_runner()
    done = preparing.done
    tasks: list[Task] = []
    # Every run's statement writes nothing when one of its queues is encrypted
    # (sealing), and the first run's queues are checked first: a later request to
    # another queue ends this attempt (the usual path then checks the whole batch
    # in one statement), so an encrypted queue cannot refuse a later run after
    # earlier runs to other queues were written.
    queues = {r.queue for r in first}

    def runs() -> Iterator[dict[str, Any]]:
        # The requests already taken first (a transaction retried after a transient
        # failure sends them again), then the rest as they are validated.
        sent = 0
        tasks.clear()
        while True:
            step = FIRST if sent == 0 else RUN
            missing = sent + step - len(done)
            if missing > 0:
                more = preparing.take(missing)
                if not producer.is_plain(more) or any(r.queue not in queues for r in more):
                    raise _NotPlain
            part = done[sent : sent + step]
            if not part:
                return
            sent += len(part)
            yield text.bind(st, _params(st, part, sealed))
            # Here once the run has been sent: its answering tasks are built while
            # the server works on it, and settled from its rows after the commit.
            tasks.extend(producer.unsettled(part))

    async def work(conn: AsyncConnection) -> list[Any]:
        # No connection of the runner's free: the same runs in an ordinary transaction.
        rows: list[Any] = []
        for params in runs():
            rows.extend(await texts.execute_bound(conn, text, params))
        return rows

    try:
        rows = await tx.run(st, work, together=lambda: runner(text.statements, runs()))
    except (_NotPlain, depth.Capped):
        # Rolled back: the batch goes the usual way (a capped queue: step by step).
        return None
    if sealed:
        queue_of = {r.id: r.queue for r in done}
        st._keyring.learn(queues, {queue_of[row.id] for row in rows if row.encrypt})
    written = {row.id for row in rows}
    if len(written) < len(done):
        # A run refused to write plain rows to a queue that became encrypted after
        # the runs before it were written (each run writes all its tasks or none:
        # sealing). Its requests go again, sealed; the runs written stay, plain,
        # as a submit committed just before the change would have.
        left = [r for r in done if r.id not in written]
        again = {task.id: task for task in await producer.submit_sealed(st, left)}
        kept = producer.settle([task for task in tasks if task.id in written], rows)
        by_id = {task.id: task for task in kept} | again
        return [by_id[r.id] for r in done]
    return producer.settle(tasks, rows)
