"""CDC mode's change source on the real Kafka Connect worker and Debezium MariaDB connector (issue 15, item 2).

The same transactions are read twice: from the binlog by the binlog collector, and from Debezium's
topics by the CDC collector. Every transaction, every row, op, primary key and value (type for type)
must be the same both ways (coordinates aside: Debezium's `pos` is its event's, the binlog collector's the
commit's), over a table of many column types, multi-row transactions, updates,
deletes, a primary-key change (Debezium: a delete, a tombstone and an insert), a transaction that
also changes a table the monitor does not watch, and a TRUNCATE (Debezium: a BEGIN with no END).
And a connector's snapshot seeds a first start as the binlog mode's bootstrap does.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable
from decimal import Decimal

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from devservices import base, kafka_connect
from devservices.kafka_connect import CDC_SCHEMA, TOPIC_PREFIX, TRANSACTION_TOPIC, table_topic
from oncewatch.collectors.binlog import BinlogCollector, bootstrap
from oncewatch.collectors.cdc.read import CdcCollector
from oncewatch.collectors.kafka_formats import TopicParser
from oncewatch.core.config import CdcConfig, KafkaConfig, TopicConfig
from oncewatch.core.records import Transaction

from .conftest import admin_connection, monitor_config
from .kafka_fixtures import kafka_admin, unique
from .test_binlog_collector import start_position
from .test_row_images import same

__all__ = ["kafka_admin"]  # the fixture, imported so pytest finds it

BOOTSTRAP = f"{base.HOST}:{base.KAFKA_PORT}"
KAFKA = KafkaConfig(bootstrap_servers=(BOOTSTRAP,), client_id="oncewatch-test", topics=(), consumer_groups=(),
                    max_record_bytes=1_048_576, offsets_poll_seconds=5.0, request_timeout_seconds=10.0)
COLUMNS = """id INT NOT NULL PRIMARY KEY, no VARCHAR(32) CHARACTER SET utf8mb4 NULL, amount DECIMAL(14,4) NULL,
    wide DECIMAL(40,12) NULL, small SMALLINT NULL, big BIGINT NULL, f FLOAT NULL, d DOUBLE NULL,
    at3 DATETIME(3) NULL, at0 DATETIME NULL, at6 DATETIME(6) NULL, ts TIMESTAMP(6) NULL DEFAULT NULL,
    day DATE NULL, tm TIME(3) NULL, y YEAR NULL, e ENUM('x','y') NULL, st SET('a','b','c') NULL,
    bits BIT(12) NULL, flag BIT(1) NULL, blob_ BLOB NULL, txt TEXT NULL, j JSON NULL, bin VARBINARY(3) NULL"""


def end_offset(topic: str, asker: KafkaConsumer | None = None) -> int:
    """The end of the topic's partition 0. `asker`: a consumer the caller keeps for a wait that asks every few
    hundredths of a second (making one takes a few hundred milliseconds on a loaded machine, and a kill meant to land
    inside a stream-out then lands after it)."""
    consumer = asker or KafkaConsumer(bootstrap_servers=BOOTSTRAP)
    try:
        tp = TopicPartition(topic, 0)
        return consumer.end_offsets([tp])[tp]
    finally:
        if asker is None:
            consumer.close()


def wait_for_topic(topic: str, timeout: float = 60.0) -> None:
    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP)
    try:
        deadline = time.monotonic() + timeout
        while topic not in consumer.topics():
            if time.monotonic() > deadline:
                pytest.fail(f"Debezium made no topic {topic} in {timeout:.0f}s; see .devstack/connect/connect.log")
            time.sleep(0.3)
    finally:
        consumer.close()


def read(source, count: int, timeout: float = 90.0) -> list[Transaction]:
    """`count` transactions with rows or schema changes from `source` (its generator in a thread)."""
    out: list[Transaction] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for tx in source():
                if tx.rows or tx.schema_changes:
                    out.append(tx)
                if len(out) >= count:
                    break
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    if not done.wait(timeout):
        pytest.fail(f"read {len(out)} of {count} transactions in {timeout:.0f}s")
    if errors:
        raise errors[0]
    return out


def shape(tx: Transaction) -> tuple:
    return (tx.rows[0].txid if tx.rows else tx.schema_changes[0].txid,
            [(r.schema, r.table, r.op, r.pk, r.before, r.after, r.row_index) for r in tx.rows],
            [(c.table, c.kind) for c in tx.schema_changes])


def test_debezium_topics_give_the_binlog_s_transactions(cdc_connector, table_name, tmp_path):
    other = f"{table_name}_other"
    admin = admin_connection(CDC_SCHEMA)
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table_name} ({COLUMNS}) ENGINE=InnoDB")
        c.execute(f"CREATE TABLE {other} (id INT PRIMARY KEY, note VARCHAR(8)) ENGINE=InnoDB")
    watched = f"{CDC_SCHEMA}.{table_name}"
    cfg = monitor_config([watched], tmp_path, commit_time_columns={watched: "at3"})
    start = start_position(cfg)
    tx_start = end_offset(TRANSACTION_TOPIC)
    rows = [(1, "O1 ü😀", Decimal("10.5000"), Decimal("-123456789012345678901234.000000000001"), -32768,
             -9223372036854775808, 1.5, -0.1, dt.datetime(2026, 1, 2, 3, 4, 5, 678000),
             dt.datetime(2026, 1, 2, 3, 4, 5),
             dt.datetime(2026, 1, 2, 3, 4, 5, 123456), dt.datetime(2026, 1, 2, 3, 4, 5, 1), dt.date(2026, 2, 28),
             dt.timedelta(hours=12, minutes=34, seconds=56, microseconds=789000), 2026, "y", "a,c", 0b101000000101,
             1, b"\x00\xff", "text", '{"a": [1, 2.50]}', b"ab\x00"),
            (2,) + (None,) * 22]
    marks = ", ".join(["%s"] * 23)
    with admin.cursor() as c:
        c.execute("SET SESSION time_zone = '+00:00'")
        c.executemany(f"INSERT INTO {table_name} VALUES ({marks})", rows)
        admin.begin()
        c.execute(f"UPDATE {table_name} SET amount = amount + 1, st = '', flag = 0 WHERE id = 1")
        c.execute(f"INSERT INTO {other} VALUES (1, 'x')")
        c.execute(f"INSERT INTO {table_name} (id, no) VALUES (3, 'O3')")
        admin.commit()
        admin.begin()
        c.execute(f"DELETE FROM {table_name} WHERE id = 2")
        c.execute(f"UPDATE {table_name} SET id = 4 WHERE id = 3")  # a primary-key change
        admin.commit()
        c.execute(f"TRUNCATE {table_name}")
        c.execute(f"INSERT INTO {table_name} (id, no) VALUES (5, 'O5')")
    admin.close()
    wait_for_topic(table_topic(table_name))

    from_binlog = read(BinlogCollector(cfg.mysql, start).transactions, 5)
    cdc = CdcCollector(cfg.mysql, KAFKA, CdcConfig("debezium", TOPIC_PREFIX, transaction_grace_seconds=5),
                       positions={f"{TRANSACTION_TOPIC}/0": tx_start}, start_gtid=start.gtid)
    from_cdc = read(cdc.transactions, 5)
    cdc.stop()
    # read again, as a group's change router reads (idle: None after a quiet poll): a transaction is never handed
    # while the collector says it is caught up, since the ones after it in the same poll are not handed yet and a
    # caller that marks its clock at `caught_up` would vouch for them (seen: F8 on events whose change came after)
    again = CdcCollector(cfg.mysql, KAFKA, CdcConfig("debezium", TOPIC_PREFIX, transaction_grace_seconds=5),
                         positions={f"{TRANSACTION_TOPIC}/0": tx_start}, start_gtid=start.gtid)
    handed: list[bool] = []
    for tx in again.transactions(idle=True):
        if tx is not None:
            handed.append(again.caught_up)
        elif again.caught_up and len(handed) >= 5:
            break
    again.stop()
    assert len(handed) >= 5 and not any(handed), handed

    assert [shape(t)[0] for t in from_cdc] == [shape(t)[0] for t in from_binlog]  # the same GTIDs, in order
    for ours, theirs in zip(from_cdc, from_binlog):
        assert same(shape(ours), shape(theirs)), f"{shape(ours)}\n!=\n{shape(theirs)}"
    assert [len(t.rows) for t in from_cdc] == [2, 2, 2, 0, 1]
    assert from_cdc[1].rows[1].row_index == 1  # the unwatched table's row between them takes no place
    pk_change = from_cdc[2].rows[1]
    assert (pk_change.op, pk_change.before["id"], pk_change.after["id"]) == ("update", 3, 4)
    assert [(c.kind, c.table) for c in from_cdc[3].schema_changes] == [("truncate", watched)]
    assert from_cdc[0].rows[0].commit_clock == "row_column"
    assert cdc.assembler.incomplete == 0 and cdc.assembler.counts().unreadable_records == 0
    # the delete's tombstone, read as an event of an announced Debezium topic: its table is the topic's
    tombstones = [r for r in records_of(table_topic(table_name)) if r.value is None]
    parsed = TopicParser(TopicConfig(name=table_topic(table_name), format="debezium", paths={}, required=()),
                         1_000_000).parse(tombstones[0])
    assert (parsed.cdc["op"], parsed.cdc["db"], parsed.cdc["table"]) == ("tombstone", CDC_SCHEMA, table_name)


def records_of(topic: str) -> list:
    """Every record of a topic's partition 0, from its start to its end now."""
    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False, group_id=None)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    end = consumer.end_offsets([tp])[tp]
    out: list = []
    while consumer.position(tp) < end:
        for batch in consumer.poll(timeout_ms=1000).values():
            out += batch
    consumer.close()
    return out


def test_the_connector_s_snapshot_seeds_the_monitor_as_its_bootstrap_does(cdc_connector, table_name, tmp_path):
    """A first start from the topics' beginning reads the connector's snapshot (op r) as the binlog mode's
    bootstrap reads the tables: the same rows, as snapshot rows, the last chunk complete."""
    admin = admin_connection(CDC_SCHEMA)
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, no VARCHAR(16), amount DECIMAL(12,2), "
                  "at DATETIME(3))")
        c.executemany(f"INSERT INTO {table_name} VALUES (%s, %s, %s, %s)",
                      [(i, f"O{i}", Decimal(f"{i}.50"), dt.datetime(2026, 3, 1, 0, 0, i, i * 1000)) for i in range(3)])
    admin.close()
    watched = f"{CDC_SCHEMA}.{table_name}"
    cfg = monitor_config([watched], tmp_path)
    prefix, name = f"snap{table_name[2:]}", f"oncewatch-snapshot-{table_name}"
    kafka_connect.register(name, **{"topic.prefix": prefix, "table.include.list": watched, "snapshot.mode": "initial",
                                    "database.server.id": str(kafka_connect.DEBEZIUM_SERVER_ID + 1),
                                    "schema.history.internal.file.filename": str(tmp_path / "history.dat")})
    try:
        wait_for_topic(f"{prefix}.{watched}")
        cdc = CdcCollector(cfg.mysql, KAFKA, CdcConfig("debezium", prefix, transaction_grace_seconds=5))
        seen: list[Transaction] = []
        for tx in cdc.transactions():
            seen.append(tx)
            if sum(len(t.rows) for t in seen) >= 3:
                break
        cdc.stop()
    finally:
        kafka_connect.unregister(name)
    first, *snapshot = seen
    assert not first.rows and first.cdc is not None and first.cdc.offsets  # a first start's position, stored at once
    rows = [r for t in snapshot for r in t.rows]
    assert all(t.snapshot for t in snapshot) and snapshot[-1].complete and not any(t.complete for t in snapshot[:-1])
    assert all(r.snapshot and r.op == "insert" for r in rows)
    assert same([r.after for r in rows], [r.after for t in bootstrap(cfg.mysql) for r in t.rows])


def test_a_heartbeat_is_placed_only_once_every_record_written_before_it_is_read(kafka_admin, tmp_path):
    """kafka-python leaves a partition out of the next fetch while it holds records of it not yet read, so a
    heartbeat can come in a fetch answered after a record the connector wrote before it, to a partition whose last
    fetch was answered before that record. That partition then looks read to its end (its high watermark is the
    old answer's). A heartbeat placed then counted the record out of its gap: a busy gap looked quiet, which is
    what lets the change clock vouch for a time (checks.clocks.heartbeat_watermark). Here, on the real broker: a
    heartbeat; then more records than one poll takes, to the transaction topic; polls until part of them is read and
    the rest held in a fetch answer; then, while the reader waits, one more record and a heartbeat after it. That
    heartbeat is placed once every record written before it is read, and counts them all."""
    prefix = unique("hb").replace(".", "_")
    transactions, beats = f"{prefix}.transaction", f"__debezium-heartbeat.{prefix}"
    kafka_admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1) for t in (transactions, beats)])
    kafka_admin.wait_for_topics([transactions, beats], timeout_ms=10_000)
    # one batch for all the records sent before a flush: one fetch answer holds them all
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", linger_ms=100, batch_size=1 << 20)
    at = int(time.time() * 1000)

    def send(topic: str, value: bytes, ms: int) -> None:
        producer.send(topic, value=value, partition=0, timestamp_ms=ms)

    def beat(ms: int) -> None:
        send(beats, json.dumps({"ts_ms": ms}).encode(), ms)

    cfg = monitor_config([f"{CDC_SCHEMA}.{prefix}"], tmp_path)  # a table with no topic: none is read
    cdc = CdcCollector(cfg.mysql, KAFKA, CdcConfig("debezium", prefix, heartbeat_topic=beats))
    reader = cdc.transactions(poll_ms=200, idle=True)
    placed: list = []

    def step_until(done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 20
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            next(reader)
            placed.extend(cdc.take_heartbeats())

    try:
        beat(at)
        producer.flush()
        step_until(lambda: len(placed) == 1, "the first heartbeat placed")
        written = 1200  # more than a poll takes (max_poll_records 500): the rest stays in the fetch answer
        for _ in range(written):
            send(transactions, b"not a transaction marker", at + 1)
        producer.flush()
        fetcher = reader.gi_frame.f_locals["consumer"]._fetcher
        tp = TopicPartition(transactions, 0)

        def held() -> bool:  # the topic partly read, the rest of its fetch answer held unread by the consumer
            current = fetcher._next_partition_records
            return 0 < cdc.next[f"{transactions}/0"] < written and (
                (current is not None and current.topic_partition == tp)
                or any(f.topic_partition == tp for f in fetcher._completed_fetches))

        step_until(held, "a poll that leaves records of the transaction topic in its fetch answer")
        # the reader waits: its next fetch, sent at the end of that poll, asks for the heartbeats alone
        send(transactions, b"not a transaction marker", at + 2)
        producer.flush()
        beat(at + 3)
        producer.flush()
        time.sleep(1.0)  # the fetch's answer, the new heartbeat in it, taken in by the consumer's I/O thread
        step_until(lambda: len(placed) == 2, "the second heartbeat placed")
        # (the records read when the heartbeat was placed, each heartbeat's count of records since the one before)
        assert (cdc.next[f"{transactions}/0"], [b.between for b in placed]) == (written + 1, [-1, written + 1])
    finally:
        cdc.stop()
        reader.close()
        producer.close()
