"""The store: one protocol, written once, over two dialects.

How to read it (five minutes)::

    base.py          TaskStore: the public API (producer, bus, settings, upkeep)
    api_leases.py    its consumer half: claim, heartbeat, succeed, fail, acks
    api_reads.py     its reads for dashboards and metrics
    api_admin.py     bus mode, queue settings and upkeep
    api_workers.py   its live-worker records: announce_worker, retire_worker
    api_bulk.py      its bulk actions by filter: retry_where, cancel_where,
                     purge_where
    api_internal.py  store.internal: what conveyor's worker, scheduler and CLI
                     need beyond the public API (not covered by semver)
        │  validates arguments, then calls one protocol function per operation
        ▼
    protocol/        the protocol, one module per role (imports no dialect):
      transactions     open, migrate, one transaction per call, retries, clock
      refusals         what opening refuses: a login the server turned down,
                       conveyor tables no revision records
      texts            named statements: loaded, built once, run (alone, in a
                       transaction, or several sent together)
      queries          statements written once in SQLAlchemy Core (cold paths)
      requests         submit requests validated before anything is written
      producer         submit: keys, fan-out to groups, streams, the answers
      submit_together  submits whose statements go to the server together
      submit_runs      large plain batches sent in runs
      caller_conn      a caller's connection checked (submit(connection=...))
      caller_tx        a submit in the caller's transaction
      withdraw         cancel and retry
      bulk             retry, cancel and purge by filter, in batches
      consumer         claim, and the lease holder's fenced writes
      claim_order      which tasks a claim takes, in which order (stated once)
      acks             succeed_many / ack_many
      streams          the FIFO state machine of partitions; the lock order
      groups           consumer groups: subscribe, backfill, unsubscribe, the
                       claim's check that its group exists, its claim time
      health           consumer groups' lag, oldest claimable age, last claim
                       and state (ok, lagging, stalled)
      sealing          encryption at rest: what is sealed, the fail-closed rule,
                       what a store remembers (keys, encrypted queues, held tasks)
      rekey            sealing again under the current key, in batches
      upkeep           recovery, eviction, retention, counts, maintain()
      stats            stats(): one statement, one snapshot
      observed         the throughput and totals roll-ups
      schedules        the periodic tasks' schedule rows
      presence         the live workers' rows
      codec            rows to tasks, cursors
      wake             in-process wake-ups
        │  runs named statements and calls the seam
        ▼
    seam.py          Seam: what a dialect supplies (clock, locking, probe, error
                     classification, connections and runners, the wake channel,
                     the SQL of each catalogue statement, the hooks)
    catalogue.py     every named statement and its contract; the hooks
        ▲
        │  implemented by
    sqlite/          SQLiteStore (store.py), its connections' set-up: pragmas,
                     BEGIN, the fair wait for the write lock (connection.py),
                     its connection thread (thread.py), its claim hook
                     (claim.py), its statements (sql/*.sql)
    postgres/        PostgresStore (store.py), kept driver connections
                     (direct.py), LISTEN/NOTIFY (listen.py), its claim hook
                     (claim.py), its statements (sql/*.sql)

The rules that keep it one protocol:

* Protocol modules never import a dialect, and never ask which dialect runs
  them: they run catalogue statements by name and call seam methods
  (import-linter contracts in ``pyproject.toml``).
* Each dialect's SQL lives in its ``sql/*.sql`` files, one ``-- name:`` block
  per statement, read once per process and built once per store at ``open()``.
  No SQL is made by editing other SQL: a variant is a statement of its own.
* Both dialects implement every statement of :mod:`.catalogue`, and
  ``tests/dialect/test_catalogue.py`` holds the files to it. A statement runs on
  the caller's connection too (``submit(..., connection=...)``), rebuilt once in
  the style of the caller's driver (``texts.on``).
* Where the algorithm must differ, not only the SQL, the seam has one
  operation-level hook (``catalogue.HOOKS``), with a contract both dialects are
  tested against.
* The lock order, for every transaction that takes row locks: idempotency
  keys, then group rows (shared), then stream rows in (group, queue, partition)
  order, then delivery rows (see :mod:`.protocol.streams`).
"""
