-- name: wake.notify
SELECT pg_notify(n.channel, n.payload) FROM unnest(:channels::text[], :payloads::text[]) AS n(channel, payload) WHERE n.channel <> 'conveyor_done' OR EXISTS (SELECT 1 FROM conveyor_waiters AS w WHERE w.task_id = n.payload) OR (n.payload = '' AND EXISTS (SELECT 1 FROM conveyor_waiters))

-- name: wake.waiter_add
WITH gone AS (DELETE FROM conveyor_waiters WHERE expires_at < (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us))
INSERT INTO conveyor_waiters (task_id, token, expires_at)
VALUES (:task_id, :token, (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us) + :ttl_us)
ON CONFLICT (task_id, token) DO UPDATE SET expires_at = excluded.expires_at

-- name: wake.waiter_drop
DELETE FROM conveyor_waiters WHERE task_id = :task_id AND token = :token
