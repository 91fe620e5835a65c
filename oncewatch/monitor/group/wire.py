"""What travels on the internal topic: one message per shard's part of a transaction, per event, per clock mark.

Each message names its source (`"cdc"` for the change source, "topic/partition" for an event partition) and its
place in it (`seq`), so that a judge applies each source's messages once, in order, whatever a router replays
after it restarts or loses its sources to another instance: a judge keeps, per source, the highest `seq` applied
(checks nothing else: a router writes one source's messages in its order). The value is exact JSON
(core.exact_json): Decimal money, datetimes and bytes arrive as they left.

Messages travel in batches, one record of the internal topic holding those a router wrote to one shard since the
last (`batch`, `decode`): Kafka's cost is per record, far above a message's.

- `Part`: a shard's part of a transaction (checks.shards.Router.split) and the watch start, if it set it; `seq`
  counts the change source's transactions (the router's, carried in its checkpoint).
- `Event`: an event, `seq` its offset.
- `Mark`: a source vouches that every message it has written is stamped before `at` (a router's clock: the newest
  commit handed on, or now when read to the end; an event partition's kafka_watermark), with `partitions` the
  number of partitions of its topic, so a judge knows when every source of its Kafka clock has spoken.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from oncewatch.core.exact_json import from_json, to_json
from oncewatch.core.records import (BinlogPosition, CdcDelivery, EmittedEvent, QuarantinedRows, Replay, RowChange,
                                    SchemaChange, Transaction)

CDC_SOURCE = "cdc"


class WireError(ValueError):
    """A message on the internal topic that this version cannot read."""


@dataclass(frozen=True)
class Part:
    seq: int
    tx: Transaction
    watch_start: float | None = None
    source: str = CDC_SOURCE


@dataclass(frozen=True)
class Event:
    source: str
    seq: int
    event: EmittedEvent


@dataclass(frozen=True)
class Mark:
    source: str
    seq: int
    at: float
    partitions: int = 1


Message = Part | Event | Mark


def _row(r: RowChange) -> list[Any]:
    return [r.schema, r.table, r.op, list(r.pk), r.before, r.after, r.txid, r.row_index, r.binlog_file, r.end_pos,
            r.commit_time, r.commit_clock, r.snapshot]


def _tx(tx: Transaction) -> dict[str, Any]:
    d, p = tx.cdc, tx.position
    # the position's fields by hand: dataclasses.asdict copies deeply, a tenth of the cost of a message
    return {"rows": [_row(r) for r in tx.rows], "position": {"gtid": p.gtid, "file": p.file, "pos": p.pos},
            "commit_time": tx.commit_time, "quarantined": [asdict(q) for q in tx.quarantined],
            "schema_changes": [asdict(c) for c in tx.schema_changes],
            "complete": tx.complete, "snapshot": tx.snapshot,
            "cdc": None if d is None else {**asdict(d), "replays": [list(r) for r in d.replays]}}


def _untx(d: dict[str, Any]) -> Transaction:
    cdc = d["cdc"]
    return Transaction(
        rows=tuple(RowChange(s, t, op, tuple(pk), before, after, *rest) for s, t, op, pk, before, after, *rest
                   in d["rows"]),
        position=BinlogPosition(**d["position"]), commit_time=d["commit_time"],
        quarantined=tuple(QuarantinedRows(**q) for q in d["quarantined"]),
        schema_changes=tuple(SchemaChange(**c) for c in d["schema_changes"]), complete=d["complete"],
        snapshot=d["snapshot"],
        cdc=None if cdc is None else CdcDelivery(**{**cdc, "replays": tuple(Replay(*r) for r in cdc["replays"])}))


def _event(e: EmittedEvent) -> dict[str, Any]:
    return {"topic": e.topic, "partition": e.partition, "offset": e.offset, "timestamp_ms": e.timestamp_ms,
            "timestamp_type": e.timestamp_type, "key": e.key, "headers": [list(h) for h in e.headers],
            "payload": e.payload, "format": e.format, "keys": e.keys, "cdc": e.cdc}


def batch(encoded: list[bytes]) -> bytes:
    """Messages (each `encode`d) as the value of one internal-topic record: Kafka's cost is per record."""
    return b"[" + b",".join(encoded) + b"]"


def encode(message: Message) -> bytes:
    if isinstance(message, Part):
        body = {"kind": "part", "source": message.source, "seq": message.seq, "tx": _tx(message.tx),
                "watch_start": message.watch_start}
    elif isinstance(message, Event):
        body = {"kind": "event", "source": message.source, "seq": message.seq, "event": _event(message.event)}
    else:
        body = {"kind": "mark", "source": message.source, "seq": message.seq, "at": message.at,
                "partitions": message.partitions}
    return to_json(body, sort_keys=False).encode()


def decode(value: bytes) -> list[Message]:
    """The messages of one internal-topic record (`batch`)."""
    try:
        bodies = from_json(value.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"an internal-topic record this oncewatch cannot read ({type(exc).__name__}: {exc}): every "
                        "instance of a group must run the same oncewatch version") from exc
    if not isinstance(bodies, list):
        raise WireError("an internal-topic record that is no batch of messages: every instance of a group must run "
                        "the same oncewatch version")
    return [_message(body) for body in bodies]


def _message(body: Any) -> Message:
    try:
        kind = body["kind"]
        if kind == "part":
            return Part(body["seq"], _untx(body["tx"]), body["watch_start"], body["source"])
        if kind == "event":
            e = body["event"]
            return Event(body["source"], body["seq"], EmittedEvent(**{**e, "headers": tuple(map(tuple, e["headers"]))}))
        if kind == "mark":
            return Mark(body["source"], body["seq"], body["at"], body["partitions"])
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"an internal-topic message this oncewatch cannot read ({type(exc).__name__}: {exc}): "
                        "every instance of a group must run the same oncewatch version") from exc
    raise WireError(f"an internal-topic message of unknown kind {kind!r}: every instance of a group must run the "
                    "same oncewatch version")


def group_name(group: str, what: str) -> str:
    """One of the group's names on Kafka: its topics RECORDS (a partition per shard) and LEASE (one partition: whoever
    the routers' group gives it reads the change source), its consumer groups JUDGES and ROUTERS."""
    return f"oncewatch.{group}.{what}"


RECORDS, LEASE, JUDGES, ROUTERS = "records", "lease", "judges", "routers"
