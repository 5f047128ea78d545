-- name: claim_keys
INSERT INTO conveyor_keys (key, task_id) SELECT k.value, i.value FROM json_each(:keys) AS k JOIN json_each(:ids) AS i ON i.key = k.key WHERE true ORDER BY k.key ON CONFLICT (key) DO NOTHING RETURNING key

-- name: lock_keys
SELECT key, task_id FROM conveyor_keys WHERE key IN (SELECT value FROM json_each(:keys)) ORDER BY key
