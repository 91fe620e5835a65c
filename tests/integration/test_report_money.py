"""Issue 43's auditor's path on a real shop run: the F1 report prices every duplicate effect as the shop's own
tables do, and `oncewatch verify` catches an edit of any sheet, header field or cell, saying where.

The shop runs with the three F1 faults (a callback retried without idempotency, a ship before the idempotency
record, a compensation query beside the late callback) among clean orders; the monitor reads it to the end.
The ground truth is computed by SQL on the shop's tables, apart from the monitor: for each trade_no with more
than one shipment (or points grant), its payment's amount for each row beyond the first.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import openpyxl
import pytest

from devservices.shop_monitor import SCHEMA, findings, run_until_idle, shop_settings
from oncewatch import shop
from oncewatch.cli import EXIT_TAMPERED, main

from .conftest import admin_connection
from .shop_monitor import IDLE, prepared

F1_FAULTS = "retry_no_idempotency*5,ship_before_idempotency*3,compensation_and_callback*3"

# Per trade_no: the paid amount times the effect rows beyond the first, over every effect table.
TRUTH = """
SELECT d.trade_no, SUM(p.amount * (d.n - 1))
FROM (SELECT trade_no, COUNT(*) AS n FROM shipments GROUP BY trade_no HAVING COUNT(*) > 1
      UNION ALL
      SELECT trade_no, COUNT(*) AS n FROM points_grants GROUP BY trade_no HAVING COUNT(*) > 1) d
JOIN payments p ON p.trade_no = d.trade_no
GROUP BY d.trade_no
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("money")
    config, topic = prepared(base)
    shop.run(shop_settings(topic, seed=43, orders=60, rate=100, faults=F1_FAULTS))
    run_until_idle(config, idle=IDLE)
    # the commands as `oncewatch` runs them, in this process (an interpreter each costs seconds)
    first = min(f.id for f in findings(config) if f.rule == "F1")  # a history for the History sheet
    assert main(["ack", "--config", str(config), first, "--by", "auditor", "--note", "refund the 2nd shipment"]) == 0
    for fmt in ("csv", "json", "xlsx"):
        out = str(base / f"f1.{fmt}")
        assert main(["export", "--config", str(config), "--format", fmt, "--rule", "F1", "--out", out]) == 0
    return config, base


def ground_truth() -> dict[str, Decimal]:
    conn = admin_connection(SCHEMA)
    try:
        with conn.cursor() as c:
            c.execute(TRUTH)
            return {trade_no: amount for trade_no, amount in c.fetchall()}
    finally:
        conn.close()


def csv_rows(path: Path) -> list[dict[str, str]]:
    data = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(io.StringIO("\n".join(data))))


def test_the_f1_report_holds_the_shops_money(run):
    _, base = run
    truth = ground_truth()
    assert len(truth) >= 11, truth  # every fault duplicated at least one effect
    by_finding: dict[str, dict[str, str]] = {}
    payments = defaultdict(list)
    for row in csv_rows(base / "f1.csv"):
        by_finding[row["finding_id"]] = row
        if row["evidence_table"] == f"{SCHEMA}.payments":
            payments[row["finding_id"]].append((row["evidence_key"], row["evidence_status"], row["evidence_amount"]))
    reported = {json.loads(r["keys"])["trade_no"]: Decimal(r["amount_involved"]) if r["amount_involved"] else None
                for r in by_finding.values()}
    assert reported == truth
    for fid, row in by_finding.items():  # the payment row the amount was read from is in the evidence
        trade_no = json.loads(row["keys"])["trade_no"]
        assert [(k, s) for k, s, _ in payments[fid]] == [(trade_no, "success")], (fid, payments[fid])
        assert Decimal(row["amount_involved"]) % Decimal(payments[fid][0][2]) == 0
    book = openpyxl.load_workbook(base / "f1.xlsx", read_only=True)
    summary = {r[0]: r for r in book["Summary"].iter_rows(min_row=2, values_only=True)}
    assert Decimal(str(summary["F1"][4])) == sum(truth.values())


def _edited_xlsx(src: Path, dst: Path, sheet: str, row: int, column: int) -> str:
    """A copy of the report with one cell of `sheet` changed, as a person with a spreadsheet would; the cell's name."""
    book = openpyxl.load_workbook(src)
    cell = book[sheet].cell(row=row, column=column)
    value = cell.value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        cell.value = value + 1
    elif hasattr(value, "year"):
        cell.value = value.replace(year=value.year - 1)
    else:
        cell.value = f"{value or ''}x"
    book.save(dst)
    return book[sheet].cell(row=1, column=column).value


@dataclass(frozen=True)
class Verified:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def verify(capsys):
    """`oncewatch verify PATH` as the command runs it (in this process: a new interpreter per edit is slow)."""
    def run(path: Path) -> Verified:
        code = main(["verify", str(path)])
        return Verified(code, *capsys.readouterr())
    return run


def test_verify_catches_an_edit_of_every_sheet_and_says_where(run, verify, tmp_path):
    _, base = run
    assert verify(base / "f1.xlsx").returncode == 0
    sheets = openpyxl.load_workbook(base / "f1.xlsx", read_only=True).sheetnames
    assert {"Report", "Summary", "Findings", "Evidence", "History"} <= set(sheets)
    missed = []
    for sheet in sheets:
        rows = list(openpyxl.load_workbook(base / "f1.xlsx", read_only=True)[sheet].iter_rows(values_only=True))
        # the first, second, middle and last cells of the first data row in turn (tests/unit/test_reports.py
        # edits every one); on Report, the value of the first, third, middle and last header fields
        if sheet == "Report":
            places = [(r, 2) for r in sorted({2, 4, len(rows) // 2 + 1, len(rows)})]
        else:
            places = [(2, c) for c in sorted({1, 2, len(rows[0]) // 2 + 1, len(rows[0])})]
        for row, column in places:
            edited = tmp_path / f"{sheet}-{row}-{column}.xlsx"
            name = _edited_xlsx(base / "f1.xlsx", edited, sheet, row, column)
            result = verify(edited)
            where = [f"sheet {sheet}, row {row}"]
            if sheet != "Report":
                where.append(f"column {name.removesuffix('_exact')}")
            if result.returncode != EXIT_TAMPERED or not all(w in result.stderr for w in where):
                missed.append((sheet, row, name, result.returncode, result.stdout + result.stderr))
    assert not missed, missed


def test_verify_catches_an_edit_of_a_csv_or_json_header_field_and_cell(run, verify, tmp_path):
    _, base = run
    for fmt in ("csv", "json"):
        assert verify(base / f"f1.{fmt}").returncode == 0
    text = (base / "f1.csv").read_bytes().decode()
    lines = text.splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if line.startswith("# since:"))
    edited = tmp_path / "header.csv"
    edited.write_bytes("".join([*lines[:header], "# since: 2000-01-01T00:00:00.000000Z\r\n",
                                *lines[header + 1:]]).encode())
    result = verify(edited)
    assert result.returncode == EXIT_TAMPERED and "header field since" in result.stderr, result.stderr

    table = list(csv.reader(io.StringIO("".join(line for line in lines if not line.startswith("#")), newline="")))
    status = table[0].index("status")
    table[3][status] = "closed"
    out = io.StringIO(newline="")
    csv.writer(out).writerows(table)
    edited = tmp_path / "cell.csv"
    edited.write_bytes("".join(line for line in lines if line.startswith("#")).encode() + out.getvalue().encode())
    result = verify(edited)
    assert result.returncode == EXIT_TAMPERED, result.stderr
    assert "row 3" in result.stderr and "column status" in result.stderr, result.stderr

    doc = json.loads((base / "f1.json").read_text())
    doc["header"]["until"] = "2000-01-01T00:00:00.000000Z"
    (tmp_path / "header.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False))
    result = verify(tmp_path / "header.json")
    assert result.returncode == EXIT_TAMPERED and "header field until" in result.stderr, result.stderr
    doc = json.loads((base / "f1.json").read_text())
    doc["findings"][1]["evidence"][0]["coordinates"] = "binlog.000001:4#0-1-1/0"
    (tmp_path / "cell.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False))
    result = verify(tmp_path / "cell.json")
    assert result.returncode == EXIT_TAMPERED, result.stderr
    assert "column coordinates" in result.stderr and "finding" in result.stderr, result.stderr
