"""The shop's storage: creating its tables (those of its layout, shop.layout) and its topic."""

from __future__ import annotations

import logging
import time

import pymysql
from kafka import KafkaAdminClient
from kafka.errors import TopicAlreadyExistsError

from oncewatch.shop.layout import SHAPE_SHOP, Layout
from oncewatch.shop.settings import KafkaTarget, MySQLTarget

log = logging.getLogger(__name__)

def connect(target: MySQLTarget, *, autocommit: bool = False, database: bool = True) -> pymysql.connections.Connection:
    """`database`: select the target's database (the flat shop's; the mall's statements name their schemas)."""
    # Row timestamps are written in UTC (the monitor reads DATETIME columns as UTC).
    return pymysql.connect(host=target.host, port=target.port, user=target.user, password=target.password,
                           database=target.database if database else None, autocommit=autocommit,
                           connect_timeout=10, init_command="SET time_zone = '+00:00'")


def prepare_tables(target: MySQLTarget, *, reset: bool, shape: str = SHAPE_SHOP, commit_marks: bool = False) -> None:
    layout = Layout(shape, target.database)
    tables = layout.tables()
    if commit_marks:
        tables[layout.commit_marks] = "\n        tx_id CHAR(32) NOT NULL PRIMARY KEY"
    conn = connect(target, autocommit=True, database=False)
    try:
        with conn.cursor() as cur:
            for schema in layout.schemas:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS `{schema}`")
            for name, columns in tables.items():
                if reset:
                    cur.execute(f"DROP TABLE IF EXISTS {name}")
                cur.execute(f"CREATE TABLE IF NOT EXISTS {name} ({columns}\n) ENGINE=InnoDB")
    finally:
        conn.close()
    log.info("tables ready", extra={"database": target.database, "shape": shape, "reset": reset})


def binlog_position(target: MySQLTarget) -> str:
    """MariaDB's GTID position now: where a monitor should start to see just this run."""
    conn = connect(target, autocommit=True, database=False)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@gtid_binlog_pos")
            return str(cur.fetchone()[0])
    finally:
        conn.close()


def prepare_topic(admin: KafkaAdminClient, target: KafkaTarget, *, reset: bool) -> None:
    """Create the topic if missing; on reset delete it first.

    The groups' committed offsets on a deleted topic go with it. The groups themselves stay:
    another shop (a test's topic) may use the same group names for its own topic.
    """
    if reset:
        if target.topic in admin.list_topics():
            admin.delete_topics([target.topic])
    elif target.topic in admin.list_topics():
        return
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.create_topics({target.topic: {"num_partitions": target.partitions, "replication_factor": 1}},
                                wait_for_metadata=True)
            break
        except TopicAlreadyExistsError:
            # Without reset someone else just created it; after a delete the old topic can
            # linger for a moment in the controller's metadata.
            if not reset:
                break
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    log.info("topic ready", extra={"topic": target.topic, "reset": reset})
