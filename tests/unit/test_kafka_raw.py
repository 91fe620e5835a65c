"""collectors.kafka_raw reads, byte for byte, a batch kafka-python fails on (issue 42, observation 8); the dev
broker's real batches are tests/integration/test_kafka_events.py's. Here the record format's corners: null key,
value and header value, several records before and after the undecodable one, a compressed batch."""

from __future__ import annotations

import pytest
from kafka.errors import CorruptRecordError
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from oncewatch.collectors.kafka_raw import UnpackedRecord, UnreadableBatchError, failed_batch, unpack


class NotUtf8(str):
    """A header key whose bytes are not UTF-8: kafka-python's builder encodes keys with str.encode."""

    def encode(self, *_: object, **__: object) -> bytes:
        return b"\xff\xfekey"


PADDED = b"v0" + b" " * 600  # kafka-python compresses a batch only when that makes it smaller
RECORDS = [  # (offset delta, timestamp, key, value, headers)
    (0, 1_700_000_000_000, b"k0", PADDED, [("a", b"1")]),
    (1, 1_700_000_000_007, None, b"v1", [(NotUtf8("x"), b"\x00\xff"), ("b", None)]),
    (2, 1_700_000_000_009, b"k2", None, []),
]


def batch_bytes(compression: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for delta, ts, key, value, headers in RECORDS:
        builder.append(delta, timestamp=ts, key=key, value=value, headers=headers)
    return bytes(builder.build())


def failure(data: bytes) -> Exception:
    """What kafka-python raises reading the batch, as its fetcher does."""
    batch = MemoryRecords(data).next_batch()
    with pytest.raises(CorruptRecordError) as failed:
        list(batch)
    return failed.value


@pytest.mark.parametrize("compression", [DefaultRecordBatch.CODEC_NONE, DefaultRecordBatch.CODEC_GZIP])
def test_every_record_of_the_failed_batch_is_read_as_it_was(compression):
    exc = failure(batch_bytes(compression))
    batch = failed_batch(exc)
    assert batch is not None and batch.compression_type == compression
    records = unpack(batch, "t", 3)
    assert records == [
        UnpackedRecord("t", 3, 0, 1_700_000_000_000, 0, b"k0", PADDED, (("a", b"1"),), None),
        UnpackedRecord("t", 3, 1, 1_700_000_000_007, 0, None, b"v1", (("\udcff\udcfekey", b"\x00\xff"), ("b", None)),
                       "header key 0 is not UTF-8 (UnicodeDecodeError at byte 0)"),
        UnpackedRecord("t", 3, 2, 1_700_000_000_009, 0, b"k2", None, (), None)]
    assert records[1].headers[0][0].encode("utf-8", "surrogateescape") == b"\xff\xfekey"


def test_an_exception_of_no_batch_names_none():
    try:
        raise CorruptRecordError("Record batch for partition t-0 at offset 5 failed crc check")
    except CorruptRecordError as exc:
        assert failed_batch(exc) is None


def test_bytes_that_do_not_follow_the_format_are_unreadable():
    data = bytearray(batch_bytes(DefaultRecordBatch.CODEC_NONE))
    batch = failed_batch(failure(bytes(data)))
    batch._buffer = batch._buffer[:-3]  # noqa: SLF001 - a batch cut short
    with pytest.raises(UnreadableBatchError, match="record 2 of the batch at offset 0 of t/0"):
        unpack(batch, "t", 0)
