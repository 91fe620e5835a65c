"""Debezium's change events and transaction markers read exactly (no I/O): a data record as a `DataRecord` with its
row's values decoded by its schema (collectors.debezium_rows), a transaction topic's BEGIN or END as a `Marker`. A
table's records all carry the same schema, which `Schemas` parses once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgspec

from oncewatch.collectors.debezium_rows import Undecodable, column_decoders, image, image_schema, key_columns

NEW_KEY, OLD_KEY = "__debezium.newkey", "__debezium.oldkey"


class DataRecord(NamedTuple):
    """One Debezium data record of a watched table, read: its row, or why it could not be (a NamedTuple: one is
    made per record read, the hot path of CDC mode)."""

    topic: str
    partition: int
    offset: int
    txid: str
    order: int  # transaction.total_order: counted from 1 again by a connector restarted inside the transaction
    op: str  # c u d r t
    db: str
    table: str
    pk: tuple[Any, ...]
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    file: str
    pos: int
    header_time: float
    key_changed: str | None = None  # NEW_KEY on the delete of a primary-key change, OLD_KEY on its insert
    undecodable: str | None = None
    snapshot_last: bool = False  # the connector's snapshot ends with this record
    part: str = ""  # "topic/partition"
    row: int = 0  # source.row: the row's place in its binlog rows event (file, pos and row say which row it is)
    snapshot_first: bool = False  # the connector's snapshot of its table begins with this record


_HEAD, _PAYLOAD = b'{"schema":', b',"payload":'
_SCHEMAS_KEPT = 256
_PROBE = 48  # bytes of a schema's end that, with its length, find it in the cache


class _Source(msgspec.Struct):
    db: str = ""
    table: str = ""
    file: str = ""
    pos: int = 0
    ts_ms: int = 0
    gtid: str | None = None
    snapshot: str | bool | None = None  # "true", "last" or "false" (older connectors: a boolean)
    row: int = 0


class _Block(msgspec.Struct):
    id: str = ""
    total_order: int = 0


class _Envelope(msgspec.Struct):
    """A change event's payload, the parts oncewatch reads (msgspec skips the rest without building it)."""

    op: str
    source: _Source
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    transaction: _Block | None = None


_ENVELOPE = msgspec.json.Decoder(_Envelope)


class _Collection(msgspec.Struct):
    data_collection: str = ""
    event_count: int | None = 0


class Marker(msgspec.Struct):
    """A transaction topic's BEGIN or END, the parts oncewatch reads."""

    status: str = ""
    id: str = ""
    ts_ms: int = 0  # the transaction's binlog time (whole seconds, in ms)
    data_collections: list[_Collection] | None = None


MARKER = msgspec.json.Decoder(Marker)


class Schemas:
    """What a record's schema says (its columns' decoders, its key's columns), kept by the schema's bytes: a
    table's records all carry the same few kilobytes of schema, which then need not be parsed again.

    A record's schema is found in the cache by its length and its last bytes, then compared in place, byte for
    byte, with the one kept: neither copied out of the record nor hashed whole (both cost more than the rest of
    reading the record). A record whose schema differs anywhere is a miss, and its own schema is parsed."""

    def __init__(self) -> None:
        self._values: dict[tuple[int, bytes], tuple[bytes, dict[str, Any] | Undecodable]] = {}
        self._keys: dict[tuple[int, bytes], tuple[bytes, list[str]]] = {}
        self._others: dict[tuple[int, bytes], tuple[bytes, None]] = {}  # schemas only skipped (the transaction topic)
        self._last: dict[int, tuple[bytes, Any]] = {}  # per cache, the schema found last: the next record's, mostly

    @staticmethod
    def _payload_at(data: bytes) -> int:
        """Where the JsonConverter's {"schema":...,"payload":...} has its payload; -1 for another layout."""
        at = data.find(_PAYLOAD)
        return at if at > 0 and data.startswith(_HEAD) and data.endswith(b"}") else -1

    def _cached(self, cache: dict[tuple[int, bytes], tuple[bytes, Any]], data: bytes,
                parse: Callable[[Any], Any]) -> tuple[int, Any]:
        """(where the payload is, what `parse` made of the schema), or (-1, None) for another layout."""
        last = self._last.get(id(cache))
        if last is not None:  # the record has the last one's schema, followed by its payload
            at = len(_HEAD) + len(last[0])
            if data.startswith(last[0], len(_HEAD)) and data.startswith(_PAYLOAD, at) and data.startswith(_HEAD):
                return at, last[1]
        at = self._payload_at(data)
        if at < 0:
            return -1, None
        probe = (at, data[max(len(_HEAD), at - _PROBE):at])
        hit = cache.get(probe)
        if hit is None or at - len(_HEAD) != len(hit[0]) or not data.startswith(hit[0], len(_HEAD)):
            if len(cache) >= _SCHEMAS_KEPT:
                cache.clear()
            schema = data[len(_HEAD):at]
            hit = cache[probe] = (schema, parse(msgspec.json.decode(schema)))
        self._last[id(cache)] = hit
        return at, hit[1]

    def value(self, data: bytes) -> tuple[_Envelope, dict[str, Any] | Undecodable]:
        """(payload, decoders by column or why there are none)."""
        at, decoders = self._cached(self._values, data, self._decoders)
        if at < 0 or not data.endswith(b"}"):
            doc = msgspec.json.decode(data)
            if isinstance(doc, dict) and "op" in doc and "payload" not in doc:
                raise Undecodable("the record carries no schema: the connector's JsonConverter needs "
                                  "schemas.enable=true for oncewatch to read its columns exactly")
            return msgspec.convert(doc["payload"], _Envelope), self._decoders(doc.get("schema"))
        return _ENVELOPE.decode(memoryview(data)[at + len(_PAYLOAD):-1]), decoders

    def marker(self, data: bytes) -> Marker:
        """A transaction topic record's payload, its schema skipped."""
        at, _ = self._cached(self._others, data, lambda schema: None)
        if at >= 0 and data.endswith(b"}"):
            return MARKER.decode(memoryview(data)[at + len(_PAYLOAD):-1])
        return msgspec.convert(msgspec.json.decode(data)["payload"], Marker)

    def key(self, data: bytes | None) -> list[str]:
        if data is None:
            return []
        at, columns = self._cached(self._keys, data, key_columns)
        return key_columns(msgspec.json.decode(data).get("schema")) if at < 0 else columns

    @staticmethod
    def _decoders(schema: Any) -> dict[str, Any] | Undecodable:
        try:
            return column_decoders(image_schema(schema))
        except Undecodable as exc:
            return exc


def read_record(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                headers: Sequence[tuple[str, bytes | None]], schemas: Schemas | None = None,
                part: str = "") -> DataRecord | None:
    """A data record as a DataRecord; None for a tombstone. A record not in Debezium's shape is Undecodable.
    `part`: its "topic/partition", where the caller has it made already."""
    if value is None:
        return None
    schemas = schemas or Schemas()
    part = part or f"{topic}/{partition}"
    try:
        payload, decoders = schemas.value(value)
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError, AttributeError) as exc:
        raise Undecodable(f"not a Debezium change event with its schema ({type(exc).__name__}: {exc})") from None
    source, op, tx = payload.source, payload.op, payload.transaction
    txid = (tx.id if tx is not None else "") or source.gtid or ""
    key_changed = None
    for name, _ in headers:  # almost always none: only a primary-key change is marked
        if name in (NEW_KEY, OLD_KEY):
            key_changed = name
    order = tx.total_order if tx is not None else 0
    last = op == "r" and source.snapshot == "last"
    first = op == "r" and source.snapshot in ("first", "first_in_data_collection")
    undecodable = None
    pk: tuple[Any, ...] = ()
    before = after = None
    if op != "t":
        try:
            if isinstance(decoders, Undecodable):
                raise decoders
            before = None if payload.before is None else image(payload.before, decoders)
            after = None if payload.after is None else image(payload.after, decoders)
            columns = schemas.key(key)
            row = after if after is not None else before or {}
            pk = tuple(row.get(c) for c in columns)
        except Undecodable as exc:
            before = after = None
            undecodable = str(exc)
        except (msgspec.DecodeError, AttributeError) as exc:
            before = after = None
            undecodable = f"the record key is not Debezium's ({exc})"
    return DataRecord(topic, partition, offset, txid, order, op, source.db, source.table, pk, before, after,
                      source.file, source.pos, source.ts_ms / 1000, key_changed, undecodable, last, part,
                      source.row, first)
