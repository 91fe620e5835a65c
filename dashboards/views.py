"""What the pages and /metrics make of the store's contents: where the store is, the health of
each part, the lag tables, the entity a finding is about. No SQL here (the store box reads);
nothing here talks to MySQL or Kafka.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from oncewatch.core import names
from oncewatch.core.config import Config, PostgresTarget, SloConfig, load
from oncewatch.core.protocol import (NO_OFFSETS, ComponentHealth, GroupMemberHealth, Health, MonitorHealth,
                                     Status)
from oncewatch.core.records import Finding, OffsetsSnapshot, QuarantinedRecord, RowChange
from oncewatch.dashboards import incidents
from oncewatch.store import Store, open_reader, queries
from oncewatch.store.group import shard_checkpoints

ENV_STORE = "ONCEWATCH_STORE"
ENV_CONFIG = "ONCEWATCH_CONFIG"

# The monitor writes its health every second; older than this, what it says is no longer news.
STALE_SECONDS = 30.0

# Rule id -> name, for pickers and labels.
RULES = {r.id: r.name for r in names.RULES.values()}
# Keys of a finding that name its entity, best first: the rules write trade_no, order (F2-F6),
# key (the announced key of F7-F10); order_key is the events' name for an order.
FINDING_ENTITY_KEYS = ("trade_no", "order", "order_key", "key")


class StoreNotConfigured(RuntimeError):
    """Neither ONCEWATCH_STORE nor ONCEWATCH_CONFIG says where the store is."""


def config(environ: Mapping[str, str] = os.environ) -> Config | None:
    """The config named by ONCEWATCH_CONFIG, if any (exports need it: hash, mask fields)."""
    return load(environ[ENV_CONFIG]) if environ.get(ENV_CONFIG) else None


def store_target(environ: Mapping[str, str] = os.environ) -> str | PostgresTarget:
    """The store: ONCEWATCH_STORE (a file, or a postgresql:// URL whose password libpq finds in
    PGPASSWORD or ~/.pgpass), else the store of the ONCEWATCH_CONFIG file."""
    if environ.get(ENV_STORE):
        value = environ[ENV_STORE]
        return PostgresTarget(value) if value.startswith(("postgresql://", "postgres://")) else value
    cfg = config(environ)
    if cfg is None:
        raise StoreNotConfigured(f"set {ENV_STORE}=/path/to/oncewatch.db or {ENV_CONFIG}=/path/to/config.toml")
    return cfg.store.target


def open_store(target: str | PostgresTarget | None = None) -> Store:
    return open_reader(target or store_target())


# ---------------------------------------------------------------- health

@dataclass(frozen=True)
class Component:
    """One health row: what the monitor last said about a part (or itself, or a group's member), when, and how old
    that is."""

    name: str
    health: Health
    updated_at: float
    age_seconds: float

    @property
    def stale(self) -> bool:
        return self.age_seconds > STALE_SECONDS

    @property
    def up(self) -> bool:
        """A part's: its reader running and it connected (the offsets poller: answered), as last reported."""
        return not isinstance(self.health, ComponentHealth) or self.health.up


def components(store: Store, now: float | None = None) -> dict[str, Component]:
    now = time.time() if now is None else now
    return {name: Component(name, row.health, row.updated_at, max(0.0, now - row.updated_at))
            for name, row in store.health().items()}


def status_of(comps: Mapping[str, Component], name: str) -> Status | None:
    """Part `name`'s last status, if it wrote one."""
    c = comps.get(name)
    return c.health.status if c is not None and isinstance(c.health, ComponentHealth) else None


def monitor_of(comps: Mapping[str, Component]) -> MonitorHealth | None:
    """The lone monitor's own row, if it wrote one (a group has none)."""
    c = comps.get(names.MONITOR)
    return c.health if c is not None and isinstance(c.health, MonitorHealth) else None


def members_of(comps: Mapping[str, Component]) -> dict[str, tuple[Component, GroupMemberHealth]]:
    """A group's members' rows ([group]), by member name."""
    return {c.health.member: (c, c.health) for name, c in sorted(comps.items())
            if name.startswith(GROUP_HEALTH) and isinstance(c.health, GroupMemberHealth)}


def engine_stats(store: Store) -> dict[str, Any]:
    return store.state(names.ENGINE_STATS, {}) or {}


def standing(counts: Iterable[tuple[str, str, str, int]]) -> dict[tuple[str, str], int]:
    """(rule, severity) -> findings whose fact still stands (not resolved, whoever reviewed them),
    from `Store.finding_counts`: the store holds every finding, the engine only those it may change."""
    out: dict[tuple[str, str], int] = {}
    for rule, severity, status, n in counts:
        if status != names.RESOLVED:
            out[rule, severity] = out.get((rule, severity), 0) + n
    return out


def open_critical(counts: Iterable[tuple[str, str, str, int]]) -> int:
    """Critical findings open and not yet acknowledged (someone acts on those: an acknowledged one has a person)."""
    return sum(n for _, severity, status, n in counts if severity == "critical" and status == names.OPEN)


# The shop's words for its state, kept apart from the monitor's (healthy, degraded, failing).
SHOP_CRITICAL, SHOP_WARNING, SHOP_CLEAN = "critical", "warning", "clean"
SEVERITIES = ("critical", "warning", "info")


@dataclass(frozen=True)
class ShopState:
    """The shop's state as the monitor reads it, never the monitor's own health (docs/architecture.md §4: two
    verdicts, never mixed): the findings open and not acknowledged, by severity; how many more a person has
    acknowledged; the watched consumer groups whose lag is over F11's threshold (group, records behind), None where
    the offsets have not been read."""

    open: dict[str, int]
    acknowledged: int
    behind: tuple[tuple[str, int], ...] | None
    threshold: float | None

    @property
    def verdict(self) -> str:
        if self.open.get("critical"):
            return SHOP_CRITICAL
        return SHOP_WARNING if self.open.get("warning") or self.behind else SHOP_CLEAN

    @property
    def reasons(self) -> tuple[str, ...]:
        """What is wrong in the shop, in its own words, worst first."""
        found = [f"{self.open[s]:,} open {s} finding{'s' if self.open[s] > 1 else ''}" for s in SEVERITIES
                 if self.open.get(s)]
        if found and self.acknowledged:
            found[-1] += f" ({self.acknowledged:,} more acknowledged)"
        groups = [f"consumer group {g} is {lag:,} records behind (F11's threshold {self.threshold:,.0f})"
                  for g, lag in self.behind or ()]
        return (*found, *groups)


def shop_state(counts: Iterable[tuple[str, str, str, int]], offsets: OffsetsSnapshot,
               threshold: float | None) -> ShopState:
    """From `Store.finding_counts`, the last offsets snapshot and F11's threshold as the monitor runs with it."""
    counts = list(counts)
    open_ = {s: sum(n for _, severity, status, n in counts if severity == s and status == names.OPEN)
             for s in SEVERITIES}
    acknowledged = sum(n for _, _, status, n in counts if status == names.ACKNOWLEDGED)
    behind = tuple((g.group, g.total_lag) for g in offsets.groups
                   if threshold is not None and g.total_lag > threshold) if offsets.polled_at else None
    return ShopState({s: n for s, n in open_.items() if n}, acknowledged, behind, threshold)


def exactly_once(good: float, judged: float, pending: int, slo: SloConfig) -> tuple[str, str]:
    """The Overview's headline tile (issue 45): (value, help). The share is floored to the hundredth of a percent,
    so that money violated never shows as 100.00%."""
    window = f"in {slo.window_hours:g} h"
    unit = slo.unit or "the money"
    waiting = f"; {pending:,} pending" if pending else ""
    help_ = (f"Of the money of the trades committed {window} and judged (verified or violated), the share verified "
             f"exactly once within {slo.within_seconds:g} s of its commit; the objective is "
             f"{slo.objective * 100:g}%{waiting}")
    if not judged:
        return f"no trade judged {window}", help_
    # 1e-9: a share of exactly 99.98% is not floored to 99.97 by the float's last bit
    return f"{math.floor(good / judged * 10000 + 1e-9) / 100:.2f}% of {unit} {window}", help_


def backlog_total(stats: dict[str, Any]) -> int:
    return sum(stats.get("backlog_by_table", {}).values())


# ---------------------------------------------------------------- quarantine

def cannot_judge(monitor: MonitorHealth) -> str | None:
    """What the monitor's health says cannot judge now, for people: the rules blind everywhere (a stream they read
    unseen), then per rule the tables a shape problem blinds it for ("F7 on shop.orders"); None when every rule
    judges everywhere."""
    blind = monitor.cannot_judge()
    return f"cannot judge now: {', '.join(blind)}" if blind else None


def quarantine_row(q: QuarantinedRecord) -> dict[str, Any]:
    """A quarantined record for people and JSON: its coordinates, why, and its bytes (the value in
    base64, as it came; a too_large one's value is left on the broker). Key and headers are text,
    bytes that are not UTF-8 written as `\\xff` (a header key's too)."""
    return {"coordinates": f"{names.partition_key(q.topic, q.partition)}@{q.offset}", "topic": q.topic,
            "partition": q.partition, "offset": q.offset,
            "timestamp": dt.datetime.fromtimestamp(q.timestamp_ms / 1000, dt.timezone.utc).isoformat(
                timespec="milliseconds").replace("+00:00", "Z") if q.timestamp_ms >= 0 else None,
            "timestamp_type": q.timestamp_type,
            "reason": q.reason, "detail": q.detail, "size": q.size, "preview": q.preview,
            "key": None if q.key is None else q.key.decode("utf-8", "backslashreplace"),
            "value_base64": None if q.value is None else base64.b64encode(q.value).decode(),
            "headers": [[_text(k.encode("utf-8", "surrogateescape")), None if v is None else _text(v)]
                        for k, v in q.headers]}


def _text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")


# ---------------------------------------------------------------- drift

def offsets_of(components: Mapping[str, Component]) -> OffsetsSnapshot:
    """The last offsets snapshot the monitor wrote (an empty one before the first poll)."""
    status = status_of(components, names.KAFKA_OFFSETS)
    return status if isinstance(status, OffsetsSnapshot) else NO_OFFSETS


def max_lag(offsets: OffsetsSnapshot) -> int:
    """The largest known lag of any watched group on any partition (0 when none is known)."""
    return max((p.lag for g in offsets.groups for p in g.partitions if p.lag is not None), default=0)


class LagRow(NamedTuple):
    """A group on a partition: committed, end, lag (None where nothing is committed)."""

    group: str
    state: str | None
    topic: str
    partition: int
    earliest: int | None
    end: int | None
    committed: int | None
    lag: int | None
    lag_seconds: float | None


def lag_rows(offsets: OffsetsSnapshot) -> list[LagRow]:
    """One row per group and partition."""
    ends = {(p.topic, p.partition): p for p in offsets.partitions}
    rows = []
    for g in offsets.groups:
        for p in g.partitions:
            part = ends.get((p.topic, p.partition))
            rows.append(LagRow(g.group, g.state, p.topic, p.partition, part.earliest if part else None,
                               part.end if part else None, p.committed, p.lag, p.lag_seconds))
    return rows


class LagSkew(NamedTuple):
    """F12's reading of a group on a topic, with the partitions it covers."""

    group: str
    topic: str
    stddev: float
    relative: float
    partitions: int
    max_lag: int


def lag_skew(offsets: OffsetsSnapshot) -> list[LagSkew]:
    """F12's reading per group and topic (GroupOffsets.skew_by_topic)."""
    out = []
    for g in offsets.groups:
        lags = g.lags_by_topic()
        out += [LagSkew(g.group, t, s.stddev, s.relative, len(lags[t]), max(lags[t]))
                for t, s in g.skew_by_topic().items()]
    return sorted(out, key=lambda s: (s.group, s.topic))


# ---------------------------------------------------------------- findings

def entity_of(keys: dict[str, Any]) -> str:
    """What the drill-down should open for a finding: an announcement's key with its table (F7-F10:
    'key:shop.shipments:S1', since a bare id could be any table's), a consumer group (F11's lag, F12:
    'group:points-service'), a table's backlog (F11: 'backlog:shop.orders'), else its trade_no or order."""
    if keys.get("event_type") is not None and keys.get("table") and keys.get("key") is not None:
        return f"key:{keys['table']}:{keys['key']}"
    if keys.get("group") is not None:
        return f"group:{keys['group']}"
    if keys.get("backlog") is not None and keys.get("table"):
        return f"backlog:{keys['table']}"
    return next((str(keys[k]) for k in FINDING_ENTITY_KEYS if keys.get(k) is not None), "")


def incidents_of(store: Store, found: Sequence[Finding], fields: incidents.Fields) -> list[incidents.Incident]:
    """`incidents.group` of the findings, with the stored rows it wants: asked for twice, since an
    announced row reveals its trade_no, whose payment row names the order."""
    rows: dict[str, list[RowChange]] = {}
    for _ in range(2):
        rows.update(queries.rows_by_entity(store, incidents.wanted(found, rows, fields)))
    return incidents.group(found, rows, fields)


# ---------------------------------------------------------------- drill-down

def diff(row: RowChange) -> dict[str, Any]:
    """What the change did: the changed columns of an update (before -> after), the whole row otherwise."""
    if row.before is not None and row.after is not None:
        return {c: (row.before.get(c), row.after.get(c)) for c in sorted(set(row.before) | set(row.after))
                if row.before.get(c) != row.after.get(c)}
    return dict(row.row)


GROUP_HEALTH = "group/"  # the health rows of a group's members: group/<member>
SHARD_LIST = "shard list"
LEASE_PARTITION = ".lease/0"  # of a member's routers' partitions, the lease (the change source's), not an event one


def event_partitions(member: GroupMemberHealth) -> int:
    """How many event partitions a member's health row says it reads (its lease partition is none of them)."""
    return len([p for p in member.routers.partitions if not p.endswith(LEASE_PARTITION)])


def group_members(comps: Mapping[str, Component]) -> list[dict[str, Any]]:
    """A group's members ([group]), one row each: live, or gone since its last health (its work is others' by then);
    SHARD_LIST holds its shards as a list, for `group_verdict` (not a column to show)."""
    rows = []
    for c, v in members_of(comps).values():
        owned = sorted(v.shards, key=int)
        rows.append({"member": v.member, "state": "gone" if c.stale else "live", "seen_seconds_ago": c.age_seconds,
                     "shards": ", ".join(owned) or "–", SHARD_LIST: owned,
                     "change source": "reads it" if v.routers.change_source else "",
                     "event partitions": event_partitions(v),
                     "records applied": v.applied})
    return rows


def group_shards(shards: dict[int, dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """A group's shards, one row each, from their last commits: owner, how long ago, the work, how far behind."""
    return [{"shard": shard, "owner": c.get("owner") or "–", "committed_seconds_ago": max(0.0, now - c["committed_at"]),
             "records applied": c["records"], "lag (messages)": max(0, c["end"] - c["offset"]),
             "change clock behind (s)": max(0.0, now - c["binlog_time"]) if c["binlog_time"] else None,
             "Kafka clock behind (s)": max(0.0, now - c["kafka_time"]) if c["kafka_time"] else None}
            for shard, c in sorted(shards.items())]


SHARD_BEHIND_MESSAGES = 10_000  # as OncewatchGroupShardBehind


@dataclass(frozen=True)
class GroupVerdict:
    """A group's word on itself, where a lone monitor has its own (oncewatch.monitor.verdict): failing when some
    of the work is not done (no member live, the change source unread, a shard nobody commits), degraded when it
    is done late or unevenly, else healthy."""

    verdict: str
    reasons: tuple[str, ...]
    live: int
    shards: int


def group_verdict(members: list[dict[str, Any]], shards: list[dict[str, Any]]) -> GroupVerdict:
    """From `group_members` and `group_shards` rows."""
    live = [m for m in members if m["state"] == "live"]
    failing, degraded = [], []
    if not live:
        failing.append("no member is running")
    elif not any(m["change source"] for m in live):
        failing.append("no live member reads the change source")
    unjudged = [str(s["shard"]) for s in shards if s["committed_seconds_ago"] > STALE_SECONDS]
    if unjudged:
        failing.append(f"shard(s) {', '.join(unjudged)} not committed for over {STALE_SECONDS:.0f} s: no member "
                       "judges them")
    behind = [str(s["shard"]) for s in shards if s["lag (messages)"] > SHARD_BEHIND_MESSAGES]
    if behind:
        degraded.append(f"shard(s) {', '.join(behind)} more than {SHARD_BEHIND_MESSAGES:,} messages behind")
    owned = {m["member"]: len(m[SHARD_LIST]) for m in live}
    idle = [name for name, n in owned.items() if n == 0] if max(owned.values(), default=0) >= 2 else []
    if idle:
        degraded.append(f"{', '.join(idle)} judge(s) no shard while another judges two or more")
    verdict = names.FAILING if failing else names.DEGRADED if degraded else names.HEALTHY
    return GroupVerdict(verdict, tuple(failing + degraded), len(live), len(shards))


def group_health(store: Store, comps: Mapping[str, Component], now: float) -> GroupVerdict | None:
    """The group's verdict when `store` is a group's ([group]), else None."""
    shards = shard_checkpoints(store)
    members = group_members(comps)
    return group_verdict(members, group_shards(shards, now)) if members or shards else None
