"""The ``conveyor`` command line.

Commands::

    conveyor migrate                      apply the schema migrations, print the revision
    conveyor worker MODULE:APP            run a worker for an App (blocks until SIGINT/SIGTERM)
    conveyor submit NAME                  submit a task
    conveyor get ID                       show one task
    conveyor list                         list tasks, a page at a time
    conveyor cancel ID                    cancel a task
    conveyor retry ID                     queue a failed, cancelled, evicted or skipped task again
    conveyor tasks retry|cancel|purge     act on every task a filter selects (--dry-run)
    conveyor stats                        counts, oldest claimable age, group lag per queue
    conveyor groups list                  the consumer groups of each queue
    conveyor groups seek QUEUE GROUP      replay or skip a group's tasks from a point (--to)
    conveyor workers                      the live workers, busy or idle, and what they hold
    conveyor schedules                    periodic tasks with their last and next run
    conveyor demo                         a self-contained tour on a throwaway SQLite file
    conveyor dashboard                    the web dashboard (extra ``web``)

Every command takes ``--url`` (default ``$CONVEYOR_URL``, else the App's URL
for the commands that load an App, else ``sqlite:///conveyor.db``: the rule of
:func:`conveyor.connect.choose_url`); the data commands take ``--json`` to print
JSON for programs instead of tables for people.

Exit codes:

    0  success
    1  not found (no such task, for queue mode or the group); also any other
       failure, such as the demo's ordering check or an unexpected error
    2  bad input or usage (malformed JSON, invalid argument, unknown option)
    3  conflict: a task with this idempotency key exists (``submit --conflict reject``),
       or the task's state leaves it unchanged (``retry`` of a task that has not
       failed, ``cancel`` of a finished one), or the queue holds its ``max_depth``
       of queued tasks (``submit``)
    4  database unavailable, or a configuration error (bad URL, missing driver,
       a role or database the server does not have)
    5  protocol mismatch: the database was written by an incompatible conveyor
    6  no conveyor schema in this database, or an older one: the read-only
       commands and the dashboard never create or migrate it (``conveyor migrate``)
  130  interrupted

Errors are one line on stderr, ``error: ...`` followed by a hint; set
``CONVEYOR_DEBUG=1`` to let unexpected errors raise with their traceback.
"""

from __future__ import annotations

from conveyor.cli import bulk as _bulk  # noqa: F401
from conveyor.cli import dashboard as _dashboard  # noqa: F401
from conveyor.cli import demo as _demo  # noqa: F401
from conveyor.cli import groups as _groups  # noqa: F401

# Importing the command modules registers their commands on `cli`, in this order.
from conveyor.cli import queues as _queues  # noqa: F401
from conveyor.cli import schedules as _schedules  # noqa: F401
from conveyor.cli import tasks as _tasks  # noqa: F401
from conveyor.cli import worker as _worker  # noqa: F401
from conveyor.cli import workers as _workers  # noqa: F401
from conveyor.cli._common import CliError, cli
from conveyor.cli.main import main, run

__all__ = ["CliError", "cli", "main", "run"]
