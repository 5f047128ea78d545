-- The acknowledgements (conveyor.store.protocol.acks). Each item is fenced on
-- its own (leased to its worker, on its attempt, when one is given), so one
-- item's failure does not hold back the others.
--
-- A batch's items are one JSON array of [id, worker_id, grp, attempt, result]
-- entries, read through json_array_elements behind a LIMIT of the array's own
-- length, twice: it changes nothing but the planner's estimate. The planner
-- cannot read the length, so it assumes each LIMIT keeps a tenth of its input:
-- json_array_elements' assumed 100 rows become 10, then 1, and every item's rows
-- are found by index, as a worker's batch must be (a hundred index probes cost
-- less than one scan of a table of a million tasks). With one LIMIT (10 items
-- estimated) and no table statistics (a young table, autovacuum not yet run, or
-- off), the planner scanned both tables whole instead: 1.6 ms for one item at
-- 3,000 tasks against 0.7 ms, 4.4 ms against 2.2 for 50 (EXPLAIN ANALYZE, the
-- generic plan). The length is a subquery, not the bare call: a custom plan would
-- fold the call on the bound text into a constant, the generic plan could not,
-- and with their estimates apart the server planned the prepared statement anew
-- on every call (0.3 ms per acknowledgement).
--
-- Waiters: each finished task that a wait() has registered for (a row in
-- conveyor_waiters, one index probe per task) is announced with pg_notify in the
-- statement itself; none is sent when nobody waits, so an ordinary
-- acknowledgement costs no NOTIFY. The CTE that sends them (note) drives the
-- final SELECT: a CTE without writes runs only as far as it is read.

-- name: ack_plain
WITH items AS (
    -- The batch as one JSON array of [id, worker_id, grp, attempt, result] entries:
    -- the driver dumps five arrays element by element in Python, several times
    -- what encoding one JSON text costs.
    -- Each item's task sequence number is looked up here, once (NULL for an
    -- unknown id), by its unique id: a lateral lookup per item, never a join the
    -- planner may turn into a scan of every task (the items estimated at one row,
    -- as the file's head says).
    SELECT e.v ->> 0 AS id, e.v ->> 1 AS worker_id, e.v ->> 2 AS grp,
           (e.v ->> 3)::int AS attempt, e.v ->> 4 AS result, e.idx,
           t.seq, t.queue, 'running'::text AS running
    FROM (SELECT * FROM (SELECT * FROM json_array_elements(:items::json) WITH ORDINALITY AS a(v, idx) LIMIT (SELECT json_array_length(:items::json))) AS a LIMIT (SELECT json_array_length(:items::json))) AS e
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
        finished_at = (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us),
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
      -- The fence: leased to the item's worker, on the item's attempt when one is
      -- given. An attempt whose lease ran out and whose task was claimed again
      -- since (by any worker, this one too) finishes nothing.
      AND d.worker_id = i.worker_id AND (i.attempt IS NULL OR d.attempt = i.attempt)
      -- Partitioned rows are left to ack_streams: their streams must be locked
      -- first and recomputed in the same transaction.
      AND d.partition IS NULL
    RETURNING i.id, d.grp
),
note AS (
    SELECT count(pg_notify('conveyor_done', done.id)) AS n FROM done
    WHERE EXISTS (SELECT 1 FROM conveyor_waiters AS w WHERE w.task_id = done.id)
)
SELECT lost.idx
FROM note LEFT JOIN (
    -- The items not finished: the fence failed, the task is unknown, or the row
    -- is partitioned; the caller sends them on to ack_streams. Looked for only
    -- when fewer rows finished than there are items, which is rare: with the items
    -- estimated at one row, the anti-join is a nested loop comparing every item
    -- with every finished row (100 x 100 for a batch of 100, about 15 per cent of
    -- the statement's server time: 2.8 ms against 2.4). Exact: each finished row
    -- answers at least one item, and items that differ finish different rows, so
    -- as many finished rows as items means that none failed.
    SELECT i.idx FROM items AS i
    WHERE (SELECT count(*) FROM done) < (SELECT count(*) FROM items)
      AND NOT EXISTS (SELECT 1 FROM done WHERE done.id = i.id AND done.grp = i.grp)
) AS lost ON true

-- name: ack_streams
-- The second of the two statements of a stream acknowledgement (ack_streams_lock
-- is the first, run before it in the same transaction, so this statement's
-- snapshot has every change committed to the locked streams meanwhile). It
-- finishes the rows of any items, partitioned or not, each fenced on its own,
-- and recomputes each stream it touched as conveyor.store.protocol.streams.refresh
-- does (head, priority, availability) from that snapshot minus the rows it has
-- just finished: a statement does not see its own writes. Rows: idx of each item
-- not finished (one NULL row when all were) and freed, how many streams have a
-- claimable head now; "work" is announced on each queue where one became so.
WITH items AS (
    -- The batch as one JSON array of [id, worker_id, grp, attempt, result] entries:
    -- the driver dumps five arrays element by element in Python, several times
    -- what encoding one JSON text costs.
    -- Each item's task sequence number is looked up here, once (NULL for an
    -- unknown id), by its unique id: a lateral lookup per item, never a join the
    -- planner may turn into a scan of every task (the items estimated at one row,
    -- as the file's head says).
    SELECT e.v ->> 0 AS id, e.v ->> 1 AS worker_id, e.v ->> 2 AS grp,
           (e.v ->> 3)::int AS attempt, e.v ->> 4 AS result, e.idx,
           t.seq, t.queue, 'running'::text AS running
    FROM (SELECT * FROM (SELECT * FROM json_array_elements(:items::json) WITH ORDINALITY AS a(v, idx) LIMIT (SELECT json_array_length(:items::json))) AS a LIMIT (SELECT json_array_length(:items::json))) AS e
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
        finished_at = (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us),
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
      -- The fence: leased to the item's worker, on the item's attempt when one is
      -- given. An attempt whose lease ran out and whose task was claimed again
      -- since (by any worker, this one too) finishes nothing.
      AND d.worker_id = i.worker_id AND (i.attempt IS NULL OR d.attempt = i.attempt)
    RETURNING i.id, d.task_seq, d.grp, d.queue, d.partition
),
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
busy AS MATERIALIZED (
    -- The streams that still have a leased row: one pass over the leased rows of
    -- the keys' (group, queue)s, however many streams there are (a pass per stream
    -- cost ~0.05 ms each at a hundred leased rows). Only the keys' streams are
    -- kept, so the array each stream is looked up in below is no longer than the
    -- keys. As text: keys read from JSON are text, and a row of varchar does not
    -- compare with a row of text.
    SELECT coalesce(
        array_agg(DISTINCT ROW(r.grp::text, r.queue::text, r.partition::text)), '{}'
    ) AS keys
    FROM conveyor_deliveries AS r
    WHERE r.status = 'running'
      AND (r.grp, r.queue) IN (SELECT DISTINCT grp, queue FROM touched)
      AND r.partition = ANY(ARRAY(SELECT partition FROM touched))
      AND NOT (ROW(r.task_seq, r.grp) = ANY(ARRAY(SELECT ROW(task_seq, grp) FROM done)))
),
heads AS MATERIALIZED (
    -- Each touched stream's first active row, leaving out the rows just finished
    -- (NULLs when none is left), and whether a row of it is still leased.
    SELECT k.queue, k.grp, k.partition, h.task_seq, h.status, h.run_at, h.priority,
           ROW(k.grp::text, k.queue::text, k.partition::text) = ANY(b.keys) AS leased
    FROM touched AS k CROSS JOIN busy AS b LEFT JOIN LATERAL (
        SELECT y.task_seq, y.status, y.run_at, y.priority
        FROM conveyor_deliveries AS y
        WHERE y.grp = k.grp AND y.queue = k.queue AND y.partition = k.partition
          AND y.status IN ('queued', 'running')
          AND NOT (y.task_seq = ANY(k.seqs))
        ORDER BY y.task_seq
        LIMIT 1
    ) AS h ON true
),
moved AS (
-- The stream's new head, and its availability, the rule of streams.refresh:
-- available while the head is queued and no row of the stream is leased. Since
-- when: kept (or moved on to the head's run_at) while the head is the same, else
-- from now or from the head's run_at, whichever is later: a stream whose head
-- did not change keeps its place in line, one just served goes to the back.
UPDATE conveyor_streams AS s SET
    head_seq = h.task_seq,
    priority = h.priority,
    available_at = CASE WHEN h.status = 'queued' AND NOT h.leased THEN
            CASE WHEN s.head_seq = h.task_seq AND s.available_at IS NOT NULL
                 THEN greatest(s.available_at, h.run_at, s.quiet_until)
                 ELSE greatest((floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us), h.run_at, s.quiet_until)
            END
        END
FROM heads AS h
WHERE s.queue = h.queue AND s.grp = h.grp AND s.partition = h.partition
RETURNING s.queue, s.available_at
),
note AS (
    SELECT
        (SELECT count(pg_notify('conveyor_done', done.id)) FROM done
         WHERE EXISTS (SELECT 1 FROM conveyor_waiters AS w WHERE w.task_id = done.id))
        + (SELECT count(pg_notify('conveyor_work', w.queue))
           FROM (SELECT DISTINCT queue FROM moved WHERE available_at IS NOT NULL) AS w)
        AS n
)
SELECT lost.idx, (SELECT count(*) FROM moved WHERE available_at IS NOT NULL) AS freed
FROM note LEFT JOIN (
    -- The items not finished: the fence failed or the task is unknown; the
    -- caller explains each. Looked for only when fewer rows finished than there
    -- are items, which is rare: with the items estimated at one row, the anti-join
    -- is a nested loop comparing every item with every finished row (100 x 100
    -- for a batch of 100, about 15 per cent of the statement's server time: 2.8
    -- ms against 2.4). Exact: each finished row answers at least one item, and
    -- items that differ finish different rows, so as many finished rows as items
    -- means that none failed.
    SELECT i.idx FROM items AS i
    WHERE (SELECT count(*) FROM done) < (SELECT count(*) FROM items)
      AND NOT EXISTS (SELECT 1 FROM done WHERE done.id = i.id AND done.grp = i.grp)
) AS lost ON true

-- name: ack_streams_lock
-- The first of the two statements of a stream acknowledgement: lock the streams
-- of the batch's partitioned items in the lock order, (grp, queue, partition)
-- each by code point (COLLATE "C", as Python sorts the keys the other lock
-- statements take, whatever the database's collation), before any delivery row.
-- ack_streams then starts after these locks are held, so its snapshot has every
-- change to those streams (a producer that appended a task while this waited for
-- its stream, a cancel). One statement cannot do both: its snapshot would
-- predate the locks. Each item's task is looked up by its id, the items
-- estimated at one row as in ack_streams: a join of the items to the tasks read
-- every task row (0.8 ms for 10 items at 5,000 tasks, with or without
-- statistics).
SELECT 1 FROM conveyor_streams AS s
JOIN (
    SELECT DISTINCT t.queue, i.grp, t.partition
    FROM (SELECT e.v ->> 0 AS id, e.v ->> 2 AS grp FROM (SELECT * FROM (SELECT * FROM json_array_elements(:items::json) WITH ORDINALITY AS e(v, idx) LIMIT (SELECT json_array_length(:items::json))) AS e LIMIT (SELECT json_array_length(:items::json))) AS e) AS i
    CROSS JOIN LATERAL (
        SELECT t.queue, t.partition FROM conveyor_tasks AS t WHERE t.id = i.id LIMIT 1
    ) AS t
    WHERE t.partition IS NOT NULL
) AS k ON s.queue = k.queue AND s.grp = k.grp AND s.partition = k.partition
ORDER BY s.grp COLLATE "C", s.queue COLLATE "C", s.partition COLLATE "C"
FOR UPDATE OF s

-- name: succeed_plain
-- One succeed() of an unpartitioned task: the fenced write, the announcement when
-- a wait() is registered for it, and the task as the group sees it, in one round
-- trip. No row: the row is partitioned or the fence failed, and the caller goes
-- on to the stream pair (ack_streams_lock, ack_streams), which finishes the one
-- and explains the other.
WITH done AS (
    UPDATE conveyor_deliveries AS d SET
        status = 'succeeded',
        result = :result,
        finished_at = (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us),
        lease_expires_at = NULL
    FROM conveyor_tasks AS t
    WHERE t.id = :id AND d.task_seq = t.seq AND d.grp = :grp
      -- The fence: leased to this worker, on this attempt when one is given.
      AND d.status = 'running' AND d.worker_id = :worker_id
      AND (:attempt::int IS NULL OR d.attempt = :attempt::int)
      AND d.partition IS NULL
    RETURNING t.seq, t.id, t.name, t.queue, t.partition, t.payload, t.metadata, t.priority, d.max_attempts, t.created_at, t.key, t.parent_id, t.root_id, t.correlation_id, d.grp, d.status, d.attempt, d.run_at, d.started_at, d.finished_at, d.lease_expires_at, d.worker_id, d.progress, d.progress_message, d.result, d.error, d.lease
),
note AS (
    SELECT count(pg_notify('conveyor_done', done.id)) AS n FROM done
    WHERE EXISTS (SELECT 1 FROM conveyor_waiters AS w WHERE w.task_id = done.id)
)
SELECT done.* FROM note, done

-- name: task_views
-- Each task looked up by its unique id, then its row by the primary key: lateral
-- lookups with a LIMIT, which the planner cannot turn into a join over every task.
SELECT t.seq, t.id, t.name, t.queue, t.partition, t.payload, t.metadata, t.priority, d.max_attempts, t.created_at, t.key, t.parent_id, t.root_id, t.correlation_id, d.grp, d.status, d.attempt, d.run_at, d.started_at, d.finished_at, d.lease_expires_at, d.worker_id, d.progress, d.progress_message, d.result, d.error, d.lease
FROM json_array_elements_text(:ids::json) AS i(id)
CROSS JOIN LATERAL (SELECT * FROM conveyor_tasks AS t WHERE t.id = i.id LIMIT 1) AS t
CROSS JOIN LATERAL (
    SELECT * FROM conveyor_deliveries AS d WHERE d.task_seq = t.seq AND d.grp = :grp LIMIT 1
) AS d
