-- name: lock_group_streams
WITH keys AS MATERIALIZED (
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
)
INSERT INTO conveyor_streams (queue, grp, partition)
SELECT queue, grp, partition FROM keys ORDER BY n
ON CONFLICT (queue, grp, partition) DO UPDATE SET head_seq = conveyor_streams.head_seq
WHERE false

-- name: lock_group_streams_if_parents
WITH keys AS MATERIALIZED (
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
    WHERE NOT EXISTS (
        SELECT 1 FROM unnest(:parent_ids::text[]) AS m(id)
        WHERE m.id IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS t WHERE t.id = m.id)
    )
)
INSERT INTO conveyor_streams (queue, grp, partition)
SELECT queue, grp, partition FROM keys ORDER BY n
ON CONFLICT (queue, grp, partition) DO UPDATE SET head_seq = conveyor_streams.head_seq
WHERE false

-- name: lock_streams
WITH keys AS MATERIALIZED (
    SELECT k.v ->> 0 AS queue, k.v ->> 1 AS grp, k.v ->> 2 AS partition, k.idx AS n
    FROM (SELECT * FROM (SELECT * FROM json_array_elements(:keys::json) WITH ORDINALITY AS k(v, idx) LIMIT (SELECT json_array_length(:keys::json))) AS k LIMIT (SELECT json_array_length(:keys::json))) AS k
)
INSERT INTO conveyor_streams (queue, grp, partition)
SELECT queue, grp, partition FROM keys ORDER BY n
ON CONFLICT (queue, grp, partition) DO UPDATE SET head_seq = conveyor_streams.head_seq
WHERE false

-- name: lock_streams_if_parents
WITH keys AS MATERIALIZED (
    SELECT k.v ->> 0 AS queue, k.v ->> 1 AS grp, k.v ->> 2 AS partition, k.idx AS n
    FROM (SELECT * FROM (SELECT * FROM json_array_elements(:keys::json) WITH ORDINALITY AS k(v, idx) LIMIT (SELECT json_array_length(:keys::json))) AS k LIMIT (SELECT json_array_length(:keys::json))) AS k
    WHERE NOT EXISTS (
        SELECT 1 FROM unnest(:parent_ids::text[]) AS m(id)
        WHERE m.id IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS t WHERE t.id = m.id)
    )
)
INSERT INTO conveyor_streams (queue, grp, partition)
SELECT queue, grp, partition FROM keys ORDER BY n
ON CONFLICT (queue, grp, partition) DO UPDATE SET head_seq = conveyor_streams.head_seq
WHERE false

-- name: refresh_group_streams
WITH keys AS MATERIALIZED (
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
    -- quiet: a debounced queue's streams wait its quiet period from this submit
    -- (this statement runs only after a submit wrote to them); NULL otherwise.
    SELECT k.queue, k.grp, k.partition, h.task_seq, h.status, h.run_at, h.priority,
           ROW(k.grp::text, k.queue::text, k.partition::text) = ANY(b.keys) AS leased,
           (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
               + round(q.debounce * 1000000)::bigint AS quiet
    FROM keys AS k CROSS JOIN busy AS b
    LEFT JOIN conveyor_queues AS q ON q.queue = k.queue AND q.debounce > 0
    LEFT JOIN LATERAL (
        SELECT y.task_seq, y.status, y.run_at, y.priority
        FROM conveyor_deliveries AS y
        WHERE y.grp = k.grp AND y.queue = k.queue AND y.partition = k.partition
          AND y.status IN ('queued', 'running')
        ORDER BY y.task_seq
        LIMIT 1
    ) AS h ON true
)
UPDATE conveyor_streams AS s SET
    quiet_until = coalesce(h.quiet, s.quiet_until),
    head_seq = h.task_seq,
    priority = h.priority,
    available_at = CASE WHEN h.status = 'queued' AND NOT h.leased THEN
            CASE WHEN s.head_seq = h.task_seq AND s.available_at IS NOT NULL
                 THEN greatest(s.available_at, h.run_at, s.quiet_until, h.quiet)
                 ELSE greatest((floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us), h.run_at, s.quiet_until, h.quiet)
            END
        END
FROM heads AS h
WHERE s.queue = h.queue AND s.grp = h.grp AND s.partition = h.partition
  AND (h.quiet IS NOT NULL OR s.head_seq IS DISTINCT FROM h.task_seq OR s.available_at IS DISTINCT FROM CASE WHEN h.status = 'queued' AND NOT h.leased THEN
            CASE WHEN s.head_seq = h.task_seq AND s.available_at IS NOT NULL
                 THEN greatest(s.available_at, h.run_at, s.quiet_until, h.quiet)
                 ELSE greatest((floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us), h.run_at, s.quiet_until, h.quiet)
            END
        END)

-- name: refresh_streams
WITH keys AS MATERIALIZED (
    SELECT k.v ->> 0 AS queue, k.v ->> 1 AS grp, k.v ->> 2 AS partition, k.idx AS n
    FROM (SELECT * FROM (SELECT * FROM json_array_elements(:keys::json) WITH ORDINALITY AS k(v, idx) LIMIT (SELECT json_array_length(:keys::json))) AS k LIMIT (SELECT json_array_length(:keys::json))) AS k
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
RETURNING s.available_at

-- name: share_groups
SELECT 1 FROM conveyor_groups
WHERE queue IN (SELECT json_array_elements_text(:queues::json)) AND active
ORDER BY queue, name
FOR SHARE

-- name: quiet_streams
-- After a submit wrote tasks to these partitions, each of their streams (queue
-- mode's and every group's, locked by the submit already) of a queue with a
-- debounce waits until the quiet period after this submit has passed: its
-- quiet_until moves on, and an available stream's available_at with it. The
-- recompute statements keep available_at at or after quiet_until. A queue
-- without a debounce matches no row.
UPDATE conveyor_streams AS s SET
    quiet_until = c.now + round(q.debounce * 1000000)::bigint,
    available_at = CASE WHEN s.available_at IS NOT NULL
        THEN greatest(s.available_at, c.now + round(q.debounce * 1000000)::bigint) END
FROM (
    SELECT DISTINCT e.v ->> 0 AS queue, e.v ->> 1 AS partition
    FROM json_array_elements(:pairs::json) AS e(v)
) AS p
JOIN conveyor_queues AS q ON q.queue = p.queue AND q.debounce > 0
CROSS JOIN (SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now) AS c
WHERE s.queue = p.queue AND s.partition = p.partition
