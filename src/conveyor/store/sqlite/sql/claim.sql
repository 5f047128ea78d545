-- The claim hook's statements (conveyor.store.sqlite.claim): SQLite has no
-- arrays (a list is bound as JSON text and read with json_each), no LATERAL (a
-- stream's run is bounded by a correlated OFFSET probe instead), no
-- data-modifying CTEs (the claim is these statements in one BEGIN IMMEDIATE
-- transaction, the single writer lock standing in for row locks), and its
-- RETURNING may name only the updated table's columns. The choice among the
-- candidates is conveyor.store.protocol.claim_order's.

-- name: claim.candidates
-- Everything a claim of :queue in group :grp chooses from, in one read (kind
-- tells the rows apart):
-- * 1: up to :streams free streams (only :partition's when it is not NULL),
--   fairest first, each with its first :per_stream active rows from the head
--   the stream row names: status and due (run_at reached at :now_us) per row,
--   in submit order. Without LATERAL, a stream's rows are bounded by its
--   per_stream-th active row, one correlated index probe.
-- * 0: up to :limit ready unpartitioned rows in claim order (none when
--   :partition is given).
-- * 2: one row if a lease of the queue has expired: the claim then leases
--   nothing, and the caller recovers the expired leases before it claims again.
-- * 3: one row if the queue is encrypted (conveyor.store.protocol.sealing).
-- * 4: one row if the queue is flow-controlled (conveyor.store.protocol.limits)
--   and :flow is not set: then no rows of kinds 0 and 1 either. With :flow (the
--   limited path asks, holding the write lock, for the budget it computed) its
--   streams are rows of kind 1, and its unpartitioned rows of kind 0 unless it is
--   key-limited or fair (the limited path picks those by key itself).
-- A paused queue, or a paused group of it (conveyor.store.protocol.pauses), has
-- no rows of kinds 0 and 1: one probe of a table that is usually empty.
-- The stream index's partial WHERE is matched by the literal statuses.
WITH free AS (
    SELECT s.queue AS queue, s."partition" AS "partition", s.priority AS priority,
           s.available_at AS available_at, s.head_seq AS head_seq
    FROM conveyor_streams AS s
    WHERE s.grp = :grp AND s.queue = :queue
      AND s.available_at IS NOT NULL AND s.available_at <= :now_us
      AND (:partition IS NULL OR s."partition" = :partition)
      AND NOT EXISTS (SELECT 1 FROM conveyor_pauses AS c
                      WHERE c.queue = :queue AND c.grp IN (:grp, ''))
      AND NOT EXISTS (SELECT 1 FROM conveyor_queues AS l
                      WHERE l.queue = :queue AND NOT :flow AND (l.concurrency IS NOT NULL OR l.rate_limit IS NOT NULL OR l.key_concurrency IS NOT NULL OR l.key_rate_limit IS NOT NULL OR coalesce(l.fair, 0)))
    ORDER BY s.priority DESC, s.available_at, s.queue, s."partition"
    LIMIT :streams
)
SELECT 1 AS kind, f.priority AS priority, f.available_at AS at, f.queue AS queue,
       f."partition" AS "partition", f.head_seq AS head_seq, y.task_seq AS task_seq,
       y.status AS status, y.run_at <= :now_us AS due
FROM free AS f JOIN conveyor_deliveries AS y ON 
    y.grp = :grp AND y.queue = f.queue AND y."partition" = f."partition"
    AND y.status IN ('queued', 'running') AND y.task_seq >= f.head_seq
    -- The run ends at the stream's per_stream-th active row, found by one probe
    -- of the stream index; a stream with fewer active rows has none, and the
    -- largest integer leaves its run unbounded.
    AND y.task_seq <= coalesce((
        SELECT z.task_seq FROM conveyor_deliveries AS z
        WHERE 
    z.grp = :grp AND z.queue = f.queue AND z."partition" = f."partition"
    AND z.status IN ('queued', 'running') AND z.task_seq >= f.head_seq
        ORDER BY z.task_seq LIMIT 1 OFFSET :per_stream - 1
    ), 9223372036854775807)
UNION ALL
SELECT 0, p.priority, p.run_at, p.queue, NULL, NULL, p.task_seq, 'queued', 1
FROM (
    -- The ready index; its partial WHERE matched by the literal status.
    SELECT r.task_seq AS task_seq, r.priority AS priority, r.run_at AS run_at,
           r.queue AS queue
    FROM conveyor_deliveries AS r
    WHERE r.grp = :grp AND r.queue = :queue AND r.status = 'queued'
      AND r."partition" IS NULL AND r.run_at <= :now_us AND :partition IS NULL
      AND NOT EXISTS (SELECT 1 FROM conveyor_pauses AS c
                      WHERE c.queue = :queue AND c.grp IN (:grp, ''))
      AND NOT EXISTS (SELECT 1 FROM conveyor_queues AS l WHERE l.queue = :queue
                      AND CASE WHEN :flow THEN (l.key_concurrency IS NOT NULL OR l.key_rate_limit IS NOT NULL OR coalesce(l.fair, 0)) ELSE (l.concurrency IS NOT NULL OR l.rate_limit IS NOT NULL OR l.key_concurrency IS NOT NULL OR l.key_rate_limit IS NOT NULL OR coalesce(l.fair, 0)) END)
    ORDER BY r.priority DESC, r.run_at, r.task_seq
    LIMIT :limit
) AS p
UNION ALL
SELECT 2, NULL, NULL, NULL, NULL, NULL, e.task_seq, NULL, NULL
FROM (
    -- The leased index; its partial WHERE matched by the literal status.
    SELECT x.task_seq AS task_seq FROM conveyor_deliveries AS x
    WHERE x.grp = :grp AND x.queue = :queue AND x.status = 'running'
      AND x.lease_expires_at < :now_us
    LIMIT 1
) AS e
UNION ALL
-- 3: one row if :queue is encrypted: a store without keys then raises before it
-- leases anything; one with keys learns it must seal what it writes for its tasks.
SELECT 3, NULL, NULL, q.queue, NULL, NULL, NULL, NULL, NULL
FROM conveyor_queues AS q WHERE q.queue = :queue AND q.encrypt
UNION ALL
SELECT 4, NULL, NULL, l.queue, NULL, NULL, NULL, NULL, NULL
FROM conveyor_queues AS l WHERE l.queue = :queue AND NOT :flow AND (l.concurrency IS NOT NULL OR l.rate_limit IS NOT NULL OR l.key_concurrency IS NOT NULL OR l.key_rate_limit IS NOT NULL OR coalesce(l.fair, 0))
-- The kinds apart, each in claim order, a stream's rows together in submit
-- order: the choice in Python takes each stream's first row for its head (a
-- stream whose row names another head is left alone) and ends its run at the
-- first row that is not queued and due.
ORDER BY 1, 2 DESC, 3, 4, 5, 7

-- name: claim.hold
-- The streams :partitions (a JSON array) of :queue in :grp are held now: the
-- claim just leased their heads. This is what recomputing them would write
-- (same head, same priority, no longer available).
UPDATE conveyor_streams SET available_at = NULL
WHERE grp = :grp AND queue = :queue
  AND "partition" IN (SELECT j.value FROM json_each(:partitions) AS j)

-- name: claim.lease
-- Lease the rows :seqs (a JSON array of task_seq) of :queue in :grp to :w_id for
-- :lease seconds (NULL: the queue's setting, else the default). No RETURNING:
-- its correlated lookups of the task columns cost twice the update; claim.view
-- reads the rows back with one join. The queue is redundant for the result but
-- not for the plan: without it SQLite (no statistics) serves grp and status from
-- the status index by grp alone, every row the group ever had. The clock,
-- now_us, is the process's, read (with the store's clock_offset) each time the
-- statement runs: SQLite has no server clock to defer to, and one host needs none.
UPDATE conveyor_deliveries SET status='running', attempt=(conveyor_deliveries.attempt + 1), lease_expires_at=(:now_us + CAST(round(1000000.0 * coalesce(:lease, coalesce((SELECT conveyor_queues.lease 
FROM conveyor_queues 
WHERE conveyor_queues.queue = conveyor_deliveries.queue), 30.0))) AS BIGINT)), lease=coalesce(:lease, coalesce((SELECT conveyor_queues.lease 
FROM conveyor_queues 
WHERE conveyor_queues.queue = conveyor_deliveries.queue), 30.0)), worker_id=:w_id, started_at=coalesce(conveyor_deliveries.started_at, :now_us), progress=NULL, progress_message=NULL WHERE conveyor_deliveries.grp = :grp AND conveyor_deliveries.queue IN (:queue) AND conveyor_deliveries.task_seq IN (SELECT anon_1.value 
FROM json_each(:seqs) AS anon_1) AND conveyor_deliveries.status = 'queued'

-- name: claim.view
-- The task view of the rows :seqs (a JSON array of task_seq) of :grp leased to
-- :w_id: what a claim returns. CROSS JOIN keeps SQLite's join order: from the
-- list, one primary-key probe of each table.
SELECT t."seq", t."id", t."name", t."queue", t."partition", t."payload", t."metadata", t."priority", d."max_attempts", t."created_at", t."key", t."parent_id", t."root_id", t."correlation_id", d."grp", d."status", d."attempt", d."run_at", d."started_at", d."finished_at", d."lease_expires_at", d."worker_id", d."progress", d."progress_message", d."result", d."error", d."lease"
FROM json_each(:seqs) AS j
CROSS JOIN conveyor_tasks AS t ON t.seq = j.value
CROSS JOIN conveyor_deliveries AS d ON d.task_seq = t.seq AND d.grp = :grp
WHERE d.status = 'running' AND d.worker_id = :w_id
