-- name: ack_held
SELECT t.id AS id, d.task_seq AS task_seq, d.attempt AS attempt, d.queue AS queue, d."partition" AS "partition" FROM json_each(:ids) AS j CROSS JOIN conveyor_tasks AS t ON t.id = j.value CROSS JOIN conveyor_deliveries AS d ON d.task_seq = t.seq AND d.grp = :grp WHERE d.worker_id = :worker_id AND d.status = 'running'

-- name: step_finish
UPDATE conveyor_deliveries SET status='succeeded', lease_expires_at=NULL, finished_at=:now_us, result=:b_result WHERE conveyor_deliveries.grp = :grp AND conveyor_deliveries.task_seq = :b_seq
