"""The Postgres texts of the built-once statements (:mod:`conveyor.store.texts`):
the ones whose SQL differs from the shared builders, because they use what
SQLite lacks (data-modifying CTEs, arrays, ``UPDATE … FROM unnest``).

Each text binds named parameters (``%(name)s``); the contracts are in
:meth:`conveyor.store.seam.Seam._statement_texts`.
"""

from __future__ import annotations

from collections.abc import Mapping

from conveyor import statements as q
from conveyor.store import pg_claim, pg_listen

# The clock of the one-statement texts below (the statement's moment, moved by the
# store's clock_offset): the same fragment as the claim's.
_NOW = pg_claim.NOW


# Acknowledge a batch in one statement: each item fenced on its own (leased to its
# worker, on its attempt), a notification for each finished task that a wait() is
# registered for (conveyor_waiters: one index probe per task, none sent when nobody
# waits, so an ordinary acknowledgement costs no NOTIFY), and only what the caller
# needs back: the items that failed the fence, and those left for the step-by-step
# path (partitioned rows, whose stream must be refreshed in the same transaction).
# ``note`` drives the final join, so it always runs.
_ACK_TEXT = (
    pg_claim.ack_head(True, "i.id, d.grp")
    + """
note AS (
    SELECT count(pg_notify('{done}', done.id)) AS n FROM done
    WHERE EXISTS (SELECT 1 FROM conveyor_waiters AS w WHERE w.task_id = done.id)
)
SELECT lost.idx
FROM note LEFT JOIN ("""
    + pg_claim.LOST
    + """
) AS lost ON true
"""
)


# Submit plain tasks (no key, partition or parent) in one statement: insert the
# task rows, fan out their delivery rows (queue mode and every active group) and
# announce the queues when some listener can hear it (``gate``, see
# pg_listen.NOBODY_LISTENS), all from arrays. Data-modifying CTEs, which SQLite lacks.
_SUBMIT_MANY = """
    SELECT * FROM unnest(
        %(ids)s::text[], %(names)s::text[], %(queues)s::text[], %(payloads)s::text[],
        %(metadatas)s::text[], %(priorities)s::int[], %(max_attempts)s::int[],
        %(backoffs)s::text[], %(delays)s::bigint[], %(run_ats)s::bigint[],
        %(correlation_ids)s::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, n)
"""
# One task: the same statement from scalars. Dumping eleven one-element arrays costs
# the driver several times what eleven plain values do.
_SUBMIT_ONE = """
    SELECT %(id)s::text AS id, %(name)s::text AS name, %(queue)s::text AS queue,
        %(payload)s::text AS payload, %(metadata)s::text AS metadata,
        %(priority)s::int AS priority, %(max_attempts)s::int AS max_attempts,
        %(backoff)s::text AS backoff, %(delay)s::bigint AS delay_us,
        %(run_at)s::bigint AS run_at_us, %(correlation_id)s::text AS correlation_id,
        1 AS n
"""
_SUBMIT_TEXT = f"""
WITH req AS ({{req}}),
clock AS (SELECT {_NOW} AS now),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, {q.DEFAULT_MAX_ATTEMPTS}),
        coalesce(r.backoff, s.backoff), c.now,
        coalesce(r.run_at_us, c.now + coalesce(r.delay_us, 0)), NULL, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '{q.QUEUE_MODE}', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT {pg_listen.NOBODY_LISTENS} AS nobody),
note AS (
    SELECT count(pg_notify('{{work}}', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins
"""


# The rows of a submit that went the step-by-step way (keys, partitions, parents):
# the task rows, given whole (see producer.task_row) as one JSON array of arrays in
# request order, and their delivery rows (queue mode and every active group, as
# statements.fan_out); returns the streams the new rows joined. One short, fixed
# text: built by SQLAlchemy as a multi-row VALUES of 15 placeholders per row, then
# an IN list of the new sequence numbers twice, a batch of 1,000 was three
# statements of ~15,000 placeholders each, and psycopg parsed each anew in Python on
# every call (too long for its cache): about a third of a partitioned batch's time.
_INSERT_ROWS = f"""
WITH r AS (
    SELECT e.v ->> 0 AS id, e.v ->> 1 AS name, e.v ->> 2 AS queue, e.v ->> 3 AS partition,
        e.v ->> 4 AS payload, e.v ->> 5 AS metadata, (e.v ->> 6)::int AS priority,
        (e.v ->> 7)::int AS max_attempts, e.v ->> 8 AS backoff,
        (e.v ->> 9)::bigint AS created_at, (e.v ->> 10)::bigint AS run_at, e.v ->> 11 AS key,
        e.v ->> 12 AS parent_id, e.v ->> 13 AS root_id, e.v ->> 14 AS correlation_id, e.n
    FROM json_array_elements(%(rows)s::json) WITH ORDINALITY AS e(v, n)
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT id, name, queue, partition, payload, metadata, priority, max_attempts, backoff,
        created_at, run_at, key, parent_id, root_id, correlation_id
    FROM r ORDER BY n
    RETURNING seq, queue, partition, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '{q.QUEUE_MODE}', i.queue, i.partition, i.priority, i.max_attempts,
        'queued', 0, i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, i.partition, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
    RETURNING queue, grp, partition
)
SELECT DISTINCT queue, grp, partition FROM fan WHERE partition IS NOT NULL
"""


# A wait() registers before its first look, so a completion committed after the
# registration is announced; expired rows (a waiter that crashed) are cleared by
# later registrations. ``ttl_us``: how long the row holds without renewal.
_WAITER_ADD = f"""
WITH gone AS (DELETE FROM conveyor_waiters WHERE expires_at < {_NOW})
INSERT INTO conveyor_waiters (task_id, token, expires_at)
VALUES (%(task_id)s, %(token)s, {_NOW} + %(ttl_us)s)
ON CONFLICT (task_id, token) DO UPDATE SET expires_at = excluded.expires_at
"""
_WAITER_DROP = """
DELETE FROM conveyor_waiters WHERE task_id = %(task_id)s AND token = %(token)s
"""


# One succeed() of an unpartitioned task: the fenced write, the announcement when
# a wait() is registered for it, and the task as the group sees it. No row: the
# fence failed or the row is partitioned, and the step-by-step path decides.
def _succeed_text() -> str:
    return f"""
WITH done AS (
    UPDATE conveyor_deliveries AS d SET
        status = 'succeeded',
        result = %(result)s,
        finished_at = {_NOW},
        lease_expires_at = NULL
    FROM conveyor_tasks AS t
    WHERE t.id = %(id)s AND d.task_seq = t.seq AND d.grp = %(grp)s
      AND d.status = 'running' AND d.worker_id = %(worker_id)s
      AND (%(attempt)s::int IS NULL OR d.attempt = %(attempt)s::int)
      AND d.partition IS NULL
    RETURNING {pg_claim.view("d", "t")}
),
note AS (
    SELECT count(pg_notify('{pg_listen.DONE_CHANNEL}', done.id)) AS n FROM done
    WHERE EXISTS (SELECT 1 FROM conveyor_waiters AS w WHERE w.task_id = done.id)
)
SELECT done.* FROM note, done
"""


def _submit_text(req: str) -> str:
    return _SUBMIT_TEXT.replace("{req}", req).replace("{work}", pg_listen.WORK_CHANNEL)


def _edited(text: str, *edits: tuple[str, str] | tuple[str, str, int]) -> str:
    """``text`` with each edit's old fragment replaced by its new one; each fragment
    must occur exactly as often as the edit says (once by default), so a change to
    the text edited cannot leave a variant silently unedited."""
    for edit in edits:
        old, new = edit[0], edit[1]
        times = edit[2] if len(edit) == 3 else 1
        found = text.count(old)
        if found != times:
            raise AssertionError(f"{old!r} occurs {found} times, not {times}")
        text = text.replace(old, new)
    return text


# Tasks with partitions (no key or parent): the same statement with a ``partitions``
# list (None entries: unpartitioned), each task and delivery row in its partition.
# The third of the five statements of a pipelined submit (see store.pipelined):
# after the active groups are shared and the queue-mode streams locked, before the
# streams the rows joined are locked and recomputed.
_SUBMIT_PARTITIONED = _edited(
    _submit_text(_SUBMIT_MANY),
    (
        "%(correlation_ids)s::text[]\n    )",
        "%(correlation_ids)s::text[], %(partitions)s::text[]\n    )",
    ),
    (
        "backoff, delay_us, run_at_us, correlation_id, n)",
        "backoff, delay_us, run_at_us, correlation_id, partition, n)",
    ),
    (
        "SELECT r.id, r.name, r.queue, NULL, r.payload",
        "SELECT r.id, r.name, r.queue, r.partition, r.payload",
    ),
    (
        "RETURNING seq, id, queue, priority, max_attempts, created_at, run_at",
        "RETURNING seq, id, queue, partition, priority, max_attempts, created_at, run_at",
    ),
    # both delivery branches: queue mode and the groups
    ("i.queue, NULL, i.priority", "i.queue, i.partition, i.priority", 2),
)

# One task with an idempotency key (conflict "reuse" or "reject"; no partition or
# parent): the key is claimed first, as producer.submit_tx does, and the task and
# its delivery rows are written only if the claim won. A concurrent submit of the
# same key still in flight makes the key's insert wait for its end. The first of two
# statements sent together (see store.pipelined); the second (_KEY_HOLDER) reads
# who holds the key, in a snapshot that has that concurrent submit's commit.
_SUBMIT_KEYED = _edited(
    _submit_text(_SUBMIT_ONE),
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
# parent): _SUBMIT_PARTITIONED with the key, writing the task only if the key is
# this request's. The fifth of eight statements sent together (see store.pipelined),
# in producer.submit_tx's lock order: the key claimed (claim_keys) and its row
# locked (lock_keys) before the groups and streams; so this statement's snapshot
# has the key row as it stays until the commit. Claimed inside this statement, as
# _SUBMIT_KEYED does, the key would be locked after the streams: a replace of the
# same key, which locks the key and then the streams, could deadlock with it.
_SUBMIT_KEYED_PARTITIONED = _edited(
    _SUBMIT_PARTITIONED,
    (
        "%(partitions)s::text[]\n    )",
        "%(partitions)s::text[], %(keys)s::text[]\n    )",
    ),
    (
        "correlation_id, partition, n)",
        "correlation_id, partition, key, n)",
    ),
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

# A batch with keys (conflict "reuse"; no parent) and no partition: the plain
# batch with its ``keys`` list (None entries: no key), each keyed task written only
# if its key's row names it; claimed and locked before, as for _SUBMIT_KEYED_PARTITIONED.
_SUBMIT_KEYED_MANY = _edited(
    _submit_text(_SUBMIT_MANY),
    (
        "%(correlation_ids)s::text[]\n    )",
        "%(correlation_ids)s::text[], %(keys)s::text[]\n    )",
    ),
    (
        "backoff, delay_us, run_at_us, correlation_id, n)",
        "backoff, delay_us, run_at_us, correlation_id, key, n)",
    ),
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
# parent): statements sent together (see store.pipelined), in the order of
# producer.submit_tx's: the key claimed (claim_keys) and its row locked
# (lock_keys); then, if another task holds it, that task's streams locked in the
# lock order, its active rows cancelled (a registered wait() told), its streams
# recomputed, and the key handed over; then the task written as every submit of
# its kind writes it, only if the key names it by then; last, key_holder.
# ``key`` and ``id`` (the new task's) throughout: the holder is read from the key
# row, which names it until the hand-over.
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
_REPLACE_LOCK = f"""
SELECT 1 FROM conveyor_streams AS s
JOIN ({_HOLDER_STREAMS}
) AS k ON s.queue = k.queue AND s.grp = k.grp AND s.partition = k.partition
ORDER BY s.grp COLLATE "C", s.queue COLLATE "C", s.partition COLLATE "C"
FOR UPDATE OF s
"""
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
_SUBMIT_KEY_OWNED = _edited(
    _submit_text(_SUBMIT_ONE),
    (
        "%(correlation_id)s::text AS correlation_id,\n        1 AS n",
        "%(correlation_id)s::text AS correlation_id,\n        %(key)s::text AS key, 1 AS n",
    ),
    (
        "coalesce(r.delay_us, 0)), NULL, NULL, r.id,",
        "coalesce(r.delay_us, 0)), r.key, NULL, r.id,",
    ),
    (
        "LEFT JOIN conveyor_queues AS s ON s.queue = r.queue\n    ORDER BY r.n",
        "LEFT JOIN conveyor_queues AS s ON s.queue = r.queue\n"
        "    WHERE EXISTS (\n"
        "        SELECT 1 FROM conveyor_keys AS k WHERE k.key = r.key AND k.task_id = r.id\n"
        "    )\n    ORDER BY r.n",
    ),
)


# Tasks with parents (no key or partition): the plain statement with each task's
# ``parent_id`` (None: no parent), whose ``root_id`` is its parent's root, read in
# the statement's snapshot as producer.insert_tasks reads it. If any parent is not
# a task, nothing is written and the missing parents come back as ``orphan`` rows.
def _with_parents(text: str, one: bool) -> str:
    edits: list[tuple[str, str]] = []
    if one:
        edits.append(
            (
                "%(correlation_id)s::text AS correlation_id,\n        1 AS n",
                "%(correlation_id)s::text AS correlation_id,\n"
                "        %(parent_id)s::text AS parent_id, 1 AS n",
            )
        )
    else:
        edits += [
            (
                "%(correlation_ids)s::text[]\n    )",
                "%(correlation_ids)s::text[], %(parent_ids)s::text[]\n    )",
            ),
            (
                "backoff, delay_us, run_at_us, correlation_id, n)",
                "backoff, delay_us, run_at_us, correlation_id, parent_id, n)",
            ),
        ]
    return _edited(
        text,
        *edits,
        (
            "clock AS (",
            "orphans AS (\n    SELECT r.parent_id FROM req AS r WHERE r.parent_id IS NOT NULL\n"
            "      AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS p WHERE p.id = r.parent_id)\n"
            "),\nclock AS (",
        ),
        (
            "coalesce(r.delay_us, 0)), NULL, NULL, r.id,",
            "coalesce(r.delay_us, 0)), NULL, r.parent_id, coalesce(p.root_id, r.id),",
        ),
        (
            "LEFT JOIN conveyor_queues AS s ON s.queue = r.queue\n    ORDER BY r.n",
            "LEFT JOIN conveyor_queues AS s ON s.queue = r.queue\n"
            "    LEFT JOIN conveyor_tasks AS p ON p.id = r.parent_id\n"
            "    WHERE NOT EXISTS (SELECT 1 FROM orphans)\n    ORDER BY r.n",
        ),
        (
            "RETURNING seq, id, queue, priority, max_attempts, created_at, run_at\n",
            "RETURNING seq, id, queue, priority, max_attempts, created_at, run_at, root_id\n",
        ),
        (
            "SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins\n",
            "SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at, ins.root_id,\n"
            "    NULL::text AS orphan\nFROM note, ins\nUNION ALL\n"
            "SELECT NULL, NULL, NULL, NULL, NULL, o.parent_id FROM orphans AS o\n",
        ),
    )


_SUBMIT_CHILD = _with_parents(_submit_text(_SUBMIT_ONE), one=True)
_SUBMIT_CHILDREN = _with_parents(_submit_text(_SUBMIT_MANY), one=False)

# Children with partitions (no key): _SUBMIT_CHILDREN with a ``partitions`` list,
# each task and delivery row in its partition; between the stream statements, as
# _SUBMIT_PARTITIONED is (see store.pipelined), whose locks are then taken only if
# every parent is a task.
_SUBMIT_PARTITIONED_CHILDREN = _edited(
    _SUBMIT_CHILDREN,
    (
        "%(correlation_ids)s::text[], %(parent_ids)s::text[]\n    )",
        "%(correlation_ids)s::text[], %(parent_ids)s::text[], %(partitions)s::text[]\n    )",
    ),
    (
        "correlation_id, parent_id, n)",
        "correlation_id, parent_id, partition, n)",
    ),
    (
        "SELECT r.id, r.name, r.queue, NULL, r.payload",
        "SELECT r.id, r.name, r.queue, r.partition, r.payload",
    ),
    (
        "RETURNING seq, id, queue, priority, max_attempts, created_at, run_at, root_id",
        "RETURNING seq, id, queue, partition, priority, max_attempts, created_at, run_at, root_id",
    ),
    ("i.queue, NULL, i.priority", "i.queue, i.partition, i.priority", 2),
)

# One child with an idempotency key (conflict "reuse" or "reject"; no partition):
# the one-child statement, with the key claimed as _SUBMIT_KEYED claims it, but
# only when the parent is a task. A missing parent claims nothing and writes
# nothing: the key's holder (_KEY_HOLDER, sent with it) is then whoever held the
# key before, or nobody, and the step-by-step submit raises on the parent.
_SUBMIT_KEYED_CHILD = _edited(
    _SUBMIT_CHILD,
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

# Idempotency keys of a submit that goes step by step (producer.submit_tx), in the
# lock order (``keys`` sorted by code point, as Python sorts them; ``ids``: the
# task each key would go to): claimed (those won come back), then the holders of
# the keys not won locked and read. Arrays, not a multi-row VALUES of two
# placeholders per key: psycopg parsed such a text anew in Python on every call (a
# batch of 1,000 keys: 2,000 placeholders), most of a keyed batch's client time.
_CLAIM_KEYS = """
INSERT INTO conveyor_keys (key, task_id)
SELECT e.key, e.task_id
FROM unnest(%(keys)s::text[], %(ids)s::text[]) WITH ORDINALITY AS e(key, task_id, n)
ORDER BY e.n
ON CONFLICT (key) DO NOTHING
RETURNING key
"""
_LOCK_KEYS = """
SELECT key, task_id FROM conveyor_keys
WHERE key = ANY(%(keys)s::text[])
ORDER BY key COLLATE "C"
FOR UPDATE
"""

# The clock reading and the stored settings of ``queues`` (at least one row),
# and the announcement of new work or of finished tasks (pg_listen.NOTIFY), for a
# submit that goes step by step and the other transactions of the protocol: the
# same statements as the shared ones, as texts built once.
_SUBMIT_CONTEXT = f"""
SELECT c.now, s.queue, s.max_attempts, s.backoff
FROM (SELECT {_NOW} AS now) AS c
LEFT JOIN conveyor_queues AS s ON s.queue = ANY(%(queues)s::text[])
"""
_NOTIFY = _edited(
    str(pg_listen.NOTIFY),
    ("CAST(:channels AS text[])", "%(channels)s::text[]"),
    ("CAST(:payloads AS text[])", "%(payloads)s::text[]"),
)

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

# The first of those five: the active groups of the queues shared, as
# producer.insert_tasks does (the lock order: group rows before stream rows).
_SHARE_GROUPS = """
SELECT 1 FROM conveyor_groups
WHERE queue IN (SELECT json_array_elements_text(%(queues)s::json)) AND active
ORDER BY queue, name
FOR SHARE
"""


def texts(durable_claims: bool = False) -> Mapping[str, str]:
    """Every Postgres text, by statement name (``durable_claims``: the claim's commit
    waits for the WAL flush, see :data:`conveyor.store.pg_claim.QUICK_COMMIT`)."""
    return {
        "claim_one": pg_claim.claim_text(True, durable_claims),
        "claim_any": pg_claim.claim_text(False, durable_claims),
        "submit_plain": _submit_text(_SUBMIT_MANY),
        "submit_one": _submit_text(_SUBMIT_ONE),
        "ack_plain": _ACK_TEXT.replace("{done}", pg_listen.DONE_CHANNEL),
        "succeed_plain": _succeed_text(),
        "waiter_add": _WAITER_ADD,
        "waiter_drop": _WAITER_DROP,
        "ack_streams_lock": pg_claim.ACK_LOCK_TEXT,
        "ack_streams": pg_claim.ack_streams_text(pg_listen.DONE_CHANNEL, pg_listen.WORK_CHANNEL),
        "insert_rows": _INSERT_ROWS,
        "lock_streams": pg_claim.LOCK_STREAMS,
        "share_groups": _SHARE_GROUPS,
        "submit_keyed": _SUBMIT_KEYED,
        "submit_child": _SUBMIT_CHILD,
        "submit_children": _SUBMIT_CHILDREN,
        "submit_partitioned_children": _SUBMIT_PARTITIONED_CHILDREN,
        "lock_streams_if_parents": pg_claim.LOCK_STREAMS_IF_PARENTS,
        "lock_group_streams_if_parents": pg_claim.LOCK_GROUP_STREAMS_IF_PARENTS,
        "submit_keyed_child": _SUBMIT_KEYED_CHILD,
        "submit_keyed_partitioned": _SUBMIT_KEYED_PARTITIONED,
        "submit_key_owned": _SUBMIT_KEY_OWNED,
        "submit_keyed_many": _SUBMIT_KEYED_MANY,
        "key_answers": _KEY_ANSWERS,
        "replace_lock": _REPLACE_LOCK,
        "replace_cancel": _REPLACE_CANCEL,
        "replace_refresh": _REPLACE_REFRESH,
        "replace_key": _REPLACE_KEY,
        "key_holder": _KEY_HOLDER,
        "claim_keys": _CLAIM_KEYS,
        "submit_context": _SUBMIT_CONTEXT,
        "notify": _NOTIFY,
        "lock_keys": _LOCK_KEYS,
        "submit_partitioned": _SUBMIT_PARTITIONED,
        "lock_group_streams": pg_claim.LOCK_GROUP_STREAMS,
        "refresh_group_streams": pg_claim.REFRESH_GROUP_STREAMS,
        "refresh_streams": pg_claim.REFRESH_STREAMS,
    }
