"""The monitor's own memory (docs/architecture.md §2, §7): checkpoints, records, open state and findings.

SQLite in WAL mode by default, or a PostgreSQL database shared by several processes
(`[store] url`, store.postgres). Everything a batch of input produced (the rows or events, the state the
engine derived, the findings, and the checkpoint that says how far input was read) is
written in one `with store.batch() as tx:` block, i.e. one SQLite transaction, so a kill -9
at any instant resumes with nothing lost and nothing doubled. One monitor writes a store
(`open_monitor`: its lock, store.lock); readers (dashboards, exports) open their own connections
(`open_reader`) and never block it, and a person's review is a short write beside it (`open_writer`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from oncewatch.core.config import PostgresTarget
from oncewatch.core.exact_json import from_json
from oncewatch.core.names import OPEN
from oncewatch.core.protocol import Health, HealthRow
from oncewatch.core.records import (EmittedEvent, Finding, QuarantinedRecord, QuarantinedRows, RowChange,
                                    TradeVerdict)
from oncewatch.store import engine_state, entities, journal
from oncewatch.store.batch import Batch
from oncewatch.store.codec import (EVENT_COLUMNS, FINDING_COLUMNS, ROW_CHANGE_COLUMNS, VERDICT_COLUMNS, HealthRowError,
                                   event_from_row, finding_from_row, headers_from_json, health_from_json, health_json,
                                   row_change_from_row, verdict_from_row)
from oncewatch.store.errors import StoreError
from oncewatch.store.files import MEMORY, create_private, make_dir, make_private, require_space, said_full
from oncewatch.store.lock import MonitorLock
from oncewatch.store.moves import move_older
from oncewatch.store.packing import Packer
from oncewatch.store.dialect import POSTGRES, SQLITE, postgres_schema
from oncewatch.store.schema import SCHEMA, add_columns, columns, connect, create, set_older_aside

POSTGRES_SCHEMA = postgres_schema(SCHEMA)
COUNTED = ("row_changes", "events", "quarantine", "findings", "entity_names", "entity_entries", "event_entries",
           "series")

class Store:
    """A handle on the store at `target` (a SQLite file's path, or a PostgreSQL database), created there
    when there is none (a writer's only); `readonly=True` for readers. The monitor's comes from
    `open_monitor`, with its lock (`held`, or the PostgreSQL session's `monitor` lock)."""

    def __init__(self, target: str | PostgresTarget, *, readonly: bool = False, held: MonitorLock | None = None,
                 monitor: bool = False):
        self.path = str(target)
        self._lock = threading.Lock()
        self.packer: Packer
        self.entity_ids = entities.EntityIds()
        self.spaces = engine_state.Spaces()
        self.sources = journal.row_sources()
        self.event_sources = journal.event_sources()
        self._held = held
        if isinstance(target, PostgresTarget):
            from oncewatch.store import postgres  # psycopg for a PostgreSQL store only: it doubles a command's start-up

            self.dialect = POSTGRES
            self.conn = postgres.connect(target, readonly=readonly, role="monitor" if monitor else
                                         "reader" if readonly else "writer")
            try:
                self._open_postgres(readonly, monitor)
            except BaseException:
                self.conn.close()
                raise
            self.packer = Packer(self.conn)
            return
        self.dialect = SQLITE
        if not readonly and target != MEMORY and not os.path.lexists(target):
            create(target)
        self.conn = connect(target, readonly=readonly)
        self.packer = Packer(self.conn)
        if not readonly:
            with said_full(target):
                set_older_aside(self.conn, self.dialect.tables)
                self.conn.executescript(SCHEMA)  # a store made by an older version gains the newer tables
                with self.batch() as tx:
                    add_columns(self.conn)  # and the newer columns of its older tables
                    move_older(self.conn, self.dialect, self.entity_ids, self.spaces, self.sources,
                               self.event_sources, tx.insert_rows)

    def _open_postgres(self, readonly: bool, monitor: bool) -> None:
        from oncewatch.store import postgres

        made = postgres.schema_mark(self.conn)
        if made == "" and readonly:
            raise StoreError(f"there is no store in {self.path} yet: the monitor has not run with this config "
                             f"(`oncewatch run --config FILE` creates it)")
        if monitor:
            postgres.lock(self.conn)
        if not readonly and made != postgres.digest(POSTGRES_SCHEMA):
            postgres.create(self.conn, POSTGRES_SCHEMA)  # a new store, or one made by an older version: newer tables

    def close(self) -> None:
        self.conn.close()
        if self._held is not None:
            self._held.release()

    @contextmanager
    def batch(self) -> Iterator[Batch]:
        with self._lock, said_full(self.path):
            self.conn.execute(self.dialect.begin_write)
            try:
                tx = Batch(self.conn, self.dialect, self.packer, self.entity_ids, self.spaces, self.sources,
                           self.event_sources)
                yield tx
                tx.repack()
                self.conn.execute("COMMIT")
            except BaseException:
                self.packer.rolled_back()
                self.entity_ids.rolled_back()
                self.spaces.rolled_back()
                self.sources.rolled_back()
                self.event_sources.rolled_back()
                # SQLite may have rolled back itself (SQLITE_FULL can): a ROLLBACK then would raise and
                # hide the error that matters.
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise
            self.packer.committed()
            self.entity_ids.committed()
            self.spaces.committed()
            self.sources.committed()
            self.event_sources.committed()

    # -------------------------------------------------------------- reads

    def checkpoint(self, name: str) -> Any:
        row = self.conn.execute("SELECT value FROM checkpoints WHERE name = ?", (name,)).fetchone()
        return None if row is None else from_json(row[0])

    def state(self, name: str, default: Any = None) -> Any:
        row = self.conn.execute("SELECT value FROM state WHERE name = ?", (name,)).fetchone()
        return default if row is None else from_json(row[0])

    def set_health(self, component: str, health: Health) -> None:
        with self._lock, said_full(self.path):
            self.conn.execute("INSERT INTO health (component, value, updated_at) VALUES (?, ?, ?) "
                              "ON CONFLICT(component) DO UPDATE SET value=excluded.value, "
                              "updated_at=excluded.updated_at", (component, health_json(health), time.time()))

    def health(self) -> dict[str, HealthRow]:
        """Every component's last health row. A row an older oncewatch wrote (no kind) is left out: the monitor
        writes its own again every second, and a group's member its own once it runs this version."""
        rows = {}
        for c, v, at in self.conn.execute("SELECT component, value, updated_at FROM health"):
            try:
                rows[c] = HealthRow(c, health_from_json(v), at)
            except HealthRowError:
                continue
        return rows

    def row_changes(self, where: str = "", params: tuple = (), limit: int | None = None) -> list[RowChange]:
        sql = (f"SELECT {ROW_CHANGE_COLUMNS} FROM {journal.rows_from(self.conn)} " + (f"WHERE {where} " if where else "")
               + "ORDER BY seq" + (f" LIMIT {int(limit)}" if limit else ""))
        return [row_change_from_row(r, self.packer.unpack) for r in self.conn.execute(sql, params)]

    def events(self, where: str = "", params: tuple = (), limit: int | None = None) -> list[EmittedEvent]:
        sql = (f"SELECT {EVENT_COLUMNS} FROM {journal.events_from(self.conn)} " + (f"WHERE {where} " if where else "")
               + 'ORDER BY topic, partition, "offset"' + (f" LIMIT {int(limit)}" if limit else ""))
        return [event_from_row(*r[:-1], self.packer.unpack(r[-1])) for r in self.conn.execute(sql, params)]

    def quarantined(self, limit: int | None = None) -> list[QuarantinedRecord]:
        """Quarantined Kafka records with their bytes, by topic, partition and offset (the first `limit`)."""
        # A reader may open a store that no writer of this version has given the column yet.
        timestamp_type = "r.timestamp_type" if "timestamp_type" in columns(self.conn, "quarantine_raw") else "NULL"
        return [QuarantinedRecord(*r[:8], key=r[8], value=r[9], headers=headers_from_json(r[10]) if r[10] else (),
                                  timestamp_type=r[11])
                for r in self.conn.execute(
                    'SELECT q.topic, q.partition, q."offset", q.timestamp_ms, q.reason, q.detail, q.size, q.preview, '
                    f"r.record_key, r.value, r.headers, {timestamp_type} FROM quarantine q LEFT JOIN quarantine_raw r "
                    'USING (topic, partition, "offset") ORDER BY q.topic, q.partition, q."offset"'
                    + (f" LIMIT {int(limit)}" if limit else ""))]

    def binlog_quarantined(self) -> list[QuarantinedRows]:
        """Binlog rows events that could not be decoded, in binlog order."""
        return [QuarantinedRows(*r) for r in self.conn.execute(
            "SELECT txid, binlog_file, event_pos, table_name, reason, detail FROM binlog_quarantine "
            "ORDER BY binlog_file, event_pos")]

    def binlog_quarantine_counts(self) -> dict[str, int]:
        """reason -> how many binlog rows events the store keeps in quarantine."""
        return dict(self.conn.execute("SELECT reason, count(*) FROM binlog_quarantine GROUP BY reason").fetchall())

    def quarantine_counts(self) -> dict[tuple[str, str], int]:
        """(topic, reason) -> how many records the store keeps in quarantine: what /metrics counts, so
        the count survives a restart."""
        return {(t, r): n for t, r, n in self.conn.execute(
            "SELECT topic, reason, count(*) FROM quarantine GROUP BY topic, reason")}

    def used_bytes(self) -> int | None:
        """Bytes of the store's file in use (its free pages, which new rows fill first, and its WAL left out): what
        `store.max_bytes` budgets. None for a PostgreSQL store, whose disk is its database's."""
        if self.dialect is POSTGRES:
            return None
        (size,), = self.conn.execute("SELECT page_size * (page_count - freelist_count) FROM pragma_page_size, "
                                     "pragma_page_count, pragma_freelist_count")
        return int(size)

    def count(self, table: str) -> int:
        """Rows in one of the store's record tables (benchmarks, tests)."""
        if table not in COUNTED:
            raise ValueError(f"count() takes one of {', '.join(COUNTED)}, not {table!r}")
        return self.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]

    def seen_span(self) -> tuple[float | None, float | None]:
        """The earliest first_seen and the latest last_seen of all findings."""
        return self.conn.execute("SELECT min(first_seen), max(last_seen) FROM findings").fetchone()

    def finding_counts(self) -> list[tuple[str, str, str, int]]:
        """(rule, severity, status, count) of every finding in the store."""
        return self.conn.execute("SELECT rule, severity, status, count(*) FROM findings "
                                 "GROUP BY rule, severity, status ORDER BY rule, severity, status").fetchall()

    def paging_findings(self, rules: Sequence[str], limit: int) -> tuple[list[tuple[str, str, str, dict]], int]:
        """The findings that page, of `rules`: open (nobody has acknowledged or closed them) and above info.
        (id, rule, severity, keys) of the `limit` oldest, by first_seen then id, and how many there are in all,
        read in one snapshot."""
        marks = ",".join("?" * len(rules))
        where = f"FROM findings WHERE status = ? AND severity <> ? AND rule IN ({marks})"
        params = [OPEN, "info", *rules]
        with self.snapshot():
            oldest = self.conn.execute(f"SELECT id, rule, severity, keys {where} ORDER BY first_seen, id LIMIT ?",
                                       [*params, limit]).fetchall()
            total = self.conn.execute(f"SELECT count(*) {where}", params).fetchone()[0]
        return [(fid, rule, severity, from_json(keys)) for fid, rule, severity, keys in oldest], total

    def finding_ids(self) -> set[str]:
        return {fid for (fid,) in self.conn.execute("SELECT id FROM findings")}

    def findings_by_id(self, ids: Iterable[str]) -> list[Finding]:
        ids = list(ids)
        out: list[Finding] = []
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            out += [finding_from_row(r) for r in self.conn.execute(
                f"SELECT {FINDING_COLUMNS} FROM findings WHERE id IN ({','.join('?' * len(chunk))})", chunk)]
        return out

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

    def trade_verdicts(self, since: float | None = None, until: float | None = None) -> list[TradeVerdict]:
        """The verdicts of the trades committed in [since, until) (either end open when None), by commit time
        then trade_no (checks.verdicts decides them, store.verdicts writes them)."""
        clauses, params = [], []
        if since is not None:
            clauses.append("committed_at >= ?")
            params.append(since)
        if until is not None:
            clauses.append("committed_at < ?")
            params.append(until)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return [verdict_from_row(r) for r in self.conn.execute(
            f"SELECT {VERDICT_COLUMNS} FROM trade_verdicts{where} ORDER BY committed_at, trade_no", params)]

    def backup(self, path: str) -> None:
        """A consistent copy of the whole store in a new file (taken while the monitor may write), as
        private as the store: VACUUM INTO fills an empty file made 0600 here."""
        if self.dialect is not SQLITE:
            raise StoreError(f"the PostgreSQL store {self.path} is copied with pg_dump, not by oncewatch")
        with said_full(path):
            os.close(create_private(path))
            self.conn.execute("VACUUM INTO ?", (path,))

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One read transaction: everything read inside sees the same committed state."""
        self.conn.execute(self.dialect.begin_snapshot)
        try:
            yield
        finally:
            self.conn.execute("COMMIT")


def open_monitor(target: str | PostgresTarget) -> Store:
    """The monitor's handle on its store, held alone while it runs (StoreLockedError for a second
    monitor). A missing store is created; an empty or foreign file (or database) is refused
    (NotAStoreError) and never bootstrapped over; a disk without room is StoreFullError here, at
    every start until there is room, before any source is asked."""
    if isinstance(target, PostgresTarget):
        return Store(target, monitor=True)
    if target == MEMORY:
        return Store(target)
    make_dir(target)
    held = MonitorLock.acquire(target)
    try:
        require_space(target)
        store = Store(target, held=held)
    except BaseException:
        held.release()
        raise
    try:
        make_private(target)  # only once it is known to be a store: a stranger's file keeps its mode
    except BaseException:
        store.close()
        raise
    return store


def open_writer(target: str | PostgresTarget) -> Store:
    """The store at `target` for a short write beside the monitor (a person's review); StoreError when
    there is none yet, rather than a new empty store."""
    open_reader(target).close()
    return Store(target)


def open_reader(target: str | PostgresTarget) -> Store:
    """The store at `target`, read-only; StoreError (saying what to do) when there is none yet, and
    NotAStoreError for a file that is not one."""
    if not isinstance(target, PostgresTarget) and (target == MEMORY or not Path(target).is_file()):
        raise StoreError(f"there is no store at {target}: the monitor has not run with this config yet "
                         f"(`oncewatch run --config FILE` creates it)")
    return Store(target, readonly=True)
