"""A store with something of everything in it, for the dashboard's tests."""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.store.base import TaskStore


@dataclass
class Seeded:
    """Ids of the seeded tasks, by what they show."""

    queued: str
    running: str
    succeeded: str
    failed: str
    cancelled: str
    evicted: str
    parent: str
    child: str
    blocked_partition: str
    retry_partition: str


TRACEBACK = """Traceback (most recent call last):
  File "/srv/shop/tasks/mail.py", line 31, in send_email
    smtp.send_message(message)
  File "/usr/lib/python3.11/smtplib.py", line 341, in connect
    self.sock = self._get_socket(host, port, self.timeout)
ConnectionError: smtp.example.com refused the connection
"""


async def seed(store: TaskStore, *, history: bool = False) -> Seeded:
    """Tasks in every status on queue ``emails``, a group, streams blocked for each
    reason, a parent with a child, and finished work for the throughput plot
    (``history``: an hour of it, minute by minute, and two more groups of
    ``emails`` it left behind: ``search`` stalled, ``billing`` lagging)."""
    if history:
        # Two groups of emails that the hour of history left behind: one has not
        # claimed since (stalled), one still claims (lagging, below).
        store.clock_offset = -3600.0
        await store.subscribe("emails", "search", start="new")
        await store.subscribe("emails", "billing", start="new")
        store.clock_offset = 0.0
        await _history(store)
    await store.configure_queue("emails", max_attempts=2, lease=60)
    await store.configure_queue("reports", max_wait=0.5)
    await store.subscribe("emails", "analytics", start="all")

    succeeded = await store.submit("send_email", {"to": "a@example.com"}, queue="emails")
    failed = await store.submit("send_email", {"to": "b@example.com"}, queue="emails")
    running = await store.submit("send_email", {"to": "c@example.com"}, queue="emails")
    # Claimed one by one, in a known order.
    for task in (succeeded, failed, running):
        claimed = await store.claim("emails", worker_id="worker-a", limit=1)
        assert [c.id for c in claimed] == [task.id]
    await store.succeed(succeeded.id, worker_id="worker-a", result={"sent": True})
    error = {
        "type": "ConnectionError",
        "code": "exception",
        "message": "smtp.example.com refused the connection",
        "traceback": TRACEBACK,
    }
    await store.fail(failed.id, worker_id="worker-a", error=error, retryable=False)
    await store.progress(running.id, worker_id="worker-a", progress=0.4, message="rendering")

    queued = await store.submit("send_email", {"to": "d@example.com"}, queue="emails", key="k-d")
    cancelled = await store.submit("send_email", {"to": "e@example.com"}, queue="emails")
    await store.cancel(cancelled.id)
    parent = await store.submit("build_report", {"month": "2026-10"}, queue="emails")
    child = await store.submit("render_page", {"page": 1}, queue="emails", parent=parent)

    evicted = await store.submit("nightly", queue="reports")
    store.clock_offset = 5.0
    await store.maintain()  # evicts, and rolls finished rows up
    store.clock_offset = 0.0

    # Streams: one held by a lease, one waiting for a retry.
    held = await store.submit("sync", {"n": 1}, queue="orders", partition="cust-1")
    await store.submit("sync", {"n": 2}, queue="orders", partition="cust-1")
    await store.claim("orders", worker_id="worker-b", partition="cust-1")
    await store.submit("sync", {"n": 1}, queue="orders", partition="cust-2")
    await store.claim("orders", worker_id="worker-b", partition="cust-2")
    page = await store.list(queue="orders", partition="cust-2")
    await store.fail(page.items[0].id, worker_id="worker-b", error="timeout", delay=600)
    await store.submit("sync", {"n": 2}, queue="orders", partition="cust-2")
    await store.submit("sync", {"n": 1}, queue="orders", partition="cust-3")
    assert held.partition == "cust-1"
    if history:
        [late] = await store.claim("emails", worker_id="worker-c", group="billing")
        await store.succeed(late.id, worker_id="worker-c", group="billing")

    return Seeded(
        queued=queued.id,
        running=running.id,
        succeeded=succeeded.id,
        failed=failed.id,
        cancelled=cancelled.id,
        evicted=evicted.id,
        parent=parent.id,
        child=child.id,
        blocked_partition="cust-1",
        retry_partition="cust-2",
    )


async def _history(store: TaskStore) -> None:
    """An hour of finished work on ``emails`` and ``orders``, minute by minute (the
    store's clock is moved back for it), then rolled up as maintain() would."""
    for minutes_ago in range(58, 0, -1):
        store.clock_offset = -60.0 * minutes_ago
        for queue, n in (("emails", 4 + (minutes_ago * 7) % 9), ("orders", 2 + minutes_ago % 4)):
            await store.submit_many(
                [{"name": "send_email" if queue == "emails" else "sync", "queue": queue}] * n
            )
            held = await store.claim(queue, worker_id="worker-h", limit=n)
            failing = held[:1] if minutes_ago % 5 == 0 else []
            for task in failing:
                await store.fail(task.id, worker_id="worker-h", error="timeout", retryable=False)
            await store.succeed_many(
                [{"task_id": t.id, "worker_id": "worker-h"} for t in held if t not in failing]
            )
    store.clock_offset = 0.0
    await store.maintain()
