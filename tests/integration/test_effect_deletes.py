"""Issue 42, observation 4: TRUNCATE and DELETE of a watched effect table are facts F1 uses, on the real services.

F1 counts the effect rows of a trade_no that exist. Each test writes to an effect table of its own (a copy of
the shop's shipments, not announced: these tests send no events) and runs the real monitor over it, in two
runs with a restart between them, so that what the first run kept (the rows, the truncates seen) is read back
from the store by the second:

- a row, TRUNCATE, the same trade_no again: one row exists, no F1; the truncate is logged and counted on
  /metrics (`oncewatch_tables_truncated_total`), and an F1 open on the table before it is resolved by it;
- INSERT, DELETE, INSERT of one trade_no: one row exists, no F1;
- two rows of one trade_no (F1), then one deleted: the F1 is resolved, the delete in its evidence and history.

Before the fix the first two raised F1 "2 rows" for a table holding one, and the truncate left no trace.
Each runs in binlog mode and in CDC source mode (Debezium's topics of the schema the dev connector captures).
"""

from __future__ import annotations

import json
import tomllib
import uuid
from contextlib import closing
from pathlib import Path

import pytest
import tomli_w

from devservices.kafka_connect import CDC_SCHEMA
from devservices.shop_monitor import SCHEMA, findings, new_topic, run_until_idle, shop_config, shop_settings
from oncewatch import shop
from oncewatch.checks.findings import finding_id
from oncewatch.core.names import RESOLVED
from oncewatch.dashboards import metrics
from oncewatch.store import open_reader
from oncewatch.store.reviews import history

from .conftest import admin_connection
from .shop_monitor import FIRST_IDLE, IDLE

MODES = ("binlog", "cdc")


class EffectTable:
    """A fresh effect table of its own in the mode's schema, and a monitor that has taken its first checkpoint."""

    def __init__(self, folder: Path, mode: str):
        cdc = mode == "cdc"
        self.schema = CDC_SCHEMA if cdc else SCHEMA
        self.name = f"ship_{uuid.uuid4().hex[:8]}"
        self.table = f"{self.schema}.{self.name}"
        topic = new_topic()
        shop.run(shop_settings(topic, schema=self.schema, orders=0, reset=True))
        self.execute(f"CREATE TABLE {self.name} LIKE shipments")
        self.config = shop_config(folder, topic=topic, schema=self.schema, cdc=cdc)
        data = tomllib.loads(self.config.read_text())
        shipments = f"{self.schema}.shipments"
        data["mysql"]["tables"] = [self.table if t == shipments else t for t in data["mysql"]["tables"]]
        data["mysql"]["commit_time_columns"][self.table] = data["mysql"]["commit_time_columns"].pop(shipments)
        for effect in data["domain"]["effects"]:
            if effect["table"] == shipments:
                effect["table"] = self.table
        data["announce"] = [a for a in data["announce"] if a["table"] != shipments]
        self.config.write_text(tomli_w.dumps(data))
        run_until_idle(self.config, idle=FIRST_IDLE)

    def execute(self, *statements: str) -> None:
        with closing(admin_connection(self.schema)) as conn, conn.cursor() as c:
            for sql in statements:
                c.execute(sql)

    def insert(self, shipment_id: int, trade_no: str) -> str:
        return f"INSERT INTO {self.name} VALUES ({shipment_id}, '{trade_no}', 'O-{trade_no}', 'AAAAAA', NOW(3))"

    def run(self) -> list[dict]:
        """`oncewatch run --until-idle`: its log lines."""
        result = run_until_idle(self.config, idle=IDLE)
        return [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]

    def f1(self) -> list:
        return [f for f in findings(self.config) if f.rule == "F1"]


@pytest.fixture(params=MODES)
def effects(request, tmp_path) -> EffectTable:
    if request.param == "cdc":
        request.getfixturevalue("cdc_connector")
    return EffectTable(tmp_path, request.param)


def test_a_truncate_empties_the_table_for_f1_and_is_logged_and_counted(effects):
    t = effects
    t.execute(t.insert(101, "T-TRUNC"), t.insert(103, "T-DUP"), t.insert(104, "T-DUP"))
    t.run()
    (open_,) = t.f1()
    assert open_.keys["trade_no"] == "T-DUP" and open_.status == "open"

    t.execute(f"TRUNCATE TABLE {t.name}", t.insert(102, "T-TRUNC"), t.insert(105, "T-DUP"))
    logged = t.run()
    # one row of each trade_no exists: T-TRUNC raises nothing, T-DUP's F1 ended with the truncate
    assert [(f.id, f.summary, f.status) for f in t.f1()] == [
        (finding_id("F1", "T-DUP"), f"trade_no T-DUP: 2 rows in {t.table}", RESOLVED)]
    assert f"{t.table} truncated" in t.f1()[0].resolution, t.f1()[0].resolution
    truncated = [line for line in logged if line.get("event") == "table_truncated"]
    assert [line["table"] for line in truncated] == [t.table], logged
    registry = metrics.registry(str(t.config.parent / "store.db"))
    assert registry.get_sample_value("oncewatch_tables_truncated_total", {"table": t.table}) == 1


def test_insert_delete_insert_of_one_trade_no_is_one_row(effects):
    t = effects
    t.execute(t.insert(201, "T-AGAIN"), f"DELETE FROM {t.name} WHERE shipment_id = 201")
    t.run()
    t.execute(t.insert(202, "T-AGAIN"))
    t.run()
    assert [(f.summary, [e.values["op"] for e in f.evidence]) for f in t.f1()] == []


def test_a_duplicate_deleted_down_to_one_row_resolves_its_f1_with_the_delete_as_evidence(effects):
    t = effects
    t.execute(t.insert(301, "T-TWICE"), t.insert(302, "T-TWICE"))
    t.run()
    (f1,) = t.f1()
    assert f1.status == "open" and [e.values["row_id"] for e in f1.evidence] == [301, 302]

    t.execute(f"DELETE FROM {t.name} WHERE shipment_id = 302")
    t.run()
    (f1,) = t.f1()
    assert f1.status == RESOLVED, f1
    delete = [e for e in f1.evidence if e.values["op"] == "delete"]
    assert [(e.values["row_id"], e.values["table"]) for e in delete] == [(302, t.table)], f1.evidence
    assert f"{t.table}" in f1.resolution and delete[0].coordinates in f1.resolution, f1.resolution
    store = open_reader(str(t.config.parent / "store.db"))
    try:
        trail = history(store, [f1.id])[f1.id]
    finally:
        store.close()
    assert [h.status for h in trail] == [RESOLVED] and trail[0].at == delete[0].time and trail[0].note == f1.resolution

    # the same trade_no duplicated again reopens the same finding
    t.execute(t.insert(303, "T-TWICE"))
    t.run()
    (f1,) = t.f1()
    assert f1.status == "open" and [e.values["op"] for e in f1.evidence] == ["insert", "insert", "delete", "insert"]
