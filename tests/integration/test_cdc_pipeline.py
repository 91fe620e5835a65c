"""Issue 15 item 4 on the real connector: `[cdc] mode = "check"` lines the CDC topics up with the binlog, row for
row. A relay copies the connector's topics to topics of its own, dropping chosen records: exactly those rows
are lost (F13), with their binlog coordinates. Then the connector is paused while the shop writes: the lag rises
on /metrics and its alert fires in Prometheus; resumed, it catches up and nothing more is reported lost."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devservices import base, kafka_connect, paging
from devservices.kafka_connect import CDC_SCHEMA, TRANSACTION_TOPIC, table_topic
from devservices.shop_monitor import ROOT, findings, free_port

from .conftest import admin_connection, cdc_toml, monitor_config_toml, wait_for

BOOTSTRAP = f"{base.HOST}:{base.KAFKA_PORT}"


class Relay:
    """Copies the connector's transaction topic and one table's topic, from their ends now, to
    `<prefix>.transaction` and `<prefix>.<schema>.<table>`, record for record (key, value, headers), less the
    data records whose row id is in `drop`."""

    def __init__(self, table: str, drop: set[int]):
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition
        from kafka.admin import KafkaAdminClient, NewTopic

        self.prefix = f"relay{uuid.uuid4().hex[:8]}"
        self.drop = drop
        self.dropped: list[int] = []
        self.copied = 0
        self.sources = {TRANSACTION_TOPIC: f"{self.prefix}.transaction",
                        table_topic(table): f"{self.prefix}.{CDC_SCHEMA}.{table}"}
        admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP)
        admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1) for t in self.sources.values()])
        admin.close()
        self.consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP, group_id=None, enable_auto_commit=False)
        parts = [TopicPartition(t, 0) for t in self.sources]
        self.consumer.assign(parts)
        self.consumer.seek_to_end(*parts)
        for tp in parts:
            self.consumer.position(tp)  # resolved now: what comes after this is copied
        self.producer = KafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", linger_ms=0)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _row_id(self, value: bytes | None) -> int | None:
        if value is None:
            return None
        payload = json.loads(value)["payload"]
        row = payload.get("after") or payload.get("before") or {}
        return row.get("id")

    def _run(self) -> None:
        while not self._stop.is_set():
            for tp, records in self.consumer.poll(timeout_ms=200).items():
                for r in records:
                    if tp.topic != TRANSACTION_TOPIC and self._row_id(r.value) in self.drop:
                        self.dropped.append(self._row_id(r.value))
                        continue
                    self.producer.send(self.sources[tp.topic], key=r.key, value=r.value, headers=r.headers,
                                       partition=0)
                    self.copied += 1
            self.producer.flush()

    def close(self) -> None:
        self._stop.set()
        self.thread.join(10)
        self.consumer.close()
        self.producer.close()


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{base.HOST}:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^(oncewatch_cdc_\w+) (\S+)$", text, re.M)}


def firing(alertname: str, instance: str) -> bool:
    query = f'ALERTS{{alertname="{alertname}", alertstate="firing", instance="{instance}"}}'
    url = f"http://{base.HOST}:{paging.PROMETHEUS_PORT}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=5) as resp:
        return bool(json.load(resp)["data"]["result"])


def write(conn, table: str, ids: list[list[int]], filler: str = "x") -> list[tuple[str, str]]:
    """One transaction per list of ids; each transaction's GTID and binlog coordinates as the server gives them
    (nothing else writes meanwhile: the end of the binlog is the end of the transaction)."""
    out = []
    with conn.cursor() as c:
        for tx in ids:
            conn.begin()
            for i in tx:
                c.execute(f"INSERT INTO {table} VALUES (%s, %s)", (i, filler))
            conn.commit()
            c.execute("SELECT @@last_gtid")
            (gtid,), = c.fetchall()
            c.execute("SHOW MASTER STATUS")
            file, pos = c.fetchone()[:2]
            out.append((gtid, f"{file}:{pos}"))
    return out


@pytest.fixture
def paused_later() -> Iterator[None]:
    """The connector running again after the test, whatever happened in it."""
    yield
    kafka_connect.rest("PUT", f"/connectors/{kafka_connect.CONNECTOR}/resume")
    kafka_connect.ensure_running()


def test_the_pipeline_checked_against_the_binlog_finds_exactly_the_dropped_rows_and_its_lag_pages(
        cdc_connector, paused_later, table_name, tmp_path: Path):
    admin = admin_connection(CDC_SCHEMA)
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v VARCHAR(300)) ENGINE=InnoDB")
    write(admin, table_name, [[-1]])  # the connector makes the table's topic with its first record
    wait_for("the table's topic", lambda: table_topic(table_name) in kafka_topics(), timeout=60)
    dropped = {7, 20, 41}
    relay = Relay(table_name, dropped)
    port = free_port()
    config = monitor_config_toml([f"{CDC_SCHEMA}.{table_name}"], tmp_path, metrics_port=port, extra=f"""
[rules]
cdc_lost_grace_seconds = 5
{cdc_toml(relay.prefix, mode="check", transaction_grace_seconds=2)}""")
    instance = f"{base.HOST}:{port}"
    target = paging.TARGETS / f"test-{uuid.uuid4().hex[:8]}.json"
    target.write_text(json.dumps([{"targets": [instance]}]))
    log = open(tmp_path / "monitor.log", "ab")
    monitor = subprocess.Popen([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(config)], cwd=ROOT,
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for("the monitor's /metrics", lambda: "oncewatch_cdc_pipeline_lag_rows" in scrape_safe(port))
        written = write(admin, table_name, [[2 * i, 2 * i + 1] for i in range(30)])
        by_id = {i: written[i // 2] for i in range(60)}

        def lost() -> list:
            return [f for f in findings(config) if f.rule == "F13"]

        wait_for("the dropped rows lost", lambda: len(lost()) >= len(dropped), timeout=60)
        assert sorted(int(f.keys["pk"]) for f in lost()) == sorted(dropped) == sorted(relay.dropped)
        for f in lost():  # with the row's binlog coordinates: file and end of its transaction, GTID, row in it
            row = int(f.keys["pk"])
            gtid, at = by_id[row]
            assert f.keys["gtid"] == gtid and [e.coordinates for e in f.evidence] == [f"{at}#{gtid}/{row % 2}"]
        assert sorted(f.keys["gtid"] for f in findings(config) if f.rule == "F16") == sorted(
            {by_id[i][0] for i in dropped})

        kafka_connect.rest("PUT", f"/connectors/{kafka_connect.CONNECTOR}/pause")
        wait_for("the connector paused", lambda: kafka_connect.rest(
            "GET", f"/connectors/{kafka_connect.CONNECTOR}/status")["tasks"][0]["state"] == "PAUSED")
        # the task takes the pause between two polls: a transaction written now may still go out with the poll
        # under way; the next ones wait
        write(admin, table_name, [[99]])
        time.sleep(2)
        write(admin, table_name, [[100 + i] for i in range(40)], filler="y" * 250)
        wait_for("the lag on /metrics", lambda: scrape(port)["oncewatch_cdc_pipeline_lag_transactions"] >= 40
                 and scrape(port)["oncewatch_cdc_position_gap_bytes"] > 5000)
        paused = scrape(port)
        wait_for("the pipeline's alert firing", lambda: firing("OncewatchCdcPipelineBehind", instance), timeout=120)
        firing_then = scrape(port)
        kafka_connect.rest("PUT", f"/connectors/{kafka_connect.CONNECTOR}/resume")
        wait_for("the pipeline caught up", lambda: scrape(port)["oncewatch_cdc_pipeline_lag_transactions"] == 0)
        caught_up = scrape(port)
    finally:
        target.unlink()
        monitor.terminate()
        relay.close()
        assert monitor.wait(30) == 0
    assert paused["oncewatch_cdc_pipeline_lag_rows"] == paused["oncewatch_cdc_pipeline_lag_transactions"]
    # the alert holds for a minute of the gap: by then the oldest row waiting has waited that long
    assert firing_then["oncewatch_cdc_pipeline_lag_seconds"] >= 55, firing_then
    assert caught_up["oncewatch_cdc_position_gap_bytes"] == 0
    final = findings(config)
    assert sorted(int(f.keys["pk"]) for f in final if f.rule == "F13") == sorted(dropped)  # nothing more lost
    assert not [f for f in final if f.rule not in ("F13", "F16")], [(f.rule, f.summary) for f in final]


def scrape_safe(port: int) -> str:
    try:
        return " ".join(scrape(port))
    except OSError:
        return ""


def kafka_topics() -> set[str]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP)
    try:
        return set(consumer.topics())
    finally:
        consumer.close()
