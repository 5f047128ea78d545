-- Task dependencies (conveyor.store.protocol.dependencies). The release itself is
-- the trigger of migration 0017, not a statement here.

-- name: mark_parents
-- The parents' queue-mode rows locked in seq order (the lock order among
-- submits), then marked: the UPDATE of a row whose acknowledgement committed
-- while this waited updates (and returns) the row as that left it, so the
-- status is read after the lock.
WITH locked AS (
    SELECT d.task_seq FROM conveyor_deliveries AS d
    WHERE d.grp = ''
      AND d.task_seq = ANY(ARRAY(SELECT value::bigint FROM json_array_elements_text(:seqs::json)))
    ORDER BY d.task_seq
    FOR UPDATE
)
UPDATE conveyor_deliveries AS d SET has_dependents = true
FROM locked
WHERE d.task_seq = locked.task_seq AND d.grp = ''
RETURNING d.task_seq, d.status

-- name: link_edges
INSERT INTO conveyor_dependencies (task_seq, parent_seq, run_on_failure, resolved)
SELECT (e.v ->> 0)::bigint, (e.v ->> 1)::bigint, (e.v ->> 2)::boolean, (e.v ->> 3)::boolean
FROM json_array_elements(:edges::json) AS e(v)
