"""checks.pipeline: the CDC topics' transactions (from collectors.cdc's Assembler) lined up with the binlog's, on
the engine: F13 lost, F14 phantom, F15 replay, F16 incomplete, and the lag."""

from __future__ import annotations


from oncewatch.checks.engine import Engine
from oncewatch.checks.settings import Settings
from oncewatch.collectors.cdc import Assembler
from oncewatch.core.config import parse
from oncewatch.core.records import BinlogPosition, RowChange, Transaction

from .test_cdc_assembler import begin, end, feed, record

KAFKA = {"bootstrap_servers": ["127.0.0.1:9092"], "topics": [{"name": "events", "format": "json", "required": []}]}
CFG = parse({"mysql": {"user": "u", "password_env": "NONE", "tables": ["shop.orders", "shop.payments"]},
             "kafka": KAFKA,
             "cdc": {"topic_prefix": "cdc", "mode": "check"},
             "rules": {"cdc_lost_grace_seconds": 10}})


def engine() -> Engine:
    e = Engine(Settings.from_config(CFG))
    assert e.pipeline.against_binlog
    return e


def binlog(seq: int, *orders: int, t: float, file: str = "binlog.000001", end_pos: int | None = None,
           table: str = "orders") -> Transaction:
    """The binlog's transaction 0-1-seq with one insert per order number, ending at `end_pos` (1000 * seq)."""
    pos = 1000 * seq if end_pos is None else end_pos
    rows = tuple(RowChange(schema="shop", table=table, op="insert", pk=(f"O{o}",), before=None,
                           after={"order_no": f"O{o}", "status": "pending"}, txid=f"0-1-{seq}", row_index=i,
                           binlog_file=file, end_pos=pos, commit_time=t, commit_clock="binlog_header")
                 for i, o in enumerate(orders))
    return Transaction(rows=rows, position=BinlogPosition(f"0-1-{seq}", file, pos), commit_time=t)


def started(e: Engine, seq: int = 0) -> None:
    """The bootstrap's last chunk: the binlog is read from GTID 0-1-seq on."""
    e.on_transaction(Transaction(rows=(), position=BinlogPosition(f"0-1-{seq}", "binlog.000001", 500),
                                 commit_time=0.0, snapshot=True))


def copies(a: Assembler, seq: int, *orders: int, t: float, offset: int = 0, drop: tuple[int, ...] = ()) -> list:
    """The CDC topics' copy of 0-1-seq through the assembler: BEGIN, END counting every row, the records (less
    those of the orders in `drop`), one after the other from `offset`."""
    txid = f"0-1-{seq}"
    records = [record(txid, o, offset=offset + i)._replace(header_time=t)
               for i, o in enumerate(orders) if o not in drop]
    return feed(a, begin(txid), end(txid, orders=len(orders)), *records, now=t)


def rules_found(e: Engine) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in e.drain():
        out.setdefault(f.rule, []).append(f)
    return out


def test_every_binlog_row_delivered_once_is_no_finding_and_no_lag():
    e, a = engine(), Assembler(CFG.mysql)
    started(e)
    for seq in (1, 2, 3):
        e.on_transaction(binlog(seq, 2 * seq, 2 * seq + 1, t=float(seq)))
    assert e.stats()["pipeline"]["lag_transactions"] == 3
    for seq in (1, 2, 3):
        for tx in copies(a, seq, 2 * seq, 2 * seq + 1, t=float(seq), offset=10 * seq):
            e.on_cdc_copy(tx)
    e.tick(100.0, 100.0, 100.0)
    assert rules_found(e) == {}
    stats = e.stats()["pipeline"]
    assert (stats["lag_transactions"], stats["lag_rows"], stats["lag_seconds"], stats["position_gap"]) == (0, 0, 0, 0)


def test_records_dropped_on_the_way_are_exactly_those_rows_lost_with_their_binlog_coordinates():
    e, a = engine(), Assembler(CFG.mysql, grace_seconds=2.0)
    started(e)
    e.on_transaction(binlog(1, 1, 2, 3, t=1.0))
    assert copies(a, 1, 1, 2, 3, t=1.0, drop=(2,)) == []  # its END counts 3: it waits for the third
    later = feed(a, now=4.0)  # past the assembler's grace: handed on with what came
    assert len(later) == 1 and later[0].cdc.incomplete
    e.on_cdc_copy(later[0])
    found = rules_found(e)
    assert set(found) == {"F13", "F16"}
    (lost,) = found["F13"]
    assert lost.keys == {"gtid": "0-1-1", "table": "shop.orders", "op": "insert", "pk": "O2"}
    assert lost.evidence[0].coordinates == "binlog.000001:1000#0-1-1/1" and lost.severity == "critical"
    (incomplete,) = found["F16"]
    assert incomplete.keys == {"gtid": "0-1-1", "expected": 3, "came": 2}


def test_a_transaction_never_delivered_is_lost_once_later_ones_come_and_a_late_copy_resolves_it():
    e, a = engine(), Assembler(CFG.mysql)
    started(e)
    e.on_transaction(binlog(1, 1, t=1.0))
    e.on_transaction(binlog(2, 2, t=5.0))
    e.tick(50.0, 50.0, 50.0)  # nothing delivered yet: the pipeline lags, nothing is lost
    assert rules_found(e) == {} and e.stats()["pipeline"]["lag_seconds"] == 49.0
    for tx in copies(a, 2, 2, t=12.0, offset=5):  # committed 11 s after 0-1-1: past the grace
        e.on_cdc_copy(tx)
    e.tick(50.0, 50.0, 50.0)
    (lost,) = rules_found(e)["F13"]
    assert lost.keys["gtid"] == "0-1-1" and lost.first_seen == 11.0
    # it comes after all (another partition of a relay's topic, say): late, not lost
    for tx in copies(Assembler(CFG.mysql), 1, 1, t=1.0):
        e.on_cdc_copy(tx)
    (resolved,) = rules_found(e)["F13"]
    assert resolved.id == lost.id and resolved.status == "resolved"


def test_a_record_with_no_binlog_row_is_a_phantom_and_the_history_before_the_start_is_not_judged():
    e, a = engine(), Assembler(CFG.mysql)
    started(e, seq=3)
    for tx in copies(a, 2, 7, t=1.0):  # before the binlog position the monitor started at
        e.on_cdc_copy(tx)
    e.on_transaction(binlog(4, 1, t=2.0))
    for tx in copies(a, 4, 1, 9, t=2.0, offset=1):  # one row more than the binlog's transaction
        e.on_cdc_copy(tx)
    for tx in copies(a, 5, 5, t=3.0, offset=3):  # a transaction the binlog never had
        e.on_cdc_copy(tx)
    e.tick(20.0, 20.0, 20.0)
    found = rules_found(e)
    assert set(found) == {"F14"}
    assert sorted(f.keys["pk"] for f in found["F14"]) == ["O5", "O9"]
    assert e.stats()["pipeline"]["before_start"] == 1


def test_replayed_records_are_one_info_finding_per_run_and_applied_once():
    e, a = engine(), Assembler(CFG.mysql)
    started(e)
    for seq in (1, 2):
        e.on_transaction(binlog(seq, seq, t=float(seq)))
        for tx in copies(a, seq, seq, t=float(seq), offset=seq):
            e.on_cdc_copy(tx)
    # the connector restarted: both transactions again, then a new one
    replayed = copies(a, 1, 1, t=1.0, offset=3) + copies(a, 2, 2, t=2.0, offset=4)
    assert replayed == []
    e.on_transaction(binlog(3, 3, t=3.0))
    (new,) = copies(a, 3, 3, t=3.0, offset=5)
    assert [r.records for r in new.cdc.replays] == [2]
    e.on_cdc_copy(new)
    e.tick(20.0, 20.0, 20.0)
    (replay,) = rules_found(e)["F15"]
    assert replay.severity == "info"
    assert replay.keys == {"partition": "cdc.shop.orders/0", "from_offset": 3, "to_offset": 4, "records": 2}
    assert e.stats()["pipeline"]["replayed_records"] == 2


def test_the_position_gap_counts_the_bytes_of_binlog_not_delivered_across_a_rotation():
    e = engine()
    started(e)
    e.on_transaction(binlog(1, 1, t=1.0, end_pos=1000))
    e.on_transaction(binlog(2, 2, t=2.0, end_pos=4000))  # waits: its bytes begin at 1000
    e.on_transaction(binlog(3, 3, t=3.0, end_pos=9000))
    e.on_transaction(binlog(4, 4, t=4.0, file="binlog.000002", end_pos=2500))
    a = Assembler(CFG.mysql)
    for tx in copies(a, 1, 1, t=1.0):
        e.on_cdc_copy(tx)
    stats = e.stats()["pipeline"]
    assert (stats["lag_transactions"], stats["lag_rows"]) == (3, 3)
    assert stats["position_gap"] == (9000 - 1000) + 2500


def test_the_open_state_survives_a_restart():
    e, a = engine(), Assembler(CFG.mysql)
    started(e)
    e.on_transaction(binlog(1, 1, 2, t=1.0))
    again = engine()
    again.restore(e.state())
    for tx in copies(a, 1, 1, t=1.0):
        again.on_cdc_copy(tx)
    (lost,) = rules_found(again)["F13"]
    assert lost.keys["pk"] == "O2"


def test_in_source_mode_a_delivery_judges_replays_and_incomplete_transactions_alone():
    cfg = parse({"mysql": {"tables": ["shop.orders"]}, "kafka": KAFKA,
                 "cdc": {"topic_prefix": "cdc"}})
    e, a = Engine(Settings.from_config(cfg)), Assembler(cfg.mysql, grace_seconds=1.0)
    assert not e.pipeline.against_binlog
    copies(a, 1, 1, 2, t=1.0, drop=(2,))
    for tx in feed(a, now=5.0):
        e.on_transaction(tx)
    e.tick(10.0, 10.0, 10.0)
    assert set(rules_found(e)) == {"F16"}
