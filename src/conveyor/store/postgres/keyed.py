"""The Postgres texts of submits with idempotency keys: the keys claimed and
locked, a key's holder read, a holder replaced, and the submit texts of
:mod:`conveyor.store.postgres.submit_texts` writing a task only where its key names it.
Each goes with others, sent together (:mod:`conveyor.store.protocol.submit_together`), or in the
step-by-step submit (:func:`conveyor.store.protocol.producer.submit_tx`).

Each text binds named parameters (``%(name)s``); the contracts are in
:meth:`conveyor.store.seam.Seam._statement_texts`.
"""

from __future__ import annotations

from collections.abc import Mapping

from conveyor.store.postgres import claim as pg_claim
from conveyor.store.postgres import listen as pg_listen
from conveyor.store.postgres.submit_texts import (
    SUBMIT_CHILD,
    SUBMIT_MANY,
    SUBMIT_ONE,
    SUBMIT_PARTITIONED,
    edited,
    submit_text,
)
from conveyor.store.protocol import queries as q

_NOW = pg_claim.NOW

#: The edits of a submit text (with a ``key`` column in its requests) that store
#: each task's key and write a keyed task only where its key's row names it: the
#: key claimed and locked by statements before it (claim_keys, lock_keys), or
#: handed over (replace_key). A task without a key is written as ever.
_WRITTEN_WHERE_KEY_NAMES_IT = (
    (
        "coalesce(r.delay_us, 0)), NULL, NULL, r.id,",
        "coalesce(r.delay_us, 0)), r.key, NULL, r.id,",
    ),
    (
        "LEFT JOIN conveyor_queues AS s ON s.queue = r.queue\n    ORDER BY r.n",
        "LEFT JOIN conveyor_queues AS s ON s.queue = r.queue\n"
        "    WHERE r.key IS NULL OR EXISTS (\n"
        "        SELECT 1 FROM conveyor_keys AS k WHERE k.key = r.key AND k.task_id = r.id\n"
        "    )\n    ORDER BY r.n",
    ),
)


# One task with an idempotency key (conflict "reuse" or "reject"; no partition or
# parent): the key is claimed first, as producer.submit_tx does, and the task and
# its delivery rows are written only if the claim won. A concurrent submit of the
# same key still in flight makes the key's insert wait for its end. The first of two
# statements sent together (see store.pipelined); the second (_KEY_HOLDER) reads
# who holds the key, in a snapshot that has that concurrent submit's commit.
_SUBMIT_KEYED = edited(
    submit_text(SUBMIT_ONE),
    (
        "%(correlation_id)s::text AS correlation_id,\n        1 AS n",
        "%(correlation_id)s::text AS correlation_id,\n        %(key)s::text AS key, 1 AS n",
    ),
    (
        "clock AS (",
        "k AS (\n    INSERT INTO conveyor_keys (key, task_id) SELECT r.key, r.id FROM req AS r\n"
        "    ON CONFLICT (key) DO NOTHING RETURNING key\n),\nclock AS (",
    ),
    (
        "coalesce(r.delay_us, 0)), NULL, NULL, r.id,",
        "coalesce(r.delay_us, 0)), r.key, NULL, r.id,",
    ),
    (
        "LEFT JOIN conveyor_queues AS s ON s.queue = r.queue\n    ORDER BY r.n",
        "LEFT JOIN conveyor_queues AS s ON s.queue = r.queue\n"
        "    WHERE EXISTS (SELECT 1 FROM k)\n    ORDER BY r.n",
    ),
)


# One partitioned task with an idempotency key (conflict "reuse" or "reject"; no
# parent): SUBMIT_PARTITIONED with the key, writing the task only if the key is
# this request's. The fifth of eight statements sent together (see store.pipelined),
# in producer.submit_tx's lock order: the key claimed (claim_keys) and its row
# locked (lock_keys) before the groups and streams; so this statement's snapshot
# has the key row as it stays until the commit. Claimed inside this statement, as
# _SUBMIT_KEYED does, the key would be locked after the streams: a replace of the
# same key, which locks the key and then the streams, could deadlock with it.
_SUBMIT_KEYED_PARTITIONED = edited(
    SUBMIT_PARTITIONED,
    (
        "%(partitions)s::text[]\n    )",
        "%(partitions)s::text[], %(keys)s::text[]\n    )",
    ),
    (
        "correlation_id, partition, n)",
        "correlation_id, partition, key, n)",
    ),
    *_WRITTEN_WHERE_KEY_NAMES_IT,
)

# A batch with keys (conflict "reuse"; no parent) and no partition: the plain
# batch with its ``keys`` list (None entries: no key), each keyed task written only
# if its key's row names it; claimed and locked before, as for _SUBMIT_KEYED_PARTITIONED.
_SUBMIT_KEYED_MANY = edited(
    submit_text(SUBMIT_MANY),
    (
        "%(correlation_ids)s::text[]\n    )",
        "%(correlation_ids)s::text[], %(keys)s::text[]\n    )",
    ),
    (
        "backoff, delay_us, run_at_us, correlation_id, n)",
        "backoff, delay_us, run_at_us, correlation_id, key, n)",
    ),
    *_WRITTEN_WHERE_KEY_NAMES_IT,
)

# The answers of a batch with keys, as queue mode sees them: the tasks ``ids``
# (the requests without a key) with ``holds`` NULL, and the task holding each of
# ``keys``, with ``holds`` its key. The last of the statements sent together.
# Driven by the arrays, a lookup per element (LIMIT 1 keeps each a lookup): joined
# as tables, the generic plan without statistics scanned every delivery row (16 ms
# for 100 keys at 5,000 tasks).
_KEY_ANSWERS = f"""
SELECT a.holds, {pg_claim.view("d", "t")}
FROM (
    SELECT NULL::text AS holds, i.id FROM unnest(%(ids)s::text[]) AS i(id)
    UNION ALL
    SELECT k.key, k.task_id FROM unnest(%(keys)s::text[]) AS u(key)
    CROSS JOIN LATERAL (
        SELECT k.key, k.task_id FROM conveyor_keys AS k WHERE k.key = u.key LIMIT 1
    ) AS k
) AS a
CROSS JOIN LATERAL (SELECT * FROM conveyor_tasks AS t WHERE t.id = a.id LIMIT 1) AS t
CROSS JOIN LATERAL (
    SELECT * FROM conveyor_deliveries AS d
    WHERE d.task_seq = t.seq AND d.grp = '{q.QUEUE_MODE}' LIMIT 1
) AS d
"""


# A single submit that replaces the holder of its key (conflict "replace"; no
# parent): statements sent together (see store.pipelined), in the lock order: the
# key claimed (claim_keys) and its row locked (lock_keys); the groups of both
# queues shared; every stream the replace writes locked in one pass; then, if
# another task holds the key, that task's active rows cancelled (a registered
# wait() told), its streams recomputed, and the key handed over; then the task
# written as every submit of its kind writes it, only if the key names it by then;
# last, key_holder. ``key`` and ``id`` (the new task's) throughout: the holder is
# read from the key row, which names it until the hand-over.
_HOLDER = """
    SELECT t.seq, t.id, t.queue, t.partition
    FROM conveyor_keys AS k JOIN conveyor_tasks AS t ON t.id = k.task_id
    WHERE k.key = %(key)s AND k.task_id <> %(id)s"""
# The holder's streams: those of its delivery rows (queue mode and each group).
_HOLDER_STREAMS = f"""
    SELECT DISTINCT d.queue, d.grp, d.partition
    FROM ({_HOLDER}
    ) AS h JOIN conveyor_deliveries AS d ON d.task_seq = h.seq
    WHERE d.partition IS NOT NULL"""
# The groups of the new task's queue and of the holder's, shared (``queues``: a
# JSON array with the new task's queue), as share_groups does: the lock order puts
# group rows before stream rows, and the holder's streams in groups are locked next.
_REPLACE_SHARE = f"""
SELECT 1 FROM conveyor_groups
WHERE active AND queue IN (
    SELECT json_array_elements_text(%(queues)s::json)
    UNION
    SELECT h.queue FROM ({_HOLDER}
    ) AS h
)
ORDER BY queue, name
FOR SHARE
"""
# Every stream the replace will write, locked in one pass in the lock order
# (created where missing): the holder's, and those of the new task's partition
# (``pairs``, as lock_group_streams takes them; an empty array for none) in queue
# mode and every active group. Locked in two passes, the holder's and then the new
# task's, a stream of the new task's that sorts before one of the holder's was
# taken out of order: a batch locking the two in order deadlocked with it.
_REPLACE_LOCK = pg_claim.lock_streams_text(
    f"""
    SELECT u.queue, u.grp, u.partition, row_number() OVER (
        ORDER BY u.grp COLLATE "C", u.queue COLLATE "C", u.partition COLLATE "C"
    ) AS n
    FROM ({_HOLDER_STREAMS}
        UNION
        SELECT g.queue, g.grp, g.partition FROM ({pg_claim.GROUP_KEYS}
        ) AS g
    ) AS u"""
)
_REPLACE_CANCEL = f"""
WITH holder AS ({_HOLDER}
),
gone AS (
    UPDATE conveyor_deliveries AS d SET
        status = 'cancelled', finished_at = {_NOW}, lease_expires_at = NULL
    FROM holder AS h
    WHERE d.task_seq = h.seq AND d.status IN ('queued', 'running')
    RETURNING h.id
)
SELECT count(pg_notify('{pg_listen.DONE_CHANNEL}', g.id))
FROM (SELECT DISTINCT id FROM gone) AS g
WHERE EXISTS (SELECT 1 FROM conveyor_waiters AS w WHERE w.task_id = g.id)
"""
_REPLACE_REFRESH = pg_claim.refresh_streams_text(_HOLDER_STREAMS)
_REPLACE_KEY = """
UPDATE conveyor_keys SET task_id = %(id)s WHERE key = %(key)s AND task_id <> %(id)s
"""
# The new task when it has no partition: the one-task statement, with its key,
# written only if the key row names it (the claim won, or the key was handed over).
_SUBMIT_KEY_OWNED = edited(
    submit_text(SUBMIT_ONE),
    (
        "%(correlation_id)s::text AS correlation_id,\n        1 AS n",
        "%(correlation_id)s::text AS correlation_id,\n        %(key)s::text AS key, 1 AS n",
    ),
    *_WRITTEN_WHERE_KEY_NAMES_IT,
)


# One child with an idempotency key (conflict "reuse" or "reject"; no partition):
# the one-child statement, with the key claimed as _SUBMIT_KEYED claims it, but
# only when the parent is a task. A missing parent claims nothing and writes
# nothing: the key's holder (_KEY_HOLDER, sent with it) is then whoever held the
# key before, or nobody, and the step-by-step submit raises on the parent.
_SUBMIT_KEYED_CHILD = edited(
    SUBMIT_CHILD,
    (
        "%(parent_id)s::text AS parent_id, 1 AS n",
        "%(parent_id)s::text AS parent_id, %(key)s::text AS key, 1 AS n",
    ),
    (
        "),\nclock AS (",
        "),\nk AS (\n    INSERT INTO conveyor_keys (key, task_id)\n"
        "    SELECT r.key, r.id FROM req AS r WHERE NOT EXISTS (SELECT 1 FROM orphans)\n"
        "    ON CONFLICT (key) DO NOTHING RETURNING key\n),\nclock AS (",
    ),
    (
        "coalesce(r.delay_us, 0)), NULL, r.parent_id,",
        "coalesce(r.delay_us, 0)), r.key, r.parent_id,",
    ),
    (
        "WHERE NOT EXISTS (SELECT 1 FROM orphans)\n    ORDER BY r.n",
        "WHERE NOT EXISTS (SELECT 1 FROM orphans) AND EXISTS (SELECT 1 FROM k)\n    ORDER BY r.n",
    ),
)

# Idempotency keys of a submit (producer.submit_tx, and the submits sent together),
# in the lock order (``keys``, a JSON array sorted by code point, as Python sorts
# them; ``ids``, a JSON array as long: the task each key would go to): claimed
# (those won come back), then the holders locked and read. JSON arrays, as SQLite's
# texts of the same names take them, not a multi-row VALUES of two placeholders per
# key: psycopg parsed such a text anew in Python on every call (a batch of 1,000
# keys: 2,000 placeholders), most of a keyed batch's client time.
_CLAIM_KEYS = """
INSERT INTO conveyor_keys (key, task_id)
SELECT k.key, i.task_id
FROM json_array_elements_text(%(keys)s::json) WITH ORDINALITY AS k(key, n)
JOIN json_array_elements_text(%(ids)s::json) WITH ORDINALITY AS i(task_id, n) USING (n)
ORDER BY n
ON CONFLICT (key) DO NOTHING
RETURNING key
"""
_LOCK_KEYS = """
SELECT key, task_id FROM conveyor_keys
WHERE key IN (SELECT json_array_elements_text(%(keys)s::json))
ORDER BY key COLLATE "C"
FOR UPDATE
"""

# The task that holds idempotency key ``key``, as queue mode sees it, its key row
# locked (as producer.submit_tx locks a holder it did not insert: retention cannot
# delete it before this transaction ends). No row: retention deleted it since.
_KEY_HOLDER = f"""
SELECT {pg_claim.view("d", "t")}
FROM conveyor_keys AS k
JOIN conveyor_tasks AS t ON t.id = k.task_id
JOIN conveyor_deliveries AS d ON d.task_seq = t.seq AND d.grp = '{q.QUEUE_MODE}'
WHERE k.key = %(key)s
FOR UPDATE OF k
"""


def texts() -> Mapping[str, str]:
    """Every text of this module, by statement name."""
    return {
        "submit_keyed": _SUBMIT_KEYED,
        "submit_keyed_child": _SUBMIT_KEYED_CHILD,
        "submit_keyed_partitioned": _SUBMIT_KEYED_PARTITIONED,
        "submit_keyed_many": _SUBMIT_KEYED_MANY,
        "submit_key_owned": _SUBMIT_KEY_OWNED,
        "key_holder": _KEY_HOLDER,
        "key_answers": _KEY_ANSWERS,
        "claim_keys": _CLAIM_KEYS,
        "lock_keys": _LOCK_KEYS,
        "replace_share": _REPLACE_SHARE,
        "replace_lock": _REPLACE_LOCK,
        "replace_cancel": _REPLACE_CANCEL,
        "replace_refresh": _REPLACE_REFRESH,
        "replace_key": _REPLACE_KEY,
    }


__all__ = ["texts"]
