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
        ), coalesce(conveyor_streams.quiet_until, 0))
        ELSE max(excluded.available_at, coalesce(conveyor_streams.quiet_until, 0))
    END
RETURNING available_at


-- name: share_groups
-- One writer holds the whole database: nothing to share. Unsubscribe waits for the
-- write lock, and a submit's fan-out reads the group rows in the statement that
-- writes, under that lock (in a caller's deferred transaction too).
SELECT 1 WHERE 0

-- name: lock_streams_if_parents
-- lock_streams, only if every parent given is a task: a child of an unknown
-- parent writes nothing, no stream row either.
INSERT INTO conveyor_streams (queue, grp, "partition")
SELECT json_extract(j.value, '$[0]'), json_extract(j.value, '$[1]'),
    json_extract(j.value, '$[2]')
FROM json_each(:keys) AS j
WHERE NOT EXISTS (
    SELECT 1 FROM json_each(:parent_ids) AS m
    WHERE m.value IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS t WHERE t.id = m.value)
)
ON CONFLICT (queue, grp, "partition") DO NOTHING

-- name: lock_group_streams
-- The streams of the pairs in queue mode and every active group, created where
-- missing (the write lock is the lock).
INSERT INTO conveyor_streams (queue, grp, "partition")
SELECT * FROM (
    SELECT json_extract(p.value, '$[0]'), '', json_extract(p.value, '$[1]')
    FROM json_each(:pairs) AS p
    UNION
    SELECT json_extract(p.value, '$[0]'), g.name, json_extract(p.value, '$[1]')
    FROM json_each(:pairs) AS p
    JOIN conveyor_groups AS g ON g.queue = json_extract(p.value, '$[0]') AND g.active
)
WHERE NOT EXISTS (
    SELECT 1 FROM json_each(:parent_ids) AS m
    WHERE m.value IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS t WHERE t.id = m.value)
)
ON CONFLICT (queue, grp, "partition") DO NOTHING

-- name: lock_group_streams_if_parents
-- lock_group_streams reads parent_ids already (none given: no condition):
-- as: lock_group_streams

-- name: refresh_group_streams
-- refresh_streams of the pairs' streams in queue mode and every active group: the
-- same recompute, its keys made from the pairs.
WITH k AS (
    SELECT json_extract(p.value, '$[0]') AS queue, '' AS grp,
           json_extract(p.value, '$[1]') AS part
    FROM json_each(:pairs) AS p
    UNION
    SELECT json_extract(p.value, '$[0]'), g.name, json_extract(p.value, '$[1]')
    FROM json_each(:pairs) AS p
    JOIN conveyor_groups AS g ON g.queue = json_extract(p.value, '$[0]') AND g.active
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
INSERT INTO conveyor_streams (queue, grp, "partition", head_seq, priority, available_at,
    quiet_until)
SELECT h.queue, h.grp, h.part, h.head, x.priority,
       CASE WHEN x.status = 'queued' AND NOT EXISTS (
           SELECT 1 FROM conveyor_deliveries AS r
           WHERE r.grp = h.grp AND r.queue = h.queue AND r."partition" = h.part
             AND r.status = 'running'
       ) THEN max(:now_us, x.run_at) END,
       -- A debounced queue's streams wait its quiet period from this submit (this
       -- statement runs only after a submit wrote to them); NULL otherwise.
       :now_us + CAST(round((
           SELECT q.debounce FROM conveyor_queues AS q
           WHERE q.queue = h.queue AND q.debounce > 0
       ) * 1000000) AS INTEGER)
FROM h LEFT JOIN conveyor_deliveries AS x ON x.task_seq = h.head AND x.grp = h.grp
-- Only the streams that exist, as an UPDATE would (the locks before created
-- them; a submit that wrote nothing, a child of an unknown parent, created none).
WHERE EXISTS (
    SELECT 1 FROM conveyor_streams AS e
    WHERE e.queue = h.queue AND e.grp = h.grp AND e."partition" = h.part
)
ON CONFLICT (queue, grp, "partition") DO UPDATE SET
    quiet_until = coalesce(excluded.quiet_until, conveyor_streams.quiet_until),
    head_seq = excluded.head_seq,
    priority = excluded.priority,
    available_at = CASE
        WHEN excluded.available_at IS NULL THEN NULL
        WHEN conveyor_streams.head_seq = excluded.head_seq AND conveyor_streams.available_at
        THEN max(conveyor_streams.available_at, (
            SELECT y.run_at FROM conveyor_deliveries AS y
            WHERE y.task_seq = excluded.head_seq AND y.grp = excluded.grp
        ), coalesce(excluded.quiet_until, conveyor_streams.quiet_until, 0))
        ELSE max(excluded.available_at, coalesce(excluded.quiet_until, conveyor_streams.quiet_until, 0))
    END
RETURNING available_at

-- name: quiet_streams
-- After a submit wrote tasks to these partitions, each of their streams (queue
-- mode's and every group's) of a queue with a debounce waits until the quiet
-- period after this submit has passed: its quiet_until moves on, and an
-- available stream's available_at with it. The recompute statements keep
-- available_at at or after quiet_until. A queue without a debounce matches no row.
WITH p AS MATERIALIZED (
    SELECT DISTINCT json_extract(e.value, '$[0]') AS queue,
           json_extract(e.value, '$[1]') AS part,
           :now_us + CAST(round(q.debounce * 1000000) AS INTEGER) AS quiet
    FROM json_each(:pairs) AS e
    JOIN conveyor_queues AS q ON q.queue = json_extract(e.value, '$[0]') AND q.debounce > 0
)
UPDATE conveyor_streams SET
    quiet_until = p.quiet,
    available_at = CASE WHEN conveyor_streams.available_at IS NOT NULL
        THEN max(conveyor_streams.available_at, p.quiet) END
FROM p
WHERE conveyor_streams.queue = p.queue AND conveyor_streams."partition" = p.part
