"""Writes inside one store transaction: everything a batch of input produced, with its checkpoints."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

from oncewatch.core.exact_json import flat_json, to_json
from oncewatch.core.names import ACKNOWLEDGED, CLOSED, OPEN, RESOLVED
from oncewatch.core.records import EmittedEvent, Finding, QuarantinedRecord, QuarantinedRows, RowChange
from oncewatch.store.codec import FINDING_COLUMNS, event_body, headers_json
from oncewatch.store import entities as entities_index
from oncewatch.store import journal
from oncewatch.store.dialect import SQLITE, Connection, Dialect
from oncewatch.store.engine_state import Spaces
from oncewatch.store.numbered import Numbered
from oncewatch.store.packing import EVENT, ROW, TRAIN_SAMPLES, Packer

log = logging.getLogger(__name__)

# Who changed a status, when it was the monitor that saw the fact change.
MONITOR = "oncewatch"
# The fact behind a person's status: what the engine would say.
FACT = {ACKNOWLEDGED: OPEN, CLOSED: OPEN}

# A row already stored (a rows event quarantined before a restart) is kept as it is.
IGNORE_REPEATS = " ON CONFLICT DO NOTHING"
# Where each kind's values kept as text wait for its dictionary (store.packing): the table, its columns (the key
# first) and the packed ones among them. The newest REPACK_SCAN rows are looked at: the samples were the last values
# packed before the training, a group's other writers' rows between them.
WAITING = {ROW: ("row_changes", journal.COLUMNS, ("before_row", "after_row")),
           EVENT: ("events", f"rowid, {journal.EVENT_STORED}", ("body",))}
REPACK_SCAN = 10 * TRAIN_SAMPLES


class Batch:
    """Writes inside one store transaction; obtained from `Store.batch()`."""

    def __init__(self, conn: Connection, dialect: Dialect, packer: Packer, entity_ids: entities_index.EntityIds,
                 spaces: Spaces, sources: Numbered, event_sources: Numbered):
        self.conn = conn
        self.dialect = dialect
        self.packer = packer
        self.entity_ids = entity_ids
        self.spaces = spaces
        self.sources = sources
        self.event_sources = event_sources

    def set_checkpoint(self, name: str, value: Any) -> None:
        self.conn.execute("INSERT INTO checkpoints (name, value, updated_at) VALUES (?, ?, ?) "
                          "ON CONFLICT(name) DO UPDATE SET value=excluded.value, updated_at=excluded.updated_at",
                          (name, to_json(value), time.time()))

    def add_row_changes(self, rows: Sequence[RowChange], entities: Iterable[tuple[int, str]] = ()) -> list[int]:
        """Store rows; returns their sequence numbers (in order). `entities` pairs a row's index in
        `rows` with an entity key ('trade_no:T1') for the drill-down index."""
        # The monitor is the store's only writer of rows (its lock), so the numbers SQLite would give, one
        # past the largest, are known before the rows are written, and the rows go many to a statement.
        (last,), = self.conn.execute("SELECT COALESCE(MAX(seq), 0) FROM row_changes")
        seqs = list(range(last + 1, last + 1 + len(rows)))
        numbers = entities_index.numbers_of(self.conn, self.entity_ids, entities, self.insert_rows)
        pack, source, packed = self.packer.pack, self.sources.number, entities_index.pack_numbers
        self.insert_rows(journal.INSERT, journal.ROW, journal.ROWS_PER_STATEMENT,
                         [(seq, r.txid, r.row_index,
                           source(self.conn, (r.schema, r.table, r.op, r.binlog_file, r.commit_clock)),
                           flat_json(r.pk), None if r.before is None else pack(ROW, flat_json(r.before)),
                           None if r.after is None else pack(ROW, flat_json(r.after)),
                           r.end_pos, r.commit_time, int(r.snapshot), packed(numbers.get(i, ())))
                          for i, (seq, r) in enumerate(zip(seqs, rows))])
        entities_index.file(((n, seqs[i]) for i, ns in numbers.items() for n in ns), self.insert_rows)
        return seqs

    def add_events(self, events: Iterable[EmittedEvent], entities: Iterable[tuple[int, str]] = ()) -> None:
        """Store events; `entities` pairs an event's index in `events` with an entity key."""
        events = list(events)
        numbers = entities_index.numbers_of(self.conn, self.entity_ids, entities, self.insert_rows)
        if numbers:
            (last,), = self.conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM events")
        pack, source, packed = self.packer.pack, self.event_sources.number, entities_index.pack_numbers
        self.insert_rows(journal.INSERT_EVENT, journal.EVENT_ROW, 16,
                         [(source(self.conn, (e.topic, e.timestamp_type, e.format)), e.partition, e.offset,
                           e.timestamp_ms, e.key, pack(EVENT, event_body(e)), packed(numbers.get(i, ())))
                          for i, e in enumerate(events)])
        if numbers:
            # the rowids these events were given: above the largest before them (another writer of a shared store
            # may have added its own meanwhile, so each is found by its coordinates)
            rowids = {(t, p, o): rowid for rowid, t, p, o in self.conn.execute(
                f'SELECT events.rowid, topic, partition, "offset" FROM {journal.EVENTS} WHERE events.rowid > ?',
                (last,))}
            refs = [entities_index.event_ref(rowids[e.topic, e.partition, e.offset]) for e in events]
            entities_index.file(((n, refs[i]) for i, ns in numbers.items() for n in ns), self.insert_rows)

    def repack(self) -> None:
        """Before the transaction commits: the row images and event bodies kept as text until a dictionary trained
        in it, packed with it. In SQLite their rows are deleted and written again: a row updated in place to a fifth
        of its size leaves its page four-fifths empty, and pages of rows in key order are never filled again (on a
        shop's first three minutes, 1 MiB of the file); deleted, their pages are free for the next rows. In
        PostgreSQL an update writes the row anew, and each is updated only while it holds the text read (another
        writer of the shared store)."""
        for kind in self.packer.trained():
            if kind not in WAITING:
                continue
            table, selected, packed = WAITING[kind]
            names = [c.strip() for c in selected.split(",")]
            at = [names.index(c) for c in packed]
            key = names[0]
            rows = [r for r in self.conn.execute(f"SELECT {selected} FROM {table} ORDER BY {key} DESC LIMIT ?",
                                                 (REPACK_SCAN,)).fetchall()
                    if any(self.packer.waiting(r[i]) for i in at)]
            if self.dialect is SQLITE:
                self.conn.executemany(f"DELETE FROM {table} WHERE {key} = ?", [(r[0],) for r in rows])
                self.insert_rows(f"INSERT INTO {table} ({selected}) VALUES ", f"({','.join('?' * len(names))})", 16,
                                 [tuple(self._repacked(kind, v) if i in at else v for i, v in enumerate(r))
                                  for r in reversed(rows)])
            else:
                for i, column in zip(at, packed):
                    self.conn.executemany(f"UPDATE {table} SET {column} = ? WHERE {key} = ? AND {column} = ?",
                                          [(self._repacked(kind, r[i]), r[0], r[i]) for r in rows
                                           if self.packer.waiting(r[i])])
            log.info("the values kept as text until their dictionary was trained are packed with it",
                     extra={"event": "store_values_repacked", "kind": kind, "rows": len(rows)})

    def _repacked(self, kind: str, value: Any) -> Any:
        return self.packer.pack(kind, bytes(value)[1:].decode()) if self.packer.waiting(value) else value

    def insert_rows(self, head: str, row: str, per_statement: int, rows: list[tuple[Any, ...]], tail: str = "") -> None:
        """`executemany(head + row + tail, rows)`, but `per_statement` rows to a statement: SQLite's cost
        per statement run is a third of inserting an entity row. Two statements, both cached."""
        full = len(rows) - len(rows) % per_statement
        if full:
            self.conn.executemany(head + ",".join([row] * per_statement) + tail,
                                  [tuple(chain.from_iterable(rows[i:i + per_statement]))
                                   for i in range(0, full, per_statement)])
        if full < len(rows):
            self.conn.executemany(head + row + tail, rows[full:])

    def add_quarantined(self, records: Iterable[QuarantinedRecord]) -> None:
        records = list(records)
        if not records:  # the writer hands on every event batch, almost all without any
            return
        now = time.time()
        self.conn.executemany(
            'INSERT INTO quarantine (topic, partition, "offset", timestamp_ms, reason, detail, size, preview,'
            " quarantined_at) VALUES (?,?,?,?,?,?,?,?,?)",
            [(q.topic, q.partition, q.offset, q.timestamp_ms, q.reason, q.detail, q.size, q.preview, now)
             for q in records])
        self.conn.executemany(
            'INSERT INTO quarantine_raw (topic, partition, "offset", record_key, value, headers, timestamp_type) '
            "VALUES (?,?,?,?,?,?,?)",
            [(q.topic, q.partition, q.offset, q.key, q.value, headers_json(q.headers), q.timestamp_type)
             for q in records])

    def add_binlog_quarantined(self, events: Iterable[QuarantinedRows]) -> None:
        events = list(events)
        if not events:  # the writer hands on every transaction, almost all without any
            return
        now = time.time()
        self.conn.executemany(
            "INSERT INTO binlog_quarantine (txid, binlog_file, event_pos, table_name, reason, detail, "
            "quarantined_at) VALUES (?,?,?,?,?,?,?)" + IGNORE_REPEATS,
            [(q.txid, q.binlog_file, q.event_pos, q.table, q.reason, q.detail, now) for q in events])

    def set_state(self, name: str, value: Any) -> None:
        self.conn.execute("INSERT INTO state (name, value) VALUES (?, ?) "
                          "ON CONFLICT(name) DO UPDATE SET value=excluded.value", (name, to_json(value)))

    def clear_state(self, name: str) -> None:
        self.conn.execute("DELETE FROM state WHERE name = ?", (name,))

    def empty(self) -> None:
        """Every table emptied: the store as it was made, its schema and mark kept."""
        for (table,) in self.conn.execute(self.dialect.tables).fetchall():
            self.conn.execute(f'DELETE FROM "{table}"')

    def upsert_findings(self, findings: Iterable[Finding]) -> None:
        """The engine's findings, as facts (open or resolved), kept with a person's review: an
        acknowledged finding stays acknowledged while its fact stands, a closed one stays closed
        until the fact is seen again (newer evidence), and each change of status is history."""
        findings = list(findings)
        standing = self._standing(findings)
        history = []
        for f in findings:
            if f.id not in standing:
                continue
            status, reviewed_at = standing[f.id]
            if f.status == RESOLVED and status != RESOLVED:
                history.append((f.id, f.resolved_at or f.last_seen, RESOLVED, MONITOR, None, f.resolution or ""))
            elif f.status == OPEN and status == RESOLVED:
                history.append((f.id, f.last_seen, OPEN, MONITOR, None, "seen again after it was resolved"))
            elif f.status == OPEN and status == CLOSED and reviewed_at is not None and f.last_seen > reviewed_at:
                history.append((f.id, f.last_seen, OPEN, MONITOR, None, "seen again after it was closed"))
        self.conn.executemany(
            f"INSERT INTO findings ({FINDING_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT(id) DO UPDATE SET severity=excluded.severity, status=CASE "
            "WHEN excluded.status = 'resolved' THEN 'resolved' "
            "WHEN findings.status = 'acknowledged' THEN 'acknowledged' "
            "WHEN findings.status = 'closed' AND excluded.last_seen <= "
            "COALESCE((SELECT at FROM reviews WHERE finding_id = findings.id), 1e300) THEN 'closed' "
            "ELSE excluded.status END, "
            "summary=excluded.summary, last_seen=excluded.last_seen, resolved_at=excluded.resolved_at, "
            "resolution=excluded.resolution, evidence=excluded.evidence, keys=excluded.keys",
            [(f.id, f.rule, f.name, f.severity, f.status, to_json(f.keys), f.summary, f.first_seen, f.last_seen,
              f.resolved_at, f.resolution, to_json([e.__dict__ for e in f.evidence])) for f in findings])
        if history:
            self.add_history(history)
            self.conn.executemany("DELETE FROM reviews WHERE finding_id = ? AND (SELECT status FROM findings "
                                  "WHERE id = ?) NOT IN ('acknowledged', 'closed')", [(h[0], h[0]) for h in history])

    def add_history(self, rows: Iterable[tuple[str, float, str, str, str | None, str]]) -> None:
        """(finding id, at, new status, by, reason, note) rows of finding_history."""
        self.conn.executemany("INSERT INTO finding_history (finding_id, at, status, by, reason, note) "
                              "VALUES (?, ?, ?, ?, ?, ?)", rows)

    def _standing(self, findings: list[Finding]) -> dict[str, tuple[str, float | None]]:
        """Stored status and review time of those of `findings` the store has."""
        out: dict[str, tuple[str, float | None]] = {}
        for i in range(0, len(findings), 500):
            chunk = [f.id for f in findings[i:i + 500]]
            out.update((fid, (status, at)) for fid, status, at in self.conn.execute(
                "SELECT f.id, f.status, r.at FROM findings f LEFT JOIN reviews r ON r.finding_id = f.id "
                f"WHERE f.id IN ({','.join('?' * len(chunk))})", chunk))
        return out

    def add_series(self, points: Iterable[tuple[str, dict[str, str], float, float]]) -> None:
        self.conn.executemany("INSERT INTO series (name, labels, at, value) VALUES (?, ?, ?, ?)",
                              [(n, to_json(lbl), at, v) for n, lbl, at, v in points])

    def status_changes(self, findings: list[Finding]) -> bool:
        """True when any of `findings` is new to the store or has another fact status there (a person's
        acknowledgement or close of an open finding is no change of the fact)."""
        standing = self._standing(findings)
        return any(f.id not in standing or FACT.get(standing[f.id][0], standing[f.id][0]) != f.status
                   for f in findings)
