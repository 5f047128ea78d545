-- name: note_group_claims
-- When a consumer group last leased something (groups()' last_claim_at): see the
-- Postgres file for why it is a statement of its own, run after the claim. One
-- writer holds the whole database here, so the order of the rows is moot. The
-- ``WHERE true`` tells the parser the SELECT ends before ON CONFLICT.
INSERT INTO conveyor_group_claims (queue, grp, claimed_at)
SELECT j.value, :grp, :now_us FROM json_each(:queues) AS j WHERE true
ON CONFLICT (queue, grp) DO UPDATE SET claimed_at = excluded.claimed_at
WHERE excluded.claimed_at > conveyor_group_claims.claimed_at
