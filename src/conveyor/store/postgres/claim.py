"""The Postgres claim in one statement: plain work and the heads of free streams.

The step-by-step claim (:func:`conveyor.store.protocol.consumer.claim_tx`) takes one
stream per round: find the fairest free stream, lock it, read its next rows,
lease them, recompute the stream — five statements per stream. This text does
the same for every stream a claim takes, and for unpartitioned work, in one
statement (a data-modifying CTE, which SQLite does not have — hence a dialect
text; the protocol around it stays in :mod:`conveyor.store.protocol.consumer`):

1. ``flags``: an expired lease in these queues makes the statement lease nothing
   (``busy``), so the caller recovers leases step by step first;
2. ``free``: free streams, fairest first (priority, then the head that waited
   longest), locked ``FOR UPDATE SKIP LOCKED`` — at most ``streams`` of them;
3. ``srows``: per stream, its first ``per_stream`` active rows from the head the
   *locked* stream row names (the statement's snapshot may predate the lock; the
   locked row is the latest version, and every change of a stream's rows
   rewrites it), kept while queued and due, and only if the first is that head;
4. ``plain``: unpartitioned ready rows, locked ``SKIP LOCKED``;
5. ``ordered``/``chosen``: streams and plain rows compete in one order (priority,
   then who waited longest; plain first on a tie). With ``mix`` off (no
   ``per_stream``) the claim is one stream or plain work only (SPEC 2.3); with it
   on, units are taken in order until ``limit`` tasks are reached. With no free
   stream, ``picked`` takes the plain rows as they are (the same choice, without
   ordering the units);
6. ``taken`` leases the rows (re-checking ``queued`` on the latest row version),
   ``held`` marks each stream it took from as held (``available_at`` NULL: its
   head is now leased, which is what recomputing the stream would write).

The lock order (see :mod:`conveyor.store.protocol.streams`) holds: stream rows are locked
before any delivery row of theirs, and every lock taken while holding others is
either ``SKIP LOCKED`` (never waits) or a delivery row of a stream this
statement holds, which nobody else can be holding.
"""

from __future__ import annotations

from conveyor.store.protocol import queries as q

# The clock: the statement's moment in microseconds, moved by the store's
# clock_offset (a bind parameter, so the text never changes).
NOW = "(floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + %(offset_us)s)"


# A batch's items, read from its JSON array, through a LIMIT of the array's
# length, twice: it changes nothing but the estimate. The planner cannot read the
# length, so each LIMIT keeps a tenth of its input: json_array_elements' assumed
# 100 rows become 10, then 1, and every item's rows are found by index, as a
# worker's batch must be (a hundred index probes cost less than one scan of a
# table of a million tasks). With one LIMIT (10 items estimated) and no table
# statistics (a young table, autovacuum not yet run, or off), the planner chose
# to scan both tables whole instead: 1.6 ms for one item at 3,000 tasks against
# 0.7 ms (EXPLAIN ANALYZE, generic plan), 4.4 ms against 2.2 for 50. Subqueries,
# not the bare call: a custom plan would fold the call on the bound text into a
# constant, the generic plan could not, and with their estimates apart the server
# re-planned the prepared statement on every call (0.3 ms per acknowledgement).
_ITEMS_LENGTH = "LIMIT (SELECT json_array_length(%(items)s::json))"


def _few_items(alias: str) -> str:
    """The batch's array as rows ``alias(v, idx)``, estimated as one row (see above)."""
    return (
        f"(SELECT * FROM (SELECT * FROM json_array_elements(%(items)s::json) WITH ORDINALITY"
        f" AS {alias}(v, idx) {_ITEMS_LENGTH}) AS {alias} {_ITEMS_LENGTH})"
    )


def ack_head(only_plain: bool, returning: str) -> str:
    """The head both batch-acknowledgement texts share: ``items`` (the batch's
    arrays, numbered) and ``done`` (each item finished if its fence holds: leased
    to its worker, on its attempt). ``only_plain`` leaves partitioned rows alone;
    ``returning`` names what ``done`` returns."""
    plain = "\n      AND d.partition IS NULL" if only_plain else ""
    return f"""
WITH items AS (
    -- The batch as one JSON array of [id, worker_id, grp, attempt, result] entries:
    -- the driver dumps five arrays element by element in Python, several times
    -- what encoding one JSON text costs.
    -- Each item's task sequence number is looked up here, once (NULL for an
    -- unknown id), by its unique id: a lateral lookup per item, never a join the
    -- planner may turn into a scan of every task (see _few_items).
    SELECT e.v ->> 0 AS id, e.v ->> 1 AS worker_id, e.v ->> 2 AS grp,
           (e.v ->> 3)::int AS attempt, e.v ->> 4 AS result, e.idx,
           t.seq, t.queue, 'running'::text AS running
    FROM {_few_items("a")} AS e
    LEFT JOIN LATERAL (
        -- LIMIT 1 (the id is unique): a subquery with a LIMIT stays a lookup per
        -- item; without one the planner may flatten it into a join.
        SELECT t.seq, t.queue FROM conveyor_tasks AS t WHERE t.id = e.v ->> 0 LIMIT 1
    ) AS t ON true
),
done AS (
    UPDATE conveyor_deliveries AS d SET
        status = 'succeeded',
        result = i.result,
        finished_at = {NOW},
        lease_expires_at = NULL
    FROM items AS i
    -- Each item's row must be found by an exact lookup, so the only condition on
    -- ``d`` alone is the array of the items' sequence numbers; the group, queue
    -- and status come from ``items`` as join conditions, naming every column of
    -- the primary key and of the status index alike. Joined to the tasks here and
    -- with the status as a constant, the planner hash-joined every leased row of
    -- the queue to every item, with or without table statistics: 306-316 ms for
    -- 100 items with 1,000 tasks running.
    WHERE d.task_seq = ANY(ARRAY(SELECT seq FROM items WHERE seq IS NOT NULL))
      AND d.task_seq = i.seq AND d.grp = i.grp AND d.queue = i.queue
      AND d.status = i.running
      AND d.worker_id = i.worker_id AND (i.attempt IS NULL OR d.attempt = i.attempt){plain}
    RETURNING {returning}
),"""


#: The items of a batch acknowledgement that failed their fence: those without a
#: finished row in ``done``. Looked for only when fewer rows finished than there
#: are items, which is rare: the items are estimated at one row (_few_items), so
#: the anti-join is a nested loop comparing every item with every finished row,
#: 100 x 100 at a batch of 100, about 15 % of its statement's server time
#: (EXPLAIN ANALYZE, 2.8 -> 2.4 ms). Exact: each finished row answers at least one
#: item, and items that differ finish different rows, so as many finished rows as
#: items means none failed.
LOST = """
    SELECT i.idx FROM items AS i
    WHERE (SELECT count(*) FROM done) < (SELECT count(*) FROM items)
      AND NOT EXISTS (SELECT 1 FROM done WHERE done.id = i.id AND done.grp = i.grp)"""


_TASK_SIDE = frozenset(
    (
        "seq id name queue partition payload metadata priority created_at key parent_id "
        "root_id correlation_id"
    ).split()
)


def view(taken: str, task: str) -> str:
    """The columns of :func:`conveyor.store.protocol.queries.view_columns`, from an updated
    delivery row ``taken`` joined to its task row ``task``."""
    return ", ".join(
        f"{task if col.name in _TASK_SIDE else taken}.{col.name}" for col in q.view_columns()
    )


# A lease need not survive a crash of the server: a claim lost with the last
# fraction of a second of WAL leaves its rows queued, and they are claimed again
# (at-least-once, as when the worker dies). So the claim's commit does not wait
# for the flush (``synchronous_commit`` off for this transaction alone): about
# half a commit's server time. Anything durable committed after it (an ack, a
# submit) flushes the WAL up to its own record, the claim's included. Submits,
# acks and every other write keep the server's setting.
QUICK_COMMIT = "set_config('synchronous_commit', 'off', true)"


def claim_text(single_queue: bool, durable: bool = False) -> str:
    """The claim. Unless ``durable``, its commit does not wait for the WAL flush (see
    :data:`QUICK_COMMIT`). Bind parameters: ``grp``, ``queue`` (``single_queue``) or
    ``queues`` (a list), ``partition`` (or NULL), ``limit``, ``per_stream`` (rows
    per stream), ``streams`` (streams to lock at most), ``mix`` (several units, or
    one), ``worker_id``, ``lease`` (or NULL) and ``offset_us``. Rows: ``busy`` and
    ``rank`` (the unit's place in claim order), then the task columns; one row of
    NULLs when nothing was leased."""
    queue = "queue = %(queue)s" if single_queue else "queue = ANY(%(queues)s::text[])"
    # The queue's configured lease: for one queue, looked up once per claim (an
    # uncorrelated subquery), not once per row leased.
    lease_of = "%(queue)s" if single_queue else "k.queue"
    return f"""
WITH flags AS (
    SELECT {QUICK_COMMIT if not durable else "NULL"} AS quick, EXISTS (
        SELECT 1 FROM conveyor_deliveries
        WHERE status = 'running' AND grp = %(grp)s AND {queue}
          AND lease_expires_at < {NOW}
    ) AS busy
),
free AS MATERIALIZED (
    SELECT s.queue, s.partition, s.priority, s.available_at, s.head_seq
    FROM conveyor_streams AS s
    WHERE s.grp = %(grp)s AND s.{queue}
      AND s.available_at IS NOT NULL AND s.available_at <= {NOW}
      AND (%(partition)s::text IS NULL OR s.partition = %(partition)s::text)
      AND NOT (SELECT busy FROM flags)
    ORDER BY s.priority DESC, s.available_at, s.queue, s.partition
    LIMIT %(streams)s
    FOR UPDATE OF s SKIP LOCKED
),
srows AS MATERIALIZED (
    SELECT f.queue, f.partition, f.priority AS pri, f.available_at AS at, r.task_seq, r.n
    FROM free AS f CROSS JOIN LATERAL (
        SELECT x.task_seq,
               row_number() OVER w AS n,
               bool_and(x.status = 'queued' AND x.run_at <= {NOW}) OVER w AS ok,
               min(x.task_seq) OVER () AS first
        FROM (
            SELECT y.task_seq, y.status, y.run_at
            FROM conveyor_deliveries AS y
            WHERE y.grp = %(grp)s AND y.queue = f.queue AND y.partition = f.partition
              AND y.status IN ('queued', 'running') AND y.task_seq >= f.head_seq
            ORDER BY y.task_seq
            LIMIT %(per_stream)s
        ) AS x
        WINDOW w AS (ORDER BY x.task_seq)
    ) AS r
    WHERE r.ok AND r.first = f.head_seq
),
plain AS MATERIALIZED (
    SELECT p.task_seq, p.queue, p.priority, p.run_at
    FROM conveyor_deliveries AS p
    WHERE p.grp = %(grp)s AND p.{queue} AND p.status = 'queued' AND p.partition IS NULL
      AND p.run_at <= {NOW} AND %(partition)s::text IS NULL
      AND NOT (SELECT busy FROM flags)
    ORDER BY p.priority DESC, p.run_at, p.task_seq
    LIMIT %(limit)s
    FOR UPDATE OF p SKIP LOCKED
),
units AS (
    -- A stream's rows travel with its unit as an array, in order: joined back to
    -- ``srows`` (and ``srows`` to ``free``), each join compared every stream with
    -- every row, both sides estimated at one row (a claim of 50 over 50 streams:
    -- 2 x 5,000 comparisons, ~1.5 ms of its ~2.1).
    SELECT 1 AS kind, r.queue, r.partition, r.pri, r.at, NULL::bigint AS seq,
           count(*) AS size, array_agg(r.task_seq ORDER BY r.task_seq) AS seqs
    FROM srows AS r
    GROUP BY r.queue, r.partition, r.pri, r.at
    UNION ALL
    SELECT 0, p.queue, NULL, p.priority, p.run_at, p.task_seq, 1, NULL FROM plain AS p
),
ordered AS (
    SELECT u.*, row_number() OVER o AS rank, first_value(u.kind) OVER o AS lead
    FROM units AS u
    WINDOW o AS (
        ORDER BY u.pri DESC, u.at, u.kind, u.seq, u.queue, u.partition
        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
    )
),
chosen AS (
    SELECT e.*, sum(e.size) OVER (ORDER BY e.rank) AS upto
    FROM ordered AS e
    WHERE %(mix)s OR CASE WHEN e.lead = 1 THEN e.rank = 1 ELSE e.kind = 0 END
),
picked AS MATERIALIZED (
    SELECT k.task_seq, k.rank, k.queue, %(grp)s::text AS grp, 'queued'::text AS status, coalesce(
        %(lease)s::float8,
        (SELECT c.lease FROM conveyor_queues AS c WHERE c.queue = {lease_of}),
        {q.DEFAULT_LEASE}
    ) AS length
    FROM (
        SELECT s.task_seq, c.rank, c.queue
        FROM chosen AS c CROSS JOIN LATERAL unnest(c.seqs) WITH ORDINALITY AS s(task_seq, n)
        WHERE c.kind = 1 AND c.upto - c.size + s.n <= %(limit)s AND EXISTS (SELECT 1 FROM free)
        UNION ALL
        SELECT c.seq, c.rank, c.queue FROM chosen AS c
        WHERE c.kind = 0 AND c.upto <= %(limit)s AND EXISTS (SELECT 1 FROM free)
        UNION ALL
        -- No free stream: the plain rows alone, already in claim order (what the
        -- units above come to then), without sorting and numbering them twice
        -- through the units (a tenth of claim(1)'s and claim(100)'s server time).
        SELECT p.task_seq, row_number() OVER (ORDER BY p.priority DESC, p.run_at, p.task_seq),
               p.queue
        FROM plain AS p WHERE NOT EXISTS (SELECT 1 FROM free)
    ) AS k
),
taken AS (
    UPDATE conveyor_deliveries AS d SET
        status = 'running',
        attempt = d.attempt + 1,
        worker_id = %(worker_id)s,
        lease = k.length,
        lease_expires_at = {NOW} + CAST(round(1000000.0 * k.length) AS bigint),
        started_at = coalesce(d.started_at, {NOW}),
        progress = NULL,
        progress_message = NULL
    FROM picked AS k
    -- Each picked row must be found by an exact lookup, whatever the planner
    -- guesses: the planner cannot know how few rows ``picked`` holds. So the only
    -- condition on ``d`` alone is the array of sequence numbers, and the group,
    -- queue and status (re-checked on the latest row version, as every condition
    -- of an UPDATE is) come from ``picked`` as join conditions, naming every column
    -- of the primary key and of the status index alike. Written as constants on
    -- ``d`` they matched the status index's first columns, and without table
    -- statistics (a fresh table, autovacuum not yet run) the planner walked every
    -- queued row of the group there: 3-5 ms per claim at 3,000 queued tasks
    -- instead of ~0.6 ms, and growing with the queue.
    WHERE d.task_seq = ANY(ARRAY(SELECT task_seq FROM picked))
      AND d.task_seq = k.task_seq AND d.grp = k.grp AND d.queue = k.queue
      AND d.status = k.status
    RETURNING d.*, k.rank
),
held AS (
    -- The streams of the rows taken, each found by its whole primary key: nothing
    -- but the join names a column of ``s``, so the taken streams drive the loop.
    -- With ``s.grp = %(grp)s`` on its own, the generic plan read every stream of the
    -- group instead (the primary key by ``grp`` alone) and compared each with every
    -- taken stream: 0.47 of a 1.4 ms claim of 20 tasks at 100 partitions, and
    -- growing with the partitions.
    UPDATE conveyor_streams AS s SET available_at = NULL
    FROM (
        SELECT DISTINCT queue, %(grp)s::text AS grp, partition
        FROM taken WHERE partition IS NOT NULL
    ) AS h
    WHERE s.queue = h.queue AND s.grp = h.grp AND s.partition = h.partition
    RETURNING 1
)
SELECT flags.busy, x.rank, {view("x", "t")}
FROM flags LEFT JOIN (taken AS x JOIN conveyor_tasks AS t ON t.seq = x.task_seq) ON true
"""


# Acknowledging partitioned tasks: two statements in one transaction. The first
# locks the streams of the batch in the lock order (by code point, COLLATE "C",
# as Python sorts the keys of the other lock statements, whatever the database's
# collation); the second starts after those
# locks are held, so its snapshot has every change to those streams (a producer
# that appended a task while we waited for its stream, a cancel), finishes the
# rows, fenced per item, and recomputes each touched stream — head, priority,
# availability, as :func:`conveyor.store.protocol.streams.refresh` does — from that
# snapshot minus the rows it just finished (a statement does not see its own
# writes). One statement cannot do both: its snapshot would predate the locks.
# Each item's task is looked up by id, with the item count estimated as in
# ack_head (_few_items): a join of the items to the tasks read every task row
# (0.8 ms for 10 items at 5,000 tasks, with or without statistics).
ACK_LOCK_TEXT = f"""
SELECT 1 FROM conveyor_streams AS s
JOIN (
    SELECT DISTINCT t.queue, i.grp, t.partition
    FROM (SELECT e.v ->> 0 AS id, e.v ->> 2 AS grp FROM {_few_items("e")} AS e) AS i
    CROSS JOIN LATERAL (
        SELECT t.queue, t.partition FROM conveyor_tasks AS t WHERE t.id = i.id LIMIT 1
    ) AS t
    WHERE t.partition IS NOT NULL
) AS k ON s.queue = k.queue AND s.grp = k.grp AND s.partition = k.partition
ORDER BY s.grp COLLATE "C", s.queue COLLATE "C", s.partition COLLATE "C"
FOR UPDATE OF s
"""


#: A stream's ``available_at`` once its head ``h`` (``task_seq``, ``status``,
#: ``run_at``, ``leased``: a row of the stream is leased) is known, from its row
#: ``s``: set while the head is queued and no row is leased; kept (or moved to the
#: head's ``run_at``) while the head is the same, else now (or its ``run_at``). The
#: rule of :func:`conveyor.store.protocol.streams.refresh`.
_AVAILABLE = f"""CASE WHEN h.status = 'queued' AND NOT h.leased THEN
            CASE WHEN s.head_seq = h.task_seq AND s.available_at IS NOT NULL
                 THEN greatest(s.available_at, h.run_at)
                 ELSE greatest({NOW}, h.run_at)
            END
        END"""


def _heads(keys: str, done: bool) -> str:
    """The CTEs ``busy`` and ``heads`` of the streams in CTE ``keys`` (``queue``,
    ``grp``, ``partition``; with ``done``, also ``seqs``: the rows this statement
    finished, which its snapshot still sees as leased and every look below leaves
    out). ``heads``: each stream's first active row (``task_seq``, ``status``,
    ``run_at``, ``priority``; NULLs for none) and ``leased``, whether a row of it is
    leased, as :data:`_AVAILABLE` reads them."""
    finished = (
        "\n      AND NOT (ROW(r.task_seq, r.grp) = ANY(ARRAY(SELECT ROW(task_seq, grp) FROM done)))"
        if done
        else ""
    )
    not_head = "\n          AND NOT (y.task_seq = ANY(k.seqs))" if done else ""
    return f"""busy AS MATERIALIZED (
    -- The streams that still have a leased row: one pass over the leased rows of
    -- the keys' (group, queue)s, however many streams there are (a pass per stream
    -- cost ~0.05 ms each at a hundred leased rows). Only the keys' streams are
    -- kept, so the array each stream is looked up in below is no longer than the
    -- keys. As text: keys read from JSON are text, and a row of varchar does not
    -- compare with a row of text.
    SELECT coalesce(
        array_agg(DISTINCT ROW(r.grp::text, r.queue::text, r.partition::text)), '{{}}'
    ) AS keys
    FROM conveyor_deliveries AS r
    WHERE r.status = 'running'
      AND (r.grp, r.queue) IN (SELECT DISTINCT grp, queue FROM {keys})
      AND r.partition = ANY(ARRAY(SELECT partition FROM {keys})){finished}
),
heads AS MATERIALIZED (
    SELECT k.queue, k.grp, k.partition, h.task_seq, h.status, h.run_at, h.priority,
           ROW(k.grp::text, k.queue::text, k.partition::text) = ANY(b.keys) AS leased
    FROM {keys} AS k CROSS JOIN busy AS b LEFT JOIN LATERAL (
        SELECT y.task_seq, y.status, y.run_at, y.priority
        FROM conveyor_deliveries AS y
        WHERE y.grp = k.grp AND y.queue = k.queue AND y.partition = k.partition
          AND y.status IN ('queued', 'running'){not_head}
        ORDER BY y.task_seq
        LIMIT 1
    ) AS h ON true
)"""


#: Write each stream's new head and availability from CTE ``heads``.
_MOVE = f"""UPDATE conveyor_streams AS s SET
    head_seq = h.task_seq,
    priority = h.priority,
    available_at = {_AVAILABLE}
FROM heads AS h
WHERE s.queue = h.queue AND s.grp = h.grp AND s.partition = h.partition"""

#: The streams ``keys`` of :data:`LOCK_STREAMS` and :data:`REFRESH_STREAMS`: a JSON
#: array of ``[queue, grp, partition]`` in the lock order (``n``: its place).
_KEYS = f"""
    SELECT k.v ->> 0 AS queue, k.v ->> 1 AS grp, k.v ->> 2 AS partition, k.idx AS n
    FROM {_few_items("k").replace("%(items)s", "%(keys)s")} AS k"""

#: The streams of partitions ``pairs`` (a JSON array of ``[queue, partition]``) for
#: queue mode and every active group of the queue, numbered in the lock order (by
#: code point, as Python sorts the keys of the other texts): the streams a submit's
#: new rows can join, for the pipelined submit of partitioned tasks.
GROUP_KEYS = """
    SELECT p.queue, g.grp, p.partition, row_number() OVER (
        ORDER BY g.grp COLLATE "C", p.queue COLLATE "C", p.partition COLLATE "C"
    ) AS n
    FROM (
        SELECT DISTINCT e.v ->> 0 AS queue, e.v ->> 1 AS partition
        FROM json_array_elements(%(pairs)s::json) AS e(v)
    ) AS p CROSS JOIN LATERAL (
        SELECT '' AS grp
        UNION ALL
        SELECT g.name FROM conveyor_groups AS g WHERE g.queue = p.queue AND g.active
    ) AS g"""


def lock_streams_text(keys: str) -> str:
    """Lock the stream rows of ``keys`` (:data:`_KEYS` or :data:`GROUP_KEYS`) in the
    lock order, creating those that do not exist yet: one key after another, as
    :func:`conveyor.store.protocol.streams.refresh` does step by step. A conflicting row is
    locked though nothing is updated. The first of the two statements of a refresh:
    the second (:func:`refresh_streams_text`) starts after these locks are held, so
    its snapshot has every change committed to those streams meanwhile."""
    return f"""
WITH keys AS MATERIALIZED ({keys}
)
INSERT INTO conveyor_streams (queue, grp, partition)
SELECT queue, grp, partition FROM keys ORDER BY n
ON CONFLICT (queue, grp, partition) DO UPDATE SET head_seq = conveyor_streams.head_seq
WHERE false
"""


def refresh_streams_text(keys: str) -> str:
    """Recompute the streams of ``keys`` (locked by :func:`lock_streams_text` in this
    transaction) as :func:`conveyor.store.protocol.streams.refresh` does per stream: each
    head is its first active row, the leased rows are found in one pass over the
    leased rows of the keys' queues (as the stream acknowledgement does), and a row
    is written only where its head or availability changes."""
    return f"""
WITH keys AS MATERIALIZED ({keys}
),
{_heads("keys", done=False)}
{_MOVE}
  AND (s.head_seq IS DISTINCT FROM h.task_seq OR s.available_at IS DISTINCT FROM {_AVAILABLE})
"""


#: Keys (``_KEYS`` or ``GROUP_KEYS``) only while every one of ``parent_ids`` (a
#: list; ``None`` entries for no parent) is a task: a submit of children whose
#: parent is missing writes nothing, so it must not create their stream rows either.
_IF_PARENTS = """
    WHERE NOT EXISTS (
        SELECT 1 FROM unnest(%(parent_ids)s::text[]) AS m(id)
        WHERE m.id IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS t WHERE t.id = m.id)
    )"""

#: :func:`lock_streams_text` and :func:`refresh_streams_text` of a JSON array of keys.
LOCK_STREAMS = lock_streams_text(_KEYS)
#: (REFRESH_STREAMS returns the ``available_at`` of each stream it changed.)
REFRESH_STREAMS = refresh_streams_text(_KEYS) + "RETURNING s.available_at\n"
#: The same of the streams of partitions ``pairs`` (:data:`GROUP_KEYS`).
LOCK_GROUP_STREAMS = lock_streams_text(GROUP_KEYS)
REFRESH_GROUP_STREAMS = refresh_streams_text(GROUP_KEYS)
#: The two locks, for children: nothing locked or created when a parent is missing.
LOCK_STREAMS_IF_PARENTS = lock_streams_text(_KEYS + _IF_PARENTS)
LOCK_GROUP_STREAMS_IF_PARENTS = lock_streams_text(GROUP_KEYS + _IF_PARENTS)


def ack_streams_text(done_channel: str, work_channel: str) -> str:
    """The second statement (see above). Bind parameters: ``items`` (a JSON array
    of ``[id, worker_id, grp, attempt, result]``, one entry per item) and
    ``offset_us``. Rows: ``idx`` (1-based) of each item that failed its fence (one
    NULL row when none did) and ``freed``, how many streams have a claimable head
    now. Announces each finished task someone waits for (registered in
    ``conveyor_waiters``, as ``ack_plain`` does), and "work" on each queue where a
    stream's head became claimable."""
    return (
        ack_head(False, "i.id, d.task_seq, d.grp, d.queue, d.partition")
        + f"""
touched AS MATERIALIZED (
    -- Each stream the batch finished rows of, with those rows' sequence numbers: the
    -- statement still sees them as leased, so every look at the stream below leaves
    -- them out, by this short array (one stream's share of the batch). Left out by
    -- a NOT EXISTS over ``done`` instead, every row looked at scanned the whole
    -- batch: 12 of 16 ms for a batch of 48 (auto_explain, 100 streams).
    SELECT queue, grp, partition, array_agg(task_seq) AS seqs
    FROM done WHERE partition IS NOT NULL
    GROUP BY queue, grp, partition
),
{_heads("touched", done=True)},
moved AS (
{_MOVE}
RETURNING s.queue, s.available_at
),
note AS (
    SELECT
        (SELECT count(pg_notify('{done_channel}', done.id)) FROM done
         WHERE EXISTS (SELECT 1 FROM conveyor_waiters AS w WHERE w.task_id = done.id))
        + (SELECT count(pg_notify('{work_channel}', w.queue))
           FROM (SELECT DISTINCT queue FROM moved WHERE available_at IS NOT NULL) AS w)
        AS n
)
SELECT lost.idx, (SELECT count(*) FROM moved WHERE available_at IS NOT NULL) AS freed
FROM note LEFT JOIN (
{LOST}
) AS lost ON true
"""
    )


__all__ = [
    "ACK_LOCK_TEXT",
    "GROUP_KEYS",
    "LOCK_GROUP_STREAMS",
    "LOCK_GROUP_STREAMS_IF_PARENTS",
    "LOCK_STREAMS",
    "LOCK_STREAMS_IF_PARENTS",
    "NOW",
    "QUICK_COMMIT",
    "REFRESH_GROUP_STREAMS",
    "REFRESH_STREAMS",
    "ack_streams_text",
    "claim_text",
    "view",
]
