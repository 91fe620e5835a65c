"""The engine's state saved as deltas in the store comes back as the state the engine holds."""

from __future__ import annotations

from devservices.samples import Shop, grant, order, payment, push, shipment, shop_settings
from oncewatch.checks.engine import Engine
from oncewatch.core.exact_json import from_json, to_json
from oncewatch.store import Store, engine_state

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
    (saved,), = store.conn.execute("SELECT COUNT(*) FROM engine_entries WHERE space = 'effects'")
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
    (left,), = store.conn.execute("SELECT COUNT(*) FROM engine_entries WHERE space = 'effects'")
    assert left == 0
