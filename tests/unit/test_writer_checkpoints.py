"""The writer's checkpoints (issue 44): the engine judges every batch, the store saves on a cadence.

Between checkpoints nothing applied is in the store, so a kill -9 replays it from the last one; a new
finding is saved at once, with the records and the engine's state behind it; a clean stop saves all.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from devservices.samples import EXAMPLE_CONFIG, Shop, order, payment
from oncewatch.checks.engine import Engine
from oncewatch.checks.settings import Settings
from oncewatch.core.config import load
from oncewatch.core.exact_json import from_json, to_json
from oncewatch.core.names import BINLOG_CHECKPOINT
from oncewatch.core.protocol import BrokerKnown, EndKnown, KafkaEventsStatus
from oncewatch.core.records import PartitionStatus
from oncewatch.monitor.entities import EntityIndex
from oncewatch.monitor.writer import Writer
from oncewatch.store import Store, engine_state


def writer_over(path: Path, checkpoint_seconds: float) -> tuple[Writer, Store]:
    cfg = load(EXAMPLE_CONFIG)
    cfg = dataclasses.replace(cfg, store=dataclasses.replace(cfg.store, path=str(path),
                                                             checkpoint_seconds=checkpoint_seconds))
    settings = Settings.from_config(cfg)
    store = Store(str(path))
    writer = Writer(cfg, store, Engine(settings), EntityIndex(settings))
    writer.restore()
    return writer, store


def saved(store: Store) -> tuple[str | None, int, int]:
    """(the binlog checkpoint's GTID, raw rows stored, findings stored)."""
    gtid = (store.checkpoint(BINLOG_CHECKPOINT) or {}).get("gtid")
    (rows,), = store.conn.execute("SELECT COUNT(*) FROM row_changes")
    return gtid, rows, len(store.findings())


def test_batches_wait_for_the_cadence_a_finding_saves_at_once_and_a_clean_stop_saves_the_rest(tmp_path):
    writer, store = writer_over(tmp_path / "store.db", checkpoint_seconds=3600)
    shop = Shop()
    pending = shop.tx(100.0, order("O1", "pending"))
    writer.apply([pending], None)
    assert saved(store) == (None, 0, 0) and store.state(engine_state.HEAD) is None

    double = shop.tx(101.0, payment("T1", "O1", "success"), payment("T2", "O1", "success"))
    writer.apply([double], None)
    assert saved(store) == (double.position.gtid, 3, 1)
    assert store.findings()[0].rule == "F2"

    later = shop.tx(102.0, order("O2", "pending"))
    writer.apply([later], None)
    assert saved(store) == (double.position.gtid, 3, 1)
    writer.checkpoint()
    assert saved(store) == (later.position.gtid, 4, 1)
    store.close()


def test_a_restart_after_a_kill_resumes_from_the_last_checkpoint_with_the_state_saved_there(tmp_path):
    writer, store = writer_over(tmp_path / "store.db", checkpoint_seconds=3600)
    shop = Shop()
    first, second = shop.tx(100.0, order("O1", "pending")), shop.tx(101.0, order("O2", "pending"))
    writer.apply([first], None)
    writer.checkpoint()
    writer.apply([second], None)  # then killed: never saved
    store.close()

    restarted, store = writer_over(tmp_path / "store.db", checkpoint_seconds=3600)
    assert restarted.progress.binlog == first.position
    assert restarted.engine.orders is not None
    assert as_saved(restarted.engine.state()) == as_saved(writer_at(first, tmp_path / "replayed.db").engine.state())
    store.close()


def as_saved(state: dict[str, Any]) -> Any:
    return from_json(to_json(state))


def writer_at(tx: object, path: Path) -> Writer:
    """A writer that applied `tx` alone and saved it: the state the checkpoint holds."""
    writer, store = writer_over(path, checkpoint_seconds=0)
    writer.apply([tx], None)
    store.close()
    return writer


def test_a_cadence_of_zero_saves_every_batch(tmp_path):
    writer, store = writer_over(tmp_path / "store.db", checkpoint_seconds=0)
    tx = Shop().tx(100.0, order("O1", "pending"))
    writer.apply([tx], None)
    assert saved(store) == (tx.position.gtid, 1, 0)
    store.close()


def test_a_fragment_of_a_transaction_too_large_to_hold_is_saved_as_it_comes(tmp_path):
    """A kill then resumes inside the transaction, after the rows saved (tests/integration/test_monitor_kill.py)."""
    writer, store = writer_over(tmp_path / "store.db", checkpoint_seconds=3600)
    whole = Shop().tx(100.0, order("O1", "pending"), order("O2", "pending"))
    fragment = dataclasses.replace(whole, rows=whole.rows[:1], complete=False, position=dataclasses.replace(
        whole.position, within_gtid=whole.position.gtid, within_rows=1))
    writer.apply([fragment], None)
    assert saved(store) == (whole.position.gtid, 1, 0)
    assert store.checkpoint(BINLOG_CHECKPOINT)["within_rows"] == 1
    store.close()


def test_what_the_events_reader_knew_of_the_broker_is_kept_for_the_next_run_from_a_connected_reader_only(tmp_path):
    """A monitor started again while the broker is away, or just after it restarted, gives its events reader what
    the last reader knew (tests/integration/test_broker_kill.py): its ends, their epochs, those held, and how long
    they settle. A reader starting again, not connected yet, has nothing to say and overwrites none of it."""
    writer, store = writer_over(tmp_path / "store.db", checkpoint_seconds=0)
    settling = BrokerKnown((EndKnown("events/0", 40, 2, 40), EndKnown("events/1", 7, 2)), settle_until=1_000.0)
    shop = Shop()
    writer.apply([shop.tx(100.0, order("O1", "pending"))], lambda: KafkaEventsStatus(connected=True, known=settling))
    writer.apply([shop.tx(101.0, order("O2", "pending"))], lambda: KafkaEventsStatus(connected=False))
    store.close()

    restarted, store = writer_over(tmp_path / "store.db", checkpoint_seconds=0)
    assert restarted.progress.kafka_known == settling
    store.close()


def test_the_kafka_clock_stands_while_the_broker_s_return_settles(tmp_path):
    """The events reader settling after the broker was away (`producer_delivery_seconds`): no end it reports moves
    the Kafka clock, nor any event, until the producers may have appended what they kept."""
    writer, store = writer_over(tmp_path / "store.db", checkpoint_seconds=0)
    empty = (PartitionStatus("events", 0, position=0, end=0, end_at=150.0),)
    settling = BrokerKnown((), settle_until=time.time() + 30)
    writer.apply([], lambda: KafkaEventsStatus(connected=True, partitions=empty, known=settling))
    assert writer.progress.kafka_time == 0.0
    writer.apply([], lambda: KafkaEventsStatus(connected=True, partitions=empty, known=BrokerKnown((), 0.0)))
    assert writer.progress.kafka_time == 150.0
    store.close()
