"""One lifecycle for every part that reads (issue 44, One protocol): each is configured by its constructor without
I/O, answers start(), items(stop), stop(), close(), status() and alive_at(), and its status is a frozen value the
store keeps as it is; the Reader drives any such part, whatever it reads."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from oncewatch.collectors import binlog, kafka_events, kafka_offsets
from oncewatch.core.config import parse
from oncewatch.core.records import BinlogPosition

LIFECYCLE = ("start", "items", "stop", "close", "status", "alive_at")


def config():
    return parse({"mysql": {"host": "127.0.0.1", "port": 9, "tables": ["shop.orders"]},
                  "kafka": {"bootstrap_servers": ["127.0.0.1:9"],
                            "topics": [{"name": "shop.events", "format": "json", "required": []}],
                            "consumer_groups": ["shipping-service"]},
                  "store": {"path": ":memory:"},
                  "cdc": {"topic_prefix": "cdc"}})


def parts() -> dict[str, object]:
    """The five parts the monitor runs, configured as its factories configure them."""
    from oncewatch.collectors.cdc import read

    cfg = config()
    return {"binlog": binlog.BinlogCollector(cfg.mysql, BinlogPosition("0-1-5", "bin.000001", 4)),
            "bootstrap": binlog.Bootstrap(cfg.mysql),
            "cdc": read.CdcCollector(cfg.mysql, cfg.kafka, cfg.cdc, copies=True),
            "kafka_events": kafka_events.KafkaEventCollector(cfg.kafka, None, hold=frozenset),
            "kafka_offsets": kafka_offsets.KafkaOffsetsCollector(cfg.kafka)}


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a part connected while it was configured: {args}")
    monkeypatch.setattr(socket.socket, "connect", refused)
    monkeypatch.setattr(socket.socket, "connect_ex", refused)


def test_every_reading_part_is_configured_without_io_and_says_its_status_as_a_frozen_value(no_network) -> None:
    from oncewatch.core.protocol import (BinlogStatus, BootstrapStatus, CdcStatus, ComponentHealth, KafkaEventsStatus,
                                         Part)
    from oncewatch.core.records import OffsetsSnapshot
    from oncewatch.store.codec import health_from_json, health_json

    built = parts()
    missing = {name: [m for m in LIFECYCLE if not callable(getattr(part, m, None))] for name, part in built.items()}
    assert missing == {name: [] for name in built}, "parts driven each its own way"
    expected = {"binlog": BinlogStatus, "bootstrap": BootstrapStatus, "cdc": CdcStatus,
                "kafka_events": KafkaEventsStatus, "kafka_offsets": OffsetsSnapshot}
    for name, part in built.items():
        assert isinstance(part, Part), name
        status = part.status()
        assert type(status) is expected[name], name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(status, dataclasses.fields(status)[0].name, None)
        assert health_from_json(health_json(ComponentHealth(status))) == ComponentHealth(status), name
        assert part.alive_at() is None, name  # nothing read yet
    assert built["binlog"].status().last_position == BinlogPosition("0-1-5", "bin.000001", 4)
    assert built["bootstrap"].status().bootstrapping


class Counting:
    """A part that reads three numbers, then waits to be stopped; it notes what the reader asked of it."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._alive: float | None = None

    def start(self) -> None:
        self.calls.append("start")

    def items(self, stop: threading.Event) -> Iterator[int]:
        for i in range(3):
            self._alive = time.time()
            yield i
        stop.wait()

    def stop(self) -> None:
        self.calls.append("stop")

    def close(self) -> None:
        self.calls.append("close")

    def status(self) -> str:
        return "counting"

    def alive_at(self) -> float | None:
        return self._alive


def test_the_reader_drives_any_part_through_the_lifecycle() -> None:
    from oncewatch.monitor.readers import Reader

    part, got, three = Counting(), [], threading.Event()

    def put(item: object, stop: threading.Event) -> None:
        got.append(item)
        if len(got) == 3:
            three.set()

    reader = Reader("counting", lambda: part, put)
    assert part.calls == [] and reader.part is None  # configured: nothing built, nothing started
    reader.start()
    assert three.wait(10) and got == [0, 1, 2]
    assert reader.running and reader.health().alive_at is not None
    reader.stop()
    reader.join(10)
    assert part.calls == ["start", "stop", "close"] and not reader.running and got == [0, 1, 2]
