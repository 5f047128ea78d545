"""Submits whose statements are sent to the server together.

A submit with keys or partitions (or parents with either) is a transaction of
several statements; plain tasks and children alone are one statement
(:func:`conveyor.store.protocol.producer.submit`). The kinds below need no answer
from one statement to build the next, so they go together, in one transaction
(:func:`conveyor.store.protocol.texts.together`: one round trip where the dialect
pipelines, Postgres; one hop to the connection thread on SQLite), with the
statements of :func:`~conveyor.store.protocol.producer.submit_tx` in its lock
order (keys, then groups, then streams):

* partitioned tasks without keys or parents (:func:`submit_partitioned`), or
  with parents (:func:`submit_partitioned_children`);
* one task with a key, conflict ``"reuse"`` or ``"reject"``, and no partition or
  parent (:func:`submit_keyed`), or one of the two (:func:`submit_keyed_with`);
* one task with a key, conflict ``"replace"``, and no parent
  (:func:`submit_replacing`);
* a batch with keys, every one conflict ``"reuse"``, and no parent
  (:func:`submit_reusing`).

:func:`submit` picks one or answers ``None``: the other kinds (a batch with
keys refused or replaced, a key with both a partition and a parent) go step by
step (:func:`~conveyor.store.protocol.producer.submit_tx`), on every dialect.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from conveyor.errors import AlreadyExists
from conveyor.models import Task
from conveyor.store.protocol import codec, depth, producer, sealing, texts
from conveyor.store.protocol import queries as q
from conveyor.store.protocol import transactions as tx
from conveyor.store.protocol.requests import Request
from conveyor.store.seam import Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


async def submit(
    st: Seam, reqs: list[Request], conn: AsyncConnection | None = None
) -> list[Task] | None:
    """The answering tasks of ``reqs`` submitted as statements sent together, or
    ``None`` when they are not of a kind that goes so. On ``conn`` (a caller's, in
    its transaction) the same statements run one after another there, each in its
    variant for a caller's transaction."""
    if any(r.concurrency_key is not None for r in reqs):
        return None  # step by step: only insert_rows writes a concurrency key
    built = st._texts or await texts.of(st)
    if conn is not None:
        built = texts.on(st, conn).in_callers()
    if len(reqs) == 1 and keyed_alone(reqs[0]):
        keyed = await submit_keyed(st, built, reqs[0], conn)
        return None if keyed is None else [keyed]
    if len(reqs) == 1 and keyed_with_one(reqs[0]):
        keyed = await submit_keyed_with(st, built, reqs[0], conn)
        return None if keyed is None else [keyed]
    if len(reqs) == 1 and replacing(reqs[0]):
        keyed = await submit_replacing(st, built, reqs[0], conn)
        return None if keyed is None else [keyed]
    partitioned = any(r.partition is not None for r in reqs)
    if partitioned and no_key_or_parent(reqs):
        return await submit_partitioned(st, built, reqs, conn)
    if partitioned and not any(r.key is not None for r in reqs):
        return await submit_partitioned_children(st, built, reqs, conn)
    if len(reqs) > 1 and reusing(reqs):
        return await submit_reusing(st, built, reqs, conn)
    return None


def reusing(reqs: list[Request]) -> bool:
    """Whether some of ``reqs`` have keys, every key conflict "reuse", and none of
    them a parent."""
    return any(r.key is not None for r in reqs) and all(
        r.parent_id is None and (r.key is None or r.conflict == "reuse") for r in reqs
    )


async def submit_reusing(
    st: Seam, built: texts.Texts, reqs: list[Request], conn: AsyncConnection | None = None
) -> list[Task]:
    """A batch with keys, every conflict "reuse" and no parent, as statements sent
    together, in :func:`~conveyor.store.protocol.producer.submit_tx`'s lock order: the keys
    claimed (``claim_keys``: each for the first request that has it) and locked
    (``lock_keys``), in code-point order; the tasks written, each keyed one only
    if its key's row names it (``submit_keyed_many``, or, with partitions, what
    :func:`submit_partitioned` sends with ``submit_keyed_partitioned``); then the
    answers (``key_answers``): each request without a key its own task, each with
    one the task holding it. A key found without a holder at the end (retention
    took it between its claim and its lock: its request was not written) has its
    requests submitted again the usual way."""
    partitioned = any(r.partition is not None for r in reqs)
    claim, lock_key, answer = built["claim_keys"], built["lock_keys"], built["key_answers"]
    submit = built["submit_keyed_partitioned" if partitioned else "submit_keyed_many"]
    stream_steps = _stream_steps(built, reqs) if partitioned else ([], [])
    first: dict[str, str] = {}
    for r in reqs:
        if r.key is not None:
            first.setdefault(r.key, r.id)
    keys = sorted(first)
    params = {**producer.many_params(reqs), "keys": [r.key for r in reqs]}
    if partitioned:
        params["partitions"] = [r.partition for r in reqs]
    before, after = stream_steps
    steps: _Steps = [
        *_key_steps(claim, lock_key, first),
        *before,
        (submit, params),
        *after,
        (answer, {"ids": [r.id for r in reqs if r.key is None], "keys": keys}),
    ]
    rows = await texts.together(st, steps, conn=conn, inline=_short(reqs))
    by_id: dict[str, Task] = {}
    by_key: dict[str, Task] = {}
    for row in rows:
        task = codec.row_to_task(row, st._keyring)
        if row.holds is None:
            by_id[task.id] = task
        else:
            by_key[row.holds] = task
    if any(r.key is None and r.id not in by_id for r in reqs):
        # The tasks' statement wrote none (a queue of them is encrypted: sealing).
        raise sealing.Refused(*{r.queue for r in reqs})
    lost = [r for r in reqs if r.key is not None and r.key not in by_key]
    if lost:
        if conn is not None:
            again = await producer.submit_tx(st, conn, lost)
        else:
            try:
                again = await producer.submit(st, lost)
            except depth.Capped:  # the rest committed already: only these again
                again = await tx.run(st, lambda c: producer.submit_tx(st, c, lost))
        by_key.update({str(r.key): task for r, task in zip(lost, again, strict=True)})
    return [by_id[r.id] if r.key is None else by_key[r.key] for r in reqs]


def keyed_alone(r: Request) -> bool:
    """Whether ``r`` has a key (conflict "reuse" or "reject") and no partition or parent."""
    return (
        r.key is not None
        and r.conflict != "replace"
        and r.partition is None
        and r.parent_id is None
    )


def keyed_with_one(r: Request) -> bool:
    """Whether ``r`` has a key (conflict "reuse" or "reject") and either a partition
    or a parent, not both."""
    return (
        r.key is not None
        and r.conflict != "replace"
        and (r.partition is None) != (r.parent_id is None)
    )


async def submit_keyed_with(
    st: Seam, built: texts.Texts, r: Request, conn: AsyncConnection | None = None
) -> Task | None:
    """One request with a key (conflict "reuse" or "reject") and a parent or a
    partition, as statements sent together, ending with ``key_holder``: the task
    holding the key, this request's if its claim won. ``None`` when no task holds
    the key at the end (its holder went meanwhile, or the parent is not a task):
    the step-by-step submit then decides.

    With a parent, two statements: ``submit_keyed_child`` claims the key, if the
    parent is a task, and writes the child if the claim won. With a partition,
    eight, in :func:`~conveyor.store.protocol.producer.submit_tx`'s lock order: the key
    claimed (``claim_keys``) and its row locked (``lock_keys``), then what
    :func:`submit_partitioned` sends, the task written only if the key is its own
    (``submit_keyed_partitioned``)."""
    key = str(r.key)
    steps: _Steps
    holder = built["key_holder"]
    if r.parent_id is not None:
        steps = [(built["submit_keyed_child"], keyed_params(r))]
    else:
        claim, lock_key = built["claim_keys"], built["lock_keys"]
        submit = built["submit_keyed_partitioned"]
        before, after = _stream_steps(built, [r])
        params = {**producer.many_params([r]), "partitions": [r.partition], "keys": [key]}
        steps = [
            *_key_steps(claim, lock_key, {key: r.id}),
            *before,
            (submit, params),
            *after,
        ]
    rows = await texts.together(st, [*steps, (holder, {"key": key})], conn=conn, inline=True)
    if not rows:
        return None
    task = codec.row_to_task(rows[0], st._keyring)
    if task.id != r.id and r.conflict == "reject":
        raise AlreadyExists(key, task.id)
    return task


def replacing(r: Request) -> bool:
    """Whether ``r`` has a key, conflict "replace", and no parent."""
    return r.key is not None and r.conflict == "replace" and r.parent_id is None


async def submit_replacing(
    st: Seam, built: texts.Texts, r: Request, conn: AsyncConnection | None = None
) -> Task | None:
    """One request with a key, conflict "replace" (a partition or none; no parent),
    as statements sent together, in the lock order: the key claimed
    (``claim_keys``) and its row locked (``lock_keys``); the groups of the new
    task's queue and of the holder's shared (``replace_share``); every stream the
    replace writes, the holder's and the new task's, locked in one pass
    (``replace_lock``); if another task holds the key, that task withdrawn as
    :func:`~conveyor.store.protocol.withdraw.cancel_tx` withdraws it (``replace_cancel``:
    its active rows cancelled, a ``wait()`` for it told; ``replace_refresh``: its
    streams recomputed) and the key handed over (``replace_key``); then the task
    written, only if the key names it by then (``submit_key_owned``, or
    ``submit_keyed_partitioned`` and its streams recomputed); last ``key_holder``,
    the answer. ``None`` when no task holds the key at the end (retention took the
    key between its claim and its lock): the step-by-step submit then decides."""
    claim, lock_key, holder = built["claim_keys"], built["lock_keys"], built["key_holder"]
    share, lock_streams = built["replace_share"], built["replace_lock"]
    cancel, refresh, hand_over = (
        built["replace_cancel"],
        built["replace_refresh"],
        built["replace_key"],
    )
    key = str(r.key)
    ids = {"key": key, "id": r.id}
    pairs = [] if r.partition is None else [[r.queue, r.partition]]
    steps: _Steps = [
        *_key_steps(claim, lock_key, {key: r.id}),
        (share, {**ids, "queues": json.dumps([r.queue])}),
        # The holder's streams and the new task's, in one pass in the lock order.
        (lock_streams, {**ids, "pairs": json.dumps(pairs)}),
        (cancel, ids),
        (refresh, ids),
        (hand_over, ids),
    ]
    if r.partition is None:
        steps.append((built["submit_key_owned"], keyed_params(r)))
    else:
        submit = built["submit_keyed_partitioned"]
        # Its groups and streams are held already: only the writes after it, whose
        # locks are those of the first pass.
        _, after = _stream_steps(built, [r])
        params = {**producer.many_params([r]), "partitions": [r.partition], "keys": [key]}
        steps += [(submit, params), *after]
    rows = await texts.together(st, [*steps, (holder, {"key": key})], conn=conn, inline=True)
    return codec.row_to_task(rows[0], st._keyring) if rows else None


async def submit_keyed(
    st: Seam, built: texts.Texts, r: Request, conn: AsyncConnection | None = None
) -> Task | None:
    """One request with a key (conflict "reuse" or "reject"; no partition or parent)
    as two statements sent together: the key claimed and, if the claim won, the task
    written (``submit_keyed``); then the key's holder read, its key row locked
    (``key_holder``). The holder is this request's task if the claim won, else the
    task that has the key: returned (reuse) or refused (reject, nothing written).
    ``None`` when no task holds the key any more (retention deleted it between the
    two statements): :func:`.producer.submit_tx` then tries again step by step."""
    submit, holder = built["submit_keyed"], built["key_holder"]
    steps: _Steps = [(submit, keyed_params(r)), (holder, {"key": r.key})]
    rows = await texts.together(st, steps, conn=conn, inline=True)
    if not rows:
        return None
    task = codec.row_to_task(rows[0], st._keyring)
    if task.id != r.id and r.conflict == "reject":
        raise AlreadyExists(str(r.key), task.id)
    return task


def no_key_or_parent(reqs: list[Request]) -> bool:
    """Whether none of ``reqs`` has a key or a parent."""
    return not any(r.key is not None or r.parent_id is not None for r in reqs)


async def submit_partitioned(
    st: Seam, built: texts.Texts, reqs: list[Request], conn: AsyncConnection | None = None
) -> list[Task]:
    """Requests with partitions (no key or parent) as one pipelined transaction of
    five statements, each built once, in the order
    :func:`~conveyor.store.protocol.producer.submit_tx` takes its locks: the queues' active
    groups shared; the queue-mode streams of the partitions locked, created as
    needed (producers of a stream commit one after another, so its tasks' order is
    their commit order); the tasks and their delivery rows; the partitions' streams
    of queue mode and every active group locked; and recomputed.
    One round trip where the dialect pipelines, instead of one per statement."""
    submit = built["submit_partitioned"]
    before, after = _stream_steps(built, reqs)
    params = {**producer.many_params(reqs), "partitions": [r.partition for r in reqs]}
    steps = [*before, (submit, params), *after]
    rows = await texts.together(st, steps, rows_of=len(before), conn=conn, inline=_short(reqs))
    return producer.answers(reqs, rows)


async def submit_partitioned_children(
    st: Seam, built: texts.Texts, reqs: list[Request], conn: AsyncConnection | None = None
) -> list[Task]:
    """Requests with partitions and parents (no key) as :func:`submit_partitioned`
    sends partitioned ones, the tasks written by ``submit_partitioned_children``
    (each child's root its parent's), the streams locked only if every parent is a
    task: a parent that is not writes nothing, no stream row either, and raises."""
    submit = built["submit_partitioned_children"]
    parents = [r.parent_id for r in reqs]
    before, after = _stream_steps(built, reqs, parents)
    params = {
        **producer.many_params(reqs),
        "partitions": [r.partition for r in reqs],
        "parent_ids": parents,
    }
    steps = [*before, (submit, params), *after]
    rows = await texts.together(st, steps, rows_of=len(before), conn=conn, inline=_short(reqs))
    return producer.family_answers(reqs, rows)


_Steps = list[tuple[texts.Text, Mapping[str, object]]]


def _short(reqs: list[Request]) -> bool:
    """Whether the submit of ``reqs`` is short enough to run on the caller's thread
    where the dialect's connection runner allows (:data:`.producer.INLINE_MAX`)."""
    return len(reqs) <= producer.INLINE_MAX


def keyed_params(r: Request) -> dict[str, object]:
    """The parameters of the one-task keyed submits (``submit_keyed``,
    ``submit_keyed_child``, ``submit_key_owned``): ``submit_one``'s, ``key`` and
    ``parent_id`` (``None`` for none), one set for the three, whose SQL a dialect
    may share."""
    return {**producer.one_params(r), "key": r.key, "parent_id": r.parent_id}


def _key_steps(claim: texts.Text, lock: texts.Text, first: dict[str, str]) -> _Steps:
    """The idempotency keys ``first`` (key -> the id of the task it would go to)
    claimed, then their rows locked, in the lock order (by code point): the first
    statements of every keyed submit sent together."""
    keys = sorted(first)
    return [
        (claim, {"keys": json.dumps(keys), "ids": json.dumps([first[key] for key in keys])}),
        (lock, {"keys": json.dumps(keys)}),
    ]


def _stream_steps(
    built: texts.Texts, reqs: list[Request], parents: list[str | None] | None = None
) -> tuple[_Steps, _Steps]:
    """The statements a write of partitioned ``reqs`` goes between: before it, the
    queues' active groups shared and the partitions' queue-mode streams locked
    (created as needed); after it, the partitions' streams of queue mode and every
    active group locked and recomputed (a debounced queue's set to wait out its
    quiet period). With ``parents`` (the requests' parent ids), the locks are
    taken, and the rows created, only if every parent is a task."""
    guard = "_if_parents" if parents is not None else ""
    share, refresh = built["share_groups"], built["refresh_group_streams"]
    lock, lock_all = built[f"lock_streams{guard}"], built[f"lock_group_streams{guard}"]
    pairs = sorted({(r.queue, r.partition) for r in reqs if r.partition is not None})
    keyed = {"pairs": json.dumps([list(pair) for pair in pairs])}
    guarded: dict[str, object] = {} if parents is None else {"parent_ids": parents}
    before: _Steps = [
        (share, {"queues": json.dumps(sorted({r.queue for r in reqs}))}),
        # The lock order: group, queue, partition (the pairs are sorted; one group).
        (
            lock,
            {"keys": json.dumps([[queue, q.QUEUE_MODE, p] for queue, p in pairs]), **guarded},
        ),
    ]
    return before, [(lock_all, {**keyed, **guarded}), (refresh, keyed)]


__all__ = [
    "keyed_alone",
    "keyed_with_one",
    "no_key_or_parent",
    "replacing",
    "reusing",
    "submit",
    "submit_keyed",
    "submit_keyed_with",
    "submit_partitioned",
    "submit_partitioned_children",
    "submit_replacing",
    "submit_reusing",
]
