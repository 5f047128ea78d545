-- Flow control (conveyor.store.protocol.limits): the statements of a claim of a
-- flow-controlled queue, run in one READ COMMITTED transaction after the queue's
-- settings row is locked (limits_lock), each a statement of its own, so each
-- sees every claim committed before the lock was granted.
--
-- The clock, (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint
-- + :offset_us), is the server's (hosts need not agree on the time), as the
-- claim statements read it.

-- name: limits_lock
-- FOR UPDATE, in queue order (the lock order's first item, with depth_lock's
-- rows: settings rows in queue order): the flow-controlled claims of a queue run
-- one after another, each after the last one's commit.
SELECT s.queue, s.concurrency, s.key_concurrency, s.rate_limit, s.rate_per,
       s.key_rate_limit, s.key_rate_per, coalesce(s.fair, false) AS fair,
       coalesce(s.encrypt, false) AS encrypt
FROM conveyor_queues AS s
WHERE s.queue = ANY(ARRAY(SELECT json_array_elements_text(:queues::json)))
  AND (s.concurrency IS NOT NULL OR s.rate_limit IS NOT NULL
       OR s.key_concurrency IS NOT NULL OR s.key_rate_limit IS NOT NULL OR s.fair)
ORDER BY s.queue
FOR UPDATE OF s

-- name: limits_running
-- The leased index (its partial WHERE matched by the literal status): running
-- rows only, what workers hold.
SELECT c.now,
    (SELECT count(*) FROM conveyor_deliveries AS d
     WHERE d.grp = :grp AND d.queue = :queue AND d.status = 'running'
       AND d.lease_expires_at >= c.now) AS running,
    EXISTS (SELECT 1 FROM conveyor_deliveries AS d
            WHERE d.grp = :grp AND d.queue = :queue AND d.status = 'running'
              AND d.lease_expires_at < c.now) AS expired,
    EXISTS (SELECT 1 FROM conveyor_pauses AS p
            WHERE p.queue = :queue AND p.grp IN (:grp::text, '')) AS paused,
    (SELECT r.tat FROM conveyor_rate_state AS r
     WHERE r.queue = :queue AND r.grp = :grp AND r.scope = 0 AND r.key = '') AS tat
FROM (SELECT floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us AS now) AS c

-- name: limits_keys
-- The keys with queued unpartitioned rows, by a loose scan of the ready-by-key
-- index (one probe per key, however many rows each has), with each key's
-- running rows (the running-by-key index), rate state and last turn; and one
-- row for the unkeyed rows (key NULL) when there are any.
WITH RECURSIVE k AS (
    SELECT (SELECT d.concurrency_key FROM conveyor_deliveries AS d
            WHERE d.grp = :grp AND d.queue = :queue AND d.status = 'queued'
              AND d.partition IS NULL AND d.concurrency_key IS NOT NULL
            ORDER BY d.concurrency_key LIMIT 1) AS key
    UNION ALL
    SELECT (SELECT d.concurrency_key FROM conveyor_deliveries AS d
            WHERE d.grp = :grp AND d.queue = :queue AND d.status = 'queued'
              AND d.partition IS NULL AND d.concurrency_key > k.key
            ORDER BY d.concurrency_key LIMIT 1)
    FROM k WHERE k.key IS NOT NULL
),
c AS (
    SELECT floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us AS now
)
SELECT k.key,
    (SELECT count(*) FROM conveyor_deliveries AS r
     WHERE r.grp = :grp AND r.queue = :queue AND r.status = 'running'
       AND r.concurrency_key = k.key AND r.lease_expires_at >= (SELECT now FROM c)) AS running,
    (SELECT s.tat FROM conveyor_rate_state AS s
     WHERE s.queue = :queue AND s.grp = :grp AND s.scope = 1 AND s.key = k.key) AS tat,
    (SELECT s.tat FROM conveyor_rate_state AS s
     WHERE s.queue = :queue AND s.grp = :grp AND s.scope = 2 AND s.key = k.key) AS served
FROM k WHERE k.key IS NOT NULL
UNION ALL
SELECT NULL, 0, NULL,
    (SELECT s.tat FROM conveyor_rate_state AS s
     WHERE s.queue = :queue AND s.grp = :grp AND s.scope = 2 AND s.key = '')
WHERE EXISTS (SELECT 1 FROM conveyor_deliveries AS d
              WHERE d.grp = :grp AND d.queue = :queue AND d.status = 'queued'
                AND d.partition IS NULL AND d.concurrency_key IS NULL)

-- name: limits_pick
-- Per key of :keys, its first :per_key ready rows in claim order, each read from
-- the ready-by-key index and stopped there; the unkeyed ones too when :unkeyed.
SELECT w.key, x.task_seq, x.priority, x.run_at
FROM json_array_elements_text(:keys::json) AS w(key) CROSS JOIN LATERAL (
    SELECT d.task_seq, d.priority, d.run_at FROM conveyor_deliveries AS d
    WHERE d.grp = :grp AND d.queue = :queue AND d.status = 'queued' AND d.partition IS NULL
      AND d.concurrency_key = w.key
      AND d.run_at <= floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us
    ORDER BY d.priority DESC, d.run_at, d.task_seq
    LIMIT :per_key
) AS x
UNION ALL
SELECT NULL, y.task_seq, y.priority, y.run_at FROM (
    SELECT d.task_seq, d.priority, d.run_at FROM conveyor_deliveries AS d
    WHERE :unkeyed::boolean AND d.grp = :grp AND d.queue = :queue AND d.status = 'queued'
      AND d.partition IS NULL AND d.concurrency_key IS NULL
      AND d.run_at <= floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us
    ORDER BY d.priority DESC, d.run_at, d.task_seq
    LIMIT :per_key
) AS y

-- name: limits_lease
-- The rows :seqs leased as a claim leases (running, attempt + 1, the lease :lease
-- seconds, else the queue's setting, else 30 s), those still queued; the task
-- view of each. A row another transaction holds is waited for and re-checked.
WITH k AS (
    SELECT coalesce(:lease::float8,
        (SELECT c.lease FROM conveyor_queues AS c WHERE c.queue = :queue), 30.0) AS length,
        floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us AS now
),
taken AS (
    UPDATE conveyor_deliveries AS d SET
        status = 'running',
        attempt = d.attempt + 1,
        worker_id = :worker_id,
        lease = k.length,
        lease_expires_at = k.now + CAST(round(1000000.0 * k.length) AS bigint),
        started_at = coalesce(d.started_at, k.now),
        progress = NULL,
        progress_message = NULL
    FROM k
    WHERE d.task_seq = ANY(ARRAY(SELECT json_array_elements_text(:seqs::json)::bigint))
      AND d.grp = :grp AND d.queue = :queue AND d.status = 'queued'
    RETURNING d.*
)
SELECT t.seq, t.id, t.name, t.queue, t.partition, t.payload, t.metadata, t.priority, x.max_attempts, t.created_at, t.key, t.parent_id, t.root_id, t.correlation_id, x.grp, x.status, x.attempt, x.run_at, x.started_at, x.finished_at, x.lease_expires_at, x.worker_id, x.progress, x.progress_message, x.result, x.error, x.lease
FROM taken AS x JOIN conveyor_tasks AS t ON t.seq = x.task_seq

-- name: limits_spend
INSERT INTO conveyor_rate_state (queue, grp, scope, key, tat)
SELECT :queue, :grp, (e.v ->> 0)::smallint, e.v ->> 1, (e.v ->> 2)::bigint
FROM json_array_elements(:spends::json) AS e(v)
ON CONFLICT (queue, grp, scope, key) DO UPDATE SET tat = excluded.tat

-- name: limits_prune
DELETE FROM conveyor_rate_state
WHERE tat < floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us - :keep_us
