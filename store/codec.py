"""Records to store rows and back: the columns of each table and the JSON kept in them."""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, NamedTuple

import msgspec

from oncewatch.core.exact_json import JSON_DECODER, from_json, parse_exact_json, to_json
from oncewatch.core.protocol import (BinlogStatus, BootstrapStatus, BrokerKnown, CdcStatus, ComponentHealth,
                                     GroupMemberHealth, Health, KafkaEventsStatus, MonitorHealth, ReaderHealth, Status)
from oncewatch.core.records import EmittedEvent, Evidence, Finding, OffsetsSnapshot, RowChange, TradeVerdict


def finding_from_row(row: sqlite3.Row | tuple) -> Finding:
    (fid, rule, name, severity, status, keys, summary, first_seen, last_seen, resolved_at, resolution,
     evidence) = row
    return Finding(id=fid, rule=rule, name=name, severity=severity, status=status, keys=from_json(keys),
                   summary=summary, first_seen=first_seen, last_seen=last_seen, resolved_at=resolved_at,
                   resolution=resolution,
                   evidence=tuple(Evidence(**e) for e in from_json(evidence)))


def known_value(known: BrokerKnown) -> Any:
    """A checkpoint's value of what an events reader knew of the broker: {"ends": [[partition, end, epoch, held]],
    "settle_until": time}."""
    return msgspec.to_builtins(known)


def known_from_value(value: Any) -> BrokerKnown:
    """The inverse of `known_value`."""
    return msgspec.convert(value, BrokerKnown)


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
    """The inverse of `event_body` (the body unpacked) with the other columns. Bodies written before the array form
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


class HistoryEntry(NamedTuple):
    """One row of finding_history: a finding's status changed to `status`, by the monitor or a person."""

    finding_id: str
    at: float
    status: str
    by: str
    reason: str | None
    note: str


HISTORY_COLUMNS = ", ".join(HistoryEntry._fields)


ROW_CHANGE_COLUMNS = ("schema_name, table_name, op, pk, before_row, after_row, txid, row_index, binlog_file, end_pos, "
                      "commit_time, commit_clock, snapshot")


def row_change_from_row(row: tuple, unpack: Callable[[Any], str | None]) -> RowChange:
    """A row_changes row (ROW_CHANGE_COLUMNS), its images unpacked by `unpack` (store.packing)."""
    s, t, op, pk, b, a, tx, ri, f, p, ct, cc, sn = row
    return RowChange(schema=s, table=t, op=op, pk=tuple(from_json(pk)), before=None if b is None else from_json(unpack(b)),
                     after=None if a is None else from_json(unpack(a)), txid=tx, row_index=ri, binlog_file=f,
                     end_pos=p, commit_time=ct, commit_clock=cc, snapshot=bool(sn))


def headers_json(headers: Sequence[tuple[str, bytes | None]]) -> str:
    """A record's headers as JSON: [[key, value in base64 or null], ...] (values are any bytes; a key that is
    not UTF-8, in surrogate escapes, is written as its \\udcXX escapes and read back as it was)."""
    return json.dumps([[k, None if v is None else base64.b64encode(v).decode()] for k, v in headers])


def headers_from_json(text: str) -> tuple[tuple[str, bytes | None], ...]:
    return tuple((k, None if v is None else base64.b64decode(v)) for k, v in json.loads(text))


VERDICT_COLUMNS = "trade_no, order_id, amount, verdict, rule, committed_at, reached_at, verified_at"


def verdict_from_row(row: tuple) -> TradeVerdict:
    """A trade_verdicts row (VERDICT_COLUMNS): its amount is kept as exact decimal text."""
    trade_no, order_id, amount, verdict, rule, committed_at, reached_at, verified_at = row
    return TradeVerdict(trade_no=trade_no, order_id=order_id, amount=None if amount is None else Decimal(amount),
                        verdict=verdict, rule=rule, committed_at=committed_at, reached_at=reached_at,
                        verified_at=verified_at)


# ---------------------------------------------------------------- health rows

# The kind a health row's JSON names its status by: each part's status type, one name each.
STATUS_KINDS: dict[str, type[Status]] = {"binlog": BinlogStatus, "bootstrap": BootstrapStatus, "cdc": CdcStatus,
                                         "kafka_events": KafkaEventsStatus, "kafka_offsets": OffsetsSnapshot}
_KIND_OF = {t: kind for kind, t in STATUS_KINDS.items()}
MONITOR_KIND, MEMBER_KIND = "monitor", "group_member"


class HealthRowError(ValueError):
    """A health row that is none of the kinds this version writes."""


def health_json(health: Health) -> str:
    """A health row's value as JSON: {"kind": ..., "status": ..., "reader": ...} for a part, {"kind": "monitor",
    "monitor": ...} for the monitor, {"kind": "group_member", "member": ...} for a group's member."""
    doc: dict[str, Any]
    if isinstance(health, ComponentHealth):
        doc = {"kind": _KIND_OF[type(health.status)], "status": health.status, "reader": health.reader._asdict()}
    elif isinstance(health, MonitorHealth):
        doc = {"kind": MONITOR_KIND, "monitor": health}
    else:
        doc = {"kind": MEMBER_KIND, "member": health}
    return msgspec.json.encode(doc).decode()


def health_from_json(text: str) -> Health:
    """The inverse of `health_json`; HealthRowError for a row of another kind (one written by an oncewatch before
    the health rows had kinds: the monitor writes its rows again every second)."""
    doc = msgspec.json.decode(text)
    kind = doc.get("kind") if isinstance(doc, dict) else None
    try:
        if kind == MONITOR_KIND:
            return msgspec.convert(doc["monitor"], MonitorHealth)
        if kind == MEMBER_KIND:
            return msgspec.convert(doc["member"], GroupMemberHealth)
        if kind in STATUS_KINDS:
            return ComponentHealth(msgspec.convert(doc["status"], STATUS_KINDS[kind]),
                                   ReaderHealth(**doc["reader"]))
    except (KeyError, msgspec.ValidationError) as exc:
        raise HealthRowError(f"a {kind} health row that does not decode ({exc})") from exc
    raise HealthRowError(f"a health row of no known kind ({kind!r})")
