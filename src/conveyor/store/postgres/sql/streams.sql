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
                 THEN greatest(s.available_at, h.run_at)
                 ELSE greatest((floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us), h.run_at)
            END
        END
FROM heads AS h
WHERE s.queue = h.queue AND s.grp = h.grp AND s.partition = h.partition
  AND (s.head_seq IS DISTINCT FROM h.task_seq OR s.available_at IS DISTINCT FROM CASE WHEN h.status = 'queued' AND NOT h.leased THEN
            CASE WHEN s.head_seq = h.task_seq AND s.available_at IS NOT NULL
                 THEN greatest(s.available_at, h.run_at)
                 ELSE greatest((floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us), h.run_at)
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
                 THEN greatest(s.available_at, h.run_at)
                 ELSE greatest((floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us), h.run_at)
            END
        END
FROM heads AS h
WHERE s.queue = h.queue AND s.grp = h.grp AND s.partition = h.partition
  AND (s.head_seq IS DISTINCT FROM h.task_seq OR s.available_at IS DISTINCT FROM CASE WHEN h.status = 'queued' AND NOT h.leased THEN
            CASE WHEN s.head_seq = h.task_seq AND s.available_at IS NOT NULL
                 THEN greatest(s.available_at, h.run_at)
                 ELSE greatest((floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us), h.run_at)
            END
        END)
RETURNING s.available_at

-- name: share_groups
SELECT 1 FROM conveyor_groups
WHERE queue IN (SELECT json_array_elements_text(:queues::json)) AND active
ORDER BY queue, name
FOR SHARE
