"""Events/s of the Kafka events collector against a bare kafka-python consume loop over one topic.

Produces N JSON events (the shape of the shop's events) to a fresh topic on the dev broker, then
reads them back RUNS times with each loop, alternating which goes first, and prints the medians
and their ratio (collector / bare). The collector loop does what the monitor does with every
batch: poll, parse, key extraction, and one store transaction with the events, their entity
index entries, the quarantine and the checkpoint (SQLite in a temp dir). Both loops use the same
client settings and batch size, and both are timed from the end of their first batch to the last
record, by the wall clock and by the process's CPU time (all threads): events/s is the rate of
steady reading, and the one-off start-up (connections, the first fetch, and for the collector its
admin client and topic discovery, about 0.1 s more) is printed on its own. The process runs with
the monitor's garbage-collector settings (`oncewatch.monitor.tune_gc`), which both loops share. On
a machine shared with other work the wall-clock rates swing with the load; the CPU-time rates are
the steadier comparison.
Target (issue 16): ratio >= 0.5 per CPU-second against the bare loop with crc32c installed (without it
the bare loop spends most of its time on the CRC in Python). Usage:

    .venv/bin/python bench/kafka_ingest.py [--events 50000] [--partitions 3] [--runs 5] [--batch 500]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402
from kafka.admin import NewTopic  # noqa: E402

from devservices import base  # noqa: E402
from devservices.samples import shop_settings  # noqa: E402
from oncewatch.collectors.kafka_events import KafkaEventCollector, client_settings  # noqa: E402
from oncewatch.core.config import KafkaConfig, TopicConfig  # noqa: E402
from oncewatch.monitor import EntityIndex, tune_gc  # noqa: E402
from oncewatch.store import Store  # noqa: E402

BOOTSTRAP = f"{base.HOST}:{base.KAFKA_PORT}"
PATHS = {"event_type": "type", "order_key": "order_no", "trade_no": "trade_no", "amount": "amount",
         "status": "status", "effect_id": "entity_id"}


def produce(topic: str, events: int, partitions: int) -> None:
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP, linger_ms=20, batch_size=256 * 1024, acks=1)
    for i in range(events):
        body = {"type": "order.paid", "order_no": f"O{i:08d}", "trade_no": f"T{i:08d}", "entity_id": i,
                "amount": f"{i % 10000}.{i % 100:02d}", "status": "paid", "channel": "alipay",
                "paid_at": "2026-01-01T12:00:00.123Z", "meta": {"trace": uuid.uuid4().hex, "attempt": 1}}
        producer.send(topic, key=body["order_no"].encode(), value=json.dumps(body).encode(), partition=i % partitions)
    producer.flush()
    producer.close()


def config(topic: str) -> KafkaConfig:
    return KafkaConfig(bootstrap_servers=(BOOTSTRAP,), client_id="oncewatch-bench",
                       topics=(TopicConfig(topic, "json", PATHS, ("event_type",)),), consumer_groups=(),
                       max_record_bytes=1_048_576, offsets_poll_seconds=5.0, request_timeout_seconds=10.0,
                       start_from="earliest")


@dataclass(frozen=True)
class Rate:
    wall: float  # events per second of wall-clock time
    cpu: float  # events per second of process CPU time
    startup: float  # seconds from creating the client to the end of the first batch


class Stopwatch:
    """Times a loop's steady reading: from the end of its first batch (connections, topic discovery
    and the first fetch done) to the last record. The first batch's records are not counted."""

    def __init__(self) -> None:
        self.created = time.perf_counter()
        self.start: tuple[float, float] | None = None
        self.events = 0

    def batch_done(self, records: int) -> None:
        if self.start is None:
            if records:
                self.start = (time.perf_counter(), time.process_time())
        else:
            self.events += records

    def rate(self) -> Rate:
        assert self.start is not None and self.events, "no records after the first batch"
        wall, cpu = time.perf_counter() - self.start[0], time.process_time() - self.start[1]
        return Rate(self.events / wall, self.events / cpu, self.start[0] - self.created)


def bare_loop(cfg: KafkaConfig, topic: str, partitions: int, expected: int, batch: int) -> Rate:
    watch = Stopwatch()
    consumer = KafkaConsumer(**client_settings(cfg), group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    consumer.seek_to_beginning()
    n = 0
    while n < expected:
        got = sum(len(recs) for recs in consumer.poll(timeout_ms=500, max_records=batch).values())
        watch.batch_done(got)
        n += got
    rate = watch.rate()
    consumer.close(autocommit=False)
    return rate


def entity_index(topic: str) -> EntityIndex:
    """The monitor's entity index for examples/shop.toml, its announcements moved to the bench's topic."""
    settings = shop_settings()
    return EntityIndex(dataclasses.replace(settings, announce=tuple(
        dataclasses.replace(a, topic=topic) for a in settings.announce)))


def collector_loop(cfg: KafkaConfig, expected: int, batch: int) -> Rate:
    index = entity_index(cfg.topics[0].name)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(str(Path(tmp) / "bench.db"))
        watch = Stopwatch()
        collector = KafkaEventCollector(cfg)
        n = 0
        while n < expected:
            b = collector.poll(timeout_ms=500, max_records=batch)
            entities = [(i, k) for i, e in enumerate(b.events) for k in index.of_event(e)]  # as the monitor
            with store.batch() as tx:
                tx.add_events(b.events, entities)
                tx.add_quarantined(b.quarantined)
                tx.set_checkpoint("kafka_events", b.positions)
            watch.batch_done(len(b.events) + len(b.quarantined))
            n += len(b.events) + len(b.quarantined)
        rate = watch.rate()
        collector.close()
        stored = store.count("events")
        store.close()
    if stored != expected:
        raise SystemExit(f"the collector stored {stored} events, expected {expected}")
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=500, help="max records per poll, both loops")
    args = ap.parse_args()

    tune_gc()  # the monitor's process settings, for both loops
    topic = f"owbench.kafka.{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    admin.create_topics([NewTopic(topic, num_partitions=args.partitions, replication_factor=1)])
    t0 = time.perf_counter()
    produce(topic, args.events, args.partitions)
    print(f"produced {args.events} events to {topic} ({args.partitions} partitions) in "
          f"{time.perf_counter() - t0:.1f} s")
    cfg = config(topic)
    bare, ours = [], []
    try:
        for run in range(args.runs):
            if run % 2 == 0:
                bare.append(bare_loop(cfg, topic, args.partitions, args.events, args.batch))
                ours.append(collector_loop(cfg, args.events, args.batch))
            else:
                ours.append(collector_loop(cfg, args.events, args.batch))
                bare.append(bare_loop(cfg, topic, args.partitions, args.events, args.batch))
            print(f"run {run + 1}: bare {bare[-1].wall:,.0f} events/s ({bare[-1].cpu:,.0f} per CPU-s), "
                  f"collector {ours[-1].wall:,.0f} events/s ({ours[-1].cpu:,.0f} per CPU-s), "
                  f"ratio {ours[-1].wall / bare[-1].wall:.2f} ({ours[-1].cpu / bare[-1].cpu:.2f} by CPU time)")
    finally:
        admin.delete_topics([topic])
        admin.close()
    print(f"start-up to the end of the first batch, median: bare {statistics.median(r.startup for r in bare):.3f} s, "
          f"collector {statistics.median(r.startup for r in ours):.3f} s (its admin client and topic discovery)")
    print(f"median over {args.runs} runs (target ratio >= 0.5 per CPU-second):")
    for clock in ("wall", "cpu"):
        b = statistics.median(getattr(r, clock) for r in bare)
        o = statistics.median(getattr(r, clock) for r in ours)
        unit = "events/s" if clock == "wall" else "events per CPU-second"
        print(f"  {clock:4}: bare kafka-python loop {b:,.0f} {unit}, collector (poll, parse, keys, store, "
              f"checkpoint) {o:,.0f} {unit}, ratio {o / b:.2f}")


if __name__ == "__main__":
    main()
