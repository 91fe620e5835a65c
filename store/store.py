"""The monitor's own memory (DESIGN §2, §7): checkpoints, records, open state and findings.

SQLite in WAL mode. Everything a batch of input produced (the rows or events, the state the
engine derived, the findings, and the checkpoint that says how far input was read) is
written in one `with store.batch() as tx:` block, i.e. one SQLite transaction, so a kill -9
at any instant resumes with nothing lost and nothing doubled. Readers (dashboards, exports)
open their own connections and never block the writer.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Any

from oncewatch.core.records import (JSON_DECODER, EmittedEvent, Evidence, Finding, QuarantinedRecord, RowChange,
                               from_json, parse_exact_json, to_json)

SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS row_changes (
    seq INTEGER PRIMARY KEY,
    txid TEXT NOT NULL,
    row_index INTEGER NOT NULL,
    schema_name TEXT NOT NULL,
    table_name TEXT NOT NULL,
    op TEXT NOT NULL,
    pk TEXT NOT NULL,
    before_row TEXT,
    after_row TEXT,
    binlog_file TEXT NOT NULL,
    end_pos INTEGER NOT NULL,
    commit_time REAL NOT NULL,
    commit_clock TEXT NOT NULL,
    snapshot INTEGER NOT NULL DEFAULT 0,
    UNIQUE (txid, row_index, snapshot)
);
CREATE INDEX IF NOT EXISTS row_changes_table ON row_changes (schema_name, table_name, commit_time);
CREATE TABLE IF NOT EXISTS entity_index (
    entity TEXT NOT NULL,      -- e.g. 'trade_no:T123' or 'order_key:O9'
    kind TEXT NOT NULL,        -- 'row_change' | 'event'
    ref TEXT NOT NULL,         -- row_changes.seq or 'topic/partition@offset'
    PRIMARY KEY (entity, kind, ref)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    "offset" INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    timestamp_type TEXT NOT NULL,
    record_key TEXT,
    format TEXT NOT NULL,
    body TEXT NOT NULL,        -- the rest of the event as JSON: see event_body
    PRIMARY KEY (topic, partition, "offset")
);
CREATE TABLE IF NOT EXISTS quarantine (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    "offset" INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    reason TEXT NOT NULL,
    detail TEXT NOT NULL,
    size INTEGER NOT NULL,
    preview TEXT NOT NULL,
    quarantined_at REAL NOT NULL,
    PRIMARY KEY (topic, partition, "offset")
);
CREATE TABLE IF NOT EXISTS state (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS findings (
    id TEXT PRIMARY KEY,
    rule TEXT NOT NULL,
    name TEXT NOT NULL,
    severity TEXT NOT NULL,
    status TEXT NOT NULL,
    keys TEXT NOT NULL,
    summary TEXT NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    resolved_at REAL,
    resolution TEXT,
    evidence TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS findings_rule ON findings (rule, status);
CREATE INDEX IF NOT EXISTS findings_seen ON findings (first_seen);
CREATE TABLE IF NOT EXISTS health (
    component TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS series (
    name TEXT NOT NULL,
    labels TEXT NOT NULL,
    at REAL NOT NULL,
    value REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS series_name_at ON series (name, at);
"""


class StoreError(RuntimeError):
    """The store file cannot be opened or written; the message names the file."""


def connect(path: str, *, readonly: bool = False) -> sqlite3.Connection:
    try:
        if readonly:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30, check_same_thread=False)
        else:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the store {path}: {exc}") from exc
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def finding_from_row(row: sqlite3.Row | tuple) -> Finding:
    (fid, rule, name, severity, status, keys, summary, first_seen, last_seen, resolved_at, resolution,
     evidence) = row
    return Finding(id=fid, rule=rule, name=name, severity=severity, status=status, keys=from_json(keys),
                   summary=summary, first_seen=first_seen, last_seen=last_seen, resolved_at=resolved_at,
                   resolution=resolution,
                   evidence=tuple(Evidence(**e) for e in from_json(evidence)))


EVENT_COLUMNS = 'topic, partition, "offset", timestamp_ms, timestamp_type, record_key, format, body'


def event_body(e: EmittedEvent) -> str:
    """What the events table keeps of an event beyond its other columns, as JSON.

    An event that has its payload's JSON text (`payload_json`) is kept as the array
    [[headers, keys, cdc], <that text as it was read>]: encoding the parsed payload again was most
    of the cost of storing an event. Any other event is the object {headers, keys, cdc, payload}."""
    if e.payload_json is None:
        return to_json({"headers": e.headers, "keys": e.keys, "cdc": e.cdc, "payload": e.payload}, sort_keys=False)
    return f"[{to_json((e.headers, e.keys, e.cdc), sort_keys=False)},{e.payload_json}]"


def event_from_row(topic: str, partition: int, offset: int, timestamp_ms: int, timestamp_type: str,
                   key: str | None, fmt: str, body: str) -> EmittedEvent:
    """The inverse of `event_body` with the other columns. Bodies written before the array form
    hold the whole event (`to_json(event.to_dict())`), whose extra fields equal the columns."""
    if body.startswith("["):
        (headers, keys, cdc), end = JSON_DECODER.raw_decode(body, 1)
        text = body[end + 1:-1]
        payload = parse_exact_json(text)
    else:
        d = from_json(body)
        headers, keys, cdc, payload, text = d["headers"], d["keys"], d["cdc"], d["payload"], None
    return EmittedEvent(topic=topic, partition=partition, offset=offset, timestamp_ms=timestamp_ms,
                        timestamp_type=timestamp_type, key=key, headers=tuple(tuple(h) for h in headers),
                        payload=payload, format=fmt, keys=keys, cdc=cdc, payload_json=text)


FINDING_COLUMNS = ("id, rule, name, severity, status, keys, summary, first_seen, last_seen, resolved_at, "
                   "resolution, evidence")


class Batch:
    """Writes inside one store transaction; obtained from `Store.batch()`."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def set_checkpoint(self, name: str, value: Any) -> None:
        self.conn.execute("INSERT INTO checkpoints (name, value, updated_at) VALUES (?, ?, ?) "
                          "ON CONFLICT(name) DO UPDATE SET value=excluded.value, updated_at=excluded.updated_at",
                          (name, to_json(value), time.time()))

    def add_row_changes(self, rows: Iterable[RowChange], entities: Iterable[tuple[int, str]] = ()) -> list[int]:
        """Store rows; returns their sequence numbers (in order). `entities` pairs a row's index in
        `rows` with an entity key ('trade_no:T1') for the drill-down index."""
        seqs = []
        for r in rows:
            cur = self.conn.execute(
                "INSERT INTO row_changes (txid, row_index, schema_name, table_name, op, pk, before_row, after_row,"
                " binlog_file, end_pos, commit_time, commit_clock, snapshot) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (r.txid, r.row_index, r.schema, r.table, r.op, to_json(list(r.pk)),
                 None if r.before is None else to_json(r.before), None if r.after is None else to_json(r.after),
                 r.binlog_file, r.end_pos, r.commit_time, r.commit_clock, int(r.snapshot)))
            seqs.append(cur.lastrowid)
        self.conn.executemany("INSERT OR IGNORE INTO entity_index (entity, kind, ref) VALUES (?, 'row_change', ?)",
                              [(entity, str(seqs[i])) for i, entity in entities])
        return seqs

    def add_events(self, events: Iterable[EmittedEvent], entities: Iterable[tuple[int, str]] = ()) -> None:
        """Store events; `entities` pairs an event's index in `events` with an entity key."""
        events = list(events)
        self._insert(f"INSERT INTO events ({EVENT_COLUMNS}) VALUES ", "(?,?,?,?,?,?,?,?)", 16,
                     [(e.topic, e.partition, e.offset, e.timestamp_ms, e.timestamp_type, e.key, e.format,
                       event_body(e)) for e in events])
        entities = list(entities)
        if entities:
            refs = [e.coordinates for e in events]  # once per event: most have several entities
            self._insert("INSERT OR IGNORE INTO entity_index (entity, kind, ref) VALUES ", "(?,'event',?)", 50,
                         [(entity, refs[i]) for i, entity in entities])

    def _insert(self, head: str, row: str, per_statement: int, rows: list[tuple[Any, ...]]) -> None:
        """`executemany(head + row, rows)`, but `per_statement` rows to a statement: SQLite's cost
        per statement run is a third of inserting an entity row. Two statements, both cached."""
        full = len(rows) - len(rows) % per_statement
        if full:
            self.conn.executemany(head + ",".join([row] * per_statement),
                                  [tuple(chain.from_iterable(rows[i:i + per_statement]))
                                   for i in range(0, full, per_statement)])
        if full < len(rows):
            self.conn.executemany(head + row, rows[full:])

    def add_quarantined(self, records: Iterable[QuarantinedRecord]) -> None:
        now = time.time()
        self.conn.executemany(
            'INSERT INTO quarantine (topic, partition, "offset", timestamp_ms, reason, detail, size, preview,'
            " quarantined_at) VALUES (?,?,?,?,?,?,?,?,?)",
            [(q.topic, q.partition, q.offset, q.timestamp_ms, q.reason, q.detail, q.size, q.preview, now)
             for q in records])

    def set_state(self, name: str, value: Any) -> None:
        self.conn.execute("INSERT INTO state (name, value) VALUES (?, ?) "
                          "ON CONFLICT(name) DO UPDATE SET value=excluded.value", (name, to_json(value)))

    def upsert_findings(self, findings: Iterable[Finding]) -> None:
        self.conn.executemany(
            f"INSERT INTO findings ({FINDING_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT(id) DO UPDATE SET severity=excluded.severity, status=excluded.status, "
            "summary=excluded.summary, last_seen=excluded.last_seen, resolved_at=excluded.resolved_at, "
            "resolution=excluded.resolution, evidence=excluded.evidence, keys=excluded.keys",
            [(f.id, f.rule, f.name, f.severity, f.status, to_json(f.keys), f.summary, f.first_seen, f.last_seen,
              f.resolved_at, f.resolution, to_json([e.__dict__ for e in f.evidence])) for f in findings])

    def add_series(self, points: Iterable[tuple[str, dict[str, str], float, float]]) -> None:
        self.conn.executemany("INSERT INTO series (name, labels, at, value) VALUES (?, ?, ?, ?)",
                              [(n, to_json(lbl), at, v) for n, lbl, at, v in points])


class Store:
    """The writer's handle. One writer per store file; readers use `Store(path, readonly=True)`."""

    def __init__(self, path: str, *, readonly: bool = False):
        self.path = path
        self.conn = connect(path, readonly=readonly)
        self._lock = threading.Lock()
        if not readonly:
            self.conn.executescript(SCHEMA)

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def batch(self) -> Iterator[Batch]:
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield Batch(self.conn)
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    # -------------------------------------------------------------- reads

    def checkpoint(self, name: str) -> Any:
        row = self.conn.execute("SELECT value FROM checkpoints WHERE name = ?", (name,)).fetchone()
        return None if row is None else from_json(row[0])

    def checkpoints(self) -> dict[str, Any]:
        return {n: from_json(v) for n, v in self.conn.execute("SELECT name, value FROM checkpoints")}

    def state(self, name: str, default: Any = None) -> Any:
        row = self.conn.execute("SELECT value FROM state WHERE name = ?", (name,)).fetchone()
        return default if row is None else from_json(row[0])

    def set_health(self, component: str, value: dict[str, Any]) -> None:
        with self._lock:
            self.conn.execute("INSERT INTO health (component, value, updated_at) VALUES (?, ?, ?) "
                              "ON CONFLICT(component) DO UPDATE SET value=excluded.value, "
                              "updated_at=excluded.updated_at", (component, to_json(value), time.time()))

    def health(self) -> dict[str, dict[str, Any]]:
        return {c: {**from_json(v), "updated_at": at}
                for c, v, at in self.conn.execute("SELECT component, value, updated_at FROM health")}

    def row_changes(self, where: str = "", params: tuple = (), limit: int | None = None) -> list[RowChange]:
        sql = ("SELECT schema_name, table_name, op, pk, before_row, after_row, txid, row_index, binlog_file, end_pos,"
               " commit_time, commit_clock, snapshot FROM row_changes " + (f"WHERE {where} " if where else "")
               + "ORDER BY seq" + (f" LIMIT {int(limit)}" if limit else ""))
        return [RowChange(schema=s, table=t, op=op, pk=tuple(from_json(pk)),
                          before=None if b is None else from_json(b), after=None if a is None else from_json(a),
                          txid=tx, row_index=ri, binlog_file=f, end_pos=p, commit_time=ct, commit_clock=cc,
                          snapshot=bool(sn))
                for s, t, op, pk, b, a, tx, ri, f, p, ct, cc, sn in self.conn.execute(sql, params)]

    def events(self, where: str = "", params: tuple = (), limit: int | None = None) -> list[EmittedEvent]:
        sql = (f"SELECT {EVENT_COLUMNS} FROM events " + (f"WHERE {where} " if where else "")
               + 'ORDER BY topic, partition, "offset"' + (f" LIMIT {int(limit)}" if limit else ""))
        return [event_from_row(*r) for r in self.conn.execute(sql, params)]

    def quarantined(self) -> list[QuarantinedRecord]:
        return [QuarantinedRecord(*r) for r in self.conn.execute(
            'SELECT topic, partition, "offset", timestamp_ms, reason, detail, size, preview FROM quarantine '
            'ORDER BY topic, partition, "offset"')]

    def findings(self, rule: str | None = None, status: str | None = None) -> list[Finding]:
        clauses, params = [], []
        if rule:
            clauses.append("rule = ?")
            params.append(rule)
        if status:
            clauses.append("status = ?")
            params.append(status)
        sql = f"SELECT {FINDING_COLUMNS} FROM findings" + (" WHERE " + " AND ".join(clauses) if clauses else "")
        return [finding_from_row(r) for r in self.conn.execute(sql + " ORDER BY first_seen, id", params)]
