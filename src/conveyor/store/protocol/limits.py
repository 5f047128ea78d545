"""Flow control: per-queue concurrency and rate limits, per-key limits and fair
claims (``configure_queue(q, concurrency=, key_concurrency=, rate=, key_rate=,
fair=)``), enforced in the database for every worker of every process and host.

Units. ``concurrency`` counts a queue's deliveries running with a lease not
expired, per (queue, group): queue mode is one group, each consumer group
another. ``key_concurrency`` counts the same per concurrency key
(``submit(..., concurrency_key=...)``, one key per task, copied to its delivery
rows); tasks without a key are not limited by it. ``rate`` and ``key_rate``
(:class:`conveyor.Rate`) count claims (starts), per (queue, group) and per key:
the generic cell rate algorithm, its state one row per scope in
``conveyor_rate_state`` (the theoretical arrival time, µs), so a claim may
start up to ``limit`` tasks after a quiet period, then one per ``per / limit``
seconds. ``fair`` makes a claim take tasks round-robin across keys: the first
ready task of every key, then every key's second, and so on, the keys served
least recently first (their last turn is kept as scope 2 of the same table),
tasks without a key being one more key. One key serves all three.

How a claim stays within the limits, whatever claims of other processes
interleave with it:

1. The claim statements of both dialects (the claim hook) read the queues'
   settings rows anyway; a flow-controlled queue leases nothing there, and the
   hook hands its name to :func:`claimed_from`. Queues without limits pay one
   more look at a row the statement reads already.
2. The store then takes this module's path (:func:`claim`), and takes it at once
   for queues it last saw flow-controlled (``Seam._limited``): in one
   transaction it locks the settings rows of the flow-controlled queues among
   those claimed (``limits_lock``: ``FOR UPDATE`` in queue order on Postgres,
   the write lock on SQLite), so their claims run one after another; then, in
   statements of their own (on Postgres's READ COMMITTED each sees every claim
   committed before the lock was granted), it counts what runs
   (``limits_running``, ``limits_keys``), computes the budget, leases up to it
   and spends the rates (``limits_spend``) before it commits.
3. Of a key-limited or fair queue, the unpartitioned rows are picked here by key
   (``limits_keys``, ``limits_pick``, ``limits_lease``); everything else (the
   streams of partitioned tasks, the rows of a queue limited as a whole) is
   leased by the claim hook itself inside the same transaction
   (:meth:`~conveyor.store.seam.Seam._claim_in`, ``flow`` set), given the
   budget as its limit. A concurrency key cannot go with a partition (refused
   at submit), so stream tasks are counted by the queue's limits only.

A lease that expires frees its slot: only leases not expired are counted (and a
claim that meets an expired lease recovers it first, as every claim does).
Limits apply to the claims that start after ``configure_queue`` returns; a claim
whose statement began before it may still lease without them.

The order of a claim of several queues, some flow-controlled: the others' tasks
first (in claim order), then each flow-controlled queue's, in the order asked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from conveyor import _values as v
from conveyor.store.protocol import sealing, texts
from conveyor.store.protocol import transactions as tx
from conveyor.store.seam import Claim, Seam

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: ``conveyor_rate_state.scope``: a queue's rate, a key's rate, a key's last turn.
QUEUE_RATE, KEY_RATE, TURN = 0, 1, 2
#: The key under which scope 2 keeps the last turn of the tasks without a key.
UNKEYED = ""


def claimed_from(st: Seam, queues: Iterable[str], limited: Iterable[str]) -> None:
    """What a claim hook tells after reading ``queues``' settings: those of them
    ``limited`` (flow-controlled) leased nothing, and their claims take this
    module's path from now on; the others no longer do."""
    held = set(limited)
    for queue in queues:
        if queue in held:
            st._limited.add(queue)
        else:
            st._limited.discard(queue)


def learn(st: Seam, queue: str, settings: dict[str, Any]) -> None:
    """After ``configure_queue``: remember whether ``queue`` is flow-controlled."""
    limited = any(
        settings[name] for name in ("concurrency", "key_concurrency", "rate", "key_rate", "fair")
    )
    claimed_from(st, [queue], [queue] if limited else [])


def tokens(tat: int | None, now: int, limit: int, per: float) -> int:
    """How many claims a rate of ``limit`` per ``per`` seconds allows at ``now``
    (µs), its state ``tat`` (``None``: never spent)."""
    interval = per * v.US / limit
    base = now if tat is None or tat < now else tat
    return max(0, min(limit, math.floor((now + per * v.US - base) / interval + 1e-9)))


def spent(tat: int | None, now: int, limit: int, per: float, n: int) -> int:
    """The rate's state after ``n`` more claims at ``now``."""
    base = now if tat is None or tat < now else tat
    return base + round(n * per * v.US / limit)


def keyed(conf: Any) -> bool:
    """Whether a queue's settings pick its unpartitioned rows by key."""
    return conf.key_concurrency is not None or conf.key_rate_limit is not None or bool(conf.fair)


async def claim(st: Seam, ask: Claim) -> list[Any] | None:
    """Claim for ``ask`` (some of its queues flow-controlled) within every limit,
    in one transaction: the leased rows (the task view), or ``None`` when a lease
    of these queues has expired (nothing leased: the caller recovers first)."""
    return await tx.run(st, lambda conn: claim_tx(st, conn, ask))


async def claim_tx(st: Seam, conn: AsyncConnection, ask: Claim) -> list[Any] | None:
    """:func:`claim` inside the caller's transaction."""
    built = texts.on(st, conn)
    names = list(ask.queues)
    locked = await texts.execute(conn, st, built["limits_lock"], {"queues": sorted(names)})
    settings = {row.queue: row for row in locked}
    claimed_from(st, names, settings)
    taken: list[Any] = []
    free = [queue for queue in names if queue not in settings]
    if free:
        # Queues without limits: the claim hook, as any claim (it leaves out, and
        # tells of, a queue that became flow-controlled since the lock above).
        rows = await st._claim_in(conn, replace(ask, queues=free, flow=False))
        if rows is None:
            return None
        taken += rows
    for queue in names:
        left = ask.limit - len(taken)
        if left <= 0:
            break
        conf = settings.get(queue)
        if conf is None:
            continue
        rows = await _claim_limited(st, conn, built, replace(ask, queues=[queue], limit=left), conf)
        if rows is None:
            return None
        taken += rows
    return taken


async def _claim_limited(
    st: Seam, conn: AsyncConnection, built: texts.Texts, ask: Claim, conf: Any
) -> list[Any] | None:
    """The claim of one flow-controlled queue (``ask.queues``' only one), its
    settings row ``conf`` locked: up to the budget its limits leave."""
    queue, grp = conf.queue, ask.grp
    base = {"queue": queue, "grp": grp}
    state = (await texts.execute(conn, st, built["limits_running"], base)).one()
    if state.expired:
        return None
    if state.paused:
        return []
    now = int(state.now)
    budget = ask.limit
    if conf.concurrency is not None:
        budget = min(budget, conf.concurrency - int(state.running))
    if conf.rate_limit is not None:
        budget = min(budget, tokens(state.tat, now, conf.rate_limit, conf.rate_per))
    if budget <= 0:
        return []
    # Raises when this store has no keys and the queue is encrypted: nothing leased.
    sealing.claimed_from(st, [queue], [queue] if conf.encrypt else [])
    rows: list[Any] = []
    if keyed(conf) and ask.partition is None:
        rows = await _by_key(st, conn, built, ask, conf, budget, now)
    if len(rows) < budget:
        more = await st._claim_in(conn, replace(ask, limit=budget - len(rows), flow=True))
        if more is None:
            return None
        rows += more
    if rows and conf.rate_limit is not None:
        tat = spent(state.tat, now, conf.rate_limit, conf.rate_per, len(rows))
        spend = {**base, "spends": json.dumps([[QUEUE_RATE, "", tat]])}
        await texts.execute(conn, st, built["limits_spend"], spend)
    return rows


async def _by_key(
    st: Seam,
    conn: AsyncConnection,
    built: texts.Texts,
    ask: Claim,
    conf: Any,
    budget: int,
    now: int,
) -> list[Any]:
    """Up to ``budget`` unpartitioned rows of a key-limited or fair queue, leased:
    each key within its own limits, round-robin across keys where ``fair``, else
    in claim order; each key's rate and turn spent."""
    base = {"queue": conf.queue, "grp": ask.grp}
    keys = list(await texts.execute(conn, st, built["limits_keys"], base))
    caps: dict[str | None, int] = {}
    for row in keys:
        cap = budget
        if row.key is not None:
            if conf.key_concurrency is not None:
                cap = min(cap, conf.key_concurrency - int(row.running))
            if conf.key_rate_limit is not None:
                cap = min(cap, tokens(row.tat, now, conf.key_rate_limit, conf.key_rate_per))
        if cap > 0:
            caps[row.key] = cap
    if not caps:
        return []
    wanted = {
        **base,
        "keys": json.dumps(sorted(key for key in caps if key is not None)),
        "unkeyed": None in caps,
        "per_key": budget,
    }
    found: dict[str | None, list[Any]] = {}
    for row in await texts.execute(conn, st, built["limits_pick"], wanted):
        found.setdefault(row.key, []).append(row)
    served = {row.key: row.served for row in keys}
    ranked: list[tuple[Any, ...]] = []
    for key, rows in found.items():
        rows.sort(key=lambda r: (-r.priority, r.run_at, r.task_seq))
        for n, row in enumerate(rows[: caps[key]]):
            order: tuple[Any, ...] = (-row.priority, row.run_at, row.task_seq)
            if conf.fair:
                # Round by round; in a round, the keys whose last turn is oldest
                # (never served first), then claim order.
                last = served.get(key)
                order = (n, -1 if last is None else int(last), *order)
            ranked.append((order, key, int(row.task_seq)))
    ranked.sort()
    chosen = ranked[:budget]
    if not chosen:
        return []
    seqs = [seq for _, _, seq in chosen]
    lease = {**base, "seqs": json.dumps(seqs), "worker_id": ask.worker_id, "lease": ask.lease}
    result = await texts.execute(conn, st, built["limits_lease"], lease)
    leased = {int(row.seq): row for row in result}
    taken = [key for _, key, seq in chosen if seq in leased]
    await _spend_keys(st, conn, built, base, conf, keys, taken, now)
    return [leased[seq] for seq in seqs if seq in leased]


async def _spend_keys(
    st: Seam,
    conn: AsyncConnection,
    built: texts.Texts,
    base: dict[str, Any],
    conf: Any,
    keys: Sequence[Any],
    taken: list[str | None],
    now: int,
) -> None:
    """Spend each key's rate for its tasks ``taken``, and note its turn (fair)."""
    if not taken:
        return
    counts: dict[str | None, int] = {}
    for key in taken:
        counts[key] = counts.get(key, 0) + 1
    tats = {row.key: row.tat for row in keys}
    spends: list[list[Any]] = []
    for key, n in sorted(counts.items(), key=lambda item: item[0] or ""):
        if key is not None and conf.key_rate_limit is not None:
            tat = spent(tats.get(key), now, conf.key_rate_limit, conf.key_rate_per, n)
            spends.append([KEY_RATE, key, tat])
        if conf.fair:
            spends.append([TURN, UNKEYED if key is None else key, now])
    if spends:
        spend = {**base, "spends": json.dumps(spends)}
        await texts.execute(conn, st, built["limits_spend"], spend)


async def prune_tx(st: Seam, conn: AsyncConnection, keep_s: float) -> None:
    """Delete the rate state that no longer limits anything: rows whose time passed
    more than ``keep_s`` seconds ago (a fair queue's turns older than that are
    forgotten: every key then counts as never served, which is fair again)."""
    built = texts.on(st, conn)
    await texts.execute(conn, st, built["limits_prune"], {"keep_us": round(keep_s * v.US)})
