-- Task dependencies (conveyor.store.protocol.dependencies). The release itself is
-- the trigger of migration 0017, not a statement here.

-- name: mark_parents
-- The write lock the transaction holds (one writer) is the lock: the status
-- read here cannot change before the commit.
UPDATE conveyor_deliveries SET has_dependents = 1
WHERE grp = '' AND task_seq IN (SELECT value FROM json_each(:seqs))
RETURNING task_seq, status

-- name: link_edges
INSERT INTO conveyor_dependencies (task_seq, parent_seq, run_on_failure, resolved)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),
       json_extract(value, '$[2]'), json_extract(value, '$[3]')
FROM json_each(:edges)
