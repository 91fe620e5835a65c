"""CDC source mode's change clock from the connector's heartbeats (issue 42): how each heartbeat is placed among
the connector's records (`collectors.heartbeats.HeartbeatReader`) and what that vouches for
(`checks.clocks.heartbeat_watermark`). The run on the real connector, paused while the shop writes, is
tests/integration/test_cdc_clock.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import pytest

from oncewatch.checks.clocks import END_MARGIN, heartbeat_watermark
from oncewatch.checks.engine import Engine
from oncewatch.checks.settings import Settings
from oncewatch.collectors import heartbeats
from oncewatch.collectors.heartbeats import HeartbeatReader, heartbeat_time
from oncewatch.core.config import ConfigError, parse
from oncewatch.core.protocol import CdcStatus, ComponentHealth
from oncewatch.core.records import Heartbeat, Heartbeats
from oncewatch.monitor.entities import EntityIndex
from oncewatch.monitor.verdict import NO_HEARTBEATS, judge
from oncewatch.monitor.writer import Writer
from oncewatch.store import Store

TOPIC = "__debezium-heartbeat.cdc"
UNENDED = 30.0  # cdc.unended_transaction_seconds


@dataclass(frozen=True)
class Rec:
    value: bytes | None
    timestamp: int
    topic: str = TOPIC
    partition: int = 0
    offset: int = 0


def beat(sent_ms: int, with_schema: bool = True) -> Rec:
    """A heartbeat as the JsonConverter writes it, written at `sent_ms` (its ts_ms a few ms before)."""
    payload = {"ts_ms": sent_ms - 5}
    value = {"schema": {"type": "struct", "name": "io.debezium.connector.common.Heartbeat"},
             "payload": payload} if with_schema else payload
    return Rec(json.dumps(value).encode(), sent_ms)


def quiet(at: float) -> Heartbeat:
    return Heartbeat(at, 0, False)


# ---------------------------------------------------------------- what the heartbeats vouch for

def test_two_quiet_gaps_in_a_row_vouch_for_the_heartbeat_between_them():
    vouched, last = heartbeat_watermark([Heartbeat(10.0, -1, False), quiet(11.0), quiet(12.0), quiet(13.0)], None, UNENDED)
    assert (vouched, last) == (12.0, quiet(13.0))


def test_one_quiet_gap_vouches_for_nothing_a_reconnect_s_backlog_may_follow_it():
    """A heartbeat written on the first event after a reconnect has a quiet gap before it (nothing was read while
    cut off), and the backlog of what was committed meanwhile comes after it."""
    assert heartbeat_watermark([Heartbeat(10.0, -1, False), quiet(11.0)], None, UNENDED) == (None, quiet(11.0))
    assert heartbeat_watermark([Heartbeat(11.0, 40, False), quiet(12.0), Heartbeat(13.0, 7, False)], None, UNENDED)[0] is None


def test_records_between_or_a_transaction_open_are_not_quiet():
    busy = [Heartbeat(10.0, 3, False), Heartbeat(11.0, 5, False), Heartbeat(12.0, 2, False)]
    assert heartbeat_watermark(busy, None, UNENDED)[0] is None
    # a large transaction of a table the monitor does not read streams between heartbeats: its BEGIN is open
    assert heartbeat_watermark([Heartbeat(11.0, 0, True, 1.0), Heartbeat(12.0, 0, True, 2.0)], quiet(10.0), UNENDED)[0] is None


def test_a_transaction_left_open_and_quiet_for_the_unended_time_is_taken_as_ended():
    """A DDL's BEGIN has no END (Debezium writes one only at a commit): the clock stood still on a shop gone quiet
    after one, until the next transaction began (seen in the chaos soak after a CREATE USER)."""
    beats = [Heartbeat(40.0 + i, 0, True, 10.0 + i) for i in range(22)]
    assert heartbeat_watermark(beats[:21], None, UNENDED)[0] is None  # quiet for up to 30 s: one gap, held
    assert heartbeat_watermark(beats, None, UNENDED)[0] == 60.0  # 30 s and 31 s in a row: the first vouches
    # records between keep it held whatever the time: the transaction is streaming
    assert heartbeat_watermark([Heartbeat(70.0, 3, True, 0.0), Heartbeat(71.0, 0, True, 31.0)], None,
                               UNENDED)[0] is None


def test_an_end_before_a_heartbeat_vouches_for_just_before_its_binlog_time_whatever_lies_between():
    """Another schema's traffic puts its BEGINs and ENDs (event_count 0) between every two heartbeats: no gap is
    quiet, and before, the clock stood at the shop's last commit for as long as that traffic went on."""
    busy = [Heartbeat(20.4, 86, False, 0.0, 18.0), Heartbeat(21.4, 90, True, 0.0, 19.0),
            Heartbeat(22.4, 88, False, 0.0, 21.0)]
    assert heartbeat_watermark(busy, quiet(19.4), UNENDED) == (21.0 - END_MARGIN, busy[-1])
    assert heartbeat_watermark(busy[:1], None, UNENDED)[0] == 18.0 - END_MARGIN
    # the quiet rule and the ENDs together: the later of what they vouch for
    assert heartbeat_watermark([Heartbeat(30.0, 0, False, 0.0, 25.0), Heartbeat(31.0, 0, False, 0.0, 25.0)],
                               quiet(29.0), UNENDED)[0] == 30.0
    assert heartbeat_watermark([Heartbeat(30.0, 4, False)], quiet(29.0), UNENDED)[0] is None  # no END read yet


def test_the_last_heartbeat_carries_over_to_the_next_call():
    vouched, last = heartbeat_watermark([quiet(11.0)], None, UNENDED)
    assert vouched is None
    assert heartbeat_watermark([quiet(12.0)], last, UNENDED) == (11.0, quiet(12.0))


# ---------------------------------------------------------------- heartbeats placed among the records

def test_heartbeats_are_placed_by_their_kafka_timestamps_a_tie_counted_between():
    r = HeartbeatReader(TOPIC)
    r.on_heartbeat(beat(1000))
    r.on_heartbeat(beat(2000))
    r.on_heartbeat(beat(3000))
    r.on_heartbeat(beat(4000))
    r.on_record(2500)  # between the second and the third
    r.on_record(4000)  # the same millisecond as the fourth: it may have been written before it
    assert r.take() == [Heartbeat(0.995, -1, False), Heartbeat(1.995, 0, False), Heartbeat(2.995, 1, False),
                        Heartbeat(3.995, 1, False)]
    r.on_heartbeat(beat(5000))
    assert r.take() == [Heartbeat(4.995, 1, False)]  # the tie is also between the fourth and the fifth
    r.on_heartbeat(beat(6000))
    assert r.take() == [Heartbeat(5.995, 0, False)]
    assert r.take() == [] and r.read == 6


def test_a_record_read_after_the_heartbeat_it_was_written_before_is_still_between():
    """Partitions are fetched apart: a record written before a heartbeat may be read after it, but before `take`
    (every partition read to its end)."""
    r = HeartbeatReader(TOPIC)
    r.on_heartbeat(beat(1000))
    r.on_heartbeat(beat(2000))
    r.on_record(1500)
    assert [b.between for b in r.take()] == [-1, 1]


def test_a_transaction_open_at_a_heartbeat_follows_the_markers_in_the_order_read():
    r = HeartbeatReader(TOPIC)
    r.on_record(900, open_after=True)  # a BEGIN
    r.on_heartbeat(beat(1000))
    r.on_record(1500, open_after=True)  # a BEGIN and its END in one millisecond, as the connector sends them
    r.on_record(1500, open_after=False)
    r.on_heartbeat(beat(2000))
    r.on_heartbeat(beat(3000))
    assert [(b.open, b.open_quiet) for b in r.take()] == [(True, 0.1), (False, 0.0), (False, 0.0)]
    r.on_record(3500, open_after=True)  # a DDL's BEGIN, which has no END: open until the next marker
    r.on_heartbeat(beat(4000))
    r.on_heartbeat(beat(5000))
    assert [(b.open, b.open_quiet) for b in r.take()] == [(True, 0.5), (True, 1.5)]  # since the BEGIN was written
    r.on_record(5200)  # a row of it: the quiet counts from there
    r.on_heartbeat(beat(6000))
    assert [(b.open, b.open_quiet) for b in r.take()] == [(True, 0.8)]
    r.on_heartbeat(beat(7000))
    assert [(b.open, b.open_quiet) for b in r.take()] == [(True, 1.8)]


def test_each_heartbeat_carries_the_newest_end_written_before_it_and_the_next_take_goes_on_from_it():
    """An END read before a heartbeat written earlier (partitions are fetched apart) is placed by its timestamp."""
    r = HeartbeatReader(TOPIC)
    r.on_heartbeat(beat(1000))
    r.on_record(1100, open_after=True, newest_end=0.0)  # a BEGIN
    r.on_record(1200, open_after=False, newest_end=0.0)  # its END: no time yet (an older Debezium's markers)
    r.on_heartbeat(beat(2000))
    r.on_record(2100, open_after=True, newest_end=0.0)
    r.on_record(2300, open_after=False, newest_end=2.0)  # an END of a transaction stamped second 2
    r.on_heartbeat(beat(3000))
    r.on_record(3500, open_after=True, newest_end=2.0)
    r.on_record(3600, open_after=False, newest_end=3.0)
    r.on_record(2400)  # a record written before the third heartbeat, read after the END past it
    assert [(b.between, b.ended) for b in r.take()] == [(-1, 0.0), (2, 0.0), (3, 2.0)]
    r.on_heartbeat(beat(4000))
    r.on_heartbeat(beat(5000))
    assert [(b.between, b.ended) for b in r.take()] == [(2, 3.0), (0, 3.0)]


def test_records_past_the_kept_count_still_make_their_gaps_busy(monkeypatch):
    monkeypatch.setattr(heartbeats, "TIMES_KEPT", 3)
    r = HeartbeatReader(TOPIC)
    r.on_heartbeat(beat(1000))
    assert [b.between for b in r.take()] == [-1]
    for t in (1100, 1200, 1300, 1400):  # heartbeats stopped while the records went on: their span is kept
        r.on_record(t)
    r.on_heartbeat(beat(2000))
    r.on_heartbeat(beat(3000))
    assert [b.between for b in r.take()] == [1, 0]


def test_a_heartbeat_value_is_read_with_or_without_its_schema_and_anything_else_is_counted():
    assert heartbeat_time(beat(2000).value) == heartbeat_time(beat(2000, with_schema=False).value) == 1.995
    r = HeartbeatReader(TOPIC)
    r.on_heartbeat(Rec(b"not json", 1000))
    r.on_heartbeat(Rec(b'{"payload": {"ts": 1}}', 1000))
    r.on_heartbeat(Rec(None, 1000))  # a tombstone: nothing
    assert (r.read, r.unreadable, r.take()) == (0, 2, [])


# ---------------------------------------------------------------- the config and what the monitor says

def cdc_config(**cdc: object):
    return parse({"mysql": {"host": "127.0.0.1", "tables": ["shop.orders"]},
                  "kafka": {"bootstrap_servers": ["127.0.0.1:9092"],
                            "topics": [{"name": "shop.events", "format": "json", "required": []}]},
                  "store": {"path": ":memory:"},
                  "cdc": {"topic_prefix": "cdc", **cdc}})


def test_the_heartbeat_topic_is_debezium_s_default_unless_named_and_capture_seconds_is_gone():
    assert cdc_config().cdc.heartbeat_topic == TOPIC
    assert cdc_config(heartbeat_topic="beats.cdc").cdc.heartbeat_topic == "beats.cdc"
    assert cdc_config(heartbeat_topic="").cdc.heartbeat_topic == ""
    with pytest.raises(ConfigError, match=r"^cdc.capture_seconds: no longer read: .* heartbeat.interval.ms"):
        cdc_config(capture_seconds=5)


def test_a_cdc_source_behind_without_heartbeats_says_why_its_clock_stands():
    source = ComponentHealth(CdcStatus(connected=True, source="debezium", heartbeats_read=0))
    v = judge(100.0, {"binlog": source}, {"binlog": 30.0}, caught_up_seconds=5)
    assert v.verdict == "degraded" and v.reasons == ("binlog read 30.0 s behind (caught up means within 5 s)"
                                                     + NO_HEARTBEATS,)
    v = judge(100.0, {"binlog": ComponentHealth(replace(source.status, heartbeats_read=40))}, {"binlog": 30.0},
              caught_up_seconds=5)
    assert NO_HEARTBEATS not in v.reasons[0]


def test_the_writer_s_change_clock_in_cdc_source_mode_moves_by_heartbeats_never_by_the_host_s_clock(tmp_path):
    """Read to the topics' ends (caught up), the clock the engine judges F3 and F8 on stays at what the commits and
    heartbeats vouched for; before, it was now - capture_seconds."""
    cfg = cdc_config()
    settings = Settings.from_config(cfg)
    engine = TickedEngine(settings)
    store = Store(str(tmp_path / "store.db"))
    writer = Writer(cfg, store, engine, EntityIndex(settings))
    writer.progress.binlog_caught_up = True
    writer.apply([Heartbeats((Heartbeat(50.0, -1, False), quiet(51.0), quiet(52.0)))], None)
    writer.apply([], None)
    assert writer.progress.binlog_time == 51.0 and engine.binlog_times == [51.0, 51.0]
    store.close()


class TickedEngine(Engine):
    """The engine, with the change clock of every tick kept."""

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.binlog_times: list[float] = []

    def tick(self, now: float, binlog_time: float, kafka_time: float,
             backlog_elsewhere: dict[str, int] | None = None) -> None:
        self.binlog_times.append(binlog_time)
        super().tick(now, binlog_time, kafka_time, backlog_elsewhere)
