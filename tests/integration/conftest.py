"""Fixtures for tests against the real dev services (MariaDB, Kafka) that `python -m devservices.stack up` starts.

`make test` starts the services first; running pytest alone without them fails loudly here
rather than skipping, so a missing service can never pass for a green run.
"""

from __future__ import annotations

import json

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pymysql
import pytest

from devservices import base, mariadb
from devservices.shop_monitor import unique_server_id
from oncewatch.core.config import Config, parse

from .demo_run import DemoRun

ROOT = Path(__file__).resolve().parents[2]
DEMO = pytest.StashKey[DemoRun]()
DEMO_TESTS = "test_demo.py"
# Integration tests that touch no server (the dashboard over a seeded store): they run beside the demo's warm-up.
SERVERLESS = ("test_dashboard_browser.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every test here `integration`, and orders the session: the tests that need no server first
    (the unit tests, and their store tests on PostgreSQL; then SERVERLESS), then the demo's, then the rest.
    The demo starts in the background once collected (below) and needs a minute or two before its slowest
    rules show; it runs beside the serverless tests, and is stopped before any test that restarts a server
    (a bootstrap cut short by a MariaDB restart stops the demo's monitor, as it would a user's)."""
    here = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        path = Path(str(item.fspath))
        if not path.is_relative_to(here):
            return 0
        return 1 if path.name in SERVERLESS else 2 if path.name == DEMO_TESTS else 3

    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.integration)
    items.sort(key=rank)  # stable: each group keeps its own order


def pytest_collection_finish(session: pytest.Session) -> None:
    """The demo's test is collected: start the demo now, in the background (tests.integration.demo_run)."""
    if any(Path(str(item.fspath)).name == DEMO_TESTS for item in session.items) and base.port_open(base.KAFKA_PORT):
        demo = DemoRun.start()
        session.config.stash[DEMO] = demo
        session.config.add_cleanup(demo.stop)


@pytest.fixture(scope="module")
def demo(request: pytest.FixtureRequest) -> Iterator[DemoRun]:
    """The session's demo (started at collection), ready; stopped when its module is done."""
    run = request.config.stash.get(DEMO, None) or DemoRun.start()
    try:
        run.wait_ready()
        yield run
    finally:
        assert run.stop() == 0, run.output()[-3000:]


@pytest.fixture(scope="session", autouse=True)
def dev_services() -> None:
    missing = [name for name, port in (("mariadb", base.MARIADB_PORT), ("kafka", base.KAFKA_PORT))
               if not base.port_open(port)]
    if missing:
        pytest.fail(f"dev services not running: {', '.join(missing)}; run `make services` "
                    f"(python -m devservices.stack up)", pytrace=False)
    warm_up_group_coordinator()


@pytest.fixture
def cdc_connector() -> None:
    """The Debezium connector running: other tests restart MariaDB and purge its binlog under it, and a task
    that failed on that is restarted (it takes a new snapshot where its position is gone)."""
    from devservices import kafka_connect

    kafka_connect.ensure_running()


def warm_up_group_coordinator(timeout: float = 90.0) -> None:
    """A brand-new broker creates __consumer_offsets on the first group commit, and answers group
    requests with 'coordinator not available' until then; tests that read group offsets would
    otherwise race it on a fresh machine."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError
    from kafka.structs import OffsetAndMetadata

    bootstrap = f"{base.HOST}:{base.KAFKA_PORT}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic("owtest.warmup", num_partitions=1, replication_factor=1)])
    except TopicAlreadyExistsError:
        pass
    deadline = time.monotonic() + timeout
    while True:
        try:
            consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id="owtest-warmup", enable_auto_commit=False)
            consumer.assign([TopicPartition("owtest.warmup", 0)])
            consumer.commit({TopicPartition("owtest.warmup", 0): OffsetAndMetadata(0, "", -1)})
            consumer.close(autocommit=False)
            admin.describe_groups(["owtest-warmup"])
            admin.list_group_offsets("owtest-warmup")
            break
        except KafkaError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    admin.close()


def admin_connection(database: str | None = "owtest") -> pymysql.Connection:
    return pymysql.connect(host=base.HOST, port=base.MARIADB_PORT, user=mariadb.ADMIN_USER,
                           password=mariadb.ADMIN_PASSWORD, database=database, autocommit=True)


@pytest.fixture
def admin() -> Iterator[pymysql.Connection]:
    conn = admin_connection()
    yield conn
    conn.close()


@pytest.fixture
def table_name() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"


def monitor_config(tables: list[str], tmp_path: Path, **mysql: object) -> Config:
    """A config for the monitor user on the dev MariaDB watching `tables` (schema.table)."""
    return parse({
        "mysql": {"host": base.HOST, "port": base.MARIADB_PORT, "user": mariadb.MONITOR_USER,
                  "password_file": str(mariadb.MONITOR_PASSWORD_FILE), "tables": tables,
                  "heartbeat_seconds": 1.0, "reconnect_max_seconds": 2.0,
                  "server_id": unique_server_id(), **mysql},
        "store": {"path": str(tmp_path / "store.db")},
    }, base=tmp_path)


def write_config_file(cfg_dict: str, tmp_path: Path) -> Path:
    path = tmp_path / "oncewatch.toml"
    path.write_text(cfg_dict)
    return path


def monitor_config_toml(tables: list[str], tmp_path: Path, *, store: Path | None = None, extra: str = "",
                        metrics_port: int = 0, writer: str = "judge") -> Path:
    """Like monitor_config, as a file in `tmp_path`; the store at `store` (default tmp_path/store.db) written by
    `writer` ([store] writer), /metrics on
    `metrics_port` (0: none; never the product's default 9464, which a monitor of another lane of `make test` may
    hold: the monitor then exits on a config error and the test waits for it in vain), then the TOML of `extra`."""
    listed = ", ".join(f'"{t}"' for t in tables)
    return write_config_file(f"""
[mysql]
host = "{base.HOST}"
port = {base.MARIADB_PORT}
user = "{mariadb.MONITOR_USER}"
password_file = "{mariadb.MONITOR_PASSWORD_FILE}"
tables = [{listed}]
server_id = {unique_server_id()}
heartbeat_seconds = 1.0
reconnect_max_seconds = 2.0

[store]
path = "{store or tmp_path / 'store.db'}"
writer = "{writer}"

[metrics]
port = {metrics_port}
{extra}""", tmp_path)


def cdc_toml(prefix: str | None, **cdc: object) -> str:
    """The TOML of a CDC mode config reading the topics of `prefix` (None: Canal's, which `cdc` names), with more
    `[cdc]` keys: its `[kafka]` names an events topic that is never made (these tests are of the CDC topics'
    reading)."""
    keys = {} if prefix is None else {"topic_prefix": prefix}
    keys = "".join(f"{k} = {json.dumps(v)}\n" for k, v in (keys | cdc).items())
    return f"""
[kafka]
bootstrap_servers = ["{base.HOST}:{base.KAFKA_PORT}"]
[[kafka.topics]]
name = "owtest.never-made"
format = "json"
required = []
[cdc]
{keys}"""


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 90.0, every: float = 0.5,
             log: Path | None = None) -> None:
    """Poll `cond` every `every` seconds until it holds; fail naming `what` after `timeout` seconds, with the end of
    `log` (a monitor's, say) when there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(every)
    tail = f"; the end of {log}:\n{log.read_text(errors='replace')[-3000:]}" if log and log.exists() else ""
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}{tail}")
