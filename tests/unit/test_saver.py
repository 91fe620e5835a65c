"""The store's writer process (oncewatch.monitor.saver, issue 44): the checkpoints it writes are the ones the judge
would have written itself, the judge's own reads of the store wait for the checkpoint in flight, and a failure to
write, or a writer's process that dies, is raised in the judge."""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
from pathlib import Path
from typing import Any

import pytest

from devservices.samples import EXAMPLE_CONFIG, Shop, order, payment, shipment
from oncewatch.checks.engine import Engine
from oncewatch.checks.settings import Settings
from oncewatch.collectors.kafka_events import EventBatch
from oncewatch.core import forkserver
from oncewatch.core.config import load
from oncewatch.core.exact_json import from_json, to_json
from oncewatch.core.names import partition_key
from oncewatch.core.records import Packed, Transaction
from oncewatch.monitor.entities import EntityIndex
from oncewatch.monitor.remote import remote_traceback
from oncewatch.monitor.saver import ProcessSaver, SaverDiedError
from oncewatch.monitor.writer import Writer
from oncewatch.store import Store, engine_state

ORDERS = 400


def writer_over(path: Path, process: bool, memory_entries: int = 10) -> tuple[Writer, Store, ProcessSaver | None]:
    cfg = load(EXAMPLE_CONFIG)
    cfg = dataclasses.replace(cfg, store=dataclasses.replace(cfg.store, path=str(path), checkpoint_seconds=0,
                                                             memory_entries=memory_entries))
    settings = Settings.from_config(cfg)
    store = Store(str(path))
    saver = ProcessSaver(cfg) if process else None
    writer = Writer(cfg, store, Engine(settings), EntityIndex(settings), saver)
    writer.restore()

    def tick(_status: object) -> None:  # the streams' clocks, not the host's: both writers judge alike
        writer.engine.tick(writer.progress.binlog_time, writer.progress.binlog_time, writer.progress.binlog_time)

    writer._tick = tick  # type: ignore[method-assign]
    if saver is not None:
        forkserver.start()
        saver.start()
    return writer, store, saver


def batches() -> list[list[Transaction | EventBatch]]:
    """ORDERS orders in batches of 20, as a monitor's loop hands them on, each paid order announced (every 90th's
    event lost); every 50th paid twice, and every 7th shipped a second time in the next batch: by then the engine
    holding 10 entries a space has spilled its entry, in the checkpoint of the batch before, still in flight."""
    shop = Shop()
    out: list[list[Transaction | EventBatch]] = []
    for first in range(0, ORDERS, 20):
        batch: list[Transaction | EventBatch] = []
        events = []
        for i in range(first, first + 20):
            o, t, at = f"O{i}", f"T{i}", 1000.0 + i
            batch.append(shop.tx(at, order(o, "pending")))
            rows = [payment(t, o, "success"), order(o, "paid", was="pending")]
            if i % 50 == 0:
                rows.append(payment(f"{t}b", o, "success"))
            batch.append(shop.tx(at + 0.5, *rows))
            batch.append(shop.tx(at + 0.7, shipment(f"S{i}", t)))
            if i % 90:
                events.append(shop.event("order.paid", at + 0.6, order_no=o))
        batch += [shop.tx(1000.0 + first + 19.9, shipment(f"S{i}b", f"T{i}")) for i in range(first - 20, first)
                  if i >= 0 and i % 7 == 0]
        batch.append(EventBatch(tuple(events), (), {partition_key(e.topic, e.partition): e.offset + 1 for e in events},
                                True))
        out.append(batch)
    return out


def as_read_in_a_process(batch: list[Transaction | EventBatch]) -> list[Transaction | EventBatch]:
    """`batch` as a reader's process hands it to the judge (oncewatch.monitor.remote): its rows and events packed
    (core.records.Packed), pickled and unpickled."""
    packed = [dataclasses.replace(item, rows=Packed(item.rows)) if isinstance(item, Transaction)
              else dataclasses.replace(item, events=Packed(item.events)) for item in batch]
    return pickle.loads(pickle.dumps(packed, pickle.HIGHEST_PROTOCOL))


def stored(store: Store) -> dict[str, Any]:
    rows = store.conn.execute("SELECT txid, row_index, end_pos FROM row_changes ORDER BY seq").fetchall()
    (events,), = store.conn.execute("SELECT COUNT(*) FROM events")
    (entries,), = store.conn.execute("SELECT COUNT(*) FROM entity_entries")
    return {"rows": rows, "events": events, "entries": entries,
            "findings": sorted((f.id, f.rule, f.status, f.evidence) for f in store.findings()),
            "verdicts": store.conn.execute("SELECT * FROM trade_verdicts ORDER BY trade_no").fetchall(),
            "state": from_json(to_json(engine_state.load(store)))}


def test_the_writer_process_stores_what_the_judge_would_have_stored_itself(tmp_path):
    inline, inline_store, _ = writer_over(tmp_path / "inline.db", process=False)
    judge, store, saver = writer_over(tmp_path / "process.db", process=True)
    try:
        spilled = 0
        for batch in batches():
            inline.apply(batch, None)
            judge.apply(as_read_in_a_process(batch), None)
            spilled = max(spilled, sum(a.cold_count for a in judge.engine.memory.spillable))
        inline.checkpoint()
        judge.checkpoint()
        assert saver is not None and saver.pid not in (None, os.getpid())
        found = stored(store)
        assert found["rows"] == [(r.txid, r.row_index, r.end_pos) for batch in batches() for item in batch
                                 if isinstance(item, Transaction) for r in item.rows]  # each once, in commit order
        assert len(found["rows"]) > 3 * ORDERS and found["state"]["entries"]
        assert sum(f[1] == "F1" for f in found["findings"]) == len(range(0, ORDERS - 20, 7))
        assert found == stored(inline_store)
        # the engine spilled: what it read back from the store was the state handed to the writer's process last
        assert spilled > 0
    finally:
        if saver is not None:
            saver.stop()
        store.close()
        inline_store.close()


def test_a_checkpoint_the_writer_cannot_write_is_raised_in_the_judge_with_its_traceback(tmp_path):
    judge, store, saver = writer_over(tmp_path / "store.db", process=True)
    assert saver is not None
    try:
        judge.apply(batches()[0], None)
        judge.unsaved.checkpoints["unwritable"] = object()  # no JSON for it: to_json raises in the writer's process
        judge.apply([], None)
        with pytest.raises(TypeError, match="cannot store a value of type object") as raised:
            judge.settle()
        assert "to_json" in (remote_traceback(raised.value) or "")
        saver.stop()
    finally:
        store.close()


def test_a_writer_process_that_dies_is_raised_in_the_judge(tmp_path):
    judge, store, saver = writer_over(tmp_path / "store.db", process=True)
    assert saver is not None and saver.pid is not None
    try:
        os.kill(saver.pid, signal.SIGKILL)
        with pytest.raises(SaverDiedError, match="killed by signal 9"):  # handing the next checkpoint on, or after
            judge.apply(batches()[0], None)
            judge.settle()
        saver.stop()
    finally:
        store.close()
