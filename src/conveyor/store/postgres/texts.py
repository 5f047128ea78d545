"""The Postgres texts of the built-once statements (:mod:`conveyor.store.protocol.texts`):
the ones whose SQL differs from the shared builders, because they use what
SQLite lacks (data-modifying CTEs, arrays, ``UPDATE … FROM unnest``).

Each text binds named parameters (``%(name)s``); the contracts are in
:meth:`conveyor.store.seam.Seam._statement_texts`.
"""

from __future__ import annotations

from collections.abc import Mapping

from conveyor.store.postgres import claim as pg_claim
from conveyor.store.postgres import keyed as pg_keyed
from conveyor.store.postgres import listen as pg_listen
from conveyor.store.postgres.submit_texts import (
    GATE,
    SUBMIT_CHILD,
    SUBMIT_CHILDREN,
    SUBMIT_MANY,
    SUBMIT_ONE,
    SUBMIT_PARTITIONED,
    SUBMIT_PARTITIONED_CHILDREN,
    edited,
    in_callers_transaction,
    submit_text,
)
from conveyor.store.protocol import queries as q
from conveyor.store.protocol.texts import IN_CALLERS

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


# The clock reading and the stored settings of ``queues`` (at least one row),
# and the announcement of new work or of finished tasks (pg_listen.NOTIFY), for a
# submit that goes step by step and the other transactions of the protocol: the
# same statements as the shared ones, as texts built once.
_SUBMIT_CONTEXT = f"""
SELECT c.now, s.queue, s.max_attempts, s.backoff
FROM (SELECT {_NOW} AS now) AS c
LEFT JOIN conveyor_queues AS s ON s.queue = ANY(%(queues)s::text[])
"""
_NOTIFY = edited(
    str(pg_listen.NOTIFY),
    ("CAST(:channels AS text[])", "%(channels)s::text[]"),
    ("CAST(:payloads AS text[])", "%(payloads)s::text[]"),
)

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
    waits for the WAL flush, see :data:`conveyor.store.postgres.claim.QUICK_COMMIT`); and,
    for each submit that announces its queues only when someone listens, its
    variant for a caller's transaction, named with :data:`IN_CALLERS` after it."""
    out = _texts(durable_claims)
    for name, sql in list(out.items()):
        if GATE in sql:
            out[name + IN_CALLERS] = in_callers_transaction(sql)
    return out


def _texts(durable_claims: bool) -> dict[str, str]:
    return {
        "claim_one": pg_claim.claim_text(True, durable_claims),
        "claim_any": pg_claim.claim_text(False, durable_claims),
        "submit_plain": submit_text(SUBMIT_MANY),
        "submit_one": submit_text(SUBMIT_ONE),
        "submit_child": SUBMIT_CHILD,
        "submit_children": SUBMIT_CHILDREN,
        "submit_partitioned": SUBMIT_PARTITIONED,
        "submit_partitioned_children": SUBMIT_PARTITIONED_CHILDREN,
        "ack_plain": _ACK_TEXT.replace("{done}", pg_listen.DONE_CHANNEL),
        "succeed_plain": _succeed_text(),
        "waiter_add": _WAITER_ADD,
        "waiter_drop": _WAITER_DROP,
        "ack_streams_lock": pg_claim.ACK_LOCK_TEXT,
        "ack_streams": pg_claim.ack_streams_text(pg_listen.DONE_CHANNEL, pg_listen.WORK_CHANNEL),
        "insert_rows": _INSERT_ROWS,
        "share_groups": _SHARE_GROUPS,
        "submit_context": _SUBMIT_CONTEXT,
        "notify": _NOTIFY,
        "lock_streams": pg_claim.LOCK_STREAMS,
        "lock_group_streams": pg_claim.LOCK_GROUP_STREAMS,
        "lock_streams_if_parents": pg_claim.LOCK_STREAMS_IF_PARENTS,
        "lock_group_streams_if_parents": pg_claim.LOCK_GROUP_STREAMS_IF_PARENTS,
        "refresh_group_streams": pg_claim.REFRESH_GROUP_STREAMS,
        "refresh_streams": pg_claim.REFRESH_STREAMS,
        **pg_keyed.texts(),
    }
