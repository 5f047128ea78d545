-- A task's run_at is its own (run_at, or now + delay), else now + the queue's
-- delay, and never before now + the queue's debounce (greatest ignores NULL).
--
-- A queue with a max_depth (conveyor.store.protocol.depth): every submit below
-- refuses it, and the protocol submits to it step by step instead, counting the
-- queue's depth under a lock. The store's own statements raise (conveyor_capped,
-- SQLSTATE CVQ01: the transaction rolls back, keys and all); the four a caller's
-- transaction runs without a savepoint (submit_one_in, submit_plain_in,
-- submit_child_in, submit_children_in) write nothing instead, as an error would
-- abort the caller's transaction.

-- name: insert_rows
-- Each row may be sealed (its key_id given) or plain (NULL). A plain row of an
-- encrypted queue writes nothing at all and returns one row, refused: the queue's
-- settings changed since submit_context read them, and the protocol rolls back and
-- submits again (conveyor.store.protocol.sealing).
WITH r AS (
    SELECT e.v ->> 0 AS id, e.v ->> 1 AS name, e.v ->> 2 AS queue, e.v ->> 3 AS partition,
        e.v ->> 4 AS payload, e.v ->> 5 AS metadata, (e.v ->> 6)::int AS priority,
        (e.v ->> 7)::int AS max_attempts, e.v ->> 8 AS backoff,
        (e.v ->> 9)::bigint AS created_at, (e.v ->> 10)::bigint AS run_at, e.v ->> 11 AS key,
        e.v ->> 12 AS parent_id, e.v ->> 13 AS root_id, e.v ->> 14 AS correlation_id,
        e.v ->> 15 AS key_id, e.v ->> 16 AS concurrency_key, e.n
    FROM json_array_elements(:rows::json) WITH ORDINALITY AS e(v, n)
),
refused AS (
    SELECT 1 FROM r JOIN conveyor_queues AS e ON e.queue = r.queue
    WHERE e.encrypt AND r.key_id IS NULL
    LIMIT 1
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id,
        key_id, concurrency_key)
    SELECT id, name, queue, partition, payload, metadata, priority, max_attempts, backoff,
        created_at, run_at, key, parent_id, root_id, correlation_id, key_id, concurrency_key
    FROM r WHERE NOT EXISTS (SELECT 1 FROM refused) ORDER BY n
    RETURNING seq, queue, partition, priority, max_attempts, created_at, run_at,
        concurrency_key
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at, concurrency_key)
    SELECT i.seq, '', i.queue, i.partition, i.priority, i.max_attempts,
        'queued', 0, i.run_at, i.concurrency_key
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, i.partition, i.priority, i.max_attempts, 'queued', 0,
        i.run_at, i.concurrency_key
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
    RETURNING queue, grp, partition
)
SELECT DISTINCT queue, grp, partition, false AS refused FROM fan WHERE partition IS NOT NULL
UNION ALL
SELECT NULL, NULL, NULL, true FROM refused

-- name: parent_roots
SELECT t.id, t.root_id FROM conveyor_tasks AS t
WHERE t.id IN (SELECT json_array_elements_text(:ids::json))

-- name: submit_child
WITH req AS (
    SELECT :id::text AS id, :name::text AS name, :queue::text AS queue,
        :payload::text AS payload, :metadata::text AS metadata,
        :priority::int AS priority, :max_attempts::int AS max_attempts,
        :backoff::text AS backoff, :delay::bigint AS delay_us,
        :run_at::bigint AS run_at_us, :correlation_id::text AS correlation_id,
        :parent_id::text AS parent_id, 1 AS n
),
orphans AS (
    SELECT r.parent_id FROM req AS r WHERE r.parent_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS p WHERE p.id = r.parent_id)
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), NULL, r.parent_id, coalesce(p.root_id, r.id),
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    LEFT JOIN conveyor_tasks AS p ON p.id = r.parent_id
    WHERE NOT EXISTS (SELECT 1 FROM orphans)
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at, root_id
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT pg_try_advisory_xact_lock(1668247160) AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at, ins.root_id,
    NULL::text AS orphan
FROM note, ins
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, o.parent_id FROM orphans AS o

-- name: submit_child_in
WITH req AS (
    SELECT :id::text AS id, :name::text AS name, :queue::text AS queue,
        :payload::text AS payload, :metadata::text AS metadata,
        :priority::int AS priority, :max_attempts::int AS max_attempts,
        :backoff::text AS backoff, :delay::bigint AS delay_us,
        :run_at::bigint AS run_at_us, :correlation_id::text AS correlation_id,
        :parent_id::text AS parent_id, 1 AS n
),
orphans AS (
    SELECT r.parent_id FROM req AS r WHERE r.parent_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS p WHERE p.id = r.parent_id)
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3),
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), NULL, r.parent_id, coalesce(p.root_id, r.id),
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    LEFT JOIN conveyor_tasks AS p ON p.id = r.parent_id
    WHERE NOT EXISTS (SELECT 1 FROM orphans)
      AND NOT EXISTS (SELECT 1 FROM req AS x JOIN conveyor_queues AS y ON y.queue = x.queue WHERE y.max_depth IS NOT NULL)
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at, root_id
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT false AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at, ins.root_id,
    NULL::text AS orphan
FROM note, ins
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, o.parent_id FROM orphans AS o

-- name: submit_children
WITH req AS (
    SELECT * FROM unnest(
        :ids::text[], :names::text[], :queues::text[], :payloads::text[],
        :metadatas::text[], :priorities::int[], :max_attempts::int[],
        :backoffs::text[], :delays::bigint[], :run_ats::bigint[],
        :correlation_ids::text[], :parent_ids::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, parent_id, n)
),
orphans AS (
    SELECT r.parent_id FROM req AS r WHERE r.parent_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS p WHERE p.id = r.parent_id)
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), NULL, r.parent_id, coalesce(p.root_id, r.id),
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    LEFT JOIN conveyor_tasks AS p ON p.id = r.parent_id
    WHERE NOT EXISTS (SELECT 1 FROM orphans)
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at, root_id
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT pg_try_advisory_xact_lock(1668247160) AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at, ins.root_id,
    NULL::text AS orphan
FROM note, ins
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, o.parent_id FROM orphans AS o

-- name: submit_children_in
WITH req AS (
    SELECT * FROM unnest(
        :ids::text[], :names::text[], :queues::text[], :payloads::text[],
        :metadatas::text[], :priorities::int[], :max_attempts::int[],
        :backoffs::text[], :delays::bigint[], :run_ats::bigint[],
        :correlation_ids::text[], :parent_ids::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, parent_id, n)
),
orphans AS (
    SELECT r.parent_id FROM req AS r WHERE r.parent_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS p WHERE p.id = r.parent_id)
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3),
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), NULL, r.parent_id, coalesce(p.root_id, r.id),
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    LEFT JOIN conveyor_tasks AS p ON p.id = r.parent_id
    WHERE NOT EXISTS (SELECT 1 FROM orphans)
      AND NOT EXISTS (SELECT 1 FROM req AS x JOIN conveyor_queues AS y ON y.queue = x.queue WHERE y.max_depth IS NOT NULL)
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at, root_id
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT false AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at, ins.root_id,
    NULL::text AS orphan
FROM note, ins
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, o.parent_id FROM orphans AS o

-- name: submit_context
SELECT c.now, s.queue, s.max_attempts, s.backoff, s.delay, s.debounce, s.encrypt
FROM (SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now) AS c
LEFT JOIN conveyor_queues AS s ON s.queue = ANY(:queues::text[])

-- name: submit_key_owned
WITH req AS (
    SELECT :id::text AS id, :name::text AS name, :queue::text AS queue,
        :payload::text AS payload, :metadata::text AS metadata,
        :priority::int AS priority, :max_attempts::int AS max_attempts,
        :backoff::text AS backoff, :delay::bigint AS delay_us,
        :run_at::bigint AS run_at_us, :correlation_id::text AS correlation_id,
        :key::text AS key, 1 AS n
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), r.key, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    WHERE r.key IS NULL OR EXISTS (
        SELECT 1 FROM conveyor_keys AS k WHERE k.key = r.key AND k.task_id = r.id
    )
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT pg_try_advisory_xact_lock(1668247160) AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins

-- name: submit_key_owned_in
WITH req AS (
    SELECT :id::text AS id, :name::text AS name, :queue::text AS queue,
        :payload::text AS payload, :metadata::text AS metadata,
        :priority::int AS priority, :max_attempts::int AS max_attempts,
        :backoff::text AS backoff, :delay::bigint AS delay_us,
        :run_at::bigint AS run_at_us, :correlation_id::text AS correlation_id,
        :key::text AS key, 1 AS n
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), r.key, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    WHERE r.key IS NULL OR EXISTS (
        SELECT 1 FROM conveyor_keys AS k WHERE k.key = r.key AND k.task_id = r.id
    )
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT false AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins

-- name: submit_keyed
WITH req AS (
    SELECT :id::text AS id, :name::text AS name, :queue::text AS queue,
        :payload::text AS payload, :metadata::text AS metadata,
        :priority::int AS priority, :max_attempts::int AS max_attempts,
        :backoff::text AS backoff, :delay::bigint AS delay_us,
        :run_at::bigint AS run_at_us, :correlation_id::text AS correlation_id,
        :key::text AS key, 1 AS n
),
k AS (
    INSERT INTO conveyor_keys (key, task_id) SELECT r.key, r.id FROM req AS r
    ON CONFLICT (key) DO NOTHING RETURNING key
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), r.key, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    WHERE EXISTS (SELECT 1 FROM k)
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT pg_try_advisory_xact_lock(1668247160) AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins

-- name: submit_keyed_child
WITH req AS (
    SELECT :id::text AS id, :name::text AS name, :queue::text AS queue,
        :payload::text AS payload, :metadata::text AS metadata,
        :priority::int AS priority, :max_attempts::int AS max_attempts,
        :backoff::text AS backoff, :delay::bigint AS delay_us,
        :run_at::bigint AS run_at_us, :correlation_id::text AS correlation_id,
        :parent_id::text AS parent_id, :key::text AS key, 1 AS n
),
orphans AS (
    SELECT r.parent_id FROM req AS r WHERE r.parent_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS p WHERE p.id = r.parent_id)
),
k AS (
    INSERT INTO conveyor_keys (key, task_id)
    SELECT r.key, r.id FROM req AS r WHERE NOT EXISTS (SELECT 1 FROM orphans)
    ON CONFLICT (key) DO NOTHING RETURNING key
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), r.key, r.parent_id, coalesce(p.root_id, r.id),
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    LEFT JOIN conveyor_tasks AS p ON p.id = r.parent_id
    WHERE NOT EXISTS (SELECT 1 FROM orphans) AND EXISTS (SELECT 1 FROM k)
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at, root_id
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT pg_try_advisory_xact_lock(1668247160) AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at, ins.root_id,
    NULL::text AS orphan
FROM note, ins
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, o.parent_id FROM orphans AS o

-- name: submit_keyed_child_in
WITH req AS (
    SELECT :id::text AS id, :name::text AS name, :queue::text AS queue,
        :payload::text AS payload, :metadata::text AS metadata,
        :priority::int AS priority, :max_attempts::int AS max_attempts,
        :backoff::text AS backoff, :delay::bigint AS delay_us,
        :run_at::bigint AS run_at_us, :correlation_id::text AS correlation_id,
        :parent_id::text AS parent_id, :key::text AS key, 1 AS n
),
orphans AS (
    SELECT r.parent_id FROM req AS r WHERE r.parent_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS p WHERE p.id = r.parent_id)
),
k AS (
    INSERT INTO conveyor_keys (key, task_id)
    SELECT r.key, r.id FROM req AS r WHERE NOT EXISTS (SELECT 1 FROM orphans)
    ON CONFLICT (key) DO NOTHING RETURNING key
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), r.key, r.parent_id, coalesce(p.root_id, r.id),
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    LEFT JOIN conveyor_tasks AS p ON p.id = r.parent_id
    WHERE NOT EXISTS (SELECT 1 FROM orphans) AND EXISTS (SELECT 1 FROM k)
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at, root_id
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT false AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at, ins.root_id,
    NULL::text AS orphan
FROM note, ins
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, o.parent_id FROM orphans AS o

-- name: submit_keyed_in
WITH req AS (
    SELECT :id::text AS id, :name::text AS name, :queue::text AS queue,
        :payload::text AS payload, :metadata::text AS metadata,
        :priority::int AS priority, :max_attempts::int AS max_attempts,
        :backoff::text AS backoff, :delay::bigint AS delay_us,
        :run_at::bigint AS run_at_us, :correlation_id::text AS correlation_id,
        :key::text AS key, 1 AS n
),
k AS (
    INSERT INTO conveyor_keys (key, task_id) SELECT r.key, r.id FROM req AS r
    ON CONFLICT (key) DO NOTHING RETURNING key
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), r.key, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    WHERE EXISTS (SELECT 1 FROM k)
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT false AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins

-- name: submit_keyed_many
WITH req AS (
    SELECT * FROM unnest(
        :ids::text[], :names::text[], :queues::text[], :payloads::text[],
        :metadatas::text[], :priorities::int[], :max_attempts::int[],
        :backoffs::text[], :delays::bigint[], :run_ats::bigint[],
        :correlation_ids::text[], :keys::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, key, n)
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), r.key, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    WHERE r.key IS NULL OR EXISTS (
        SELECT 1 FROM conveyor_keys AS k WHERE k.key = r.key AND k.task_id = r.id
    )
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT pg_try_advisory_xact_lock(1668247160) AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins

-- name: submit_keyed_many_in
WITH req AS (
    SELECT * FROM unnest(
        :ids::text[], :names::text[], :queues::text[], :payloads::text[],
        :metadatas::text[], :priorities::int[], :max_attempts::int[],
        :backoffs::text[], :delays::bigint[], :run_ats::bigint[],
        :correlation_ids::text[], :keys::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, key, n)
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), r.key, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    WHERE r.key IS NULL OR EXISTS (
        SELECT 1 FROM conveyor_keys AS k WHERE k.key = r.key AND k.task_id = r.id
    )
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT false AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins

-- name: submit_keyed_partitioned
WITH req AS (
    SELECT * FROM unnest(
        :ids::text[], :names::text[], :queues::text[], :payloads::text[],
        :metadatas::text[], :priorities::int[], :max_attempts::int[],
        :backoffs::text[], :delays::bigint[], :run_ats::bigint[],
        :correlation_ids::text[], :partitions::text[], :keys::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, partition, key, n)
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, r.partition, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), r.key, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    WHERE r.key IS NULL OR EXISTS (
        SELECT 1 FROM conveyor_keys AS k WHERE k.key = r.key AND k.task_id = r.id
    )
    ORDER BY r.n
    RETURNING seq, id, queue, partition, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, i.partition, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, i.partition, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT pg_try_advisory_xact_lock(1668247160) AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins

-- name: submit_keyed_partitioned_in
WITH req AS (
    SELECT * FROM unnest(
        :ids::text[], :names::text[], :queues::text[], :payloads::text[],
        :metadatas::text[], :priorities::int[], :max_attempts::int[],
        :backoffs::text[], :delays::bigint[], :run_ats::bigint[],
        :correlation_ids::text[], :partitions::text[], :keys::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, partition, key, n)
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, r.partition, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), r.key, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    WHERE r.key IS NULL OR EXISTS (
        SELECT 1 FROM conveyor_keys AS k WHERE k.key = r.key AND k.task_id = r.id
    )
    ORDER BY r.n
    RETURNING seq, id, queue, partition, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, i.partition, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, i.partition, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT false AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins

-- name: submit_one
WITH req AS (
    SELECT :id::text AS id, :name::text AS name, :queue::text AS queue,
        :payload::text AS payload, :metadata::text AS metadata,
        :priority::int AS priority, :max_attempts::int AS max_attempts,
        :backoff::text AS backoff, :delay::bigint AS delay_us,
        :run_at::bigint AS run_at_us, :correlation_id::text AS correlation_id,
        1 AS n
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), NULL, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT pg_try_advisory_xact_lock(1668247160) AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins

-- name: submit_one_in
WITH req AS (
    SELECT :id::text AS id, :name::text AS name, :queue::text AS queue,
        :payload::text AS payload, :metadata::text AS metadata,
        :priority::int AS priority, :max_attempts::int AS max_attempts,
        :backoff::text AS backoff, :delay::bigint AS delay_us,
        :run_at::bigint AS run_at_us, :correlation_id::text AS correlation_id,
        1 AS n
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3),
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), NULL, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    WHERE NOT EXISTS (SELECT 1 FROM req AS x JOIN conveyor_queues AS y ON y.queue = x.queue WHERE y.max_depth IS NOT NULL)
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT false AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins

-- name: submit_partitioned
WITH req AS (
    SELECT * FROM unnest(
        :ids::text[], :names::text[], :queues::text[], :payloads::text[],
        :metadatas::text[], :priorities::int[], :max_attempts::int[],
        :backoffs::text[], :delays::bigint[], :run_ats::bigint[],
        :correlation_ids::text[], :partitions::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, partition, n)
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, r.partition, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), NULL, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    ORDER BY r.n
    RETURNING seq, id, queue, partition, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, i.partition, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, i.partition, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT pg_try_advisory_xact_lock(1668247160) AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins

-- name: submit_partitioned_children
WITH req AS (
    SELECT * FROM unnest(
        :ids::text[], :names::text[], :queues::text[], :payloads::text[],
        :metadatas::text[], :priorities::int[], :max_attempts::int[],
        :backoffs::text[], :delays::bigint[], :run_ats::bigint[],
        :correlation_ids::text[], :parent_ids::text[], :partitions::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, parent_id, partition, n)
),
orphans AS (
    SELECT r.parent_id FROM req AS r WHERE r.parent_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS p WHERE p.id = r.parent_id)
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, r.partition, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), NULL, r.parent_id, coalesce(p.root_id, r.id),
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    LEFT JOIN conveyor_tasks AS p ON p.id = r.parent_id
    WHERE NOT EXISTS (SELECT 1 FROM orphans)
    ORDER BY r.n
    RETURNING seq, id, queue, partition, priority, max_attempts, created_at, run_at, root_id
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, i.partition, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, i.partition, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT pg_try_advisory_xact_lock(1668247160) AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at, ins.root_id,
    NULL::text AS orphan
FROM note, ins
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, o.parent_id FROM orphans AS o

-- name: submit_partitioned_children_in
WITH req AS (
    SELECT * FROM unnest(
        :ids::text[], :names::text[], :queues::text[], :payloads::text[],
        :metadatas::text[], :priorities::int[], :max_attempts::int[],
        :backoffs::text[], :delays::bigint[], :run_ats::bigint[],
        :correlation_ids::text[], :parent_ids::text[], :partitions::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, parent_id, partition, n)
),
orphans AS (
    SELECT r.parent_id FROM req AS r WHERE r.parent_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS p WHERE p.id = r.parent_id)
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, r.partition, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), NULL, r.parent_id, coalesce(p.root_id, r.id),
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    LEFT JOIN conveyor_tasks AS p ON p.id = r.parent_id
    WHERE NOT EXISTS (SELECT 1 FROM orphans)
    ORDER BY r.n
    RETURNING seq, id, queue, partition, priority, max_attempts, created_at, run_at, root_id
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, i.partition, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, i.partition, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT false AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at, ins.root_id,
    NULL::text AS orphan
FROM note, ins
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, o.parent_id FROM orphans AS o

-- name: submit_partitioned_in
WITH req AS (
    SELECT * FROM unnest(
        :ids::text[], :names::text[], :queues::text[], :payloads::text[],
        :metadatas::text[], :priorities::int[], :max_attempts::int[],
        :backoffs::text[], :delays::bigint[], :run_ats::bigint[],
        :correlation_ids::text[], :partitions::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, partition, n)
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, r.partition, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), NULL, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    ORDER BY r.n
    RETURNING seq, id, queue, partition, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, i.partition, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, i.partition, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT false AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins

-- name: submit_plain
WITH req AS (
    SELECT * FROM unnest(
        :ids::text[], :names::text[], :queues::text[], :payloads::text[],
        :metadatas::text[], :priorities::int[], :max_attempts::int[],
        :backoffs::text[], :delays::bigint[], :run_ats::bigint[],
        :correlation_ids::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, n)
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), NULL, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT pg_try_advisory_xact_lock(1668247160) AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins

-- name: submit_plain_in
WITH req AS (
    SELECT * FROM unnest(
        :ids::text[], :names::text[], :queues::text[], :payloads::text[],
        :metadatas::text[], :priorities::int[], :max_attempts::int[],
        :backoffs::text[], :delays::bigint[], :run_ats::bigint[],
        :correlation_ids::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, n)
),
-- No clock, so nothing written, when a queue of the rows is encrypted: plain rows
-- never go to one, whatever this store believes (conveyor.store.protocol.sealing).
clock AS (
    SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_queues AS e
        WHERE e.encrypt AND e.queue IN (SELECT rq.queue FROM req AS rq)
    )
),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3),
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), NULL, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    WHERE NOT EXISTS (SELECT 1 FROM req AS x JOIN conveyor_queues AS y ON y.queue = x.queue WHERE y.max_depth IS NOT NULL)
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT false AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins

-- name: submit_sealed
-- submit_plain for tasks sealed in Python (conveyor.store.protocol.sealing), all
-- under :key_id: no check of the queues (a sealed row may go anywhere), the key id
-- written, and each row's queue's encrypt setting returned, so the store learns
-- of a queue no longer encrypted.
WITH req AS (
    SELECT * FROM unnest(
        :ids::text[], :names::text[], :queues::text[], :payloads::text[],
        :metadatas::text[], :priorities::int[], :max_attempts::int[],
        :backoffs::text[], :delays::bigint[], :run_ats::bigint[],
        :correlation_ids::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, n)
),
clock AS (SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id,
        key_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), NULL, NULL, r.id,
        r.correlation_id, :key_id::text
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT pg_try_advisory_xact_lock(1668247160) AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at, q.encrypt
FROM note, ins LEFT JOIN conveyor_queues AS q ON q.queue = ins.queue

-- name: submit_sealed_one
-- submit_sealed for one task, from submit_one's parameters and :key_id.
WITH req AS (
    SELECT :id::text AS id, :name::text AS name, :queue::text AS queue,
        :payload::text AS payload, :metadata::text AS metadata,
        :priority::int AS priority, :max_attempts::int AS max_attempts,
        :backoff::text AS backoff, :delay::bigint AS delay_us,
        :run_at::bigint AS run_at_us, :correlation_id::text AS correlation_id,
        1 AS n
),
clock AS (SELECT (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) AS now),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id,
        key_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END,
        coalesce(r.backoff, s.backoff), c.now,
        greatest(coalesce(r.run_at_us, c.now + coalesce(r.delay_us, round(s.delay * 1000000)::bigint, 0)), c.now + round(s.debounce * 1000000)::bigint), NULL, NULL, r.id,
        r.correlation_id, :key_id::text
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
gate AS (SELECT pg_try_advisory_xact_lock(1668247160) AS nobody),
note AS (
    SELECT count(pg_notify('conveyor_work', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at, q.encrypt
FROM note, ins LEFT JOIN conveyor_queues AS q ON q.queue = ins.queue

-- name: depth_lock
-- FOR UPDATE: producers of a capped queue count its depth one after another, each
-- after the last one's commit (the next statement's snapshot sees it).
SELECT s.queue, s.max_depth
FROM conveyor_queues AS s
WHERE s.queue = ANY(ARRAY(SELECT json_array_elements_text(:queues::json))) AND s.max_depth IS NOT NULL
ORDER BY s.queue
FOR UPDATE OF s

-- name: depth_count
SELECT x.queue, (
    SELECT count(*) FROM conveyor_deliveries AS d
    WHERE d.queue = x.queue AND d.grp = '' AND d.status = 'queued'
) AS n
FROM json_array_elements_text(:queues::json) AS x(queue)

