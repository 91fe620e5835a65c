"""The running monitor: collectors in reader threads, one writer that feeds the engine and the store.

Reader threads only read (the binlog collector, the Kafka collectors) and put what they read
on one bounded queue. The main thread is the store's only writer: it takes a batch off the
queue, feeds the engine, and writes records, engine state, findings and *both* checkpoints in
one store transaction (DESIGN §7), so a kill -9 at any instant resumes with nothing lost and
nothing doubled. Health of every part is written to the store for /metrics and the pages.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from collectors.binlog import BinlogCollector, BinlogError, bootstrap
from oncewatch.config import Config, ConfigError
from oncewatch.records import BinlogPosition, RowChange, Transaction
from oncewatch.store import Batch, Store

log = logging.getLogger("oncewatch.monitor")

BINLOG_CHECKPOINT = "binlog"
QUEUE_SIZE = 256
BATCH_SECONDS = 0.2
HEALTH_SECONDS = 1.0


class MonitorError(RuntimeError):
    """The monitor cannot go on; the message says why and what to do."""


class SourceUnavailableError(MonitorError):
    """A source cannot be reached or refuses the monitor's account at start-up."""


REQUIRED_BINLOG_SETTINGS = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
                            "binlog_row_metadata": "FULL"}


def preflight_mysql(cfg: Config) -> None:
    """Check, before reading anything, that the server is reachable, lets the monitor in, has the
    binlog settings the collector relies on and has every watched table."""
    import pymysql

    from collectors.binlog import connect

    m = cfg.mysql
    try:
        conn = connect(m)
    except pymysql.err.OperationalError as exc:
        code = exc.args[0] if exc.args else None
        if code == 1045:
            raise SourceUnavailableError(
                f"MySQL at {m.host}:{m.port} refused user {m.user!r} (wrong password or no such account); "
                f"check mysql.password_env / mysql.password_file") from exc
        raise SourceUnavailableError(f"cannot reach MySQL at {m.host}:{m.port} ({exc.args[-1]}); check "
                                     f"mysql.host and mysql.port and that the server runs") from exc
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN (%s, %s, %s, %s)",
                        tuple(REQUIRED_BINLOG_SETTINGS))
            found = {k.lower(): str(v).upper() for k, v in cur.fetchall()}
            for name, want in REQUIRED_BINLOG_SETTINGS.items():
                if found.get(name) != want:
                    raise SourceUnavailableError(f"MySQL at {m.host}:{m.port} has {name}={found.get(name)}; "
                                                 f"oncewatch needs {name}={want} (see README)")
            for table in m.tables:
                schema, name = table.split(".")
                try:
                    cur.execute(f"SELECT 1 FROM `{schema}`.`{name}` LIMIT 0")
                except pymysql.err.MySQLError as exc:
                    raise ConfigError(f"mysql.tables: {table} does not exist or user {m.user!r} may not "
                                      f"SELECT it ({exc.args[-1]})") from exc
    finally:
        conn.close()


@dataclass
class _Fatal:
    error: BaseException


@dataclass
class Progress:
    """What the writer has committed so far, for --until-idle and the health row."""

    last_change_at: float = field(default_factory=time.time)
    binlog_time: float = 0.0
    transactions: int = 0
    rows: int = 0


def entity_keys_of_row(row: RowChange) -> list[str]:
    """Drill-down index entries of a row: its table's primary key, for now."""
    return [f"pk:{row.qualified_table}:{'/'.join(str(v) for v in row.pk)}"]


class Monitor:
    """Runs until `stop()` (or until idle, for batch audits)."""

    def __init__(self, cfg: Config, store: Store | None = None):
        self.cfg = cfg
        self.store = store or Store(cfg.store.path)
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=QUEUE_SIZE)
        self._stop = threading.Event()
        self.progress = Progress()
        self.binlog: BinlogCollector | None = None
        self.started_at = time.time()

    def stop(self) -> None:
        self._stop.set()
        if self.binlog:
            self.binlog.stop()

    # -------------------------------------------------------------- start-up

    def ensure_binlog_start(self) -> BinlogPosition:
        """The checkpoint, or a fresh bootstrap of the watched tables when there is none."""
        saved = self.store.checkpoint(BINLOG_CHECKPOINT)
        if saved is not None:
            return BinlogPosition.from_dict(saved)
        return self.bootstrap()

    def bootstrap(self) -> BinlogPosition:
        log.info("bootstrapping watched tables", extra={"event": "bootstrap_start",
                                                         "tables": list(self.cfg.mysql.tables)})
        with self.store.batch() as tx:
            snap = bootstrap(self.cfg.mysql, on_rows=lambda rows: self._write_rows(tx, rows))
            tx.set_checkpoint(BINLOG_CHECKPOINT, snap.position.to_dict())
        log.info("bootstrap done", extra={"event": "bootstrap_done", "gtid": snap.position.gtid})
        return snap.position

    # -------------------------------------------------------------- readers

    def _binlog_reader(self, start: BinlogPosition) -> None:
        self.binlog = BinlogCollector(self.cfg.mysql, start)
        if self._stop.is_set():
            return
        try:
            for tx in self.binlog.transactions():
                self._put(tx)
        except BinlogError as exc:
            self._put(_Fatal(exc))

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self.queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    # -------------------------------------------------------------- writer

    def _write_rows(self, tx: Batch, rows: list[RowChange] | tuple[RowChange, ...]) -> None:
        tx.add_row_changes(rows, [(i, k) for i, r in enumerate(rows) for k in entity_keys_of_row(r)])

    def _apply(self, items: list[Any]) -> None:
        last_position: BinlogPosition | None = None
        with self.store.batch() as tx:
            for item in items:
                if isinstance(item, Transaction):
                    if item.rows:
                        self._write_rows(tx, item.rows)
                        self.progress.last_change_at = time.time()
                    self.progress.transactions += 1
                    self.progress.rows += len(item.rows)
                    self.progress.binlog_time = item.commit_time
                    last_position = item.position
            if last_position is not None:
                tx.set_checkpoint(BINLOG_CHECKPOINT, last_position.to_dict())

    def _drain_queue(self) -> list[Any]:
        items: list[Any] = []
        deadline = time.monotonic() + BATCH_SECONDS
        while len(items) < QUEUE_SIZE:
            try:
                items.append(self.queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return items

    def _write_health(self) -> None:
        if self.binlog:
            self.store.set_health("binlog", self.binlog.status.as_dict())
        self.store.set_health("monitor", {"started_at": self.started_at, "pid": os.getpid(),
                                          "binlog_time": self.progress.binlog_time,
                                          "caught_up": self.caught_up()})

    def caught_up(self) -> bool:
        """True when the binlog has been read to the server's current end."""
        b = self.binlog
        if b is None or not b.status.connected or b.status.last_position is None:
            return False
        try:
            server = b.current_server_position()
        except Exception:  # noqa: BLE001 - a server we cannot ask is not caught up with
            return False
        return server.gtid == b.status.last_position.gtid

    def run(self, until_idle: float | None = None, on_tick: Callable[[], None] | None = None) -> None:
        preflight_mysql(self.cfg)
        start = self.ensure_binlog_start()
        reader = threading.Thread(target=self._binlog_reader, args=(start,), name="binlog-reader", daemon=True)
        reader.start()
        last_health = 0.0
        try:
            while not self._stop.is_set():
                items = self._drain_queue()
                fatal = next((i for i in items if isinstance(i, _Fatal)), None)
                if fatal:
                    raise fatal.error
                if items:
                    self._apply(items)
                now = time.time()
                if now - last_health >= HEALTH_SECONDS:
                    self._write_health()
                    last_health = now
                    if until_idle is not None and now - self.progress.last_change_at >= until_idle \
                            and self.queue.empty() and self.caught_up():
                        break
                if on_tick:
                    on_tick()
        finally:
            self.stop()
            reader.join(timeout=10)
            self._write_health()
