"""The running parts in reader threads, each driven through the one lifecycle of oncewatch.core.protocol.Part.

A `Reader` is configured with a factory and connects nothing until `start()`, which builds its part (a
collector: the binlog tail, the bootstrap, the CDC reader, the Kafka events or the offsets poller) and runs
`part.start()` then `part.items(stop)` in a daemon thread that puts what it reads on the monitor's queue. The
factory reads the positions the writer has committed, so a reader started again resumes exactly where the store
stands. `stop()` ends the loop, `join()` waits for the thread and closes the part.

Failures are loud, never a monitor that looks alive with a dead reader:
- a part's own error (purged binlog, access refused: `FATAL`) ends the monitor with exit
  code 3, since a person has to act;
- any other exception is a bug. It is logged once with its traceback and put on the queue as
  `ReaderFailed`, behind everything the reader had read (so the writer applies those first and
  the checkpoint is exact). The part's `up` is 0 on /metrics and its failures are counted at once, not once the
  writer reaches that item (a judge behind, its queue full, took 9 s on a loaded machine), and the monitor starts
  the reader again from the checkpoint after a backoff (RESTART_BACKOFF_SECONDS, doubling). A reader that fails
  MAX_FAILURES times within FAILURE_WINDOW_SECONDS ends the monitor with exit code 1 (`ReaderFailedError`).
Why a restart and not an exit at once: one transient bug must not stop a monitor meant to run
for months, and a restart from the checkpoint loses and doubles nothing. Why bounded: a bug
that strikes again at once (a record that always fails) would otherwise loop forever while
the pages and metrics go stale behind a "restarting" label.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from oncewatch.collectors.binlog import BinlogError
from oncewatch.collectors.kafka_events import KafkaEventsError
from oncewatch.core.protocol import Item, Part, ReaderFailed, ReaderHealth
from oncewatch.monitor.remote import remote_traceback

log = logging.getLogger("oncewatch.monitor.readers")

FATAL = (BinlogError, KafkaEventsError)
MAX_FAILURES = 3
FAILURE_WINDOW_SECONDS = 600.0
RESTART_BACKOFF_SECONDS = 1.0


class ReaderFailedError(RuntimeError):
    """A reader kept failing on an unexpected error: a bug; the log has its tracebacks."""


class Reader:
    """One part in its own thread; see the module docstring for what a failure does."""

    def __init__(self, name: str, factory: Callable[[], Part], put: Callable[[Item, threading.Event], None]):
        self.name = name
        self._factory = factory
        self._put = put
        self.part: Part | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._recent: list[float] = []  # failure times inside the window
        self.failures = 0  # counted by the reader's thread as it fails, for /metrics at once
        self.last_failure: str | None = None
        self.failing = False  # this start's part has failed: not running, whether or not its thread has ended
        self.restart_at: float | None = None
        self.started_at = 0.0
        self.seen_alive_at: float | None = None  # when the monitor first saw this start's part alive (`live_for`)

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._stop = threading.Event()
        self.part = self._factory()
        self.restart_at, self.failing = None, False
        self.started_at, self.seen_alive_at = time.time(), None
        self._thread = threading.Thread(target=self._run, args=(self.part, self._stop), name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.part is not None:
            self.part.stop()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
        if self.part is not None:
            self.part.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.restart_at is None and not self.failing

    def live_for(self, now: float) -> float:
        """Seconds since the monitor first saw this start's part alive (0 before): a reader in a process of its own
        starts reading seconds after it was started, and until then it has struck no bug and read nothing, though
        it may already count as caught up (placed at the ends it was checkpointed at)."""
        alive = self.part.alive_at() if self.part is not None else None
        if self.seen_alive_at is None and alive is not None and alive >= self.started_at:
            self.seen_alive_at = now
        return 0.0 if self.seen_alive_at is None else now - self.seen_alive_at

    # -------------------------------------------------------------- failures

    def _run(self, part: Part, stop: threading.Event) -> None:
        try:
            part.start()
            for item in part.items(stop):
                self._put(item, stop)
            if stop.is_set():
                return
            raise RuntimeError(f"the {self.name} reader's loop ended on its own")
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none ends the thread silently
            failure = ReaderFailed(self.name, exc, time.time(), fatal=isinstance(exc, FATAL))
            self.failures += 1
            self.last_failure, self.failing = f"{type(exc).__name__}: {exc}", True
            extra = {"reader": self.name, "error": self.last_failure}
            if failure.fatal:  # the message says what to do; a traceback would only hide it
                log.error("source refused the reader", extra={"event": "reader_refused", **extra})
            elif (trace := remote_traceback(exc)) is not None:  # its frames are in the reader's process
                log.error("reader failed", extra={"event": "reader_failed", **extra, "exc": trace.splitlines()[-1],
                                                  "traceback": trace})
            else:
                log.error("reader failed", exc_info=True, extra={"event": "reader_failed", **extra})
            self._put(failure, stop)

    def failed(self, failure: ReaderFailed) -> None:
        """Schedule the restart after a failure (counted as it struck); ReaderFailedError once the budget is spent."""
        self._recent = [t for t in self._recent if failure.at - t < FAILURE_WINDOW_SECONDS] + [failure.at]
        if len(self._recent) >= MAX_FAILURES:
            raise ReaderFailedError(
                f"the {self.name} reader failed {len(self._recent)} times within {FAILURE_WINDOW_SECONDS:.0f} s, "
                f"last with {self.last_failure}; this is a bug: please report it with the log, which has the "
                f"tracebacks (the store is consistent: `oncewatch run` resumes from its checkpoint)") from failure.error
        self.restart_at = failure.at + RESTART_BACKOFF_SECONDS * 2 ** (len(self._recent) - 1)
        log.warning("restarting reader from the checkpoint", extra={
            "event": "reader_restart_scheduled", "reader": self.name, "in_seconds": self.restart_at - failure.at,
            "failures_in_window": len(self._recent)})

    def restart_if_due(self, now: float) -> bool:
        """True when it restarted the reader now."""
        if self.restart_at is None or now < self.restart_at:
            return False
        self.join(timeout=10)
        self.start()
        log.info("reader restarted", extra={"event": "reader_restarted", "reader": self.name})
        return True

    def health(self) -> ReaderHealth:
        """The reader's side of its part's health row."""
        cpu = getattr(self.part, "cpu_seconds", None)  # a part read in a process of its own says what it used
        return ReaderHealth(running=self.running, failures=self.failures, last_failure=self.last_failure,
                            alive_at=self.part.alive_at() if self.part else None, restart_at=self.restart_at,
                            cpu_seconds=cpu() if cpu is not None else None)


def running_part(readers: dict[str, Reader], name: str) -> Part | None:
    """The part of reader `name` while that reader runs (None if it is missing, stopped or restarting)."""
    reader = readers.get(name)
    return reader.part if reader is not None and reader.running else None
