"""The three collectors in reader threads, with one lifecycle: configure, start, stop.

A `Reader` is configured with a factory and connects nothing until `start()`, which builds a
`Source` (one collector and the loop that reads it) and runs it in a daemon thread that puts
what it reads on the monitor's queue. The factory reads the positions the writer has committed,
so a reader started again resumes exactly where the store stands. `stop()` ends the loop,
`join()` waits for the thread and closes the collector.

Failures are loud, never a monitor that looks alive with a dead reader:
- a collector's own error (purged binlog, access refused: `FATAL`) ends the monitor with exit
  code 3, since a person has to act;
- any other exception is a bug. It is logged once with its traceback and put on the queue as
  `ReaderFailed`, behind everything the reader had read (so the writer applies those first and
  the checkpoint is exact), the collector's `up` is 0 on /metrics and its failures are counted,
  and the monitor starts the reader again from the checkpoint after a backoff
  (RESTART_BACKOFF_SECONDS, doubling). A reader that fails MAX_FAILURES times within
  FAILURE_WINDOW_SECONDS ends the monitor with exit code 1 (`ReaderFailedError`).
Why a restart and not an exit at once: one transient bug must not stop a monitor meant to run
for months, and a restart from the checkpoint loses and doubles nothing. Why bounded: a bug
that strikes again at once (a record that always fails) would otherwise loop forever while
the pages and metrics go stale behind a "restarting" label.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from oncewatch.collectors.binlog import BinlogCollector, BinlogError, bootstrap
from oncewatch.collectors.cdc import CdcCollector
from oncewatch.collectors.kafka_events import EventBatch, KafkaEventCollector, KafkaEventsError
from oncewatch.collectors.kafka_offsets import KafkaOffsetsCollector
from oncewatch.core.config import MySQLConfig
from oncewatch.core.records import CdcCopy, Heartbeats, OffsetsSnapshot, Transaction

log = logging.getLogger("oncewatch.monitor.readers")


class BootstrapInterruptedError(BinlogError):
    """The first bootstrap failed mid-way: a consistent snapshot cannot be resumed, so the monitor stops and
    its next start empties the store and bootstraps again."""


FATAL = (BinlogError, KafkaEventsError)
MAX_FAILURES = 3
FAILURE_WINDOW_SECONDS = 600.0
RESTART_BACKOFF_SECONDS = 1.0


@dataclass(frozen=True)
class ReaderFailed:
    """Put on the queue by a reader whose loop raised; everything it read before is ahead of it."""

    reader: str
    error: BaseException
    at: float

    @property
    def fatal(self) -> bool:
        return isinstance(self.error, FATAL)


Item = Transaction | CdcCopy | Heartbeats | EventBatch | OffsetsSnapshot | ReaderFailed


class ReaderFailedError(RuntimeError):
    """A reader kept failing on an unexpected error: a bug; the log has its tracebacks."""


class Source(Protocol):
    """One collector and the loop that reads it."""

    def items(self, stop: threading.Event) -> Iterator[Item]:
        """What is read, until `stop` is set."""

    def alive_at(self) -> float | None:
        """When the loop last showed life (a read, a poll that returned, a server heartbeat)."""

    def health(self) -> dict[str, Any]:
        """The collector's status for the health row."""

    def stop(self) -> None: ...

    def close(self) -> None: ...


class BinlogSource:
    """Reads the binlog collector; after a transaction, pauses while `ahead()` says the binlog is read far
    past Kafka, for PAUSE_SECONDS at most at a time: a binlog dump the monitor does not read for
    longer than the server's net_write_timeout (60 s by default) is dropped by the server."""

    PAUSE_SECONDS = 20.0

    def __init__(self, collector: BinlogCollector, ahead: Callable[[], bool]):
        self.collector = collector
        self._ahead = ahead
        self._paused_at: float | None = None  # alive while paused, though nothing is read

    def items(self, stop: threading.Event) -> Iterator[Item]:
        for tx in self.collector.transactions():
            yield tx
            until = time.monotonic() + self.PAUSE_SECONDS
            while self._ahead() and time.monotonic() < until and not stop.is_set():
                self._paused_at = time.time()
                stop.wait(0.2)

    def alive_at(self) -> float | None:
        return max(filter(None, (self.collector.status.last_alive, self._paused_at)), default=None)

    def health(self) -> dict[str, Any]:
        return self.collector.status.as_dict()

    def stop(self) -> None:
        self.collector.stop()

    def close(self) -> None:
        self.collector.close()


class CdcSource:
    """Reads the CDC collector: CDC source mode's change source, in the binlog reader's place, with the connector's
    heartbeats behind the transactions handed on before them (the change clock), or (`copies`) in check mode its
    transactions as `CdcCopy`s, to be checked against the binlog's (whose clock the server's binlog end gives)."""

    def __init__(self, collector: CdcCollector, copies: bool = False):
        self.collector = collector
        self.copies = copies

    def items(self, stop: threading.Event) -> Iterator[Item]:
        for tx in self.collector.transactions(idle=True):
            if tx is not None:
                yield CdcCopy(tx) if self.copies else tx
            beats = self.collector.take_heartbeats()
            if beats and not self.copies:
                yield Heartbeats(tuple(beats))

    def alive_at(self) -> float | None:
        return self.collector.status.last_alive

    def health(self) -> dict[str, Any]:
        return self.collector.health()

    def stop(self) -> None:
        self.collector.stop()

    def close(self) -> None:
        self.collector.close()


class BootstrapSource:
    """The watched tables' rows, chunk by chunk, in the binlog reader's place until the tail can start
    (at the snapshot's position, which the last chunk carries); then it waits to be replaced."""

    def __init__(self, cfg: MySQLConfig):
        self.cfg = cfg
        self.rows = 0
        self.table = ""
        self.done = False
        self._alive: float | None = None

    def items(self, stop: threading.Event) -> Iterator[Item]:
        self._alive = time.time()
        try:
            for chunk in bootstrap(self.cfg):
                self._alive = time.time()
                self.rows += len(chunk.rows)
                self.table = chunk.rows[-1].qualified_table if chunk.rows else self.table
                yield chunk
        except Exception as exc:  # noqa: BLE001 - any failure ends this bootstrap; the message says what next
            raise BootstrapInterruptedError(
                f"the bootstrap of the watched tables stopped after {self.rows} rows ({type(exc).__name__}: {exc}); "
                f"start the monitor again: it empties its new store and bootstraps from a new snapshot") from exc
        self.done = True
        while not stop.wait(1.0):
            self._alive = time.time()

    def alive_at(self) -> float | None:
        return self._alive

    def health(self) -> dict[str, Any]:
        return {"connected": True, "bootstrapping": not self.done, "bootstrap_rows": self.rows,
                "bootstrap_table": self.table, "rows_read": self.rows, "transactions_read": 0,
                "last_alive": self._alive, "reconnects": 0}

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


class KafkaEventsSource:
    """Polls the events collector, leaving unread the partitions `ahead()` names: read far past the binlog."""

    def __init__(self, collector: KafkaEventCollector, ahead: Callable[[], frozenset[str]]):
        self.collector = collector
        self._ahead = ahead
        self._alive: float | None = None

    def items(self, stop: threading.Event) -> Iterator[Item]:
        while not stop.is_set():
            self._alive = time.time()
            batch = self.collector.poll(timeout_ms=500, max_records=2000, hold=self._ahead())
            if batch.events or batch.quarantined or batch.positions_changed:
                yield batch

    def alive_at(self) -> float | None:
        return self._alive

    def health(self) -> dict[str, Any]:
        return self.collector.status.as_dict()

    def stop(self) -> None:
        pass

    def close(self) -> None:
        self.collector.close()


class OffsetsSource:
    """Takes an offsets snapshot every `every` seconds."""

    def __init__(self, collector: KafkaOffsetsCollector, every: float):
        self.collector = collector
        self._every = every
        self._alive: float | None = None
        self.last: OffsetsSnapshot | None = None

    def items(self, stop: threading.Event) -> Iterator[Item]:
        while not stop.is_set():
            self.last = self.collector.snapshot()
            self._alive = time.time()
            yield self.last
            stop.wait(self._every)

    def alive_at(self) -> float | None:
        return self._alive

    def health(self) -> dict[str, Any]:
        return self.last.to_dict() if self.last is not None else {}

    def stop(self) -> None:
        pass

    def close(self) -> None:
        self.collector.close()


class Reader:
    """One collector in its own thread; see the module docstring for what a failure does."""

    def __init__(self, name: str, factory: Callable[[], Source], put: Callable[[Item, threading.Event], None]):
        self.name = name
        self._factory = factory
        self._put = put
        self.source: Source | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._recent: list[float] = []  # failure times inside the window
        self.failures = 0
        self.last_failure: str | None = None
        self.restart_at: float | None = None

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._stop = threading.Event()
        self.source = self._factory()
        self.restart_at = None
        self._thread = threading.Thread(target=self._run, args=(self.source, self._stop), name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.source is not None:
            self.source.stop()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
        if self.source is not None:
            self.source.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.restart_at is None

    # -------------------------------------------------------------- failures

    def _run(self, source: Source, stop: threading.Event) -> None:
        try:
            for item in source.items(stop):
                self._put(item, stop)
            if stop.is_set():
                return
            raise RuntimeError(f"the {self.name} reader's loop ended on its own")
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none ends the thread silently
            failure = ReaderFailed(self.name, exc, time.time())
            extra = {"reader": self.name, "error": f"{type(exc).__name__}: {exc}"}
            if failure.fatal:  # the message says what to do; a traceback would only hide it
                log.error("source refused the reader", extra={"event": "reader_refused", **extra})
            else:
                log.error("reader failed", exc_info=True, extra={"event": "reader_failed", **extra})
            self._put(failure, stop)

    def failed(self, failure: ReaderFailed) -> None:
        """Count a failure and schedule the restart; ReaderFailedError once the budget is spent."""
        self.failures += 1
        self.last_failure = f"{type(failure.error).__name__}: {failure.error}"
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

    def health(self) -> dict[str, Any]:
        """The reader's side of the collector's health row."""
        return {"running": self.running, "failures": self.failures, "last_failure": self.last_failure,
                "alive_at": self.source.alive_at() if self.source else None, "restart_at": self.restart_at}


def running_source(readers: dict[str, Reader], name: str) -> Any:
    """The source of reader `name` while that reader runs (None if it is missing, stopped or restarting)."""
    reader = readers.get(name)
    return reader.source if reader is not None and reader.running else None
