"""Synthetic records in the shape of examples/shop.toml, for the rule tests and bench/engine.py.

`Shop` hands out binlog coordinates (GTID, file position) and Kafka offsets in order, the
way the collectors would, so tests read like the story they tell:

    shop = Shop()
    tx = shop.tx(100.0, order("O1", "paid", was="pending"), payment("T1", "O1", "success"))
    ev = shop.event("order.paid", 100.2, order_no="O1")
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path
from typing import Any

from oncewatch.checks.engine import Engine
from oncewatch.checks.settings import Settings
from oncewatch.core.config import load
from oncewatch.core.records import (CLOCK_GTID_COMMIT_TS, OP_DELETE, OP_INSERT, OP_UPDATE, BinlogPosition,
                                    EmittedEvent, Finding, RowChange, SchemaChange, Transaction)

SCHEMA = "shop"
# table -> primary key column
PRIMARY_KEYS = {"orders": "order_no", "payments": "trade_no", "shipments": "shipment_id",
                "points_grants": "grant_id", "refunds": "refund_id"}
# payload field -> logical key, as [kafka.topics.paths] of examples/shop.toml
PATHS = {"type": "event_type", "order_no": "order_key", "trade_no": "trade_no", "entity_id": "effect_id",
         "amount": "amount", "status": "status"}

RowSpec = tuple[str, str, dict[str, Any] | None, dict[str, Any] | None]  # table, op, before, after
EXAMPLE_CONFIG = Path(__file__).resolve().parents[1] / "examples" / "shop.toml"


def shop_settings(**rules: Any) -> Settings:
    """The settings of examples/shop.toml, with some [rules] thresholds changed."""
    settings = Settings.from_config(load(EXAMPLE_CONFIG))
    return dataclasses.replace(settings, rules=dataclasses.replace(settings.rules, **rules))


def _row(table: str, after: dict[str, Any], was: dict[str, Any] | None) -> RowSpec:
    return (table, OP_INSERT if was is None else OP_UPDATE, None if was is None else {**after, **was}, after)


def order(no: str, status: str, amount: str = "10.00", was: str | None = None) -> RowSpec:
    return _row("orders", {"order_no": no, "status": status, "amount": Decimal(amount)},
                None if was is None else {"status": was})


def payment(trade_no: str, order_no: str, status: str, amount: str = "10.00", callback: str | None = "success",
            was: str | None = None) -> RowSpec:
    return _row("payments", {"trade_no": trade_no, "order_no": order_no, "status": status, "amount": Decimal(amount),
                             "callback_status": callback}, None if was is None else {"status": was})


def shipment(shipment_id: str, trade_no: str) -> RowSpec:
    return _row("shipments", {"shipment_id": shipment_id, "trade_no": trade_no}, None)


def grant(grant_id: str, trade_no: str) -> RowSpec:
    return _row("points_grants", {"grant_id": grant_id, "trade_no": trade_no}, None)


def deleted(row: RowSpec) -> RowSpec:
    """The delete of the row `row` wrote."""
    table, _, _, after = row
    return (table, OP_DELETE, after, None)


class Shop:
    def __init__(self) -> None:
        self.seq = 0
        self.pos = 4
        self.offsets: dict[tuple[str, int], int] = {}

    def tx(self, at: float, *rows: RowSpec, snapshot: bool = False, clock: str = CLOCK_GTID_COMMIT_TS) -> Transaction:
        self.seq += 1
        txid = f"0-1-{self.seq}"
        changes = []
        for i, (table, op, before, after) in enumerate(rows):
            self.pos += 100
            image = after if after is not None else before
            changes.append(RowChange(schema=SCHEMA, table=table, op=op, pk=(image[PRIMARY_KEYS[table]],),
                                     before=before, after=after, txid=txid, row_index=i, binlog_file="bin.000001",
                                     end_pos=self.pos, commit_time=at, commit_clock=clock, snapshot=snapshot))
        return Transaction(rows=tuple(changes), position=BinlogPosition(txid, "bin.000001", self.pos), commit_time=at)

    def truncate(self, at: float, table: str) -> Transaction:
        """A TRUNCATE of `table` (schema.table) as the collectors hand it on: a transaction with no rows."""
        tx = self.tx(at)
        return dataclasses.replace(tx, schema_changes=(SchemaChange(
            table=table, kind="truncate", statement=f"TRUNCATE {table}", columns={}, txid=tx.position.gtid,
            binlog_file=tx.position.file, pos=tx.position.pos),))

    def event(self, event_type: str, at: float, *, partition: int = 0, topic: str = "shop.events",
              **fields: Any) -> EmittedEvent:
        offset = self.offsets.get((topic, partition), 0)
        self.offsets[topic, partition] = offset + 1
        payload = {"type": event_type, **fields}
        return EmittedEvent(topic=topic, partition=partition, offset=offset, timestamp_ms=round(at * 1000),
                            timestamp_type="CreateTime", key=None, headers=(), payload=payload, format="json",
                            keys={PATHS[k]: v for k, v in payload.items() if k in PATHS})


def push(engine: Engine, *records: Transaction | EmittedEvent) -> None:
    """Hand records to the engine in the given order."""
    for r in records:
        if isinstance(r, Transaction):
            engine.on_transaction(r)
        else:
            engine.on_events([r])


def feed(engine: Engine, *records: Transaction | EmittedEvent) -> list[Finding]:
    """`push`, then return what the engine drained."""
    push(engine, *records)
    return engine.drain()


def rules_of(findings: list[Finding]) -> list[str]:
    return sorted(f.rule for f in findings)
