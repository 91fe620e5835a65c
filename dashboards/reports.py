"""Auditors' reports: findings with their evidence as CSV, JSON or XLSX, checkable later (docs/architecture.md §1).

`export()` makes one report; `oncewatch export` and the dashboard's Reports page both call it
(through `report()`). `oncewatch findings` prints the same finding dicts (`findings_json`) or a
table (`findings_table`). A finding carries its history: every change of its status after it
opened, by the monitor (the fact that ended it, a lapse) or by a person (an acknowledgement, a
close with its reason). dashboards.report_check recomputes its hashes and says where it was changed
(`oncewatch verify`).

A report is a header and a data section.

Header (CSV: the leading lines `# field: value`; JSON: "header"; XLSX: sheet "Report"), in this order:
  report            format version of the report, "oncewatch-report/4" (2 added the history; 3 the
                    evidence columns, amount_involved, the covered range and report_sha256; 4 readable
                    keys and values, every finding priced, row_sha256, columns_sha256, fields_sha256, and
                    every XLSX sheet typed and checked)
  generated_at      when the report was made
  since, until      the range the report covers: the requested bounds, else the earliest first_seen
                    of its findings and generated_at; a finding is in it when it was seen during
                    [since, until): last_seen >= since and first_seen < until
  rule, status      the other filters, empty = all
  mask              "off", "***" (masked values replaced) or "hmac-sha256" (replaced by a keyed
                    hash, so equal values give equal tokens and reports can be compared)
  masked_fields     the field names masked wherever they occur inside keys and evidence values
  binlog_position   how far the monitor had read the binlog: {"gtid", "file", "pos"}
  kafka_positions   how far it had read each partition: {"topic/partition": next offset}
  config_sha256     Config.content_sha256: the SHA-256 of the config file's content as parsed, the
                    same for one file wherever it lies (`oncewatch check-config` prints it)
  findings, evidence_rows   counts
  columns_sha256    per column of the data section, SHA-256 of its cells (below the names row) one after
                    another, each followed by a NUL (which no cell holds, see below), UTF-8: tells
                    `oncewatch verify` which column changed
  data_sha256       SHA-256 of the data section, as defined below
  fields_sha256     per field above, the first 16 hex digits of the SHA-256 of its text (UTF-8): tells
                    `oncewatch verify` which field changed
  report_sha256     SHA-256 of the header: canonical JSON (sorted keys, no spaces, UTF-8) of the list of
                    [field, text] pairs of every field above, text as the CSV header holds it; since
                    data_sha256 is one of them, it covers the whole report
The header and the data are read in one store transaction, so the positions are the ones the
findings were produced at. In JSON, empty header values are null and positions are objects; in
CSV and XLSX, they are empty text and compact JSON text.

Data section: one row per evidence item (a finding without evidence gives one row with the
evidence columns empty); findings ordered by first_seen then id, evidence in the order the rule
gave it; columns COLUMNS:
  finding_id, rule, name, severity, status, first_seen, last_seen, resolved_at, resolution,
  keys, summary, amount_involved, history, key_fields, evidence_kind, evidence_table, evidence_key,
  evidence_amount, evidence_status, coordinates, evidence_time, values, evidence_fields, row_sha256
amount_involved is the money a finding is about, for every rule where money is at stake: F2 and F5
give theirs, the others are priced from the shop's rows the store keeps, and the row an amount was
read from joins the evidence (dashboards.pricing; F1: the trade's paid amount for each effect row
beyond the first, its payment row in the evidence). key_fields and evidence_fields are keys and
values for people ("name: value; ...", nested names dotted: `fields_text`); keys and values keep them
as JSON. row_sha256 is the first 16 hex digits of the SHA-256 of the row's other cells, each followed
by a NUL, UTF-8: `oncewatch verify` names the row an edit is in. evidence_table is the watched
table (a topic for an event); evidence_key, _amount and _status are the values of the columns
the config's domain names for that table (`roles_of`), or an event's record key and payload
amount and status. history is a JSON list, oldest first, of {"at", "status" (the status it
changed to), "by" ("oncewatch" or the person), "reason" (a close's reason, else null), "note"}.
Times are ISO-8601 UTC with microseconds ("2024-05-01T12:00:00.123456Z"). keys and values are
JSON with sorted keys, no spaces and non-ASCII characters as they are; exact decimals are
strings ("12.50"). Empty cells are empty strings. Control characters other than tab and line
feed, and U+FFFE/U+FFFF, are written as \\uXXXX in every cell, so that XLSX (XML, which cannot
hold them, and turns CR into LF) keeps the same text as CSV.

XLSX sheets: Report (the header: each field's text, and beside the times and counts the same
typed), Summary (per rule: findings, those still standing, amount involved), Findings (one row
per finding), Evidence (the data section, then each time column's exact text as
"<column>_exact": Excel keeps milliseconds), History (one row per change). The sheets are typed:
times as dates (UTC), amounts as numbers shown to their scale (text where binary floating point
could not give the same digits back), counts as integers. Summary, Findings and History are made
from the data section's rows (`Derived`); `oncewatch verify` makes them again from the Evidence
sheet and compares every cell, and every typed cell with the text it stands for, so that an edit
of any sheet is found and placed.

data_sha256 = SHA-256 of the data section written as CSV: the COLUMNS row, then the data rows,
every cell a string, as RFC 4180 and Python's default csv.writer write it: cells separated by
commas, CRLF after every row, a cell in double quotes only when it holds a comma, a double quote
(doubled inside), CR or LF; UTF-8 without BOM. It is the same for
the three formats of one report. To recompute it:
  CSV   hash the bytes from the first line that does not start with '#' to the end of the file
        (`sed -n '/^[^#]/,$p' report.csv | sha256sum`);
  XLSX  read the "Evidence" sheet's cells back to text (each time from its _exact column, an amount
        to the decimals its number format shows), write them as above and hash that;
  JSON  flatten "findings" into rows as `rows()` does, each row's row_sha256 the one its finding's
        "rows_sha256" list states (the JSON report's findings carry it beside `findings_json`'s
        fields), write them as above and hash that.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import hmac
import io
import json
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

from openpyxl import Workbook
from openpyxl.cell import WriteOnlyCell
from openpyxl.cell.cell import ERROR_CODES
from openpyxl.utils import get_column_letter
from openpyxl.utils.datetime import from_excel, to_excel

from oncewatch.core.config import Config
from oncewatch.core.domain import Announce, Domain
from oncewatch.core.exact_json import from_json, plain
from oncewatch.core.names import BINLOG_CHECKPOINT, KAFKA_CHECKPOINT, RESOLVED, key_of, key_text, split_partition_key
from oncewatch.core.tables import Watched
from oncewatch.dashboards.pricing import Pricing
from oncewatch.store import Store, open_reader
from oncewatch.store.codec import HistoryEntry
from oncewatch.store.queries import FindingFilter, findings_with_history

if TYPE_CHECKING:
    from openpyxl.worksheet._write_only import WriteOnlyWorksheet

REPORT_VERSION = "oncewatch-report/4"
FORMATS = ("csv", "json", "xlsx")

FINDING_FIELDS = ("id", "rule", "name", "severity", "status", "first_seen", "last_seen", "resolved_at",
                  "resolution", "keys", "summary", "amount_involved", "history", "key_fields")
EVIDENCE_FIELDS = ("kind", "table", "key", "amount", "status", "coordinates", "time", "values", "fields")
COLUMNS = ("finding_id", *FINDING_FIELDS[1:], "evidence_kind", "evidence_table", "evidence_key", "evidence_amount",
           "evidence_status", "coordinates", "evidence_time", "values", "evidence_fields", "row_sha256")
HISTORY_COLUMNS = HistoryEntry._fields  # XLSX sheet "History"
SUMMARY_COLUMNS = ("rule", "name", "findings", "standing", "amount_involved")  # XLSX sheet "Summary"
FINDINGS_COLUMNS = (*FINDING_FIELDS, "evidence_items")  # XLSX sheet "Findings"
SHEETS = ("Report", "Summary", "Findings", "Evidence", "History")
# How typed sheets write a column, by name: times as dates, amounts as numbers, counts as integers (the names of
# the period attestations' sheets too: dashboards.attestation).
TIME_FIELDS = frozenset({"first_seen", "last_seen", "resolved_at", "evidence_time", "at", "generated_at", "since",
                         "until", "committed_at", "reached_at", "verified_at", "closed_at"})
AMOUNT_FIELDS = frozenset({"amount_involved", "evidence_amount", "amount"})
COUNT_FIELDS = frozenset({"findings", "standing", "evidence_items", "evidence_rows", "sequence", "trades", "unpriced",
                          "records", "first", "last", "read_to"})
HEADER_FIELDS = ("report", "generated_at", "since", "until", "rule", "status", "mask", "masked_fields",
                 "binlog_position", "kafka_positions", "config_sha256", "findings", "evidence_rows", "columns_sha256",
                 "data_sha256", "fields_sha256", "report_sha256")  # in this order (module docstring)
# The Report sheet: each header field's text (what report_sha256 covers), and times and counts typed beside it.
REPORT_COLUMNS = ("field", "value", "typed")
TYPED_HEADER = frozenset({"generated_at", "since", "until", "findings", "evidence_rows"})
# The Evidence sheet's exact times (Excel keeps milliseconds), after the data section's columns.
EXACT = "_exact"
EVIDENCE_SHEET_COLUMNS = (*COLUMNS, *(c + EXACT for c in COLUMNS if c in TIME_FIELDS))
ROW_DIGEST = 16  # hex digits of a row's row_sha256
# Typed sheets: widths in characters by column name, the rest DEFAULT_WIDTH.
WIDTHS = {"id": 26, "finding_id": 26, "summary": 60, "keys": 40, "history": 40, "values": 60, "coordinates": 34,
          "name": 22, "first_seen": 22, "last_seen": 22, "resolved_at": 22, "resolution": 30}
DEFAULT_WIDTH = 14
DATETIME_FORMAT = "yyyy-mm-dd hh:mm:ss.000"
# What XML 1.0 cannot hold or does not keep (CR becomes LF when read back).
NOT_IN_XML = re.compile(r"[\x00-\x08\x0b-\x1f\ufffe\uffff]")
# The CSV of the data section is hashed (and, for a CSV report, kept) in pieces of about this many characters.
SECTION_CHUNK = 1 << 20


# ---------------------------------------------------------------- values

def iso(t: float | None) -> str | None:
    """Epoch seconds as ISO-8601 UTC with microseconds and a Z."""
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


# json.dumps(value, **options) makes a JSONEncoder(**options) per call; reports encode many values.
canonical_json: Callable[[Any], str] = json.JSONEncoder(sort_keys=True, separators=(",", ":"),
                                                        ensure_ascii=False).encode
_indent2: Callable[[Any], str] = json.JSONEncoder(indent=2, ensure_ascii=False).encode


def _raw(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else canonical_json(value)


def _escape(text: str) -> str:
    return NOT_IN_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _text(value: Any) -> str:
    """The text of one cell (module docstring)."""
    return _escape(_raw(value))


def cells_text(values: Iterable[Any]) -> list[str]:
    """`_text` of each value; one search of the whole row spares the escape pass on almost every row."""
    cells = [_raw(v) for v in values]
    return [_escape(c) for c in cells] if NOT_IN_XML.search("".join(cells)) else cells


def _epoch(t: dt.datetime) -> float:
    # Naive datetimes are taken as UTC, as the CLI documents for --since/--until.
    return (t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)).timestamp()


def _plain_json(text: str) -> Any:
    """`plain(from_json(text))` of a store column. Only tagged values ({"$decimal": ...}) need the
    object hook and the second pass; a text with neither a '$' nor its escape holds none, and one
    C-speed parse gives the same values."""
    return plain(from_json(text)) if "$" in text or "\\u0024" in text else json.loads(text)


def _unchanged(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Mask:
    """Hides the values of personal fields wherever they occur inside keys and evidence values.

    With a key, a value becomes "hmac-sha256:" + the first 16 hex digits of HMAC-SHA256(key, value),
    so one customer has one token across rows and reports without being named; without one, "***".
    None stays None: that a field was empty is not personal and auditors may need it.
    """

    fields: frozenset[str]  # lower-case field names
    key: bytes | None = None

    @property
    def kind(self) -> str:
        return "***" if self.key is None else "hmac-sha256"

    def token(self, value: Any) -> str:
        if self.key is None:
            return "***"
        # The text, not the JSON type, is hashed: user 42 in a row and "42" in a payload match.
        text = value if isinstance(value, str) else canonical_json(value)
        return "hmac-sha256:" + hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()[:16]

    def apply(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self.token(v) if k.lower() in self.fields and v is not None else self.apply(v)
                    for k, v in value.items()}
        if isinstance(value, list):
            return [self.apply(v) for v in value]
        return value


# ---------------------------------------------------------------- what an evidence item is about

@dataclass(frozen=True)
class Roles:
    """Which columns of one watched table hold its key, amount and status (from the config's domain)."""

    key: tuple[str, ...] = ()  # one column, or a composite key's
    amount: str | None = None
    status: str | None = None


def roles_of(domain: Domain, announce: Iterable[Announce] = ()) -> dict[str, Roles]:
    """Table -> Roles, for the evidence columns of a report: the domain's tables, then those only announced."""
    out = {a.table: Roles(key=a.key_columns) for a in announce}
    out.update({e.table: Roles(key=(e.trade_no_column,)) for e in domain.effects})
    if (c := domain.callbacks) is not None:
        out[c.table] = Roles((c.trade_no_column,), c.amount_column, c.status_column)
    if (p := domain.payments) is not None:
        out[p.table] = Roles((p.trade_no_column,), p.amount_column, p.status_column)
    if (o := domain.orders) is not None:
        out[o.table] = Roles(o.key_columns, o.amount_column, o.status_column)
    return out


def _roles_for(roles: Mapping[str, Roles], table: Any) -> Roles:
    """The Roles of a real table: its own entry's, or that of the pattern it is a shard of."""
    found = roles.get(table)
    if found is None and isinstance(table, str):
        found = roles.get(_entry(tuple(roles), table) or "")
    return found or Roles()


@lru_cache(maxsize=4096)
def _entry(entries: tuple[str, ...], table: str) -> str | None:
    return Watched(entries).qualified(table)


def _about(kind: str, coordinates: str, values: dict[str, Any], roles: Mapping[str, Roles]) -> dict[str, Any]:
    """An evidence item's table (a topic for an event), key, amount and status: from the columns its table's
    Roles name for a row change, from the payload's logical keys (and the record key) for an event."""
    if kind == "row_change":
        table = values.get("table")
        r = _roles_for(roles, table)
        key = key_of(values, r.key) if r.key else None
        return {"table": table, "key": key_text(key) if isinstance(key, tuple) else key,
                "amount": values.get(r.amount) if r.amount else None,
                "status": values.get(r.status) if r.status else None}
    topic = values.get("topic") or (coordinates.rsplit("/", 1)[0] if "/" in coordinates else None)
    return {"table": topic, "key": values.get("key", values.get("group")), "amount": values.get("amount"),
            "status": values.get("status")}


# ---------------------------------------------------------------- reading the store

def _filter(rule: str | None, status: str | None, since: dt.datetime | None,
            until: dt.datetime | None) -> FindingFilter:
    """The pages' filter, so the Reports page counts what the report holds."""
    return FindingFilter(rules=(rule,) if rule else (), statuses=(status,) if status else (),
                         since=_epoch(since) if since else None, until=_epoch(until) if until else None)


def _history(entries: list[HistoryEntry]) -> list[dict[str, Any]]:
    return [{"at": iso(h.at), "status": h.status, "by": h.by, "reason": h.reason, "note": h.note} for h in entries]


def fields_text(value: Any, prefix: str = "") -> str:
    """Keys or evidence values for people: "name: value" pairs joined by "; ", nested names dotted, lists of
    plain values joined by ", ", text as it is (the JSON columns beside it keep types and exactness)."""
    if not isinstance(value, dict):
        if isinstance(value, list) and not any(isinstance(v, (dict, list)) for v in value):
            return ", ".join(_raw(v) for v in value)
        return _raw(value)
    parts = []
    for k in sorted(value):
        v = value[k]
        if isinstance(v, dict) and v:
            parts.append(fields_text(v, f"{prefix}{k}."))
        else:
            parts.append(f"{prefix}{k}: {fields_text(v)}")
    return "; ".join(parts)


def _item(e: dict[str, Any], values: Any, roles: Mapping[str, Roles]) -> dict[str, Any]:
    return {"kind": e["kind"], **_about(e["kind"], e["coordinates"], values, roles), "coordinates": e["coordinates"],
            "time": iso(e["time"]), "values": values, "fields": fields_text(values)}


def _finding_dict(row: tuple, history: list[HistoryEntry], plain_of: Callable[[Any], Any],
                  hide: Callable[[Any], Any], roles: Mapping[str, Roles], pricing: Pricing | None) -> dict[str, Any]:
    """A finding as plain JSON data for people, from its store row (FINDING_COLUMNS) and history:
    ISO times, exact decimals as strings (`plain_of` makes keys and evidence plain), masked by `hide`;
    each evidence item with what it is about (`_about`), the finding with the money it involves: its rule's,
    else what `pricing` reads from the shop's rows, those rows joining the evidence (dashboards.pricing)."""
    fid, rule, name, severity, status, keys, summary, first_seen, last_seen, resolved_at, resolution, evidence = row
    keys = plain_of(keys)
    evidence = plain_of(evidence)
    amount = keys.get("amount_involved") if isinstance(keys, dict) else None
    if amount is None and pricing is not None and isinstance(keys, dict):
        priced = pricing.price(rule, keys, evidence)
        amount = None if priced.amount is None else str(priced.amount)
        # a row already in the evidence gains the columns it was priced by (an F3's order row its amount)
        read = {(r["kind"], r["coordinates"]): r for r in priced.rows}
        evidence = [{**e, "values": {**read.pop((e["kind"], e["coordinates"]))["values"], **e["values"]}}
                    if (e["kind"], e["coordinates"]) in read else e for e in evidence]
        evidence += read.values()
    shown = hide(keys)
    return {
        "id": fid, "rule": rule, "name": name, "severity": severity, "status": status,
        "first_seen": iso(first_seen), "last_seen": iso(last_seen), "resolved_at": iso(resolved_at),
        "resolution": resolution, "keys": shown, "summary": summary, "amount_involved": amount,
        "history": _history(history), "key_fields": fields_text(shown),
        "evidence": [_item(e, hide(e["values"]), roles) for e in evidence],
    }


def _findings(store: Store, flt: FindingFilter, hide: Callable[[Any], Any], roles: Mapping[str, Roles],
              domain: Domain | None) -> Iterator[dict[str, Any]]:
    pricing = Pricing(domain, store) if domain is not None else None
    for row, history in findings_with_history(store, flt):
        yield _finding_dict(row, history, _plain_json, hide, roles, pricing)


def findings_json(store: Store, *, rule: str | None = None, status: str | None = None,
                  since: dt.datetime | None = None, until: dt.datetime | None = None,
                  roles: Mapping[str, Roles] | None = None, domain: Domain | None = None) -> list[dict[str, Any]]:
    """What `oncewatch findings --format json` prints, and the "findings" of a JSON report: findings
    by rule and status, seen during [since, until), ordered by first_seen then id, with their history.
    `roles` (`roles_of` the config's domain) says which columns hold each table's key, amount, status;
    `domain` (the config's) prices the findings whose rule does not (dashboards.pricing)."""
    with store.snapshot():
        return list(_findings(store, _filter(rule, status, since, until), _unchanged, roles or {}, domain))


def findings_table(findings: list[dict[str, Any]]) -> str:
    """A fixed-width table of `findings_json` output for a terminal, one line per finding."""
    if not findings:
        return "no findings"
    head = ("id", "rule", "severity", "status", "first_seen", "last_seen", "evidence", "keys", "summary")
    lines = [head] + [(f["id"], f["rule"], f["severity"], f["status"], f["first_seen"], f["last_seen"],
                       str(len(f["evidence"])), " ".join(f"{k}={_text(v)}" for k, v in sorted(f["keys"].items())),
                       f["summary"]) for f in findings]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)) + "  " + line[-1] for line in lines)


# ---------------------------------------------------------------- the data section and its hash

def finding_lines(f: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One finding of `findings_json` output: its cells (FINDING_FIELDS) and its rows of the data section."""
    head = cells_text(f[name] for name in FINDING_FIELDS)
    if not f["evidence"]:
        return head, [_signed(head + [""] * len(EVIDENCE_FIELDS))]
    return head, [_signed(head + cells_text(e[name] for name in EVIDENCE_FIELDS)) for e in f["evidence"]]


def row_sha256(cells: Sequence[str]) -> str:
    """A data row's row_sha256: the first ROW_DIGEST hex digits of the SHA-256 of its other cells, each
    followed by a NUL (which no cell holds: `_escape`), which tells `oncewatch verify` the row an edit is in."""
    return sha256_hex(("\0".join(cells) + "\0").encode())[:ROW_DIGEST]


def _signed(cells: list[str]) -> list[str]:
    return [*cells, row_sha256(cells)]


class ColumnHashes:
    """columns_sha256: per column of the data section, the SHA-256 of its cells one after another, each
    followed by a NUL; it tells `oncewatch verify` the column an edit is in."""

    def __init__(self) -> None:
        self._sha = [hashlib.sha256() for _ in COLUMNS]

    def add(self, lines: Sequence[Sequence[str]]) -> None:
        if lines:
            for sha, column in zip(self._sha, zip(*lines)):
                sha.update(("\0".join(column) + "\0").encode())

    def digests(self) -> dict[str, str]:
        return {name: sha.hexdigest() for name, sha in zip(COLUMNS, self._sha)}


def rows(findings: list[dict[str, Any]]) -> list[list[str]]:
    """The data section: one row of COLUMNS per evidence item of `findings_json` output."""
    return [line for f in findings for line in finding_lines(f)[1]]


def csv_bytes(table: Iterable[Iterable[str]]) -> bytes:
    buf = io.StringIO(newline="")
    csv.writer(buf).writerows(table)
    return buf.getvalue().encode()


class _Section:
    """The data section as CSV (module docstring), written as the findings come: its SHA-256, its
    row count and, when `keep`, its bytes; what is hashed is never held whole unless kept."""

    def __init__(self, keep: bool):
        self._buf = io.StringIO(newline="")
        self._writer = csv.writer(self._buf)
        self._sha = hashlib.sha256()
        self.chunks: list[bytes] | None = [] if keep else None
        self.rows = 0
        self.columns = ColumnHashes()
        self._lines: list[list[str]] = []  # those written since the last flush: columns are hashed a chunk at once
        self._writer.writerow(COLUMNS)

    def add(self, lines: list[list[str]]) -> None:
        self._writer.writerows(lines)
        self._lines += lines
        self.rows += len(lines)
        if self._buf.tell() >= SECTION_CHUNK:
            self._flush()

    def _flush(self) -> None:
        self.columns.add(self._lines)
        self._lines.clear()
        chunk = self._buf.getvalue().encode()
        self._buf.seek(0)
        self._buf.truncate()
        self._sha.update(chunk)
        if self.chunks is not None:
            self.chunks.append(chunk)

    def sha256(self) -> str:
        """data_sha256, once every row is in; columns_sha256 is then complete too."""
        self._flush()
        return self._sha.hexdigest()


def data_section(data: list[list[str]]) -> bytes:
    """The canonical bytes that data_sha256 covers (module docstring)."""
    return csv_bytes([COLUMNS, *data])


def sha256_hex(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ---------------------------------------------------------------- writers

def header_items(header: dict[str, Any]) -> list[tuple[str, str]]:
    return [(k, _text(v)) for k, v in header.items()]


def header_sha256(items: Iterable[tuple[str, str]]) -> str:
    """report_sha256: SHA-256 of the header's fields before it, as the text the file holds them in
    (module docstring); data_sha256 is one of them, so it covers the whole report."""
    return sha256_hex(canonical_json([[k, v] for k, v in items if k != "report_sha256"]).encode())


def fields_sha256(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """fields_sha256: per header field before it, the first ROW_DIGEST hex digits of the SHA-256 of its text,
    which tells `oncewatch verify` the field an edit is in."""
    return {k: sha256_hex(v.encode())[:ROW_DIGEST] for k, v in items if k not in ("fields_sha256", "report_sha256")}


class _Writer(Protocol):
    """One format: takes the findings one by one (as `findings_json` output, and as their cells and
    rows of the data section), then the header, which counts and hashes them."""

    keeps_section: bool  # whether the file holds the data section's CSV as it is

    def add(self, finding: dict[str, Any], cells: list[str], lines: list[list[str]]) -> None: ...

    def finish(self, header: dict[str, Any], section: _Section) -> bytes: ...


class _CsvWriter:
    """The header lines, then the data section as `_Section` kept it."""

    keeps_section = True

    def add(self, finding: dict[str, Any], cells: list[str], lines: list[list[str]]) -> None:
        pass

    def finish(self, header: dict[str, Any], section: _Section) -> bytes:
        block = "".join(f"# {k}: {v}".rstrip() + "\r\n" for k, v in header_items(header)).encode()
        return b"".join([block, *(section.chunks or ())])


def _indented(value: Any, level: int) -> str:
    """`value` as json.dumps(indent=2) writes it `level` levels deep in a document (strings in JSON
    hold no raw line feed, so every one is a line break of the layout)."""
    return _indent2(value).replace("\n", "\n" + "  " * level)


class _JsonWriter:
    """json.dumps({"header": ..., "findings": [...]}, indent=2, ensure_ascii=False) + "\\n", byte for
    byte, with each finding's text made (and encoded) when it comes."""

    keeps_section = False

    def __init__(self) -> None:
        self.items: list[bytes] = []

    def add(self, finding: dict[str, Any], cells: list[str], lines: list[list[str]]) -> None:
        separator = ",\n    " if self.items else "\n    "
        finding = {**finding, "rows_sha256": [line[-1] for line in lines]}
        self.items.append((separator + _indented(finding, 2)).encode())

    def finish(self, header: dict[str, Any], section: _Section) -> bytes:
        head = f'{{\n  "header": {_indented(header, 1)},\n  "findings": '.encode()
        if not self.items:
            return head + b"[]\n}\n"
        return b"".join([head, b"[", *self.items, b"\n  ]\n}\n"])


def _as_text(ws: WriteOnlyWorksheet, line: Iterable[Any]) -> list[Any]:
    """Text stays text: openpyxl would take '=...' for a formula and '#N/A' for an error."""
    out = list(line)
    for i, value in enumerate(out):
        if isinstance(value, str) and (value.startswith("=") or value in ERROR_CODES):
            out[i] = cell = WriteOnlyCell(ws, value)
            cell.data_type = "s"
    return out


class _Sheet:
    """One write-only sheet: its header row frozen, widths by column name, rows counted for the autofilter."""

    def __init__(self, book: Workbook, title: str, columns: Sequence[str]):
        self.ws = book.create_sheet(title)
        self.ws.freeze_panes = "A2"
        for i, name in enumerate(columns, start=1):
            self.ws.column_dimensions[get_column_letter(i)].width = WIDTHS.get(name, DEFAULT_WIDTH)
        self.width, self.rows = len(columns), -1
        self.append(columns)

    def append(self, line: Iterable[Any]) -> None:
        self.ws.append(_as_text(self.ws, line))
        self.rows += 1

    def cell(self, value: Any, number_format: str | None = None) -> WriteOnlyCell:
        cell = WriteOnlyCell(self.ws, value)
        if number_format:
            cell.number_format = number_format
        return cell

    def typed(self, columns: Sequence[str], texts: Sequence[str], after: Sequence[str] = ()) -> None:
        """A row of `texts` written as `_typed` says, then the cells `after` as text."""
        self.append([*(_typed(self, name, text) for name, text in zip(columns, texts)), *after])

    def filter(self) -> None:
        self.ws.auto_filter.ref = f"A1:{get_column_letter(self.width)}{self.rows + 1}"


def when_of(text: str) -> dt.datetime | None:
    """A report's time text as the naive UTC datetime a sheet holds, None for other text."""
    if not text.endswith("Z"):
        return None
    try:
        return dt.datetime.fromisoformat(text[:-1])
    except ValueError:
        return None


def ms_iso(t: dt.datetime) -> str:
    return t.isoformat(timespec="milliseconds") + "Z"


def _amount_format(scale: int) -> str:
    return "#,##0" + ("." + "0" * scale if scale else "")


def number_text(value: float | int, number_format: str) -> str:
    """An amount cell as text: its digits to the scale its number format shows (what `_number` wrote)."""
    exact = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    scale = len(number_format.partition(".")[2].rstrip(";")) if "." in number_format else 0
    quantum = Decimal(1).scaleb(-scale)
    return str(exact.quantize(quantum)) if exact == exact.quantize(quantum) else repr(value)


def _number(text: str) -> tuple[Decimal, str] | None:
    """An amount's text as a number and the format that shows it as the same text; None when a spreadsheet's
    binary floating point could not give the text back (then the cell stays text)."""
    try:
        d = Decimal(text)
    except InvalidOperation:
        return None
    if not d.is_finite() or str(d) != text or d.as_tuple().exponent > 0:
        return None
    fmt = _amount_format(-d.as_tuple().exponent)
    return (d, fmt) if number_text(float(d), fmt) == text else None


def _typed(sheet: _Sheet, name: str, text: str) -> Any:
    """A cell of a typed sheet from its text: times as dates (UTC, to the millisecond Excel keeps), amounts as
    numbers (shown to their scale), counts as integers; other text, and text that is not one, as it is."""
    if not text:
        return None
    if name in TIME_FIELDS and (when := when_of(text)) is not None:
        # the millisecond Excel keeps, as `report_check.shown` says it: openpyxl writes a serial in 16 digits, and a
        # header's time (to the microsecond) at half a millisecond read back as the millisecond below, so about one
        # XLSX report in 2,500 failed its own verification (tests/unit/test_pages.py, on a fresh clone)
        return sheet.cell(from_excel(to_excel(when)), DATETIME_FORMAT)
    if name in AMOUNT_FIELDS and (number := _number(text)) is not None:
        return sheet.cell(*number)
    if name in COUNT_FIELDS and text.isdigit():
        return int(text)
    return text




def _rule_order(rule: str) -> tuple[int, str]:
    return len(rule), rule  # F2 before F10


FINDING_CELLS = len(FINDING_FIELDS)
KIND_AT = COLUMNS.index("evidence_kind")


class Derived:
    """The Summary, Findings and History sheets as text, from the data section's rows, finding by finding:
    how the XLSX writer makes them and how `oncewatch verify` tells whether a sheet still says what the data says."""

    def __init__(self) -> None:
        self.by_rule: dict[str, list[Any]] = {}  # rule -> [name, findings, standing, amount or None]

    def add(self, lines: Sequence[Sequence[str]]) -> tuple[list[str], list[list[str]]]:
        """One finding's data rows: its Findings row and its History rows."""
        cells = dict(zip(FINDING_FIELDS, lines[0][:FINDING_CELLS]))
        rule = self.by_rule.setdefault(cells["rule"], [cells["name"], 0, 0, None])
        rule[1] += 1
        rule[2] += cells["status"] != RESOLVED
        amount = _number(cells["amount_involved"]) if cells["amount_involved"] else None
        if amount is not None:
            rule[3] = (rule[3] or Decimal(0)) + amount[0]
        try:
            history = json.loads(cells["history"]) if cells["history"] else []
        except ValueError:
            history = []
        entries = [[cells["id"], *cells_text(h.get(name) for name in HISTORY_COLUMNS[1:])]
                   for h in history if isinstance(h, dict)]
        return [*lines[0][:FINDING_CELLS], str(sum(1 for line in lines if line[KIND_AT]))], entries

    def summary(self) -> list[list[str]]:
        return [[rule, name, str(count), str(standing), "" if amount is None else str(amount)]
                for rule, (name, count, standing, amount) in sorted(self.by_rule.items(),
                                                                    key=lambda item: _rule_order(item[0]))]


class _XlsxWriter:
    """Sheets Report, Summary, Findings, Evidence and History, streamed to openpyxl's temporary files
    (write-only mode); Report and Summary, first in the book, are filled last.

    Every sheet but Report is typed (`_typed`) and derived from the data section: Evidence is it, with each
    time's exact text beside it; Summary, Findings and History say what its rows say (`Derived`), so that
    `oncewatch verify` finds an edit of any of them. Widths, frozen header rows and an autofilter are for people."""

    keeps_section = False

    def __init__(self) -> None:
        self.book = Workbook(write_only=True)
        self.report = _Sheet(self.book, "Report", REPORT_COLUMNS)
        self.summary = _Sheet(self.book, "Summary", SUMMARY_COLUMNS)
        self.findings = _Sheet(self.book, "Findings", FINDINGS_COLUMNS)
        self.evidence = _Sheet(self.book, "Evidence", EVIDENCE_SHEET_COLUMNS)
        self.history = _Sheet(self.book, "History", HISTORY_COLUMNS)
        self.derived = Derived()

    def add(self, finding: dict[str, Any], cells: list[str], lines: list[list[str]]) -> None:
        row, entries = self.derived.add(lines)
        self.findings.typed(FINDINGS_COLUMNS, row)
        for line in lines:
            self.evidence.typed(COLUMNS, line, [line[i] for i in EXACT_AT])
        for entry in entries:
            self.history.typed(HISTORY_COLUMNS, entry)

    def finish(self, header: dict[str, Any], section: _Section) -> bytes:
        for name, text in header_items(header):
            self.report.append([name, text, _typed(self.report, name, text) if name in TYPED_HEADER else None])
        for line in self.derived.summary():
            self.summary.typed(SUMMARY_COLUMNS, line)
        for sheet in (self.summary, self.findings, self.evidence, self.history):
            sheet.filter()
        out = io.BytesIO()
        self.book.save(out)
        return out.getvalue()


EXACT_AT = [COLUMNS.index(c) for c in COLUMNS if c in TIME_FIELDS]


WRITERS: dict[str, Callable[[], _Writer]] = {"csv": _CsvWriter, "json": _JsonWriter, "xlsx": _XlsxWriter}


def _kafka_order(item: tuple[str, int]) -> tuple[str, int]:
    return split_partition_key(item[0])


def export(store: Store, fmt: str, *, rule: str | None = None, status: str | None = None,
           since: dt.datetime | None = None, until: dt.datetime | None = None, mask: bool = False,
           mask_fields: Collection[str] = (), mask_key: bytes | None = None, config_fingerprint: str,
           roles: Mapping[str, Roles] | None = None, domain: Domain | None = None,
           now: dt.datetime | None = None) -> bytes:
    """One report as the bytes of a file of format `fmt` (module docstring).

    `mask=True` masks the values of `mask_fields` (the config's export.mask_fields) with a keyed
    hash when `mask_key` (export.mask_key) is given, else with "***". `roles`: `roles_of` the
    config's domain, for the evidence columns; `domain`: the config's, to price the findings whose rule does
    not (dashboards.pricing). SQL selects the findings; they are read and written
    one at a time, so only the file being made grows with their number.
    """
    if fmt not in WRITERS:
        raise ValueError(f"unknown report format {fmt!r}: use one of {', '.join(FORMATS)}")
    if mask and not mask_fields:
        raise ValueError("mask=True needs mask_fields: pass the config's export.mask_fields")
    masking = Mask(frozenset(f.lower() for f in mask_fields), mask_key) if mask else None
    hide = masking.apply if masking else _unchanged
    writer = WRITERS[fmt]()
    section = _Section(keep=writer.keeps_section)
    found, earliest = 0, None
    generated_at = _epoch(now or dt.datetime.now(dt.timezone.utc))
    with store.snapshot():
        binlog = store.checkpoint(BINLOG_CHECKPOINT)
        kafka = store.checkpoint(KAFKA_CHECKPOINT) or {}
        for finding in _findings(store, _filter(rule, status, since, until), hide, roles or {}, domain):
            cells, lines = finding_lines(finding)
            section.add(lines)
            writer.add(finding, cells, lines)
            found += 1
            earliest = earliest or finding["first_seen"]  # they come by first_seen
    header = {
        "report": REPORT_VERSION,
        "generated_at": iso(generated_at),
        "since": iso(_epoch(since)) if since else earliest,
        "until": iso(_epoch(until)) if until else iso(generated_at),
        "rule": rule, "status": status,
        "mask": masking.kind if masking else "off",
        "masked_fields": sorted(masking.fields) if masking else [],
        "binlog_position": binlog,
        "kafka_positions": dict(sorted(kafka.items(), key=_kafka_order)),
        "config_sha256": config_fingerprint,
        "findings": found, "evidence_rows": section.rows,
    }
    data_sha256 = section.sha256()
    header.update(columns_sha256=section.columns.digests(), data_sha256=data_sha256)
    header["fields_sha256"] = fields_sha256(header_items(header))
    header["report_sha256"] = header_sha256(header_items(header))
    return writer.finish(header, section)


# ---------------------------------------------------------------- for the dashboard

def report(cfg: Config, fmt: str, *, rule: str | None = None, status: str | None = None,
           since: dt.datetime | None = None, until: dt.datetime | None = None, mask: bool = False) -> bytes:
    """The auditor's report `oncewatch export` writes, as bytes for a download button."""
    with closing(open_reader(cfg.store.target)) as store:
        return export(store, fmt, rule=rule, status=status, since=since, until=until, mask=mask,
                      mask_fields=cfg.export.mask_fields, mask_key=cfg.export.key() if mask else None,
                      config_fingerprint=cfg.content_sha256, roles=roles_of(cfg.domain, cfg.announce),
                      domain=cfg.domain)
