"""``conveyor worker APP --processes N``: a supervisor over N worker processes.

Each child is a full worker (``conveyor worker APP`` with the same options),
with its own store, connections and event loop, so N processes use N cores.
The supervisor does no task work itself:

* it starts the N children and watches them;
* a child that dies while the supervisor is not stopping (crash, ``kill -9``,
  out of memory) is started again after a backoff: 1 s, doubling up to 30 s,
  back to 1 s once a child has stayed up for a minute. Its leased tasks are not
  lost: their leases run out and they are recovered like any crashed worker's;
* a child that exits with a usage error (code 2: a group that is not
  subscribed, say) is not started again, since it would fail the same way: the
  supervisor stops the others and exits with that code;
* SIGTERM or SIGINT is passed on to every child as SIGTERM: each stops
  claiming, finishes its tasks within its grace period and hands the rest back.
  A second signal is passed on too, cutting the children's grace period short;
* when every child has stopped it exits 0.

Children run in their own session, so a Ctrl-C in the terminal reaches them once
(through the supervisor), not twice. Each child watches its parent and stops
gracefully if the supervisor itself disappears (:func:`watch_parent`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

log = logging.getLogger("conveyor.worker.supervisor")

BACKOFF_FIRST = 1.0  # seconds before the first restart of a child
BACKOFF_MAX = 30.0
STABLE_AFTER = 60.0  # a child up this long resets its backoff
USAGE_ERROR = 2  # the CLI's exit code for bad input or usage: restarting cannot help
TICK = 0.1  # how often the supervisor looks at its children


@dataclass
class _Slot:
    """One of the N places a child runs in."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restart_at: float = 0.0  # monotonic time the next start is due
    backoff: float = BACKOFF_FIRST
    restarts: int = 0


@dataclass
class Supervisor:
    """Runs ``processes`` children; see the module docs. ``command(index)`` is the
    argv of the child in slot ``index`` (0 to ``processes - 1``), so each child
    can get options of its own (a metrics port, say)."""

    command: Callable[[int], Sequence[str]]
    processes: int
    env: dict[str, str] | None = None
    backoff_first: float = BACKOFF_FIRST
    backoff_max: float = BACKOFF_MAX
    _slots: list[_Slot] = field(default_factory=list)
    _signals: int = 0
    _forwarded: int = 0
    _exit: int = 0

    def run(self) -> int:
        """Supervise until stopped by a signal and every child has exited; 0, or a
        child's usage error code (see the module docs)."""
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        self._slots = [_Slot(index=i) for i in range(self.processes)]
        log.info("supervisor %d: starting %d worker processes", os.getpid(), self.processes)
        try:
            while True:
                self._forward_signals()
                now = time.monotonic()
                for slot in self._slots:
                    self._look_after(slot, now)
                if self._signals and all(slot.proc is None for slot in self._slots):
                    break
                time.sleep(TICK)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._kill_leftovers()
        log.info("supervisor %d: all worker processes stopped", os.getpid())
        return self._exit

    def stop(self) -> None:
        """Stop as a SIGTERM would (for embedding and tests)."""
        self._signals += 1

    def children(self) -> list[int]:
        """The pids of the children running now."""
        return [s.proc.pid for s in self._slots if s.proc is not None]

    # ------------------------------------------------------------ internals
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only count here; the loop forwards (no I/O inside a signal handler).
        self._signals += 1

    def _forward_signals(self) -> None:
        while self._forwarded < self._signals:
            self._forwarded += 1
            how = "stopping" if self._forwarded == 1 else "cutting the grace period short"
            log.info("supervisor %d: %s; passing SIGTERM on", os.getpid(), how)
            for slot in self._slots:
                if slot.proc is not None and slot.proc.poll() is None:
                    try:
                        slot.proc.send_signal(signal.SIGTERM)
                    except ProcessLookupError:  # exited meanwhile; reaped below
                        pass

    def _look_after(self, slot: _Slot, now: float) -> None:
        if slot.proc is not None:
            code = slot.proc.poll()
            if code is None:
                return
            slot.proc = None
            if self._signals:
                log.info("worker process %d exited with code %d", slot.index, code)
                return
            if code == USAGE_ERROR:
                log.error(
                    "worker process %d exited with a usage error (code %d): not restarting "
                    "it; stopping the others",
                    slot.index,
                    code,
                )
                self._exit = code
                self._signals += 1
                return
            up = now - slot.started
            if up >= STABLE_AFTER:
                slot.backoff = self.backoff_first
            slot.restart_at = now + slot.backoff
            log.warning(
                "worker process %d exited unexpectedly with code %d after %.1f s; "
                "restarting it in %g s",
                slot.index,
                code,
                up,
                slot.backoff,
            )
            slot.backoff = min(slot.backoff * 2, self.backoff_max)
            slot.restarts += 1
            return
        if not self._signals and now >= slot.restart_at:
            self._start(slot, now)

    def _start(self, slot: _Slot, now: float) -> None:
        argv = list(self.command(slot.index))
        # A session of its own: a terminal's Ctrl-C goes to the supervisor only,
        # which passes it on once.
        slot.proc = subprocess.Popen(argv, env=self.env, start_new_session=True)
        slot.started = now
        log.info("worker process %d started: pid %d", slot.index, slot.proc.pid)

    def _kill_leftovers(self) -> None:
        # Only reached with children alive if the loop itself failed.
        for slot in self._slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()
                slot.proc.wait()


def watch_parent(parent_pid: int, interval: float = 1.0) -> threading.Thread:
    """In a child: send ourselves SIGTERM (a graceful stop) once ``parent_pid``
    is no longer our parent, i.e. the supervisor died without passing a signal on."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        log.warning("the supervisor (pid %d) is gone; stopping", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="conveyor-parent-watch", daemon=True)
    thread.start()
    return thread


__all__ = ["Supervisor", "watch_parent"]
