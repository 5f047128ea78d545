-- The claim hook's statement (conveyor.store.postgres.claim): the whole choice
-- of conveyor.store.protocol.claim_order in one data-modifying CTE, so a claim
-- is one round trip (SQLite, which has no such CTEs, runs a few statements
-- instead). claim.one is for one queue, claim.any for a list of them; each
-- _durable variant is the same statement with a commit that waits for the WAL.
--
-- The clock, (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint
-- + offset_us), is the statement's moment in microseconds: the server's clock, so
-- that hosts need not agree on the time, moved by the store's clock_offset. The
-- offset is a bind parameter so that the text never changes and stays prepared.
--
-- The lock order (conveyor.store.protocol.streams) holds: stream rows are locked
-- before any delivery row of theirs, and every lock taken while others are held
-- is either SKIP LOCKED (never waits) or a delivery row of a stream this
-- statement holds, which by the same order nobody else can be holding.

-- name: claim.any
WITH flags AS (
    -- quick: this transaction's commit does not wait for the WAL flush (this
    -- transaction alone: submits, acks and every other write keep the server's
    -- setting). A lease need not survive a crash of the server: a claim lost with
    -- the last fraction of a second of WAL leaves its rows queued, to be claimed
    -- again (at-least-once, as when a worker dies), and any durable commit after
    -- it (an ack, a submit) flushes the WAL up to its own record, the claim's
    -- included. It saves about half of a commit's server time.
    -- busy: a lease of these queues has expired. Then nothing is leased (every CTE
    -- below is empty) and the caller recovers the expired leases step by step
    -- before it claims again, so a crashed worker's tasks are not passed over.
    SELECT set_config('synchronous_commit', 'off', true) AS quick, EXISTS (
        SELECT 1 FROM conveyor_deliveries
        WHERE status = 'running' AND grp = :grp AND queue = ANY(:queues::text[])
          AND lease_expires_at < (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
    ) AS busy,
    -- paused: those of these queues that are paused, whole or for this group
    -- (conveyor.store.protocol.pauses): none of their work is leased. One probe
    -- of a table that is usually empty.
    ARRAY(
        SELECT c.queue FROM conveyor_pauses AS c
        WHERE c.queue = ANY(:queues::text[]) AND c.grp IN (:grp::text, '')
    ) AS paused,
    -- sealed: the encrypted queues among these (NULL: none). A store without keys
    -- (keyless) then leases nothing either, and raises before any lease is taken;
    -- one with keys learns which queues it must seal what it writes for.
    (
        SELECT array_agg(e.queue) FROM conveyor_queues AS e
        WHERE e.queue = ANY(:queues::text[]) AND e.encrypt
    ) AS sealed,
    -- held: the flow-controlled queues among these (concurrency, rate, key
    -- limits or fair: conveyor.store.protocol.limits), whose work this claim
    -- leases none of: their claims take the limited path, which holds their
    -- settings rows. With :flow that path asks, for the budget it computed: then
    -- only the key-limited or fair queues among them, whose unpartitioned rows
    -- it picks by key itself. One probe of the settings rows, read above anyway.
    ARRAY(
        SELECT l.queue FROM conveyor_queues AS l
        WHERE l.queue = ANY(:queues::text[])
          AND CASE WHEN :flow::boolean THEN (l.key_concurrency IS NOT NULL OR l.key_rate_limit IS NOT NULL OR coalesce(l.fair, false))
              ELSE (l.concurrency IS NOT NULL OR l.rate_limit IS NOT NULL OR l.key_concurrency IS NOT NULL OR l.key_rate_limit IS NOT NULL OR coalesce(l.fair, false)) END
    ) AS held
),
free AS MATERIALIZED (
    -- The free streams, fairest first (priority, then the head that waited
    -- longest; queue and partition only make the order total), as many as the
    -- claim may take. Locked FOR UPDATE SKIP LOCKED: a stream that another claim
    -- is taking is passed over, never waited for, so concurrent claimers spread
    -- over the streams instead of queueing behind each other on the fairest one.
    -- Stream rows first: the lock order.
    SELECT s.queue, s.partition, s.priority, s.available_at, s.head_seq
    FROM conveyor_streams AS s
    WHERE s.grp = :grp AND s.queue = ANY(:queues::text[])
      AND s.available_at IS NOT NULL AND s.available_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
      AND (:partition::text IS NULL OR s.partition = :partition::text)
      AND NOT (SELECT busy OR (:keyless::boolean AND sealed IS NOT NULL) FROM flags)
      AND s.queue <> ALL(CAST((SELECT paused FROM flags) AS text[]))
      AND (:flow::boolean OR s.queue <> ALL(CAST((SELECT held FROM flags) AS text[])))
    ORDER BY s.priority DESC, s.available_at, s.queue, s.partition
    LIMIT :streams
    FOR UPDATE OF s SKIP LOCKED
),
srows AS MATERIALIZED (
    -- Per stream, its first per_stream active rows from the head that the locked
    -- stream row names. This statement's snapshot may predate the lock, but a
    -- locked row is read in its latest version, and every change of a stream's
    -- rows rewrites that row, so head_seq is current. A run goes on while its rows
    -- are queued and due (bool_and up to each row), and a stream is taken only if
    -- its first active row is that head: where the snapshot does not see the head
    -- as active yet (a change committed after the statement began), the stream is
    -- left for the next claim rather than lease a later row ahead of its head.
    -- Its delivery rows need no lock of their own here: every change of a
    -- partitioned row locks its stream first, and this statement holds it.
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
    -- Ready unpartitioned rows in claim order from the ready index (its partial
    -- WHERE matched by the literal status), none when a partition is asked for.
    -- SKIP LOCKED: the rows another claim is taking are passed over; waiting for
    -- them would queue every claimer behind the first, and find them leased.
    SELECT p.task_seq, p.queue, p.priority, p.run_at
    FROM conveyor_deliveries AS p
    WHERE p.grp = :grp AND p.queue = ANY(:queues::text[]) AND p.status = 'queued' AND p.partition IS NULL
      AND p.run_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AND :partition::text IS NULL
      AND NOT (SELECT busy OR (:keyless::boolean AND sealed IS NOT NULL) FROM flags)
      AND p.queue <> ALL(CAST((SELECT paused FROM flags) AS text[]))
      AND p.queue <> ALL(CAST((SELECT held FROM flags) AS text[]))
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
    -- Streams and plain rows compete in one claim order: priority, then who waited
    -- longest (a row since its run_at, a stream since its available_at), plain
    -- rows first on a tie (kind 0), the rest only to make the order total. lead:
    -- the kind of the first unit.
    SELECT u.*, row_number() OVER o AS rank, first_value(u.kind) OVER o AS lead
    FROM units AS u
    WINDOW o AS (
        ORDER BY u.pri DESC, u.at, u.kind, u.seq, u.queue, u.partition
        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
    )
),
chosen AS (
    -- Without mix (no per_stream, or a partition), a claim takes one kind of work:
    -- the first unit alone when it is a stream, else plain rows only (the streams
    -- passed over). With mix, every unit in order. upto: the tasks up to and
    -- including each unit, for the cut at limit below.
    SELECT e.*, sum(e.size) OVER (ORDER BY e.rank) AS upto
    FROM ordered AS e
    WHERE :mix OR CASE WHEN e.lead = 1 THEN e.rank = 1 ELSE e.kind = 0 END
),
picked AS MATERIALIZED (
    -- The rows to lease, each with its unit's rank and its lease length: the
    -- lease asked for, else the queue's configured one, else 30 s. Taken in order
    -- until limit tasks: a stream's run cut to what is left, a plain row whole.
    -- grp and status ride along as columns for the join in taken (see there).
    SELECT k.task_seq, k.rank, k.queue, :grp::text AS grp, 'queued'::text AS status, coalesce(
        :lease::float8,
        -- Several queues: each row's own queue's setting.
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
    -- The lease: running, one attempt more, the lease's end from this statement's
    -- clock. The rows locked here are plain rows already locked by plain, or rows
    -- of a stream this statement holds: nothing to wait for.
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
    -- Each stream taken from is held now (available_at NULL): its head is leased,
    -- which is what recomputing the stream would write, without a second
    -- statement to do it.
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
-- One row even when nothing was leased (flags drives the join, its other columns
-- NULL), so the caller always reads busy. rank: the unit's place in claim order.
SELECT flags.busy, flags.sealed, flags.held, x.rank, t.seq, t.id, t.name, t.queue, t.partition, t.payload, t.metadata, t.priority, x.max_attempts, t.created_at, t.key, t.parent_id, t.root_id, t.correlation_id, x.grp, x.status, x.attempt, x.run_at, x.started_at, x.finished_at, x.lease_expires_at, x.worker_id, x.progress, x.progress_message, x.result, x.error, x.lease
FROM flags LEFT JOIN (taken AS x JOIN conveyor_tasks AS t ON t.seq = x.task_seq) ON true

-- name: claim.any_durable
WITH flags AS (
    -- durable_claims: the commit waits for the WAL flush, as the server's setting
    -- says (the plain variant turns synchronous_commit off for its transaction).
    -- busy: a lease of these queues has expired. Then nothing is leased (every CTE
    -- below is empty) and the caller recovers the expired leases step by step
    -- before it claims again, so a crashed worker's tasks are not passed over.
    SELECT NULL AS quick, EXISTS (
        SELECT 1 FROM conveyor_deliveries
        WHERE status = 'running' AND grp = :grp AND queue = ANY(:queues::text[])
          AND lease_expires_at < (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
    ) AS busy,
    -- paused: those of these queues that are paused, whole or for this group
    -- (conveyor.store.protocol.pauses): none of their work is leased. One probe
    -- of a table that is usually empty.
    ARRAY(
        SELECT c.queue FROM conveyor_pauses AS c
        WHERE c.queue = ANY(:queues::text[]) AND c.grp IN (:grp::text, '')
    ) AS paused,
    -- sealed: the encrypted queues among these (NULL: none). A store without keys
    -- (keyless) then leases nothing either, and raises before any lease is taken;
    -- one with keys learns which queues it must seal what it writes for.
    (
        SELECT array_agg(e.queue) FROM conveyor_queues AS e
        WHERE e.queue = ANY(:queues::text[]) AND e.encrypt
    ) AS sealed,
    -- held: the flow-controlled queues among these (concurrency, rate, key
    -- limits or fair: conveyor.store.protocol.limits), whose work this claim
    -- leases none of: their claims take the limited path, which holds their
    -- settings rows. With :flow that path asks, for the budget it computed: then
    -- only the key-limited or fair queues among them, whose unpartitioned rows
    -- it picks by key itself. One probe of the settings rows, read above anyway.
    ARRAY(
        SELECT l.queue FROM conveyor_queues AS l
        WHERE l.queue = ANY(:queues::text[])
          AND CASE WHEN :flow::boolean THEN (l.key_concurrency IS NOT NULL OR l.key_rate_limit IS NOT NULL OR coalesce(l.fair, false))
              ELSE (l.concurrency IS NOT NULL OR l.rate_limit IS NOT NULL OR l.key_concurrency IS NOT NULL OR l.key_rate_limit IS NOT NULL OR coalesce(l.fair, false)) END
    ) AS held
),
free AS MATERIALIZED (
    -- The free streams, fairest first (priority, then the head that waited
    -- longest; queue and partition only make the order total), as many as the
    -- claim may take. Locked FOR UPDATE SKIP LOCKED: a stream that another claim
    -- is taking is passed over, never waited for, so concurrent claimers spread
    -- over the streams instead of queueing behind each other on the fairest one.
    -- Stream rows first: the lock order.
    SELECT s.queue, s.partition, s.priority, s.available_at, s.head_seq
    FROM conveyor_streams AS s
    WHERE s.grp = :grp AND s.queue = ANY(:queues::text[])
      AND s.available_at IS NOT NULL AND s.available_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
      AND (:partition::text IS NULL OR s.partition = :partition::text)
      AND NOT (SELECT busy OR (:keyless::boolean AND sealed IS NOT NULL) FROM flags)
      AND s.queue <> ALL(CAST((SELECT paused FROM flags) AS text[]))
      AND (:flow::boolean OR s.queue <> ALL(CAST((SELECT held FROM flags) AS text[])))
    ORDER BY s.priority DESC, s.available_at, s.queue, s.partition
    LIMIT :streams
    FOR UPDATE OF s SKIP LOCKED
),
srows AS MATERIALIZED (
    -- Per stream, its first per_stream active rows from the head that the locked
    -- stream row names. This statement's snapshot may predate the lock, but a
    -- locked row is read in its latest version, and every change of a stream's
    -- rows rewrites that row, so head_seq is current. A run goes on while its rows
    -- are queued and due (bool_and up to each row), and a stream is taken only if
    -- its first active row is that head: where the snapshot does not see the head
    -- as active yet (a change committed after the statement began), the stream is
    -- left for the next claim rather than lease a later row ahead of its head.
    -- Its delivery rows need no lock of their own here: every change of a
    -- partitioned row locks its stream first, and this statement holds it.
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
    -- Ready unpartitioned rows in claim order from the ready index (its partial
    -- WHERE matched by the literal status), none when a partition is asked for.
    -- SKIP LOCKED: the rows another claim is taking are passed over; waiting for
    -- them would queue every claimer behind the first, and find them leased.
    SELECT p.task_seq, p.queue, p.priority, p.run_at
    FROM conveyor_deliveries AS p
    WHERE p.grp = :grp AND p.queue = ANY(:queues::text[]) AND p.status = 'queued' AND p.partition IS NULL
      AND p.run_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AND :partition::text IS NULL
      AND NOT (SELECT busy OR (:keyless::boolean AND sealed IS NOT NULL) FROM flags)
      AND p.queue <> ALL(CAST((SELECT paused FROM flags) AS text[]))
      AND p.queue <> ALL(CAST((SELECT held FROM flags) AS text[]))
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
    -- Streams and plain rows compete in one claim order: priority, then who waited
    -- longest (a row since its run_at, a stream since its available_at), plain
    -- rows first on a tie (kind 0), the rest only to make the order total. lead:
    -- the kind of the first unit.
    SELECT u.*, row_number() OVER o AS rank, first_value(u.kind) OVER o AS lead
    FROM units AS u
    WINDOW o AS (
        ORDER BY u.pri DESC, u.at, u.kind, u.seq, u.queue, u.partition
        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
    )
),
chosen AS (
    -- Without mix (no per_stream, or a partition), a claim takes one kind of work:
    -- the first unit alone when it is a stream, else plain rows only (the streams
    -- passed over). With mix, every unit in order. upto: the tasks up to and
    -- including each unit, for the cut at limit below.
    SELECT e.*, sum(e.size) OVER (ORDER BY e.rank) AS upto
    FROM ordered AS e
    WHERE :mix OR CASE WHEN e.lead = 1 THEN e.rank = 1 ELSE e.kind = 0 END
),
picked AS MATERIALIZED (
    -- The rows to lease, each with its unit's rank and its lease length: the
    -- lease asked for, else the queue's configured one, else 30 s. Taken in order
    -- until limit tasks: a stream's run cut to what is left, a plain row whole.
    -- grp and status ride along as columns for the join in taken (see there).
    SELECT k.task_seq, k.rank, k.queue, :grp::text AS grp, 'queued'::text AS status, coalesce(
        :lease::float8,
        -- Several queues: each row's own queue's setting.
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
    -- The lease: running, one attempt more, the lease's end from this statement's
    -- clock. The rows locked here are plain rows already locked by plain, or rows
    -- of a stream this statement holds: nothing to wait for.
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
    -- Each stream taken from is held now (available_at NULL): its head is leased,
    -- which is what recomputing the stream would write, without a second
    -- statement to do it.
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
-- One row even when nothing was leased (flags drives the join, its other columns
-- NULL), so the caller always reads busy. rank: the unit's place in claim order.
SELECT flags.busy, flags.sealed, flags.held, x.rank, t.seq, t.id, t.name, t.queue, t.partition, t.payload, t.metadata, t.priority, x.max_attempts, t.created_at, t.key, t.parent_id, t.root_id, t.correlation_id, x.grp, x.status, x.attempt, x.run_at, x.started_at, x.finished_at, x.lease_expires_at, x.worker_id, x.progress, x.progress_message, x.result, x.error, x.lease
FROM flags LEFT JOIN (taken AS x JOIN conveyor_tasks AS t ON t.seq = x.task_seq) ON true

-- name: claim.one
WITH flags AS (
    -- quick: this transaction's commit does not wait for the WAL flush (this
    -- transaction alone: submits, acks and every other write keep the server's
    -- setting). A lease need not survive a crash of the server: a claim lost with
    -- the last fraction of a second of WAL leaves its rows queued, to be claimed
    -- again (at-least-once, as when a worker dies), and any durable commit after
    -- it (an ack, a submit) flushes the WAL up to its own record, the claim's
    -- included. It saves about half of a commit's server time.
    -- busy: a lease of these queues has expired. Then nothing is leased (every CTE
    -- below is empty) and the caller recovers the expired leases step by step
    -- before it claims again, so a crashed worker's tasks are not passed over.
    SELECT set_config('synchronous_commit', 'off', true) AS quick, EXISTS (
        SELECT 1 FROM conveyor_deliveries
        WHERE status = 'running' AND grp = :grp AND queue = :queue
          AND lease_expires_at < (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
    ) AS busy,
    -- paused: the queue, or this group of it, is paused (conveyor.store.protocol.
    -- pauses): nothing is leased. One probe of a table that is usually empty.
    EXISTS (
        SELECT 1 FROM conveyor_pauses AS c
        WHERE c.queue = :queue AND c.grp IN (:grp::text, '')
    ) AS paused,
    -- sealed: the queue if it is encrypted (NULL: not). A store without keys
    -- (keyless) then leases nothing either, and raises before any lease is taken;
    -- one with keys learns that it must seal what it writes for these tasks.
    -- length: the queue's configured lease. Both from one read of its row.
    CASE WHEN e.encrypt THEN ARRAY[e.queue] END AS sealed, e.lease AS length,
    -- held: the queue is flow-controlled (see claim.any); with :flow, key-limited
    -- or fair.
    coalesce(CASE WHEN :flow::boolean THEN (e.key_concurrency IS NOT NULL OR e.key_rate_limit IS NOT NULL OR coalesce(e.fair, false))
        ELSE (e.concurrency IS NOT NULL OR e.rate_limit IS NOT NULL OR e.key_concurrency IS NOT NULL OR e.key_rate_limit IS NOT NULL OR coalesce(e.fair, false)) END, false) AS held
    FROM (SELECT 1) AS one LEFT JOIN conveyor_queues AS e ON e.queue = :queue
),
free AS MATERIALIZED (
    -- The free streams, fairest first (priority, then the head that waited
    -- longest; queue and partition only make the order total), as many as the
    -- claim may take. Locked FOR UPDATE SKIP LOCKED: a stream that another claim
    -- is taking is passed over, never waited for, so concurrent claimers spread
    -- over the streams instead of queueing behind each other on the fairest one.
    -- Stream rows first: the lock order.
    SELECT s.queue, s.partition, s.priority, s.available_at, s.head_seq
    FROM conveyor_streams AS s
    WHERE s.grp = :grp AND s.queue = :queue
      AND s.available_at IS NOT NULL AND s.available_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
      AND (:partition::text IS NULL OR s.partition = :partition::text)
      AND NOT (SELECT busy OR paused OR (held AND NOT :flow::boolean) OR (:keyless::boolean AND sealed IS NOT NULL) FROM flags)
    ORDER BY s.priority DESC, s.available_at, s.queue, s.partition
    LIMIT :streams
    FOR UPDATE OF s SKIP LOCKED
),
srows AS MATERIALIZED (
    -- Per stream, its first per_stream active rows from the head that the locked
    -- stream row names. This statement's snapshot may predate the lock, but a
    -- locked row is read in its latest version, and every change of a stream's
    -- rows rewrites that row, so head_seq is current. A run goes on while its rows
    -- are queued and due (bool_and up to each row), and a stream is taken only if
    -- its first active row is that head: where the snapshot does not see the head
    -- as active yet (a change committed after the statement began), the stream is
    -- left for the next claim rather than lease a later row ahead of its head.
    -- Its delivery rows need no lock of their own here: every change of a
    -- partitioned row locks its stream first, and this statement holds it.
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
    -- Ready unpartitioned rows in claim order from the ready index (its partial
    -- WHERE matched by the literal status), none when a partition is asked for.
    -- SKIP LOCKED: the rows another claim is taking are passed over; waiting for
    -- them would queue every claimer behind the first, and find them leased.
    SELECT p.task_seq, p.queue, p.priority, p.run_at
    FROM conveyor_deliveries AS p
    WHERE p.grp = :grp AND p.queue = :queue AND p.status = 'queued' AND p.partition IS NULL
      AND p.run_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AND :partition::text IS NULL
      AND NOT (SELECT busy OR paused OR held OR (:keyless::boolean AND sealed IS NOT NULL) FROM flags)
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
    -- Streams and plain rows compete in one claim order: priority, then who waited
    -- longest (a row since its run_at, a stream since its available_at), plain
    -- rows first on a tie (kind 0), the rest only to make the order total. lead:
    -- the kind of the first unit.
    SELECT u.*, row_number() OVER o AS rank, first_value(u.kind) OVER o AS lead
    FROM units AS u
    WINDOW o AS (
        ORDER BY u.pri DESC, u.at, u.kind, u.seq, u.queue, u.partition
        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
    )
),
chosen AS (
    -- Without mix (no per_stream, or a partition), a claim takes one kind of work:
    -- the first unit alone when it is a stream, else plain rows only (the streams
    -- passed over). With mix, every unit in order. upto: the tasks up to and
    -- including each unit, for the cut at limit below.
    SELECT e.*, sum(e.size) OVER (ORDER BY e.rank) AS upto
    FROM ordered AS e
    WHERE :mix OR CASE WHEN e.lead = 1 THEN e.rank = 1 ELSE e.kind = 0 END
),
picked AS MATERIALIZED (
    -- The rows to lease, each with its unit's rank and its lease length: the
    -- lease asked for, else the queue's configured one, else 30 s. Taken in order
    -- until limit tasks: a stream's run cut to what is left, a plain row whole.
    -- grp and status ride along as columns for the join in taken (see there).
    SELECT k.task_seq, k.rank, k.queue, :grp::text AS grp, 'queued'::text AS status, coalesce(
        :lease::float8,
        -- One queue: its setting is looked up once per claim (an uncorrelated
        -- subquery), not once per row leased.
        (SELECT length FROM flags),
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
    -- The lease: running, one attempt more, the lease's end from this statement's
    -- clock. The rows locked here are plain rows already locked by plain, or rows
    -- of a stream this statement holds: nothing to wait for.
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
    -- Each stream taken from is held now (available_at NULL): its head is leased,
    -- which is what recomputing the stream would write, without a second
    -- statement to do it.
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
-- One row even when nothing was leased (flags drives the join, its other columns
-- NULL), so the caller always reads busy. rank: the unit's place in claim order.
SELECT flags.busy, flags.sealed, CASE WHEN flags.held THEN ARRAY[:queue::text] END AS held, x.rank, t.seq, t.id, t.name, t.queue, t.partition, t.payload, t.metadata, t.priority, x.max_attempts, t.created_at, t.key, t.parent_id, t.root_id, t.correlation_id, x.grp, x.status, x.attempt, x.run_at, x.started_at, x.finished_at, x.lease_expires_at, x.worker_id, x.progress, x.progress_message, x.result, x.error, x.lease
FROM flags LEFT JOIN (taken AS x JOIN conveyor_tasks AS t ON t.seq = x.task_seq) ON true

-- name: claim.one_durable
WITH flags AS (
    -- durable_claims: the commit waits for the WAL flush, as the server's setting
    -- says (the plain variant turns synchronous_commit off for its transaction).
    -- busy: a lease of these queues has expired. Then nothing is leased (every CTE
    -- below is empty) and the caller recovers the expired leases step by step
    -- before it claims again, so a crashed worker's tasks are not passed over.
    SELECT NULL AS quick, EXISTS (
        SELECT 1 FROM conveyor_deliveries
        WHERE status = 'running' AND grp = :grp AND queue = :queue
          AND lease_expires_at < (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
    ) AS busy,
    -- paused: the queue, or this group of it, is paused (conveyor.store.protocol.
    -- pauses): nothing is leased. One probe of a table that is usually empty.
    EXISTS (
        SELECT 1 FROM conveyor_pauses AS c
        WHERE c.queue = :queue AND c.grp IN (:grp::text, '')
    ) AS paused,
    -- sealed: the queue if it is encrypted (NULL: not). A store without keys
    -- (keyless) then leases nothing either, and raises before any lease is taken;
    -- one with keys learns that it must seal what it writes for these tasks.
    -- length: the queue's configured lease. Both from one read of its row.
    CASE WHEN e.encrypt THEN ARRAY[e.queue] END AS sealed, e.lease AS length,
    -- held: the queue is flow-controlled (see claim.any); with :flow, key-limited
    -- or fair.
    coalesce(CASE WHEN :flow::boolean THEN (e.key_concurrency IS NOT NULL OR e.key_rate_limit IS NOT NULL OR coalesce(e.fair, false))
        ELSE (e.concurrency IS NOT NULL OR e.rate_limit IS NOT NULL OR e.key_concurrency IS NOT NULL OR e.key_rate_limit IS NOT NULL OR coalesce(e.fair, false)) END, false) AS held
    FROM (SELECT 1) AS one LEFT JOIN conveyor_queues AS e ON e.queue = :queue
),
free AS MATERIALIZED (
    -- The free streams, fairest first (priority, then the head that waited
    -- longest; queue and partition only make the order total), as many as the
    -- claim may take. Locked FOR UPDATE SKIP LOCKED: a stream that another claim
    -- is taking is passed over, never waited for, so concurrent claimers spread
    -- over the streams instead of queueing behind each other on the fairest one.
    -- Stream rows first: the lock order.
    SELECT s.queue, s.partition, s.priority, s.available_at, s.head_seq
    FROM conveyor_streams AS s
    WHERE s.grp = :grp AND s.queue = :queue
      AND s.available_at IS NOT NULL AND s.available_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
      AND (:partition::text IS NULL OR s.partition = :partition::text)
      AND NOT (SELECT busy OR paused OR (held AND NOT :flow::boolean) OR (:keyless::boolean AND sealed IS NOT NULL) FROM flags)
    ORDER BY s.priority DESC, s.available_at, s.queue, s.partition
    LIMIT :streams
    FOR UPDATE OF s SKIP LOCKED
),
srows AS MATERIALIZED (
    -- Per stream, its first per_stream active rows from the head that the locked
    -- stream row names. This statement's snapshot may predate the lock, but a
    -- locked row is read in its latest version, and every change of a stream's
    -- rows rewrites that row, so head_seq is current. A run goes on while its rows
    -- are queued and due (bool_and up to each row), and a stream is taken only if
    -- its first active row is that head: where the snapshot does not see the head
    -- as active yet (a change committed after the statement began), the stream is
    -- left for the next claim rather than lease a later row ahead of its head.
    -- Its delivery rows need no lock of their own here: every change of a
    -- partitioned row locks its stream first, and this statement holds it.
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
    -- Ready unpartitioned rows in claim order from the ready index (its partial
    -- WHERE matched by the literal status), none when a partition is asked for.
    -- SKIP LOCKED: the rows another claim is taking are passed over; waiting for
    -- them would queue every claimer behind the first, and find them leased.
    SELECT p.task_seq, p.queue, p.priority, p.run_at
    FROM conveyor_deliveries AS p
    WHERE p.grp = :grp AND p.queue = :queue AND p.status = 'queued' AND p.partition IS NULL
      AND p.run_at <= (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AND :partition::text IS NULL
      AND NOT (SELECT busy OR paused OR held OR (:keyless::boolean AND sealed IS NOT NULL) FROM flags)
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
    -- Streams and plain rows compete in one claim order: priority, then who waited
    -- longest (a row since its run_at, a stream since its available_at), plain
    -- rows first on a tie (kind 0), the rest only to make the order total. lead:
    -- the kind of the first unit.
    SELECT u.*, row_number() OVER o AS rank, first_value(u.kind) OVER o AS lead
    FROM units AS u
    WINDOW o AS (
        ORDER BY u.pri DESC, u.at, u.kind, u.seq, u.queue, u.partition
        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
    )
),
chosen AS (
    -- Without mix (no per_stream, or a partition), a claim takes one kind of work:
    -- the first unit alone when it is a stream, else plain rows only (the streams
    -- passed over). With mix, every unit in order. upto: the tasks up to and
    -- including each unit, for the cut at limit below.
    SELECT e.*, sum(e.size) OVER (ORDER BY e.rank) AS upto
    FROM ordered AS e
    WHERE :mix OR CASE WHEN e.lead = 1 THEN e.rank = 1 ELSE e.kind = 0 END
),
picked AS MATERIALIZED (
    -- The rows to lease, each with its unit's rank and its lease length: the
    -- lease asked for, else the queue's configured one, else 30 s. Taken in order
    -- until limit tasks: a stream's run cut to what is left, a plain row whole.
    -- grp and status ride along as columns for the join in taken (see there).
    SELECT k.task_seq, k.rank, k.queue, :grp::text AS grp, 'queued'::text AS status, coalesce(
        :lease::float8,
        -- One queue: its setting is looked up once per claim (an uncorrelated
        -- subquery), not once per row leased.
        (SELECT length FROM flags),
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
    -- The lease: running, one attempt more, the lease's end from this statement's
    -- clock. The rows locked here are plain rows already locked by plain, or rows
    -- of a stream this statement holds: nothing to wait for.
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
    -- Each stream taken from is held now (available_at NULL): its head is leased,
    -- which is what recomputing the stream would write, without a second
    -- statement to do it.
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
-- One row even when nothing was leased (flags drives the join, its other columns
-- NULL), so the caller always reads busy. rank: the unit's place in claim order.
SELECT flags.busy, flags.sealed, CASE WHEN flags.held THEN ARRAY[:queue::text] END AS held, x.rank, t.seq, t.id, t.name, t.queue, t.partition, t.payload, t.metadata, t.priority, x.max_attempts, t.created_at, t.key, t.parent_id, t.root_id, t.correlation_id, x.grp, x.status, x.attempt, x.run_at, x.started_at, x.finished_at, x.lease_expires_at, x.worker_id, x.progress, x.progress_message, x.result, x.error, x.lease
FROM flags LEFT JOIN (taken AS x JOIN conveyor_tasks AS t ON t.seq = x.task_seq) ON true
