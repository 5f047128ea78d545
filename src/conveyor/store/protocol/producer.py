"""Producer: inserting tasks with their delivery rows (fan-out at submit) and
idempotency keys. The requests come validated (:mod:`conveyor.store.protocol.requests`); a
replaced key's holder is withdrawn (:mod:`conveyor.store.protocol.withdraw`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, exists, select

from conveyor import _values as v
from conveyor.errors import AlreadyExists, InvalidArgument, StoreUnavailable
from conveyor.models import Task
from conveyor.schema import keys as k
from conveyor.schema import tasks as t
from conveyor.store.protocol import codec, depth, sealing, streams, texts, withdraw
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.protocol.requests import Request
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: A submit of at most this many tasks is a short write transaction: where the
#: dialect runs transactions on a connection thread of its own (SQLite), it may run
#: on the caller's thread while that thread is idle (see
#: :mod:`conveyor.store.sqlite.thread`). Larger batches always take the thread, so
#: the event loop is never held for long.
INLINE_MAX = 100
DEFAULT_MAX_ATTEMPTS = 3


def is_plain(reqs: list[Request]) -> bool:
    """No key, partition, parent or concurrency key among ``reqs``: the
    one-statement submit serves."""
    return not any(
        r.key is not None
        or r.partition is not None
        or r.parent_id is not None
        or r.concurrency_key is not None
        or r.linked
        for r in reqs
    )


def many_params(reqs: list[Request]) -> dict[str, Any]:
    """The parameters of the ``submit_plain`` text for ``reqs``."""
    return {
        "ids": [r.id for r in reqs],
        "names": [r.name for r in reqs],
        "queues": [r.queue for r in reqs],
        "payloads": [r.payload for r in reqs],
        "metadatas": [r.metadata for r in reqs],
        "priorities": [r.priority for r in reqs],
        # Options nobody gave: no list at all (NULL stands for a list of NULLs).
        "max_attempts": _given([r.max_attempts for r in reqs]),
        "backoffs": _given([r.backoff for r in reqs]),
        "delays": _given([r.delay_us for r in reqs]),
        "run_ats": _given([r.run_at_us for r in reqs]),
        "correlation_ids": _given([r.correlation_id for r in reqs]),
    }


async def submit(st: Seam, reqs: list[Request]) -> list[Task]:
    """Insert the requests in one transaction; the answering tasks in request order.
    Plain requests (no key, partition or parent) go as the one-statement submit
    (``submit_one``, ``submit_plain``), children without keys or partitions as
    the one-statement submit of children (``submit_child``, ``submit_children``);
    the rest step by step (:func:`submit_tx`; partitioned ones and one keyed
    request may go as statements sent together first:
    :mod:`conveyor.store.protocol.submit_together`). A short submit may run on the
    caller's thread where the dialect's connection runner allows
    (:data:`INLINE_MAX`)."""
    single = len(reqs) == 1
    short = len(reqs) <= INLINE_MAX
    built = st._texts or await texts.of(st)
    if is_plain(reqs):
        text = built["submit_one" if single else "submit_plain"]
        params = one_params(reqs[0]) if single else many_params(reqs)
        return answers(reqs, await texts.alone(st, text, params, inline=short))
    if only_parents(reqs):
        family = built["submit_child" if single else "submit_children"]
        return await submit_children(st, family, reqs)
    return await tx.run(st, lambda conn: submit_tx(st, conn, reqs), inline=short)


def only_parents(reqs: list[Request]) -> bool:
    """No key or partition among ``reqs``, and some parent: the dialect's
    one-statement submit of children serves (``submit_child``, ``submit_children``)."""
    return not any(
        r.key is not None or r.partition is not None or r.concurrency_key is not None or r.linked
        for r in reqs
    ) and any(r.parent_id is not None for r in reqs)


async def submit_children(st: Seam, text: texts.Text, reqs: list[Request]) -> list[Task]:
    """Requests with parents (no key or partition) as one statement: ``text`` is the
    dialect's ``submit_child`` (one request) or ``submit_children``. A parent that
    is not a task writes nothing and raises, as :func:`insert_tasks` does."""
    if len(reqs) == 1:
        params = {**one_params(reqs[0]), "parent_id": reqs[0].parent_id}
    else:
        params = {**many_params(reqs), "parent_ids": [r.parent_id for r in reqs]}
    rows = await texts.alone(st, text, params, inline=len(reqs) <= INLINE_MAX)
    return family_answers(reqs, rows)


def family_answers(reqs: list[Request], rows: list[Any]) -> list[Task]:
    """The tasks of requests with parents (no key), from the rows a submit of
    children returned (:func:`answers`' columns, ``root_id`` and ``orphan``): raises
    on a parent that is not a task (nothing was written)."""
    orphans = [row.orphan for row in rows if row.orphan is not None]
    if orphans:
        raise InvalidArgument("parent", f"no task has id {min(orphans)!r}")
    tasks = answers(reqs, rows)
    roots = {row.id: row.root_id for row in rows}
    for task in tasks:
        if task.parent_id is not None:
            codec.settle_root(task, roots[task.id])
    return tasks


def one_params(r: Request) -> dict[str, Any]:
    """The parameters of the ``submit_one`` text for ``r``."""
    return {
        "id": r.id,
        "name": r.name,
        "queue": r.queue,
        "payload": r.payload,
        "metadata": r.metadata,
        "priority": r.priority,
        "max_attempts": r.max_attempts,
        "backoff": r.backoff,
        "delay": r.delay_us,
        "run_at": r.run_at_us,
        "correlation_id": r.correlation_id,
    }


def answers(reqs: list[Request], rows: list[Any]) -> list[Task]:
    """The tasks of requests without a key or parent, from the rows the one-statement
    submit returned (``id``, ``max_attempts``, ``created_at``, ``run_at``), in request
    order."""
    return settle(unsettled(reqs), rows)


def unsettled(reqs: list[Request]) -> list[Task]:
    """The answering tasks of new requests (their keys claimed, if any), in
    request order, but for what the database decides: ``max_attempts``,
    ``created_at`` and ``run_at`` are left unset until :func:`settle`. Two steps, so
    a batch sent in runs (:mod:`conveyor.store.protocol.submit_runs`) builds them while the server
    works; no one sees a task before it is settled."""
    if len(reqs) == 1:
        payloads = [json.loads(reqs[0].payload)]
    else:
        # One decoder call for the batch: per call, the decoder's own overhead is
        # most of what a small payload costs to read back.
        payloads = json.loads("[" + ",".join([r.payload for r in reqs]) + "]")
    make = codec.queued_task
    return [
        make(
            id=r.id,
            name=r.name,
            queue=r.queue,
            partition=r.partition,
            payload=payload,
            metadata={} if r.metadata == "{}" else json.loads(r.metadata),
            priority=r.priority,
            max_attempts=None,
            run_at=None,
            created_at=None,
            key=r.key,
            parent_id=r.parent_id,
            root_id=r.id,  # a child's: its parent's root, once settled
            correlation_id=r.correlation_id,
        )
        for r, payload in zip(reqs, payloads, strict=True)
    ]


def settle(tasks: list[Task], rows: Iterable[Any]) -> list[Task]:
    """Fill in what the database decided for each of :func:`unsettled`'s ``tasks``
    from ``rows`` (``id``, ``max_attempts``, ``created_at``, ``run_at``; any order,
    one per task); the tasks, settled."""
    stored = {row.id: row for row in rows}
    # The statement's clock is one moment: a run shares created_at (and run_at,
    # unless delayed), so each distinct value becomes a datetime once.
    moments: dict[int, datetime] = {}
    for task in tasks:
        row = stored.get(task.id)
        if row is None:
            # A plain submit statement writes every task or, when a queue of them is
            # encrypted, none (sealing): never some. (The four a caller's transaction
            # runs alone write none for a queue with a max_depth too: the step-by-step
            # submit that follows counts its depth.)
            raise sealing.Refused(task.queue)
        created_at, run_at = int(row.created_at), int(row.run_at)
        created = moments.get(created_at)
        if created is None:
            created = moments[created_at] = v.from_us(created_at)
        due = moments.get(run_at)
        if due is None:
            due = moments[run_at] = v.from_us(run_at)
        codec.settle_queued(task, row.max_attempts, created, due)
    return tasks


def _given(values: list[Any]) -> list[Any] | None:
    """``values``, or ``None`` when every one is ``None``."""
    return values if any(value is not None for value in values) else None


async def submit_tx(st: Seam, conn: AsyncConnection, reqs: list[Request]) -> list[Task]:
    """Insert the requests (keys resolved first); the answering tasks in request order.
    A capped queue's depth is checked before anything is written (:mod:`.depth`)."""
    await depth.check(st, conn, reqs)
    # 1. Idempotency keys: claim each key first. A concurrent submit of the same
    #    key waits on the row and then sees it, so one key makes one task. A key
    #    already held is locked (sorted: the lock order) and read after the lock, so
    #    a concurrent replace has committed its swap by then and retention cannot
    #    delete the holder before this transaction ends; a key retention deleted
    #    since the insert looked is free again, and the insert is tried anew.
    chosen: dict[str, str] = {}  # key -> id of the task that answers it
    new: list[Request] = []
    replaced: list[str] = []
    keyed = [r for r in reqs if r.key is not None]
    if keyed:
        first: dict[str, Request] = {}
        for r in keyed:
            first.setdefault(r.key, r)  # type: ignore[arg-type]
        won: set[str] = set()
        existing: dict[str, str] = {}
        pending = sorted(first)
        built = texts.on(st, conn)
        while pending:
            bound = {"keys": pending, "ids": [first[key].id for key in pending]}
            claimed = await texts.execute(conn, st, built["claim_keys"], bound)
            won |= {row.key for row in claimed}
            lost = [key for key in pending if key not in won]
            if not lost:
                break
            rows = await texts.execute(conn, st, built["lock_keys"], {"keys": lost})
            existing.update({row.key: row.task_id for row in rows})
            # A key naming this very request's task, which does not exist: a plain
            # statement of this submit claimed it, then refused to write the task
            # to an encrypted queue (sealing). The key is this request's.
            won |= {key for key in lost if existing.get(key) == first[key].id}
            pending = [key for key in lost if key not in existing]
        for key, r in first.items():
            if key in won:
                chosen[key] = r.id
            elif r.conflict == "reject":
                raise AlreadyExists(key, existing[key])
            elif r.conflict == "reuse":
                chosen[key] = existing[key]
            else:
                replaced.append(existing[key])
                chosen[key] = r.id
                await texts.execute(conn, st, built["replace_key"], {"key": key, "id": r.id})
    for r in reqs:
        if r.key is None or (chosen[r.key] == r.id):
            new.append(r)
    if replaced:
        await lock_replacing(st, conn, replaced, new)
        await withdraw.cancel_tx(st, conn, replaced)

    found: dict[str, Task] = {}
    if new:
        found.update(await insert_tasks(st, conn, new))
    ids = [r.id if r.key is None else chosen[r.key] for r in reqs]
    reused = [i for i in ids if i not in found]
    if reused:
        found.update(await codec.fetch_tasks(conn, q.QUEUE_MODE, ids=reused, keyring=st._keyring))
    if new:
        await st._notify(conn, {r.queue for r in new}, done=False)
    return [found[i] for i in ids]


def task_row(r: Request, now: int, conf: Any, root: str) -> dict[str, Any]:
    """The task row of request ``r`` (the INSERT's parameters): ``now`` the clock
    read, ``conf`` the queue's stored settings (or ``None``), ``root`` its root id."""
    max_attempts = r.max_attempts or (conf.max_attempts if conf is not None else None)
    return {
        "id": r.id,
        "name": r.name,
        "queue": r.queue,
        "partition": r.partition,
        "payload": r.payload,
        "metadata": r.metadata,
        "key_id": r.key_id,
        "priority": r.priority,
        "max_attempts": max_attempts or DEFAULT_MAX_ATTEMPTS,
        "backoff": r.backoff or (conf.backoff if conf is not None else None),
        "created_at": now,
        "run_at": _run_at_us(r, now, conf),
        "key": r.key,
        "parent_id": r.parent_id,
        "root_id": root,
        "correlation_id": r.correlation_id,
        "concurrency_key": r.concurrency_key,
    }


def _delay_us(r: Request, conf: Any) -> int:
    """The delay of request ``r`` in µs: its own, else its queue's (``conf``), else 0."""
    if r.delay_us is not None:
        return r.delay_us
    if conf is not None and conf.delay is not None:
        seconds: float = conf.delay
        return round(seconds * v.US)
    return 0


def _run_at_us(r: Request, now: int, conf: Any) -> int:
    """When request ``r`` is due (µs): its run_at, else now plus its delay (its own
    or its queue's), and never sooner than now plus the queue's debounce."""
    due = r.run_at_us if r.run_at_us is not None else now + _delay_us(r, conf)
    if conf is not None and conf.debounce:
        seconds: float = conf.debounce
        due = max(due, now + round(seconds * v.US))
    return due


async def share_groups(st: Seam, conn: AsyncConnection, queues: list[str]) -> None:
    """Share the active group rows of ``queues`` (sorted), held until commit
    (``share_groups``)."""
    if not queues:
        return
    await texts.execute(conn, st, texts.on(st, conn)["share_groups"], {"queues": queues})


async def lock_replacing(
    st: Seam, conn: AsyncConnection, holders: list[str], new: list[Request]
) -> None:
    """Before replaced ``holders`` are withdrawn and ``new`` written: the groups of
    every queue involved shared, then every stream the transaction writes locked in
    one pass in the lock order (created where missing), the holders' (every
    group's) and the queue-mode streams of the new tasks' partitions. Locked in
    the passes that follow one by one (the holders', then the new tasks'), a new
    task's stream that sorts before a holder's was taken out of order, and a batch
    locking both in order deadlocked with it. (Where one writer holds the whole
    database, SQLite, the statements lock nothing and create the rows missing.)"""
    rows = await conn.execute(
        select(t.c.queue, t.c.partition).where(
            t.c.id.in_(sorted(set(holders))), t.c.partition.is_not(None)
        )
    )
    held = {(row.queue, row.partition) for row in rows}
    fresh = {(r.queue, p) for r in new if (p := r.partition) is not None}
    if not held | fresh:
        return
    await share_groups(st, conn, sorted({qn for qn, _ in held | fresh} | {r.queue for r in new}))
    existing = await conn.execute(q.partition_streams(sorted(held | fresh), None))
    keys = {(row.queue, row.grp, row.partition) for row in existing}
    keys |= {(qn, q.QUEUE_MODE, p) for qn, p in fresh}
    await streams.lock_or_create(st, conn, keys)


async def insert_tasks(st: Seam, conn: AsyncConnection, reqs: list[Request]) -> dict[str, Task]:
    """Insert the task rows and their delivery rows; the new tasks by id."""
    parents: dict[str, str] = {}
    parent_ids = sorted({r.parent_id for r in reqs if r.parent_id is not None})
    built = texts.on(st, conn)
    if parent_ids:
        rows = await texts.execute(conn, st, built["parent_roots"], {"ids": parent_ids})
        parents = {row.id: row.root_id for row in rows}
        missing = [p for p in parent_ids if p not in parents and p not in {r.id for r in reqs}]
        if missing:
            raise InvalidArgument("parent", f"no task has id {missing[0]!r}")
    for r in reqs:  # a parent submitted in the same batch
        if r.parent_id is not None and r.parent_id not in parents:
            parents[r.parent_id] = r.parent_id
    queues = sorted({r.queue for r in reqs})
    # The active group rows the fan-out below reads (the lock order: group rows
    # before stream rows). Unsubscribe locks the row, so it waits for the producers
    # in flight and later ones see the group inactive: no delivery row is ever
    # written for a group whose state unsubscribe already dropped.
    await share_groups(st, conn, queues)
    stream_keys = {(r.queue, p) for r in reqs if (p := r.partition) is not None}
    await streams.serialize_producers(st, conn, stream_keys)
    for _ in range(SEALED_TRIES):
        # The queues' settings read in this transaction; the rows of encrypted
        # queues sealed. Should a queue become encrypted after the read (another
        # transaction's commit, seen by the next statement on Postgres), the
        # insert writes nothing and says so: read again, in the same transaction.
        context = list(await texts.execute(conn, st, built["submit_context"], {"queues": queues}))
        now = int(context[0].now)
        settings = {row.queue: row for row in context if row.queue is not None}
        encrypted = {row.queue for row in settings.values() if row.encrypt}
        st._keyring.learn(queues, encrypted)
        params = [
            task_row(
                seal_request(st, r) if r.queue in encrypted or r.seal else r,
                now,
                settings.get(r.queue),
                r.id if r.parent_id is None else parents.get(r.parent_id, r.parent_id),
            )
            for r in reqs
        ]
        # The task rows and their delivery rows in one statement, which returns
        # the streams the new rows joined (``insert_rows``).
        encoded = json.dumps([[row[c] for c in _ROW_COLUMNS] for row in params])
        touched = list(await texts.execute(conn, st, built["insert_rows"], {"rows": encoded}))
        if not any(row.refused for row in touched):
            break
    else:
        raise StoreUnavailable(
            f"the settings of queue(s) {', '.join(queues)} kept changing during the submit"
        )
    if touched:
        await streams.refresh(st, conn, [(row.queue, row.grp, row.partition) for row in touched])
        await streams.quiet(st, conn, {(row.queue, row.partition) for row in touched})
    return {
        r.id: codec.new_task(row, payload=json.loads(r.payload), metadata=json.loads(r.metadata))
        for r, row in zip(reqs, params, strict=True)
    }


def seal_request(st: Seam, r: Request) -> Request:
    """``r`` with its payload and metadata sealed (the store's current key), for an
    encrypted queue; ConfigurationError when this store has no keys. Metadata
    left empty stays ``{}``: there is nothing in it to hide, and every claim of
    the task would open it."""
    enc = st._keyring.require(r.queue)
    meta = r.metadata
    # Made field by field: dataclasses.replace() cost three times the sealing.
    return Request(
        id=r.id,
        name=r.name,
        payload=enc.seal(r.payload, task_id=r.id, field="payload"),
        queue=r.queue,
        priority=r.priority,
        delay_us=r.delay_us,
        run_at_us=r.run_at_us,
        max_attempts=r.max_attempts,
        backoff=r.backoff,
        key=r.key,
        conflict=r.conflict,
        partition=r.partition,
        parent_id=r.parent_id,
        correlation_id=r.correlation_id,
        metadata=meta if meta == "{}" else enc.seal(meta, task_id=r.id, field="metadata"),
        key_id=enc.current,
        seal=r.seal,
        concurrency_key=r.concurrency_key,
    )


def touches(reqs: list[Request], queues: set[str]) -> bool:
    """Whether a request of ``reqs`` goes to one of ``queues``."""
    return any(r.queue in queues for r in reqs)


#: How many times :func:`insert_tasks` reads the settings again while a queue keeps
#: turning encrypted under it.
SEALED_TRIES = 5


async def submit_sealed(
    st: Seam, reqs: list[Request], conn: AsyncConnection | None = None
) -> list[Task]:
    """Submit ``reqs`` so that the tasks of encrypted queues are sealed: the path of
    a batch that touches a queue this store knows encrypted, and of one a plain
    statement refused (:class:`~.sealing.Refused`). Plain tasks all to queues
    known encrypted: sealed here and written by one statement; the rest step by
    step (:func:`submit_tx`, which reads the settings in its transaction and
    seals what must be), on ``conn`` (a caller's) in a savepoint."""
    keyring = st._keyring
    if conn is None and is_plain(reqs) and all(r.queue in keyring.encrypted for r in reqs):
        return await _submit_sealed_plain(st, reqs)
    if conn is None:
        return await tx.run(st, lambda c: submit_tx(st, c, reqs))
    async with conn.begin_nested():
        return await submit_tx(st, conn, reqs)


async def _submit_sealed_plain(st: Seam, reqs: list[Request]) -> list[Task]:
    """Plain requests, all to queues this store knows encrypted, sealed and written
    by ``submit_sealed`` (one statement, committed on its own); the queues it finds
    no longer encrypted are remembered so (their next submits go plain)."""
    keyring = st._keyring
    enc = keyring.require(reqs[0].queue)
    sealed = [seal_request(st, r) for r in reqs]
    single = len(reqs) == 1
    text = (st._texts or await texts.of(st))["submit_sealed_one" if single else "submit_sealed"]
    params = {**(one_params(sealed[0]) if single else many_params(sealed)), "key_id": enc.current}
    rows = await texts.alone(st, text, params, inline=len(reqs) <= INLINE_MAX)
    queue_of = {r.id: r.queue for r in reqs}
    keyring.learn(set(queue_of.values()), {queue_of[row.id] for row in rows if row.encrypt})
    return answers(reqs, rows)


async def drop_orphan_keys(st: Seam, reqs: list[Request]) -> None:
    """Delete the keys naming a task of ``reqs`` that does not exist: what a plain
    statement claimed before it refused to write the task to an encrypted queue,
    when the submit then cannot go on (this store has no key)."""
    ids = [r.id for r in reqs if r.key is not None]
    if ids:
        await tx.run(st, lambda conn: _drop_orphan_keys(conn, ids))


async def _drop_orphan_keys(conn: AsyncConnection, ids: list[str]) -> None:
    await conn.execute(
        delete(k).where(
            k.c.task_id.in_(sorted(ids)), ~exists(select(t.c.seq).where(t.c.id == k.c.task_id))
        )
    )


#: The columns of a task row (:func:`task_row`) in the order ``insert_rows`` reads.
_ROW_COLUMNS = (
    "id name queue partition payload metadata priority max_attempts backoff created_at "
    "run_at key parent_id root_id correlation_id key_id concurrency_key"
).split()
