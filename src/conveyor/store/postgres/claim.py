"""Postgres's claim (the seam's claim hook, :meth:`conveyor.store.seam.Seam._claim`):
one statement, sent by itself on a connection kept in autocommit (one round trip).

The statement (``claim.one`` for one queue, ``claim.any`` for several, in
``sql/claim.sql``) makes the whole choice of
:mod:`conveyor.store.protocol.claim_order` in SQL: it locks the fairest free
streams and the first ready unpartitioned rows with ``SKIP LOCKED``, orders them
as units, leases the rows chosen, marks their streams held, and returns the
leased rows with each one's unit ``rank``. It first asks whether a lease of these
queues has expired (``busy``); then it leases nothing and the caller recovers
first. Its ``_durable`` variant is the same statement without turning
``synchronous_commit`` off for its transaction (``durable_claims=True``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.store.protocol import claim_order, limits, sealing, texts
from conveyor.store.seam import Claim, Seam

#: The statement by (one queue, durable).
_NAMES = {
    (True, False): "claim.one",
    (False, False): "claim.any",
    (True, True): "claim.one_durable",
    (False, True): "claim.any_durable",
}


def statement(built: texts.Texts, *, single: bool, durable: bool) -> texts.Text:
    """The claim statement for one queue (``single``) or several, whose commit
    waits for the WAL flush or not (``durable``)."""
    text = built.get(_NAMES[single, durable])
    assert text is not None, "the Postgres SQL files hold every claim statement"
    return text


async def claim(
    st: Seam, durable: bool, ask: Claim, conn: AsyncConnection | None = None
) -> list[Any] | None:
    """The claim hook: see :meth:`conveyor.store.seam.Seam._claim`; on ``conn``,
    inside the caller's transaction (:meth:`~conveyor.store.seam.Seam._claim_in`)."""
    queues, limit, partition, per_stream = ask.queues, ask.limit, ask.partition, ask.per_stream
    single = len(queues) == 1
    text = statement(await texts.of(st), single=single, durable=durable)
    params: dict[str, Any] = {
        "grp": ask.grp,
        "partition": partition,
        "limit": limit,
        "per_stream": claim_order.run_cap(limit, per_stream),
        "streams": claim_order.streams_wanted(limit, partition, per_stream),
        "mix": claim_order.mixes(partition, per_stream),
        "worker_id": ask.worker_id,
        "lease": ask.lease,
        "keyless": st._keyring.encryption is None,
        "flow": ask.flow,
    }
    if single:
        params["queue"] = queues[0]
    else:
        params["queues"] = list(queues)
    if conn is None:
        rows = await texts.alone(st, text, params)
    else:
        rows = list(await texts.execute(conn, st, text, params))
    sealed = rows[0].sealed or ()
    sealing.claimed_from(st, queues, sealed)  # raises when keyless: nothing was leased
    if not ask.flow:
        limits.claimed_from(st, queues, rows[0].held or ())
    if rows[0].busy:
        return None
    # Claim order: unit by unit (the statement's rank), a stream's tasks in submit
    # order. (One row of NULLs but ``busy`` when nothing was leased.)
    taken = [row for row in rows if row.id is not None]
    taken.sort(key=lambda row: (row.rank, row.seq))
    return taken
