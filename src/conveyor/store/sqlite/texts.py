"""SQLite's own texts of the built-once steps (:mod:`conveyor.store.protocol.steps`).

Why these differ from anything shared: SQLite has no arrays (a list is bound as
JSON text and read with ``json_each``), no ``LATERAL`` (a stream's run is bounded
by a correlated ``OFFSET`` probe instead), no data-modifying CTEs (the claim is
a few statements in one ``BEGIN IMMEDIATE`` transaction, the single writer lock
standing in for row locks), and its ``RETURNING`` may name only the updated
table's columns (task columns come from correlated lookups). The choices the
statements serve — which streams, which rows, in which order — are made in
:mod:`conveyor.store.protocol.steps`, written once for every dialect.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import BigInteger, ClauseElement, Float, bindparam, func, select

from conveyor.schema import deliveries as d
from conveyor.schema import tasks as t
from conveyor.store.protocol import queries as q


@functools.cache
def returned_view() -> tuple[Any, ...]:
    """The task view as SQLite's RETURNING can give it, built once (a claim or
    fenced write needs it every time, and building it cost a tenth of a claim).

    SQLite's RETURNING may name only the updated table's columns (an UPDATE …
    FROM table may not appear there), so each task column is a correlated lookup
    by primary key. Same names and values as Postgres's joined form.
    """
    columns: list[Any] = []
    for col in q.view_columns():
        if col.table is d:
            columns.append(col)
        elif col.name == "seq":
            columns.append(d.c.task_seq.label("seq"))
        else:
            lookup = select(col).where(t.c.seq == d.c.task_seq).correlate(d)
            columns.append(lookup.scalar_subquery().label(col.name))
    return tuple(columns)


#: Rows of ``:ids`` (a JSON array of task ids) in group ``:grp`` leased to
#: ``:worker_id`` (see conveyor.store.protocol.steps.ack_tx).
ACK_HELD = (
    "SELECT t.id AS id, d.task_seq AS task_seq, d.attempt AS attempt, d.queue AS queue, "
    'd."partition" AS "partition" '
    # CROSS JOIN fixes the join order (SQLite keeps it): from the ids, each one
    # probe of the tasks' id index and of the delivery's primary key. Left to the
    # planner, it walked the group's delivery rows by the status index: every
    # finished row of the history.
    "FROM json_each(:ids) AS j CROSS JOIN conveyor_tasks AS t ON t.id = j.value "
    "CROSS JOIN conveyor_deliveries AS d ON d.task_seq = t.seq AND d.grp = :grp "
    "WHERE d.worker_id = :worker_id AND d.status = 'running'"
)

# The rows of one stream that are still active, from its head: the stream index
# (grp, queue, partition, task_seq) serves it. The status list is written inline
# so SQLite matches the index's partial WHERE (see statements.active).
_ACTIVE_FROM_HEAD = """
    {r}.grp = :grp AND {r}.queue = f.queue AND {r}."partition" = f."partition"
    AND {r}.status IN ('queued', 'running') AND {r}.task_seq >= f.head_seq"""

#: Everything a claim of ``:queue`` in group ``:grp`` chooses from, in one read
#: (``kind`` tells the rows apart):
#:
#: * 1 — up to ``:streams`` free streams (only ``:partition``'s when it is not
#:   NULL), fairest first, each with its first ``:per_stream`` active rows from
#:   the head the stream row names: ``status`` and ``due`` (``run_at`` reached at
#:   ``:now_us``) per row, in submit order. Without LATERAL, a stream's rows are
#:   bounded by its ``per_stream``-th active row, one correlated index probe;
#: * 0 — up to ``:limit`` ready unpartitioned rows in claim order (none when
#:   ``:partition`` is given);
#: * 2 — one row if a lease of these queues has expired (to be recovered first).
CANDIDATES = f"""
WITH free AS (
    SELECT s.queue AS queue, s."partition" AS "partition", s.priority AS priority,
           s.available_at AS available_at, s.head_seq AS head_seq
    FROM conveyor_streams AS s
    WHERE s.grp = :grp AND s.queue = :queue
      AND s.available_at IS NOT NULL AND s.available_at <= :now_us
      AND (:partition IS NULL OR s."partition" = :partition)
    ORDER BY s.priority DESC, s.available_at, s.queue, s."partition"
    LIMIT :streams
)
SELECT 1 AS kind, f.priority AS priority, f.available_at AS at, f.queue AS queue,
       f."partition" AS "partition", f.head_seq AS head_seq, y.task_seq AS task_seq,
       y.status AS status, y.run_at <= :now_us AS due
FROM free AS f JOIN conveyor_deliveries AS y ON {_ACTIVE_FROM_HEAD.format(r="y")}
    AND y.task_seq <= coalesce((
        SELECT z.task_seq FROM conveyor_deliveries AS z
        WHERE {_ACTIVE_FROM_HEAD.format(r="z")}
        ORDER BY z.task_seq LIMIT 1 OFFSET :per_stream - 1
    ), 9223372036854775807)
UNION ALL
SELECT 0, p.priority, p.run_at, p.queue, NULL, NULL, p.task_seq, 'queued', 1
FROM (
    -- The ready index; its partial WHERE matched by the literal status.
    SELECT r.task_seq AS task_seq, r.priority AS priority, r.run_at AS run_at,
           r.queue AS queue
    FROM conveyor_deliveries AS r
    WHERE r.grp = :grp AND r.queue = :queue AND r.status = 'queued'
      AND r."partition" IS NULL AND r.run_at <= :now_us AND :partition IS NULL
    ORDER BY r.priority DESC, r.run_at, r.task_seq
    LIMIT :limit
) AS p
UNION ALL
SELECT 2, NULL, NULL, NULL, NULL, NULL, e.task_seq, NULL, NULL
FROM (
    -- The leased index; its partial WHERE matched by the literal status.
    SELECT x.task_seq AS task_seq FROM conveyor_deliveries AS x
    WHERE x.grp = :grp AND x.queue = :queue AND x.status = 'running'
      AND x.lease_expires_at < :now_us
    LIMIT 1
) AS e
ORDER BY 1, 2 DESC, 3, 4, 5, 7
"""

#: The streams ``:partitions`` (a JSON array) of ``:queue`` in ``:grp`` are held
#: now: a claim just leased their heads. This is what recomputing them would
#: write (same head, same priority, no longer available).
HOLD_STREAMS = """
UPDATE conveyor_streams SET available_at = NULL
WHERE grp = :grp AND queue = :queue
  AND "partition" IN (SELECT j.value FROM json_each(:partitions) AS j)
"""

#: Recompute the streams ``:keys`` (a JSON array of [queue, grp, partition]) as
#: conveyor.store.protocol.streams.refresh does one by one: the head is the first active
#: row; the stream is available when the head is queued and no row of it is
#: leased, since the moment its head became available (kept while the head
#: stays the same), else since now or the head's run_at, whichever is later. A
#: missing stream row is created. Returns each stream's new ``available_at``.
REFRESH_STREAMS = """
WITH k AS (
    SELECT json_extract(j.value, '$[0]') AS queue, json_extract(j.value, '$[1]') AS grp,
           json_extract(j.value, '$[2]') AS part
    FROM json_each(:keys) AS j
),
h AS (
    SELECT k.queue AS queue, k.grp AS grp, k.part AS part, (
        SELECT y.task_seq FROM conveyor_deliveries AS y
        WHERE y.grp = k.grp AND y.queue = k.queue AND y."partition" = k.part
          AND y.status IN ('queued', 'running')
        ORDER BY y.task_seq LIMIT 1
    ) AS head
    FROM k
)
INSERT INTO conveyor_streams (queue, grp, "partition", head_seq, priority, available_at)
SELECT h.queue, h.grp, h.part, h.head, x.priority,
       CASE WHEN x.status = 'queued' AND NOT EXISTS (
           -- Among the queue's leased rows (few), not the stream's active ones:
           -- with nothing leased, that walked the stream's whole backlog (4.4 ms
           -- per refresh for a stream of 20,000 queued tasks, against 0.03).
           SELECT 1 FROM conveyor_deliveries AS r
           WHERE r.grp = h.grp AND r.queue = h.queue AND r."partition" = h.part
             AND r.status = 'running'
       ) THEN max(:now_us, x.run_at) END
FROM h LEFT JOIN conveyor_deliveries AS x ON x.task_seq = h.head AND x.grp = h.grp
-- WHERE: SQLite's parser needs it to tell the join's ON from ON CONFLICT.
WHERE true
ON CONFLICT (queue, grp, "partition") DO UPDATE SET
    head_seq = excluded.head_seq,
    priority = excluded.priority,
    available_at = CASE
        WHEN excluded.available_at IS NULL THEN NULL
        WHEN conveyor_streams.head_seq = excluded.head_seq AND conveyor_streams.available_at
        THEN max(conveyor_streams.available_at, (
            SELECT y.run_at FROM conveyor_deliveries AS y
            WHERE y.task_seq = excluded.head_seq AND y.grp = excluded.grp
        ))
        ELSE excluded.available_at
    END
RETURNING available_at
"""


def lease_seqs() -> ClauseElement:
    """Lease the rows ``:seqs`` (a JSON array of task_seq) of ``:queue`` in ``:grp``
    to ``:w_id``, as :func:`conveyor.store.protocol.queries.take` does, for ``:lease`` seconds
    (NULL: the queue's setting, else the default). No RETURNING: its correlated
    lookups of the task columns cost twice the update; :data:`VIEW_SEQS` reads
    the rows back with one join."""
    # Bind parameters stand where take() has Python values (typed Any for that).
    grp: Any = bindparam("grp")
    queue: Any = bindparam("queue")
    worker_id: Any = bindparam("w_id")
    seqs: Any = select(func.json_each(bindparam("seqs")).table_valued("value").c.value)
    length = func.coalesce(bindparam("lease", type_=Float), q.lease_seconds(None))
    # ``now_us``: the process clock, read each time the statement runs (texts.now).
    now = bindparam("now_us", type_=BigInteger)
    return q.take(grp, seqs, now, worker_id=worker_id, lease=length, queues=[queue])


def _view(delivery: str, task: str) -> str:
    names = {col.name for col in q.view_columns() if col.table is t}
    return ", ".join(
        f'{task if col.name in names else delivery}."{col.name}"' for col in q.view_columns()
    )


#: The task view of the rows ``:seqs`` (a JSON array of task_seq) of ``:grp``
#: leased to ``:w_id``: what a claim returns. CROSS JOIN keeps SQLite's join order:
#: from the list, one primary-key probe of each table.
VIEW_SEQS = f"""
SELECT {_view("d", "t")}
FROM json_each(:seqs) AS j
CROSS JOIN conveyor_tasks AS t ON t.seq = j.value
CROSS JOIN conveyor_deliveries AS d ON d.task_seq = t.seq AND d.grp = :grp
WHERE d.status = 'running' AND d.worker_id = :w_id
"""


#: Idempotency keys claimed for their tasks (``:keys`` and ``:ids``, JSON arrays
#: of one length, the keys sorted by code point), those already held left alone;
#: a row per key won. ``WHERE true``: an INSERT … SELECT needs a WHERE before its
#: ON CONFLICT, or SQLite reads the ON as a join's.
CLAIM_KEYS = (
    "INSERT INTO conveyor_keys (key, task_id) "
    "SELECT k.value, i.value FROM json_each(:keys) AS k "
    "JOIN json_each(:ids) AS i ON i.key = k.key WHERE true ORDER BY k.key "
    "ON CONFLICT (key) DO NOTHING RETURNING key"
)
#: The holders of ``:keys`` (a JSON array). No row locks on SQLite: the writer
#: lock the transaction holds keeps them as they are until it ends.
LOCK_KEYS = (
    "SELECT key, task_id FROM conveyor_keys "
    "WHERE key IN (SELECT value FROM json_each(:keys)) ORDER BY key"
)


def texts() -> dict[str, ClauseElement | str]:
    """SQLite's own built-once statements, by name (see
    :meth:`conveyor.store.seam.Seam._statement_texts`)."""
    return {
        "ack_held": ACK_HELD,
        "step_candidates": CANDIDATES,
        "step_hold_streams": HOLD_STREAMS,
        "step_lease_seqs": lease_seqs(),
        "step_view_seqs": VIEW_SEQS,
        "refresh_streams": REFRESH_STREAMS,
        "claim_keys": CLAIM_KEYS,
        "lock_keys": LOCK_KEYS,
    }


__all__ = [
    "ACK_HELD",
    "CANDIDATES",
    "CLAIM_KEYS",
    "HOLD_STREAMS",
    "LOCK_KEYS",
    "REFRESH_STREAMS",
    "VIEW_SEQS",
    "lease_seqs",
    "returned_view",
    "texts",
]
