"""Read-only views of the store shared by the pages, /metrics and the bench.

Everything here takes a `Store` opened read-only and returns plain data; nothing here talks to
MySQL or Kafka, so a page load costs a few indexed SQLite reads whatever the size of the store.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import statistics
import time
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from oncewatch.core.config import Config, load
from oncewatch.core.records import EmittedEvent, Finding, RowChange, from_json
from oncewatch.store.store import FINDING_COLUMNS, Store, finding_from_row

ENV_STORE = "ONCEWATCH_STORE"
ENV_CONFIG = "ONCEWATCH_CONFIG"

# The monitor writes its health every second; older than this, what it says is no longer news.
STALE_SECONDS = 30.0

# DESIGN §4; the dashboards may not import oncewatch.checks/, and only need the names.
RULES = {
    "F1": "duplicate_effect", "F2": "double_charge", "F3": "stuck_pending", "F4": "illegal_transition",
    "F5": "amount_mismatch", "F6": "invalid_callback_status", "F7": "missing_event", "F8": "orphan_event",
    "F9": "duplicate_event", "F10": "event_delay", "F11": "offset_drift", "F12": "partition_skew",
}
SEVERITIES = ("critical", "warning", "info")
STATUSES = ("open", "resolved")
# Entity kinds the drill-down tries when given a bare value (entity_index keys are 'kind:value').
ENTITY_KINDS = ("trade_no", "order_key")
# Keys of a finding that name its entity, best first: the rules write trade_no, order (F2-F6),
# key (the announced key of F7-F10); order_key is the events' name for an order.
FINDING_ENTITY_KEYS = ("trade_no", "order", "order_key", "key")
# A drill-down shows at most this many rows and events of one entity, newest kept.
TIMELINE_LIMIT = 2000


class StoreNotConfigured(RuntimeError):
    """Neither ONCEWATCH_STORE nor ONCEWATCH_CONFIG says where the store is."""


def config(environ: Mapping[str, str] = os.environ) -> Config | None:
    """The config named by ONCEWATCH_CONFIG, if any (exports need it: hash, mask fields)."""
    return load(environ[ENV_CONFIG]) if environ.get(ENV_CONFIG) else None


def store_path(environ: Mapping[str, str] = os.environ) -> str:
    """The store file: ONCEWATCH_STORE, else `store.path` of the ONCEWATCH_CONFIG file."""
    if environ.get(ENV_STORE):
        return environ[ENV_STORE]
    cfg = config(environ)
    if cfg is None:
        raise StoreNotConfigured(f"set {ENV_STORE}=/path/to/oncewatch.db or {ENV_CONFIG}=/path/to/config.toml")
    return cfg.store.path


def open_store(path: str | None = None) -> Store:
    return Store(path or store_path(), readonly=True)


# ---------------------------------------------------------------- health

@dataclass(frozen=True)
class Component:
    """One health row: what the monitor last said about a part, and how old that is."""

    name: str
    value: dict[str, Any]
    age_seconds: float

    @property
    def stale(self) -> bool:
        return self.age_seconds > STALE_SECONDS

    @property
    def up(self) -> bool:
        """Connected (collectors) or answering (the offsets poller), as last reported."""
        if self.name == "kafka_offsets":
            return self.value.get("error") is None
        return bool(self.value.get("connected", True))


def components(store: Store, now: float | None = None) -> dict[str, Component]:
    now = time.time() if now is None else now
    return {name: Component(name, value, max(0.0, now - value["updated_at"]))
            for name, value in store.health().items()}


def engine_stats(store: Store) -> dict[str, Any]:
    return store.state("engine_stats", {}) or {}


def open_critical(stats: dict[str, Any]) -> int:
    return sum(r["count"] for r in stats.get("open_by_rule_severity", []) if r["severity"] == "critical")


def backlog_total(stats: dict[str, Any]) -> int:
    return sum(stats.get("backlog_by_table", {}).values())


def unread_records(kafka_events: dict[str, Any]) -> int:
    """Records on the watched partitions the monitor has not read yet."""
    return sum(max(0, p["end"] - p["position"]) for p in kafka_events.get("partitions", []))


# ---------------------------------------------------------------- series (small charts)

def series(store: Store, name: str, since: float) -> list[dict[str, Any]]:
    """Points of one series since a time: [{'at', 'value', **labels}], oldest first."""
    rows = store.conn.execute("SELECT labels, at, value FROM series WHERE name = ? AND at >= ? ORDER BY at",
                              (name, since)).fetchall()
    parsed = {labels: from_json(labels) for labels in {r[0] for r in rows}}  # a handful of label sets
    return [{"at": at, "value": value, **parsed[labels]} for labels, at, value in rows]


def latest(store: Store, name: str) -> float | None:
    row = store.conn.execute("SELECT value FROM series WHERE name = ? ORDER BY at DESC LIMIT 1", (name,)).fetchone()
    return None if row is None else row[0]


# ---------------------------------------------------------------- drift

def lag_rows(offsets: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per group and partition: committed, end, lag (None where nothing is committed)."""
    ends = {(p["topic"], p["partition"]): p for p in offsets.get("partitions", [])}
    rows = []
    for g in offsets.get("groups", []):
        for p in g["partitions"]:
            part = ends.get((p["topic"], p["partition"]), {})
            rows.append({"group": g["group"], "state": g.get("state"), "topic": p["topic"],
                         "partition": p["partition"], "earliest": part.get("earliest"), "end": part.get("end"),
                         "committed": p.get("committed"), "lag": p.get("lag"), "lag_seconds": p.get("lag_seconds")})
    return rows


def lag_skew(offsets: dict[str, Any]) -> list[dict[str, Any]]:
    """Population standard deviation of partition lag per group and topic (what F12 judges);
    partitions with no commit have no lag and are left out."""
    lags: dict[tuple[str, str], list[int]] = {}
    for r in lag_rows(offsets):
        if r["lag"] is not None:
            lags.setdefault((r["group"], r["topic"]), []).append(r["lag"])
    return [{"group": g, "topic": t, "stddev": statistics.pstdev(v), "partitions": len(v), "max_lag": max(v)}
            for (g, t), v in sorted(lags.items())]


def delay_buckets(stats: dict[str, Any]) -> dict[str, list[tuple[str, float]]]:
    """Per clock, the cumulative delay histogram as (upper bound, count) pairs in bound order."""
    return {clock: sorted(h["buckets"].items(), key=lambda b: math.inf if b[0] == "+Inf" else float(b[0]))
            for clock, h in sorted(stats.get("delay", {}).items())}


def quantile(buckets: list[tuple[str, float]], q: float) -> float | None:
    """The q-quantile of a cumulative histogram, interpolated inside its bucket as Prometheus'
    histogram_quantile does (so the page and the alert agree)."""
    total = buckets[-1][1] if buckets else 0
    if not total:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in buckets:
        upper = math.inf if bound == "+Inf" else float(bound)
        if count >= rank:
            if upper == math.inf:  # in the open-ended bucket: the highest finite bound, as Prometheus says
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


# ---------------------------------------------------------------- findings

@dataclass(frozen=True)
class FindingFilter:
    rules: tuple[str, ...] = ()
    severities: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    search: str = ""  # a trade_no, order key or other entity value, matched exactly

    def where(self) -> tuple[str, list[Any]]:
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
            # Any key value (lists included: F2's trade_nos) equal to the search. instr() cheaply
            # discards most rows, json_tree insists on an exact value; as a rowid set, so the
            # newest-first scan of the findings_seen index tests membership without reading rows.
            value = self.search.strip()
            clauses.append("findings.rowid IN (SELECT rowid FROM findings WHERE instr(keys, ?) > 0 AND EXISTS "
                           "(SELECT 1 FROM json_tree(findings.keys) j WHERE j.atom IS NOT NULL "
                           "AND CAST(j.atom AS TEXT) = ?))")
            params.extend([value, value])
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def count_findings(store: Store, flt: FindingFilter) -> int:
    where, params = flt.where()
    return store.conn.execute(f"SELECT count(*) FROM findings{where}", params).fetchone()[0]


def findings_page(store: Store, flt: FindingFilter, limit: int = 200, offset: int = 0) -> list[dict[str, Any]]:
    """One page of findings, newest first, without their evidence (the drill-down loads that).
    Ties go by rowid, which the findings_seen index holds, so deep pages skip through the index alone."""
    where, params = flt.where()
    cur = store.conn.execute(
        "SELECT id, rule, name, severity, status, keys, summary, first_seen, last_seen, resolved_at, resolution"
        f" FROM findings{where} ORDER BY first_seen DESC, rowid DESC LIMIT ? OFFSET ?", [*params, limit, offset])
    columns = [d[0] for d in cur.description]
    rows = [dict(zip(columns, r)) for r in cur]
    for r in rows:
        r["keys"] = from_json(r["keys"])
    return rows


def entity_of(keys: dict[str, Any]) -> str:
    """The value the drill-down should open for a finding ('' for findings about no one entity,
    e.g. F12 on a consumer group)."""
    return next((str(keys[k]) for k in FINDING_ENTITY_KEYS if keys.get(k) is not None), "")


# ---------------------------------------------------------------- drill-down

@dataclass(frozen=True)
class Timeline:
    """Everything the store holds about one trade_no or order."""

    query: str
    entities: tuple[str, ...]
    rows: list[RowChange] = field(default_factory=list)
    events: list[EmittedEvent] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    truncated: bool = False


def entity_keys(value: str) -> tuple[str, ...]:
    """'T1' -> ('trade_no:T1', 'order_key:T1'); an explicit 'kind:value' is taken as it is."""
    value = value.strip()
    if not value:
        return ()
    kind = value.split(":", 1)[0]
    if ":" in value and (kind in ENTITY_KINDS or kind == "pk"):
        return (value,)
    return tuple(f"{k}:{value}" for k in ENTITY_KINDS)


def timeline(store: Store, value: str) -> Timeline:
    keys = entity_keys(value)
    if not keys:
        return Timeline(value, ())
    marks = ",".join("?" * len(keys))
    refs = store.conn.execute(f"SELECT kind, ref FROM entity_index WHERE entity IN ({marks})", keys).fetchall()
    seqs = sorted({int(ref) for kind, ref in refs if kind == "row_change"})
    coords = sorted({ref for kind, ref in refs if kind == "event"})
    truncated = len(seqs) > TIMELINE_LIMIT or len(coords) > TIMELINE_LIMIT
    seqs, coords = seqs[-TIMELINE_LIMIT:], coords[-TIMELINE_LIMIT:]
    rows = store.row_changes(f"seq IN ({','.join('?' * len(seqs))})", tuple(seqs)) if seqs else []
    events = []
    for ref in coords:
        topic_partition, offset = ref.rsplit("@", 1)
        topic, partition = topic_partition.rsplit("/", 1)
        events += store.events('topic = ? AND partition = ? AND "offset" = ?', (topic, int(partition), int(offset)))
    bare = keys[0].split(":", 1)[1] if len(keys) == 1 else value.strip()
    where, params = FindingFilter(search=bare).where()
    findings = [finding_from_row(r) for r in store.conn.execute(
        f"SELECT {FINDING_COLUMNS} FROM findings{where} ORDER BY first_seen LIMIT ?", [*params, TIMELINE_LIMIT])]
    return Timeline(value, keys, rows, events, findings, truncated)


def diff(row: RowChange) -> dict[str, Any]:
    """What the change did: the changed columns of an update (before -> after), the whole row otherwise."""
    if row.before is not None and row.after is not None:
        return {c: (row.before.get(c), row.after.get(c)) for c in sorted(set(row.before) | set(row.after))
                if row.before.get(c) != row.after.get(c)}
    return dict(row.row)


# ---------------------------------------------------------------- reports

def report(cfg: Config, fmt: str, *, rule: str | None = None, status: str | None = None,
           since: dt.datetime | None = None, until: dt.datetime | None = None, mask: bool = False) -> bytes:
    """The auditor's report `oncewatch export` writes, as bytes for a download button."""
    from oncewatch.dashboards.reports import export  # openpyxl is only needed when someone downloads

    with closing(open_store(cfg.store.path)) as store:
        return export(store, fmt, rule=rule, status=status, since=since, until=until, mask=mask,
                      mask_fields=cfg.export.mask_fields, mask_key=cfg.export.key() if mask else None,
                      config_fingerprint=cfg.fingerprint())
