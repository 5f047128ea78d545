-- name: note_group_claims
-- When a consumer group last leased something (groups()' last_claim_at). Run by
-- itself after a claim that leased something, at most once a second per (queue,
-- group) per store: never inside the claim, which leaves conveyor_groups alone
-- (submits share its rows), and never a wait on anything but these rows, taken
-- in the order of their key (the protocol sorts ``queues``), so two notes of
-- several queues never wait for each other crosswise. A note whose clock reading
-- is older than the row's (another store's, a moment later) writes nothing.
INSERT INTO conveyor_group_claims AS c (queue, grp, claimed_at)
SELECT q.queue, :grp, (floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint + :offset_us)
FROM json_array_elements_text(:queues::json) WITH ORDINALITY AS q(queue, n)
ORDER BY q.n
ON CONFLICT (queue, grp) DO UPDATE SET claimed_at = excluded.claimed_at
WHERE c.claimed_at < excluded.claimed_at
