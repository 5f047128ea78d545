"""The Postgres texts of the one-statement submits: plain tasks, partitioned
tasks, children, and the fragments the other submit texts are edited from
(:mod:`conveyor.store.postgres.keyed`). Data-modifying CTEs, which SQLite lacks.

Each text binds named parameters (``%(name)s``); the contracts are in
:meth:`conveyor.store.seam.Seam._statement_texts`.
"""

from __future__ import annotations

from conveyor.store.postgres import claim as pg_claim
from conveyor.store.postgres import listen as pg_listen
from conveyor.store.protocol import queries as q

# The clock of the texts below (the statement's moment, moved by the store's
# clock_offset): the same fragment as the claim's.
_NOW = pg_claim.NOW


#: The step of a submit text that asks whether anyone listens (see
#: :data:`conveyor.store.postgres.listen.NOBODY_LISTENS`): its announcement is skipped
#: when nobody does.
GATE = f"gate AS (SELECT {pg_listen.NOBODY_LISTENS} AS nobody)"


# Submit plain tasks (no key, partition or parent) in one statement: insert the
# task rows, fan out their delivery rows (queue mode and every active group) and
# announce the queues when some listener can hear it (``gate``, see
# pg_listen.NOBODY_LISTENS), all from arrays. Data-modifying CTEs, which SQLite lacks.
SUBMIT_MANY = """
    SELECT * FROM unnest(
        %(ids)s::text[], %(names)s::text[], %(queues)s::text[], %(payloads)s::text[],
        %(metadatas)s::text[], %(priorities)s::int[], %(max_attempts)s::int[],
        %(backoffs)s::text[], %(delays)s::bigint[], %(run_ats)s::bigint[],
        %(correlation_ids)s::text[]
    ) WITH ORDINALITY AS r(id, name, queue, payload, metadata, priority, max_attempts,
                           backoff, delay_us, run_at_us, correlation_id, n)
"""
# One task: the same statement from scalars. Dumping eleven one-element arrays costs
# the driver several times what eleven plain values do.
SUBMIT_ONE = """
    SELECT %(id)s::text AS id, %(name)s::text AS name, %(queue)s::text AS queue,
        %(payload)s::text AS payload, %(metadata)s::text AS metadata,
        %(priority)s::int AS priority, %(max_attempts)s::int AS max_attempts,
        %(backoff)s::text AS backoff, %(delay)s::bigint AS delay_us,
        %(run_at)s::bigint AS run_at_us, %(correlation_id)s::text AS correlation_id,
        1 AS n
"""
_SUBMIT_TEXT = f"""
WITH req AS ({{req}}),
clock AS (SELECT {_NOW} AS now),
ins AS (
    INSERT INTO conveyor_tasks (id, name, queue, partition, payload, metadata, priority,
        max_attempts, backoff, created_at, run_at, key, parent_id, root_id, correlation_id)
    SELECT r.id, r.name, r.queue, NULL, r.payload, r.metadata, r.priority,
        coalesce(r.max_attempts, s.max_attempts, {q.DEFAULT_MAX_ATTEMPTS}),
        coalesce(r.backoff, s.backoff), c.now,
        coalesce(r.run_at_us, c.now + coalesce(r.delay_us, 0)), NULL, NULL, r.id,
        r.correlation_id
    FROM req AS r CROSS JOIN clock AS c LEFT JOIN conveyor_queues AS s ON s.queue = r.queue
    ORDER BY r.n
    RETURNING seq, id, queue, priority, max_attempts, created_at, run_at
),
fan AS (
    INSERT INTO conveyor_deliveries (task_seq, grp, queue, partition, priority,
        max_attempts, status, attempt, run_at)
    SELECT i.seq, '{q.QUEUE_MODE}', i.queue, NULL, i.priority, i.max_attempts, 'queued', 0,
        i.run_at
    FROM ins AS i
    UNION ALL
    SELECT i.seq, g.name, i.queue, NULL, i.priority, i.max_attempts, 'queued', 0, i.run_at
    FROM ins AS i JOIN conveyor_groups AS g ON g.queue = i.queue AND g.active
        AND (g.start_at IS NULL OR g.start_at <= i.created_at)
),
{GATE},
note AS (
    SELECT count(pg_notify('{{work}}', w.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins) AS w, gate
    WHERE NOT gate.nobody
)
SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins
"""


def submit_text(req: str) -> str:
    """The one-statement submit of the requests ``req`` (:data:`SUBMIT_MANY` or
    :data:`SUBMIT_ONE`), announcing new work on its queues."""
    return _SUBMIT_TEXT.replace("{req}", req).replace("{work}", pg_listen.WORK_CHANNEL)


def in_callers_transaction(text: str) -> str:
    """``text`` (a one-statement submit) for a caller's transaction
    (``submit(..., connection=...)``): it always announces its queues. The gate
    would hold the listeners' lock until the caller commits, however long that
    takes, and a listener starting meanwhile would wait for it; the caller's
    transaction pays for a ``NOTIFY`` instead, as the step-by-step submit does."""
    return edited(text, (GATE, "gate AS (SELECT false AS nobody)"))


def edited(text: str, *edits: tuple[str, str] | tuple[str, str, int]) -> str:
    """``text`` with each edit's old fragment replaced by its new one; each fragment
    must occur exactly as often as the edit says (once by default), so a change to
    the text edited cannot leave a variant silently unedited."""
    for edit in edits:
        old, new = edit[0], edit[1]
        times = edit[2] if len(edit) == 3 else 1
        found = text.count(old)
        if found != times:
            raise AssertionError(f"{old!r} occurs {found} times, not {times}")
        text = text.replace(old, new)
    return text


# Tasks with partitions (no key or parent): the same statement with a ``partitions``
# list (None entries: unpartitioned), each task and delivery row in its partition.
# The third of the five statements of a pipelined submit (see store.pipelined):
# after the active groups are shared and the queue-mode streams locked, before the
# streams the rows joined are locked and recomputed.
SUBMIT_PARTITIONED = edited(
    submit_text(SUBMIT_MANY),
    (
        "%(correlation_ids)s::text[]\n    )",
        "%(correlation_ids)s::text[], %(partitions)s::text[]\n    )",
    ),
    (
        "backoff, delay_us, run_at_us, correlation_id, n)",
        "backoff, delay_us, run_at_us, correlation_id, partition, n)",
    ),
    (
        "SELECT r.id, r.name, r.queue, NULL, r.payload",
        "SELECT r.id, r.name, r.queue, r.partition, r.payload",
    ),
    (
        "RETURNING seq, id, queue, priority, max_attempts, created_at, run_at",
        "RETURNING seq, id, queue, partition, priority, max_attempts, created_at, run_at",
    ),
    # both delivery branches: queue mode and the groups
    ("i.queue, NULL, i.priority", "i.queue, i.partition, i.priority", 2),
)


# Tasks with parents (no key or partition): the plain statement with each task's
# ``parent_id`` (None: no parent), whose ``root_id`` is its parent's root, read in
# the statement's snapshot as producer.insert_tasks reads it. If any parent is not
# a task, nothing is written and the missing parents come back as ``orphan`` rows.
def with_parents(text: str, one: bool) -> str:
    """``text`` (a submit of one request, ``one``, or of many) with each task's
    parent: see the comment above."""
    edits: list[tuple[str, str]] = []
    if one:
        edits.append(
            (
                "%(correlation_id)s::text AS correlation_id,\n        1 AS n",
                "%(correlation_id)s::text AS correlation_id,\n"
                "        %(parent_id)s::text AS parent_id, 1 AS n",
            )
        )
    else:
        edits += [
            (
                "%(correlation_ids)s::text[]\n    )",
                "%(correlation_ids)s::text[], %(parent_ids)s::text[]\n    )",
            ),
            (
                "backoff, delay_us, run_at_us, correlation_id, n)",
                "backoff, delay_us, run_at_us, correlation_id, parent_id, n)",
            ),
        ]
    return edited(
        text,
        *edits,
        (
            "clock AS (",
            "orphans AS (\n    SELECT r.parent_id FROM req AS r WHERE r.parent_id IS NOT NULL\n"
            "      AND NOT EXISTS (SELECT 1 FROM conveyor_tasks AS p WHERE p.id = r.parent_id)\n"
            "),\nclock AS (",
        ),
        (
            "coalesce(r.delay_us, 0)), NULL, NULL, r.id,",
            "coalesce(r.delay_us, 0)), NULL, r.parent_id, coalesce(p.root_id, r.id),",
        ),
        (
            "LEFT JOIN conveyor_queues AS s ON s.queue = r.queue\n    ORDER BY r.n",
            "LEFT JOIN conveyor_queues AS s ON s.queue = r.queue\n"
            "    LEFT JOIN conveyor_tasks AS p ON p.id = r.parent_id\n"
            "    WHERE NOT EXISTS (SELECT 1 FROM orphans)\n    ORDER BY r.n",
        ),
        (
            "RETURNING seq, id, queue, priority, max_attempts, created_at, run_at\n",
            "RETURNING seq, id, queue, priority, max_attempts, created_at, run_at, root_id\n",
        ),
        (
            "SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at FROM note, ins\n",
            "SELECT ins.id, ins.max_attempts, ins.created_at, ins.run_at, ins.root_id,\n"
            "    NULL::text AS orphan\nFROM note, ins\nUNION ALL\n"
            "SELECT NULL, NULL, NULL, NULL, NULL, o.parent_id FROM orphans AS o\n",
        ),
    )


SUBMIT_CHILD = with_parents(submit_text(SUBMIT_ONE), one=True)
SUBMIT_CHILDREN = with_parents(submit_text(SUBMIT_MANY), one=False)

# Children with partitions (no key): SUBMIT_CHILDREN with a ``partitions`` list,
# each task and delivery row in its partition; between the stream statements, as
# SUBMIT_PARTITIONED is (see store.pipelined), whose locks are then taken only if
# every parent is a task.
SUBMIT_PARTITIONED_CHILDREN = edited(
    SUBMIT_CHILDREN,
    (
        "%(correlation_ids)s::text[], %(parent_ids)s::text[]\n    )",
        "%(correlation_ids)s::text[], %(parent_ids)s::text[], %(partitions)s::text[]\n    )",
    ),
    (
        "correlation_id, parent_id, n)",
        "correlation_id, parent_id, partition, n)",
    ),
    (
        "SELECT r.id, r.name, r.queue, NULL, r.payload",
        "SELECT r.id, r.name, r.queue, r.partition, r.payload",
    ),
    (
        "RETURNING seq, id, queue, priority, max_attempts, created_at, run_at, root_id",
        "RETURNING seq, id, queue, partition, priority, max_attempts, created_at, run_at, root_id",
    ),
    ("i.queue, NULL, i.priority", "i.queue, i.partition, i.priority", 2),
)


__all__ = [
    "GATE",
    "SUBMIT_CHILD",
    "SUBMIT_CHILDREN",
    "SUBMIT_MANY",
    "SUBMIT_ONE",
    "SUBMIT_PARTITIONED",
    "SUBMIT_PARTITIONED_CHILDREN",
    "edited",
    "in_callers_transaction",
    "submit_text",
    "with_parents",
]
