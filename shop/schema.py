"""The shop's storage: its tables (the names and columns of examples/shop.toml) and its topic.

Shipments and points grants deliberately have no unique key on trade_no: the only thing
that keeps them to one per payment is the handler's idempotency record, which is what the
F1 faults get wrong and what oncewatch must catch from the outside.
"""

from __future__ import annotations

import logging
import time

import pymysql
from kafka import KafkaAdminClient
from kafka.errors import TopicAlreadyExistsError

from oncewatch.shop.settings import KafkaTarget, MySQLTarget

log = logging.getLogger(__name__)

TABLES: dict[str, str] = {
    "orders": """
        order_no VARCHAR(32) NOT NULL PRIMARY KEY,
        user_id BIGINT NOT NULL,
        amount DECIMAL(12,2) NOT NULL,
        status VARCHAR(16) NOT NULL,
        created_at DATETIME(3) NOT NULL,
        updated_at DATETIME(3) NOT NULL,
        KEY orders_status (status, updated_at)""",
    "payments": """
        trade_no VARCHAR(40) NOT NULL PRIMARY KEY,
        order_no VARCHAR(32) NOT NULL,
        channel VARCHAR(16) NOT NULL,
        amount DECIMAL(12,2) NOT NULL,
        status VARCHAR(16) NOT NULL,
        callback_status VARCHAR(32) NULL,
        created_at DATETIME(3) NOT NULL,
        updated_at DATETIME(3) NOT NULL,
        KEY payments_order (order_no)""",
    "idempotency": """
        idem_key VARCHAR(64) NOT NULL PRIMARY KEY,
        trade_no VARCHAR(40) NOT NULL,
        order_no VARCHAR(32) NOT NULL,
        result VARCHAR(16) NOT NULL,
        created_at DATETIME(3) NOT NULL""",
    "shipments": """
        shipment_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        trade_no VARCHAR(40) NOT NULL,
        order_no VARCHAR(32) NOT NULL,
        pickup_code CHAR(6) NOT NULL,
        created_at DATETIME(3) NOT NULL,
        KEY shipments_trade (trade_no)""",
    "points_grants": """
        grant_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        trade_no VARCHAR(40) NOT NULL,
        order_no VARCHAR(32) NOT NULL,
        points INT NOT NULL,
        created_at DATETIME(3) NOT NULL,
        KEY points_trade (trade_no)""",
    "refunds": """
        refund_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        order_no VARCHAR(32) NOT NULL,
        trade_no VARCHAR(40) NOT NULL,
        amount DECIMAL(12,2) NOT NULL,
        created_at DATETIME(3) NOT NULL,
        KEY refunds_order (order_no)""",
    "outbox": """
        id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        event_id CHAR(32) NOT NULL UNIQUE,
        topic VARCHAR(249) NOT NULL,
        msg_key VARCHAR(64) NOT NULL,
        payload BLOB NOT NULL,
        created_at DATETIME(3) NOT NULL,
        sent_at DATETIME(3) NULL,
        KEY outbox_unsent (sent_at, id)""",
}


def connect(target: MySQLTarget, *, autocommit: bool = False) -> pymysql.connections.Connection:
    # Row timestamps are written in UTC (the monitor reads DATETIME columns as UTC).
    return pymysql.connect(host=target.host, port=target.port, user=target.user, password=target.password,
                           database=target.database, autocommit=autocommit, connect_timeout=10,
                           init_command="SET time_zone = '+00:00'")


def prepare_tables(target: MySQLTarget, *, reset: bool) -> None:
    conn = connect(target, autocommit=True)
    try:
        with conn.cursor() as cur:
            for name, columns in TABLES.items():
                if reset:
                    cur.execute(f"DROP TABLE IF EXISTS `{name}`")
                cur.execute(f"CREATE TABLE IF NOT EXISTS `{name}` ({columns}\n) ENGINE=InnoDB")
    finally:
        conn.close()
    log.info("tables ready", extra={"database": target.database, "reset": reset})


def binlog_position(target: MySQLTarget) -> str:
    """MariaDB's GTID position now: where a monitor should start to see just this run."""
    conn = connect(target, autocommit=True)
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
