"""The dev broker restarted under a reading collector, then the collector restarted from its
checkpoint: every record lands in the store exactly once."""

from __future__ import annotations

import time

import pytest
from kafka import errors as kerrors

from devservices import broker
from oncewatch.collectors.kafka_events import KafkaEventCollector
from oncewatch.store import Store
from tests.integration.kafka_fixtures import (create_topic, drain, json_topic, jsonb, kafka_admin, kafka_config,
                                              produce, resume_and_check_exactly_once, wait_for)

__all__ = ["kafka_admin"]


def records(tag: str, n: int) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(i % 2, None, jsonb({"type": "order.paid", "order_no": f"{tag}{i}"})) for i in range(n)]


def produce_when_back(topic: str, batch: list, timeout: float = 60.0) -> list[tuple[int, int, int]]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return produce(topic, batch)
        except kerrors.KafkaError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.integration
def test_broker_restart_and_collector_restart_mid_stream_lose_and_double_nothing(kafka_admin, tmp_path):
    topic = create_topic(kafka_admin, "restart", 2)
    kafka_admin.close()  # the broker goes away below; this client is not needed any more
    sent = produce(topic, records("a", 20))
    store = Store(str(tmp_path / "store.db"))
    cfg = kafka_config([json_topic(topic)])
    collector = KafkaEventCollector(cfg)
    try:
        drain(collector, 10, store=store, max_records=5)
        try:
            broker.kafka_down()
            wait_for(lambda: not collector.status().connected, "the collector notices the broker is gone", collector,
                     store)
            assert collector.status().last_error and collector.status().disconnected_since
        finally:
            broker.kafka_up()
        sent += produce_when_back(topic, records("b", 20))
        drain(collector, len(sent) - len(store.events()), store=store, timeout=60)  # reads on across the restart
        wait_for(lambda: collector.status().connected, "the collector reports the broker back", collector, store)
        assert collector.status().reconnects >= 1 and collector.status().last_error is None
    finally:
        collector.close()
    sent += produce(topic, records("c", 10))
    try:
        resume_and_check_exactly_once(cfg, store, sent)
    finally:
        store.close()
