"""Writes a test makes by hand beside the shop: SQL in the test schema, an event on a topic."""

from __future__ import annotations

import json

from kafka import KafkaProducer

from devservices import base
from devservices.shop_monitor import SCHEMA

from .conftest import admin_connection


def execute(*statements: str) -> None:
    conn = admin_connection(SCHEMA)
    try:
        with conn.cursor() as c:
            for sql in statements:
                c.execute(sql)
    finally:
        conn.close()


def announce(topic: str, *payloads: dict) -> None:
    """Each payload as the shop would send it (keyed by its order_no), acknowledged before the next."""
    producer = KafkaProducer(bootstrap_servers=f"{base.HOST}:{base.KAFKA_PORT}")
    for payload in payloads:
        producer.send(topic, key=payload["order_no"].encode(), value=json.dumps(payload).encode()).get(timeout=30)
    producer.close()


def effect_event(event_type: str, entity_id: int) -> dict:
    """A well-formed shipment.created / points.granted payload of examples/shop.toml for row `entity_id`."""
    return {"type": event_type, "order_no": f"O-{entity_id}", "trade_no": f"T-{entity_id}",
            "entity_id": str(entity_id), "amount": "10.00", "status": "created"}
