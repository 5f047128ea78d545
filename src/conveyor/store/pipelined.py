"""Submits whose statements are sent to the server together.

A submit with keys or partitions (or parents with either) is a transaction of
several statements (:func:`conveyor.store.producer.submit_tx`), one round trip
each; children alone are one statement (:func:`conveyor.store.producer.submit`). Two
common kinds need no answer from one statement to build the next, so where the
dialect has their texts (Postgres: ``submit_partitioned`` and its stream
statements, ``submit_keyed`` and ``key_holder``; see
:meth:`~conveyor.store.seam.Seam._statement_texts`) they go together, pipelined in
one transaction (:func:`conveyor.store.texts.together`), with the same statements
in the same lock order:

* partitioned tasks without keys or parents (:func:`submit_partitioned`);
* one task with a key, conflict ``"reuse"`` or ``"reject"``, no partition or
  parent (:func:`submit_keyed`).

:func:`submit` picks one or answers ``None`` (the producer's usual way then).
"""

from __future__ import annotations

import json

from conveyor import statements as q
from conveyor.errors import AlreadyExists
from conveyor.models import Task
from conveyor.store import codec, producer, texts
from conveyor.store.requests import Request
from conveyor.store.seam import Seam


async def submit(st: Seam, reqs: list[Request]) -> list[Task] | None:
    """The answering tasks of ``reqs`` submitted as statements sent together, or
    ``None`` when they are not of a kind that goes so on this dialect."""
    built = st._texts or await texts.of(st)
    if len(reqs) == 1 and keyed_alone(reqs[0]) and built.get("submit_keyed") is not None:
        keyed = await submit_keyed(st, built, reqs[0])
        if keyed is not None:
            return [keyed]
        return None
    partitioned = any(r.partition is not None for r in reqs)
    if partitioned and no_key_or_parent(reqs) and built.get("submit_partitioned") is not None:
        return await submit_partitioned(st, built, reqs)
    return None


def keyed_alone(r: Request) -> bool:
    """Whether ``r`` has a key (conflict "reuse" or "reject") and no partition or parent."""
    return (
        r.key is not None
        and r.conflict != "replace"
        and r.partition is None
        and r.parent_id is None
    )


async def submit_keyed(st: Seam, built: texts.Texts, r: Request) -> Task | None:
    """One request with a key (conflict "reuse" or "reject"; no partition or parent)
    as two statements sent together: the key claimed and, if the claim won, the task
    written (``submit_keyed``); then the key's holder read, its key row locked
    (``key_holder``). The holder is this request's task if the claim won, else the
    task that has the key: returned (reuse) or refused (reject, nothing written).
    ``None`` when no task holds the key any more (retention deleted it between the
    two statements): :func:`~conveyor.store.producer.submit_tx` then tries again step by step."""
    submit, holder = built.get("submit_keyed"), built.get("key_holder")
    assert submit is not None and holder is not None
    params = {**producer.one_params(r), "key": r.key}
    rows = await texts.together(st, [(submit, params), (holder, {"key": r.key})])
    if not rows:
        return None
    task = codec.row_to_task(rows[0])
    if task.id != r.id and r.conflict == "reject":
        raise AlreadyExists(str(r.key), task.id)
    return task


def no_key_or_parent(reqs: list[Request]) -> bool:
    """Whether none of ``reqs`` has a key or a parent."""
    return not any(r.key is not None or r.parent_id is not None for r in reqs)


async def submit_partitioned(st: Seam, built: texts.Texts, reqs: list[Request]) -> list[Task]:
    """Requests with partitions (no key or parent) as one pipelined transaction of
    five statements, each built once, in the order
    :func:`~conveyor.store.producer.submit_tx` takes its locks: the queues' active
    groups shared; the queue-mode streams of the partitions locked, created as
    needed (producers of a stream commit one after another, so its tasks' order is
    their commit order); the tasks and their delivery rows; the partitions' streams
    of queue mode and every active group locked; and recomputed.
    One round trip where the dialect pipelines, instead of one per statement."""
    names = ("share_groups", "lock_streams", "submit_partitioned")
    share, lock, submit = (built.get(name) for name in names)
    lock_all, refresh = built.get("lock_group_streams"), built.get("refresh_group_streams")
    assert share and lock and submit and lock_all and refresh
    pairs = sorted({(r.queue, r.partition) for r in reqs if r.partition is not None})
    keyed = {"pairs": json.dumps([list(pair) for pair in pairs])}
    params = {**producer.many_params(reqs), "partitions": [r.partition for r in reqs]}
    steps = [
        (share, {"queues": json.dumps(sorted({r.queue for r in reqs}))}),
        # The lock order: group, queue, partition (the pairs are sorted; one group).
        (lock, {"keys": json.dumps([[queue, q.QUEUE_MODE, p] for queue, p in pairs])}),
        (submit, params),
        (lock_all, keyed),
        (refresh, keyed),
    ]
    return producer.answers(reqs, await texts.together(st, steps, rows_of=2))


__all__ = ["keyed_alone", "no_key_or_parent", "submit", "submit_keyed", "submit_partitioned"]
