"""The reads behind the pages, /metrics, the CLI and the exports: findings by filter, a drill-down
timeline, the small charts' series. Each takes a `Store` (read-only is enough) and returns records
or plain data; a page load costs a few indexed SQLite reads whatever the size of the store.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from oncewatch.core.exact_json import from_json
from oncewatch.core.names import ENTITY_KINDS, key_text
from oncewatch.core.records import EmittedEvent, Finding, RowChange
from oncewatch.store.codec import (FINDING_COLUMNS, ROW_CHANGE_COLUMNS, HistoryEntry,
                                   finding_from_row, row_change_from_row)
from oncewatch.store import entities as entity_index
from oncewatch.store import retention
from oncewatch.store.dialect import Dialect
from oncewatch.store.journal import events_from, rows_from
from oncewatch.store.store import Store

# A drill-down shows at most this many rows and events of one entity, newest kept.
TIMELINE_LIMIT = 2000


def series(store: Store, name: str, since: float, label: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """Points of one series since a time: [{'at', 'value', **labels}], oldest first; with `label` (name,
    value), only the points so labelled."""
    dialect = store.dialect
    where, params = ("", ()) if label is None else (dialect.label_match, (dialect.label_path(label[0]), label[1]))
    rows = store.conn.execute(f"SELECT labels, at, value FROM series WHERE name = ? AND at >= ?{where} ORDER BY at",
                              (name, since, *params)).fetchall()
    parsed = {labels: from_json(labels) for labels in {r[0] for r in rows}}  # a handful of label sets
    return [{"at": at, "value": value, **parsed[labels]} for labels, at, value in rows]


def latest(store: Store, name: str) -> float | None:
    row = store.conn.execute("SELECT value FROM series WHERE name = ? ORDER BY at DESC LIMIT 1", (name,)).fetchone()
    return None if row is None else row[0]



@dataclass(frozen=True)
class FindingFilter:
    rules: tuple[str, ...] = ()
    severities: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    search: str = ""  # a trade_no, order key or other entity value, matched exactly

    def where(self, dialect: Dialect) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        for column, values in (("rule", self.rules), ("severity", self.severities), ("status", self.statuses)):
            if values:
                clauses.append(f"{column} IN ({','.join('?' * len(values))})")
                params.extend(values)
        if self.since is not None:
            clauses.append("last_seen >= ?")
            params.append(self.since)
        if self.until is not None:
            clauses.append("first_seen < ?")
            params.append(self.until)
        if self.search.strip():
            value = self.search.strip()
            clauses.append(dialect.key_search)
            params.extend([value, value])
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def count_findings(store: Store, flt: FindingFilter) -> int:
    where, params = flt.where(store.dialect)
    return store.conn.execute(f"SELECT count(*) FROM findings{where}", params).fetchone()[0]


def findings_page(store: Store, flt: FindingFilter, limit: int = 200, offset: int = 0) -> list[dict[str, Any]]:
    """One page of findings, newest first, without their evidence (the drill-down loads that).
    Ties go by rowid, which the findings_seen index holds, so deep pages skip through the index alone."""
    where, params = flt.where(store.dialect)
    cur = store.conn.execute(
        "SELECT id, rule, name, severity, status, keys, summary, first_seen, last_seen, resolved_at, resolution"
        f" FROM findings{where} ORDER BY first_seen DESC, rowid DESC LIMIT ? OFFSET ?", [*params, limit, offset])
    columns = [d[0] for d in cur.description]
    rows = [dict(zip(columns, r)) for r in cur]
    for r in rows:
        r["keys"] = from_json(r["keys"])
    return rows


def finding_rows(store: Store, flt: FindingFilter) -> Iterator[tuple]:
    """The store rows (FINDING_COLUMNS) of the findings `flt` selects, ordered by first_seen then id,
    read as they are used (exports stream them)."""
    where, params = flt.where(store.dialect)
    yield from store.conn.execute(f"SELECT {FINDING_COLUMNS} FROM findings{where} ORDER BY first_seen, id", params)


def finding_marks(store: Store, since: float, limit: int = 5000) -> list[dict[str, Any]]:
    """The newest findings first seen since a time, without their evidence (a timeline's marks):
    [{'first_seen', 'rule', 'severity', 'status', 'summary'}], newest first."""
    return [{"first_seen": t, "rule": r, "severity": sev, "status": st, "summary": summary}
            for t, r, sev, st, summary in store.conn.execute(
                "SELECT first_seen, rule, severity, status, summary FROM findings WHERE first_seen >= ? "
                "ORDER BY first_seen DESC LIMIT ?", (since, limit))]


def recent_findings(store: Store, flt: FindingFilter, limit: int) -> list[Finding]:
    """The newest `limit` findings `flt` selects, newest first, with their evidence."""
    where, params = flt.where(store.dialect)
    return [finding_from_row(r) for r in store.conn.execute(
        f"SELECT {FINDING_COLUMNS} FROM findings{where} ORDER BY first_seen DESC, rowid DESC LIMIT ?",
        [*params, limit])]


def findings_with_history(store: Store, flt: FindingFilter) -> Iterator[tuple[tuple, list[HistoryEntry]]]:
    """`finding_rows`, each with its history, oldest first. The history is read by a second cursor
    in the same order as the findings, so neither is held whole; call it inside `store.snapshot()`
    for the two to see the same store."""
    where, params = flt.where(store.dialect)
    columns = ", ".join(f"h.{c}" for c in HistoryEntry._fields)
    trail = iter(store.conn.execute(
        f"SELECT {columns} FROM (SELECT id, first_seen FROM findings{where}) f "
        "JOIN finding_history h ON h.finding_id = f.id ORDER BY f.first_seen, f.id, h.at, h.rowid", params))
    pending = next(trail, None)
    for row in finding_rows(store, flt):
        entries = []
        while pending is not None and pending[0] == row[0]:
            entries.append(HistoryEntry(*pending))
            pending = next(trail, None)
        yield row, entries


def rows_by_entity(store: Store, entities: Iterable[str], per_entity: int = 50) -> dict[str, list[RowChange]]:
    """The stored row changes of each entity key ('trade_no:T1', 'pk:shop.shipments:7'), at most
    `per_entity` (the newest) each; an entity with none is not in the answer."""
    seqs_of = {entity: sorted(r for r in refs if r > 0)[-per_entity:]
               for entity, refs in entity_index.refs_of(store.conn, entities).items()}
    wanted = sorted({seq for seqs in seqs_of.values() for seq in seqs})
    by_seq: dict[int, RowChange] = {}
    source = rows_from(store.conn)
    for i in range(0, len(wanted), 500):
        part = wanted[i:i + 500]
        by_seq.update((r[0], row_change_from_row(r[1:], store.packer.unpack)) for r in store.conn.execute(
            f"SELECT seq, {ROW_CHANGE_COLUMNS} FROM {source} WHERE seq IN ({','.join('?' * len(part))})", part))
    found = {entity: [by_seq[s] for s in seqs if s in by_seq] for entity, seqs in seqs_of.items()}
    return {entity: rows for entity, rows in found.items() if rows}


@dataclass(frozen=True)
class Timeline:
    """Everything the store holds about one trade_no or order (or, for a reading entity, its findings)."""

    query: str
    entities: tuple[str, ...]
    rows: list[RowChange] = field(default_factory=list)
    events: list[EmittedEvent] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    truncated: bool = False


TABLE_KINDS = ("pk", "key")  # entities named by table and value: 'pk:shop.shipments:7', 'key:shop.shipments:S1'
# Entities that are readings, not records: a consumer group (F11's lag, F12's skew: 'group:shipping-service')
# and a table's backlog (F11: 'backlog:shop.orders'); each is the series kept of it, by the label naming it.
READING_SERIES = {"group": (("group_lag", "group"), ("lag_stddev", "group")), "backlog": (("backlog", "table"),)}


def reading_of(value: str) -> tuple[str, str] | None:
    """(kind, name) of a reading entity ('group:g' -> ('group', 'g')), None for any other entity."""
    kind, sep, name = value.strip().partition(":")
    return (kind, name) if sep and name and kind in READING_SERIES else None


def readings(store: Store, value: str, since: float) -> dict[str, list[dict[str, Any]]]:
    """A reading entity's series since a time, by series name (empty for any other entity)."""
    kind, name = reading_of(value) or ("", "")
    return {series_name: series(store, series_name, since, (label, name))
            for series_name, label in READING_SERIES.get(kind, ())}


def entity_keys(value: str) -> tuple[str, ...]:
    """'T1' -> ('trade_no:T1', 'order_key:T1'); an explicit 'kind:value' is taken as it is."""
    value = value.strip()
    if not value:
        return ()
    kind = value.split(":", 1)[0]
    if ":" in value and kind == "key":  # an announced key: its rows and events, and the order or trade it may be
        bare = value.split(":", 2)[-1]
        return (value, *(f"{k}:{bare}" for k in ENTITY_KINDS))
    if ":" in value and (kind in ENTITY_KINDS or kind == "pk"):
        return (value,)
    return tuple(f"{k}:{value}" for k in ENTITY_KINDS)


def findings_mentioning(store: Store, value: str) -> list[Finding]:
    """The first findings (by first sight) with a key equal to `value`."""
    where, params = FindingFilter(search=value).where(store.dialect)
    return [finding_from_row(r) for r in store.conn.execute(
        f"SELECT {FINDING_COLUMNS} FROM findings{where} ORDER BY first_seen LIMIT ?", [*params, TIMELINE_LIMIT])]


def _atoms(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _atoms(v)
    elif isinstance(value, list):
        for v in value:
            yield from _atoms(v)
    elif value is not None:
        yield value


def _names(f: Finding, values: set[str], announced: set[tuple[str, str]]) -> bool:
    """A finding about one of `values`: a key or an evidence value equal to one (a row or event of its evidence
    names it); or about one of the announced rows `announced` (table, key), which F7-F10 name by their key alone."""
    if f.keys.get("key") is not None and (str(f.keys.get("table")), key_text(f.keys["key"])) in announced:
        return True
    return any(key_text(a) in values for a in _atoms([f.keys, *(e.values for e in f.evidence)]))


def findings_naming(store: Store, values: Iterable[str], announced: Iterable[tuple[str, str]] = ()) -> list[Finding]:
    """The first findings (by first sight, at most TIMELINE_LIMIT) about any of `values` or `announced` (`_names`).
    The SQL keeps the findings whose keys or evidence hold one's text; each is then checked value by value."""
    values, announced = set(values), set(announced)
    texts = sorted(values | {key for _, key in announced})
    found: dict[str, Finding] = {}
    for i in range(0, len(texts), 100):
        part = texts[i:i + 100]
        where = " OR ".join(f"{store.dialect.contains.format('keys')} OR {store.dialect.contains.format('evidence')}"
                            for _ in part)
        for r in store.conn.execute(f"SELECT {FINDING_COLUMNS} FROM findings WHERE {where} ORDER BY first_seen",
                                    [t for t in part for _ in (0, 1)]):
            f = finding_from_row(r)
            if f.id not in found and _names(f, values, announced):
                found[f.id] = f
    return sorted(found.values(), key=lambda f: (f.first_seen, f.id))[:TIMELINE_LIMIT]


def timeline(store: Store, value: str) -> Timeline:
    """What the store holds of a trade_no, an order or an announced key: its row changes and events, and the
    findings about it, its records or its trade_nos (an order's F1 names its trade_no; an F8 of its shipment
    names the shipment, its event the order), and about the rows announced among those (F7-F10)."""
    reading = reading_of(value)
    if reading:
        return Timeline(value, (value.strip(),), findings=findings_mentioning(store, reading[1]))
    keys = entity_keys(value)
    if not keys:
        return Timeline(value, ())
    refs = {ref for found in entity_index.refs_of(store.conn, keys).values() for ref in found}
    seqs = sorted(r for r in refs if r > 0)
    rowids = sorted(entity_index.event_rowid(r) for r in refs if r < 0)
    truncated = len(seqs) > TIMELINE_LIMIT or len(rowids) > TIMELINE_LIMIT
    seqs, rowids = seqs[-TIMELINE_LIMIT:], rowids[-TIMELINE_LIMIT:]
    rows = store.row_changes(f"seq IN ({','.join('?' * len(seqs))})", tuple(seqs)) if seqs else []
    events = store.events(f"events.rowid IN ({','.join('?' * len(rowids))})", tuple(rowids)) if rowids else []
    # the value alone, which the findings' keys hold ('pk:' and 'key:' name a table before it)
    kind = keys[0].split(":", 1)[0]
    bare = keys[0].split(":", 2 if kind in TABLE_KINDS else 1)[-1] if len(keys) == 1 or kind == "key" \
        else value.strip()
    near = entity_index.names_of(store.conn, [*seqs, *map(entity_index.event_ref, rowids)])
    trades = {e for e in near if e.startswith("trade_no:")}
    # the records of its trade_nos too: an order's shipments and grants, announced by their own ids
    filed = near | entity_index.names_of(store.conn, {ref for found in entity_index.refs_of(
        store.conn, trades - set(keys)).values() for ref in found})
    announced = {(table, key) for table, key in (e.split(":", 2)[1:] for e in filed if e.startswith("key:"))}
    found = findings_naming(store, {bare} | {t.split(":", 1)[1] for t in trades}, announced)
    return Timeline(value, keys, rows, events, found, truncated)


def transactions_committed(store: Store, since: float, until: float) -> Iterator[str]:
    """The transaction ids (GTIDs, where the server has them) of the row changes the store keeps that were committed
    during [since, until), in the order they were read (a bootstrap's snapshot rows left out): what a period
    attestation says of the binlog it covers."""
    for (txid,) in store.conn.execute(
            "SELECT txid FROM row_changes WHERE snapshot = 0 AND commit_time >= ? AND commit_time < ? "
            "GROUP BY txid ORDER BY MIN(seq)", (since, until)):
        yield txid


def event_offsets(store: Store, since: float, until: float) -> list[tuple[str, int, int, int, int]]:
    """(topic, partition, first offset, last offset, records) of the events the store keeps whose Kafka timestamp
    falls in [since, until), by topic and partition."""
    return [tuple(r) for r in store.conn.execute(
        f'SELECT topic, partition, MIN("offset"), MAX("offset"), COUNT(*) FROM {events_from(store.conn)} '
        "WHERE timestamp_ms >= ? AND timestamp_ms < ? GROUP BY topic, partition ORDER BY topic, partition",
        (math.ceil(since * 1000), math.ceil(until * 1000)))]  # whole milliseconds: ceil keeps both bounds exact


@dataclass(frozen=True)
class Pruned:
    """What the store no longer keeps of the raw records: how many went for the retention and for the budget, and
    the commit time of the oldest row change kept (None when none is)."""

    for_retention: int
    for_budget: int
    oldest_kept: float | None


def pruned(store: Store) -> Pruned:
    """The drill-down's note on pruned records: one read of the first row change by its number, no scan."""
    gone = [retention.pruned_total(store, for_budget=b) for b in (False, True)]
    first = store.conn.execute("SELECT commit_time FROM row_changes ORDER BY seq LIMIT 1").fetchone()
    return Pruned(*(g["row_changes"] + g["events"] for g in gone), first[0] if first else None)


def oldest_kept(store: Store) -> float | None:
    """The commit time of the oldest row change the store still keeps (retention prunes older ones)."""
    return store.conn.execute("SELECT MIN(commit_time) FROM row_changes WHERE snapshot = 0").fetchone()[0]
