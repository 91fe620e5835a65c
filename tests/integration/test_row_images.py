"""The lean row decoder (collectors.row_images) against pymysqlreplication's own decode, on the real MariaDB.

A table holds every column type the decoder reads, and rows written to it hold each type's edges:
NULLs, the integer extremes signed and unsigned, negative and 65-digit DECIMALs, every DATETIME,
TIMESTAMP and TIME precision, zero dates, utf8mb4 beyond the BMP, latin1, JSON, BLOBs, ENUM, SET
and BIT. Every rows event of the table is decoded both ways and the values must be the same,
type for type (a Decimal by its digits, so 1.50 is not 1.5). A table with a type left to the
library (GEOMETRY) has no decoder, and the collector still hands its rows on.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from decimal import Decimal
from typing import Any

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from oncewatch.collectors.binlog import BinlogCollector, connection_settings
from oncewatch.collectors.row_images import RowImages

from .conftest import monitor_config
from .test_binlog_collector import collect, start_position

COLUMNS = """
    id INT NOT NULL PRIMARY KEY,
    t TINYINT NULL, tu TINYINT UNSIGNED NULL, s SMALLINT NULL, su SMALLINT UNSIGNED NULL,
    m MEDIUMINT NULL, mu MEDIUMINT UNSIGNED NULL, i INT NULL, iu INT UNSIGNED NULL,
    b BIGINT NULL, bu BIGINT UNSIGNED NULL,
    f FLOAT NULL, d DOUBLE NULL,
    d14 DECIMAL(14,4) NULL, d65 DECIMAL(65,30) NULL, d10 DECIMAL(10,0) NULL, d55 DECIMAL(5,5) NULL,
    d18 DECIMAL(18,9) NULL, d9 DECIMAL(9,0) NULL, d3 DECIMAL(3,1) NULL,
    vc VARCHAR(20) CHARACTER SET utf8mb4 NULL, vl VARCHAR(300) CHARACTER SET utf8mb4 NULL,
    c CHAR(10) CHARACTER SET latin1 NULL, cu CHAR(3) CHARACTER SET utf8mb4 NULL,
    bn BINARY(4) NULL, vb VARBINARY(300) NULL,
    tx TEXT NULL, mt MEDIUMTEXT NULL, lt LONGTEXT NULL, tb TINYBLOB NULL, bl BLOB NULL, j JSON NULL,
    e ENUM('a','b','c') NULL, st SET('x','y','z') NULL, b1 BIT(1) NULL, b12 BIT(12) NULL, b64 BIT(64) NULL,
    dd DATE NULL, dt0 DATETIME NULL, dt1 DATETIME(1) NULL, dt2 DATETIME(2) NULL, dt3 DATETIME(3) NULL,
    dt4 DATETIME(4) NULL, dt5 DATETIME(5) NULL, dt6 DATETIME(6) NULL,
    ts0 TIMESTAMP NULL DEFAULT NULL, ts3 TIMESTAMP(3) NULL DEFAULT NULL, ts6 TIMESTAMP(6) NULL DEFAULT NULL,
    tm TIME NULL, tm2 TIME(2) NULL, tm6 TIME(6) NULL, y YEAR NULL
"""

NAMES = [column.split()[0] for column in re.split(r",\s+", COLUMNS.strip())]  # no ", " inside a type

EDGES: list[dict[str, Any]] = [
    dict(t=-128, tu=255, s=-32768, su=65535, m=-8388608, mu=16777215, i=-2147483648, iu=4294967295,
         b=-9223372036854775808, bu=18446744073709551615, f=-3.25e10, d=-1e308,
         d14=Decimal("-9999999999.9999"), d65=Decimal("-" + "9" * 35 + "." + "9" * 30), d10=Decimal("-1"),
         d55=Decimal("-0.00001"), d18=Decimal("-123456789.000000001"), d9=Decimal("-999999999"), d3=Decimal("-0.5"),
         vc="😀 café ü", vl="ß" * 300, c="é", cu="汉字", bn=b"\x00\x01\xfe\xff", vb=bytes(range(256)) + b"x" * 40,
         tx="line\nbreak", mt="m" * 70000, lt="", tb=b"\x00", bl=b"\xff" * 1000, j='{"a": [1, 2.50, "x"]}',
         e="c", st="x,z", b1=1, b12=0b101010101010, b64=(1 << 64) - 1,
         dd=dt.date(1000, 1, 1), dt0=dt.datetime(9999, 12, 31, 23, 59, 59),
         dt1=dt.datetime(2026, 1, 1, 0, 0, 0, 100000),
         dt2=dt.datetime(2026, 1, 1, 0, 0, 0, 990000), dt3=dt.datetime(2026, 6, 30, 12, 0, 0, 123000),
         dt4=dt.datetime(2026, 6, 30, 12, 0, 0, 123400), dt5=dt.datetime(2026, 6, 30, 12, 0, 0, 123450),
         dt6=dt.datetime(2026, 12, 31, 23, 59, 59, 999999), ts0=dt.datetime(1970, 1, 2, 0, 0, 0),
         ts3=dt.datetime(2038, 1, 19, 3, 14, 7, 999000), ts6=dt.datetime(2026, 3, 1, 1, 2, 3, 456789),
         tm=dt.timedelta(hours=838, minutes=59, seconds=59), tm2=dt.timedelta(hours=-12, minutes=-34, seconds=-56),
         tm6=dt.timedelta(hours=1, microseconds=1), y=2155),
    dict(t=127, tu=0, s=32767, su=0, m=8388607, mu=0, i=2147483647, iu=0, b=9223372036854775807, bu=0,
         f=1.5, d=0.1, d14=Decimal("0.0001"), d65=Decimal("9" * 35 + "." + "9" * 30), d10=Decimal("9999999999"),
         d55=Decimal("0.99999"), d18=Decimal("0.000000000"), d9=Decimal("0"), d3=Decimal("99.9"),
         vc="", vl="a", c="", cu="", bn=b"", vb=b"", tx="", mt="", lt="ü" * 10, tb=b"", bl=b"", j="[]",
         e="a", st="", b1=0, b12=0, b64=0, dd=dt.date(2026, 2, 28), dt0=dt.datetime(1000, 1, 1),
         dt1=dt.datetime(2026, 1, 1), dt2=dt.datetime(2026, 1, 1, 0, 0, 0, 10000),
         dt3=dt.datetime(2026, 1, 1, 0, 0, 0, 1000), dt4=dt.datetime(2026, 1, 1, 0, 0, 0, 100),
         dt5=dt.datetime(2026, 1, 1, 0, 0, 0, 10), dt6=dt.datetime(2026, 1, 1, 0, 0, 0, 1),
         ts0=dt.datetime(2026, 1, 1), ts3=dt.datetime(2026, 1, 1, 0, 0, 0, 1000),
         ts6=dt.datetime(2026, 1, 1, 0, 0, 0, 1),
         tm=dt.timedelta(0), tm2=dt.timedelta(seconds=1, microseconds=10000), tm6=dt.timedelta(hours=-838),
         y=1901),
    {},  # every column NULL
]


def same(a: Any, b: Any) -> bool:
    """Equal and of one type; a Decimal by its digits and exponent, NaN equal to NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, Decimal):
        return a.as_tuple() == b.as_tuple()
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def write_rows(admin, table: str) -> int:
    """The edge rows, then changed and deleted, in several transactions; the number of row images written."""
    cols = ", ".join(NAMES)
    marks = ", ".join(["%s"] * len(NAMES))
    images = 0
    with admin.cursor() as c:
        c.execute("SET SESSION time_zone = '+00:00'")
        for n, row in enumerate(EDGES * 3):
            values = [n] + [row.get(name) for name in NAMES[1:]]
            c.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", values)
            images += 1
        admin.commit()
        c.execute("SET SESSION sql_mode = ''")  # zero dates, as an old shop's tables may hold them
        c.execute(f"INSERT INTO {table} (id, dd, dt0, dt3, ts0) VALUES (100, '0000-00-00', '0000-00-00 00:00:00', "
                  "'0000-00-00 00:00:00.000', '0000-00-00 00:00:00')")
        images += 1
        c.execute(f"UPDATE {table} SET d14 = -d14, vc = CONCAT(vc, '!'), dt6 = NULL, st = 'y', tm6 = '-00:00:00.5' "
                  "WHERE id < 6")
        images += 2 * 6
        c.execute(f"DELETE FROM {table} WHERE id >= 6")
        images += 4
        admin.commit()
    return images


def read_both(cfg, start, table: str, images_written: int) -> tuple[int, int]:
    """The rows events of `table` decoded by the library and by RowImages, until `images_written` row images
    are read; (images compared, events the decoder left to the library)."""
    stream = BinLogStreamReader(connection_settings=connection_settings(cfg.mysql), server_id=cfg.mysql.server_id + 7,
                                is_mariadb=True, auto_position=start.gtid or None, blocking=True,
                                only_tables=[table], only_schemas=["owtest"], freeze_schema=True,
                                only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent])
    images = RowImages()
    compared = misses = seen = 0
    try:
        for event in stream:
            if isinstance(event, XidEvent):
                if seen >= images_written:
                    break
                continue
            ours = images.of(event)  # before the library reads the rows: it moves the packet's position
            theirs = [((r["values"],) if "values" in r else (r["before_values"], r["after_values"]))
                      for r in event.rows]
            seen += sum(map(len, theirs))
            if ours is None:
                misses += 1
                continue
            assert len(ours) == len(theirs)
            for mine, library in zip(ours, theirs):
                for a, b in zip(mine, library):
                    diff = {k: (a.get(k), b[k]) for k in b if not same(a.get(k), b[k])}
                    assert not diff and a.keys() == b.keys(), f"{type(event).__name__}: {diff}"
                compared += len(mine)
    finally:
        stream.close()
    return compared, misses


def test_every_type_decodes_as_the_library_does(admin, table_name, tmp_path):
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table_name} ({COLUMNS}) ENGINE=InnoDB")
    cfg = monitor_config([f"owtest.{table_name}"], tmp_path)
    start = start_position(cfg)
    written = write_rows(admin, table_name)
    compared, misses = read_both(cfg, start, table_name, written)
    assert misses == 0, "the decoder left an event of the table to the library"
    assert compared == written

    rows = collect(BinlogCollector(cfg.mysql, start), lambda rows: len(rows) >= 3 * len(EDGES) + 1 + 6 + 4)
    first = rows[0].after
    assert first["d65"] == EDGES[0]["d65"] and first["vc"] == "😀 café ü" and first["bu"] == 2 ** 64 - 1
    assert first["dt6"] == dt.datetime(2026, 12, 31, 23, 59, 59, 999999) and first["j"] == '{"a": [1, 2.50, "x"]}'
    assert set(rows[2].after.values()) == {None, 2}  # the all-NULL row: its id and NULLs


def test_a_type_left_to_the_library_still_comes_through(admin, table_name, tmp_path):
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, g GEOMETRY NULL, note VARCHAR(8)) ENGINE=InnoDB")
    cfg = monitor_config([f"owtest.{table_name}"], tmp_path)
    start = start_position(cfg)
    with admin.cursor() as c:
        c.execute(f"INSERT INTO {table_name} VALUES (1, ST_GeomFromText('POINT(1 2)'), 'a'), (2, NULL, 'b')")
        admin.commit()
    compared, misses = read_both(cfg, start, table_name, 2)
    assert (compared, misses) == (0, 1)
    rows = collect(BinlogCollector(cfg.mysql, start), lambda rows: len(rows) >= 2)
    assert [(r.after["id"], r.after["note"]) for r in rows] == [(1, "a"), (2, "b")]
    assert isinstance(rows[0].after["g"], bytes) and rows[1].after["g"] is None
