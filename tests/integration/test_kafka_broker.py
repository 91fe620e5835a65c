"""The dev stack's Kafka broker really takes and gives records (its collectors have their own tests)."""

from __future__ import annotations

import uuid

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from devservices import base

BOOTSTRAP = f"{base.HOST}:{base.KAFKA_PORT}"


def test_produce_and_consume_round_trip():
    topic = f"owtest.smoke.{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all")
    sent = [producer.send(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2).get(timeout=30)
            for i in range(20)]
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False, consumer_timeout_ms=5000)
    consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    consumer.seek_to_beginning()
    got = {(r.partition, r.offset): (r.key, r.value) for r in consumer}
    consumer.close()
    assert got == {(m.partition, m.offset): (f"k{i}".encode(), f"v{i}".encode()) for i, m in enumerate(sent)}
