"""CDC source mode against the binlog's findings on the real Kafka Connect worker (issue 42, observation 3 and the
CDC change clock): a connector's snapshot whose callback log comes before the payments gives the findings the
binlog bootstrap gives.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition

from devservices import kafka_connect, stack
from devservices.kafka_connect import CDC_SCHEMA
from devservices.shop_monitor import findings, run_until_idle

from .conftest import admin_connection, cdc_toml, monitor_config_toml, wait_for

BOOTSTRAP = f"{stack.HOST}:{stack.KAFKA_PORT}"


def payment_shop_toml(tables: dict[str, str]) -> str:
    """[domain] for an orders, payments and callback log shop (tables: role -> schema.table)."""
    return f"""
[domain.orders]
table = "{tables['orders']}"
key_column = "order_no"
status_column = "status"
amount_column = "amount"
pending_statuses = ["pending"]

[domain.payments]
table = "{tables['payments']}"
trade_no_column = "trade_no"
order_column = "order_no"
status_column = "status"
amount_column = "amount"
success_statuses = ["success"]

[domain.callbacks]
table = "{tables['callbacks']}"
trade_no_column = "trade_no"
status_column = "status"
status_whitelist = ["success", "failed"]
amount_column = "amount"
success_statuses = ["success"]

[domain.state_machine]
pending = ["paid", "closed"]
paid = []
closed = []
"""


def first_record(topic: str) -> dict:
    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False, group_id=None)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        while True:
            for records in consumer.poll(timeout_ms=1000).values():
                return json.loads(records[0].value)["payload"]
    finally:
        consumer.close()


def test_a_snapshot_with_the_callback_log_first_finds_what_the_binlog_bootstrap_finds(cdc_connector, table_name,
                                                                                      tmp_path: Path):
    """Issue 42, observation 3. The connector snapshots the callback log first (first in its table.include.list,
    first by name), then the payments, then the orders. Three of twenty success callbacks carry another amount
    than their order (F5): the binlog bootstrap reads the tables in the config's order (orders, payments, callbacks)
    and finds them; the CDC source monitor, reading the snapshot, must find the same."""
    names = {"callbacks": f"{table_name}_a_callback", "payments": f"{table_name}_b_payment",
             "orders": f"{table_name}_c_order"}
    tables = {role: f"{CDC_SCHEMA}.{name}" for role, name in names.items()}
    admin = admin_connection(CDC_SCHEMA)
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {names['orders']} (order_no VARCHAR(16) PRIMARY KEY, status VARCHAR(16), "
                  "amount DECIMAL(12,2))")
        c.execute(f"CREATE TABLE {names['payments']} (trade_no VARCHAR(16) PRIMARY KEY, order_no VARCHAR(16), "
                  "status VARCHAR(16), amount DECIMAL(12,2))")
        c.execute(f"CREATE TABLE {names['callbacks']} (id INT PRIMARY KEY, trade_no VARCHAR(16), status VARCHAR(16), "
                  "amount DECIMAL(12,2))")
        for i in range(20):
            amount = Decimal(10 + i)
            c.execute(f"INSERT INTO {names['orders']} VALUES (%s, 'paid', %s)", (f"O{i}", amount))
            c.execute(f"INSERT INTO {names['payments']} VALUES (%s, %s, 'success', %s)", (f"T{i}", f"O{i}", amount))
            sent = amount - 1 if i % 7 == 3 else amount  # the channel's notification of another amount: F5
            c.execute(f"INSERT INTO {names['callbacks']} VALUES (%s, %s, 'success', %s)", (i, f"T{i}", sent))
    admin.close()
    ordered = [tables["orders"], tables["payments"], tables["callbacks"]]
    shop = payment_shop_toml(tables)

    (tmp_path / "binlog").mkdir()
    binlog = monitor_config_toml(ordered, tmp_path / "binlog", extra=shop)
    run_until_idle(binlog)
    from_bootstrap = sorted((f.id, f.rule, f.keys.get("trade_no")) for f in findings(binlog))
    assert sorted((rule, trade) for _, rule, trade in from_bootstrap) == [("F5", "T10"), ("F5", "T17"), ("F5", "T3")]

    prefix, connector = f"snap{table_name[2:]}", f"oncewatch-snapshot-{table_name}"
    kafka_connect.register(connector, **{
        "topic.prefix": prefix, "table.include.list": ",".join([tables["callbacks"], tables["payments"],
                                                                tables["orders"]]),
        "snapshot.mode": "initial", "database.server.id": str(kafka_connect.DEBEZIUM_SERVER_ID + 2),
        "schema.history.internal.file.filename": str(tmp_path / "history.dat")})
    try:
        consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP)
        wait_for("the connector's snapshot topics",
                 lambda: {f"{prefix}.{t}" for t in tables.values()} <= consumer.topics(), timeout=90)
        consumer.close()
        # the reproduction's precondition: the connector's snapshot began with the callback log
        assert first_record(f"{prefix}.{tables['callbacks']}")["source"]["snapshot"] == "first"
        (tmp_path / "cdc").mkdir()
        cdc = monitor_config_toml(ordered, tmp_path / "cdc",
                                  extra=cdc_toml(prefix, start_from="earliest", transaction_grace_seconds=2) + shop)
        run_until_idle(cdc)
    finally:
        kafka_connect.unregister(connector)
    from_snapshot = sorted((f.id, f.rule, f.keys.get("trade_no")) for f in findings(cdc))
    assert from_snapshot == from_bootstrap
