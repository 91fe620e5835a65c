"""CDC for development and tests: a Kafka Connect worker with Debezium's MariaDB connector, on loopback.

Both come from Maven Central (devservices/connect/worker and devservices/connect/debezium, fetched
by `mvn dependency:copy-dependencies` the first time). The worker runs standalone (its source
offsets in a file under .devstack/connect/, so a restart resumes where it stopped), with its REST
API on CONNECT_PORT. Standalone mode forgets its connectors when it stops, so every start registers
the connector again (a PUT of its config is create-or-update) and waits until its task runs.

The connector captures the schema CDC_SCHEMA with transaction metadata on: topics
`cdc.<schema>.<table>` (JSON with schemas, DECIMAL in Debezium's default `precise` form), one
partition each, and `cdc.transaction` with each transaction's BEGIN and END; TRUNCATEs are records
and BIGINT UNSIGNED is exact. It reads as its own
user, DEBEZIUM_USER, with the grants Debezium documents. `poll.interval.ms` is 100 (the default
500 would add half a second to every change's way to Kafka; 20 kept an idle worker at 0.05 core, 100 at 0.015, and
`make test` runs four). It writes heartbeats to
`__debezium-heartbeat.cdc`, the monitor's change clock while the tables are quiet.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from devservices.base import (HOST, KAFKA_PORT, MARIADB_PORT, ROOT, STATE, Service, StackError, already_up, java_argv,
                              log, spawn, stop, wait_until)
from devservices.mariadb import mariadb_admin_sql

CONNECT_PORT = int(os.environ.get("ONCEWATCH_DEV_CONNECT_PORT", str(KAFKA_PORT - 1009)))  # 18083 by default
JARS = ROOT / "devservices" / "connect"
WORKER_LIB = JARS / "worker" / "lib"
PLUGINS = JARS / "debezium"  # plugin.path: each folder in it is one plugin (plugin/)
CONNECT_DIR = STATE / "connect"
CONNECT = Service("connect", CONNECT_DIR / "connect.pid", CONNECT_DIR / "connect.log",
                  str(CONNECT_DIR / "worker.properties"))

CONNECTOR = "oncewatch-cdc"
CDC_SCHEMA = "owcdc"
TOPIC_PREFIX = "cdc"
TRANSACTION_TOPIC = f"{TOPIC_PREFIX}.transaction"
DEBEZIUM_USER = "debezium"
DEBEZIUM_PASSWORD = "debezium-dev"
DEBEZIUM_SERVER_ID = 5400  # a replica id of its own: the monitor's streams use theirs


def table_topic(table: str, schema: str = CDC_SCHEMA) -> str:
    return f"{TOPIC_PREFIX}.{schema}.{table}"


def ensure_jars() -> None:
    for pom, folder, probe in ((JARS / "worker" / "pom.xml", WORKER_LIB, "slf4j-simple-1.*.jar"),
                               (PLUGINS / "pom.xml", PLUGINS / "plugin", "debezium-connector-mariadb-*.jar")):
        if not any(folder.glob(probe)):
            log(f"fetching {pom.parent.name} jars from Maven Central")
            subprocess.run(["mvn", "-q", "-B", "-Dstyle.color=never", "-f", str(pom), "dependency:copy-dependencies"],
                           check=True)


def ensure_debezium_user() -> None:
    mariadb_admin_sql(
        f"CREATE DATABASE IF NOT EXISTS `{CDC_SCHEMA}`;"
        f"CREATE USER IF NOT EXISTS '{DEBEZIUM_USER}'@'127.0.0.1' IDENTIFIED BY '{DEBEZIUM_PASSWORD}';"
        f"GRANT SELECT, RELOAD, SHOW DATABASES, LOCK TABLES, REPLICATION SLAVE, REPLICATION CLIENT ON *.* "
        f"TO '{DEBEZIUM_USER}'@'127.0.0.1'; FLUSH PRIVILEGES;")


def write_worker_config() -> Path:
    CONNECT_DIR.mkdir(parents=True, exist_ok=True)
    props = Path(CONNECT.marker)
    props.write_text(f"""bootstrap.servers={HOST}:{KAFKA_PORT}
listeners=http://{HOST}:{CONNECT_PORT}
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=true
value.converter.schemas.enable=true
offset.storage.file.filename={CONNECT_DIR / 'offsets.dat'}
offset.flush.interval.ms=1000
plugin.path={PLUGINS}
plugin.discovery=service_load
topic.creation.enable=true
""")
    return props


def connector_config() -> dict[str, str]:
    return {
        "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
        "tasks.max": "1",
        "database.hostname": HOST,
        "database.port": str(MARIADB_PORT),
        "database.user": DEBEZIUM_USER,
        "database.password": DEBEZIUM_PASSWORD,
        "database.server.id": str(DEBEZIUM_SERVER_ID),
        "topic.prefix": TOPIC_PREFIX,
        "database.include.list": CDC_SCHEMA,
        "provide.transaction.metadata": "true",
        "snapshot.locking.mode": "none",
        # the tests restart MariaDB and purge its binlog under the connector: it retries for as long as it takes,
        # and where its position is gone it takes a new snapshot rather than fail
        "snapshot.mode": "when_needed",
        "errors.max.retries": "-1",
        "connect.keep.alive.interval.ms": "1000",  # a MariaDB restart noticed within a second (default: a minute)
        "poll.interval.ms": "100",  # measured idle, 60 s: 296 CPU ticks at 20, 139 at 50, 87 at 100, 66 at 200
        # the monitor's change clock while the topics are quiet (README, [cdc]): a heartbeat after each server heartbeat
        # (every 0.8 s of keep-alive above) and at most every 0.5 s while the binlog is busy
        "heartbeat.interval.ms": "500",
        "include.schema.changes": "false",
        # what the monitor needs to read every row exactly (collectors.debezium): a TRUNCATE as a record (skipped by
        # default), and BIGINT UNSIGNED as a decimal (by default an int64, where 2**64-1 reads as -1)
        "skipped.operations": "none",
        "bigint.unsigned.handling.mode": "precise",
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": str(CONNECT_DIR / "schema-history.dat"),
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
    }


def rest(method: str, path: str, body: dict[str, Any] | None = None, port: int = CONNECT_PORT) -> Any:
    """A call of the REST API of the worker on `port` (the standalone one's by default); its answer's JSON."""
    request = urllib.request.Request(f"http://{HOST}:{port}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode()
    return json.loads(text) if text else None


def connector_running() -> bool:
    """The connector and its one task both RUNNING; a FAILED task is an error with its trace's first line."""
    try:
        status = rest("GET", f"/connectors/{CONNECTOR}/status")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise
    for task in status.get("tasks", []):
        if task.get("state") == "FAILED":
            first = (task.get("trace") or "").splitlines()[:1]
            raise StackError(f"the Debezium task failed: {first}; see {CONNECT.logfile}")
    return status["connector"]["state"] == "RUNNING" and any(t.get("state") == "RUNNING"
                                                               for t in status.get("tasks", []))


def register(name: str = CONNECTOR, **overrides: str) -> None:
    """Create or update a connector: the dev one, or (with `overrides`) another of its kind, for a test."""
    rest("PUT", f"/connectors/{name}/config", {**connector_config(), **overrides})


def unregister(name: str) -> None:
    rest("DELETE", f"/connectors/{name}")


def restart_failed_task(timeout: float = 120) -> bool:
    """A failed task restarted as an operator does (it resumes from its offsets); True when it had failed. Debezium
    gives up for good on some errors, e.g. MariaDB going away while its streaming starts."""
    restarted, deadline = False, time.monotonic() + timeout
    while True:
        status = rest("GET", f"/connectors/{CONNECTOR}/status")
        tasks = status.get("tasks", [])
        failed = [t for t in tasks if t.get("state") == "FAILED"]
        if not failed and (not restarted or (status["connector"]["state"] == "RUNNING"
                                             and any(t.get("state") == "RUNNING" for t in tasks))):
            return restarted
        if time.monotonic() > deadline:
            first = (failed[0].get("trace") or "").splitlines()[:1] if failed else "not running"
            raise StackError(f"the Debezium task is not running {timeout:.0f} s after its restart: {first}; see "
                             f"{CONNECT.logfile}")
        # a restart is asynchronous: the status says FAILED a while after it (then the task is restarted again,
        # as an operator does when it fails anew, e.g. on a MariaDB still starting)
        for task in failed:
            rest("POST", f"/connectors/{CONNECTOR}/tasks/{task['id']}/restart")
        restarted = restarted or bool(failed)
        time.sleep(3.0 if failed else 0.5)


def ensure_running(timeout: float = 120) -> None:
    """The connector and its task running. A failed task (MariaDB restarted or its binlog purged under it by
    another test) is started afresh: the worker stopped, its source offsets and schema history forgotten, and
    started again, so the connector takes a new snapshot and streams from the binlog's end."""
    status = rest("GET", f"/connectors/{CONNECTOR}/status")
    if any(t.get("state") == "FAILED" for t in status.get("tasks", [])) or status["connector"]["state"] == "FAILED":
        log("the Debezium task failed; starting the connector afresh (new snapshot, offsets forgotten)")
        stop(CONNECT)
        for name in ("offsets.dat", "schema-history.dat"):
            (CONNECT_DIR / name).unlink(missing_ok=True)
        up()
        return
    _wait_running(timeout)


def _wait_running(timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not connector_running():
        if time.monotonic() > deadline:
            raise StackError(f"the Debezium connector is not running after {timeout:.0f} s; see {CONNECT.logfile}")
        time.sleep(0.5)


def ends(topics: list[str]) -> int:
    """The sum of the end offsets of `topics` (one partition each, as the connector makes them; one it has not
    made yet, on a new stack before it captured a row of its table, holds none)."""
    consumer = KafkaConsumer(bootstrap_servers=f"{HOST}:{KAFKA_PORT}")
    try:
        tps = [TopicPartition(t, 0) for t in set(topics) & consumer.topics()]
        return sum(consumer.end_offsets(tps).values())
    finally:
        consumer.close()


def captured(quiet: float = 5.0, timeout: float = 900.0, topic: str = TRANSACTION_TOPIC) -> None:
    """The connector has put all of a workload on its topics: its transaction topic (the dev connector's, or
    `topic`) has not grown for `quiet` s."""
    deadline, end, since = time.monotonic() + timeout, ends([topic]), time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() > deadline:
            raise StackError(f"the connector did not finish capturing in {timeout:.0f} s; see {CONNECT.logfile}")
        time.sleep(1.0)
        now = ends([topic])
        if now != end:
            end, since = now, time.monotonic()


def up() -> None:
    ensure_jars()
    ensure_debezium_user()
    if not already_up(CONNECT, CONNECT_PORT):
        props = write_worker_config()
        proc = spawn(CONNECT, java_argv(WORKER_LIB, "org.apache.kafka.connect.cli.ConnectStandalone", str(props)))
        wait_until("kafka connect", lambda: rest("GET", "/") is not None, proc, CONNECT, 120)
    register()
    _wait_running(120)
    log(f"kafka connect listening on {HOST}:{CONNECT_PORT} (Debezium MariaDB connector '{CONNECTOR}' capturing "
        f"{CDC_SCHEMA} into {TOPIC_PREFIX}.{CDC_SCHEMA}.* with transaction metadata on {TRANSACTION_TOPIC})")


def down() -> list[tuple[str, bool]]:
    return [("connect", stop(CONNECT))]


def kill() -> bool:
    """The worker ended by SIGKILL, between offset flushes: at its next start (`up`) Debezium resumes from the last
    flushed offsets and delivers again what it had sent after them. True when it was running."""
    return stop(CONNECT, sig=signal.SIGKILL)


SERVICES = ((CONNECT, CONNECT_PORT),)
