"""Canal's replay after a server restart, through the real broker and the whole monitor (issue 42, Deliver 2).

A Canal server that restarts sends again what it had sent since its last acknowledged position: the same
FlatMessages, with a new batch `id` and build time `ts`. A CDC source monitor reading Canal's topic must apply
them once, count them as F15, and otherwise find what a monitor reading the same messages without the replay
finds. Canal's deployer cannot run here (README, [cdc] `format = "canal"`), so the messages are written in the
shape Canal's MQ producer documents, as tests/unit/test_canal.py writes them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from devservices.shop_monitor import findings, run_until_idle

from .conftest import cdc_toml, monitor_config_toml
from .kafka_fixtures import create_topic, kafka_admin, produce
from .test_cdc_clock import payment_shop_toml

SCHEMA = "canalshop"
TABLES = {"orders": f"{SCHEMA}.orders", "payments": f"{SCHEMA}.payments", "callbacks": f"{SCHEMA}.callbacks"}
TYPES = {"orders": {"order_no": "varchar(16)", "status": "varchar(16)", "amount": "decimal(12,2)"},
         "payments": {"trade_no": "varchar(16)", "order_no": "varchar(16)", "status": "varchar(16)",
                      "amount": "decimal(12,2)"},
         "callbacks": {"id": "int(11)", "trade_no": "varchar(16)", "status": "varchar(16)",
                       "amount": "decimal(12,2)"}}
KEYS = {"orders": "order_no", "payments": "trade_no", "callbacks": "id"}
ORDERS = 30
REPLAYED = range(10, 20)  # the orders whose transactions Canal sends again after its restart

__all__ = ["kafka_admin"]  # the fixture, imported so pytest finds it


def message(table: str, type_: str, data: list[dict], es: int, batch: int, old: list[dict] | None = None) -> dict:
    return {"data": data, "database": SCHEMA, "es": es, "id": batch, "isDdl": False, "mysqlType": TYPES[table],
            "old": old, "pkNames": [KEYS[table]], "sql": "", "sqlType": {}, "table": table, "ts": es + 40,
            "type": type_}


def shop_messages(start_ms: int) -> list[list[dict]]:
    """A shop's transactions as Canal sends them, one message per table changed: each order placed, then paid
    (payment, order update, the channel's callback); order 7 charged twice (F2), order 12's callback of another
    amount (F5)."""
    txs: list[list[dict]] = []
    for i in range(ORDERS):
        es, amount = start_ms + i * 200, f"{10 + i}.00"
        order = {"order_no": f"O{i}", "status": "pending", "amount": amount}
        txs.append([message("orders", "INSERT", [order], es, 2 * i + 1)])
        payments = [{"trade_no": f"T{i}", "order_no": f"O{i}", "status": "success", "amount": amount}]
        if i == 7:
            payments.append({"trade_no": f"T{i}b", "order_no": f"O{i}", "status": "success", "amount": amount})
        sent = f"{9 + i}.00" if i == 12 else amount
        txs.append([message("payments", "INSERT", payments, es + 100, 2 * i + 2),
                    message("orders", "UPDATE", [{**order, "status": "paid"}], es + 100, 2 * i + 2,
                            old=[{"status": "pending"}]),
                    message("callbacks", "INSERT", [{"id": str(i), "trade_no": f"T{i}", "status": "success",
                                                     "amount": sent}], es + 100, 2 * i + 2)])
    return txs


def canal_config(folder: Path, topic: str) -> Path:
    folder.mkdir()
    return monitor_config_toml(list(TABLES.values()), folder,
                               extra=cdc_toml(None, format="canal", topics=[topic]) + payment_shop_toml(TABLES))


def test_canal_s_replay_after_a_restart_is_applied_once_and_counted(kafka_admin, tmp_path):
    txs = shop_messages(int(time.time() * 1000) - 60_000)
    replayed = [tx for i, tx in enumerate(txs) if i // 2 in REPLAYED]
    # after its restart Canal sends them again in new batches, built anew; then goes on where it was
    again = [[{**m, "id": 1000 + k, "ts": m["ts"] + 5_000} for m in tx] for k, tx in enumerate(replayed)]
    sent = {"replayed": [m for tx in txs[:40] + again + txs[40:] for m in tx], "control": [m for tx in txs for m in tx]}
    configs = {}
    for name, messages in sent.items():
        topic = create_topic(kafka_admin, f"canal-{name}")
        produce(topic, [(0, None, json.dumps(m).encode()) for m in messages])
        configs[name] = canal_config(tmp_path / name, topic)
        run_until_idle(configs[name], idle=2.0)
    got = {f.id: (f.rule, f.status, f.keys.get("order"), f.summary) for f in findings(configs["replayed"])}
    want = {f.id: (f.rule, f.status, f.keys.get("order"), f.summary) for f in findings(configs["control"])}
    assert sorted((rule, order) for rule, _, order, _ in want.values()) == [("F2", "O7"), ("F5", "O12")], want
    replays = [f for f in findings(configs["replayed"]) if f.rule == "F15"]
    assert {k: v for k, v in got.items() if v[0] != "F15"} == want
    # one run of replayed records: the 10 orders' 40 messages, at the offsets they were sent again at
    assert [(r.keys["records"], r.keys["from_offset"], r.keys["to_offset"]) for r in replays] == [(40, 80, 119)]
