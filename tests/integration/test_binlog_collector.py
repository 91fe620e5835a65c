"""The binlog collector against the real dev MariaDB: exact rows, order, resume, restarts, purge, bootstrap."""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
import warnings
from decimal import Decimal

import pymysql
import pytest

from devservices import base, mariadb
from oncewatch.collectors.binlog import BinlogCollector, BinlogPurgedError, bootstrap
from oncewatch.core.records import BinlogPosition, RowChange

from .conftest import admin_connection, monitor_config


def create_orders(admin: pymysql.Connection, name: str) -> None:
    with admin.cursor() as c:
        c.execute(f"""CREATE TABLE {name} (
            order_no VARCHAR(32) NOT NULL PRIMARY KEY,
            amount DECIMAL(14,4) NOT NULL,
            status VARCHAR(16) NOT NULL,
            note VARCHAR(64) NULL,
            updated_at DATETIME(3) NOT NULL
        ) ENGINE=InnoDB""")


def collect(collector: BinlogCollector, until, timeout: float = 60.0) -> list[RowChange]:
    """Run the collector in a thread until `until(rows)` holds; returns the rows in hand-on order."""
    rows: list[RowChange] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            for tx in collector.transactions():
                rows.extend(tx.rows)
                if until(rows):
                    break
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)
        finally:
            done.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    if not done.wait(timeout):
        collector.stop()
        t.join(10)
        pytest.fail(f"collector did not deliver in {timeout}s; got {len(rows)} rows; status {collector.status()}")
    if errors:
        raise errors[0]
    return rows


def start_position(cfg) -> BinlogPosition:
    return BinlogCollector(cfg.mysql, None).current_server_position()


def test_transactions_come_out_exactly_in_commit_order(admin, table_name, tmp_path):
    create_orders(admin, table_name)
    cfg = monitor_config([f"owtest.{table_name}"], tmp_path, commit_time_columns={f"owtest.{table_name}": "updated_at"})
    start = start_position(cfg)
    expected = []
    with admin.cursor() as c:
        for i in range(50):
            admin.begin()
            for j in range(3):
                key = f"ü-{i:03d}-{j}"  # non-ASCII string key
                amount = Decimal(f"{i}.{j:04d}") + Decimal("1234567890.0001")
                note = None if j == 1 else f"note {i}"
                when = dt.datetime(2026, 1, 1, 12, 0, 0, (i * 1000 + j) % 1000 * 1000)
                c.execute(f"INSERT INTO {table_name} VALUES (%s, %s, 'pending', %s, %s)", (key, amount, note, when))
                expected.append(("insert", key, amount, note, when))
            admin.commit()
        c.execute(f"UPDATE {table_name} SET status='paid' WHERE order_no='ü-000-0'")
        c.execute(f"DELETE FROM {table_name} WHERE order_no='ü-000-2'")
    rows = collect(BinlogCollector(cfg.mysql, start), lambda rs: len(rs) >= 152)
    assert len(rows) == 152
    got = [(r.op, r.pk[0], r.after["amount"], r.after["note"], r.after["updated_at"]) for r in rows[:150]]
    assert got == expected
    assert all(type(r.after["amount"]) is Decimal for r in rows[:150])
    # rows of one transaction share its id and end position, indexed inside it
    assert [r.row_index for r in rows[:3]] == [0, 1, 2]
    assert len({r.txid for r in rows[:150]}) == 50
    assert rows[0].commit_clock == "row_column"
    assert rows[0].commit_time == dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc).timestamp()
    upd, dele = rows[150], rows[151]
    assert (upd.op, upd.before["status"], upd.after["status"]) == ("update", "pending", "paid")
    assert (dele.op, dele.before["order_no"], dele.after) == ("delete", "ü-000-2", None)
    # positions grow, and a resume from the middle gives exactly the rest
    mid = rows[74]  # last row of transaction 24
    resume_at = BinlogPosition(gtid=mid.txid, file=mid.binlog_file, pos=mid.end_pos)
    rest = collect(BinlogCollector(cfg.mysql, resume_at), lambda rs: len(rs) >= 77)
    assert [(r.txid, r.row_index) for r in rest] == [(r.txid, r.row_index) for r in rows[75:]]


def test_alter_table_mid_stream_later_rows_carry_new_column(admin, table_name, tmp_path):
    create_orders(admin, table_name)
    cfg = monitor_config([f"owtest.{table_name}"], tmp_path)
    start = start_position(cfg)
    with admin.cursor() as c:
        c.execute(f"INSERT INTO {table_name} VALUES ('a', 1.5, 'pending', NULL, NOW(3))")
        c.execute(f"ALTER TABLE {table_name} ADD COLUMN channel VARCHAR(16) NULL AFTER status")
        c.execute(f"INSERT INTO {table_name} VALUES ('b', 2.25, 'pending', 'alipay', NULL, NOW(3))")
        c.execute(f"UPDATE {table_name} SET channel='card', amount=3 WHERE order_no='a'")
    rows = collect(BinlogCollector(cfg.mysql, start), lambda rs: len(rs) >= 3)
    assert "channel" not in rows[0].after
    assert rows[1].after["channel"] == "alipay" and rows[1].after["amount"] == Decimal("2.2500")
    assert rows[1].after["note"] is None
    assert rows[2].before["channel"] is None and rows[2].after["channel"] == "card"


def test_a_pattern_reads_every_shard_one_created_after_the_start_too(admin, table_name, tmp_path):
    # shards in both of the mall's test schemas, and an unwatched table beside them
    for schema, n in (("owmall_0", 0), ("owmall_1", 1)):
        create_orders(admin, f"{schema}.{table_name}_{n}")
    create_orders(admin, f"owtest.{table_name}_x")
    entry = f"owmall_*.{table_name}_*"
    cfg = monitor_config([entry], tmp_path, commit_time_columns={entry: "updated_at"})
    with admin.cursor() as c:
        c.execute(f"INSERT INTO owmall_0.{table_name}_0 VALUES ('s0', 1, 'pending', NULL, NOW(3))")
        c.execute(f"INSERT INTO owmall_1.{table_name}_1 VALUES ('s1', 1, 'pending', NULL, NOW(3))")
    chunks = list(bootstrap(cfg.mysql))
    snapshot = [r for chunk in chunks for r in chunk.rows]
    assert sorted((r.schema, r.table, r.pk[0]) for r in snapshot) == [
        ("owmall_0", f"{table_name}_0", "s0"), ("owmall_1", f"{table_name}_1", "s1")]
    start = chunks[-1].position
    with admin.cursor() as c:
        c.execute(f"INSERT INTO owtest.{table_name}_x VALUES ('x', 1, 'pending', NULL, NOW(3))")  # not watched
        c.execute(f"INSERT INTO owmall_1.{table_name}_1 VALUES ('t1', 2, 'pending', NULL, NOW(3))")
        create_orders(admin, f"owmall_1.{table_name}_2")  # a new shard, after the monitor's start
        c.execute(f"INSERT INTO owmall_1.{table_name}_2 VALUES ('t2', 3, 'pending', NULL, '2026-01-01 12:00:00')")
    rows = collect(BinlogCollector(cfg.mysql, start), lambda rs: len(rs) >= 2)
    assert [(r.table, r.pk[0]) for r in rows] == [(f"{table_name}_1", "t1"), (f"{table_name}_2", "t2")]
    # the new shard's commit time column is found by its pattern too
    assert rows[1].commit_clock == "row_column"
    assert rows[1].commit_time == dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc).timestamp()


def test_mariadb_restart_mid_stream_every_row_exactly_once(admin, table_name, tmp_path):
    create_orders(admin, table_name)
    cfg = monitor_config([f"owtest.{table_name}"], tmp_path)
    start = start_position(cfg)
    collector = BinlogCollector(cfg.mysql, start)
    total = 60

    def write(first: int, last: int) -> None:
        conn = admin_connection()
        with conn.cursor() as c:
            for i in range(first, last):
                c.execute(f"INSERT INTO {table_name} VALUES (%s, 1, 'pending', NULL, NOW(3))", (f"o{i}",))
        conn.close()

    write(0, 30)
    seen_disconnect = []

    def until(rs):
        if len(rs) == 30 and not seen_disconnect:
            mariadb.mariadb_down()
            seen_disconnect.append(True)
            threading.Thread(target=lambda: (mariadb.mariadb_up(), write(30, total)), daemon=True).start()
        return len(rs) >= total

    rows = collect(collector, until, timeout=180)
    assert [r.pk[0] for r in rows] == [f"o{i}" for i in range(total)]
    assert collector.status().reconnects >= 1
    assert collector.status().connected


def test_a_dropped_replication_connection_resumes_from_the_checkpoint_not_the_opening_gtid(admin, table_name,
                                                                                            tmp_path):
    """Issue 16: the server drops the monitor's replication connection (KILL CONNECTION) after a large binlog;
    the collector reconnects by itself from what it handed on, reads only what came after (events counted),
    and the drop is counted and visible."""
    create_orders(admin, table_name)
    cfg = monitor_config([f"owtest.{table_name}"], tmp_path)
    start = start_position(cfg)
    big, rows_per_tx, after = 40, 1000, 5
    with admin.cursor() as c:
        for t in range(big):  # one statement of rows_per_tx rows per transaction
            values = ", ".join(["(%s, 1, 'pending', NULL, NOW(3))"] * rows_per_tx)
            c.execute(f"INSERT INTO {table_name} VALUES {values}", [f"b{t}-{i}" for i in range(rows_per_tx)])
            admin.commit()
    collector = BinlogCollector(cfg.mysql, start)
    at_kill: dict[str, int] = {}

    def write_after() -> None:
        conn = admin_connection()
        with conn.cursor() as c:
            for i in range(after):
                c.execute(f"INSERT INTO {table_name} VALUES (%s, 2, 'pending', NULL, NOW(3))", (f"a{i}",))
        conn.close()

    def until(rs):
        if len(rs) == big * rows_per_tx and not at_kill:
            port = collector._stream._stream_connection._sock.getsockname()[1]
            conn = admin_connection()
            with conn.cursor() as c:
                c.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE HOST = %s", (f"127.0.0.1:{port}",))
                (thread_id,), = c.fetchall()
                c.execute(f"KILL CONNECTION {int(thread_id)}")
            conn.close()
            at_kill.update(events=collector.status().events_read, reconnects=collector.status().reconnects)
            threading.Thread(target=write_after, daemon=True).start()
        return len(rs) >= big * rows_per_tx + after

    rows = collect(collector, until, timeout=240)
    assert [r.pk[0] for r in rows[big * rows_per_tx:]] == [f"a{i}" for i in range(after)]
    assert len(rows) == big * rows_per_tx + after  # nothing twice, nothing lost
    assert at_kill["events"] > big * 4  # a GTID, a table map, rows events and an XID per big transaction
    read_after = collector.status().events_read - at_kill["events"]
    # the five new transactions (GTID, table map, rows, XID each) and the new stream's preamble (rotate, format
    # description, GTID list, binlog checkpoint, heartbeats): a replay from the opening GTID would be thousands
    assert read_after <= after * 4 + 20, read_after
    assert collector.status().reconnects == at_kill["reconnects"] + 1  # the drop is counted (and was shown)
    assert collector.status().connected


def test_purged_checkpoint_gives_specific_error(admin, table_name, tmp_path):
    create_orders(admin, table_name)
    cfg = monitor_config([f"owtest.{table_name}"], tmp_path)
    old = start_position(cfg)
    with admin.cursor() as c:
        c.execute(f"INSERT INTO {table_name} VALUES ('x', 1, 'pending', NULL, NOW(3))")
        c.execute("FLUSH BINARY LOGS")
        c.execute(f"INSERT INTO {table_name} VALUES ('y', 1, 'pending', NULL, NOW(3))")
        c.execute("SHOW MASTER STATUS")
        current = c.fetchone()[0]
        deadline = time.monotonic() + 30
        while True:  # a binlog still open by a replica's dump thread (an earlier test's) is kept back
            c.execute(f"PURGE BINARY LOGS TO '{current}'")
            c.execute("SHOW BINARY LOGS")
            if c.fetchone()[0] == current:
                break
            assert time.monotonic() < deadline, "the server kept the old binlog"
            time.sleep(0.5)
    with pytest.raises(BinlogPurgedError, match="oncewatch bootstrap"):
        collect(BinlogCollector(cfg.mysql, old), lambda rs: False, timeout=60)


def test_bootstrap_while_writes_go_on_equals_final_state(admin, table_name, tmp_path):
    create_orders(admin, table_name)
    with admin.cursor() as c:
        for i in range(200):
            c.execute(f"INSERT INTO {table_name} VALUES (%s, %s, 'pending', NULL, NOW(3))", (f"o{i}", i))
    cfg = monitor_config([f"owtest.{table_name}"], tmp_path)
    stop = threading.Event()
    rng = random.Random(7)

    def writer() -> None:
        conn = admin_connection()
        n = 200
        with conn.cursor() as c:
            while not stop.is_set():
                action = rng.random()
                if action < 0.4:
                    c.execute(f"INSERT INTO {table_name} VALUES (%s, 5, 'pending', NULL, NOW(3))", (f"o{n}",))
                    n += 1
                elif action < 0.8:
                    c.execute(f"UPDATE {table_name} SET status='paid', amount=amount+1 WHERE order_no=%s",
                              (f"o{rng.randrange(n)}",))
                else:
                    c.execute(f"DELETE FROM {table_name} WHERE order_no=%s", (f"o{rng.randrange(n)}",))
                time.sleep(0.002)
        conn.close()

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    time.sleep(0.5)
    chunks = list(bootstrap(cfg.mysql, chunk=50))
    rows = [r for tx in chunks for r in tx.rows]
    position = chunks[-1].position
    assert len(chunks) > 1 and {tx.position for tx in chunks} == {position}
    time.sleep(0.5)
    stop.set()
    t.join()
    with admin.cursor() as c:
        c.execute(f"SELECT order_no, amount, status FROM {table_name}")
        final = {r[0]: (r[1], r[2]) for r in c.fetchall()}
        c.execute("SELECT @@gtid_binlog_pos")
        end_gtid = c.fetchone()[0]
    state = {r.pk[0]: (r.after["amount"], r.after["status"]) for r in rows}
    assert len(state) >= 200 and all(r.snapshot for r in rows)
    collector = BinlogCollector(cfg.mysql, position)

    def apply(rs):
        return collector.status().last_position.gtid == end_gtid

    for r in collect(collector, apply, timeout=120):
        if r.op == "delete":
            state.pop(r.pk[0])
        else:
            state[r.pk[0]] = (r.after["amount"], r.after["status"])
    assert state == final


def test_monitor_user_cannot_write(table_name, admin, tmp_path):
    create_orders(admin, table_name)
    conn = pymysql.connect(host=base.HOST, port=base.MARIADB_PORT, user=mariadb.MONITOR_USER,
                           password=mariadb.monitor_password(), database="owtest", autocommit=True)
    with conn.cursor() as c, pytest.raises(pymysql.err.OperationalError) as refused:
        c.execute(f"INSERT INTO {table_name} VALUES ('z', 1, 'pending', NULL, NOW(3))")
    assert refused.value.args[0] == 1142  # INSERT command denied
    conn.close()



def test_a_row_python_cannot_decode_is_quarantined_and_the_tail_goes_on(admin, table_name, tmp_path):
    """MariaDB's big5 holds 0xF9FE, Python's big5 codec does not: that rows event used to make the
    reader reconnect forever at its GTID. Now it is kept aside with its coordinates, and the
    transactions after it come out."""
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {table_name} (k VARCHAR(8) NOT NULL PRIMARY KEY, "
                  f"name VARCHAR(16) CHARACTER SET big5 NULL) ENGINE=InnoDB")
    cfg = monitor_config([f"owtest.{table_name}"], tmp_path)
    start = start_position(cfg)
    with admin.cursor() as c:
        c.execute(f"INSERT INTO {table_name} VALUES ('before', 'ok')")
        c.execute(f"INSERT INTO {table_name} VALUES ('poison', X'F9FE')")
        c.execute(f"INSERT INTO {table_name} VALUES ('after', 'ok')")
    collector = BinlogCollector(cfg.mysql, start)
    txs = []
    for tx in collector.transactions():
        txs.append(tx)
        if len(txs) == 3:
            break
    collector.close()
    assert [[r.pk[0] for r in tx.rows] for tx in txs] == [["before"], [], ["after"]]
    (bad,) = txs[1].quarantined
    assert (bad.table, bad.reason) == (f"owtest.{table_name}", "undecodable")
    assert bad.txid in txs[1].position.gtid.split(",")
    assert "big5 cannot decode byte(s) b'\\xf9'" in bad.detail and bad.event_pos > 0 and bad.binlog_file
    assert not txs[0].quarantined and not txs[2].quarantined


def table_ids(admin: pymysql.Connection, tables: tuple[str, ...]) -> list[dict[str, int]]:
    """Each binlog file's table ids of `tables` (from its Table_map events), oldest file first."""
    ids: list[dict[str, int]] = []
    with admin.cursor() as c:
        c.execute("SHOW BINARY LOGS")
        for (name, *_) in c.fetchall():
            c.execute(f"SHOW BINLOG EVENTS IN '{name}'")
            found = {}
            for *_, kind, _, _, info in c.fetchall():
                if kind == "Table_map":
                    table_id, _, rest = info.partition(" (")
                    table = rest.rstrip(")").split(".")[-1]
                    if table in tables:
                        found[table] = int(table_id.split(":")[1])
            ids.append(found)
    return ids


def test_rows_read_across_mariadb_crashes_keep_their_tables(admin, table_name, tmp_path):
    """Issue 42, found by bench/chaos.py: table ids restart with the server, and a binlog file that ended in a crash
    has no rotate event of its own. A reader that read across two crashes (a monitor behind or stopped, a control run
    afterwards) took the second server's rows for the tables its ids had named under the first: the points grants
    of a chaos soak's shop were stored as refunds."""
    tables = (f"{table_name}_a", f"{table_name}_b")
    for t in tables:
        create_orders(admin, t)
    cfg = monitor_config([f"owtest.{t}" for t in tables], tmp_path)
    start = start_position(cfg)
    order = [tables, tables[::-1]]  # the first table opened after a start takes the first free id
    for era, first_second in enumerate(order):
        mariadb.mariadb_kill()
        mariadb.mariadb_up()
        conn = admin_connection()
        with conn.cursor() as c:
            for t in first_second:
                c.execute(f"INSERT INTO {t} VALUES (%s, 1, 'pending', NULL, NOW(3))", (f"{t}-{era}",))
        conn.close()
    conn = admin_connection()
    first, second = table_ids(conn, tables)[-2:]
    conn.close()
    # what makes the crash matter: the second server gave each id to the other table
    assert first[tables[0]] == second[tables[1]] and first[tables[1]] == second[tables[0]], (first, second)
    rows = collect(BinlogCollector(cfg.mysql, start), lambda rs: len(rs) >= 4, timeout=120)
    assert [(r.table, r.pk[0]) for r in rows] == [(t, f"{t}-{era}") for era, ts in enumerate(order) for t in ts]


def test_the_bootstrap_reads_every_result_to_its_end(admin, table_name, tmp_path):
    # Issue 43: its server-side cursor read one row of BINLOG_GTID_POS's result and went on to the next query,
    # which PyMySQL reports as "Previous unbuffered result was left incomplete" (a warning in the monitor's log).
    create_orders(admin, f"owtest.{table_name}")
    with admin.cursor() as c:
        c.execute(f"INSERT INTO owtest.{table_name} VALUES ('a', 1, 'pending', NULL, NOW(3))")
    cfg = monitor_config([f"owtest.{table_name}"], tmp_path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        chunks = list(bootstrap(cfg.mysql))
    assert [r.pk for chunk in chunks for r in chunk.rows] == [("a",)]
    assert [str(w.message) for w in seen if issubclass(w.category, UserWarning)] == []
