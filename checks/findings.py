"""Findings: deterministic ids, evidence items, and the open/resolved registry.

A finding's id is a hash of its rule and the identity of the fact, so the same fact found
twice (after a restart, or with the two streams read in another order) is one finding:

    F1 trade_no                    F5 trade_no                  F9  event type + key
    F2 order                       F6 trade_no + txid           F10 event type + key
    F3 order                       F7 txid + row index          F11 "backlog" + table | "lag" + group
    F4 order + txid + row index    F8 event type + key          F12 group + topic

Lifecycle: findings open; F1 resolves when deletes or a TRUNCATE leave one effect row per
table, F3 when the order leaves pending, F7 when the event comes late (with an F10 for the
delay), F8 when the change comes late, F11/F12 when the reading drops back; the others are
facts that stay open for a person to close.

Evidence is kept in state as compact tuples (see `EvidenceItem`) and sorted by time when a
finding is built, so the order in which the streams were read does not show in the result.
Times are stream times (commit times, Kafka timestamps, deadlines derived from them), never
the wall clock, for the same reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from oncewatch.checks.horizon import STREAMS, Memory
from oncewatch.core.names import OPEN, RESOLVED, RULES, SEVERITY_RANK, key_text
from oncewatch.core.records import EmittedEvent, Evidence, Finding, RowChange

# (kind, coordinates, time, names, values): lists once through JSON. Held by the hundred
# thousand in open state, so kept to plain tuples, two per item: `names` is interned (one
# tuple per call site and shape), and CPython's collector stops tracking a tuple of plain
# values, which keeps garbage collection cheap.
EvidenceItem = Sequence[Any]

log = logging.getLogger("oncewatch.checks")


def warn_null_key(what: str, coordinates: str) -> None:
    """A record a rule cannot place (NULL key): visible in the log by coordinates, never by value."""
    log.warning(f"{what} without its key; not checked", extra={"event": "null_key", "at": coordinates})


def finding_id(rule: str, *identity: Any) -> str:
    digest = hashlib.sha256("\x1f".join([rule, *map(str, identity)]).encode()).hexdigest()
    return f"{rule}-{digest[:20]}"


_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}
_ROW_NAMES: dict[Sequence[str], tuple[str, ...]] = {}  # columns -> names of a row change's values
_TABLES: dict[tuple[str, str], str] = {}  # (schema, table) -> "schema.table", one string per table


def _interned(names: tuple[str, ...]) -> tuple[str, ...]:
    return _NAMES.setdefault(names, names)


def row_evidence(change: RowChange, columns: Sequence[str], *, with_id: bool = False) -> EvidenceItem:
    """The change with its real table (the shard, where the config names a pattern) and the columns a rule
    looked at (and their old values where they changed); `with_id`: and the row's primary key as "row_id" (a
    list for a composite key, None without one). Every item of one table shares one table name string."""
    after, before = change.after, change.before
    where = (change.schema, change.table)
    table = _TABLES.get(where) or _TABLES.setdefault(where, f"{change.schema}.{change.table}")
    row = after if after is not None else before or {}
    names = _ROW_NAMES.get(columns) or _ROW_NAMES.setdefault(columns, ("table", "op", "commit_clock", *columns))
    values = (table, change.op, change.commit_clock, *map(row.get, columns))
    if with_id:
        pk = [key_text(v) if isinstance(v, bytes) else v for v in change.pk]  # bytes are not JSON
        names, values = _interned((*names, "row_id")), (*values, pk[0] if len(pk) == 1 else pk or None)
    if after is not None and before is not None:
        changed = [c for c in columns if before.get(c) != after.get(c)]
        if changed:
            names = _interned(names + tuple(f"before.{c}" for c in changed))
            values += tuple(before.get(c) for c in changed)
    return ("row_change", change.coordinates, change.commit_time, names, values)


def event_evidence(event: EmittedEvent) -> EvidenceItem:
    keys = event.keys
    return ("event", event.coordinates, event.timestamp_ms / 1000.0, _interned((*keys, "key", "timestamp_type")),
            (*keys.values(), event.key, event.timestamp_type))


def offsets_evidence(coordinates: str, time: float, values: dict[str, Any]) -> EvidenceItem:
    return ("offsets", coordinates, time, _interned(tuple(values)), tuple(values.values()))


def values_of(item: EvidenceItem) -> dict[str, Any]:
    return dict(zip(item[3], item[4]))


def _merge(old: tuple[Evidence, ...], new: Iterable[EvidenceItem]) -> tuple[Evidence, ...]:
    by_place = {(e.kind, e.coordinates): e for e in old}
    for item in new:
        by_place.setdefault((item[0], item[1]), Evidence(item[0], item[1], item[2], values_of(item)))
    return tuple(sorted(by_place.values(), key=lambda e: (e.time, e.kind, e.coordinates)))


def to_dict(f: Finding) -> dict[str, Any]:
    return dataclasses.asdict(f)


def from_dict(d: dict[str, Any]) -> Finding:
    return Finding(**{**d, "evidence": tuple(Evidence(**e) for e in d["evidence"])})


class Findings:
    """The findings the engine may still change, and those changed since the last drain.

    `raise_` opens or updates a finding (evidence is merged; a resolved one reopens);
    `settle` records a fact that is already over (an event that came late, an order paid
    after the threshold) whether or not the open finding had been raised yet, so that the
    result does not depend on when the timer ran.
    """

    def __init__(self, memory: Memory):
        # findings that may still change, by id; they age on the later of the two stream clocks
        # only ever looked up by id (the store counts them for /metrics), so older ones may spill
        self.live = memory.aging("findings", STREAMS, encode=to_dict, decode=from_dict, spill=True)
        self.found_total = memory.counters("found_total", dict.fromkeys(RULES, 0))
        # rule -> the watched tables (entries) a shape change blinds it for (checks.shape): what it would have
        # raised about them meanwhile is counted, what it raises about the others stands
        self.blind: dict[str, frozenset[str]] = {}
        self.suppressed = memory.counters("suppressed", {})
        self.changed: dict[str, Finding] = {}
        # told of every finding raised or changed (checks.verdicts: the trades it touches)
        self.listener: Callable[[Finding], None] | None = None

    def blinded(self, rule: str, keys: dict[str, Any]) -> bool:
        """A finding of `rule` with these keys reads a table its rule is blind for: its keys' "table" (F7-F10) or
        "tables" (F1); a rule whose findings name no table (F2-F6: one table of each role) is blind for all."""
        tables = self.blind.get(rule)
        if not tables:
            return False
        named = keys.get("tables") or ((keys["table"],) if "table" in keys else None)
        return named is None or not tables.isdisjoint(named)

    def get(self, fid: str) -> Finding | None:
        return self.live.get(fid)

    def _put(self, f: Finding, created: bool) -> Finding:
        self.live.put(f.id, f, f.last_seen)
        self.changed[f.id] = f
        if created:
            self.found_total[f.rule] += 1
        if self.listener is not None:
            self.listener(f)
        return f

    def raise_(self, rule: str, identity: tuple[Any, ...], *, keys: dict[str, Any], summary: str, time: float,
               evidence: Iterable[EvidenceItem], severity: str | None = None,
               replace: bool = False) -> Finding | None:
        """Open (or update) the finding of `rule` about `identity`; `replace` keeps only the new evidence
        (readings such as offsets, where the latest one is what counts). A blind rule raises nothing
        about the tables it is blind for: it is counted in `suppressed` instead (checks.shape)."""
        if self.blind and self.blinded(rule, keys):
            self.suppressed[rule] = self.suppressed.get(rule, 0) + 1
            return None
        fid = finding_id(rule, *identity)
        severity = severity or RULES[rule].severity
        old = self.live.get(fid)
        if old is None:
            return self._put(Finding(id=fid, rule=rule, name=RULES[rule].name, severity=severity, keys=keys,
                                     summary=summary, first_seen=time, last_seen=time,
                                     evidence=_merge((), evidence)), created=True)
        if SEVERITY_RANK[old.severity] > SEVERITY_RANK[severity]:
            severity = old.severity
        new = dataclasses.replace(old, severity=severity, keys=keys, summary=summary,
                                  last_seen=max(old.last_seen, time), status=OPEN, resolved_at=None, resolution=None,
                                  evidence=_merge(() if replace else old.evidence, evidence))
        return new if new == old else self._put(new, created=False)

    def resolve(self, fid: str, at: float, why: str, evidence: Iterable[EvidenceItem] = ()) -> None:
        """`evidence`: what ended the fact (a deleted row), added to the finding's."""
        old = self.live.get(fid)
        if old is not None and old.status == OPEN:
            # A history in time order whatever the clocks did: a fact that ended at `at`, before it was last seen
            # standing (a clock that ran ahead; a delete timed by the binlog's whole second), is resolved as of then.
            at = max(at, old.last_seen)
            self._put(dataclasses.replace(old, status=RESOLVED, resolved_at=at, resolution=why, last_seen=at,
                                          evidence=_merge(old.evidence, evidence)),
                      created=False)

    def settle(self, rule: str, identity: tuple[Any, ...], *, keys: dict[str, Any], summary: str, since: float,
               evidence: Iterable[EvidenceItem], at: float, why: str) -> None:
        """Record a fact that started at `since` and ended at `at`, resolved, with all its evidence."""
        self.raise_(rule, identity, keys=keys, summary=summary, time=since, evidence=evidence)
        self.resolve(finding_id(rule, *identity), at, why)

    def drain(self) -> list[Finding]:
        out, self.changed = list(self.changed.values()), {}
        return out
