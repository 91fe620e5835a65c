"""Helpers for the Kafka collector tests on the dev broker: unique topics, producing, draining."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from devservices import base
from oncewatch.collectors.kafka_events import KafkaEventCollector
from oncewatch.core.config import KafkaConfig, TopicConfig
from oncewatch.core.protocol import EventBatch
from oncewatch.core.records import EmittedEvent, QuarantinedRecord
from oncewatch.store import Store

BOOTSTRAP = f"{base.HOST}:{base.KAFKA_PORT}"
JSON_PATHS = {"event_type": "type", "order_key": "order_no", "trade_no": "trade_no", "amount": "amount",
              "status": "status", "effect_id": "entity_id"}


def unique(purpose: str) -> str:
    return f"owtest.{purpose}.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def kafka_admin() -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP, request_timeout_ms=10_000)
    yield admin
    admin.close()


def create_topic(admin: KafkaAdminClient, purpose: str, partitions: int = 1) -> str:
    name = unique(purpose)
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    admin.wait_for_topics([name], timeout_ms=10_000)
    return name


class UndecodableKey(str):
    """A header key whose bytes on the wire are not UTF-8: kafka-python's producer only sends str keys
    (encoded as UTF-8), so this one lies about its encoding to put such bytes on the real broker."""

    def encode(self, *_: object, **__: object) -> bytes:
        return b"\xff\xfekey"


def produce(topic: str, records: list[tuple[int, bytes | None, bytes | None]],
            headers: list[tuple[str, bytes]] | None = None) -> list[tuple[int, int, int]]:
    """Send (partition, key, value) records in order; returns their (partition, offset, timestamp ms)."""
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", max_request_size=4 * 1024 * 1024)
    try:
        meta = [producer.send(topic, key=k, value=v, partition=p, headers=headers).get(timeout=30)
                for p, k, v in records]
    finally:
        producer.close()
    return [(m.partition, m.offset, m.timestamp) for m in meta]


def jsonb(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def kafka_config(topics: list[TopicConfig], **overrides: Any) -> KafkaConfig:
    settings: dict[str, Any] = {
        "bootstrap_servers": (BOOTSTRAP,), "client_id": "owtest", "topics": tuple(topics), "consumer_groups": (),
        "max_record_bytes": 1_048_576, "offsets_poll_seconds": 0.5, "request_timeout_seconds": 5.0,
        "start_from": "earliest", "metadata_refresh_seconds": 0.3, "lag_history_points": 60}
    return KafkaConfig(**{**settings, **overrides})


def json_topic(name: str, required: tuple[str, ...] = ("event_type",)) -> TopicConfig:
    return TopicConfig(name=name, format="json", paths=dict(JSON_PATHS), required=required)


def write(store: Store, batch: EventBatch) -> None:
    """What the monitor does with a batch: records, quarantine and checkpoint in one transaction."""
    with store.batch() as tx:
        tx.add_events(batch.events)
        tx.add_quarantined(batch.quarantined)
        tx.set_checkpoint("kafka_events", batch.positions)


def poll_into(collector: KafkaEventCollector, store: Store | None, max_records: int = 500) -> EventBatch:
    batch = collector.poll(timeout_ms=200, max_records=max_records)
    if store is not None and (batch.events or batch.quarantined or batch.positions_changed):
        write(store, batch)
    return batch


def drain(collector: KafkaEventCollector, records: int, *, store: Store | None = None, timeout: float = 20.0,
          max_records: int = 500) -> tuple[list[EmittedEvent], list[QuarantinedRecord]]:
    """Poll until `records` records (events + quarantined) came back, failing after `timeout`."""
    events: list[EmittedEvent] = []
    quarantined: list[QuarantinedRecord] = []
    deadline = time.monotonic() + timeout
    while len(events) + len(quarantined) < records:
        assert time.monotonic() < deadline, (f"read {len(events)} events + {len(quarantined)} quarantined of "
                                             f"{records}; status {collector.status()}")
        batch = poll_into(collector, store, max_records)
        events += batch.events
        quarantined += batch.quarantined
    return events, quarantined


def wait_for(predicate: Any, what: str, collector: KafkaEventCollector, store: Store | None = None,
             timeout: float = 20.0) -> None:
    """Poll the collector (storing what it reads) until `predicate()` holds: it only changes when polled."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}; status {collector.status()}"
        poll_into(collector, store)


def resume_and_check_exactly_once(cfg: KafkaConfig, store: Store, sent: list[tuple[int, int, int]]) -> None:
    """A new collector started from the store's checkpoint reads the rest; every sent record is then
    in the store exactly once (its primary key would refuse a second copy)."""
    resumed = KafkaEventCollector(cfg, store.checkpoint("kafka_events"))
    try:
        drain(resumed, len(sent) - len(store.events()), store=store)
        assert sorted((e.partition, e.offset) for e in store.events()) == sorted((p, o) for p, o, _ in sent)
        assert resumed.caught_up()
    finally:
        resumed.close()
