"""The engine's state saved as deltas in the store comes back as the state the engine holds."""

from __future__ import annotations

import threading

import pytest

from devservices.samples import Shop, grant, order, payment, push, shipment, shop_settings
from oncewatch.checks.engine import Engine
from oncewatch.core.config import PostgresTarget
from oncewatch.core.exact_json import from_json, to_json
from oncewatch.store import Store, engine_state

from tests.conftest import POSTGRES_ONLY

# entries are packed with a dictionary after this many (store.packing), so that most of them are
PACK_AFTER = 50


def canonical(state):
    state = from_json(to_json(state))
    state["entries"] = {space: sorted(rows, key=lambda r: to_json(r[0])) for space, rows in state["entries"].items()}
    return state


def traffic(shop: Shop, n: int):
    for i in range(n):
        at = 1000.0 + i
        yield shop.tx(at, order(f"O{i}", "pending"))
        yield shop.tx(at + 0.2, payment(f"T{i}", f"O{i}", "success"), order(f"O{i}", "paid", was="pending"))
        if i % 3:
            yield shop.tx(at + 0.3, shipment(f"S{i}", f"T{i}"), grant(f"G{i}", f"T{i}"))
        yield shop.event("order.paid", at + 0.25, order_no=f"O{i}", trade_no=f"T{i}", entity_id=f"O{i}")


def test_deltas_saved_batch_by_batch_load_as_the_full_state(store_target):
    settings = shop_settings()
    engine = Engine(settings)
    store = Store(store_target)
    store.packer.train_samples = PACK_AFTER
    assert engine_state.load(store) is None
    for i, record in enumerate(traffic(Shop(), 200)):
        push(engine, record)
        if i % 37 == 0:
            engine.tick(1000.0 + i / 4, 1000.0 + i / 4, 1000.0 + i / 4)
            with store.batch() as tx:
                engine_state.save(tx, engine.state_delta())
    with store.batch() as tx:
        engine_state.save(tx, engine.state_delta())
    assert sum(len(rows) for rows in engine.state()["entries"].values()) > 100
    assert canonical(engine_state.load(store)) == canonical(engine.state())
    restored = Engine(settings)
    restored.restore(engine_state.load(store))
    assert canonical(restored.state()) == canonical(engine.state())


def test_spilled_spaces_keep_their_newest_entries_in_memory_and_the_rest_in_the_store(store_target):
    settings = shop_settings()
    store = Store(store_target)
    store.packer.train_samples = PACK_AFTER
    engine = Engine(settings)
    engine.memory.spill_to(engine_state.ColdEntries(store), 10)
    for i, record in enumerate(traffic(Shop(), 300)):
        push(engine, record)
        if i % 50 == 0:
            with store.batch() as tx:
                engine_state.save(tx, engine.state_delta())
    with store.batch() as tx:
        engine_state.save(tx, engine.state_delta())
    spilled = {a.name: a for a in engine.memory.spillable}
    effects = spilled["effects"]
    assert len(effects.items) <= 10 and len(effects) == 2 * 200  # a shipment and a grant for 200 of 300 trade_nos
    (saved,), = store.conn.execute("SELECT COUNT(*) FROM open_state s JOIN open_state_spaces n ON n.id = s.space "
                                   "WHERE n.name = 'effects'")
    assert saved == len(effects)
    assert effects.get(f"{settings.domain.effects[0].table}\x1fT1") is not None  # read back from the store

    restored = Engine(settings)
    restored.memory.spill_to(engine_state.ColdEntries(store), 10)
    restored.restore(engine_state.load(store, restored.memory.hot_limits()))
    again = {a.name: a for a in restored.memory.spillable}
    assert len(again["effects"].items) == 10 and len(again["effects"]) == len(effects)
    assert len(again["order_amounts"]) == len(spilled["order_amounts"]) == 300

    # the horizon drops the cold entries too, in the store, and counts them
    before = restored.memory.dropped()
    with store.batch() as tx:
        restored.tick(1000.0 + settings.rules.horizon_seconds + 500, 1000.0 + settings.rules.horizon_seconds + 500,
                      1000.0 + settings.rules.horizon_seconds + 500)
        engine_state.save(tx, restored.state_delta())
    assert len(again["effects"]) == 0 and restored.memory.dropped() - before >= 400
    (left,), = store.conn.execute("SELECT COUNT(*) FROM open_state s JOIN open_state_spaces n ON n.id = s.space "
                                  "WHERE n.name = 'effects'")
    assert left == 0


@pytest.mark.parametrize("older", ["engine_entries", "open_state_keys_whole"])
def test_an_older_stores_entries_move_to_the_numbered_table_and_load_as_they_were(store_target, older):
    """Issue 47: stores made before kept each entry's space by name and its key as JSON text (`engine_entries`), then
    the space by number and the key whole (`open_state` with a column `key`); their first writer of this version
    moves them, and the engine loads the same state."""
    settings = shop_settings()
    engine = Engine(settings)
    store = Store(store_target)
    store.packer.train_samples = PACK_AFTER
    for record in traffic(Shop(), 60):
        push(engine, record)
    with store.batch() as tx:
        engine_state.save(tx, engine.state_delta())
    want = canonical(engine_state.load(store))
    # the entries as a version before kept them
    rows = store.conn.execute("SELECT s.space, n.name, p.prefix || s.rest, s.at, s.value FROM open_state s "
                              "JOIN open_state_spaces n ON n.id = s.space "
                              "JOIN open_state_prefixes p ON p.id = s.prefix").fetchall()
    blob = "BYTEA" if isinstance(store_target, PostgresTarget) else "BLOB"
    store.conn.execute("DROP TABLE open_state")
    store.conn.execute("DELETE FROM open_state_prefixes")
    if older == "engine_entries":
        store.conn.execute(f"CREATE TABLE engine_entries (space TEXT NOT NULL, key TEXT NOT NULL, at REAL NOT NULL, "
                           f"value {blob} NOT NULL, PRIMARY KEY (space, key))")
        store.conn.executemany("INSERT INTO engine_entries VALUES (?, ?, ?, ?)",
                               [(name, to_json(key), at, value) for _, name, key, at, value in rows])
        store.conn.execute("DELETE FROM open_state_spaces")
    else:
        store.conn.execute(f"CREATE TABLE open_state (space INTEGER NOT NULL, key TEXT NOT NULL, at REAL NOT NULL, "
                           f"value {blob} NOT NULL, PRIMARY KEY (space, key))")
        store.conn.execute("CREATE INDEX open_state_at ON open_state (space, at)")
        store.conn.executemany("INSERT INTO open_state VALUES (?, ?, ?, ?)",
                               [(space, key, at, value) for space, _, key, at, value in rows])
    if isinstance(store_target, PostgresTarget):
        store.conn.execute("UPDATE oncewatch_store SET schema_sha256 = 'made by an older version'")
    store.close()
    assert len(rows) > 100 and any("\x1f" in key for _, _, key, _, _ in rows)
    writer = Store(store_target)
    tables = {t for (t,) in writer.conn.execute(writer.dialect.tables)}
    assert not tables & {"engine_entries", "open_state_old"}
    assert writer.conn.execute("SELECT COUNT(*) FROM open_state").fetchone()[0] == len(rows)
    assert writer.conn.execute("SELECT COUNT(*) FROM open_state_prefixes").fetchone()[0] < len(rows) / 10
    assert canonical(engine_state.load(writer)) == want
    writer.close()


def test_a_space_numbered_in_a_transaction_rolled_back_is_numbered_again(store_target):
    store = Store(store_target)
    with pytest.raises(RuntimeError):
        with store.batch() as tx:
            assert tx.spaces.number(tx.conn, ("effects",)) == 1
            raise RuntimeError("the checkpoint failed")
    assert store.spaces.find(store.conn, ("effects",)) is None
    with store.batch() as tx:
        assert (tx.spaces.number(tx.conn, ("orders",)), tx.spaces.number(tx.conn, ("effects",))) == (1, 2)
    assert store.spaces.known == {("orders",): 1, ("effects",): 2}
    store.close()


@POSTGRES_ONLY
def test_writers_numbering_spaces_at_once_each_get_a_number_of_their_own(store_target):
    """A group's members save their shards' state into one PostgreSQL store: two that number a new space in
    transactions at once both take one past the largest; the later one, having lost the race, tries again."""
    first, second = Store(store_target), Store(store_target)
    numbered: dict[str, int] = {}
    with first.batch() as tx:
        numbered["shard/0/effects"] = tx.spaces.number(tx.conn, ("shard/0/effects",))

        def other() -> None:
            with second.batch() as tx2:
                numbered["shard/1/effects"] = tx2.spaces.number(tx2.conn, ("shard/1/effects",))

        racing = threading.Thread(target=other)
        racing.start()
        racing.join(1.0)
        assert racing.is_alive()  # waiting on the first's number 1, not yet committed
    racing.join(30)
    assert numbered == {"shard/0/effects": 1, "shard/1/effects": 2}
    first.close()
    second.close()


def test_cold_entries_read_through_the_delta_a_writer_of_their_own_has_not_written_yet(store_target, monkeypatch):
    """engine_state.ColdEntries beside oncewatch.monitor.saver's writer process: the delta handed on and not yet
    written is what a key reads; an entry past the horizon is gone at once, and deleted once nothing is in flight, or
    once its drop has waited DROP_WAIT_SECONDS for the writer, which it then waits for."""
    store = Store(store_target)
    with store.batch() as tx:
        engine_state.save(tx, {"changes": {"effects": {"full": True, "gone": [], "put": [
            ["T1", 100.0, {"n": 1}], ["T2", 200.0, {"n": 2}], ["T3", 300.0, {"n": 3}]]}}})
    in_flight: list[dict] = [{"changes": {"effects": {"full": False, "gone": ["T2"], "put": [
        ["T3", 350.0, {"n": 33, "at": (1, 2)}], ["T4", 400.0, {"n": 4}]]}}}]
    cold = engine_state.ColdEntries(store, handed=lambda: in_flight[0] if in_flight else None)
    assert cold.get("effects", "T1") == (100.0, {"n": 1})  # not in the delta: the store's
    assert cold.get("effects", "T2") is None  # gone in the delta, still in the store
    assert cold.get("effects", "T3") == (350.0, {"n": 33, "at": [1, 2]})  # as the store will give it back
    assert cold.get("effects", "T4") == (400.0, {"n": 4})
    cold.get("effects", "T4")[1]["n"] = 5  # what is read is a copy: the delta in flight stays as it was handed on
    assert in_flight[0]["changes"]["effects"]["put"][1][2] == {"n": 4}
    assert cold.drop_before("effects", 150.0) == []  # nothing deleted beside the writer...
    assert cold.get("effects", "T1") is None  # ...but past the horizon all the same
    assert cold.drop_before("effects", 250.0) == [] and cold.get("effects", "T2") is None
    in_flight.clear()
    assert cold.drop_before("effects", 150.0) == ["T1"]

    in_flight.append({"changes": {}})
    settled: list[bool] = []
    cold.settle = lambda: (settled.append(True), in_flight.clear())
    assert cold.drop_before("effects", 250.0) == [] and not settled
    monkeypatch.setattr(engine_state, "DROP_WAIT_SECONDS", 0.0)
    assert cold.drop_before("effects", 250.0) == ["T2"] and settled
    store.close()
