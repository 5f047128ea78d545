"""Submits in the caller's transaction (``submit(..., connection=...)``): the
caller's connection, checked (:mod:`conveyor.store.protocol.caller_conn`), runs what the
store's own transaction would, with no commit of ours; this process's workers
are woken after the caller commits.

Plain tasks and children go as the one-statement submit; the kinds sent
together outside a transaction (:mod:`conveyor.store.protocol.submit_together`) run the
same statements one after another on the caller's connection, in a savepoint;
the rest go step by step (:func:`conveyor.store.protocol.producer.submit_tx`), in a
savepoint too. Each statement runs in its variant for a caller's transaction
(:meth:`conveyor.store.protocol.texts.Texts.in_callers`), written in the style of
the caller's driver (:func:`conveyor.store.protocol.texts.on`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DBAPIError

from conveyor.errors import StoreUnavailable
from conveyor.models import Task
from conveyor.store.protocol import (
    caller_conn,
    dependencies,
    depth,
    producer,
    sealing,
    submit_together,
    texts,
    wake,
)
from conveyor.store.protocol.requests import Request
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


async def submit(st: Seam, connection: Any, reqs: list[Request]) -> list[Task]:
    """The requests written in the caller's transaction on ``connection``; the
    answering tasks in request order."""
    conn = await caller_conn.resolve(st, connection)
    if any(r.linked for r in reqs):
        try:
            # A savepoint: a refused parent or batch leaves the caller's
            # transaction as it was.
            async with conn.begin_nested():
                tasks = await dependencies.submit_tx(st, conn, reqs)
        except DBAPIError as exc:
            raise StoreUnavailable(
                f"the submit failed in the caller's transaction ({exc.orig}); roll it back"
            ) from exc
        caller_conn.after_commit(conn, lambda: wake.wake_local(st, work=True))
        return tasks
    capped = depth.known_capped(st, reqs)
    one = None if capped else _one_statement(st, conn, reqs)
    try:
        try:
            tasks = await _submit(st, conn, one, reqs, capped)
        except sealing.Refused:
            # A queue of the batch is encrypted: nothing was written (one statement
            # writes all or nothing; the others ran in a savepoint, rolled back).
            tasks = await producer.submit_sealed(st, reqs, conn)
    except DBAPIError as exc:
        raise StoreUnavailable(
            f"the submit failed in the caller's transaction ({exc.orig}); roll it back"
        ) from exc
    caller_conn.after_commit(conn, lambda: wake.wake_local(st, work=True))
    return tasks


async def _submit(
    st: Seam, conn: AsyncConnection, one: texts.Text | None, reqs: list[Request], capped: bool
) -> list[Task]:
    """The requests written on ``conn`` by the one-statement submit ``one``, or
    by the kinds sent together, or step by step (both in a savepoint). A queue
    known encrypted or capped goes step by step at once (``submit_sealed`` on a
    caller's connection: in a savepoint, sealing and counting the depth first); a
    capped queue met by a statement (SQLite's refusal, which writes nothing) the
    same way."""
    if capped or producer.touches(reqs, st._keyring.encrypted):
        return await producer.submit_sealed(st, reqs, conn)
    try:
        if one is not None:
            # No savepoint: one statement writes all or nothing by itself, and the
            # two round trips of a savepoint cost about what the statement does. (A
            # script, SQLite's, refuses a missing parent before it writes; a later
            # statement failing is a database error, and the caller is told to
            # roll back.)
            return await _submit_one_statement(st, conn, one, reqs)
        # A savepoint: a refused or failed submit leaves the caller's
        # transaction as it was (no half-written keys) and usable.
        async with conn.begin_nested():
            sent = await submit_together.submit(st, reqs, conn)
            return sent if sent is not None else await producer.submit_tx(st, conn, reqs)
    except DBAPIError as exc:
        if not st._is_capped(exc):
            raise
    return await producer.submit_sealed(st, reqs, conn)


def _one_statement(st: Seam, conn: AsyncConnection, reqs: list[Request]) -> texts.Text | None:
    """The dialect's one-statement submit of ``reqs`` for a caller's transaction,
    if they are plain, or children without keys or partitions."""
    single = len(reqs) == 1
    built = texts.on(st, conn)
    if producer.is_plain(reqs):
        return built["submit_one_in" if single else "submit_plain_in"]
    if producer.only_parents(reqs):
        return built["submit_child_in" if single else "submit_children_in"]
    return None


async def _submit_one_statement(
    st: Seam, conn: AsyncConnection, text: texts.Text, reqs: list[Request]
) -> list[Task]:
    """Plain requests, or children without keys or partitions, by the dialect's
    one-statement submit ``text`` on ``conn``, in its transaction."""
    single = len(reqs) == 1
    params = producer.one_params(reqs[0]) if single else producer.many_params(reqs)
    if producer.is_plain(reqs):
        return producer.answers(reqs, list(await texts.execute(conn, st, text, params)))
    # Children: each with its parent's root.
    if single:
        params["parent_id"] = reqs[0].parent_id
    else:
        params["parent_ids"] = [r.parent_id for r in reqs]
    return producer.family_answers(reqs, list(await texts.execute(conn, st, text, params)))


__all__ = ["submit"]
