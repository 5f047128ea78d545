-- name: claim_keys
INSERT INTO conveyor_keys (key, task_id) SELECT k.value, i.value FROM json_each(:keys) AS k JOIN json_each(:ids) AS i ON i.key = k.key WHERE true ORDER BY k.key ON CONFLICT (key) DO NOTHING RETURNING key

-- name: lock_keys
SELECT key, task_id FROM conveyor_keys WHERE key IN (SELECT value FROM json_each(:keys)) ORDER BY key

-- name: key_holder
-- One writer holds the whole database: the key row needs no lock of its own.
SELECT t.seq, t.id, t.name, t.queue, t."partition", t.payload, t.metadata, t.priority,
       d.max_attempts, t.created_at, t."key", t.parent_id, t.root_id, t.correlation_id,
       d.grp, d.status, d.attempt, d.run_at, d.started_at, d.finished_at,
       d.lease_expires_at, d.worker_id, d.progress, d.progress_message, d.result, d.error,
       d.lease
FROM conveyor_keys AS k
JOIN conveyor_tasks AS t ON t.id = k.task_id
JOIN conveyor_deliveries AS d ON d.task_seq = t.seq AND d.grp = ''
WHERE k.key = :key

-- name: key_answers
WITH a AS (
    SELECT NULL AS holds, i.value AS id FROM json_each(:ids) AS i
    UNION ALL
    SELECT k.key, k.task_id FROM json_each(:keys) AS u
    JOIN conveyor_keys AS k ON k.key = u.value
)
SELECT a.holds, t.seq, t.id, t.name, t.queue, t."partition", t.payload, t.metadata,
       t.priority, d.max_attempts, t.created_at, t."key", t.parent_id, t.root_id,
       t.correlation_id, d.grp, d.status, d.attempt, d.run_at, d.started_at,
       d.finished_at, d.lease_expires_at, d.worker_id, d.progress, d.progress_message,
       d.result, d.error, d.lease
-- CROSS JOIN: from the answers to their rows by primary key, in that order.
FROM a CROSS JOIN conveyor_tasks AS t ON t.id = a.id
CROSS JOIN conveyor_deliveries AS d ON d.task_seq = t.seq AND d.grp = ''

-- name: replace_share
-- One writer holds the whole database: nothing to share (see share_groups).
SELECT 1 WHERE 0

-- name: replace_lock
-- The write lock is the lock: what is left is creating the stream rows missing,
-- the holder's and those of the new task's partition in queue mode and every
-- active group, so the recompute that follows finds them.
INSERT INTO conveyor_streams (queue, grp, "partition")
SELECT * FROM (
SELECT DISTINCT d.queue, d.grp, d."partition"
FROM conveyor_keys AS k
JOIN conveyor_tasks AS t ON t.id = k.task_id
JOIN conveyor_deliveries AS d ON d.task_seq = t.seq
WHERE k.key = :key AND k.task_id <> :id AND d."partition" IS NOT NULL
UNION
SELECT json_extract(p.value, '$[0]'), '', json_extract(p.value, '$[1]')
FROM json_each(:pairs) AS p
UNION
SELECT json_extract(p.value, '$[0]'), g.name, json_extract(p.value, '$[1]')
FROM json_each(:pairs) AS p
JOIN conveyor_groups AS g ON g.queue = json_extract(p.value, '$[0]') AND g.active
)
-- WHERE: SQLite's parser needs it to tell the join's ON from ON CONFLICT.
WHERE true
ON CONFLICT (queue, grp, "partition") DO NOTHING

-- name: replace_cancel
-- The holder the key row names, if another task: its active rows cancelled. A
-- wait() for it hears the commit (PRAGMA data_version; in this process, the store
-- wakes its own waiters).
UPDATE conveyor_deliveries SET status = 'cancelled', finished_at = :now_us,
    lease_expires_at = NULL
WHERE task_seq = (
    SELECT t.seq FROM conveyor_keys AS k JOIN conveyor_tasks AS t ON t.id = k.task_id
    WHERE k.key = :key AND k.task_id <> :id
) AND status IN ('queued', 'running')

-- name: replace_refresh
-- refresh_streams (streams.sql) of the holder's streams: the same recompute, its
-- keys read from the holder's delivery rows instead of a parameter.
WITH k AS (
    SELECT DISTINCT d.queue AS queue, d.grp AS grp, d."partition" AS part
    FROM conveyor_keys AS kr
    JOIN conveyor_tasks AS t ON t.id = kr.task_id
    JOIN conveyor_deliveries AS d ON d.task_seq = t.seq
    WHERE kr.key = :key AND kr.task_id <> :id AND d."partition" IS NOT NULL
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
           SELECT 1 FROM conveyor_deliveries AS r
           WHERE r.grp = h.grp AND r.queue = h.queue AND r."partition" = h.part
             AND r.status = 'running'
       ) THEN max(:now_us, x.run_at) END
FROM h LEFT JOIN conveyor_deliveries AS x ON x.task_seq = h.head AND x.grp = h.grp
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
    END
RETURNING available_at

-- name: replace_key
UPDATE conveyor_keys SET task_id = :id WHERE key = :key AND task_id <> :id
