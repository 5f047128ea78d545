-- name: ack_plain
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
      AND d.worker_id = i.worker_id AND (i.attempt IS NULL OR d.attempt = i.attempt)
      AND d.partition IS NULL
    RETURNING i.id, d.grp
),
note AS (
    SELECT count(pg_notify('conveyor_done', done.id)) AS n FROM done
    WHERE EXISTS (SELECT 1 FROM conveyor_waiters AS w WHERE w.task_id = done.id)
)
SELECT lost.idx
FROM note LEFT JOIN (
    SELECT i.idx FROM items AS i
    WHERE (SELECT count(*) FROM done) < (SELECT count(*) FROM items)
      AND NOT EXISTS (SELECT 1 FROM done WHERE done.id = i.id AND done.grp = i.grp)
) AS lost ON true

-- name: ack_streams
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
UPDATE conveyor_streams AS s SET
    head_seq = h.task_seq,
    priority = h.priority,
    available_at = CASE WHEN h.status = 'queued' AND NOT h.leased THEN
            CASE WHEN s.head_seq = h.task_seq AND s.available_at IS NOT NULL
                 THEN greatest(s.available_at, h.run_at)
                 ELSE greatest((floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us), h.run_at)
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

    SELECT i.idx FROM items AS i
    WHERE (SELECT count(*) FROM done) < (SELECT count(*) FROM items)
      AND NOT EXISTS (SELECT 1 FROM done WHERE done.id = i.id AND done.grp = i.grp)
) AS lost ON true

-- name: ack_streams_lock
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
WITH done AS (
    UPDATE conveyor_deliveries AS d SET
        status = 'succeeded',
        result = :result,
        finished_at = (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us),
        lease_expires_at = NULL
    FROM conveyor_tasks AS t
    WHERE t.id = :id AND d.task_seq = t.seq AND d.grp = :grp
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
