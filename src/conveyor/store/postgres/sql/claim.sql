-- name: claim.any
WITH flags AS (
    SELECT set_config('synchronous_commit', 'off', true) AS quick, EXISTS (
        SELECT 1 FROM conveyor_deliveries
        WHERE status = 'running' AND grp = :grp AND queue = ANY(:queues::text[])
          AND lease_expires_at < (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
    ) AS busy
),
free AS MATERIALIZED (
    SELECT s.queue, s.partition, s.priority, s.available_at, s.head_seq
    FROM conveyor_streams AS s
    WHERE s.grp = :grp AND s.queue = ANY(:queues::text[])
      AND s.available_at IS NOT NULL AND s.available_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
      AND (:partition::text IS NULL OR s.partition = :partition::text)
      AND NOT (SELECT busy FROM flags)
    ORDER BY s.priority DESC, s.available_at, s.queue, s.partition
    LIMIT :streams
    FOR UPDATE OF s SKIP LOCKED
),
srows AS MATERIALIZED (
    SELECT f.queue, f.partition, f.priority AS pri, f.available_at AS at, r.task_seq, r.n
    FROM free AS f CROSS JOIN LATERAL (
        SELECT x.task_seq,
               row_number() OVER w AS n,
               bool_and(x.status = 'queued' AND x.run_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)) OVER w AS ok,
               min(x.task_seq) OVER () AS first
        FROM (
            SELECT y.task_seq, y.status, y.run_at
            FROM conveyor_deliveries AS y
            WHERE y.grp = :grp AND y.queue = f.queue AND y.partition = f.partition
              AND y.status IN ('queued', 'running') AND y.task_seq >= f.head_seq
            ORDER BY y.task_seq
            LIMIT :per_stream
        ) AS x
        WINDOW w AS (ORDER BY x.task_seq)
    ) AS r
    WHERE r.ok AND r.first = f.head_seq
),
plain AS MATERIALIZED (
    SELECT p.task_seq, p.queue, p.priority, p.run_at
    FROM conveyor_deliveries AS p
    WHERE p.grp = :grp AND p.queue = ANY(:queues::text[]) AND p.status = 'queued' AND p.partition IS NULL
      AND p.run_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AND :partition::text IS NULL
      AND NOT (SELECT busy FROM flags)
    ORDER BY p.priority DESC, p.run_at, p.task_seq
    LIMIT :limit
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
    WHERE :mix OR CASE WHEN e.lead = 1 THEN e.rank = 1 ELSE e.kind = 0 END
),
picked AS MATERIALIZED (
    SELECT k.task_seq, k.rank, k.queue, :grp::text AS grp, 'queued'::text AS status, coalesce(
        :lease::float8,
        (SELECT c.lease FROM conveyor_queues AS c WHERE c.queue = k.queue),
        30.0
    ) AS length
    FROM (
        SELECT s.task_seq, c.rank, c.queue
        FROM chosen AS c CROSS JOIN LATERAL unnest(c.seqs) WITH ORDINALITY AS s(task_seq, n)
        WHERE c.kind = 1 AND c.upto - c.size + s.n <= :limit AND EXISTS (SELECT 1 FROM free)
        UNION ALL
        SELECT c.seq, c.rank, c.queue FROM chosen AS c
        WHERE c.kind = 0 AND c.upto <= :limit AND EXISTS (SELECT 1 FROM free)
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
        worker_id = :worker_id,
        lease = k.length,
        lease_expires_at = (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) + CAST(round(1000000.0 * k.length) AS bigint),
        started_at = coalesce(d.started_at, (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)),
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
    -- With ``s.grp = :grp`` on its own, the generic plan read every stream of the
    -- group instead (the primary key by ``grp`` alone) and compared each with every
    -- taken stream: 0.47 of a 1.4 ms claim of 20 tasks at 100 partitions, and
    -- growing with the partitions.
    UPDATE conveyor_streams AS s SET available_at = NULL
    FROM (
        SELECT DISTINCT queue, :grp::text AS grp, partition
        FROM taken WHERE partition IS NOT NULL
    ) AS h
    WHERE s.queue = h.queue AND s.grp = h.grp AND s.partition = h.partition
    RETURNING 1
)
SELECT flags.busy, x.rank, t.seq, t.id, t.name, t.queue, t.partition, t.payload, t.metadata, t.priority, x.max_attempts, t.created_at, t.key, t.parent_id, t.root_id, t.correlation_id, x.grp, x.status, x.attempt, x.run_at, x.started_at, x.finished_at, x.lease_expires_at, x.worker_id, x.progress, x.progress_message, x.result, x.error, x.lease
FROM flags LEFT JOIN (taken AS x JOIN conveyor_tasks AS t ON t.seq = x.task_seq) ON true

-- name: claim.any_durable
WITH flags AS (
    SELECT NULL AS quick, EXISTS (
        SELECT 1 FROM conveyor_deliveries
        WHERE status = 'running' AND grp = :grp AND queue = ANY(:queues::text[])
          AND lease_expires_at < (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
    ) AS busy
),
free AS MATERIALIZED (
    SELECT s.queue, s.partition, s.priority, s.available_at, s.head_seq
    FROM conveyor_streams AS s
    WHERE s.grp = :grp AND s.queue = ANY(:queues::text[])
      AND s.available_at IS NOT NULL AND s.available_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
      AND (:partition::text IS NULL OR s.partition = :partition::text)
      AND NOT (SELECT busy FROM flags)
    ORDER BY s.priority DESC, s.available_at, s.queue, s.partition
    LIMIT :streams
    FOR UPDATE OF s SKIP LOCKED
),
srows AS MATERIALIZED (
    SELECT f.queue, f.partition, f.priority AS pri, f.available_at AS at, r.task_seq, r.n
    FROM free AS f CROSS JOIN LATERAL (
        SELECT x.task_seq,
               row_number() OVER w AS n,
               bool_and(x.status = 'queued' AND x.run_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)) OVER w AS ok,
               min(x.task_seq) OVER () AS first
        FROM (
            SELECT y.task_seq, y.status, y.run_at
            FROM conveyor_deliveries AS y
            WHERE y.grp = :grp AND y.queue = f.queue AND y.partition = f.partition
              AND y.status IN ('queued', 'running') AND y.task_seq >= f.head_seq
            ORDER BY y.task_seq
            LIMIT :per_stream
        ) AS x
        WINDOW w AS (ORDER BY x.task_seq)
    ) AS r
    WHERE r.ok AND r.first = f.head_seq
),
plain AS MATERIALIZED (
    SELECT p.task_seq, p.queue, p.priority, p.run_at
    FROM conveyor_deliveries AS p
    WHERE p.grp = :grp AND p.queue = ANY(:queues::text[]) AND p.status = 'queued' AND p.partition IS NULL
      AND p.run_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AND :partition::text IS NULL
      AND NOT (SELECT busy FROM flags)
    ORDER BY p.priority DESC, p.run_at, p.task_seq
    LIMIT :limit
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
    WHERE :mix OR CASE WHEN e.lead = 1 THEN e.rank = 1 ELSE e.kind = 0 END
),
picked AS MATERIALIZED (
    SELECT k.task_seq, k.rank, k.queue, :grp::text AS grp, 'queued'::text AS status, coalesce(
        :lease::float8,
        (SELECT c.lease FROM conveyor_queues AS c WHERE c.queue = k.queue),
        30.0
    ) AS length
    FROM (
        SELECT s.task_seq, c.rank, c.queue
        FROM chosen AS c CROSS JOIN LATERAL unnest(c.seqs) WITH ORDINALITY AS s(task_seq, n)
        WHERE c.kind = 1 AND c.upto - c.size + s.n <= :limit AND EXISTS (SELECT 1 FROM free)
        UNION ALL
        SELECT c.seq, c.rank, c.queue FROM chosen AS c
        WHERE c.kind = 0 AND c.upto <= :limit AND EXISTS (SELECT 1 FROM free)
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
        worker_id = :worker_id,
        lease = k.length,
        lease_expires_at = (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) + CAST(round(1000000.0 * k.length) AS bigint),
        started_at = coalesce(d.started_at, (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)),
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
    -- With ``s.grp = :grp`` on its own, the generic plan read every stream of the
    -- group instead (the primary key by ``grp`` alone) and compared each with every
    -- taken stream: 0.47 of a 1.4 ms claim of 20 tasks at 100 partitions, and
    -- growing with the partitions.
    UPDATE conveyor_streams AS s SET available_at = NULL
    FROM (
        SELECT DISTINCT queue, :grp::text AS grp, partition
        FROM taken WHERE partition IS NOT NULL
    ) AS h
    WHERE s.queue = h.queue AND s.grp = h.grp AND s.partition = h.partition
    RETURNING 1
)
SELECT flags.busy, x.rank, t.seq, t.id, t.name, t.queue, t.partition, t.payload, t.metadata, t.priority, x.max_attempts, t.created_at, t.key, t.parent_id, t.root_id, t.correlation_id, x.grp, x.status, x.attempt, x.run_at, x.started_at, x.finished_at, x.lease_expires_at, x.worker_id, x.progress, x.progress_message, x.result, x.error, x.lease
FROM flags LEFT JOIN (taken AS x JOIN conveyor_tasks AS t ON t.seq = x.task_seq) ON true

-- name: claim.one
WITH flags AS (
    SELECT set_config('synchronous_commit', 'off', true) AS quick, EXISTS (
        SELECT 1 FROM conveyor_deliveries
        WHERE status = 'running' AND grp = :grp AND queue = :queue
          AND lease_expires_at < (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
    ) AS busy
),
free AS MATERIALIZED (
    SELECT s.queue, s.partition, s.priority, s.available_at, s.head_seq
    FROM conveyor_streams AS s
    WHERE s.grp = :grp AND s.queue = :queue
      AND s.available_at IS NOT NULL AND s.available_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
      AND (:partition::text IS NULL OR s.partition = :partition::text)
      AND NOT (SELECT busy FROM flags)
    ORDER BY s.priority DESC, s.available_at, s.queue, s.partition
    LIMIT :streams
    FOR UPDATE OF s SKIP LOCKED
),
srows AS MATERIALIZED (
    SELECT f.queue, f.partition, f.priority AS pri, f.available_at AS at, r.task_seq, r.n
    FROM free AS f CROSS JOIN LATERAL (
        SELECT x.task_seq,
               row_number() OVER w AS n,
               bool_and(x.status = 'queued' AND x.run_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)) OVER w AS ok,
               min(x.task_seq) OVER () AS first
        FROM (
            SELECT y.task_seq, y.status, y.run_at
            FROM conveyor_deliveries AS y
            WHERE y.grp = :grp AND y.queue = f.queue AND y.partition = f.partition
              AND y.status IN ('queued', 'running') AND y.task_seq >= f.head_seq
            ORDER BY y.task_seq
            LIMIT :per_stream
        ) AS x
        WINDOW w AS (ORDER BY x.task_seq)
    ) AS r
    WHERE r.ok AND r.first = f.head_seq
),
plain AS MATERIALIZED (
    SELECT p.task_seq, p.queue, p.priority, p.run_at
    FROM conveyor_deliveries AS p
    WHERE p.grp = :grp AND p.queue = :queue AND p.status = 'queued' AND p.partition IS NULL
      AND p.run_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AND :partition::text IS NULL
      AND NOT (SELECT busy FROM flags)
    ORDER BY p.priority DESC, p.run_at, p.task_seq
    LIMIT :limit
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
    WHERE :mix OR CASE WHEN e.lead = 1 THEN e.rank = 1 ELSE e.kind = 0 END
),
picked AS MATERIALIZED (
    SELECT k.task_seq, k.rank, k.queue, :grp::text AS grp, 'queued'::text AS status, coalesce(
        :lease::float8,
        (SELECT c.lease FROM conveyor_queues AS c WHERE c.queue = :queue),
        30.0
    ) AS length
    FROM (
        SELECT s.task_seq, c.rank, c.queue
        FROM chosen AS c CROSS JOIN LATERAL unnest(c.seqs) WITH ORDINALITY AS s(task_seq, n)
        WHERE c.kind = 1 AND c.upto - c.size + s.n <= :limit AND EXISTS (SELECT 1 FROM free)
        UNION ALL
        SELECT c.seq, c.rank, c.queue FROM chosen AS c
        WHERE c.kind = 0 AND c.upto <= :limit AND EXISTS (SELECT 1 FROM free)
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
        worker_id = :worker_id,
        lease = k.length,
        lease_expires_at = (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) + CAST(round(1000000.0 * k.length) AS bigint),
        started_at = coalesce(d.started_at, (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)),
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
    -- With ``s.grp = :grp`` on its own, the generic plan read every stream of the
    -- group instead (the primary key by ``grp`` alone) and compared each with every
    -- taken stream: 0.47 of a 1.4 ms claim of 20 tasks at 100 partitions, and
    -- growing with the partitions.
    UPDATE conveyor_streams AS s SET available_at = NULL
    FROM (
        SELECT DISTINCT queue, :grp::text AS grp, partition
        FROM taken WHERE partition IS NOT NULL
    ) AS h
    WHERE s.queue = h.queue AND s.grp = h.grp AND s.partition = h.partition
    RETURNING 1
)
SELECT flags.busy, x.rank, t.seq, t.id, t.name, t.queue, t.partition, t.payload, t.metadata, t.priority, x.max_attempts, t.created_at, t.key, t.parent_id, t.root_id, t.correlation_id, x.grp, x.status, x.attempt, x.run_at, x.started_at, x.finished_at, x.lease_expires_at, x.worker_id, x.progress, x.progress_message, x.result, x.error, x.lease
FROM flags LEFT JOIN (taken AS x JOIN conveyor_tasks AS t ON t.seq = x.task_seq) ON true

-- name: claim.one_durable
WITH flags AS (
    SELECT NULL AS quick, EXISTS (
        SELECT 1 FROM conveyor_deliveries
        WHERE status = 'running' AND grp = :grp AND queue = :queue
          AND lease_expires_at < (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
    ) AS busy
),
free AS MATERIALIZED (
    SELECT s.queue, s.partition, s.priority, s.available_at, s.head_seq
    FROM conveyor_streams AS s
    WHERE s.grp = :grp AND s.queue = :queue
      AND s.available_at IS NOT NULL AND s.available_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
      AND (:partition::text IS NULL OR s.partition = :partition::text)
      AND NOT (SELECT busy FROM flags)
    ORDER BY s.priority DESC, s.available_at, s.queue, s.partition
    LIMIT :streams
    FOR UPDATE OF s SKIP LOCKED
),
srows AS MATERIALIZED (
    SELECT f.queue, f.partition, f.priority AS pri, f.available_at AS at, r.task_seq, r.n
    FROM free AS f CROSS JOIN LATERAL (
        SELECT x.task_seq,
               row_number() OVER w AS n,
               bool_and(x.status = 'queued' AND x.run_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)) OVER w AS ok,
               min(x.task_seq) OVER () AS first
        FROM (
            SELECT y.task_seq, y.status, y.run_at
            FROM conveyor_deliveries AS y
            WHERE y.grp = :grp AND y.queue = f.queue AND y.partition = f.partition
              AND y.status IN ('queued', 'running') AND y.task_seq >= f.head_seq
            ORDER BY y.task_seq
            LIMIT :per_stream
        ) AS x
        WINDOW w AS (ORDER BY x.task_seq)
    ) AS r
    WHERE r.ok AND r.first = f.head_seq
),
plain AS MATERIALIZED (
    SELECT p.task_seq, p.queue, p.priority, p.run_at
    FROM conveyor_deliveries AS p
    WHERE p.grp = :grp AND p.queue = :queue AND p.status = 'queued' AND p.partition IS NULL
      AND p.run_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AND :partition::text IS NULL
      AND NOT (SELECT busy FROM flags)
    ORDER BY p.priority DESC, p.run_at, p.task_seq
    LIMIT :limit
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
    WHERE :mix OR CASE WHEN e.lead = 1 THEN e.rank = 1 ELSE e.kind = 0 END
),
picked AS MATERIALIZED (
    SELECT k.task_seq, k.rank, k.queue, :grp::text AS grp, 'queued'::text AS status, coalesce(
        :lease::float8,
        (SELECT c.lease FROM conveyor_queues AS c WHERE c.queue = :queue),
        30.0
    ) AS length
    FROM (
        SELECT s.task_seq, c.rank, c.queue
        FROM chosen AS c CROSS JOIN LATERAL unnest(c.seqs) WITH ORDINALITY AS s(task_seq, n)
        WHERE c.kind = 1 AND c.upto - c.size + s.n <= :limit AND EXISTS (SELECT 1 FROM free)
        UNION ALL
        SELECT c.seq, c.rank, c.queue FROM chosen AS c
        WHERE c.kind = 0 AND c.upto <= :limit AND EXISTS (SELECT 1 FROM free)
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
        worker_id = :worker_id,
        lease = k.length,
        lease_expires_at = (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) + CAST(round(1000000.0 * k.length) AS bigint),
        started_at = coalesce(d.started_at, (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)),
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
    -- With ``s.grp = :grp`` on its own, the generic plan read every stream of the
    -- group instead (the primary key by ``grp`` alone) and compared each with every
    -- taken stream: 0.47 of a 1.4 ms claim of 20 tasks at 100 partitions, and
    -- growing with the partitions.
    UPDATE conveyor_streams AS s SET available_at = NULL
    FROM (
        SELECT DISTINCT queue, :grp::text AS grp, partition
        FROM taken WHERE partition IS NOT NULL
    ) AS h
    WHERE s.queue = h.queue AND s.grp = h.grp AND s.partition = h.partition
    RETURNING 1
)
SELECT flags.busy, x.rank, t.seq, t.id, t.name, t.queue, t.partition, t.payload, t.metadata, t.priority, x.max_attempts, t.created_at, t.key, t.parent_id, t.root_id, t.correlation_id, x.grp, x.status, x.attempt, x.run_at, x.started_at, x.finished_at, x.lease_expires_at, x.worker_id, x.progress, x.progress_message, x.result, x.error, x.lease
FROM flags LEFT JOIN (taken AS x JOIN conveyor_tasks AS t ON t.seq = x.task_seq) ON true
