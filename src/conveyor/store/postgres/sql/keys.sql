-- name: claim_keys
INSERT INTO conveyor_keys (key, task_id)
SELECT k.key, i.task_id
FROM json_array_elements_text(:keys::json) WITH ORDINALITY AS k(key, n)
JOIN json_array_elements_text(:ids::json) WITH ORDINALITY AS i(task_id, n) USING (n)
ORDER BY n
ON CONFLICT (key) DO NOTHING
RETURNING key

-- name: key_answers
SELECT a.holds, t.seq, t.id, t.name, t.queue, t.partition, t.payload, t.metadata, t.priority, d.max_attempts, t.created_at, t.key, t.parent_id, t.root_id, t.correlation_id, d.grp, d.status, d.attempt, d.run_at, d.started_at, d.finished_at, d.lease_expires_at, d.worker_id, d.progress, d.progress_message, d.result, d.error, d.lease
FROM (
    SELECT NULL::text AS holds, i.id FROM unnest(:ids::text[]) AS i(id)
    UNION ALL
    SELECT k.key, k.task_id FROM unnest(:keys::text[]) AS u(key)
    CROSS JOIN LATERAL (
        SELECT k.key, k.task_id FROM conveyor_keys AS k WHERE k.key = u.key LIMIT 1
    ) AS k
) AS a
CROSS JOIN LATERAL (SELECT * FROM conveyor_tasks AS t WHERE t.id = a.id LIMIT 1) AS t
CROSS JOIN LATERAL (
    SELECT * FROM conveyor_deliveries AS d
    WHERE d.task_seq = t.seq AND d.grp = '' LIMIT 1
) AS d

-- name: key_holder
SELECT t.seq, t.id, t.name, t.queue, t.partition, t.payload, t.metadata, t.priority, d.max_attempts, t.created_at, t.key, t.parent_id, t.root_id, t.correlation_id, d.grp, d.status, d.attempt, d.run_at, d.started_at, d.finished_at, d.lease_expires_at, d.worker_id, d.progress, d.progress_message, d.result, d.error, d.lease
FROM conveyor_keys AS k
JOIN conveyor_tasks AS t ON t.id = k.task_id
JOIN conveyor_deliveries AS d ON d.task_seq = t.seq AND d.grp = ''
WHERE k.key = :key
FOR UPDATE OF k

-- name: lock_keys
SELECT key, task_id FROM conveyor_keys
WHERE key IN (SELECT json_array_elements_text(:keys::json))
ORDER BY key COLLATE "C"
FOR UPDATE

-- name: replace_cancel
WITH holder AS (
    SELECT t.seq, t.id, t.queue, t.partition
    FROM conveyor_keys AS k JOIN conveyor_tasks AS t ON t.id = k.task_id
    WHERE k.key = :key AND k.task_id <> :id
),
gone AS (
    UPDATE conveyor_deliveries AS d SET
        status = 'cancelled', finished_at = (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us), lease_expires_at = NULL
    FROM holder AS h
    WHERE d.task_seq = h.seq AND d.status IN ('queued', 'running')
    RETURNING h.id
)
SELECT count(pg_notify('conveyor_done', g.id))
FROM (SELECT DISTINCT id FROM gone) AS g
WHERE EXISTS (SELECT 1 FROM conveyor_waiters AS w WHERE w.task_id = g.id)

-- name: replace_key
UPDATE conveyor_keys SET task_id = :id WHERE key = :key AND task_id <> :id

-- name: replace_lock
WITH keys AS MATERIALIZED (
    SELECT u.queue, u.grp, u.partition, row_number() OVER (
        ORDER BY u.grp COLLATE "C", u.queue COLLATE "C", u.partition COLLATE "C"
    ) AS n
    FROM (
    SELECT DISTINCT d.queue, d.grp, d.partition
    FROM (
    SELECT t.seq, t.id, t.queue, t.partition
    FROM conveyor_keys AS k JOIN conveyor_tasks AS t ON t.id = k.task_id
    WHERE k.key = :key AND k.task_id <> :id
    ) AS h JOIN conveyor_deliveries AS d ON d.task_seq = h.seq
    WHERE d.partition IS NOT NULL
        UNION
        SELECT g.queue, g.grp, g.partition FROM (
    SELECT p.queue, g.grp, p.partition, row_number() OVER (
        ORDER BY g.grp COLLATE "C", p.queue COLLATE "C", p.partition COLLATE "C"
    ) AS n
    FROM (
        SELECT DISTINCT e.v ->> 0 AS queue, e.v ->> 1 AS partition
        FROM json_array_elements(:pairs::json) AS e(v)
    ) AS p CROSS JOIN LATERAL (
        SELECT '' AS grp
        UNION ALL
        SELECT g.name FROM conveyor_groups AS g WHERE g.queue = p.queue AND g.active
    ) AS g
        ) AS g
    ) AS u
)
INSERT INTO conveyor_streams (queue, grp, partition)
SELECT queue, grp, partition FROM keys ORDER BY n
ON CONFLICT (queue, grp, partition) DO UPDATE SET head_seq = conveyor_streams.head_seq
WHERE false

-- name: replace_refresh
WITH keys AS MATERIALIZED (
    SELECT DISTINCT d.queue, d.grp, d.partition
    FROM (
    SELECT t.seq, t.id, t.queue, t.partition
    FROM conveyor_keys AS k JOIN conveyor_tasks AS t ON t.id = k.task_id
    WHERE k.key = :key AND k.task_id <> :id
    ) AS h JOIN conveyor_deliveries AS d ON d.task_seq = h.seq
    WHERE d.partition IS NOT NULL
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
      AND (r.grp, r.queue) IN (SELECT DISTINCT grp, queue FROM keys)
      AND r.partition = ANY(ARRAY(SELECT partition FROM keys))
),
heads AS MATERIALIZED (
    SELECT k.queue, k.grp, k.partition, h.task_seq, h.status, h.run_at, h.priority,
           ROW(k.grp::text, k.queue::text, k.partition::text) = ANY(b.keys) AS leased
    FROM keys AS k CROSS JOIN busy AS b LEFT JOIN LATERAL (
        SELECT y.task_seq, y.status, y.run_at, y.priority
        FROM conveyor_deliveries AS y
        WHERE y.grp = k.grp AND y.queue = k.queue AND y.partition = k.partition
          AND y.status IN ('queued', 'running')
        ORDER BY y.task_seq
        LIMIT 1
    ) AS h ON true
)
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
  AND (s.head_seq IS DISTINCT FROM h.task_seq OR s.available_at IS DISTINCT FROM CASE WHEN h.status = 'queued' AND NOT h.leased THEN
            CASE WHEN s.head_seq = h.task_seq AND s.available_at IS NOT NULL
                 THEN greatest(s.available_at, h.run_at, s.quiet_until)
                 ELSE greatest((floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us), h.run_at, s.quiet_until)
            END
        END)

-- name: replace_share
SELECT 1 FROM conveyor_groups
WHERE active AND queue IN (
    SELECT json_array_elements_text(:queues::json)
    UNION
    SELECT h.queue FROM (
    SELECT t.seq, t.id, t.queue, t.partition
    FROM conveyor_keys AS k JOIN conveyor_tasks AS t ON t.id = k.task_id
    WHERE k.key = :key AND k.task_id <> :id
    ) AS h
)
ORDER BY queue, name
FOR SHARE
