-- Flow control (conveyor.store.protocol.limits): the statements of a claim of a
-- flow-controlled queue, in one BEGIN IMMEDIATE transaction: the write lock it
-- holds is the lock of the queues' settings rows. Partial indexes are used only
-- where a query names their WHERE term by term, hence the literal statuses.
-- The clock, :now_us, is the process's (with the store's clock_offset).

-- name: limits_lock
SELECT s.queue AS queue, s.concurrency AS concurrency, s.key_concurrency AS key_concurrency,
       s.rate_limit AS rate_limit, s.rate_per AS rate_per, s.key_rate_limit AS key_rate_limit,
       s.key_rate_per AS key_rate_per, coalesce(s.fair, 0) AS fair,
       coalesce(s.encrypt, 0) AS encrypt
FROM conveyor_queues AS s
WHERE s.queue IN (SELECT value FROM json_each(:queues))
  AND (s.concurrency IS NOT NULL OR s.rate_limit IS NOT NULL
       OR s.key_concurrency IS NOT NULL OR s.key_rate_limit IS NOT NULL OR s.fair)
ORDER BY s.queue

-- name: limits_running
SELECT :now_us AS now,
    (SELECT count(*) FROM conveyor_deliveries AS d
     WHERE d.grp = :grp AND d.queue = :queue AND d.status = 'running'
       AND d.lease_expires_at >= :now_us) AS running,
    EXISTS (SELECT 1 FROM conveyor_deliveries AS d
            WHERE d.grp = :grp AND d.queue = :queue AND d.status = 'running'
              AND d.lease_expires_at < :now_us) AS expired,
    EXISTS (SELECT 1 FROM conveyor_pauses AS p
            WHERE p.queue = :queue AND p.grp IN (:grp, '')) AS paused,
    (SELECT r.tat FROM conveyor_rate_state AS r
     WHERE r.queue = :queue AND r.grp = :grp AND r.scope = 0 AND r."key" = '') AS tat

-- name: limits_keys
-- A loose scan of the ready-by-key index: one probe per key.
WITH RECURSIVE k("key") AS (
    SELECT (SELECT d.concurrency_key FROM conveyor_deliveries AS d
            WHERE d.grp = :grp AND d.queue = :queue AND d.status = 'queued'
              AND d."partition" IS NULL AND d.concurrency_key IS NOT NULL
            ORDER BY d.concurrency_key LIMIT 1)
    UNION ALL
    SELECT (SELECT d.concurrency_key FROM conveyor_deliveries AS d
            WHERE d.grp = :grp AND d.queue = :queue AND d.status = 'queued'
              AND d."partition" IS NULL AND d.concurrency_key > k."key"
            ORDER BY d.concurrency_key LIMIT 1)
    FROM k WHERE k."key" IS NOT NULL
)
SELECT k."key" AS "key",
    (SELECT count(*) FROM conveyor_deliveries AS r
     WHERE r.grp = :grp AND r.queue = :queue AND r.status = 'running'
       AND r.concurrency_key IS NOT NULL AND r.concurrency_key = k."key"
       AND r.lease_expires_at >= :now_us) AS running,
    (SELECT s.tat FROM conveyor_rate_state AS s
     WHERE s.queue = :queue AND s.grp = :grp AND s.scope = 1 AND s."key" = k."key") AS tat,
    (SELECT s.tat FROM conveyor_rate_state AS s
     WHERE s.queue = :queue AND s.grp = :grp AND s.scope = 2 AND s."key" = k."key") AS served
FROM k WHERE k."key" IS NOT NULL
UNION ALL
SELECT NULL, 0, NULL,
    (SELECT s.tat FROM conveyor_rate_state AS s
     WHERE s.queue = :queue AND s.grp = :grp AND s.scope = 2 AND s."key" = '')
WHERE EXISTS (SELECT 1 FROM conveyor_deliveries AS d
              WHERE d.grp = :grp AND d.queue = :queue AND d.status = 'queued'
                AND d."partition" IS NULL AND d.concurrency_key IS NULL)

-- name: limits_pick
-- No LATERAL: each key's first rows by a correlated subquery on the
-- ready-by-key index, stopped at :per_key.
SELECT d.concurrency_key AS "key", d.task_seq AS task_seq, d.priority AS priority,
       d.run_at AS run_at
FROM json_each(:keys) AS w CROSS JOIN conveyor_deliveries AS d
    ON d.grp = :grp AND d.task_seq IN (
        SELECT z.task_seq FROM conveyor_deliveries AS z
        WHERE z.grp = :grp AND z.queue = :queue AND z.status = 'queued'
          AND z."partition" IS NULL AND z.concurrency_key = w.value AND z.run_at <= :now_us
        ORDER BY z.priority DESC, z.run_at, z.task_seq
        LIMIT :per_key)
UNION ALL
SELECT NULL, y.task_seq, y.priority, y.run_at FROM (
    SELECT d.task_seq AS task_seq, d.priority AS priority, d.run_at AS run_at
    FROM conveyor_deliveries AS d
    WHERE :unkeyed AND d.grp = :grp AND d.queue = :queue AND d.status = 'queued'
      AND d."partition" IS NULL AND d.concurrency_key IS NULL AND d.run_at <= :now_us
    ORDER BY d.priority DESC, d.run_at, d.task_seq
    LIMIT :per_key
) AS y

-- name: limits_lease
-- RETURNING may name only the updated table's columns: the lease, then the view
-- read back (as claim.lease and claim.view do).
UPDATE conveyor_deliveries SET status = 'running', attempt = attempt + 1,
    lease = coalesce(:lease, (SELECT c.lease FROM conveyor_queues AS c WHERE c.queue = :queue), 30.0),
    lease_expires_at = :now_us + CAST(round(1000000.0 * coalesce(:lease,
        (SELECT c.lease FROM conveyor_queues AS c WHERE c.queue = :queue), 30.0)) AS INTEGER),
    worker_id = :worker_id, started_at = coalesce(started_at, :now_us),
    progress = NULL, progress_message = NULL
WHERE grp = :grp AND queue = :queue AND status = 'queued'
  AND task_seq IN (SELECT value FROM json_each(:seqs));
SELECT t."seq", t."id", t."name", t."queue", t."partition", t."payload", t."metadata", t."priority", d."max_attempts", t."created_at", t."key", t."parent_id", t."root_id", t."correlation_id", d."grp", d."status", d."attempt", d."run_at", d."started_at", d."finished_at", d."lease_expires_at", d."worker_id", d."progress", d."progress_message", d."result", d."error", d."lease"
FROM json_each(:seqs) AS j
CROSS JOIN conveyor_tasks AS t ON t.seq = j.value
CROSS JOIN conveyor_deliveries AS d ON d.task_seq = t.seq AND d.grp = :grp
WHERE d.status = 'running' AND d.worker_id = :worker_id AND d.started_at IS NOT NULL
  AND d.lease_expires_at >= :now_us

-- name: limits_spend
INSERT INTO conveyor_rate_state (queue, grp, scope, "key", tat)
SELECT :queue, :grp, json_extract(e.value, '$[0]'), json_extract(e.value, '$[1]'),
       json_extract(e.value, '$[2]')
FROM json_each(:spends) AS e WHERE true
ON CONFLICT (queue, grp, scope, "key") DO UPDATE SET tat = excluded.tat

-- name: limits_prune
DELETE FROM conveyor_rate_state WHERE tat < :now_us - :keep_us
