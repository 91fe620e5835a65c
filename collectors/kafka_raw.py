"""Reads, byte for byte, the records of a batch that kafka-python could not decode.

kafka-python decodes each header key as UTF-8 while it unpacks a record batch. A key that is not
UTF-8 raises out of `poll()` (a CorruptRecordError over the UnicodeDecodeError), and so does every
record after it in that batch, which is read in order: the records are then nowhere in its answer.
The batch it was reading is, though: the `self` of the `DefaultRecordBatch.__next__` frame that
raised, which the exception's traceback keeps (`failed_batch`). `unpack` reads that batch's records
as the v2 record format defines them (KIP-98: length, attributes, timestamp delta, offset delta,
key, value, headers), with header keys as bytes: a key that is not UTF-8 is kept in surrogate
escapes, so that `key.encode("utf-8", "surrogateescape")` gives back its bytes as they came.

None of this is kafka-python's public API (measured on 3.0.12). A version that keeps the batch
elsewhere makes `failed_batch` find none, and the caller quarantines the offset without its bytes,
loudly; tests/integration/test_kafka_events.py shows which happens. A batch that failed its CRC is
never read here: its bytes cannot be trusted, and it raises before any record is read.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from kafka.record.default_records import DefaultRecordBatch
from kafka.record.util import decode_varint


class UnreadableBatchError(ValueError):
    """The batch's bytes do not follow the record format, so no record of it can be told apart."""


@dataclass(frozen=True)
class UnpackedRecord:
    """One record of a batch read here, with what kafka_formats.RawRecord reads of a record."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    undecodable: str | None  # what kafka-python cannot decode in it (a header key that is not UTF-8), if anything


def failed_batch(exc: BaseException) -> DefaultRecordBatch | None:
    """The batch kafka-python was reading a record of when `exc` was raised, or None."""
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        batch = frame.f_locals.get("self")
        if frame.f_code.co_name == "__next__" and isinstance(batch, DefaultRecordBatch):
            return batch
    return None


def unpack(batch: DefaultRecordBatch, topic: str, partition: int) -> list[UnpackedRecord]:
    """Every record of a batch that kafka-python has begun to read, in offset order."""
    # Once kafka-python reads a batch's records, its buffer holds them alone, decompressed, when the batch
    # was compressed, and the whole batch, header first, when it was not.
    buffer = bytes(batch._buffer)  # noqa: SLF001 - the only copy of the bytes (see the module docstring)
    pos = 0 if batch.compression_type != batch.CODEC_NONE else batch.HEADER_STRUCT.size
    records = []
    try:
        for _ in range(batch.records_count):
            record, pos = _record(batch, topic, partition, buffer, pos)
            records.append(record)
    except (IndexError, ValueError) as exc:
        raise UnreadableBatchError(f"record {len(records)} of the batch at offset {batch.base_offset} of "
                                   f"{topic}/{partition}: {exc}") from exc
    if pos != len(buffer):
        raise UnreadableBatchError(f"{len(buffer) - pos} bytes after the {len(records)} records of the batch at "
                                   f"offset {batch.base_offset} of {topic}/{partition}")
    return records


def _record(batch: DefaultRecordBatch, topic: str, partition: int, buffer: bytes,
            pos: int) -> tuple[UnpackedRecord, int]:
    length, pos = decode_varint(buffer, pos)
    end = pos + length
    pos += 1  # attributes: one byte, no bit of which is used yet
    timestamp_delta, pos = decode_varint(buffer, pos)
    offset_delta, pos = decode_varint(buffer, pos)
    key, pos = _bytes(buffer, pos)
    value, pos = _bytes(buffer, pos)
    count, pos = decode_varint(buffer, pos)
    headers: list[tuple[str, bytes | None]] = []
    undecodable = None
    for i in range(count):
        name, pos = _bytes(buffer, pos)
        if name is None:
            raise ValueError(f"header {i} has no key")
        header_value, pos = _bytes(buffer, pos)
        try:
            text = name.decode("utf-8")
        except UnicodeDecodeError as exc:
            text = name.decode("utf-8", "surrogateescape")
            undecodable = undecodable or f"header key {i} is not UTF-8 (UnicodeDecodeError at byte {exc.start})"
        headers.append((text, header_value))
    if pos != end:
        raise ValueError(f"a record of {length} bytes holds {length + pos - end}")
    timestamp = (batch.max_timestamp if batch.timestamp_type == batch.LOG_APPEND_TIME
                 else batch.first_timestamp + timestamp_delta)
    return UnpackedRecord(topic, partition, batch.base_offset + offset_delta, timestamp, batch.timestamp_type, key,
                          value, tuple(headers), undecodable), pos


def _bytes(buffer: bytes, pos: int) -> tuple[bytes | None, int]:
    """A varint length, then that many bytes (a length of -1 is null)."""
    n, pos = decode_varint(buffer, pos)
    if n < 0:
        return None, pos
    if pos + n > len(buffer):
        raise ValueError(f"{n} bytes announced, {len(buffer) - pos} left")
    return buffer[pos:pos + n], pos + n


__all__ = ["UnpackedRecord", "UnreadableBatchError", "failed_batch", "unpack"]
