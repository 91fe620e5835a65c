"""Tails a MariaDB binlog and hands on committed transactions as `RowChange` records.

The collector reads and never decides. It buffers the rows of each transaction and hands
them on at its commit (XID, or a standalone DDL), together with the GTID position right
after it: the caller stores both in one store transaction and passes that position back on
restart, so resuming is exact at a transaction boundary. A transaction of more than
`fragment_rows` rows is handed on in fragments of about that many (memory holds one
fragment, whatever the transaction's size), each with a position inside the transaction
that says how many of its rows are handed on: a resume from it skips those rows.

MariaDB resumes by GTID (pymysqlreplication ignores file/pos with `is_mariadb=True`,
LIBRARY-NOTES). The library would reconnect on its own after a lost connection and replay
from the GTID set the stream was *opened* with (after a day of running, the day's binlog,
every row of it decoded), silently: that reconnect is switched off here, so a lost
connection reaches `transactions()`, which counts it, shows the gap and rebuilds the stream
from the last handed-on position with capped backoff (`status()`). Should a transaction come
again all the same, the collector skips any whose GTID sequence it has already handed on,
without decoding its rows; `status().events_read` counts every event the server sent. Only a
lost connection or an error the server sent (`TRANSPORT_ERRORS`) means reconnect: anything
else is a bug and goes to the caller, which must not take it for an outage.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader, binlogstream
from pymysqlreplication.event import (HeartbeatLogEvent, MariadbGtidEvent, QueryEvent, RotateEvent,
                                      XidEvent)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from oncewatch.collectors.row_images import RowImages
from oncewatch.core.config import MySQLConfig
from oncewatch.core.gtids import gtid_set, gtid_text
from oncewatch.core.protocol import BinlogStatus, BootstrapStatus
from oncewatch.core.names import UNDECODABLE, UNPARSEABLE
from oncewatch.core.tables import is_pattern
from oncewatch.core.records import (CLOCK_BINLOG_HEADER, CLOCK_READ_TIME, CLOCK_ROW_COLUMN, OP_DELETE, OP_INSERT,
                                    OP_UPDATE, BinlogPosition, Packed, QuarantinedRows, RowChange,
                                    SchemaChange, Transaction)

log = logging.getLogger("oncewatch.collectors.binlog")

# MariaDB: "Could not find GTID state requested by slave in any binlog files" and friends.
ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236
ER_GTID_POSITION_NOT_FOUND_IN_BINLOG = 1945
ER_GTID_POSITION_NOT_FOUND_IN_BINLOG2 = 1955
PURGED_CODES = {ER_MASTER_FATAL_ERROR_READING_BINLOG, ER_GTID_POSITION_NOT_FOUND_IN_BINLOG,
                ER_GTID_POSITION_NOT_FOUND_IN_BINLOG2}
ACCESS_DENIED_CODES = {1045, 1044, 1142, 1227}
# What a dropped or refused connection raises, from PyMySQL or the socket under it.
TRANSPORT_ERRORS = (pymysql.err.MySQLError, OSError, EOFError)
# Rows held before a transaction is handed on in fragments: a few MB of decoded rows.
FRAGMENT_ROWS = 2000

# The library's own reconnect (on these client error codes, in BinLogStreamReader.fetchone) replays from the stream's
# opening GTID and tells no one; with none listed, the error is raised and `transactions()` reconnects from the
# last position handed on. Read by the library at each error, so setting the module's name is enough.
binlogstream.MYSQL_EXPECTED_ERROR_CODES = []


class BinlogError(RuntimeError):
    """Base class of the binlog collector's errors."""


class BinlogPurgedError(BinlogError):
    """The checkpoint points into binlog the server no longer has: rows in between are lost to us."""


class BinlogAccessError(BinlogError):
    """The monitor's MySQL account is refused; fixing it needs a person."""


@dataclass
class StreamState:
    """What the binlog collector (and the CDC reader, collectors.cdc) keeps of its stream as it reads, in place;
    `status()` hands out a frozen BinlogStatus of it (oncewatch.core.protocol)."""

    connected: bool = False
    seconds_behind: float | None = None
    last_position: BinlogPosition | None = None
    last_event_time: float | None = None
    last_alive: float | None = None  # any event or heartbeat from the server, or a reconnect attempt
    last_error: str | None = None
    disconnected_since: float | None = None
    reconnects: int = 0
    rows_read: int = 0
    transactions_read: int = 0
    events_read: int = 0  # every event the server sent, handed on or skipped: a replay would show as a jump

    def status(self) -> BinlogStatus:
        return BinlogStatus(**vars(self))


# DDL on tables (MariaDB logs each as a standalone event); names may be `quoted` and schema-qualified.
_NAME = r"`?[\w$]+`?(?:\.`?[\w$]+`?)?"
_DDL = [
    ("alter", re.compile(rf"^\s*ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+(?:IF\s+EXISTS\s+)?({_NAME})", re.I)),
    ("truncate", re.compile(rf"^\s*TRUNCATE\s+(?:TABLE\s+)?({_NAME})", re.I)),
    ("create", re.compile(rf"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?({_NAME})", re.I)),
]
_DROP = re.compile(r"^\s*DROP\s+(?:TEMPORARY\s+)?TABLES?\s+(?:IF\s+EXISTS\s+)?(.+)", re.I | re.S)
_RENAME = re.compile(r"^\s*RENAME\s+TABLES?\s+(.+)", re.I | re.S)
_COMMENT = re.compile(r"/\*.*?\*/", re.S)


def ddl_targets(query: str, default_schema: str) -> list[tuple[str, str]]:
    """The tables ('schema.table') a DDL statement changes, with its kind; [] for anything else.
    A RENAME changes both names: the old one is gone, the new one appears."""
    query = _COMMENT.sub(" ", query)

    def qualified(name: str) -> str:
        name = name.strip().replace("`", "")
        return name if "." in name else f"{default_schema}.{name}"

    for kind, pattern in _DDL:
        if m := pattern.match(query):
            return [(qualified(m.group(1)), kind)]
    if m := _DROP.match(query):
        return [(qualified(n), "drop") for n in m.group(1).split(",") if n.strip()]
    if m := _RENAME.match(query):
        pairs = [p.split() for p in m.group(1).split(",")]
        return [(qualified(p[i]), "rename") for p in pairs if len(p) == 3 and p[1].upper() == "TO" for i in (0, 2)]
    return []


def connection_settings(cfg: MySQLConfig) -> dict[str, Any]:
    """PyMySQL's settings for the monitor user, the binlog stream's and the SELECTs' alike (TLS included)."""
    # PyMySQL 1.1 checks the server's certificate against ssl_ca only when told to (ssl_verify_cert), else not at all
    tls = {"ssl_ca": cfg.ssl_ca, "ssl_verify_cert": cfg.ssl_ca is not None, "ssl_cert": cfg.ssl_cert,
           "ssl_key": cfg.ssl_key, "ssl_verify_identity": cfg.ssl_verify_identity} if cfg.ssl_ca or cfg.ssl_cert else {}
    return {"host": cfg.host, "port": cfg.port, "user": cfg.user, "password": cfg.password.value(),
            "connect_timeout": cfg.connect_timeout, "read_timeout": cfg.read_timeout, **tls}


def library_filter(cfg: MySQLConfig) -> dict[str, list[str] | None]:
    """BinLogStreamReader's only_schemas / only_tables for the watched entries: a pattern leaves its part
    unfiltered by the library (None), and the collector keeps the watched tables itself."""
    schemas, tables = cfg.watched.exact_schemas(), cfg.watched.exact_tables()
    return {"only_schemas": None if schemas is None else list(schemas),
            "only_tables": None if tables is None else list(tables)}


def connect(cfg: MySQLConfig, **extra: Any) -> pymysql.Connection:
    """A plain client connection as the monitor user (bootstrap, status queries)."""
    return pymysql.connect(**connection_settings(cfg), autocommit=True, **extra)


def to_epoch(value: Any) -> float | None:
    """A row timestamp column as epoch seconds; naive DATETIMEs are read as UTC."""
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).timestamp()
    return None


def commit_time(after: dict[str, Any] | None, column: str | None, fallback: float,
                fallback_clock: str) -> tuple[float, str]:
    """A row's commit time and the clock it came from: its table's commit-time column (mysql.commit_time_columns)
    where it has one and the row `after` the change a time in it, else `fallback` (the binlog header's, the
    read's). A delete (no `after`) is timed by the fallback: its row's column says when the row was written, not
    when it went."""
    row_time = to_epoch(after.get(column)) if column and after is not None else None
    return (row_time, CLOCK_ROW_COLUMN) if row_time is not None else (fallback, fallback_clock)


class BinlogCollector:
    """Committed transactions of the configured tables, from a GTID position on, forever: a running part
    (oncewatch.core.protocol.Part).

    `start` is the position after the last transaction the caller has stored, or None to
    start at the server's current end. Iterate `items(stop)` (or `transactions()`); call `stop()` from another
    thread to end it. Transactions that touch no watched table are handed on too (with no
    rows) so the caller's checkpoint keeps moving. After each transaction, `items` pauses while `ahead()` says
    the binlog is read far past Kafka, for PAUSE_SECONDS at most at a time: a binlog dump the monitor does not
    read for longer than the server's net_write_timeout (60 s by default) is dropped by the server.
    """

    PAUSE_SECONDS = 20.0

    def __init__(self, cfg: MySQLConfig, start: BinlogPosition | None, *, ahead: Callable[[], bool] = lambda: False,
                 sleep: Callable[[float], None] = time.sleep, fragment_rows: int = FRAGMENT_ROWS):
        self.cfg = cfg
        self._ahead = ahead
        self._paused_at: float | None = None  # alive while paused, though nothing is read
        self.fragment_rows = fragment_rows
        self.state = StreamState(last_position=start)
        self._start = start
        self._stop = threading.Event()
        self._sleep = sleep
        self._stream: BinLogStreamReader | None = None
        self._probe: pymysql.Connection | None = None
        self._probe_lock = threading.Lock()
        self._images = RowImages()

    # -------------------------------------------------------------- public

    def start(self) -> None:
        """Nothing to connect ahead: the stream opens as `items` reads, and again after a lost connection."""

    def items(self, stop: threading.Event) -> Iterator[Transaction]:
        for tx in self.transactions():
            yield tx
            until = time.monotonic() + self.PAUSE_SECONDS
            while self._ahead() and time.monotonic() < until and not stop.is_set():
                self._paused_at = time.time()
                stop.wait(0.2)

    def status(self) -> BinlogStatus:
        return self.state.status()

    def alive_at(self) -> float | None:
        return max(filter(None, (self.state.last_alive, self._paused_at)), default=None)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """Drop the status probe's connection (the stream closes itself when `transactions()` ends)."""
        with self._probe_lock:
            if self._probe is not None:
                self._probe.close()
                self._probe = None

    def current_server_position(self) -> BinlogPosition:
        """The server's binlog end now (to tell whether the tail has caught up)."""
        (gtid,), = self._probe_query("SELECT @@gtid_binlog_pos")
        rows = self._probe_query("SHOW MASTER STATUS")
        row = rows[0] if rows else None
        return BinlogPosition(gtid=gtid or "", file=row[0] if row else "", pos=int(row[1]) if row else 0)

    def columns(self, table: str) -> dict[str, str]:
        """A table's columns as the server has them now: name -> information_schema DATA_TYPE ({} if gone)."""
        schema, name = table.split(".", 1)
        return dict(self._probe_query("SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS "
                                      "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (schema, name)))

    def _probe_query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """One query on the probe connection, kept between calls and dropped on any error, so a
        restarted server is simply reconnected."""
        with self._probe_lock:
            try:
                if self._probe is None:
                    self._probe = connect(self.cfg)
                with self._probe.cursor() as cur:
                    cur.execute(sql, params)
                    return list(cur.fetchall())
            except Exception:
                if self._probe is not None:
                    self._probe.close()
                self._probe = None
                raise

    def transactions(self) -> Iterator[Transaction]:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                if self.state.last_position is None:
                    self.state.last_position = self.current_server_position()
                for tx in self._read(self.state.last_position):
                    backoff = 0.5
                    yield tx
                    if self._stop.is_set():
                        break
            except TRANSPORT_ERRORS as exc:
                self.state.last_alive = time.time()
                self._disconnected(exc)
                if self._stop.wait(backoff):
                    break
                backoff = min(backoff * 2, self.cfg.reconnect_max_seconds)
                self.state.reconnects += 1
            finally:
                self._close()

    # -------------------------------------------------------------- internals

    def _disconnected(self, exc: BaseException) -> None:
        code = exc.args[0] if isinstance(exc, pymysql.err.MySQLError) and exc.args else None
        if code in PURGED_CODES:
            raise BinlogPurgedError(self._purged_message(str(exc))) from exc
        if code in ACCESS_DENIED_CODES:
            raise BinlogAccessError(
                f"MySQL refused the monitor user {self.cfg.user!r} at {self.cfg.host}:{self.cfg.port} "
                f"({exc.args[1] if len(exc.args) > 1 else exc}); check the password source and grant "
                f"REPLICATION SLAVE, REPLICATION CLIENT and SELECT on the watched tables") from exc
        if self.state.connected or self.state.disconnected_since is None:
            self.state.disconnected_since = time.time()
        self.state.connected = False
        self.state.last_error = f"{type(exc).__name__}: {exc}"
        log.warning("binlog stream lost", extra={"event": "binlog_disconnected", "error": self.state.last_error})

    def _purged_message(self, detail: str) -> str:
        pos = self.state.last_position
        return (f"the binlog at the checkpoint ({pos.gtid if pos else '?'}, {pos.file if pos else '?'}) is no "
                f"longer on the server (purged or expired; server said: {detail}). Changes between the "
                f"checkpoint and the oldest binlog are lost to the monitor. To start again from the "
                f"tables' current state run `oncewatch bootstrap --config FILE` (re-reads the watched "
                f"tables and tails from there), and raise the server's binlog retention "
                f"(binlog_expire_logs_seconds) above the monitor's longest expected downtime.")

    def _close(self) -> None:
        if self._stream is not None:
            try:
                self._stream.close()
            except Exception:  # noqa: BLE001 - closing a dead stream may fail; nothing to save
                pass
            self._stream = None

    def _open(self, position: BinlogPosition) -> BinLogStreamReader:
        # Every stream of this collector registers with the same server_id: a half-dead previous connection of
        # ours that the server still holds is then the one it drops (MariaDB kills the older dump thread of a
        # replica id; error 4052 goes to that one), not the new stream.
        self._stream = BinLogStreamReader(
            connection_settings=connection_settings(self.cfg),
            server_id=self.cfg.server_id,
            is_mariadb=True,
            auto_position=position.gtid or None,
            blocking=True,
            resume_stream=True,
            **library_filter(self.cfg),
            only_events=[MariadbGtidEvent, XidEvent, QueryEvent, RotateEvent, HeartbeatLogEvent,
                         WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
            slave_heartbeat=self.cfg.heartbeat_seconds,
            # A table map already read for its table_id is not parsed again (more than half of the read's time went
            # into parsing the same map for every transaction). Correct on MariaDB: a table's id is new whenever its
            # definition is (an ALTER, a rename, a reopen), and ids restart only with the server, which starts a new
            # binlog file: `_read` empties the library's map whenever the file changes.
            freeze_schema=True,
            enable_logging=False,
        )
        return self._stream

    def _read(self, position: BinlogPosition) -> Iterator[Transaction]:
        stream = self._open(position)
        done = gtid_set(position.gtid)
        # gtid -> rows of it handed on in fragments: skipped when it is read again, after a resume
        # from inside it or the library's own reconnect from the stream's opening position
        handed = {position.within_gtid: position.within_rows} if position.within_gtid else {}
        watched = self.cfg.watched.entry
        tx_gtid: str | None = None
        skip_tx = standalone = False
        rows: list[tuple[str, Any, dict | None, dict | None]] = []  # (op, event, before, after)
        first = skip = 0  # row index of rows[0]; rows of this transaction still to skip
        bad: list[QuarantinedRows] = []
        changes: list[SchemaChange] = []
        log_file = position.file
        for event in _released(stream):
            if self._stop.is_set():
                return
            now = self.state.last_alive = time.time()
            self.state.events_read += 1
            if not self.state.connected:
                self.state.connected = True
                self.state.disconnected_since = None
                self.state.last_error = None
                log.info("binlog stream connected", extra={"event": "binlog_connected", "gtid": position.gtid})
            if isinstance(event, RotateEvent):
                if event.next_binlog != log_file:
                    # The library forgets its table maps only at a rotate written in the file; a file that ended in
                    # a crash has none, only the server's own (timestamp 0) as it moves on, and the next server
                    # gives the same ids to other tables.
                    stream.table_map.clear()
                log_file = event.next_binlog
                continue
            if isinstance(event, HeartbeatLogEvent):
                self.state.seconds_behind = 0.0
                continue
            self.state.last_event_time = event.timestamp
            self.state.seconds_behind = max(0.0, now - event.timestamp) if event.timestamp else None
            if isinstance(event, MariadbGtidEvent):
                domain, server, seq = (int(x) for x in event.gtid.split("-"))
                skip_tx = domain in done and seq <= done[domain][1]
                tx_gtid, rows, bad, changes = event.gtid, [], [], []
                first, skip = 0, handed.get(event.gtid, 0)
                standalone = bool(event.flags & 0x01)  # FL_STANDALONE: DDL or non-transactional, no XID
                continue
            if tx_gtid is None:
                continue  # the tail of a transaction whose start we did not see: cannot happen on GTID resume
            if isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                if not skip_tx and watched(event.schema, event.table) is not None:
                    try:
                        read = self._row_tuples(event)
                    except Exception as exc:  # noqa: BLE001 - one event the library cannot decode must not stop the tail
                        bad.append(self._quarantined(event, tx_gtid, log_file, exc))
                        read = []
                    if skip:
                        skipped = min(skip, len(read))
                        first, skip, read = first + skipped, skip - skipped, read[skipped:]
                    rows.extend(read)
                    if len(rows) >= self.fragment_rows:
                        at = BinlogPosition(gtid=gtid_text(done), file=log_file, pos=stream.log_pos or 0,
                                            within_gtid=tx_gtid, within_rows=first + len(rows))
                        yield self._handed_on(self._transaction(tx_gtid, rows, first, at, event.timestamp, bad, [],
                                                                complete=False))
                        handed[tx_gtid] = first = first + len(rows)
                        rows, bad = [], []
                continue
            if isinstance(event, QueryEvent) and standalone and not skip_tx:
                default = event.schema.decode("utf-8", "backslashreplace") if isinstance(event.schema, bytes) \
                    else str(event.schema or "")
                changes += [SchemaChange(table=t, kind=kind, statement=event.query[:500], columns=self.columns(t),
                                         txid=tx_gtid, binlog_file=log_file or "", pos=stream.log_pos or 0)
                            for t, kind in ddl_targets(event.query, default)
                            if self.cfg.watched.qualified(t) is not None]
            is_commit = isinstance(event, XidEvent) or (
                isinstance(event, QueryEvent) and (standalone or event.query.strip().upper() == "COMMIT"))
            if not is_commit:
                continue
            domain, server, seq = (int(x) for x in tx_gtid.split("-"))
            if not skip_tx:
                end = BinlogPosition(gtid=gtid_text({**done, domain: (server, seq)}), file=log_file,
                                     pos=stream.log_pos or 0)
                tx = self._transaction(tx_gtid, rows, first, end, event.timestamp, bad, changes)
                done[domain] = (server, seq)
                handed.pop(tx_gtid, None)
                yield self._handed_on(tx)
            tx_gtid, rows, bad, changes, skip_tx = None, [], [], [], False

    def _handed_on(self, tx: Transaction) -> Transaction:
        self.state.last_position = tx.position
        self.state.transactions_read += tx.complete
        self.state.rows_read += len(tx.rows)
        return tx

    def _row_tuples(self, event: Any) -> list[tuple[str, Any, dict | None, dict | None]]:
        """(op, event, before, after) of each row: decoded here when the table's types allow (row_images),
        else by the library."""
        images = self._images.of(event)
        if images is None:
            images = [(r["before_values"], r["after_values"]) if "before_values" in r else (r["values"],)
                      for r in event.rows]
        if isinstance(event, WriteRowsEvent):
            return [(OP_INSERT, event, None, a) for a, in images]
        if isinstance(event, UpdateRowsEvent):
            return [(OP_UPDATE, event, b, a) for b, a in images]
        return [(OP_DELETE, event, b, None) for b, in images]

    @staticmethod
    def _quarantined(event: Any, gtid: str, log_file: str | None, exc: Exception) -> QuarantinedRows:
        table = f"{event.schema}.{event.table}"
        reason = UNDECODABLE if isinstance(exc, UnicodeDecodeError) else UNPARSEABLE
        detail = (f"{exc.encoding} cannot decode byte(s) {exc.object[exc.start:exc.end]!r} of a value"
                  if isinstance(exc, UnicodeDecodeError) else f"{type(exc).__name__}: {str(exc)[:200]}")
        log.error("binlog rows event cannot be decoded; kept in quarantine", exc_info=reason == UNPARSEABLE,
                  extra={"event": "binlog_rows_quarantined", "gtid": gtid, "file": log_file,
                         "pos": event.packet.log_pos, "table": table, "reason": reason})
        return QuarantinedRows(txid=gtid, binlog_file=log_file or "", event_pos=event.packet.log_pos, table=table,
                               reason=reason, detail=detail)

    def _transaction(self, gtid: str, rows: list, first: int, end: BinlogPosition, header_time: int,
                     quarantined: list[QuarantinedRows], changes: list[SchemaChange], *,
                     complete: bool = True) -> Transaction:
        out = []
        entry = self.cfg.watched.entry
        for i, (op, event, before, after) in enumerate(rows, first):
            image = after if after is not None else before
            pk_names = event.primary_key if isinstance(event.primary_key, (list, tuple)) else (
                (event.primary_key,) if event.primary_key else ())
            pk = tuple(image.get(n) for n in pk_names)
            when, clock = commit_time(after, self.cfg.commit_time_columns.get(entry(event.schema, event.table)),
                                      float(header_time), CLOCK_BINLOG_HEADER)
            out.append(RowChange(
                schema=event.schema, table=event.table, op=op, pk=pk, before=before, after=after,
                txid=gtid, row_index=i, binlog_file=end.file, end_pos=end.pos, commit_time=when, commit_clock=clock))
        return Transaction(rows=Packed(out), position=end, commit_time=float(header_time),
                           quarantined=tuple(quarantined), schema_changes=tuple(changes), complete=complete)


def _released(stream: BinLogStreamReader) -> Iterator[Any]:
    """The stream's events, each let go of its packet once the next one is asked for. The library links an
    event and its packet both ways: that cycle would leave every event, and the rows it decoded, to the
    cycle collector, which the monitor runs rarely (oncewatch.monitor.garbage)."""
    for event in stream:
        yield event
        event.packet = None


def watched_tables(cur: Any, cfg: MySQLConfig) -> list[tuple[str, str, str]]:
    """(entry, schema, table) of every table on the server that a watched entry names, in the order of
    `mysql.tables` then by name: an exact entry as it is, a pattern as each shard it matches now."""
    names: list[tuple[str, str]] = []
    if any(map(is_pattern, cfg.tables)):  # the server's tables, read once for all the patterns
        cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' "
                    "ORDER BY TABLE_SCHEMA, TABLE_NAME")
        names = [tuple(r.values()) if isinstance(r, dict) else tuple(r) for r in cur.fetchall()]
    out = []
    for entry in cfg.tables:
        if not is_pattern(entry):
            out.append((entry, *entry.split(".", 1)))
            continue
        out += [(entry, schema, table) for schema, table in names if cfg.watched.entry(schema, table) == entry]
    return out


class BootstrapInterruptedError(BinlogError):
    """The first bootstrap failed mid-way: a consistent snapshot cannot be resumed, so the monitor stops and
    its next start empties the store and bootstraps again."""


class Bootstrap:
    """The watched tables' rows, chunk by chunk (`bootstrap`), as a running part in the binlog tail's place until
    the tail can start (at the snapshot's position, which the last chunk carries); then it waits to be replaced.
    Any failure on the way is a BootstrapInterruptedError, which says what to do."""

    def __init__(self, cfg: MySQLConfig):
        self.cfg = cfg
        self.rows = 0
        self.table = ""
        self.done = False
        self._alive: float | None = None

    def start(self) -> None:
        """Nothing to connect ahead: `items` opens the snapshot."""

    def items(self, stop: threading.Event) -> Iterator[Transaction]:
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

    def status(self) -> BootstrapStatus:
        return BootstrapStatus(bootstrapping=not self.done, bootstrap_rows=self.rows, bootstrap_table=self.table,
                               rows_read=self.rows, last_alive=self._alive)

    def alive_at(self) -> float | None:
        return self._alive

    def stop(self) -> None:
        """`items` ends at the stop event it was given."""

    def close(self) -> None:
        """The snapshot's connection closes as `items` ends."""


def bootstrap(cfg: MySQLConfig, chunk: int = 5000) -> Iterator[Transaction]:
    """Read the watched tables consistently with a binlog position (no locks, no RELOAD grant).

    Yields the rows as `snapshot` transactions of at most `chunk` rows, each carrying the snapshot's
    position (the tail starts there), the last one `complete` (empty when the tables are).

    MariaDB's `START TRANSACTION WITH CONSISTENT SNAPSHOT` fixes `binlog_snapshot_file/position`
    to the binlog point the snapshot corresponds to; `BINLOG_GTID_POS()` turns that into the GTID
    position to tail from. Rows come as inserts marked `snapshot=True`, read through a server-side
    cursor, so memory holds one chunk whatever the size of the tables.
    """
    conn = connect(cfg, cursorclass=pymysql.cursors.SSDictCursor)
    rows: list[RowChange] = []
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
            status = {r["Variable_name"]: r["Value"] for r in cur.fetchall()}
            file, pos = status["Binlog_snapshot_file"], int(status["Binlog_snapshot_position"])
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s) AS g", (file, pos))
            # fetchall, not fetchone: a server-side cursor must read a result to its end before the next query
            gtid = cur.fetchall()[0]["g"] or ""
            position = BinlogPosition(gtid=gtid, file=file, pos=pos)
            now = time.time()
            for entry, schema, name in watched_tables(cur, cfg):
                table = f"{schema}.{name}"
                cur.execute(f"SHOW KEYS FROM `{schema}`.`{name}` WHERE Key_name = 'PRIMARY'")
                pk_cols = [r["Column_name"] for r in sorted(cur.fetchall(), key=lambda r: r["Seq_in_index"])]
                cur.execute(f"SELECT * FROM `{schema}`.`{name}`")
                column = cfg.commit_time_columns.get(entry)
                for i, row in enumerate(cur):
                    when, clock = commit_time(row, column, now, CLOCK_READ_TIME)
                    rows.append(RowChange(
                        schema=schema, table=name, op=OP_INSERT, pk=tuple(row[c] for c in pk_cols), before=None,
                        after=dict(row), txid=f"snapshot:{gtid}:{table}", row_index=i, binlog_file=file,
                        end_pos=pos, commit_time=when, commit_clock=clock, snapshot=True))
                    if len(rows) >= chunk:
                        yield Transaction(rows=Packed(rows), position=position, commit_time=now, complete=False,
                                          snapshot=True)
                        rows = []
            cur.execute("COMMIT")
    finally:
        conn.close()
    yield Transaction(rows=Packed(rows), position=position, commit_time=now, snapshot=True)


__all__ = ["BinlogCollector", "Bootstrap", "BootstrapInterruptedError", "BinlogError", "BinlogPurgedError",
           "BinlogAccessError", "StreamState", "bootstrap", "commit_time", "connect", "library_filter",
           "watched_tables"]
