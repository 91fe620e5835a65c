"""The XLSX of a period attestation (dashboards.attestation): the same content typed, as the reports' sheets are
(dashboards.reports: times as dates, exact amounts as numbers shown to their scale, counts as integers). The
attestation records its SHA-256, so the signature covers it.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from openpyxl import Workbook

from oncewatch.dashboards.reports import _Sheet, _typed, cells_text

OPEN_TRADE_COLUMNS = ("trade_no", "order_id", "amount", "verdict", "rule", "committed_at", "reached_at",
                      "verified_at")  # the fields of an attestation's "open_trades"
SHEETS = ("Attestation", "Trades", "Violated by rule", "Open trades", "Findings", "History", "Coverage")
HEADER_ROWS = ("attestation", "sequence", "generated_at", "since", "until", "config_sha256", "previous",
               "verified_share", "objective")
TYPED_HEADER = frozenset({"sequence", "generated_at", "since", "until"})
AMOUNT_COLUMNS = ("trades", "amount", "unpriced")
XLSX_FINDING_COLUMNS = ("id", "rule", "name", "severity", "status", "first_seen", "last_seen", "resolved_at",
                        "resolution", "closed_at", "closed_by", "closed_reason", "closed_note", "keys", "summary",
                        "amount_involved", "evidence_items")
HISTORY_COLUMNS = ("finding_id", "at", "status", "by", "reason", "note")
COVERAGE_COLUMNS = ("stream", "source", "first", "last", "records", "read_to")


def sheets(document: Mapping[str, Any]) -> dict[str, tuple[tuple[str, ...], list[list[str]]]]:
    """The XLSX's sheets as text: name -> (columns, rows), every cell as the reports write one (`cells_text`)."""
    closed = [{f"closed_{k}": (f["closed"] or {}).get(k) for k in ("at", "by", "reason", "note")}
              for f in document["findings"]]
    coverage = document["coverage"]
    binlog = coverage["binlog"]
    gtid_rows = [["binlog", f"GTID domain {domain}", span["first"], span["last"], "", ""]
                 for domain, span in binlog["gtids"].items()]
    if binlog["other"]:
        gtid_rows.append(["binlog", "transaction ids", binlog["other"]["first"], binlog["other"]["last"], "", ""])
    return {
        "Attestation": (("field", "value", "typed"), [[name, *cells_text([document[name]]), ""]
                                                      for name in HEADER_ROWS]),
        "Trades": (("verdict", *AMOUNT_COLUMNS), [[name, *cells_text(figures[c] for c in AMOUNT_COLUMNS)]
                                                  for name, figures in document["trades"].items()]),
        "Violated by rule": (("rule", *AMOUNT_COLUMNS), [[rule, *cells_text(figures[c] for c in AMOUNT_COLUMNS)]
                                                         for rule, figures in document["violated_by_rule"].items()]),
        "Open trades": (OPEN_TRADE_COLUMNS, [cells_text(t[c] for c in OPEN_TRADE_COLUMNS)
                                             for t in document["open_trades"]]),
        "Findings": (XLSX_FINDING_COLUMNS, [cells_text({**f, **c}[name] for name in XLSX_FINDING_COLUMNS)
                                            for f, c in zip(document["findings"], closed)]),
        "History": (HISTORY_COLUMNS, [[f["id"], *cells_text(h[c] for c in HISTORY_COLUMNS[1:])]
                                      for f in document["findings"] for h in f["history"]]),
        "Coverage": (COVERAGE_COLUMNS, [
            *gtid_rows,
            ["binlog", "transactions committed", "", "", str(binlog["transactions"]), *cells_text([binlog["read_to"]])],
            ["binlog", "oldest row change kept", *cells_text([binlog["kept_since"]]), "", "", ""],
            *(["kafka", key, *cells_text(span[c] for c in COVERAGE_COLUMNS[2:])]
              for key, span in coverage["kafka"]["partitions"].items())]),
    }


def xlsx(document: Mapping[str, Any]) -> bytes:
    """The XLSX of an attestation's content: every sheet typed as the reports' are (dashboards.reports `_typed`)."""
    book = Workbook(write_only=True)
    for name, (columns, rows) in sheets(document).items():
        sheet = _Sheet(book, name, columns)
        for row in rows:
            if name == "Attestation":
                sheet.append([row[0], row[1], _typed(sheet, row[0], row[1]) if row[0] in TYPED_HEADER else None])
            else:
                sheet.typed(columns, row)
        if name != "Attestation":
            sheet.filter()
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()
