"""Issue 42, deliver 2: the Kafka Connect worker SIGKILLed while Debezium takes a connector's initial snapshot.

A snapshot not finished when its worker dies is taken again at the restart (its offsets say it was under way, or
none were flushed yet): every row it had written comes twice, each time at new offsets, the first pass never
reaching its `last` record. A CDC source monitor reading the topics from their start runs through it: it must never
exit, take in each row once (what came again counted as F15, info), and give what a monitor of an undisturbed
connector's snapshot of the same tables gives.

The connector snapshots its tables in the order of `table.include.list` (here also by name): the shop's orders
and payments, then a padding table of PAD_ROWS, then the shop's other tables. The kill lands while the padding table
is read: the orders and payments come twice, the other tables once, after the restart.
"""

from __future__ import annotations

import json
import signal
import tomllib
from collections import Counter
from pathlib import Path

import tomli_w
from kafka import KafkaConsumer, TopicPartition

from devservices import kafka_connect
from devservices.kafka_connect import CDC_SCHEMA
from devservices.shop_monitor import SHORT_RULES, findings, new_topic, run_until_idle, shop_config, shop_settings
from oncewatch import shop
from oncewatch.core.config import load
from oncewatch.core.records import Finding
from oncewatch.store import Store

from .conftest import admin_connection, wait_for
from .recorded_run import start_monitor
from .shop_monitor import IDLE
from .test_cdc_source import BOOTSTRAP, end_offset, wait_for_topic

PAD_ROWS = 20_000


def last_record(topic: str) -> dict | None:
    """The value of the newest record of a topic's partition 0 (None: none yet)."""
    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False, group_id=None)
    try:
        tp = TopicPartition(topic, 0)
        end = consumer.end_offsets([tp])[tp]
        if end == 0:
            return None
        consumer.assign([tp])
        consumer.seek(tp, end - 1)
        for _ in range(20):
            for records in consumer.poll(timeout_ms=500).values():
                return json.loads(records[-1].value)
        return None
    finally:
        consumer.close()


def snapshot_done(topic: str) -> bool:
    value = last_record(topic)
    return value is not None and (value.get("payload") or {}).get("source", {}).get("snapshot") == "last"


def padding_table(name: str) -> str:
    """A table of PAD_ROWS named `pb_<name>`: after the shop's payments by name, before its points_grants."""
    admin = admin_connection(CDC_SCHEMA)
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE pb_{name} (id INT PRIMARY KEY, note VARCHAR(8)) ENGINE=InnoDB")
        for at in range(0, PAD_ROWS, 5_000):
            c.execute(f"INSERT INTO pb_{name} VALUES " + ",".join(f"({i}, 'p')" for i in range(at, at + 5_000)))
        admin.commit()
    admin.close()
    return f"{CDC_SCHEMA}.pb_{name}"


def source_config(folder: Path, topic: str, prefix: str) -> Path:
    """A CDC source monitor of the shop on the topics of `prefix`, read from their start (the snapshot first)."""
    folder.mkdir()
    config = shop_config(folder, topic=topic, rules=SHORT_RULES, cdc=True, start_from="earliest")
    data = tomllib.loads(config.read_text())
    data["cdc"].update(topic_prefix=prefix, start_from="earliest")
    config.write_text(tomli_w.dumps(data))
    return config


def rows(config: Path) -> Counter:
    """How many times the monitor stored each row change (table, primary key, operation, transaction)."""
    store = Store(load(config).store.target, readonly=True)
    try:
        return Counter((r.table, tuple(r.pk), r.op, r.txid) for r in store.row_changes())
    finally:
        store.close()


def verdicts(found: list[Finding]) -> Counter:
    """Findings as monitors of two connectors' topics must agree on them (evidence names each one's own topics)."""
    return Counter((f.rule, f.status, f.severity, json.dumps(f.keys, sort_keys=True, default=str)) for f in found
                   if f.rule != "F15")


def test_a_worker_killed_during_the_snapshot_takes_it_again_and_the_monitor_applies_it_once(
        cdc_connector, table_name, tmp_path):
    topic = new_topic()
    shop.run(shop_settings(topic, schema=CDC_SCHEMA, orders=0, reset=True))
    truth = shop.run(shop_settings(topic, schema=CDC_SCHEMA, seed=5, orders=300, rate=150, faults="all"))
    assert truth.faults
    tables = list(load(shop_config(tmp_path, topic=topic, cdc=True)).mysql.tables)
    pad = padding_table(table_name)
    assert sorted([*tables, pad]).index(pad) == 2, tables  # the orders and payments before it, the rest after
    base = {"snapshot.mode": "initial"}
    killed = {**base, "topic.prefix": f"sk{table_name[2:]}", "table.include.list": ",".join(sorted([*tables, pad])),
              "database.server.id": str(kafka_connect.DEBEZIUM_SERVER_ID + 3),
              "schema.history.internal.file.filename": str(tmp_path / "killed-history.dat")}
    control = {**base, "topic.prefix": f"sc{table_name[2:]}", "table.include.list": ",".join(sorted(tables)),
               "database.server.id": str(kafka_connect.DEBEZIUM_SERVER_ID + 4),
               "schema.history.internal.file.filename": str(tmp_path / "control-history.dat")}
    names = {"killed": f"oncewatch-snapkill-{table_name}", "control": f"oncewatch-snapctl-{table_name}"}
    pad_topic = f"{killed['topic.prefix']}.{pad}"
    live_config = source_config(tmp_path / "live", topic, killed["topic.prefix"])
    control_config = source_config(tmp_path / "control", topic, control["topic.prefix"])
    live = None
    try:
        kafka_connect.register(names["killed"], **killed)
        wait_for_topic(f"{killed['topic.prefix']}.{tables[0]}")
        live = start_monitor(live_config, tmp_path / "live.log")
        wait_for_topic(pad_topic)
        wait_for("the padding table's snapshot under way", lambda: end_offset(pad_topic) >= 2_000, every=0.05)
        kafka_connect.kill()
        at_kill = end_offset(pad_topic)
        assert at_kill < PAD_ROWS, at_kill  # the kill landed inside the snapshot (else this test shows nothing)
        kafka_connect.up()
        kafka_connect.register(names["killed"], **killed)  # a standalone worker forgets its connectors
        last_topic = f"{killed['topic.prefix']}.{sorted(tables)[-1]}"
        wait_for("the snapshot taken again to its end", lambda: snapshot_done(last_topic), timeout=120, every=1.0)
        # taken again: the padding table's rows written twice in part (its records may be sent after the last)
        wait_for("the padding table taken again", lambda: end_offset(pad_topic) > PAD_ROWS, timeout=60)
        kafka_connect.register(names["control"], **control)
        control_topics = [f"{control['topic.prefix']}.{t}" for t in sorted(tables)]
        for t in control_topics:
            wait_for_topic(t)
        wait_for("the control's snapshot", lambda: snapshot_done(control_topics[-1]), timeout=120, every=1.0)
        # then the shop writes on, every fault mode on, streamed by both connectors
        shop.run(shop_settings(topic, schema=CDC_SCHEMA, seed=6, orders=60, rate=30, faults="all"))
        for prefix in (killed["topic.prefix"], control["topic.prefix"]):
            kafka_connect.captured(quiet=3.0, timeout=120, topic=f"{prefix}.transaction")
        assert live.poll() is None, (tmp_path / "live.log").read_text()[-3000:]
        live.send_signal(signal.SIGTERM)
        assert live.wait(timeout=60) == 0, (tmp_path / "live.log").read_text()[-3000:]
        live = None
        # the verdicts still due, as the control gives them: on the change clock of the connectors' heartbeats
        run_until_idle(live_config, idle=IDLE, timeout=120)
        run_until_idle(control_config, idle=IDLE, timeout=120)
    finally:
        if live is not None:
            live.kill()
        for name in names.values():
            try:
                kafka_connect.unregister(name)
            except OSError:
                pass
        admin = admin_connection(CDC_SCHEMA)
        with admin.cursor() as c:
            c.execute(f"DROP TABLE {pad}")
        admin.close()
    got, want = findings(live_config), findings(control_config)
    assert rows(live_config) == rows(control_config)  # each row taken in once
    replays = [f for f in got if f.rule == "F15"]
    assert replays and all(f.severity == "info" for f in replays)
    assert verdicts(got) == verdicts(want), (verdicts(got) - verdicts(want), verdicts(want) - verdicts(got))
