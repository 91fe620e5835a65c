"""What the instances of a group keep in the shared store (oncewatch.monitor.group): per shard, its owner's epoch,
its checkpoint and its engine's state; per source a router reads, the position it has handed on up to.

A shard moves between instances when the Kafka group rebalances. Its new owner `claim`s it (the epoch goes up by
one, in one statement, so two claims never get the same one) and `save_shard` commits the shard's findings, state
and checkpoint only while the epoch is still the one it claimed: an instance that lost the shard and did not
notice yet (a long pause) gets FencedError and its transaction is rolled back, so a shard's state only ever moves
forward from its last owner's last commit.
"""

from __future__ import annotations

import time
from typing import Any

from oncewatch.core.exact_json import from_json
from oncewatch.core.records import Finding, QuarantinedRows
from oncewatch.store import engine_state
from oncewatch.store.batch import Batch
from oncewatch.store.errors import StoreError
from oncewatch.store.store import Store


class FencedError(StoreError):
    """The shard was claimed by another instance since this one claimed it: drop it, its new owner goes on."""


OWNER, SHARD, SOURCE = "group/owner/{}", "group/shard/{}", "group/source/{}"  # checkpoints' names


def claim(store: Store, shard: int, instance: str) -> int:
    """Take `shard` for `instance`: its new epoch, which every later `save_shard` of this owner must name."""
    with store.batch() as tx:
        (epoch,), = tx.conn.execute(
            "INSERT INTO checkpoints (name, value, updated_at) VALUES (?, '1', ?) ON CONFLICT(name) DO UPDATE SET "
            "value = CAST(CAST(checkpoints.value AS INTEGER) + 1 AS TEXT), updated_at = excluded.updated_at "
            "RETURNING value", (OWNER.format(shard), time.time())).fetchall()
        tx.set_checkpoint(f"{OWNER.format(shard)}/instance", instance)
    return int(epoch)


def load_shard(store: Store, shard: int) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the shard's checkpoint, its engine state), each None before its first commit."""
    return store.checkpoint(SHARD.format(shard)), engine_state.load(store, shard=shard)


def shard_checkpoints(store: Store) -> dict[int, dict[str, Any]]:
    """Every shard's last checkpoint (those committed at least once), with when (`committed_at`) and its owner's
    name (`owner`)."""
    rows = store.conn.execute("SELECT name, value, updated_at FROM checkpoints WHERE name LIKE 'group/%'").fetchall()
    values = {name: (from_json(value), at) for name, value, at in rows}
    found = {}
    for name, (checkpoint, at) in values.items():
        if name.startswith(SHARD.format("")):
            shard = int(name.rpartition("/")[2])
            owner = values.get(f"{OWNER.format(shard)}/instance")
            found[shard] = {**checkpoint, "committed_at": at, "owner": owner[0] if owner else None}
    return dict(sorted(found.items()))


def save_shard(tx: Batch, shard: int, epoch: int, checkpoint: dict[str, Any], delta: dict[str, Any],
               findings: list[Finding], quarantined: list[QuarantinedRows]) -> None:
    """One commit of a shard, inside the caller's transaction; FencedError if another instance claimed it since."""
    fenced = tx.conn.execute("UPDATE checkpoints SET updated_at = ? WHERE name = ? AND value = ?",
                             (time.time(), OWNER.format(shard), str(epoch)))
    if fenced.rowcount != 1:
        raise FencedError(f"shard {shard} was claimed by another instance since this one claimed it (epoch {epoch}); "
                          f"its new owner goes on from this one's last commit")
    tx.set_checkpoint(SHARD.format(shard), checkpoint)
    engine_state.save(tx, delta, shard=shard)
    if findings:
        tx.upsert_findings(findings)
    tx.add_binlog_quarantined(quarantined)


def source_position(store: Store, source: str) -> Any:
    """Where a router handed `source` on up to (None: never)."""
    return store.checkpoint(SOURCE.format(source))


def save_source_position(tx: Batch, source: str, position: Any) -> None:
    tx.set_checkpoint(SOURCE.format(source), position)


def advance_source_position(tx: Batch, source: str, position: dict[str, Any]) -> bool:
    """A change source's `position` ({"positions": {partition: offset}, ...}) stored unless one of the stored
    offsets is past it: a router paused past its session, whose successor read further meanwhile, never moves the
    source back (it would make the next reader read again what was handed on). True when stored."""
    row = tx.conn.execute("SELECT value FROM checkpoints WHERE name = ?", (SOURCE.format(source),)).fetchone()
    held = {} if row is None else (from_json(row[0]).get("positions") or {})
    ours = position["positions"]
    if any(offset > ours.get(partition, -1) for partition, offset in held.items()):
        return False
    tx.set_checkpoint(SOURCE.format(source), position)
    return True
