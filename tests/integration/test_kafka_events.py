"""The events collector against the dev broker: known records in each format, garbage, topics that
appear later, first-run start, restart from the checkpoint and offsets lost to retention."""

from __future__ import annotations

import json
import time
from decimal import Decimal

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewPartitions, NewTopic
from kafka.errors import CorruptRecordError

from oncewatch.collectors.kafka_events import KafkaEventCollector
from oncewatch.collectors.kafka_raw import failed_batch
from oncewatch.core.config import TopicConfig
from oncewatch.core.records import EmittedEvent
from oncewatch.dashboards.views import quarantine_row
from oncewatch.store import Store
from tests.integration.kafka_fixtures import (BOOTSTRAP, UndecodableKey, create_topic, drain, json_topic, jsonb,
                                              kafka_admin, kafka_config, produce, resume_and_check_exactly_once,
                                              unique, wait_for)

__all__ = ["kafka_admin"]  # the fixture, imported so pytest finds it

PAID = {"type": "order.paid", "order_no": "O1", "trade_no": "T1", "amount": 99.90, "status": "paid"}
SHIPPED = {"type": "shipment.created", "order_no": "O1", "trade_no": "T1", "entity_id": 501}
PAID2 = {"type": "order.paid", "order_no": "O2", "trade_no": "T2", "amount": "12.00", "status": "paid"}
SOURCE = {"version": "2.5.0.Final", "connector": "mysql", "name": "shopdb", "ts_ms": 1_700_000_000_000,
          "snapshot": "false", "db": "shop", "sequence": None, "table": "payments", "server_id": 1,
          "gtid": "0-1-77", "file": "mysql-bin.000003", "pos": 4331, "row": 0, "thread": 36, "query": None}
PAY = {"id": 7, "trade_no": "T7", "order_no": "O7", "status": "pending", "amount": "10.00"}
CDC_PATHS = {"trade_no": "trade_no", "order_key": "order_no", "status": "status"}


def debezium(op: str, before: dict | None, after: dict | None, pos: int) -> bytes:
    return jsonb({"before": before, "after": after, "source": {**SOURCE, "pos": pos}, "op": op,
                  "ts_ms": 1_700_000_000_500, "transaction": None})


def canal(type_: str, data: list[dict], old: list[dict] | None) -> bytes:
    return jsonb({"data": data, "database": "shop", "es": 1_700_000_000_000, "id": 3, "isDdl": False,
                  "mysqlType": {k: "varchar(64)" for k in PAY}, "old": old, "pkNames": ["id"], "sql": "",
                  "sqlType": {k: 12 for k in PAY}, "table": "payments", "ts": 1_700_000_000_900, "type": type_})


def test_known_records_in_each_format_become_exactly_those_events(kafka_admin, tmp_path):
    jt, dt, ct = (create_topic(kafka_admin, "json", 2), create_topic(kafka_admin, "dbz"),
                  create_topic(kafka_admin, "canal"))
    sent_json = produce(jt, [(0, b"O1", jsonb(PAID)), (1, b"O1", jsonb(SHIPPED)), (0, b"O2", jsonb(PAID2))],
                        headers=[("trace", b"t-1")])
    key = jsonb({"schema": {"type": "struct", "fields": [{"type": "int64", "field": "id"}]}, "payload": {"id": 7}})
    paid = {**PAY, "status": "success"}
    sent_dbz = produce(dt, [(0, key, debezium("u", PAY, paid, 4331)), (0, key, debezium("d", paid, None, 4700)),
                            (0, key, None)])
    second = {**PAY, "id": 8, "trade_no": "T8"}
    sent_canal = produce(ct, [(0, None, canal("UPDATE", [paid, {**second, "status": "success"}],
                                              [{"status": "pending"}, {"status": "pending"}]))])
    cdc_topics = [TopicConfig(dt, "debezium", dict(CDC_PATHS), ("trade_no",)),
                  TopicConfig(ct, "canal", dict(CDC_PATHS), ("trade_no",))]
    collector = KafkaEventCollector(kafka_config([json_topic(jt), *cdc_topics]))
    store = Store(str(tmp_path / "store.db"))
    try:
        events, quarantined = drain(collector, 7, store=store)
        assert quarantined == []
        got = {e.coordinates: e for e in events}
        assert len(got) == 7 and store.events() == sorted(events, key=lambda e: (e.topic, e.partition, e.offset))

        (p0, o0, ts0), (p1, o1, _), (p2, o2, _) = sent_json
        assert got[f"{jt}/{p0}@{o0}"] == EmittedEvent(
            topic=jt, partition=p0, offset=o0, timestamp_ms=ts0, timestamp_type="CreateTime", key="O1",
            headers=(("trace", "t-1"),), payload={**PAID, "amount": Decimal("99.90")}, format="json",
            keys={"event_type": "order.paid", "order_key": "O1", "trade_no": "T1", "amount": Decimal("99.90"),
                  "status": "paid"})
        assert got[f"{jt}/{p1}@{o1}"].keys == {"event_type": "shipment.created", "order_key": "O1",
                                               "trade_no": "T1", "effect_id": 501}
        assert got[f"{jt}/{p2}@{o2}"].keys["amount"] == Decimal("12.00")

        dbz = [got[f"{dt}/{p}@{o}"] for p, o, _ in sent_dbz]
        assert [(e.cdc["op"], e.cdc["pk"], e.keys.get("status")) for e in dbz] == [
            ("update", {"id": 7}, "success"), ("delete", {"id": 7}, "success"), ("tombstone", {"id": 7}, None)]
        assert (dbz[0].cdc["before"], dbz[0].cdc["source"]["pos"], dbz[1].cdc["source"]["pos"]) == (PAY, 4331, 4700)

        (p, o, _), = sent_canal
        rows = got[f"{ct}/{p}@{o}"].cdc["rows"]
        assert [(r["before"]["status"], r["after"]["status"], r["keys"]["trade_no"]) for r in rows] == [
            ("pending", "success", "T7"), ("pending", "success", "T8")]

        # Read to the end, and the checkpoint says so.
        expected = {f"{jt}/0": 2, f"{jt}/1": 1, f"{dt}/0": 3, f"{ct}/0": 1}
        assert collector.positions() == store.checkpoint("kafka_events") == expected
        assert collector.caught_up()
        status = collector.status()
        assert status.caught_up and status.connected and status.records_read == 7 and status.waiting_for == ()
        assert {(p.topic, p.partition): (p.position, p.end) for p in status.partitions} == {
            (jt, 0): (2, 2), (jt, 1): (1, 1), (dt, 0): (3, 3), (ct, 0): (1, 1)}
    finally:
        collector.close()
        store.close()


def test_garbage_is_quarantined_counted_and_reading_goes_on(kafka_admin, tmp_path):
    topic = create_topic(kafka_admin, "garbage")
    good = [(0, None, jsonb({**PAID, "order_no": f"O{i}"})) for i in range(3)]
    garbage = [(0, None, b"\xff\xfe\x00binary"), (0, None, b"{not json"), (0, None, jsonb({"order_no": "O9"})),
               (0, None, jsonb({**PAID, "amount": "12,50"})), (0, None, jsonb({**PAID, "pad": "x" * 5000})),
               (0, b"k", None)]
    sent = produce(topic, good[:1] + garbage + good[1:])
    collector = KafkaEventCollector(kafka_config([json_topic(topic)], max_record_bytes=4096))
    store = Store(str(tmp_path / "store.db"))
    try:
        events, quarantined = drain(collector, len(sent), store=store)
        assert [e.offset for e in events] == [sent[0][1], sent[-2][1], sent[-1][1]]
        assert [(q.offset, q.reason) for q in quarantined] == [
            (sent[1][1], "not_utf8"), (sent[2][1], "not_json"), (sent[3][1], "missing_path"),
            (sent[4][1], "wrong_type"), (sent[5][1], "too_large"), (sent[6][1], "null_value")]
        assert store.quarantined() == quarantined
        assert quarantined[0].preview == "\\xff\\xfe\\x00binary" and quarantined[4].size > 5000
        # Kept whole (a too_large value excepted: the broker has it at those coordinates), and counted by the store.
        assert quarantined[0].value == b"\xff\xfe\x00binary" and quarantined[4].value is None
        assert (quarantined[5].key, quarantined[5].value) == (b"k", None)
        assert store.quarantine_counts() == {(topic, r): 1 for r in ("not_utf8", "not_json", "missing_path",
                                                                      "wrong_type", "too_large", "null_value")}
        status = collector.status()
        assert (status.records_read, status.events_read, status.connected) == (9, 3, True)
        # Still running: a record produced after the garbage is read too.
        more = produce(topic, [(0, None, jsonb(PAID2))])
        events, _ = drain(collector, 1, store=store)
        assert [e.offset for e in events] == [more[0][1]] and collector.caught_up()
    finally:
        collector.close()
        store.close()


def test_topic_created_later_and_partitions_added_later_are_read_from_their_start(kafka_admin):
    name = unique("later")
    collector = KafkaEventCollector(kafka_config([json_topic(name, required=())], start_from="latest"))
    try:
        wait_for(lambda: collector.status().waiting_for == (name,), "waiting for the missing topic", collector)
        status = collector.status()
        assert status.state == f"waiting for topic {name} (does not exist yet)" and status.connected
        assert collector.caught_up()  # a topic that does not exist has nothing unread
        kafka_admin.create_topics([NewTopic(name, 1, 1)])
        kafka_admin.wait_for_topics([name], timeout_ms=10_000)
        sent = produce(name, [(0, None, jsonb(PAID)), (0, None, jsonb(PAID2))])
        events, _ = drain(collector, 2)  # created after the first run started: read from its beginning
        assert [(e.partition, e.offset) for e in events] == [(p, o) for p, o, _ in sent]
        assert collector.status().waiting_for == ()
        kafka_admin.create_partitions({name: NewPartitions(total_count=2)})
        sent = produce(name, [(1, None, jsonb(SHIPPED))])
        events, _ = drain(collector, 1)
        assert [(e.partition, e.offset) for e in events] == [(1, 0)] and sent[0][:2] == (1, 0)
        assert collector.positions() == {f"{name}/0": 2, f"{name}/1": 1}
    finally:
        collector.close()


def test_first_run_at_latest_checkpoints_the_end_and_reads_only_what_comes_after(kafka_admin):
    topic = create_topic(kafka_admin, "latest")
    produce(topic, [(0, None, jsonb(PAID))] * 3)
    collector = KafkaEventCollector(kafka_config([json_topic(topic)], start_from="latest"))
    try:
        batch = collector.poll(timeout_ms=200)
        assert (batch.events, batch.positions, batch.positions_changed) == ((), {f"{topic}/0": 3}, True)
        assert collector.poll(timeout_ms=200).positions_changed is False
        produce(topic, [(0, None, jsonb(PAID2))] * 2)
        events, _ = drain(collector, 2)
        assert [e.offset for e in events] == [3, 4]
    finally:
        collector.close()


def test_restarted_collector_resumes_exactly_from_the_checkpoint(kafka_admin, tmp_path):
    topic = create_topic(kafka_admin, "resume", 2)
    sent = produce(topic, [(i % 2, None, jsonb({**PAID, "order_no": f"O{i}"})) for i in range(12)])
    store = Store(str(tmp_path / "store.db"))
    cfg = kafka_config([json_topic(topic)])
    first = KafkaEventCollector(cfg)
    drain(first, 5, store=store, max_records=2)
    first.close()  # stopped mid-stream, after its last batch was stored
    sent += produce(topic, [(i % 2, None, jsonb({**PAID, "order_no": f"P{i}"})) for i in range(6)])
    assert sum(store.checkpoint("kafka_events").values()) >= 5
    try:
        resume_and_check_exactly_once(cfg, store, sent)
    finally:
        store.close()


def test_a_held_partition_waits_unread_and_then_reads_on_with_nothing_lost(kafka_admin):
    """The monitor holds partitions read far past the binlog (issue 12): the others are read meanwhile."""
    topic = create_topic(kafka_admin, "hold", 2)
    sent = produce(topic, [(i % 2, None, jsonb({**PAID, "order_no": f"O{i}"})) for i in range(10)])
    collector = KafkaEventCollector(kafka_config([json_topic(topic)]))
    try:
        held, deadline, read = {f"{topic}/0"}, time.monotonic() + 20, []
        while len(read) < 5 and time.monotonic() < deadline:
            read += collector.poll(timeout_ms=300, hold=held).events
        assert sorted((e.partition, e.offset) for e in read) == [(1, o) for o in range(5)]
        for _ in range(3):
            assert collector.poll(timeout_ms=300, hold=held).events == ()
        assert collector.positions() == {f"{topic}/0": 0, f"{topic}/1": 5}
        assert collector.poll(timeout_ms=100, hold={f"{topic}/0", f"{topic}/1"}).events == ()  # all held: waits
        events, _ = drain(collector, 5)
        assert [(e.partition, e.offset) for e in events] == [(0, o) for o in range(5)]
        assert sorted((e.partition, e.offset) for e in read + events) == sorted((p, o) for p, o, _ in sent)
    finally:
        collector.close()


def test_holds_that_change_at_every_poll_never_strand_a_partition(kafka_admin):
    """As the monitor holds them: whichever partitions are read furthest ahead, a new set at every poll.
    (With KafkaConsumer.pause/resume, kafka-python 3.0 stranded resumed partitions: found by the load run.)"""
    topic = create_topic(kafka_admin, "holds", 3)
    produce(topic, [(i % 3, None, jsonb({**PAID, "order_no": f"O{i}"})) for i in range(1500)])
    collector = KafkaEventCollector(kafka_config([json_topic(topic)]))
    read = {0: [], 1: [], 2: []}
    deadline = time.monotonic() + 30
    try:
        while sum(map(len, read.values())) < 1500:
            assert time.monotonic() < deadline, {p: len(o) for p, o in read.items()}
            least = min(map(len, read.values()))
            hold = {f"{topic}/{p}" for p, offsets in read.items() if len(offsets) > least + 50}
            for e in collector.poll(timeout_ms=200, max_records=100, hold=hold).events:
                assert f"{topic}/{e.partition}" not in hold
                read[e.partition].append(e.offset)
        assert all(offsets == list(range(500)) for offsets in read.values())  # each once, in order
    finally:
        collector.close()


def test_a_fetch_answered_while_the_reader_was_held_up_vouches_only_for_what_it_covers(kafka_admin):
    """A reader held up between two polls (its judge slow, the pipe to it full) reads, once it polls again, the
    answer of a fetch the broker gave early in the wait. That answer's highwater covers none of what was produced
    after it: an end taken as of when it was read let the Kafka clock vouch for those records, unread, and past
    an absence rule's grace they would be judged lost. Every record produced before an end's `end_at` is below it.
    (The broker's own answer of the ends would cover the stale one here; no refresh asks it meanwhile.)"""
    topic = create_topic(kafka_admin, "heldup", 2)
    produce(topic, [(p, None, jsonb(PAID)) for _ in range(10) for p in (0, 1)])
    reader = KafkaEventCollector(kafka_config([json_topic(topic)], metadata_refresh_seconds=600.0))
    try:
        drain(reader, 20, max_records=15)  # the second poll hands on the rest and sends the next fetch
        sent = produce(topic, [(p, None, jsonb(PAID)) for _ in range(20) for p in (0, 1)])  # the reader held up
        unread = reader._consumer._fetcher._completed_fetches
        assert any(f.partition_data.high_watermark < 30 for f in unread), \
            "no fetch answered early in the wait: kafka-python no longer pipelines as this test needs"
        reader.poll(timeout_ms=500, max_records=15)
        ends = {p.partition: p for p in reader.status().partitions}
        uncovered = [(p, o) for p, o, ts in sent if ts / 1000 < ends[p].end_at and o >= ends[p].end]
        assert not uncovered, f"produced before their partition's end_at, at or past its end: {uncovered}"
    finally:
        reader.close()


def test_offsets_deleted_before_they_were_read_are_a_counted_gap(kafka_admin):
    topic = create_topic(kafka_admin, "gap")
    produce(topic, [(0, None, jsonb({**PAID, "order_no": f"O{i}"})) for i in range(10)])
    kafka_admin.delete_records({TopicPartition(topic, 0): 6})
    collector = KafkaEventCollector(kafka_config([json_topic(topic)]), {f"{topic}/0": 2})
    try:
        events, _ = drain(collector, 4)
        assert [e.offset for e in events] == [6, 7, 8, 9]
        (gap,), = [collector.status().gaps]
        assert (gap.topic, gap.partition, gap.from_offset, gap.to_offset, gap.kind) == (topic, 0, 2, 6, "deleted")
        assert collector.status().gaps[0].kind == "deleted"
    finally:
        collector.close()


def test_poison_cdc_records_found_by_experiment_are_quarantined_and_survive_a_restart(kafka_admin, tmp_path):
    """The Debezium and Canal records that used to kill the reader (and kill it again on every
    restart): each quarantined with its coordinates, the records around them read, and after a
    restart from the checkpoint the quarantine is still there and nothing is read twice."""
    dt, ct = create_topic(kafka_admin, "dbz-poison"), create_topic(kafka_admin, "canal-poison")
    paid = {**PAY, "status": "success"}
    good = debezium("u", PAY, paid, 4331)
    envelope = json.loads(debezium("u", PAY, paid, 4400))
    amount = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "field": "amount"}
    poison_dbz = [jsonb({"schema": {"type": "struct", "fields": [
                      {"field": "after", "fields": [{**amount, "parameters": {"scale": "two"}}]}]}, "payload": envelope}),
                  jsonb({"schema": {"type": "struct", "fields": ["x"]}, "payload": envelope}),
                  jsonb({"schema": {"type": "struct", "fields": [
                      {"field": "after", "fields": [{k: v for k, v in amount.items() if k != "field"}]}]},
                      "payload": envelope})]
    sent_dbz = produce(dt, [(0, None, good), *[(0, None, p) for p in poison_dbz], (0, None, good)])
    poison_canal = json.loads(canal("INSERT", [paid], None)) | {"pkNames": [{}]}
    sent_canal = produce(ct, [(0, None, jsonb(poison_canal)), (0, None, canal("INSERT", [paid], None))])
    cfg = kafka_config([TopicConfig(dt, "debezium", dict(CDC_PATHS), ("trade_no",)),
                        TopicConfig(ct, "canal", dict(CDC_PATHS), ("trade_no",))])
    store = Store(str(tmp_path / "store.db"))
    collector = KafkaEventCollector(cfg)
    try:
        events, quarantined = drain(collector, len(sent_dbz) + len(sent_canal), store=store)
        assert sorted(e.coordinates for e in events) == sorted(
            [f"{dt}/0@{sent_dbz[0][1]}", f"{dt}/0@{sent_dbz[-1][1]}", f"{ct}/0@{sent_canal[1][1]}"])
        quarantined.sort(key=lambda q: (q.topic, q.partition, q.offset))  # the store's order
        assert [(q.topic, q.offset, q.reason) for q in quarantined] == sorted([
            *[(dt, o, "wrong_type") for _, o, _ in sent_dbz[1:-1]], (ct, sent_canal[0][1], "wrong_type")])
        scale = next(q for q in quarantined if q.topic == dt)
        assert "scale 'two'" in scale.detail and scale.value == poison_dbz[0]
    finally:
        collector.close()
    store.close()
    store = Store(str(tmp_path / "store.db"))  # the monitor restarted
    try:
        assert store.quarantined() == quarantined
        assert store.quarantine_counts() == {(dt, "wrong_type"): 3, (ct, "wrong_type"): 1}
        resumed = KafkaEventCollector(cfg, store.checkpoint("kafka_events"))
        try:
            more = produce(dt, [(0, None, good)])
            events, again = drain(resumed, 1, store=store)
            assert [e.offset for e in events] == [more[0][1]] and again == []
        finally:
            resumed.close()
    finally:
        store.close()


def test_a_header_key_that_is_not_utf8_is_quarantined_and_the_partition_reads_on(kafka_admin, tmp_path):
    """kafka-python raises at that record on every poll and every rebuild: the partition used to stall
    for good. Now its batch is quarantined offset by offset, and the records after it are read."""
    topic = create_topic(kafka_admin, "header-poison", partitions=2)
    before = produce(topic, [(0, None, jsonb(PAID)), (1, None, jsonb(PAID2))])
    poisoned = produce(topic, [(0, None, jsonb(SHIPPED))], headers=[(UndecodableKey("k"), b"v")])
    after = produce(topic, [(0, None, jsonb(PAID2)), (1, None, jsonb(PAID))])
    store = Store(str(tmp_path / "store.db"))
    collector = KafkaEventCollector(kafka_config([json_topic(topic)]))
    try:
        events, quarantined = drain(collector, len(before) + len(poisoned) + len(after), store=store)
        assert sorted((e.partition, e.offset) for e in events) == sorted((p, o) for p, o, _ in before + after)
        (p, o, _), = poisoned
        assert [(q.partition, q.offset, q.reason) for q in quarantined] == [(p, o, "unparseable")]
        assert "UnicodeDecodeError" in quarantined[0].detail and collector.status().connected
        assert store.quarantine_counts() == {(topic, "unparseable"): 1}
        assert collector.caught_up()
    finally:
        collector.close()
        store.close()


def produce_batch(topic: str, records: list[tuple[bytes, bytes, list[tuple[str, bytes]]]],
                  compression: str | None) -> list[tuple[int, int, int]]:
    """(key, value, headers) records sent together so that the producer puts them in one batch of partition 0."""
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", linger_ms=500, compression_type=compression)
    try:
        futures = [producer.send(topic, key=k, value=v, partition=0, headers=h) for k, v, h in records]
        producer.flush()
        return [(m.partition, m.offset, m.timestamp) for m in (f.get(timeout=30) for f in futures)]
    finally:
        producer.close()


@pytest.mark.parametrize("compression, timestamp_type", [
    (None, "CreateTime"), ("gzip", "CreateTime"), (None, "LogAppendTime")])
def test_a_record_kafka_python_cannot_decode_is_kept_byte_for_byte(kafka_admin, tmp_path, compression, timestamp_type):
    """A header key that is not UTF-8 (issue 42, observation 8): the record used to be stored with size 0 and no
    key, value, headers or timestamp. Now its bytes are read from the batch kafka-python failed on: the stored
    row has every byte the record had, its timestamp and type, and the good records of its batch are events."""
    topic = unique("header-bytes")
    kafka_admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1,
                                        topic_configs={"message.timestamp.type": timestamp_type})])
    kafka_admin.wait_for_topics([topic], timeout_ms=10_000)
    pad = b" " * 600 if compression else b""  # gzip only pays off (and is only used) on a larger batch
    value = jsonb(SHIPPED) + pad
    sent = produce_batch(topic, [
        (b"k-before", jsonb(PAID) + pad, [("trace", b"t-0")]),
        (b"k-poison", value, [(UndecodableKey("x"), b"\x00hv\xff"), ("trace", b"t-1")]),
        (b"k-after", jsonb(PAID2) + pad, [])], compression)
    (_, before, _), (_, poison, stamp), (_, after, _) = sent
    raw = KafkaConsumer(bootstrap_servers=BOOTSTRAP, group_id=None, enable_auto_commit=False)
    try:  # one batch, and kafka-python fails on its second record
        raw.assign([TopicPartition(topic, 0)])
        raw.seek(TopicPartition(topic, 0), poison)
        with pytest.raises(CorruptRecordError) as failed:
            raw.poll(timeout_ms=5000)
        assert failed_batch(failed.value).records_count == 3
    finally:
        raw.close()
    store = Store(str(tmp_path / "store.db"))
    collector = KafkaEventCollector(kafka_config([json_topic(topic)]))
    try:
        events, _ = drain(collector, 3, store=store)
        stored = {q.offset: q for q in store.quarantined()}
        q = stored[poison]
        assert (q.topic, q.partition, q.offset, q.reason) == (topic, 0, poison, "unparseable")
        assert "header key 0 is not UTF-8" in q.detail and "UnicodeDecodeError" in q.detail
        assert (q.key, q.value, q.size, q.timestamp_ms, q.timestamp_type) == (
            b"k-poison", value, len(value), stamp, timestamp_type)
        assert [(k.encode("utf-8", "surrogateescape"), v) for k, v in q.headers] == [
            (b"\xff\xfekey", b"\x00hv\xff"), (b"trace", b"t-1")]
        shown = quarantine_row(q)  # what `oncewatch quarantine` and the Quarantine page show: text, no surrogates
        assert shown["headers"][0] == ["\\xff\\xfekey", "\x00hv\\xff"] and json.dumps(shown, ensure_ascii=False)
        assert shown["timestamp_type"] == timestamp_type
        assert list(stored) == [poison]
        assert [(e.offset, e.key) for e in events] == [(before, "k-before"), (after, "k-after")]
        assert sorted(e.offset for e in store.events()) == [before, after]
        assert collector.positions() == {f"{topic}/0": after + 1} and collector.caught_up()
    finally:
        collector.close()
        store.close()
