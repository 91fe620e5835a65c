"""The row images of a binlog rows event, decoded straight from its bytes: the same values as
pymysqlreplication's `event.rows`, several times faster.

The library decodes a row through half a dozen method calls and a `struct.unpack` per column,
which was half of the binlog tail's time. Here each table gets, once per table map, a list of
small readers (one per column, chosen by its type and metadata), and a row is a loop over them
on the event's bytes; the DATETIME and DECIMAL values of a stream repeat (a batch written in
one second, the same prices), so their readers keep what they decoded by its bytes.

A table with a column type not listed in `_READERS` (GEOMETRY, the pre-5.6 temporal types,
MySQL's binary JSON, which MariaDB does not write) has no decoder, and an event whose images leave
columns out (binlog_row_image other than FULL) is not decoded here: the library decodes those, as
before. What this decodes is checked against the library over a binlog holding every
listed type (tests/integration/test_row_images.py).
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pymysql.charset import charset_by_name
from pymysqlreplication.constants import FIELD_TYPE as T

Reader = Callable[[bytes, int], tuple[Any, int]]  # (event bytes, offset) -> (value, offset after it)
Image = dict[str, Any]

EPOCH = dt.datetime(1970, 1, 1)
CACHED = 4096  # values kept per DATETIME/DECIMAL column before its memo starts afresh
_DECIMAL_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)  # bytes of 0..9 leftover digits


def _fixed(fmt: str) -> Reader:
    unpack, size = struct.Struct(fmt).unpack_from, struct.calcsize(fmt)

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        return unpack(buf, pos)[0], pos + size
    return read


def _int24(signed: bool) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[int, int]:
        return int.from_bytes(buf[pos:pos + 3], "little", signed=signed), pos + 3
    return read


def _encoding(column: Any) -> str | None:
    """The Python codec of a text column (None: bytes kept as they are, as the library does for `binary`)."""
    name = column.character_set_name
    if name is None:
        return "utf-8"
    charset = charset_by_name(name)
    encoding = charset.encoding if charset else name
    try:
        "".encode(encoding)
    except LookupError:
        return None
    return encoding


def _text(length_size: int, encoding: str | None) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        end = pos + length_size + int.from_bytes(buf[pos:pos + length_size], "little")
        raw = buf[pos + length_size:end]
        # bytes of a binary column, but "" when there are none: the library's decode of b"" never looks its
        # codec up, so it gives "" (and the values must be the library's)
        return (raw.decode(encoding) if encoding else raw or ""), end
    return read


def _fraction(fsp: int) -> tuple[int, Callable[[bytes], int]]:
    """Bytes of a fractional-seconds part and how to read microseconds from them (the library's way)."""
    size = (fsp + 1) // 2
    scale = 10 ** (6 - fsp)

    def micros(raw: bytes) -> int:
        value = int.from_bytes(raw, "big", signed=True)
        return (int(value / 10) if fsp % 2 else value) * scale
    return size, micros


def _memo(size: int, decode: Callable[[bytes], Any]) -> Reader:
    """A reader of `size` bytes that keeps the values it decoded by their bytes (they are immutable)."""
    seen: dict[bytes, Any] = {}

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        raw = buf[pos:pos + size]
        try:
            return seen[raw], pos + size
        except KeyError:
            pass
        if len(seen) >= CACHED:
            seen.clear()
        value = seen[raw] = decode(raw)
        return value, pos + size
    return read


def _datetime2(fsp: int) -> Reader:
    frac, micros = _fraction(fsp)

    def decode(raw: bytes) -> dt.datetime | None:
        packed = int.from_bytes(raw[:5], "big")
        year_month = (packed >> 22) & 0x1FFFF
        try:
            value = dt.datetime(year_month // 13, year_month % 13, (packed >> 17) & 0x1F, (packed >> 12) & 0x1F,
                                (packed >> 6) & 0x3F, packed & 0x3F)
        except ValueError:
            return None  # a zero date ('0000-00-00 00:00:00'), as the library gives it
        us = micros(raw[5:]) if frac else 0
        return value.replace(microsecond=us) if us > 0 else value
    return _memo(5 + frac, decode)


def _timestamp2(fsp: int) -> Reader:
    frac, micros = _fraction(fsp)

    def decode(raw: bytes) -> dt.datetime:
        value = EPOCH + dt.timedelta(seconds=int.from_bytes(raw[:4], "big", signed=True))
        us = micros(raw[4:]) if frac else 0
        return value.replace(microsecond=us) if us > 0 else value
    return _memo(4 + frac, decode)


def _time2(fsp: int) -> Reader:
    frac, micros = _fraction(fsp)

    def read(buf: bytes, pos: int) -> tuple[dt.timedelta, int]:
        packed = int.from_bytes(buf[pos:pos + 3], "big", signed=True)
        sign = 1 if (packed >> 23) & 1 else -1
        if sign == -1:
            packed = ~packed + 1
        value = dt.timedelta(hours=(packed >> 12) & 0x3FF, minutes=(packed >> 6) & 0x3F, seconds=packed & 0x3F,
                             microseconds=micros(buf[pos + 3:pos + 3 + frac]) if frac else 0) * sign
        return value, pos + 3 + frac
    return read


def _date(buf: bytes, pos: int) -> tuple[dt.date | None, int]:
    packed = int.from_bytes(buf[pos:pos + 3], "little")
    year, month, day = packed >> 9, (packed >> 5) & 0xF, packed & 0x1F
    if not (year and month and day):
        return None, pos + 3
    return dt.date(year, month, day), pos + 3


def _decimal(precision: int, decimals: int) -> Reader:
    integral = precision - decimals
    whole_int, left_int = divmod(integral, 9)
    whole_frac, left_frac = divmod(decimals, 9)
    head, tail = _DECIMAL_BYTES[left_int], _DECIMAL_BYTES[left_frac]
    size = head + 4 * whole_int + 4 * whole_frac + tail

    def decode(raw: bytes) -> Decimal:
        positive = raw[0] & 0x80
        mask = 0 if positive else -1
        raw = bytes([raw[0] ^ 0x80]) + raw[1:]
        parts = ["" if positive else "-"]
        at = 0
        if head:
            parts.append(str(int.from_bytes(raw[:head], "big", signed=True) ^ mask))
            at = head
        for _ in range(whole_int):
            parts.append(f"{int.from_bytes(raw[at:at + 4], 'big', signed=True) ^ mask:09d}")
            at += 4
        parts.append(".")
        for _ in range(whole_frac):
            parts.append(f"{int.from_bytes(raw[at:at + 4], 'big', signed=True) ^ mask:09d}")
            at += 4
        if tail:
            parts.append(f"{int.from_bytes(raw[at:at + tail], 'big', signed=True) ^ mask:0{left_frac}d}")
        return Decimal("".join(parts))
    return _memo(size, decode)


def _enum(column: Any) -> Reader:
    size, values = column.size, column.enum_values

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        index = int.from_bytes(buf[pos:pos + size], "little")
        return (values[index] if values else None), pos + size
    return read


def _set(column: Any) -> Reader:
    size, values = column.size, column.set_values

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        mask = int.from_bytes(buf[pos:pos + size], "little")
        chosen = {v for i, v in enumerate(values or ()) if mask & (1 << i)}
        return (chosen or None), pos + size
    return read


def _bit(column: Any) -> Reader:
    """The library's '0'/'1' text, most significant bit first, `bits` digits long."""
    size, bits = column.bytes, column.bits

    def read(buf: bytes, pos: int) -> tuple[str, int]:
        return format(int.from_bytes(buf[pos:pos + size], "big"), f"0{bits}b")[-bits:], pos + size
    return read


def _integer(column: Any, signed: str, unsigned: str) -> Reader:
    return _fixed(unsigned if column.unsigned else signed)


_READERS: dict[int, Callable[[Any], Reader]] = {
    T.TINY: lambda c: _integer(c, "<b", "<B"),
    T.SHORT: lambda c: _integer(c, "<h", "<H"),
    T.INT24: lambda c: _int24(not c.unsigned),
    T.LONG: lambda c: _integer(c, "<i", "<I"),
    T.LONGLONG: lambda c: _integer(c, "<q", "<Q"),
    T.FLOAT: lambda c: _fixed("<f"),
    T.DOUBLE: lambda c: _fixed("<d"),
    T.YEAR: lambda c: lambda buf, pos: (buf[pos] + 1900, pos + 1),
    T.NEWDECIMAL: lambda c: _decimal(c.precision, c.decimals),
    T.VARCHAR: lambda c: _text(2 if c.max_length > 255 else 1, _encoding(c)),
    T.STRING: lambda c: _text(2 if c.max_length > 255 else 1, _encoding(c)),
    T.BLOB: lambda c: _text(c.length_size, _encoding(c)),  # TEXT, BLOB, and MariaDB's JSON (a LONGTEXT)
    T.ENUM: _enum,
    T.SET: _set,
    T.BIT: _bit,
    T.DATE: lambda c: _date,
    T.DATETIME2: lambda c: _datetime2(c.fsp),
    T.TIMESTAMP2: lambda c: _timestamp2(c.fsp),
    T.TIME2: lambda c: _time2(c.fsp),
}


class TableDecoder:
    """The row images of one table map's rows events, every column present (binlog_row_image=FULL)."""

    def __init__(self, columns: list[Any]):
        self.columns = list(zip([c.name for c in columns], [_READERS[c.type](c) for c in columns]))
        self.nulls_size = (len(columns) + 7) // 8
        self.every_column = ((1 << len(columns)) - 1).to_bytes(self.nulls_size, "little")

    def images(self, buf: bytes, pos: int, end: int, per_row: int) -> list[tuple[Image, ...]]:
        """Every row between `pos` and `end`, each `per_row` images (2 for an update: before and after)."""
        rows = []
        while pos < end:
            row = []
            for _ in range(per_row):
                image, pos = self._image(buf, pos)
                row.append(image)
            rows.append(tuple(row))
        return rows

    def _image(self, buf: bytes, pos: int) -> tuple[Image, int]:
        nulls = int.from_bytes(buf[pos:pos + self.nulls_size], "little")
        pos += self.nulls_size
        image: Image = {}
        bit = 1
        for name, read in self.columns:
            if nulls & bit:
                image[name] = None
            else:
                image[name], pos = read(buf, pos)
            bit <<= 1
        return image, pos


def decoder(columns: list[Any]) -> TableDecoder | None:
    """A table's decoder, or None when one of its columns is of a type left to the library (or unnamed:
    a server without binlog_row_metadata=FULL)."""
    if any(c.type not in _READERS or not c.name for c in columns):
        return None
    return TableDecoder(columns)


class RowImages:
    """Rows events to their images, with one decoder per table map (a table's map is frozen: a new
    definition gets a new table_id)."""

    def __init__(self) -> None:
        self._decoders: dict[int, tuple[Any, TableDecoder | None]] = {}

    def of(self, event: Any) -> list[tuple[Image, ...]] | None:
        """`event`'s rows as image tuples (one for a write or delete, before and after for an update), or
        None when the library has to decode it."""
        table = event.table_map.get(event.table_id)
        known = self._decoders.get(event.table_id)
        if known is None or known[0] is not table:
            known = self._decoders[event.table_id] = (table, None if table is None else decoder(table.columns))
        decode = known[1]
        wrapper = event.packet
        if decode is None or wrapper._BinLogPacketWrapper__data_buffer or not event.complete:
            return None
        bitmaps = ((event.columns_present_bitmap, event.columns_present_bitmap2)
                   if hasattr(event, "columns_present_bitmap2") else (event.columns_present_bitmap,))
        if any(b != decode.every_column for b in bitmaps):
            return None  # a partial image (binlog_row_image=MINIMAL or NOBLOB): the library's
        packet = wrapper.packet
        start = packet._position
        return decode.images(packet._data, start, start + event.event_size - wrapper.read_bytes, len(bitmaps))
