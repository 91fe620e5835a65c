"""Shape changes mid-stream on the real services: a configured column renamed, dropped or retyped,
a watched table truncated. Each is shown as a health problem naming the config key it breaks,
the rules that read it say they are blind, and no false finding follows; putting the column back
ends the problem. Then a VARBINARY key and a PK-less effect table, read from the real binlog.

Without the blindness, the first step alone gives a false F8: the order.paid event finds no
change with a `status` becoming "paid" (`test_near_miss_without_the_ddl_the_same_rows_give_f8`
in tests/unit/test_shape.py shows the same rows giving it).
"""

from __future__ import annotations

import time
from pathlib import Path

from devservices.shop_monitor import SHORT_RULES, findings, free_port, run_until_idle, shop_config, shop_settings
from oncewatch import shop
from oncewatch.checks.engine import Engine
from oncewatch.checks.settings import Settings
from oncewatch.collectors.binlog import BinlogCollector
from oncewatch.core.config import load
from oncewatch.core.names import ENGINE_STATS
from oncewatch.core.protocol import MonitorHealth
from oncewatch.store import open_reader

from .by_hand import announce, effect_event, execute
from .recorded_run import metric, start_monitor
from .shop_monitor import IDLE, prepared


def blind_by_shape(health: MonitorHealth) -> set[str]:
    """The rules the standing shape problems blind for some table (the health row written as the run stopped
    also counts every rule blind, its readers being down)."""
    return set(health.blind_tables)


def monitor_view(config: Path) -> tuple[MonitorHealth, dict]:
    """(the monitor's health row, the engine's stats) as the run left them."""
    store = open_reader(str(config.parent / "store.db"))
    try:
        return store.health()["monitor"].health, store.state(ENGINE_STATS, {})
    finally:
        store.close()


def test_renamed_dropped_retyped_and_truncated_columns_are_shown_and_raise_nothing_false(tmp_path):
    _, topic = prepared(tmp_path)
    config = shop_config(tmp_path, topic=topic, rules={**SHORT_RULES, "stuck_pending_seconds": 2})
    shop.run(shop_settings(topic, seed=3, orders=10, rate=20))
    run_until_idle(config, idle=IDLE)
    assert findings(config) == []

    # The status column renamed; an order is then placed, paid and announced as the shop would.
    execute("ALTER TABLE orders RENAME COLUMN status TO state",
            "INSERT INTO orders VALUES ('SHAPE-1', 7, 10.00, 'pending', NOW(3), NOW(3))",
            "UPDATE orders SET state = 'paid', updated_at = NOW(3) WHERE order_no = 'SHAPE-1'")
    announce(topic, {"type": "order.paid", "order_no": "SHAPE-1", "amount": "10.00", "status": "paid"})
    run_until_idle(config, idle=IDLE)  # the event waits out its 4 s orphan grace
    health, stats = monitor_view(config)
    assert findings(config) == []
    assert any(r.startswith("domain.orders.status_column: owtest.orders.status is gone") for r in health.reasons)
    assert {"F3", "F4", "F6", "F7", "F8", "F9", "F10"} <= blind_by_shape(health)
    assert stats["suppressed_total"].get("F8", 0) >= 1

    # Put back: the problem ends and the rules judge again; the payment amount retyped: F5 is blind.
    execute("ALTER TABLE orders RENAME COLUMN state TO status", "ALTER TABLE payments MODIFY amount VARCHAR(20) NOT NULL")
    run_until_idle(config, idle=IDLE)
    health, _ = monitor_view(config)
    assert not any("status_column" in r for r in health.reasons) and blind_by_shape(health) == {"F5"}
    assert "domain.payments.amount_column: owtest.payments.amount is now varchar, not a number (F5 cannot judge)" \
        in health.reasons
    execute("ALTER TABLE payments DROP COLUMN amount")
    run_until_idle(config, idle=IDLE)
    health, _ = monitor_view(config)
    assert any(r.startswith("domain.payments.amount_column: owtest.payments.amount is gone") for r in health.reasons)
    execute("ALTER TABLE payments ADD COLUMN amount DECIMAL(12,2) NOT NULL DEFAULT 0 AFTER channel")

    # A pending order, then the table truncated: no F3 once its threshold (2 s here) has passed.
    execute("INSERT INTO orders VALUES ('SHAPE-2', 7, 10.00, 'pending', NOW(3), NOW(3))", "TRUNCATE TABLE orders")
    run_until_idle(config, idle=IDLE)
    health, _ = monitor_view(config)
    assert findings(config) == [] and health.shape_problems == ()
    assert not [r for r in health.reasons if "_column" in r]


def test_a_renamed_orders_status_blinds_the_orders_only_and_f7_still_judges_the_shipments(tmp_path):
    """Issue 42, observation 5: the orders' status renamed switched F7 off for every announce entry, so an
    insert into the untouched shipments table (its announce entry intact) whose event was never produced
    raised nothing. Blindness is per rule and table: F7 is found for it, and the health names the orders
    table, not the shipments, as the one F3, F4, F6 and F7-F10 cannot judge."""
    _, topic = prepared(tmp_path)
    port = free_port()
    config = shop_config(tmp_path, topic=topic, metrics_port=port)
    execute("ALTER TABLE orders RENAME COLUMN status TO state",
            *(f"INSERT INTO shipments VALUES ({n}, 'T-{n}', 'O-{n}', 'ABC{n % 1000:03d}', NOW(3))"
              for n in (4201, 4202, 4203)))
    announce(topic, effect_event("shipment.created", 4201), effect_event("shipment.created", 4203))  # not 4202
    run_until_idle(config, idle=IDLE)  # the change waits out its 4 s grace
    (f7,) = findings(config)
    assert (f7.rule, f7.keys) == ("F7", {"event_type": "shipment.created", "key": "4202", "table": "owtest.shipments"})
    health, stats = monitor_view(config)
    # F6 judges an order's callbacks across the orders and payments: blind for both
    assert health.blind_tables == {**{rule: ("owtest.orders",) for rule in ("F3", "F4", "F7", "F8", "F9", "F10")},
                                   "F6": ("owtest.orders", "owtest.payments")}
    assert "F7" in health.rule_tables and "owtest.shipments" in health.rule_tables["F7"]
    assert stats["suppressed_total"] == {}

    # A running monitor's /metrics says the same (the run above left a stopped health row: every rule blind).
    monitor = start_monitor(config, tmp_path / "live.log")
    try:
        deadline = time.monotonic() + 60
        while metric(port, "oncewatch_rule_can_judge", 'rule="F7",table="owtest.shipments"') != 1.0:
            assert monitor.poll() is None and time.monotonic() < deadline, "no running monitor's health on /metrics"
            time.sleep(0.5)
        assert metric(port, "oncewatch_rule_can_judge", 'rule="F7",table="owtest.orders"') == 0.0
        assert metric(port, "oncewatch_rule_can_judge", 'rule="F3",table="owtest.orders"') == 0.0
        assert metric(port, "oncewatch_rule_can_judge", 'rule="F1",table="owtest.shipments"') == 1.0
    finally:
        monitor.terminate()
        monitor.wait(timeout=60)


def test_a_varbinary_key_and_an_effect_table_without_a_primary_key_from_the_real_binlog(tmp_path):
    """The collector reads the rows as MariaDB logs them (bytes for VARBINARY, no key columns for a
    PK-less table); the rules then see the duplicate and match the key to its text."""
    config, _ = prepared(tmp_path)
    cfg = load(config)
    start = BinlogCollector(cfg.mysql, None).current_server_position()
    execute("ALTER TABLE shipments DROP PRIMARY KEY, MODIFY shipment_id BIGINT NOT NULL",
            "ALTER TABLE shipments MODIFY trade_no VARBINARY(40) NOT NULL",
            "INSERT INTO shipments VALUES (1, 'T-BIN', 'O-BIN', 'AAAAAA', NOW(3))",
            "INSERT INTO shipments VALUES (1, 'T-BIN', 'O-BIN', 'BBBBBB', NOW(3))")
    collector = BinlogCollector(cfg.mysql, start)
    txs = []
    for tx in collector.transactions():
        txs.append(tx)
        if sum(len(t.rows) for t in txs) == 2:
            break
    collector.close()
    rows = [r for t in txs for r in t.rows]
    assert [(r.pk, r.after["trade_no"]) for r in rows] == [((), b"T-BIN"), ((), b"T-BIN")]
    engine = Engine(Settings.from_config(cfg))
    for tx in txs:
        engine.on_transaction(tx)
    (f1,) = [f for f in engine.drain() if f.rule == "F1"]
    assert f1.keys["trade_no"] == "T-BIN" and len(f1.evidence) == 2
