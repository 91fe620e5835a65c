"""F13 cdc_lost, F14 cdc_phantom, F15 cdc_replay, F16 cdc_transaction_incomplete: the CDC pipeline itself.

Seed 004 §4.4 checks a CDC pipeline (binlog -> connector -> Kafka) against the binlog it reads. With
`[cdc] mode = "check"` the monitor reads both: the binlog is the change source of the rules, and every
transaction the CDC topics deliver (collectors.cdc, as a `CdcCopy`) is lined up with the binlog's of the
same GTID, row for row. A row is known by its table, operation, primary key and how many rows of the
same three came before it in the transaction, so a dropped record leaves exactly its row unmatched.

- A binlog transaction with rows waits in `expected` for its copy. Once the CDC topics have delivered
  transactions committed `cdc_lost_grace_seconds` after it (the CDC clock: the newest commit time
  delivered, never the wall clock: a stopped connector delivers nothing and loses nothing, it lags),
  each of its rows is lost by the pipeline (F13, one finding per row, with its binlog coordinates). A
  copy that comes later still resolves the rows it holds.
- A copy whose binlog transaction has not been read waits in `unexpected`; once the binlog has been read
  past its commit by the same grace, its rows are phantoms (F14). Copies of transactions from before
  the monitor's first binlog position are not judged (`before_start`): the topics hold the connector's
  history, the binlog is read from the bootstrap on.
- A copy and its binlog transaction compared: binlog rows without a record are F13 at once, records
  without a binlog row F14 (records quarantined as undecodable stand for as many rows of their table).
- Any delivery (in source mode too): records of transactions delivered before, read again (a connector
  restart replays what it wrote since its last offset flush) are one F15 per run of them (info: nothing
  happened twice); a transaction whose END counts more records of the watched tables than came is F16.

Lag, for /metrics: the binlog transactions (and their rows) still waiting for their copy within the
grace, the age of the oldest, and the bytes of binlog from its start to the binlog's newest position
(`position_gap`, the seed's binlog-Kafka position difference).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from oncewatch.checks.findings import Findings, finding_id
from oncewatch.checks.horizon import BINLOG, CDC, Memory
from oncewatch.core.domain import Rules
from oncewatch.core.gtids import gtid_set, parse
from oncewatch.core.names import key_text
from oncewatch.core.records import CdcDelivery, RowChange, Transaction

FILES_KEPT = 64  # binlog files whose end the position gap remembers


def row_identities(rows: Iterable[RowChange]) -> list[list[Any]]:
    """[identity, coordinates, table, op, key] per row: the identity is table, op, key and the row's rank
    among the rows of the same three in its transaction."""
    seen: Counter[str] = Counter()
    out = []
    for r in rows:
        table, key = f"{r.schema}.{r.table}", key_text(r.pk)
        base = f"{table}\x1f{r.op}\x1f{key}"
        out.append([f"{base}\x1f{seen[base]}", r.coordinates, table, r.op, key])
        seen[base] += 1
    return out


def unmatched(ours: list[list[Any]], theirs: list[list[Any]], stand_ins: Counter[str]) -> list[list[Any]]:
    """The rows of `ours` whose identity is not in `theirs`, less, per table, one per `stand_ins` of it."""
    present = {r[0] for r in theirs}
    out = []
    spare = Counter(stand_ins)
    for r in ours:
        if r[0] in present:
            continue
        if spare[r[2]] > 0:
            spare[r[2]] -= 1
            continue
        out.append(r)
    return out


class PipelineChecks:
    def __init__(self, rules: Rules, memory: Memory, findings: Findings, against_binlog: bool):
        self.rules = rules
        self.findings = findings
        self.against_binlog = against_binlog
        grace = rules.cdc_lost_grace_seconds
        # gtid -> [{"t": commit time, "rows": row_identities, "from": [file, pos]: where its bytes begin}]
        self.expected = memory.deadlines("cdc_expected", CDC, grace)
        # gtid -> [{"t": commit time, "rows": row_identities (source coordinates), "at": its first record}]
        self.unexpected = memory.deadlines("cdc_unexpected", BINLOG, grace)
        self.marks = memory.counters("cdc_marks", {"start": None, "end": None, "file_ends": {}, "cdc_time": 0.0})
        self.counts = memory.counters("cdc_counts", {"before_start": 0, "replayed_records": 0})
        self.lag_seconds = 0.0

    # ------------------------------------------------------------ the binlog side

    def on_binlog(self, tx: Transaction) -> None:
        m = self.marks
        if tx.snapshot:  # the bootstrap: the binlog is read from its snapshot's position on
            if tx.complete:
                m["start"] = {str(d): seq for d, (_, seq) in gtid_set(tx.position.gtid).items()}
            return
        begin = m["end"] if m["end"] and m["end"][0] == tx.position.file else [tx.position.file, 0]
        m["end"] = [tx.position.file, tx.position.pos]
        ends = m["file_ends"]
        ends[tx.position.file] = tx.position.pos
        if len(ends) > FILES_KEPT:
            del ends[min(ends)]
        gtid = parse(tx.position.within_gtid or (tx.rows[0].txid if tx.rows else ""))
        if m["start"] is None and gtid is not None:  # no bootstrap seen: judged from the first transaction on
            m["start"] = {str(gtid[0]): gtid[2] - 1}
        if not tx.rows:
            return
        txid = tx.rows[0].txid
        rows = row_identities(tx.rows)
        copy = self.unexpected.take(txid)
        if copy is not None:
            self._compare(txid, rows, copy[0]["rows"], copy[0].get("q", {}), tx.commit_time, late=copy[1])
        else:
            self.expected.add(txid, {"t": tx.commit_time, "rows": rows, "from": begin})

    # ------------------------------------------------------------ the CDC side

    def on_delivery(self, tx: Transaction) -> None:
        """What any delivery tells of the pipeline: its replays (F15) and whether its END's count came (F16)."""
        d = tx.cdc
        if d is None:
            return
        m = self.marks
        m["cdc_time"] = max(m["cdc_time"], tx.commit_time, d.delivered_until)
        for run in d.replays:
            self.counts["replayed_records"] += run.records
            self.findings.raise_(
                "F15", (run.partition, run.first), replace=True,
                keys={"partition": run.partition, "from_offset": run.first, "to_offset": run.last,
                      "records": run.records},
                summary=f"{run.records} record(s) of {run.partition} from offset {run.first} to {run.last} were "
                        f"delivered before (transactions {run.first_gtid} to {run.last_gtid}): replayed after a "
                        f"connector restart, not applied twice", time=m["cdc_time"],
                evidence=[("cdc_replay", f"{run.partition}@{run.first}-{run.last}", m["cdc_time"],
                           ("records", "first_gtid", "last_gtid"), (run.records, run.first_gtid, run.last_gtid))])
        if d.incomplete:
            self._incomplete(tx, d)

    def _incomplete(self, tx: Transaction, d: CdcDelivery) -> None:
        txid = d.txid
        self.findings.raise_(
            "F16", (txid,), keys={"gtid": txid, "expected": d.expected, "came": d.records},
            summary=f"the CDC transaction {txid} counts {d.expected} record(s) of the watched tables in its END; "
                    f"{d.records} came within cdc.transaction_grace_seconds",
            time=tx.commit_time, evidence=[("cdc_transaction", d.first_record, tx.commit_time,
                                            ("gtid", "expected", "came"), (txid, d.expected, d.records))])

    def on_copy(self, tx: Transaction) -> None:
        """A transaction the CDC topics delivered, in check mode: lined up with the binlog's."""
        self.on_delivery(tx)
        txid = tx.cdc.txid if tx.cdc else ""
        gtid = parse(txid)
        if gtid is None or not (tx.rows or tx.quarantined or (tx.cdc and tx.cdc.expected)):
            return  # the connector's snapshot, or a transaction with nothing of the watched tables
        start = self.marks["start"]
        if start is None or gtid[2] <= start.get(str(gtid[0]), -1):
            self.counts["before_start"] += 1
            return
        rows = row_identities(tx.rows)
        stand_ins = dict(Counter(q.table for q in tx.quarantined))
        binlog = self.expected.take(txid)
        if binlog is not None:
            expected, late = list(binlog[0]["rows"]), binlog[1]
            while (more := self.expected.take(txid)) is not None:  # a transaction read from the binlog in fragments
                expected += more[0]["rows"]
                late = late or more[1]
            self._compare(txid, expected, rows, stand_ins, tx.commit_time, late=late)
        else:
            self.unexpected.add(txid, {"t": tx.commit_time, "rows": rows, "q": stand_ins})

    # ------------------------------------------------------------ judging

    def _compare(self, txid: str, binlog: list[list[Any]], cdc: list[list[Any]], stand_ins: dict[str, int],
                 at: float, late: bool) -> None:
        lost = unmatched(binlog, cdc, Counter(stand_ins))
        if late:  # judged lost (or phantom) before the other side came: what came now resolves its finding
            ids = {r[0] for r in lost}
            for r in binlog:
                if r[0] not in ids:
                    self.findings.resolve(_fid("F13", txid, r), at, "the CDC record came late")
            for r in cdc:
                self.findings.resolve(_fid("F14", txid, r), at, "the binlog row was read late")
        for r in lost:
            self._lost(txid, r, at, "its transaction's copy on the CDC topics lacks it")
        for r in unmatched(cdc, binlog, Counter()):
            self._phantom(txid, r, at, "no row of the binlog's transaction is it")

    def _lost(self, txid: str, r: list[Any], at: float, why: str) -> None:
        self._row("F13", "row_change", f"the binlog row {{}} has no record on the CDC topics: {why}", txid, r, at)

    def _phantom(self, txid: str, r: list[Any], at: float, why: str) -> None:
        self._row("F14", "cdc_record", f"the CDC record {{}} has no row in the binlog: {why}", txid, r, at)

    def _row(self, rule: str, kind: str, summary: str, txid: str, r: list[Any], at: float) -> None:
        """The finding of one row (a binlog row lost, a CDC record a phantom), its coordinates the evidence."""
        _, coordinates, table, op, key = r
        self.findings.raise_(
            rule, (txid, r[0]), keys={"gtid": txid, "table": table, "op": op, "pk": key},
            summary=summary.format(f"{table} {op} pk={key} ({coordinates})"), time=at,
            evidence=[(kind, coordinates, at, ("table", "op", "pk", "gtid"), (table, op, key, txid))])

    def tick(self, binlog_time: float, cdc_time: float) -> None:
        grace = self.rules.cdc_lost_grace_seconds
        for txid, item in self.expected.due(cdc_time):
            for r in item["rows"]:
                self._lost(txid, r, item["t"] + grace, f"the CDC topics delivered transactions committed "
                                                       f"{grace:g} s after it without it")
        for txid, item in self.unexpected.due(binlog_time):
            for r in item["rows"]:
                self._phantom(txid, r, item["t"] + grace, f"the binlog was read {grace:g} s past it without it")
        oldest = next(iter(self.expected.fresh.items.values()), None)
        self.lag_seconds = 0.0 if oldest is None else max(0.0, binlog_time - oldest[0])

    # ------------------------------------------------------------ for /metrics

    def stats(self) -> dict[str, Any]:
        waiting = [item for _, items in self.expected.fresh.items.values() for item in items]
        return {"against_binlog": self.against_binlog, "lag_transactions": len(waiting),
                "lag_rows": sum(len(i["rows"]) for i in waiting), "lag_seconds": self.lag_seconds,
                "position_gap": self._position_gap(waiting[0]["from"] if waiting else None), **self.counts}

    def _position_gap(self, begin: list[Any] | None) -> int:
        """Bytes of binlog from `begin` ([file, pos]) to the newest position read, over the files between."""
        end = self.marks["end"]
        if begin is None or end is None:
            return 0
        if begin[0] == end[0]:
            return max(0, end[1] - begin[1])
        ends = self.marks["file_ends"]
        between = sum(pos for f, pos in ends.items() if begin[0] < f < end[0])
        return max(0, ends.get(begin[0], begin[1]) - begin[1]) + between + end[1]


def _fid(rule: str, txid: str, r: list[Any]) -> str:
    return finding_id(rule, txid, r[0])
