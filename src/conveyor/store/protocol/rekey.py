"""Rekey: sealing stored values again under the current key (``conveyor rekey``).

Which tasks: those sealed under another key than the current one (found by
``conveyor_tasks.key_id``, whose partial index holds only sealed rows), then the
plain tasks of encrypted queues (stored before the queue was set ``encrypt``),
each in submit order, in batches, one transaction each. A task is rewritten with
its delivery rows' results, errors and progress messages (of every group) in the
same transaction. Each write is conditional on the value read (compare and set):
a value changed meanwhile (an acknowledgement landing, another rekey) is left as
the other writer left it. A run cut short keeps the batches it committed;
running it again does the rest, as a row rewritten no longer matches.

Not found: a task already under the current key whose delivery row holds a
value written otherwise (a result written plain by a store that did not know the
task sealed, or sealed under an older key by a store not yet given the new
current key). Rekey after every store uses the current key.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, or_, select, update

from conveyor.encryption import Encryption, is_sealed
from conveyor.errors import ConfigurationError
from conveyor.schema import deliveries as d
from conveyor.schema import queues as qs
from conveyor.schema import tasks as t
from conveyor.store.protocol import sealing
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: The delivery columns sealed for a task of an encrypted queue, by field name.
_DELIVERY_FIELDS = {"result": "result", "error": "error", "progress_message": "progress"}


def keys_of(st: Seam) -> Encryption:
    """The store's keys, or ConfigurationError: rekey seals with the current key."""
    enc = st._keyring.encryption
    if enc is None:
        raise ConfigurationError(
            "rekey needs the encryption keys: pass encryption=conveyor.Encryption(...) "
            "to connect(), or set $CONVEYOR_ENCRYPTION_KEYS"
        )
    return enc


async def _encrypted(conn: AsyncConnection, queue: str | None) -> list[str]:
    """The encrypted queues (of ``queue`` alone, when given)."""
    stmt = select(qs.c.queue).where(qs.c.encrypt.is_(True))
    if queue is not None:
        stmt = stmt.where(qs.c.queue == queue)
    return sorted(row.queue for row in await conn.execute(stmt))


def _pending(current: str, encrypted: list[str], queue: str | None) -> list[Any]:
    """The two selections of tasks to rewrite, in the order they are run: sealed
    under another key; plain in an encrypted queue."""
    old = and_(t.c.key_id.is_not(None), t.c.key_id != current)
    if queue is not None:
        old = and_(old, t.c.queue == queue)
    out: list[Any] = [old]
    if encrypted:
        out.append(and_(t.c.queue.in_(encrypted), t.c.key_id.is_(None)))
    return out


async def count(st: Seam, queue: str | None) -> int:
    """How many tasks a rekey would rewrite now."""
    current = keys_of(st).current

    async def work(conn: AsyncConnection) -> int:
        total = 0
        for where in _pending(current, await _encrypted(conn, queue), queue):
            total += int((await conn.execute(select(func.count()).where(where))).scalar_one())
        return total

    return await tx.run(st, work, write=False)


async def run(
    st: Seam, queue: str | None, batch: int, on_batch: Callable[[int], None] | None
) -> int:
    """Rewrite every pending task (see the module docs); how many were."""
    enc = keys_of(st)
    encrypted = await tx.run(st, lambda conn: _encrypted(conn, queue), write=False)
    done = 0
    for where in _pending(enc.current, encrypted, queue):
        after = 0
        while True:
            step = functools.partial(_batch, st, enc=enc, where=where, after=after, batch=batch)
            n, after = await tx.run(st, step)
            if after == 0:
                break
            done += n
            if on_batch is not None and n:
                on_batch(n)
    return done


async def _batch(
    st: Seam, conn: AsyncConnection, *, enc: Encryption, where: Any, after: int, batch: int
) -> tuple[int, int]:
    """One batch: the next ``batch`` pending tasks after seq ``after`` rewritten;
    ``(how many, the last seq read)`` (0: none left)."""
    rows = list(
        await conn.execute(
            select(t.c.seq, t.c.id, t.c.payload, t.c.metadata, t.c.key_id)
            .where(where, t.c.seq > after)
            .order_by(t.c.seq)
            .limit(batch)
        )
    )
    if not rows:
        return 0, 0
    keyring = st._keyring
    written = 0
    for row in rows:
        values = {
            "payload": _reseal(keyring, enc, row.payload, row.id, "payload"),
            # Empty metadata stays "{}" (as a sealed submit leaves it).
            "metadata": row.metadata
            if row.metadata == "{}"
            else _reseal(keyring, enc, row.metadata, row.id, "metadata"),
            "key_id": enc.current,
        }
        same_key = t.c.key_id.is_(None) if row.key_id is None else t.c.key_id == row.key_id
        result = await conn.execute(
            update(t).where(t.c.seq == row.seq, same_key, t.c.payload == row.payload).values(values)
        )
        written += result.rowcount or 0
    seqs = [row.seq for row in rows]
    ids = {row.seq: row.id for row in rows}
    found = await conn.execute(
        select(d.c.task_seq, d.c.grp, d.c.result, d.c.error, d.c.progress_message).where(
            d.c.task_seq.in_(seqs),
            or_(d.c.result.is_not(None), d.c.error.is_not(None), d.c.progress_message.is_not(None)),
        )
    )
    for drow in found:
        task_id = ids[drow.task_seq]
        for column, field in _DELIVERY_FIELDS.items():
            old = getattr(drow, column)
            if old is None or (is_sealed(old) and old.startswith(f"~c1:{enc.current}:")):
                continue
            new = _reseal(keyring, enc, old, task_id, field)
            await conn.execute(
                update(d)
                .where(d.c.task_seq == drow.task_seq, d.c.grp == drow.grp, d.c[column] == old)
                .values({column: new})
            )
    return written, seqs[-1]


def _reseal(keyring: sealing.Keyring, enc: Encryption, text: str, task_id: str, field: str) -> str:
    """``text`` (sealed under any key of this store, or plain) sealed under the
    current key."""
    plain = text
    if is_sealed(text):
        opened = keyring.open(text, task_id, field)
        assert isinstance(opened, str)  # a rekeying store raises on a key it lacks
        plain = opened
    return enc.seal(plain, task_id=task_id, field=field)


__all__ = ["count", "keys_of", "run"]
