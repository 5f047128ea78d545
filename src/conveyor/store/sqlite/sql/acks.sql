-- The acknowledgements. SQLite has no data-modifying CTEs, so the batch
-- statements are scripts: the fenced UPDATE, then (ack_streams) the recompute of
-- the streams it moved, then the report. ``items`` is the same JSON text as on
-- Postgres: one array of [id, worker_id, grp, attempt, result] entries, read by
-- json_each; each item's task is found by its unique id (one index probe each,
-- never a walk of the group's delivery rows, which hold the history).
--
-- The report: a later statement of the script no longer sees which rows the
-- UPDATE changed, so it asks which items' rows are now in the state it wrote:
-- succeeded at this run's clock reading (``now_us``, one value for the whole
-- script) by the item's worker, on its attempt. (A row that worker had finished
-- in another transaction at the very same microsecond would count as finished
-- here too: it is, by that worker, on that attempt.) In ack_plain, when the
-- UPDATE changed as many rows as there are items (``changes()``, the usual
-- case), every item was finished and nothing is looked up again.
--
-- Waiters: a commit is SQLite's announcement. Other processes' connection
-- threads see ``PRAGMA data_version`` move and wake their waiters; this process
-- wakes its own after the commit.

-- name: succeed_plain
-- One succeed() of an unpartitioned task, its row found from the task's unique
-- id. No row: the row is partitioned or the fence failed, and the caller goes on
-- to the stream pair (ack_streams_lock, ack_streams), which finishes the one and
-- explains the other.
UPDATE conveyor_deliveries SET
    status = 'succeeded',
    result = :result,
    finished_at = :now_us,
    lease_expires_at = NULL
WHERE task_seq = (SELECT t.seq FROM conveyor_tasks AS t WHERE t.id = :id)
  -- The fence: leased to this worker, on this attempt when one is given. An
  -- attempt whose lease ran out and whose task was claimed again since (by any
  -- worker, this one too) finishes nothing.
  AND grp = :grp AND status = 'running' AND worker_id = :worker_id
  AND (:attempt IS NULL OR attempt = :attempt)
  AND "partition" IS NULL
-- SQLite's RETURNING may name only the updated table: each task column is a
-- lookup by the task's primary key.
RETURNING task_seq AS seq,
    (SELECT t.id FROM conveyor_tasks AS t WHERE t.seq = task_seq) AS id,
    (SELECT t.name FROM conveyor_tasks AS t WHERE t.seq = task_seq) AS name,
    (SELECT t.queue FROM conveyor_tasks AS t WHERE t.seq = task_seq) AS queue,
    (SELECT t."partition" FROM conveyor_tasks AS t WHERE t.seq = task_seq) AS "partition",
    (SELECT t.payload FROM conveyor_tasks AS t WHERE t.seq = task_seq) AS payload,
    (SELECT t.metadata FROM conveyor_tasks AS t WHERE t.seq = task_seq) AS metadata,
    (SELECT t.priority FROM conveyor_tasks AS t WHERE t.seq = task_seq) AS priority,
    max_attempts,
    (SELECT t.created_at FROM conveyor_tasks AS t WHERE t.seq = task_seq) AS created_at,
    (SELECT t."key" FROM conveyor_tasks AS t WHERE t.seq = task_seq) AS "key",
    (SELECT t.parent_id FROM conveyor_tasks AS t WHERE t.seq = task_seq) AS parent_id,
    (SELECT t.root_id FROM conveyor_tasks AS t WHERE t.seq = task_seq) AS root_id,
    (SELECT t.correlation_id FROM conveyor_tasks AS t WHERE t.seq = task_seq) AS correlation_id,
    grp, status, attempt, run_at, started_at, finished_at, lease_expires_at, worker_id,
    progress, progress_message, result, error, lease

-- name: task_views
SELECT t.seq, t.id, t.name, t.queue, t."partition", t.payload, t.metadata, t.priority,
       d.max_attempts, t.created_at, t."key", t.parent_id, t.root_id, t.correlation_id,
       d.grp, d.status, d.attempt, d.run_at, d.started_at, d.finished_at,
       d.lease_expires_at, d.worker_id, d.progress, d.progress_message, d.result, d.error,
       d.lease
-- CROSS JOIN: SQLite keeps that order, from the ids (given the choice, it walked
-- the group's delivery rows, which hold the history, by the status index).
FROM json_each(:ids) AS j
CROSS JOIN conveyor_tasks AS t ON t.id = j.value
CROSS JOIN conveyor_deliveries AS d ON d.task_seq = t.seq AND d.grp = :grp

-- name: ack_plain
UPDATE conveyor_deliveries AS d SET
    status = 'succeeded',
    result = i.result,
    finished_at = :now_us,
    lease_expires_at = NULL
FROM (
    SELECT t.seq, json_extract(j.value, '$[1]') AS worker_id,
           json_extract(j.value, '$[2]') AS grp, json_extract(j.value, '$[3]') AS attempt,
           json_extract(j.value, '$[4]') AS result
    FROM json_each(:items) AS j
    JOIN conveyor_tasks AS t ON t.id = json_extract(j.value, '$[0]')
) AS i
-- The fence, per item: leased to its worker, on its attempt when one is given.
WHERE d.task_seq = i.seq AND d.grp = i.grp
  AND d.status = 'running' AND d.worker_id = i.worker_id
  AND (i.attempt IS NULL OR d.attempt = i.attempt)
  -- Partitioned rows are left to ack_streams, which recomputes their streams in
  -- the same transaction.
  AND d."partition" IS NULL;
SELECT lost.idx
FROM (SELECT 1) AS one LEFT JOIN (
    SELECT j.key + 1 AS idx FROM json_each(:items) AS j
    WHERE changes() < json_array_length(:items)
      AND NOT EXISTS (
          SELECT 1 FROM conveyor_tasks AS t
          JOIN conveyor_deliveries AS d ON d.task_seq = t.seq
          WHERE t.id = json_extract(j.value, '$[0]') AND d.grp = json_extract(j.value, '$[2]')
            AND d.status = 'succeeded' AND d.finished_at = :now_us
            AND d.worker_id = json_extract(j.value, '$[1]')
            AND (json_extract(j.value, '$[3]') IS NULL OR d.attempt = json_extract(j.value, '$[3]'))
            AND d."partition" IS NULL
      )
) AS lost ON true

-- name: ack_streams_lock
-- One writer holds the whole database (BEGIN IMMEDIATE): there is nothing to lock,
-- and the recompute in ack_streams creates a missing stream row.
SELECT NULL AS locked WHERE :items IS NULL

-- name: ack_streams
UPDATE conveyor_deliveries AS d SET
    status = 'succeeded',
    result = i.result,
    finished_at = :now_us,
    lease_expires_at = NULL
FROM (
    SELECT t.seq, json_extract(j.value, '$[1]') AS worker_id,
           json_extract(j.value, '$[2]') AS grp, json_extract(j.value, '$[3]') AS attempt,
           json_extract(j.value, '$[4]') AS result
    FROM json_each(:items) AS j
    JOIN conveyor_tasks AS t ON t.id = json_extract(j.value, '$[0]')
) AS i
-- The fence, per item: leased to its worker, on its attempt when one is given.
WHERE d.task_seq = i.seq AND d.grp = i.grp
  AND d.status = 'running' AND d.worker_id = i.worker_id
  AND (i.attempt IS NULL OR d.attempt = i.attempt);
-- The streams of the rows just finished (found as the report finds them: in the
-- state this script wrote), recomputed as refresh_streams does, a stream that did
-- not move written as it was: the head is the first active row; the stream is
-- available while the head is queued and no row of it is leased, since the
-- moment its head became available (kept while the head stays the same, so the
-- stream keeps its place in line), else since now or the head's run_at,
-- whichever is later. A missing stream row is created.
WITH k AS (
    SELECT DISTINCT d.queue AS queue, d.grp AS grp, d."partition" AS part
    FROM json_each(:items) AS j
    CROSS JOIN conveyor_tasks AS t ON t.id = json_extract(j.value, '$[0]')
    CROSS JOIN conveyor_deliveries AS d
      ON d.task_seq = t.seq AND d.grp = json_extract(j.value, '$[2]')
    WHERE d."partition" IS NOT NULL AND d.status = 'succeeded' AND d.finished_at = :now_us
      AND d.worker_id = json_extract(j.value, '$[1]')
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
        ), coalesce(conveyor_streams.quiet_until, 0))
        ELSE max(excluded.available_at, coalesce(conveyor_streams.quiet_until, 0))
    END;
-- The report, from one look at each item's row: whether it is finished, and its
-- stream.
WITH i AS MATERIALIZED (
    SELECT j.key + 1 AS idx, d.task_seq IS NOT NULL AS done,
           d.queue AS queue, d.grp AS grp, d."partition" AS part
    FROM json_each(:items) AS j
    LEFT JOIN conveyor_tasks AS t ON t.id = json_extract(j.value, '$[0]')
    LEFT JOIN conveyor_deliveries AS d
      ON d.task_seq = t.seq AND d.grp = json_extract(j.value, '$[2]')
     AND d.status = 'succeeded' AND d.finished_at = :now_us
     AND d.worker_id = json_extract(j.value, '$[1]')
     AND (json_extract(j.value, '$[3]') IS NULL OR d.attempt = json_extract(j.value, '$[3]'))
)
SELECT lost.idx, (
    -- The streams of the finished rows whose head is claimable now, found from the
    -- items (CROSS JOIN keeps them the outer loop: a walk of the available streams
    -- would look at every stream of the database).
    SELECT count(*)
    FROM (SELECT DISTINCT queue, grp, part FROM i WHERE done AND part IS NOT NULL) AS k
    CROSS JOIN conveyor_streams AS s
    WHERE s.queue = k.queue AND s.grp = k.grp AND s."partition" = k.part
      AND s.available_at IS NOT NULL
) AS freed
FROM (SELECT 1) AS one LEFT JOIN (SELECT idx FROM i WHERE NOT done) AS lost ON true
