"""Debezium's transaction-topic and data records in, committed `Transaction`s in commit order out (no I/O): the
`Assembler` of the package docstring, with the graces and replays it follows."""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from oncewatch.collectors.binlog import commit_time
from oncewatch.collectors.cdc.counts import ReplayRuns, Unreadable
from oncewatch.collectors.cdc.decode import NEW_KEY, OLD_KEY, DataRecord, Marker, Schemas, read_record
from oncewatch.collectors.cdc_snapshots import SnapshotPasses
from oncewatch.collectors.debezium_rows import Undecodable
from oncewatch.core.config import MySQLConfig
from oncewatch.core.gtids import GtidSet, gtid_set, gtid_text, parse
from oncewatch.core.names import UNDECODABLE, UNPARSEABLE
from oncewatch.core.protocol import CdcCounts
from oncewatch.core.records import (CLOCK_BINLOG_HEADER, OP_DELETE, OP_INSERT, OP_UPDATE, BinlogPosition,
                                    CdcDelivery, Packed, QuarantinedRows, RowChange, SchemaChange, Transaction)

log = logging.getLogger("oncewatch.collectors.cdc")

OPS = {"c": OP_INSERT, "u": OP_UPDATE, "d": OP_DELETE, "r": OP_INSERT}
GRACE_SECONDS = 30.0
# the connector counts as writing for this long after the last record read of its topics: the grace of a transaction
# whose records have not come runs only while it writes (a worker restarting, which can take longer than the grace,
# writes nothing, and then writes again what it had not sent)
WRITING_SECONDS = 5.0
WITHOUT_END_KEPT = 1000  # transactions handed on without an END whose rows are remembered


def row_of(record: DataRecord) -> tuple[Any, ...]:
    """Which binlog row a record is: what the binlog fixes for it, the same when a restarted connector writes it
    again (its `total_order` and Kafka offset are not). A primary-key change's delete and insert share the row."""
    return record.db, record.table, record.file, record.pos, record.row, record.op


@dataclass
class _Open:
    records: list[DataRecord] = field(default_factory=list)
    expected: int | None = None  # from the END: records of the watched tables; None: no END came
    ended_at: float = 0.0
    ended_writing: float = 0.0  # the Assembler's `writing` then
    over: bool = False  # its END came, or the next transaction's BEGIN: it is in `ends`
    rows: set[tuple[Any, ...]] = field(default_factory=set)  # row_of each record in `records`
    # the connector was restarted inside it: its BEGIN came again, or records of it did. The END then counts only
    # what the last connector run wrote, from `total_order` 1 again, not every record of it (Assembler.ready)
    restarted: bool = False
    top_order: int = 0  # the highest total_order of its records, replayed ones too
    tables: set[str] = field(default_factory=set)  # "schema.table" of the watched tables its END names

    def add(self, record: DataRecord) -> bool:
        """Holds `record`; False when it holds that row already (the connector wrote it again)."""
        self.top_order = max(self.top_order, record.order)
        row = row_of(record)
        if row in self.rows:
            self.restarted = True
            return False
        self.rows.add(row)
        self.records.append(record)
        return True

    def short(self) -> bool:
        """Records its END counts have not come (yet)."""
        if self.expected is None:
            return False
        return self.top_order < self.expected if self.restarted else len(self.records) < self.expected


class Assembler:
    """Transaction-topic and data records in, Transactions in commit order out (no I/O).

    Feed a whole poll's records, then take `ready()`: a transaction without an END (its BEGIN followed
    by another's) goes in its place with the records that came by then, and one of its records that
    comes later still goes on, at once and out of its place, counted in `late`."""

    def __init__(self, cfg: MySQLConfig, start_gtid: str = "", grace_seconds: float = GRACE_SECONDS,
                 prefix: str = "", heartbeat_topic: str = ""):
        """`heartbeat_topic`: the connector's heartbeats (cdc.heartbeat_topic), read as a sign that it writes."""
        self.cfg = cfg
        self.grace = grace_seconds
        self.prefix = prefix
        self.transaction_topic = f"{prefix}.transaction"
        self.heartbeat_topic = heartbeat_topic
        self.schemas = Schemas()
        self.done = gtid_set(start_gtid)
        self.done_text = gtid_text(self.done)  # kept with `done`: every transaction's position carries it
        self.open: dict[str, _Open] = {}
        self.ends: deque[str] = deque()  # transactions over (an END, or the next one's BEGIN), in commit order
        self.begun: str | None = None  # the newest BEGIN's transaction while its END has not come
        # the binlog time (s) of the newest END read, of any transaction, one with nothing watched or none captured
        # too: the connector had read the binlog up to that commit (checks.clocks.heartbeat_watermark)
        self.newest_end = 0.0
        self.newest: GtidSet = {}  # per GTID domain, the newest transaction whose BEGIN was read (older: replays)
        # per partition, the newest transaction (domain, sequence) a record of it belongs to: the connector writes a
        # partition in order, so every record it wrote there of an older transaction is in
        self.newest_in: dict[str, tuple[int, int]] = {}
        self.parts_of: dict[str, set[str]] = {}  # "schema.table" -> the partitions its records came in
        # recent ones handed on that had no END, each with the rows it held (row_of): a record of one that comes later
        # is late, or written again by a restarted connector
        self.without_end: OrderedDict[str, set[tuple[Any, ...]]] = OrderedDict()
        self.incomplete = self.late = self.resnapshots = 0
        self.resnapshotting = False  # the records read last were of a new snapshot (logged at its first)
        self.snapshot_passes = SnapshotPasses()  # the first snapshot's rows, while it may be taken again
        self.resumed = bool(self.done)  # changes were streamed before this reader's start
        self.streamed_in: set[str] = set()  # the partitions that gave a streamed change
        self.level_at = float("-inf")  # the last time some topic was not read to its end (ready's `behind`)
        self.fed_at = float("-inf")  # the last time a record was read
        self.writing = 0.0  # seconds the connector has been writing (WRITING_SECONDS), as of `writing_at`
        self.writing_at: float | None = None
        self.replays = ReplayRuns()
        # per partition, offsets of records held in `open`, and of the BEGINs of transactions not handed on yet
        self.pending: dict[str, OrderedDict[int, None]] = {}
        self.begins: dict[str, tuple[str, int]] = {}  # txid -> where its BEGIN is, until it is handed on
        self.unreadable = Unreadable("a CDC record is not a Debezium change event with its schema; kept in quarantine")
        self._commit_time_columns: dict[Any, Any] = {}  # (schema, table) -> its [mysql.commit_time_columns] entry
        self._watched: dict[str, bool] = {}  # "schema.table" of an END's data collection -> watched or not
        # where the topics are read on from after the transaction being handed on (the collector's positions)
        self.offsets: Callable[[], dict[str, int]] = dict

    def topics(self) -> list[str]:
        """The transaction topic, the watched tables' and the connector's heartbeats' (`heartbeat.interval.ms`; read
        where the connector writes them: an idle connector's records that it is alive, WRITING_SECONDS)."""
        beats = [self.heartbeat_topic] if self.heartbeat_topic else []
        return [self.transaction_topic, *beats] + [f"{self.prefix}.{e}" for e in self.cfg.tables]

    def counts(self) -> CdcCounts:
        """What the source's health row and /metrics count."""
        return CdcCounts(incomplete_transactions=self.incomplete, replayed_records=self.replays.records,
                         late_records=self.late, unreadable_records=self.unreadable.records,
                         open_transactions=len(self.open))

    def feed(self, topic: str, partition: int, rec: Any, now: float, part: str = "") -> list[Transaction]:
        """One Kafka record of the topics (kafka-python's ConsumerRecord): what it lets go on at once; `part`: its
        "topic/partition", where the caller has it made already."""
        self.fed_at = now
        if topic == self.heartbeat_topic:
            return []
        try:
            if topic == self.transaction_topic:
                if rec.value is not None:
                    self.on_transaction(self.schemas.marker(rec.value), now, (part or f"{topic}/{partition}",
                                                                               rec.offset))
                return []
            record = read_record(topic, partition, rec.offset, rec.key, rec.value, rec.headers, self.schemas, part)
        except (Undecodable, msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError) as exc:
            self.unreadable.add(part or f"{topic}/{partition}", rec.offset, topic, UNPARSEABLE, str(exc))
            return []
        return [] if record is None else list(self.on_record(record))

    @property
    def waiting(self) -> bool:
        """Records read whose transaction is not handed on yet."""
        return bool(self.open)

    def _seen(self, txid: str) -> bool:
        gtid = parse(txid)
        return gtid is not None and gtid[0] in self.done and gtid[2] <= self.done[gtid[0]][1]

    def _replayed(self, txid: str) -> bool:
        """`txid` was handed on, or is older than a transaction whose BEGIN was read while it is neither under way
        nor waiting: the connector, restarted, reads the binlog again from before it (from before this reader's
        start, too, where that began from the topics' ends)."""
        if self._seen(txid):
            return True
        gtid = parse(txid)
        newest = self.newest.get(gtid[0]) if gtid is not None else None
        return (newest is not None and gtid is not None and gtid[2] < newest[1] and txid != self.begun
                and txid not in self.open)

    def on_transaction(self, payload: dict[str, Any] | Marker, now: float,
                       where: tuple[str, int] | None = None) -> None:
        """A BEGIN or END of the transaction topic (its payload as read, or as a dict); `where`: its ("topic/partition",
        offset), held as where a restart reads from until its transaction is handed on: its END may be read before
        its records are, and a restart from past it would wait for that END for good."""
        marker = payload if isinstance(payload, Marker) else msgspec.convert(payload, Marker)
        txid = marker.id
        self.fed_at = now
        if marker.status == "BEGIN":
            again = self.open.get(txid)
            if txid == self.begun or self._replayed(txid) or (again is not None and again.over):
                # written again by a restarted connector, which reads the binlog again from its last flushed offset:
                # the transaction under way comes again from there, and is not over
                for under_way in {self.begun, txid if again is not None else None} - {None}:
                    self._restarted(self.open.setdefault(under_way, _Open()), now)
                return
            if self.begun is not None:  # DDL, a TRUNCATE, or one no captured table took part in
                self._over(self.begun, None, now)
            self.begun = txid
            gtid = parse(txid)
            if gtid is not None:
                self.newest[gtid[0]] = gtid[1:]
            if self.begun is not None and where is not None:
                self.begins[txid] = where
                self.pending.setdefault(where[0], OrderedDict())[where[1]] = None
            return
        if marker.status != "END":
            return
        self.newest_end = max(self.newest_end, marker.ts_ms / 1000)
        if self._replayed(txid):
            return
        if txid == self.begun:
            self.begun = None
        watched = self._watched
        expected = 0
        for c in marker.data_collections or ():
            name = c.data_collection
            is_watched = watched.get(name)
            if is_watched is None:
                is_watched = watched[name] = self.cfg.watched.qualified(name) is not None
            expected += (c.event_count or 0) if is_watched else 0
        self._over(txid, expected, now, {c.data_collection for c in marker.data_collections or ()
                                         if watched.get(c.data_collection)})

    def _over(self, txid: str, expected: int | None, now: float, tables: set[str] | None = None) -> None:
        """`txid` is over: in `ends`, once. A marker of it that comes again (its END after the next BEGIN placed
        it, as the topic's history of connector restarts has it) only gives it the END's count."""
        tx = self.open.setdefault(txid, _Open())
        if tx.over:
            tx.expected = expected if expected is not None else tx.expected
            self._restarted(tx, now)
            return
        tx.expected, tx.ended_at, tx.ended_writing, tx.over = expected, now, self.writing, True
        tx.tables |= tables or set()
        self.ends.append(txid)

    def _restarted(self, tx: _Open, now: float) -> None:
        """A marker of `tx` came again: the connector, restarted, writes it again, so its grace begins again."""
        tx.restarted = True
        tx.ended_at, tx.ended_writing = now, self.writing

    def on_record(self, record: DataRecord) -> Iterator[Transaction]:
        if record.op == "r":  # the connector's snapshot: no transaction, a row of the tables as they were
            name = f"snapshot:{record.db}.{record.table}"
            # a new snapshot of tables whose changes were streamed since the first (in this partition, which the
            # connector writes in order, or before this reader's start): rows known. The first snapshot's rows may still
            # be read after a change another partition streamed: the partitions are read each at its own pace
            if self.resumed or record.part in self.streamed_in:
                if not self.resnapshotting:
                    self.resnapshotting = True
                    log.warning("the connector takes a new snapshot of tables it streamed (its offsets lost, or "
                                "snapshot.mode when_needed); its rows are taken as known, and counted as replays: "
                                "a change it did not stream before the snapshot is not applied",
                                extra={"event": "cdc_snapshot_again", "at": f"{record.part}@{record.offset}"})
                self.resnapshots += 1
                self.replays.replayed(record.part, record.offset, name)
                return
            if self.snapshot_passes.again(record):  # a worker stopped during the snapshot: taken again
                self.replays.replayed(record.part, record.offset, name)
                return
            self.replays.ended(record.part)
            yield self._transaction(name, [record], snapshot_last=record.snapshot_last)
            return
        self.resnapshotting = False
        if record.part not in self.streamed_in:
            self.streamed_in.add(record.part)
            self.snapshot_passes.streamed(f"{record.db}.{record.table}")
        gtid = parse(record.txid)
        if gtid is not None:
            newest = self.newest_in.get(record.part)
            if newest is None or newest[0] != gtid[0] or newest[1] < gtid[2]:
                self.newest_in[record.part] = (gtid[0], gtid[2])
        table = f"{record.db}.{record.table}"
        if record.part not in self.parts_of.get(table, ()):
            self.parts_of.setdefault(table, set()).add(record.part)
        tx = self.open.get(record.txid)
        handed = self.without_end.get(record.txid) if tx is None else None
        if tx is not None:
            if tx.add(record):
                self._hold(record)
            else:
                self.replays.replayed(record.part, record.offset, record.txid)
        elif handed is not None and row_of(record) not in handed:
            self.late += 1
            log.error("a record of a CDC transaction without an END came after the transactions behind it; handed "
                      "on out of its place", extra={"event": "cdc_record_late", "gtid": record.txid,
                                                    "at": f"{record.topic}/{record.partition}@{record.offset}"})
            handed.add(row_of(record))
            yield self._transaction(record.txid, [record], first_row=len(handed) - 1)
        elif handed is not None or self._replayed(record.txid):
            self.replays.replayed(record.part, record.offset, record.txid)
        else:
            tx = self.open[record.txid] = _Open()
            tx.add(record)
            self._hold(record)

    def replay_notice(self) -> Transaction | None:
        """An empty transaction carrying the replays read since the last one handed on, if there are any."""
        return self._transaction("", []) if self.replays.grown else None

    def ready(self, now: float, behind: bool = False) -> Iterator[Transaction]:
        """Transactions over whose records are all in, oldest first; one waiting past the grace goes as it is.
        `behind`: some topic is not read to its end yet, so a record not read may simply be further on: the grace
        runs only from when every topic is read to its end (a monitor catching up reads the small transaction
        topic far ahead of the tables' topics, and its transactions would all go incomplete)."""
        if behind:
            self.level_at = now
        if self.writing_at is not None:
            self.writing += max(0.0, min(now, self.fed_at + WRITING_SECONDS) - self.writing_at)
        self.writing_at = now
        while self.ends:
            txid = self.ends[0]
            tx = self.open[txid]
            short = tx.short()
            if short or tx.restarted:
                # its records may still come: every topic is read to its end, and the connector wrote a later
                # transaction's records in each partition of its tables, or the grace passed without that
                waited = min(now - max(tx.ended_at, self.level_at), self.writing - tx.ended_writing)
                if behind or (waited < self.grace and not self._written_past(txid, tx)):
                    return
            if short:
                self.incomplete += 1
                log.error("a CDC transaction's END counts records that did not come; handed on without them",
                          extra={"event": "cdc_transaction_incomplete", "gtid": txid, "expected": tx.expected,
                                 "came": len(tx.records)})
            if tx.expected is None:
                self.without_end[txid] = tx.rows
                if len(self.without_end) > WITHOUT_END_KEPT:
                    self.without_end.popitem(last=False)
            self.ends.popleft()
            del self.open[txid]
            for r in tx.records:
                self.pending[r.part].pop(r.offset, None)
            begun = self.begins.pop(txid, None)
            if begun is not None:
                self.pending[begun[0]].pop(begun[1], None)
            self._advance(txid)
            # in binlog order: a restarted connector numbers `total_order` from 1 again
            yield self._transaction(txid, sorted(tx.records, key=lambda r: (r.pos, r.row)), expected=tx.expected)

    def _written_past(self, txid: str, tx: _Open) -> bool:
        """The connector wrote a transaction after `txid` in every partition of its tables (those of its records and
        those its END names), so no more of it is to come; true at once of one with nothing of the watched tables."""
        parts = {r.part for r in tx.records}.union(*(self.parts_of.get(t, {""}) for t in tx.tables))
        gtid = parse(txid)
        return not parts or gtid is not None and all(
            (newest := self.newest_in.get(p)) is not None and newest[0] == gtid[0] and newest[1] > gtid[2]
            for p in parts)

    def first_pending(self) -> dict[str, int]:
        """Per partition ("topic/partition"), the offset of its first record of a transaction not handed on yet."""
        return {key: next(iter(offsets)) for key, offsets in self.pending.items() if offsets}

    def _hold(self, record: DataRecord) -> None:
        # records come in offset order per partition, so each partition's first is its oldest; a record not
        # replayed ends its partition's run of replays
        self.replays.ended(record.part)
        self.pending.setdefault(record.part, OrderedDict())[record.offset] = None

    def _advance(self, txid: str) -> None:
        gtid = parse(txid)
        if gtid is not None and not self._seen(txid):  # not a MariaDB GTID: nothing to resume by
            self.done[gtid[0]] = gtid[1:]
            self.done_text = gtid_text(self.done)

    def _transaction(self, txid: str, records: list[DataRecord], snapshot_last: bool = False,
                     expected: int | None = None, first_row: int = 0) -> Transaction:
        """`first_row`: the first row's row_index (a late record's: after those of its transaction handed on)."""
        rows: list[RowChange] = []
        bad = self.unreadable.take()
        changes: list[SchemaChange] = []
        merged = _merge_key_changes(records) if any(r.key_changed for r in records) else records
        last = records[-1] if records else None
        header = 0.0
        for r in records:
            header = r.header_time if r.header_time > header else header
        columns_of = self._commit_time_columns
        for r in merged:
            if r.undecodable is not None or r.op == "t":
                table = f"{r.db}.{r.table}"
            if r.undecodable is not None:
                # kept by the record's Kafka coordinates: the rows of one binlog event share its position
                bad.append(QuarantinedRows(txid=txid, binlog_file=f"{r.topic}/{r.partition}", event_pos=r.offset,
                                           table=table, reason=UNDECODABLE,
                                           detail=f"{r.topic}/{r.partition}@{r.offset} ({r.file}:{r.pos}): "
                                                  f"{r.undecodable}"))
                continue
            if r.op == "t":
                changes.append(SchemaChange(table=table, kind="truncate", statement=f"TRUNCATE {table} (from CDC)",
                                            columns={}, txid=txid, binlog_file=r.file, pos=r.pos))
                continue
            columns = columns_of.get((r.db, r.table), columns_of)
            if columns is columns_of:
                columns = columns_of[(r.db, r.table)] = self.cfg.commit_time_columns.get(
                    self.cfg.watched.entry(r.db, r.table))
            when, clock = commit_time(r.after, columns, r.header_time, CLOCK_BINLOG_HEADER)
            op = r.op  # RowChange's fields in order (positional: one is made per row)
            rows.append(RowChange(r.db, r.table, OPS[op], r.pk, r.before if op == "u" or op == "d" else None,
                                  r.after if op != "d" else None, txid,
                                  r.offset if op == "r" else first_row + len(rows), r.file,
                                  r.pos, when, clock, op == "r"))
        position = BinlogPosition(gtid=self.done_text, file=last.file if last else "",
                                  pos=last.pos if last else 0)
        snapshot = bool(records) and records[0].op == "r"
        first = records[0] if records else None
        delivery = CdcDelivery(offsets=self.offsets(), txid="" if snapshot else txid, expected=expected,
                               records=len(records),
                               first_record=f"{first.topic}/{first.partition}@{first.offset}" if first else "",
                               replays=self.replays.take())
        return Transaction(rows=Packed(rows), position=position, commit_time=header, quarantined=tuple(bad),
                           schema_changes=tuple(changes), snapshot=snapshot, complete=not snapshot or snapshot_last,
                           cdc=delivery)


def _merge_key_changes(records: list[DataRecord]) -> list[DataRecord]:
    """A primary-key change (the delete marked NEW_KEY, then the insert marked OLD_KEY) as one update, as the
    binlog has it."""
    out: list[DataRecord] = []
    for r in records:
        prev = out[-1] if out else None
        if (r.key_changed == OLD_KEY and r.op == "c" and prev is not None and prev.key_changed == NEW_KEY
                and prev.op == "d" and (prev.db, prev.table) == (r.db, r.table)):
            out[-1] = prev._replace(op="u", after=r.after, pk=r.pk, key_changed=None)
            continue
        out.append(r)
    return out
