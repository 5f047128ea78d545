-- name: lock_streams
-- One writer holds the whole database: the write lock is the lock, and the rows
-- missing are created, as on Postgres (the recompute that follows then finds them).
INSERT INTO conveyor_streams (queue, grp, "partition")
SELECT json_extract(j.value, '$[0]'), json_extract(j.value, '$[1]'),
    json_extract(j.value, '$[2]')
FROM json_each(:keys) AS j
-- WHERE: SQLite's parser needs it to tell the SELECT's end from ON CONFLICT.
WHERE true
ON CONFLICT (queue, grp, "partition") DO NOTHING

-- name: refresh_streams
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


-- name: share_groups
-- One writer holds the whole database: nothing to share. Unsubscribe waits for the
-- write lock, and a submit's fan-out reads the group rows in the statement that
-- writes, under that lock (in a caller's deferred transaction too).
SELECT 1 WHERE 0
