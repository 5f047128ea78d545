"""The statement catalogue: every named statement the protocol runs, with its
contract, which each dialect implements in its SQL files
(``store/<dialect>/sql/*.sql``, one ``-- name:`` block per statement).

A contract says what a statement is given (bind parameters, ``:name`` in the
files), what it returns (columns), what it locks and what it writes. The SQL of
each dialect is free in how it meets the contract (a data-modifying CTE on
Postgres; on SQLite, where one writer holds the whole database, a lock is the
write lock the transaction already holds; a script of several statements where
one will not do), never in what it does. Lists are bound as JSON arrays where the
contract says "JSON"; where it says "a list", the protocol gives a Python list,
which the dialect binds as its driver can: a Postgres array, or JSON text where
the statement reads it so (``json_each`` on SQLite: see
:meth:`conveyor.store.protocol.texts.Text.bind`). An announcement is the
dialect's: a NOTIFY sent at commit on Postgres; on SQLite the commit itself,
which other processes see move ``PRAGMA data_version``.

Two kinds of entry:

* :data:`STATEMENTS` — statements of the protocol, run by the role module named
  in the entry;
* :data:`HOOKS` — operation-level hooks of the seam, where the dialects' algorithms
  differ and not only their SQL (:meth:`conveyor.store.seam.Seam._claim`): a
  dialect's statements named ``<hook>.<part>`` serve only its own hook.

The catalogue test (``tests/dialect/test_catalogue.py``) fails when a dialect
lacks a statement or has one the catalogue does not name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Statement:
    """One named statement and its contract."""

    name: str
    #: The protocol module that runs it (``conveyor.store.protocol.<role>``).
    role: str
    #: Parameters, rows returned, locks taken, rows written.
    contract: str


_VIEW = "the columns of ``queries.view_columns`` (the task as the delivery sees it)"
_PLAIN = (
    "equal-length lists ``ids``, ``names``, ``queues``, ``payloads``, ``metadatas`` "
    "(JSON text), ``priorities``, ``max_attempts``, ``backoffs``, ``delays``, ``run_ats`` "
    "(µs), ``correlation_ids`` (``None`` entries: the queue's setting or the default; "
    "``None`` for a whole list of the last five: ``None`` for every task)"
)
_ONE = (
    "the singular ``id``, ``name``, ``queue``, ``payload``, ``metadata``, ``priority``, "
    "``max_attempts``, ``backoff``, ``delay``, ``run_at``, ``correlation_id``"
)
_STORED = "one row per task written: ``id``, ``max_attempts``, ``created_at``, ``run_at``"
_IN = (
    " Its ``_in`` variant is the same statement for a caller's transaction "
    "(``submit(..., connection=...)``): it announces whether or not anyone listens, "
    "holding no lock until the caller commits."
    " Like every submit statement but ``insert_rows``, it writes plain rows only: when "
    "a queue of its tasks is encrypted (``conveyor_queues.encrypt``) it writes no task "
    "and returns no row for any (conveyor.store.protocol.sealing)."
)
_ITEMS = (
    "``items``: one JSON array of ``[id, worker_id, grp, attempt, result]`` per item "
    "(``attempt`` null: any attempt; ``result`` the result's JSON text)"
)


def _s(name: str, role: str, contract: str) -> Statement:
    return Statement(name, role, " ".join(contract.split()))


STATEMENTS: tuple[Statement, ...] = (
    _s(
        "quiet_streams",
        "streams",
        """``pairs`` (a JSON array of ``[queue, partition]``), after a
        step-by-step submit wrote tasks there and recomputed their streams: the
        streams of those partitions (every group's) whose queue has a
        ``debounce`` get ``quiet_until`` now plus it, and ``available_at`` no
        sooner where it is set; no row of a queue without one changes.""",
    ),
    # --------------------------------------------------------------- depth
    _s(
        "depth_lock",
        "depth",
        """``queues`` (a JSON array): those of them with a ``max_depth``, their
        settings rows locked until commit in queue order (``queue``,
        ``max_depth``); no row for a queue without one.""",
    ),
    _s(
        "depth_count",
        "depth",
        """``queues`` (a JSON array): per queue (``queue``) its tasks queued in
        queue mode, delayed ones included (``n``), read after ``depth_lock``.""",
    ),
    # -------------------------------------------------------------- limits
    _s(
        "limits_lock",
        "limits",
        """``queues`` (a JSON array, sorted): the settings rows of the
        flow-controlled queues among them (a concurrency, key_concurrency, rate or
        key_rate, or fair), locked until commit in queue order: ``queue``,
        ``concurrency``, ``key_concurrency``, ``rate_limit``, ``rate_per``,
        ``key_rate_limit``, ``key_rate_per``, ``fair``, ``encrypt``; no row for
        the others.""",
    ),
    _s(
        "limits_running",
        "limits",
        """``queue``, ``grp``, read after ``limits_lock``: one row, the clock
        (``now``, µs), the rows of the queue in the group running with a lease
        not expired (``running``), whether a lease has expired (``expired``),
        whether the queue or the group is paused (``paused``), and the queue's
        rate state (``tat``, NULL: none).""",
    ),
    _s(
        "limits_keys",
        "limits",
        """``queue``, ``grp``: one row per concurrency key with queued
        unpartitioned rows there (``key``), with its rows running with a lease not
        expired (``running``), its rate state (``tat``) and last turn
        (``served``, NULL: none); one row with ``key`` NULL when some of those rows
        have no key (``running`` 0, ``served`` their turn); one index probe per
        key, whatever the rows per key.""",
    ),
    _s(
        "limits_pick",
        "limits",
        """``queue``, ``grp``, ``keys`` (a JSON array), ``unkeyed`` and
        ``per_key``: per key of ``keys`` (and of the rows without a key when
        ``unkeyed``) its first ``per_key`` queued, due unpartitioned rows in claim
        order (``key``, ``task_seq``, ``priority``, ``run_at``), reading no
        more.""",
    ),
    _s(
        "limits_lease",
        "limits",
        f"""``queue``, ``grp``, ``seqs`` (a JSON array), ``worker_id``,
        ``lease``: those of the rows ``seqs`` still queued leased as the claim
        hook leases; {_VIEW} of each.""",
    ),
    _s(
        "limits_spend",
        "limits",
        """``queue``, ``grp``, ``spends`` (a JSON array of ``[scope, key,
        tat]``): each rate state row set to its ``tat``, created where missing.""",
    ),
    _s(
        "limits_prune",
        "limits",
        """``keep_us``: the rate state rows whose ``tat`` is more than that
        before the clock deleted.""",
    ),
    # ---------------------------------------------------------------- keys
    _s(
        "claim_keys",
        "producer",
        """``keys`` and ``ids`` (JSON arrays, keys sorted by code
        point: the lock order): inserts each key for its task, in that order, leaving
        keys already held alone; a row (``key``) per key inserted.""",
    ),
    _s(
        "lock_keys",
        "producer",
        """``keys`` (a JSON array, sorted): locks the key rows
        that exist, in that order, until commit; their ``key`` and ``task_id``.""",
    ),
    _s(
        "key_holder",
        "submit_together",
        f"""``key``: {_VIEW} of the task holding it, in
        queue mode, its key row locked; no row when no task holds it.""",
    ),
    _s(
        "key_answers",
        "submit_together",
        f"""``ids`` and ``keys`` (lists): {_VIEW} of
        each task of ``ids`` with ``holds`` NULL, and of the task holding each of
        ``keys`` with ``holds`` its key.""",
    ),
    _s(
        "replace_share",
        "submit_together",
        """``queues`` (JSON array) and ``key``: the
        active group rows of those queues and of the key holder's queue shared, in the
        lock order.""",
    ),
    _s(
        "replace_lock",
        "submit_together",
        """``key``, ``id`` and ``pairs`` (JSON array of
        ``[queue, partition]``): the holder's streams and those of ``pairs``, in queue
        mode and every active group, locked in one pass in the lock order, created
        where missing.""",
    ),
    _s(
        "replace_cancel",
        "submit_together",
        """``key`` and ``id`` (the new task's): the
        holder the key row names, if not ``id``, has its active rows cancelled and a
        registered ``wait()`` told.""",
    ),
    _s(
        "replace_refresh",
        "submit_together",
        """``key`` and ``id``: the streams of the
        holder cancelled by ``replace_cancel`` recomputed.""",
    ),
    _s(
        "replace_key",
        "submit_together",
        """``key`` and ``id``: the key row names
        ``id``.""",
    ),
    # ------------------------------------------------------------- submits
    _s(
        "submit_context",
        "producer",
        """``queues`` (a list): the clock reading (``now``)
        and the stored settings (``queue``, ``max_attempts``, ``backoff``, ``delay``,
        ``encrypt``) of those queues; at least one row.""",
    ),
    _s(
        "insert_rows",
        "producer",
        """``rows``: one JSON array of ``[id, name, queue,
        partition, payload, metadata, priority, max_attempts, backoff, created_at,
        run_at, key, parent_id, root_id, correlation_id, key_id]`` in request order: the
        task rows, inserted in that order, and their delivery rows for queue mode and
        every active group of the queue (those whose ``start_at`` is not after the
        task's ``created_at``); no announcement. Returns the ``(queue, grp,
        partition, refused)`` of every stream the new delivery rows joined, once each
        (``refused`` false). A row without ``key_id`` (plain) whose queue is
        encrypted: nothing written, and one row with ``refused`` true.""",
    ),
    _s(
        "parent_roots",
        "producer",
        """``ids`` (a JSON array): the ``id`` and ``root_id`` of each
        of those that is a task.""",
    ),
    _s(
        "submit_plain",
        "producer",
        f"""Plain tasks (no key, partition or parent) in one
        statement, from {_PLAIN}: task rows, their delivery rows for queue mode and
        every active group of the queue (groups shared), and the new-work announcement
        of their queues. Returns {_STORED}.{_IN}""",
    ),
    _s("submit_one", "producer", f"""``submit_plain`` for one task, from {_ONE}.{_IN}"""),
    _s(
        "submit_sealed",
        "producer",
        f"""``submit_plain`` for tasks whose payload and metadata are sealed
        (conveyor.store.protocol.sealing), from {_PLAIN} and ``key_id``, the key they
        are all sealed with, written to each task row; whatever the queues' settings
        (a sealed row may go to any queue). Returns {_STORED}, and ``encrypt``: the
        setting of the task's queue (NULL: none).""",
    ),
    _s(
        "submit_sealed_one",
        "producer",
        f"""``submit_sealed`` for one task, from {_ONE} and ``key_id``.""",
    ),
    _s(
        "submit_children",
        "producer",
        """``submit_plain`` for tasks with parents (no key or
        partition), with ``parent_ids`` (``None`` entries: no parent): each child's
        ``root_id`` is its parent's root; each row also has ``root_id`` and ``orphan``
        (NULL). When a parent is not a task nothing is written and the rows are one
        per such parent, all NULL but ``orphan``, its id."""
        + _IN,
    ),
    _s(
        "submit_child",
        "producer",
        """``submit_children`` for one task, with
        ``parent_id``."""
        + _IN,
    ),
    _s(
        "submit_partitioned",
        "submit_together",
        """``submit_plain`` with a ``partitions``
        list (``None`` entries unpartitioned); run after ``share_groups`` and
        ``lock_streams`` of the queue-mode streams, before ``lock_group_streams`` and
        ``refresh_group_streams``."""
        + _IN,
    ),
    _s(
        "submit_partitioned_children",
        "submit_together",
        """``submit_children``'s
        parameters and ``partitions``; its rows as ``submit_children``'s; between
        ``lock_streams_if_parents`` and ``lock_group_streams_if_parents``."""
        + _IN,
    ),
    _s(
        "submit_keyed",
        "submit_together",
        f"""One task with a key (conflict ``"reuse"`` or
        ``"reject"``, no partition or parent), from {_ONE} and ``key``: the key
        claimed, the task written only if the claim won; then ``key_holder``.{_IN}""",
    ),
    _s(
        "submit_keyed_child",
        "submit_together",
        """``submit_child``'s parameters and
        ``key``: the key claimed only if the parent is a task, the task written only
        if the claim won; then ``key_holder``."""
        + _IN,
    ),
    _s(
        "submit_keyed_partitioned",
        "submit_together",
        """``submit_partitioned``'s
        parameters and ``keys`` (a list): each task written only if its key's row
        names it."""
        + _IN,
    ),
    _s(
        "submit_keyed_many",
        "submit_together",
        """``submit_plain``'s parameters and
        ``keys`` (a list, ``None`` for no key): each keyed task written only if its
        key's row names it."""
        + _IN,
    ),
    _s(
        "submit_key_owned",
        "submit_together",
        f"""From {_ONE} and ``key``: the task written
        only if the key's row names it (a replace).{_IN}""",
    ),
    # ------------------------------------------------------------- streams
    _s(
        "share_groups",
        "producer",
        """``queues`` (a JSON array): the active group rows of
        those queues shared (``FOR KEY SHARE``) in the lock order, until commit.""",
    ),
    _s(
        "lock_streams",
        "streams",
        """``keys`` (a JSON array of ``[queue, grp,
        partition]`` in the lock order): their stream rows locked in that order until
        commit, missing ones created.""",
    ),
    _s(
        "lock_streams_if_parents",
        "submit_together",
        """``lock_streams`` of the queue-mode
        streams of ``pairs``, only if every one of ``parent_ids`` is a task.""",
    ),
    _s(
        "lock_group_streams",
        "submit_together",
        """``pairs`` (a JSON array of ``[queue,
        partition]``): ``lock_streams`` of those streams in every active group of the
        queue.""",
    ),
    _s(
        "lock_group_streams_if_parents",
        "submit_together",
        """``lock_group_streams``, only
        if every one of ``parent_ids`` is a task.""",
    ),
    _s(
        "refresh_streams",
        "streams",
        """``keys`` (as ``lock_streams``): each stream's head,
        priority, availability and holder recomputed from its active rows
        (``streams.refresh``); rows ``available_at`` of the streams whose head is
        claimable now.""",
    ),
    _s(
        "refresh_group_streams",
        "submit_together",
        """``pairs``, after a submit wrote tasks there: ``refresh_streams`` of
        those streams in queue mode and every active group of the queue, and, on
        a queue with a ``debounce``, what ``quiet_streams`` writes (one statement
        of the submit sent together, not two).""",
    ),
    # -------------------------------------------------------------- groups
    _s(
        "note_group_claims",
        "groups",
        """``queues`` (a JSON array, sorted) and ``grp``: the group's
        ``conveyor_group_claims`` row of each queue set to the store's clock, created
        where missing and never moved back (an older reading leaves it alone), the
        rows written in the order of ``queues``; run by itself after a claim that
        leased something (never inside the claim), no row returned.""",
    ),
    # -------------------------------------------------------- dependencies
    _s(
        "mark_parents",
        "dependencies",
        """``seqs`` (a JSON array of task seqs, the parents a submit names): their
        queue-mode rows locked until commit in seq order (Postgres: ``FOR
        UPDATE``; SQLite: the write lock) and set ``has_dependents``; per row
        (``task_seq``, ``status``), the status as it is after the lock (a finish
        committed meanwhile is seen).""",
    ),
    _s(
        "link_edges",
        "dependencies",
        """``edges`` (a JSON array of ``[task_seq, parent_seq, run_on_failure,
        resolved]``): the rows of ``conveyor_dependencies`` inserted; nothing
        returned.""",
    ),
    # ---------------------------------------------------------------- acks
    _s(
        "succeed_plain",
        "acks",
        f"""One ``succeed()`` of an unpartitioned leased row,
        fenced (``id``, ``grp``, ``worker_id``, ``attempt`` or NULL), with ``result``
        (JSON text); announced to a registered ``wait()``. Returns {_VIEW} of the row
        finished, or no row (fence failed, or a partitioned row).""",
    ),
    _s(
        "ack_plain",
        "acks",
        f"""Finish a batch of unpartitioned leased rows as
        ``succeeded``, each fenced on its own, and announce the finished tasks to
        registered waiters. {_ITEMS}. At least one row: ``idx``, the 1-based position of
        each item not finished (fence failed, or a partitioned row); a single NULL row
        when all were.""",
    ),
    _s(
        "ack_streams_lock",
        "acks",
        f"""{_ITEMS}: the stream rows of the items'
        partitions locked in the lock order (run before ``ack_streams``).""",
    ),
    _s(
        "ack_streams",
        "acks",
        """``ack_plain`` for any rows, partitioned or not, each
        touched stream recomputed (``refresh_streams``) and new work announced where a
        head became claimable; ``idx`` as ``ack_plain``'s, plus ``freed`` (streams whose
        head is claimable now).""",
    ),
    _s(
        "task_views",
        "acks",
        f"""``ids`` (a JSON array) and ``grp``: {_VIEW} of each of
        those tasks that has a row in the group (no row for the others), each task
        found by its id and its row by the primary key.""",
    ),
)

#: The variants of the submits for a caller's transaction: each its own statement.
STATEMENTS += tuple(
    Statement(f"{s.name}_in", s.role, f"``{s.name}`` for a caller's transaction.")
    for s in STATEMENTS
    if s.contract.endswith(_IN.strip())
)

_NAMES = {s.name for s in STATEMENTS}

#: The seam's operation-level hooks, by name: where the dialects' algorithms differ
#: (not only their SQL). A dialect's statements named ``<hook>.<part>`` serve it.
HOOKS: dict[str, str] = {
    "wake": """The wake channel (``Seam._notify``, ``_add_waiter``, ``_drop_waiter``,
        ``_start_wake``): Postgres announces with ``wake.notify`` (``channels`` and
        ``payloads``, lists: one NOTIFY per pair at commit, a ``conveyor_done`` one
        only to registered waiters) and registers waiters with ``wake.waiter_add``
        (``task_id``, ``token``, ``ttl_us``; expired registrations dropped) and
        ``wake.waiter_drop``; SQLite's channel is its connection thread's
        ``data_version`` poll and needs no statement.""",
    "claim": " ".join(
        f"""``Seam._claim(ask)`` (``ask`` a ``seam.Claim``: ``grp``, ``queues``,
        ``worker_id``, ``lease``, ``limit``, ``partition``, ``per_stream``, ``flow``),
        its own transaction (``Seam._claim_in``: the caller's), in which the
        flow-controlled queues (conveyor.store.protocol.limits) lease nothing and
        are told to ``limits.claimed_from``, unless ``flow`` (then only the
        unpartitioned rows of key-limited or fair queues are left out): when a
        queue of ``queues`` is encrypted and the store has no keys, nothing leased
        or written and ``ConfigurationError`` raised
        (``sealing.claimed_from``, told the encrypted queues before any lease);
        when a lease of ``grp`` in ``queues`` has
        expired, nothing leased or written and ``None`` returned (the protocol
        recovers, ``upkeep.recover_tx``, and asks again); else the rows
        ``claim_order.claim_order`` chooses leased to the worker (running, attempt +
        1, lease set: ``lease`` seconds, or the queue's setting, else the default),
        the streams taken from marked held, and {_VIEW} of each returned in claim
        order. Concurrent claims never lease one row twice nor wait for each other.
        One round trip (Postgres: ``claim.one`` / ``claim.any``, their ``_durable``
        variants with ``durable_claims=True``) or one connection-thread hop (SQLite:
        ``claim.candidates`` per queue, ``claim.lease``, ``claim.view``,
        ``claim.hold``).""".split()
    ),
}


def names() -> list[str]:
    """Every catalogue statement's name, sorted."""
    return sorted(s.name for s in STATEMENTS)


def by_name() -> dict[str, Statement]:
    """The catalogue by statement name."""
    return {s.name: s for s in STATEMENTS}
