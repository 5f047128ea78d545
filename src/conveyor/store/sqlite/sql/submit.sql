-- SQLite has no data-modifying CTEs: each submit is a script, its statements run
-- in order in the submit's transaction. The task rows go in with one INSERT …
-- SELECT; the delivery rows of queue mode and of every active group are the
-- rows of the tasks that INSERT wrote, found by the first one's seq (the INSERT
-- holds the write lock from its start, so the rows above that seq are its own,
-- in a caller's deferred transaction too); the last statement reads back what
-- the database decided. Lists arrive as JSON text (texts.Text.bind encodes
-- them): each is zipped to the ids by position through a materialized table,
-- which SQLite indexes for the join (two json_each joined directly cost a scan
-- of one per row of the other: 1.8 ms per task at 1,000 tasks, against 6 µs).
-- No announcement: other processes hear a commit through PRAGMA data_version.
-- A task's run_at is its own (run_at, or now + delay), else now + the queue's
-- delay, and never before now + the queue's debounce.
-- A queue with a max_depth (conveyor.store.protocol.depth) makes the task INSERT
-- of every submit raise, through conveyor_capped (a function the store's
-- connections, and a caller's, register): the statement writes nothing, and the
-- protocol submits to that queue step by step, counting its depth first.

-- name: submit_context
SELECT :now_us AS now, s.queue AS queue, s.max_attempts AS max_attempts,
    s.backoff AS backoff, s.delay AS delay, s.debounce AS debounce, s.encrypt AS encrypt
FROM (SELECT 1) AS one
LEFT JOIN conveyor_queues AS s ON s.queue IN (SELECT value FROM json_each(:queues))

-- name: parent_roots
SELECT t.id AS id, t.root_id AS root_id
FROM json_each(:ids) AS j JOIN conveyor_tasks AS t ON t.id = j.value

-- name: insert_rows
-- Each row may be sealed (its key_id given) or plain (NULL). A plain row of an
-- encrypted queue writes nothing at all and returns one row, refused: the queue's
-- settings changed since submit_context read them, and the protocol rolls back and
-- submits again (conveyor.store.protocol.sealing).
INSERT INTO conveyor_tasks (id, name, queue, "partition", payload, metadata, priority,
    max_attempts, backoff, created_at, run_at, "key", parent_id, root_id, correlation_id,
    key_id, concurrency_key)
SELECT json_extract(e.value, '$[0]'), json_extract(e.value, '$[1]'),
    json_extract(e.value, '$[2]'), json_extract(e.value, '$[3]'),
    json_extract(e.value, '$[4]'), json_extract(e.value, '$[5]'),
    json_extract(e.value, '$[6]'), json_extract(e.value, '$[7]'),
    json_extract(e.value, '$[8]'), json_extract(e.value, '$[9]'),
    json_extract(e.value, '$[10]'), json_extract(e.value, '$[11]'),
    json_extract(e.value, '$[12]'), json_extract(e.value, '$[13]'),
    json_extract(e.value, '$[14]'), json_extract(e.value, '$[15]'),
    json_extract(e.value, '$[16]')
FROM json_each(:rows) AS e
WHERE NOT EXISTS (
    SELECT 1 FROM json_each(:rows) AS x
    JOIN conveyor_queues AS q ON q.queue = json_extract(x.value, '$[2]')
    WHERE q.encrypt AND json_extract(x.value, '$[15]') IS NULL
)
ORDER BY e.key;
INSERT INTO conveyor_deliveries (task_seq, grp, queue, "partition", priority, max_attempts,
    status, attempt, run_at, concurrency_key)
SELECT t.seq, '', t.queue, t."partition", t.priority, t.max_attempts, 'queued', 0, t.run_at,
    t.concurrency_key
FROM conveyor_tasks AS t
WHERE t.seq >= (SELECT seq FROM conveyor_tasks WHERE id = json_extract(:rows, '$[0][0]'))
UNION ALL
SELECT t.seq, g.name, t.queue, t."partition", t.priority, t.max_attempts, 'queued', 0,
    t.run_at, t.concurrency_key
FROM conveyor_tasks AS t JOIN conveyor_groups AS g ON g.queue = t.queue AND g.active
    AND (g.start_at IS NULL OR g.start_at <= t.created_at)
WHERE t.seq >= (SELECT seq FROM conveyor_tasks WHERE id = json_extract(:rows, '$[0][0]'));
-- From the new task rows (by seq) to their delivery rows (by primary key), in
-- that order (CROSS JOIN): left to choose, the planner scans every delivery row.
SELECT DISTINCT d.queue AS queue, d.grp AS grp, d."partition" AS "partition", 0 AS refused
FROM conveyor_tasks AS t CROSS JOIN conveyor_deliveries AS d ON d.task_seq = t.seq
WHERE t.seq >= (SELECT seq FROM conveyor_tasks WHERE id = json_extract(:rows, '$[0][0]'))
  AND t."partition" IS NOT NULL
UNION ALL
SELECT NULL, NULL, NULL, 1
WHERE NOT EXISTS (SELECT 1 FROM conveyor_tasks WHERE id = json_extract(:rows, '$[0][0]'))

-- name: submit_one
INSERT INTO conveyor_tasks (id, name, queue, "partition", payload, metadata, priority,
    max_attempts, backoff, created_at, run_at, "key", parent_id, root_id, correlation_id)
SELECT :id, :name, :queue, NULL, :payload, :metadata, :priority,
    coalesce(:max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END, coalesce(:backoff, s.backoff), :now_us,
    max(coalesce(:run_at, :now_us + coalesce(:delay, CAST(round(s.delay * 1000000) AS INTEGER), 0)), coalesce(:now_us + CAST(round(s.debounce * 1000000) AS INTEGER), 0)), NULL, NULL, :id, :correlation_id
-- Nothing written when the queue is encrypted: plain rows never go to one,
-- whatever this store believes (conveyor.store.protocol.sealing).
FROM (SELECT 1 AS one WHERE NOT EXISTS (
    SELECT 1 FROM conveyor_queues AS e WHERE e.queue = :queue AND e.encrypt
)) AS one LEFT JOIN conveyor_queues AS s ON s.queue = :queue;
INSERT INTO conveyor_deliveries (task_seq, grp, queue, "partition", priority, max_attempts,
    status, attempt, run_at)
SELECT t.seq, '', t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t WHERE t.id = :id
UNION ALL
SELECT t.seq, g.name, t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t JOIN conveyor_groups AS g ON g.queue = t.queue AND g.active
    AND (g.start_at IS NULL OR g.start_at <= t.created_at)
WHERE t.id = :id;
SELECT id, max_attempts, created_at, run_at FROM conveyor_tasks WHERE id = :id

-- name: submit_one_in
-- SQLite announces nothing, in a caller's transaction or not:
-- as: submit_one

-- name: submit_child
-- A parent that is not a task: nothing written, and a row naming it.
INSERT INTO conveyor_tasks (id, name, queue, "partition", payload, metadata, priority,
    max_attempts, backoff, created_at, run_at, "key", parent_id, root_id, correlation_id)
SELECT :id, :name, :queue, NULL, :payload, :metadata, :priority,
    coalesce(:max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END, coalesce(:backoff, s.backoff), :now_us,
    max(coalesce(:run_at, :now_us + coalesce(:delay, CAST(round(s.delay * 1000000) AS INTEGER), 0)), coalesce(:now_us + CAST(round(s.debounce * 1000000) AS INTEGER), 0)), NULL, :parent_id,
    coalesce(p.root_id, :id), :correlation_id
-- Nothing written when the queue is encrypted: plain rows never go to one,
-- whatever this store believes (conveyor.store.protocol.sealing).
FROM (SELECT 1 AS one WHERE NOT EXISTS (
    SELECT 1 FROM conveyor_queues AS e WHERE e.queue = :queue AND e.encrypt
)) AS one LEFT JOIN conveyor_queues AS s ON s.queue = :queue
LEFT JOIN conveyor_tasks AS p ON p.id = :parent_id
WHERE :parent_id IS NULL OR p.id IS NOT NULL;
INSERT INTO conveyor_deliveries (task_seq, grp, queue, "partition", priority, max_attempts,
    status, attempt, run_at)
SELECT t.seq, '', t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t WHERE t.id = :id
UNION ALL
SELECT t.seq, g.name, t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t JOIN conveyor_groups AS g ON g.queue = t.queue AND g.active
    AND (g.start_at IS NULL OR g.start_at <= t.created_at)
WHERE t.id = :id;
SELECT id, max_attempts, created_at, run_at, root_id, NULL AS orphan
FROM conveyor_tasks WHERE id = :id
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, :parent_id
WHERE :parent_id IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM conveyor_tasks WHERE id = :parent_id)

-- name: submit_child_in
-- SQLite announces nothing, in a caller's transaction or not:
-- as: submit_child

-- name: submit_plain
WITH names AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:names)),
queues AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:queues)),
payloads AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:payloads)),
metadatas AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:metadatas)),
priorities AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:priorities)),
-- The last five may be NULL (no list: NULL for every task): no rows to join.
attempts AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:max_attempts)),
backoffs AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:backoffs)),
delays AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:delays)),
run_ats AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:run_ats)),
correlations AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:correlation_ids))
INSERT INTO conveyor_tasks (id, name, queue, "partition", payload, metadata, priority,
    max_attempts, backoff, created_at, run_at, "key", parent_id, root_id, correlation_id)
SELECT i.value, n.v, q.v, NULL, p.v, m.v, r.v,
    coalesce(a.v, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END, coalesce(b.v, s.backoff), :now_us,
    max(coalesce(ra.v, :now_us + coalesce(d.v, CAST(round(s.delay * 1000000) AS INTEGER), 0)), coalesce(:now_us + CAST(round(s.debounce * 1000000) AS INTEGER), 0)), NULL, NULL, i.value, c.v
FROM json_each(:ids) AS i
JOIN names AS n ON n.k = i.key
JOIN queues AS q ON q.k = i.key
JOIN payloads AS p ON p.k = i.key
JOIN metadatas AS m ON m.k = i.key
JOIN priorities AS r ON r.k = i.key
LEFT JOIN attempts AS a ON a.k = i.key
LEFT JOIN backoffs AS b ON b.k = i.key
LEFT JOIN delays AS d ON d.k = i.key
LEFT JOIN run_ats AS ra ON ra.k = i.key
LEFT JOIN correlations AS c ON c.k = i.key
LEFT JOIN conveyor_queues AS s ON s.queue = q.v
-- Nothing written when a queue of the rows is encrypted: plain rows never go to
-- one, whatever this store believes (conveyor.store.protocol.sealing). Uncorrelated:
-- asked once per statement.
WHERE NOT EXISTS (
    SELECT 1 FROM conveyor_queues AS e
    WHERE e.encrypt AND e.queue IN (SELECT value FROM json_each(:queues))
)
ORDER BY i.key;
INSERT INTO conveyor_deliveries (task_seq, grp, queue, "partition", priority, max_attempts,
    status, attempt, run_at)
SELECT t.seq, '', t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t
WHERE t.seq >= (SELECT seq FROM conveyor_tasks WHERE id = json_extract(:ids, '$[0]'))
UNION ALL
SELECT t.seq, g.name, t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t JOIN conveyor_groups AS g ON g.queue = t.queue AND g.active
    AND (g.start_at IS NULL OR g.start_at <= t.created_at)
WHERE t.seq >= (SELECT seq FROM conveyor_tasks WHERE id = json_extract(:ids, '$[0]'));
SELECT id, max_attempts, created_at, run_at FROM conveyor_tasks
WHERE seq >= (SELECT seq FROM conveyor_tasks WHERE id = json_extract(:ids, '$[0]'))

-- name: submit_plain_in
-- SQLite announces nothing, in a caller's transaction or not:
-- as: submit_plain

-- name: submit_children
-- A parent that is not a task: nothing written, and a row naming it.
WITH names AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:names)),
queues AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:queues)),
payloads AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:payloads)),
metadatas AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:metadatas)),
priorities AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:priorities)),
attempts AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:max_attempts)),
backoffs AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:backoffs)),
delays AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:delays)),
run_ats AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:run_ats)),
correlations AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:correlation_ids)),
parents AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:parent_ids))
INSERT INTO conveyor_tasks (id, name, queue, "partition", payload, metadata, priority,
    max_attempts, backoff, created_at, run_at, "key", parent_id, root_id, correlation_id)
SELECT i.value, n.v, q.v, NULL, p.v, m.v, r.v,
    coalesce(a.v, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END, coalesce(b.v, s.backoff), :now_us,
    max(coalesce(ra.v, :now_us + coalesce(d.v, CAST(round(s.delay * 1000000) AS INTEGER), 0)), coalesce(:now_us + CAST(round(s.debounce * 1000000) AS INTEGER), 0)), NULL, f.v, coalesce(pt.root_id, i.value),
    c.v
FROM json_each(:ids) AS i
JOIN names AS n ON n.k = i.key
JOIN queues AS q ON q.k = i.key
JOIN payloads AS p ON p.k = i.key
JOIN metadatas AS m ON m.k = i.key
JOIN priorities AS r ON r.k = i.key
LEFT JOIN attempts AS a ON a.k = i.key
LEFT JOIN backoffs AS b ON b.k = i.key
LEFT JOIN delays AS d ON d.k = i.key
LEFT JOIN run_ats AS ra ON ra.k = i.key
LEFT JOIN correlations AS c ON c.k = i.key
LEFT JOIN parents AS f ON f.k = i.key
LEFT JOIN conveyor_tasks AS pt ON pt.id = f.v
LEFT JOIN conveyor_queues AS s ON s.queue = q.v
-- Nothing written when a queue of the rows is encrypted: plain rows never go to
-- one, whatever this store believes (conveyor.store.protocol.sealing). Uncorrelated:
-- asked once per statement.
WHERE NOT EXISTS (
    SELECT 1 FROM conveyor_queues AS e
    WHERE e.encrypt AND e.queue IN (SELECT value FROM json_each(:queues))
)
  AND NOT EXISTS (
    SELECT 1 FROM json_each(:parent_ids) AS o
    WHERE o.value IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS x WHERE x.id = o.value)
)
ORDER BY i.key;
INSERT INTO conveyor_deliveries (task_seq, grp, queue, "partition", priority, max_attempts,
    status, attempt, run_at)
SELECT t.seq, '', t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t
WHERE t.seq >= (SELECT seq FROM conveyor_tasks WHERE id = json_extract(:ids, '$[0]'))
UNION ALL
SELECT t.seq, g.name, t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t JOIN conveyor_groups AS g ON g.queue = t.queue AND g.active
    AND (g.start_at IS NULL OR g.start_at <= t.created_at)
WHERE t.seq >= (SELECT seq FROM conveyor_tasks WHERE id = json_extract(:ids, '$[0]'));
SELECT id, max_attempts, created_at, run_at, root_id, NULL AS orphan FROM conveyor_tasks
WHERE seq >= (SELECT seq FROM conveyor_tasks WHERE id = json_extract(:ids, '$[0]'))
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, o.value FROM json_each(:parent_ids) AS o
WHERE o.value IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS x WHERE x.id = o.value)

-- name: submit_children_in
-- SQLite announces nothing, in a caller's transaction or not:
-- as: submit_children

-- name: submit_keyed_partitioned
-- The submit of every kind but the plain one and children alone: each list but
-- ids may be NULL (no list: NULL for every task), so this one script serves
-- partitions, keys and parents, alone or together (the statements of those kinds
-- are this one: below). A keyed task is written only if its key's row names it; a
-- parent that is not a task writes nothing and returns a row naming it. Some tasks
-- may be left out, so the rows written are found by their ids, not by a first seq.
WITH names AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:names)),
queues AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:queues)),
payloads AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:payloads)),
metadatas AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:metadatas)),
priorities AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:priorities)),
attempts AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:max_attempts)),
backoffs AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:backoffs)),
delays AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:delays)),
run_ats AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:run_ats)),
correlations AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:correlation_ids)),
partitions AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:partitions)),
keys AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:keys)),
parents AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:parent_ids))
INSERT INTO conveyor_tasks (id, name, queue, "partition", payload, metadata, priority,
    max_attempts, backoff, created_at, run_at, "key", parent_id, root_id, correlation_id)
SELECT i.value, n.v, q.v, pa.v, p.v, m.v, r.v,
    coalesce(a.v, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END, coalesce(b.v, s.backoff), :now_us,
    max(coalesce(ra.v, :now_us + coalesce(d.v, CAST(round(s.delay * 1000000) AS INTEGER), 0)), coalesce(:now_us + CAST(round(s.debounce * 1000000) AS INTEGER), 0)), ky.v, f.v, coalesce(pt.root_id, i.value),
    c.v
FROM json_each(:ids) AS i
JOIN names AS n ON n.k = i.key
JOIN queues AS q ON q.k = i.key
JOIN payloads AS p ON p.k = i.key
JOIN metadatas AS m ON m.k = i.key
JOIN priorities AS r ON r.k = i.key
LEFT JOIN attempts AS a ON a.k = i.key
LEFT JOIN backoffs AS b ON b.k = i.key
LEFT JOIN delays AS d ON d.k = i.key
LEFT JOIN run_ats AS ra ON ra.k = i.key
LEFT JOIN correlations AS c ON c.k = i.key
LEFT JOIN partitions AS pa ON pa.k = i.key
LEFT JOIN keys AS ky ON ky.k = i.key
LEFT JOIN parents AS f ON f.k = i.key
LEFT JOIN conveyor_tasks AS pt ON pt.id = f.v
LEFT JOIN conveyor_queues AS s ON s.queue = q.v
-- Nothing written when a queue of the rows is encrypted: plain rows never go to
-- one, whatever this store believes (conveyor.store.protocol.sealing). Uncorrelated:
-- asked once per statement.
WHERE NOT EXISTS (
    SELECT 1 FROM conveyor_queues AS e
    WHERE e.encrypt AND e.queue IN (SELECT value FROM json_each(:queues))
)
  AND (ky.v IS NULL OR EXISTS (
        SELECT 1 FROM conveyor_keys AS kr WHERE kr.key = ky.v AND kr.task_id = i.value
    ))
  AND NOT EXISTS (
    SELECT 1 FROM json_each(:parent_ids) AS o
    WHERE o.value IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS x WHERE x.id = o.value)
)
ORDER BY i.key;
INSERT INTO conveyor_deliveries (task_seq, grp, queue, "partition", priority, max_attempts,
    status, attempt, run_at)
SELECT t.seq, '', t.queue, t."partition", t.priority, t.max_attempts, 'queued', 0,
    t.run_at
FROM json_each(:ids) AS j CROSS JOIN conveyor_tasks AS t ON t.id = j.value
UNION ALL
SELECT t.seq, g.name, t.queue, t."partition", t.priority, t.max_attempts, 'queued', 0,
    t.run_at
FROM json_each(:ids) AS j CROSS JOIN conveyor_tasks AS t ON t.id = j.value
JOIN conveyor_groups AS g ON g.queue = t.queue AND g.active
    AND (g.start_at IS NULL OR g.start_at <= t.created_at);
SELECT t.id, t.max_attempts, t.created_at, t.run_at, t.root_id, NULL AS orphan
FROM json_each(:ids) AS j CROSS JOIN conveyor_tasks AS t ON t.id = j.value
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, o.value FROM json_each(:parent_ids) AS o
WHERE o.value IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS x WHERE x.id = o.value)

-- name: submit_keyed_partitioned_in
-- SQLite announces nothing, in a caller's transaction or not:
-- as: submit_keyed_partitioned

-- name: submit_partitioned
-- as: submit_keyed_partitioned

-- name: submit_partitioned_in
-- as: submit_keyed_partitioned

-- name: submit_partitioned_children
-- as: submit_keyed_partitioned

-- name: submit_partitioned_children_in
-- as: submit_keyed_partitioned

-- name: submit_keyed_many
-- as: submit_keyed_partitioned

-- name: submit_keyed_many_in
-- as: submit_keyed_partitioned

-- name: submit_keyed_child
-- One task with a key (and a parent, or none): the key claimed if the parent, if
-- any, is a task; the task written if its claim won (submit_keyed is this one).
INSERT INTO conveyor_keys (key, task_id)
SELECT :key, :id
WHERE :parent_id IS NULL OR EXISTS (SELECT 1 FROM conveyor_tasks WHERE id = :parent_id)
ON CONFLICT (key) DO NOTHING;
INSERT INTO conveyor_tasks (id, name, queue, "partition", payload, metadata, priority,
    max_attempts, backoff, created_at, run_at, "key", parent_id, root_id, correlation_id)
SELECT :id, :name, :queue, NULL, :payload, :metadata, :priority,
    coalesce(:max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END, coalesce(:backoff, s.backoff), :now_us,
    max(coalesce(:run_at, :now_us + coalesce(:delay, CAST(round(s.delay * 1000000) AS INTEGER), 0)), coalesce(:now_us + CAST(round(s.debounce * 1000000) AS INTEGER), 0)), :key, :parent_id,
    coalesce(p.root_id, :id), :correlation_id
-- Nothing written when the queue is encrypted: plain rows never go to one,
-- whatever this store believes (conveyor.store.protocol.sealing).
FROM (SELECT 1 AS one WHERE NOT EXISTS (
    SELECT 1 FROM conveyor_queues AS e WHERE e.queue = :queue AND e.encrypt
)) AS one LEFT JOIN conveyor_queues AS s ON s.queue = :queue
LEFT JOIN conveyor_tasks AS p ON p.id = :parent_id
WHERE EXISTS (SELECT 1 FROM conveyor_keys WHERE key = :key AND task_id = :id);
INSERT INTO conveyor_deliveries (task_seq, grp, queue, "partition", priority, max_attempts,
    status, attempt, run_at)
SELECT t.seq, '', t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t WHERE t.id = :id
UNION ALL
SELECT t.seq, g.name, t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t JOIN conveyor_groups AS g ON g.queue = t.queue AND g.active
    AND (g.start_at IS NULL OR g.start_at <= t.created_at)
WHERE t.id = :id;
SELECT id, max_attempts, created_at, run_at, root_id, NULL AS orphan
FROM conveyor_tasks WHERE id = :id
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, :parent_id
WHERE :parent_id IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM conveyor_tasks WHERE id = :parent_id)

-- name: submit_keyed_child_in
-- as: submit_keyed_child

-- name: submit_keyed
-- as: submit_keyed_child

-- name: submit_keyed_in
-- as: submit_keyed_child

-- name: submit_key_owned
-- A replace's task: written only if the key's row names it (handed over by
-- replace_key); no claim of its own.
INSERT INTO conveyor_tasks (id, name, queue, "partition", payload, metadata, priority,
    max_attempts, backoff, created_at, run_at, "key", parent_id, root_id, correlation_id)
SELECT :id, :name, :queue, NULL, :payload, :metadata, :priority,
    coalesce(:max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END, coalesce(:backoff, s.backoff), :now_us,
    max(coalesce(:run_at, :now_us + coalesce(:delay, CAST(round(s.delay * 1000000) AS INTEGER), 0)), coalesce(:now_us + CAST(round(s.debounce * 1000000) AS INTEGER), 0)), :key, NULL, :id, :correlation_id
-- Nothing written when the queue is encrypted: plain rows never go to one,
-- whatever this store believes (conveyor.store.protocol.sealing).
FROM (SELECT 1 AS one WHERE NOT EXISTS (
    SELECT 1 FROM conveyor_queues AS e WHERE e.queue = :queue AND e.encrypt
)) AS one LEFT JOIN conveyor_queues AS s ON s.queue = :queue
WHERE EXISTS (SELECT 1 FROM conveyor_keys WHERE key = :key AND task_id = :id);
INSERT INTO conveyor_deliveries (task_seq, grp, queue, "partition", priority, max_attempts,
    status, attempt, run_at)
SELECT t.seq, '', t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t WHERE t.id = :id
UNION ALL
SELECT t.seq, g.name, t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t JOIN conveyor_groups AS g ON g.queue = t.queue AND g.active
    AND (g.start_at IS NULL OR g.start_at <= t.created_at)
WHERE t.id = :id;
SELECT id, max_attempts, created_at, run_at FROM conveyor_tasks WHERE id = :id

-- name: submit_key_owned_in
-- as: submit_key_owned

-- name: submit_sealed
-- submit_plain for tasks sealed in Python (conveyor.store.protocol.sealing), all
-- under :key_id: no check of the queues (a sealed row may go anywhere), the key id
-- written, and each row's queue's encrypt setting returned, so the store learns
-- of a queue no longer encrypted.
WITH names AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:names)),
queues AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:queues)),
payloads AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:payloads)),
metadatas AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:metadatas)),
priorities AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:priorities)),
-- The last five may be NULL (no list: NULL for every task): no rows to join.
attempts AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:max_attempts)),
backoffs AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:backoffs)),
delays AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:delays)),
run_ats AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:run_ats)),
correlations AS MATERIALIZED (SELECT key AS k, value AS v FROM json_each(:correlation_ids))
INSERT INTO conveyor_tasks (id, name, queue, "partition", payload, metadata, priority,
    max_attempts, backoff, created_at, run_at, "key", parent_id, root_id, correlation_id,
    key_id)
SELECT i.value, n.v, q.v, NULL, p.v, m.v, r.v,
    coalesce(a.v, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END, coalesce(b.v, s.backoff), :now_us,
    max(coalesce(ra.v, :now_us + coalesce(d.v, CAST(round(s.delay * 1000000) AS INTEGER), 0)), coalesce(:now_us + CAST(round(s.debounce * 1000000) AS INTEGER), 0)), NULL, NULL, i.value, c.v,
    :key_id
FROM json_each(:ids) AS i
JOIN names AS n ON n.k = i.key
JOIN queues AS q ON q.k = i.key
JOIN payloads AS p ON p.k = i.key
JOIN metadatas AS m ON m.k = i.key
JOIN priorities AS r ON r.k = i.key
LEFT JOIN attempts AS a ON a.k = i.key
LEFT JOIN backoffs AS b ON b.k = i.key
LEFT JOIN delays AS d ON d.k = i.key
LEFT JOIN run_ats AS ra ON ra.k = i.key
LEFT JOIN correlations AS c ON c.k = i.key
LEFT JOIN conveyor_queues AS s ON s.queue = q.v
ORDER BY i.key;
INSERT INTO conveyor_deliveries (task_seq, grp, queue, "partition", priority, max_attempts,
    status, attempt, run_at)
SELECT t.seq, '', t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t
WHERE t.seq >= (SELECT seq FROM conveyor_tasks WHERE id = json_extract(:ids, '$[0]'))
UNION ALL
SELECT t.seq, g.name, t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t JOIN conveyor_groups AS g ON g.queue = t.queue AND g.active
    AND (g.start_at IS NULL OR g.start_at <= t.created_at)
WHERE t.seq >= (SELECT seq FROM conveyor_tasks WHERE id = json_extract(:ids, '$[0]'));
SELECT t.id AS id, t.max_attempts AS max_attempts, t.created_at AS created_at,
    t.run_at AS run_at, q.encrypt AS encrypt
FROM conveyor_tasks AS t LEFT JOIN conveyor_queues AS q ON q.queue = t.queue
WHERE t.seq >= (SELECT seq FROM conveyor_tasks WHERE id = json_extract(:ids, '$[0]'))

-- name: submit_sealed_one
-- submit_sealed for one task, from submit_one's parameters and :key_id.
INSERT INTO conveyor_tasks (id, name, queue, "partition", payload, metadata, priority,
    max_attempts, backoff, created_at, run_at, "key", parent_id, root_id, correlation_id,
    key_id)
SELECT :id, :name, :queue, NULL, :payload, :metadata, :priority,
    coalesce(:max_attempts, s.max_attempts, 3) + CASE WHEN s.max_depth IS NULL THEN 0 ELSE conveyor_capped(s.queue) END, coalesce(:backoff, s.backoff), :now_us,
    max(coalesce(:run_at, :now_us + coalesce(:delay, CAST(round(s.delay * 1000000) AS INTEGER), 0)), coalesce(:now_us + CAST(round(s.debounce * 1000000) AS INTEGER), 0)), NULL, NULL, :id, :correlation_id,
    :key_id
FROM (SELECT 1) AS one LEFT JOIN conveyor_queues AS s ON s.queue = :queue;
INSERT INTO conveyor_deliveries (task_seq, grp, queue, "partition", priority, max_attempts,
    status, attempt, run_at)
SELECT t.seq, '', t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t WHERE t.id = :id
UNION ALL
SELECT t.seq, g.name, t.queue, NULL, t.priority, t.max_attempts, 'queued', 0, t.run_at
FROM conveyor_tasks AS t JOIN conveyor_groups AS g ON g.queue = t.queue AND g.active
    AND (g.start_at IS NULL OR g.start_at <= t.created_at)
WHERE t.id = :id;
SELECT t.id AS id, t.max_attempts AS max_attempts, t.created_at AS created_at,
    t.run_at AS run_at, q.encrypt AS encrypt
FROM conveyor_tasks AS t LEFT JOIN conveyor_queues AS q ON q.queue = t.queue
WHERE t.id = :id

-- name: depth_lock
-- The write lock the transaction holds is the lock.
SELECT s.queue AS queue, s.max_depth AS max_depth
FROM conveyor_queues AS s
WHERE s.queue IN (SELECT value FROM json_each(:queues)) AND s.max_depth IS NOT NULL
ORDER BY s.queue

-- name: depth_count
SELECT x.value AS queue, (
    SELECT count(*) FROM conveyor_deliveries AS d
    WHERE d.queue = x.value AND d.grp = '' AND d.status = 'queued'
) AS n
FROM json_each(:queues) AS x

