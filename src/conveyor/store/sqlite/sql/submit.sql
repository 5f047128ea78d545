-- name: step_fan_out
INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority, max_attempts, status, attempt, run_at) SELECT conveyor_tasks.seq, targets.grp, conveyor_tasks.queue, conveyor_tasks.partition, conveyor_tasks.priority, conveyor_tasks.max_attempts, 'queued' AS anon_1, 0 AS anon_2, conveyor_tasks.run_at 
FROM conveyor_tasks JOIN (SELECT '' AS grp, NULL AS queue, NULL AS start_at UNION ALL SELECT conveyor_groups.name AS name, conveyor_groups.queue AS queue, conveyor_groups.start_at AS start_at 
FROM conveyor_groups 
WHERE conveyor_groups.active IS 1) AS targets ON targets.grp = '' OR conveyor_tasks.queue = targets.queue AND (targets.start_at IS NULL OR conveyor_tasks.created_at >= targets.start_at) 
WHERE conveyor_tasks.seq = :seq

-- name: step_fan_out_after
INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority, max_attempts, status, attempt, run_at) SELECT conveyor_tasks.seq, targets.grp, conveyor_tasks.queue, conveyor_tasks.partition, conveyor_tasks.priority, conveyor_tasks.max_attempts, 'queued' AS anon_1, 0 AS anon_2, conveyor_tasks.run_at 
FROM conveyor_tasks JOIN (SELECT '' AS grp, NULL AS queue, NULL AS start_at UNION ALL SELECT conveyor_groups.name AS name, conveyor_groups.queue AS queue, conveyor_groups.start_at AS start_at 
FROM conveyor_groups 
WHERE conveyor_groups.active IS 1) AS targets ON targets.grp = '' OR conveyor_tasks.queue = targets.queue AND (targets.start_at IS NULL OR conveyor_tasks.created_at >= targets.start_at) 
WHERE conveyor_tasks.seq > :after

-- name: step_last_seq
SELECT coalesce(max(conveyor_tasks.seq), 0) AS coalesce_1 
FROM conveyor_tasks

-- name: step_parent_root
SELECT conveyor_tasks.root_id 
FROM conveyor_tasks 
WHERE conveyor_tasks.id = :parent

-- name: step_submit_context
SELECT :now_us AS now, conveyor_queues.queue, conveyor_queues.max_attempts, conveyor_queues.backoff 
FROM (SELECT 1 AS one) AS one LEFT OUTER JOIN conveyor_queues ON conveyor_queues.queue IN (:queue)

-- name: step_submit_insert
INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority, max_attempts, backoff, created_at, run_at, "key", parent_id, root_id, correlation_id) VALUES (:v_id, :v_name, :v_queue, :v_partition, :v_payload, :v_metadata, :v_priority, :v_max_attempts, :v_backoff, :v_created_at, :v_run_at, :v_key, :v_parent_id, :v_root_id, :v_correlation_id) RETURNING seq

-- name: step_submit_insert_many
INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority, max_attempts, backoff, created_at, run_at, "key", parent_id, root_id, correlation_id) VALUES (:v_id, :v_name, :v_queue, :v_partition, :v_payload, :v_metadata, :v_priority, :v_max_attempts, :v_backoff, :v_created_at, :v_run_at, :v_key, :v_parent_id, :v_root_id, :v_correlation_id)

-- name: step_touched_after
SELECT DISTINCT conveyor_deliveries.queue, conveyor_deliveries.grp, conveyor_deliveries.partition 
FROM conveyor_deliveries 
WHERE conveyor_deliveries.task_seq > :after AND conveyor_deliveries.partition IS NOT NULL
