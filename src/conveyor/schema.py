"""The tables: the single source of truth for the schema (protocol version 2).

Alembic revisions under ``conveyor/migrations`` create exactly these; a test
compares the migrated database with this module on both backends.

Design (see docs/internals.md, "How it works"):

* ``conveyor_tasks`` — immutable rows: what was submitted. ``seq`` is the
  submit order; ``id`` is the public, time-sortable identifier.
* ``conveyor_deliveries`` — all mutable state, one row per (task, consumer
  group); ``grp = ''`` is queue mode. Rows are written at submit time for queue
  mode and every active group of the queue (fan-out in the producer's own
  transaction, so no cursor can skip a late commit). ``queue``, ``partition``,
  ``priority`` and ``max_attempts`` are copied from the immutable task so the
  claim indexes never join.
* Partial indexes hold only claimable / leased rows, so claim and recovery cost
  does not grow with the finished history.
* ``conveyor_streams`` — one row per (queue, group, partition): the head of the
  ordered stream and when it became available, so a claim picks the fairest free
  stream by index and locks only that row.
* times are integer microseconds since the epoch on both backends, so the same
  SQL arithmetic (``now + lease``) runs everywhere.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    text,
)

PROTOCOL_VERSION = 2

metadata = MetaData()

# SQLite only auto-assigns INTEGER PRIMARY KEY columns; Postgres gets a BIGINT identity.
SeqType = BigInteger().with_variant(Integer(), "sqlite")

NAME = 255
ID = 26

meta = Table(
    "conveyor_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

tasks = Table(
    "conveyor_tasks",
    metadata,
    Column("seq", SeqType, primary_key=True, autoincrement=True),
    Column("id", String(ID), nullable=False, unique=True),
    Column("name", String(NAME), nullable=False),
    Column("queue", String(NAME), nullable=False),
    Column("partition", String(NAME), nullable=True),
    Column("payload", Text, nullable=False),
    Column("metadata", Text, nullable=False),
    Column("priority", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("backoff", Text, nullable=True),
    Column("created_at", BigInteger, nullable=False),
    Column("run_at", BigInteger, nullable=False),
    Column("key", String(NAME), nullable=True),
    Column("parent_id", String(ID), nullable=True),
    Column("root_id", String(ID), nullable=False),
    Column("correlation_id", String(NAME), nullable=True),
    # The id of the key payload and metadata are sealed with (NULL: stored plain;
    # see conveyor.encryption). A task of an encrypted queue has its results,
    # errors and progress messages sealed too; rekey finds what to seal again here.
    Column("key_id", String(64), nullable=True),
    # The task's tenant for flow control (``submit(concurrency_key=...)``): counted by
    # its queue's key_concurrency and key_rate, and the unit its fair claims take
    # turns between (NULL: no key; see conveyor.store.protocol.limits).
    Column("concurrency_key", String(NAME), nullable=True),
    sqlite_autoincrement=True,
)
# Every index here is paid by every submit (a task row is written once and never
# updated), so each one is here for a query that needs it (revision 0005 dropped or
# shrank the rest):
# list(queue=...) in submit order, and a new group's backfill (queue, seq ranges;
# its created_at >= start filter rides along: no (queue, created_at) index).
Index("ix_conveyor_tasks_queue_seq", tasks.c.queue, tasks.c.seq)
# list(name=...) in submit order.
Index("ix_conveyor_tasks_name_seq", tasks.c.name, tasks.c.seq)
# list(root_id=...) in submit order: a workflow's descendants. Only tasks with a
# parent (most have none, and are their own root): the listing reads the root itself
# by its id (revision 0007).
Index(
    "ix_conveyor_tasks_root_seq",
    tasks.c.root_id,
    tasks.c.seq,
    postgresql_where=text("parent_id IS NOT NULL"),
    sqlite_where=text("parent_id IS NOT NULL"),
)
# children(): most tasks have no parent and no correlation id, so these two hold
# only the rows that do. ``col = :x`` implies ``col IS NOT NULL`` to both planners
# (checked by tests/conformance/test_task_indexes.py), so lookups still use them.
Index(
    "ix_conveyor_tasks_parent",
    tasks.c.parent_id,
    postgresql_where=text("parent_id IS NOT NULL"),
    sqlite_where=text("parent_id IS NOT NULL"),
)
# list(correlation_id=...) in submit order.
Index(
    "ix_conveyor_tasks_correlation_seq",
    tasks.c.correlation_id,
    tasks.c.seq,
    postgresql_where=text("correlation_id IS NOT NULL"),
    sqlite_where=text("correlation_id IS NOT NULL"),
)

# rekey: the sealed tasks not under the current key, by key id. Only sealed rows
# (a plain task's key_id is NULL), so plain submits pay nothing for it.
Index(
    "ix_conveyor_tasks_key_id",
    tasks.c.key_id,
    tasks.c.seq,
    postgresql_where=text("key_id IS NOT NULL"),
    sqlite_where=text("key_id IS NOT NULL"),
)

deliveries = Table(
    "conveyor_deliveries",
    metadata,
    # conveyor_tasks.seq. No FOREIGN KEY (dropped by revision 0005): its check ran
    # a trigger and an index probe of the task row for every delivery row a submit
    # writes (~18 % of a batch submit's server time), to guard what the protocol
    # already guarantees: delivery rows are written only beside their task (in the
    # same statement or transaction), and the only delete of tasks (retention,
    # upkeep.py) deletes their delivery rows in the same transaction.
    Column("task_seq", SeqType, primary_key=True),
    Column("grp", String(NAME), primary_key=True),
    Column("queue", String(NAME), nullable=False),
    Column("partition", String(NAME), nullable=True),
    Column("priority", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("run_at", BigInteger, nullable=False),
    Column("lease_expires_at", BigInteger, nullable=True),
    Column("lease", Float, nullable=True),
    Column("worker_id", String(NAME), nullable=True),
    Column("started_at", BigInteger, nullable=True),
    Column("finished_at", BigInteger, nullable=True),
    Column("progress", Float, nullable=True),
    Column("progress_message", Text, nullable=True),
    Column("result", Text, nullable=True),
    Column("error", Text, nullable=True),
    # 1 once maintain() has added this finished row to conveyor_counts; 0 otherwise
    # (every queued or running row, and finished rows not yet counted).
    Column("rolled", SmallInteger, nullable=False, server_default=text("0")),
    # Task dependencies (queue mode only; NULL on every other row). On a waiting
    # child: how many of its parents (and, for a batch's callback, the batch's
    # open hold) are still unresolved; it is queued when this reaches 0. On a
    # parent: true once a child named it in ``after``, so only such a row's
    # terminal update runs the release (the trigger of revision 0017, whose WHEN
    # reads it: rows without dependents pay nothing).
    Column("waiting_on", Integer, nullable=True),
    Column("has_dependents", Boolean, nullable=True),
    # Copied from the task (revision 0018), so the flow-control claim counts and
    # picks by key from delivery indexes alone.
    Column("concurrency_key", String(NAME), nullable=True),
)
# Unordered claimable work: the claim reads this index in claim order and stops.
Index(
    "ix_conveyor_deliveries_ready",
    deliveries.c.grp,
    deliveries.c.queue,
    deliveries.c.priority.desc(),
    deliveries.c.run_at,
    deliveries.c.task_seq,
    postgresql_where=text("status = 'queued' AND partition IS NULL"),
    sqlite_where=text("status = 'queued' AND partition IS NULL"),
)
# Active rows of ordered streams: finding a stream's head is one index probe.
Index(
    "ix_conveyor_deliveries_stream",
    deliveries.c.grp,
    deliveries.c.queue,
    deliveries.c.partition,
    deliveries.c.task_seq,
    postgresql_where=text("status IN ('queued', 'running') AND partition IS NOT NULL"),
    sqlite_where=text("status IN ('queued', 'running') AND partition IS NOT NULL"),
)
# Leased rows only: lease recovery never reads finished work.
Index(
    "ix_conveyor_deliveries_leased",
    deliveries.c.grp,
    deliveries.c.queue,
    deliveries.c.lease_expires_at,
    postgresql_where=text("status = 'running'"),
    sqlite_where=text("status = 'running'"),
)
# Flow control (revision 0018, conveyor.store.protocol.limits): the ready
# unpartitioned rows by tenant, so a claim of a key-limited or fair queue finds
# the keys with work (a loose index scan) and each key's first rows in claim order
# by index, however many tasks one tenant has queued. Unkeyed rows are in it too:
# they are one tenant (the NULL key), found by ``concurrency_key IS NULL``.
Index(
    "ix_conveyor_deliveries_ready_key",
    deliveries.c.grp,
    deliveries.c.queue,
    deliveries.c.concurrency_key,
    deliveries.c.priority.desc(),
    deliveries.c.run_at,
    deliveries.c.task_seq,
    postgresql_where=text("status = 'queued' AND partition IS NULL"),
    sqlite_where=text("status = 'queued' AND partition IS NULL"),
)
# Leased keyed rows: a key-limited claim counts each key's running tasks here
# (what workers hold: few), never reading finished work.
Index(
    "ix_conveyor_deliveries_running_key",
    deliveries.c.grp,
    deliveries.c.queue,
    deliveries.c.concurrency_key,
    deliveries.c.lease_expires_at,
    postgresql_where=text("status = 'running' AND concurrency_key IS NOT NULL"),
    sqlite_where=text("status = 'running' AND concurrency_key IS NOT NULL"),
)
# Listing and counting by status. On Postgres, leased rows are left out of this
# index and the next (revision 0006): a claim's UPDATE writes a new version of
# every row it leases, with an entry in each index whose WHERE the new version
# meets, and these two entries were 25-45 % of a claim's server time (claim(100):
# 3.7-4.2 -> 1.9-2.9 ms, 59 -> 41 kB of WAL). Leased rows are read through
# ix_conveyor_deliveries_leased instead (few: what workers hold). SQLite keeps
# both whole: its planner uses a partial index only when the query names the
# index's WHERE term by term (``status = 'queued'`` does not prove
# ``status <> 'running'`` to it), and its claim's lease step probes this index.
Index(
    "ix_conveyor_deliveries_status",
    deliveries.c.grp,
    deliveries.c.queue,
    deliveries.c.status,
    deliveries.c.task_seq,
    postgresql_where=text("status <> 'running'"),
)
# Rows not rolled up into conveyor_counts: the active ones plus the recently
# finished (on Postgres, leased rows aside: see above). stats() counts these,
# the leased rows, and adds the rolled-up totals.
Index(
    "ix_conveyor_deliveries_unrolled",
    deliveries.c.queue,
    deliveries.c.grp,
    deliveries.c.status,
    postgresql_where=text("rolled = 0 AND status <> 'running'"),
    sqlite_where=text("rolled = 0"),
)
Index(
    "ix_conveyor_deliveries_finished",
    deliveries.c.queue,
    deliveries.c.finished_at,
    postgresql_where=text("finished_at IS NOT NULL"),
    sqlite_where=text("finished_at IS NOT NULL"),
)

streams = Table(
    "conveyor_streams",
    metadata,
    Column("queue", String(NAME), primary_key=True),
    Column("grp", String(NAME), primary_key=True),
    Column("partition", String(NAME), primary_key=True),
    Column("head_seq", BigInteger, nullable=True),
    Column("priority", Integer, nullable=True),
    Column("available_at", BigInteger, nullable=True),
    # A debounced queue's partition: not claimable before this moment (its newest
    # task's submit plus the queue's debounce), whatever its head (NULL: no wait).
    Column("quiet_until", BigInteger, nullable=True),
)
# Free streams in claim order (fairest first: priority, then the head that waited
# longest): a claim reads the streams it takes and stops, however many partitions
# the queue has (revision 0008; before, it read and sorted every free stream).
Index(
    "ix_conveyor_streams_available",
    streams.c.grp,
    streams.c.queue,
    streams.c.priority.desc(),
    streams.c.available_at,
    streams.c.partition,
    postgresql_where=text("available_at IS NOT NULL"),
    sqlite_where=text("available_at IS NOT NULL"),
)

counts = Table(
    "conveyor_counts",
    metadata,
    Column("queue", String(NAME), primary_key=True),
    Column("grp", String(NAME), primary_key=True),
    Column("status", String(16), primary_key=True),
    Column("n", BigInteger, nullable=False),
)

groups = Table(
    "conveyor_groups",
    metadata,
    Column("queue", String(NAME), primary_key=True),
    Column("name", String(NAME), primary_key=True),
    Column("start_at", BigInteger, nullable=True),
    Column("created_at", BigInteger, nullable=False),
    Column("active", Boolean, nullable=False),
)

# When each consumer group last leased something, per (queue, group): the
# ``last_claim_at`` of :meth:`TaskStore.groups`. Written after a claim that leased
# something, by a statement of its own and at most once a second per (queue,
# group) per store (so "to about a second"), never inside the claim: the claim
# leaves conveyor_groups alone (submits share its rows: the lock order) and its
# hot path pays one short upsert a second at most. Queue mode has no row.
group_claims = Table(
    "conveyor_group_claims",
    metadata,
    Column("queue", String(NAME), primary_key=True),
    Column("grp", String(NAME), primary_key=True),
    Column("claimed_at", BigInteger, nullable=False),
)

keys = Table(
    "conveyor_keys",
    metadata,
    Column("key", String(NAME), primary_key=True),
    # No foreign key: the key is claimed before its task row exists (that is what
    # makes concurrent submits of one key safe); retention deletes keys itself.
    Column("task_id", String(ID), nullable=False),
)
Index("ix_conveyor_keys_task", keys.c.task_id)

queues = Table(
    "conveyor_queues",
    metadata,
    Column("queue", String(NAME), primary_key=True),
    Column("lease", Float, nullable=True),
    Column("max_attempts", Integer, nullable=True),
    Column("backoff", Text, nullable=True),
    Column("retention", Float, nullable=True),
    Column("max_wait", Float, nullable=True),
    # False: the queue is consumed by groups only, so queue-mode state never holds
    # retention back (NULL means True).
    Column("queue_mode", Boolean, nullable=True),
    Column("updated_at", BigInteger, nullable=False),
    # The queue a task of this queue goes to when it fails for good or is evicted
    # (NULL: none).
    Column("dead_letter", String(NAME), nullable=True),
    # Seconds added to the run_at of a submit that gives neither delay nor run_at.
    Column("delay", Float, nullable=True),
    # The most tasks the queue may hold queued (queue mode); a submit beyond it
    # raises QueueFull (NULL: no limit).
    Column("max_depth", BigInteger, nullable=True),
    # Seconds of quiet: a partition's head is claimable only once its newest task
    # is this old; an unpartitioned task once it is itself (NULL: none).
    Column("debounce", Float, nullable=True),
    # True: the queue's values are stored sealed (conveyor.encryption); every submit
    # statement refuses to write a plain row to it (NULL means False).
    Column("encrypt", Boolean, nullable=True),
    # Flow control (revision 0018, conveyor.store.protocol.limits; NULL: no limit).
    # The most deliveries of the queue running at once, per group (queue mode is
    # one), and per concurrency key within that.
    Column("concurrency", Integer, nullable=True),
    Column("key_concurrency", Integer, nullable=True),
    # The most claims (starts) per ``rate_per`` seconds, per group; and per key.
    Column("rate_limit", Integer, nullable=True),
    Column("rate_per", Float, nullable=True),
    Column("key_rate_limit", Integer, nullable=True),
    Column("key_rate_per", Float, nullable=True),
    # True: claims take tasks round-robin across concurrency keys (NULL: False).
    Column("fair", Boolean, nullable=True),
)

# Rate limits' state (revision 0018): per (queue, group) (``scope`` 0, ``key``
# '') and per (queue, group, concurrency key) (``scope`` 1), the theoretical
# arrival time of the next claim in µs (the generic cell rate algorithm): a claim
# may start as many tasks as fit between it and now plus the rate's period. Read
# and written only by flow-controlled claims, which hold the queue's settings
# row meanwhile; a row whose time has passed means no more than no row, and
# maintain() deletes those.
rate_state = Table(
    "conveyor_rate_state",
    metadata,
    Column("queue", String(NAME), primary_key=True),
    Column("grp", String(NAME), primary_key=True),
    Column("scope", SmallInteger, primary_key=True),
    Column("key", String(NAME), primary_key=True),
    Column("tat", BigInteger, nullable=False),
)

maintenance = Table(
    "conveyor_maintenance",
    metadata,
    Column("id", SeqType, primary_key=True, autoincrement=True),
    Column("ran_at", BigInteger, nullable=False),
    Column("recovered", Integer, nullable=False),
    Column("expired", Integer, nullable=False),
    Column("evicted", Integer, nullable=False),
    Column("deleted", Integer, nullable=False),
    Column("duration", Float, nullable=False),
    sqlite_autoincrement=True,
)
Index("ix_conveyor_maintenance_ran_at", maintenance.c.ran_at)

# Periodic schedules of applications (``@app.periodic``): what each scheduler has
# handled so far. Every worker may run the scheduler; ticks are submitted under
# idempotency keys, and this row tells them which ticks are behind them.
schedules = Table(
    "conveyor_schedules",
    metadata,
    Column("name", String(NAME), primary_key=True),
    Column("task", String(NAME), nullable=False),
    Column("queue", String(NAME), nullable=False),
    # "cron */5 * * * * Europe/Paris" or "every 300": shown by `conveyor schedules`.
    Column("spec", Text, nullable=False),
    Column("catch_up", String(8), nullable=False),
    # Ticks at or before this moment are done with (submitted or skipped by policy).
    Column("handled_until", BigInteger, nullable=True),
    # The latest tick submitted, and its task.
    Column("last_tick", BigInteger, nullable=True),
    Column("last_task_id", String(ID), nullable=True),
    Column("next_tick", BigInteger, nullable=True),
    # First registration: a new schedule runs the ticks after it, none before.
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
)

# Finished tasks per minute (``minute`` = microseconds since the epoch // 60 s), per
# (queue, group, status): the dashboard's throughput plot. Filled by maintain()'s
# roll-up from the rows it folds into conveyor_counts (so the ack path writes
# nothing more), and pruned to the last day; the rows finished since the last
# roll-up are added at read time from the unrolled index.
throughput = Table(
    "conveyor_throughput",
    metadata,
    Column("queue", String(NAME), primary_key=True),
    Column("grp", String(NAME), primary_key=True),
    Column("minute", BigInteger, primary_key=True),
    Column("status", String(16), primary_key=True),
    Column("n", BigInteger, nullable=False),
)

# Finished attempts ever, per (queue, group, task name, terminal status): the
# source of monotonic Prometheus counters. Filled by the same roll-up; unlike
# conveyor_counts it is never decremented (retention and retry leave it alone),
# because it counts events, not rows.
totals = Table(
    "conveyor_totals",
    metadata,
    Column("queue", String(NAME), primary_key=True),
    Column("grp", String(NAME), primary_key=True),
    Column("name", String(NAME), primary_key=True),
    Column("status", String(16), primary_key=True),
    Column("n", BigInteger, nullable=False),
)

# Pending wait() calls, so a completion announces itself only when someone waits for
# it (Postgres: the NOTIFY of a finished task is sent only for task ids found here;
# an acknowledgement nobody waits for sends none). One row per (task, waiting store),
# written when a wait() starts and deleted when it returns; ``expires_at`` bounds
# what a crashed waiter leaves behind (expired rows are deleted by later
# registrations). An accelerator only: a waiter also polls.
waiters = Table(
    "conveyor_waiters",
    metadata,
    Column("task_id", String(ID), primary_key=True),
    Column("token", String(64), primary_key=True),
    Column("expires_at", BigInteger, nullable=False),
)

# Live workers: a running worker writes its row when it starts and again every
# few seconds (``seen_at``), and deletes it when it stops. A row is live until
# ``expires_at``; one left by a killed worker stops counting then, and the next
# write of any worker deletes it. A dashboard's view of who runs, busy or idle.
workers = Table(
    "conveyor_workers",
    metadata,
    Column("worker_id", String(NAME), primary_key=True),
    Column("queues", Text, nullable=False),  # a JSON list of the queue names
    Column("grp", String(NAME), nullable=False),  # '' = queue mode
    Column("concurrency", Integer, nullable=False),
    Column("host", String(NAME), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", BigInteger, nullable=False),
    Column("seen_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
)

# Paused queues and groups: while a row is here, claims of its queue (``grp``
# '': every consumer of the queue, queue mode and each group) or of that group
# alone lease nothing; submits go on. A table of its own, usually empty, so the
# claim's check is one probe of an empty index and pausing rewrites no row that
# submits or claims lock.
pauses = Table(
    "conveyor_pauses",
    metadata,
    Column("queue", String(NAME), primary_key=True),
    Column("grp", String(NAME), primary_key=True),
    Column("paused_at", BigInteger, nullable=False),
)

# Task dependencies: one row per (child, parent) edge, both by task seq. Written
# with the child, in its submit's transaction; ``resolved`` once the parent's
# queue-mode row reached a terminal status and the child was released or cancelled
# (a parent retried and finished again must not release it twice).
# ``run_on_failure``: the child is queued even when this parent did not succeed
# (``on_parent_failure="run"``, and every edge of a batch's callback).
dependencies = Table(
    "conveyor_dependencies",
    metadata,
    Column("task_seq", SeqType, primary_key=True),
    Column("parent_seq", SeqType, primary_key=True),
    Column("run_on_failure", Boolean, nullable=False),
    Column("resolved", Boolean, nullable=False),
)
# The release of a finished parent reads its edges by parent.
Index("ix_conveyor_dependencies_parent", dependencies.c.parent_seq)

# Batches (``store.batch()``): the callback task (a waiting task whose parents are
# the batch's tasks, held back by one more count while the batch is open) and
# whether it was closed. ``closed`` moves once, so the hold is released once.
batches = Table(
    "conveyor_batches",
    metadata,
    Column("id", String(ID), primary_key=True),
    Column("queue", String(NAME), nullable=False),
    Column("callback_seq", SeqType, nullable=False),
    Column("callback_id", String(ID), nullable=False),
    Column("closed", Boolean, nullable=False),
    Column("created_at", BigInteger, nullable=False),
)
