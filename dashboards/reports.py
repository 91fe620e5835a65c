"""Auditors' reports: findings with their evidence as CSV, JSON or XLSX, checkable later (DESIGN §1).

`export()` makes one report; `oncewatch export` and the dashboard's Reports page both call it.
`oncewatch findings` prints the same finding dicts (`findings_json`) or a table (`findings_table`).
A finding carries its history: every change of its status after it opened, by the monitor (the
fact that ended it, a lapse) or by a person (an acknowledgement, a close with its reason).
`verify()` checks a report file against the hash it carries.

A report is a header and a data section.

Header (CSV: the leading lines `# field: value`; JSON: "header"; XLSX: sheet "Report"):
  report            format version of the report, "oncewatch-report/2" (2 added the history)
  generated_at      when the report was made
  since, until      the requested time range, empty = unbounded; a finding is in it when it was
                    seen during [since, until): last_seen >= since and first_seen < until
  rule, status      the other filters, empty = all
  mask              "off", "***" (masked values replaced) or "hmac-sha256" (replaced by a keyed
                    hash, so equal values give equal tokens and reports can be compared)
  masked_fields     the field names masked wherever they occur inside keys and evidence values
  binlog_position   how far the monitor had read the binlog: {"gtid", "file", "pos"}
  kafka_positions   how far it had read each partition: {"topic/partition": next offset}
  config_sha256     Config.fingerprint() of the config in use (its secrets masked before hashing)
  findings, evidence_rows   counts
  data_sha256       SHA-256 of the data section, as defined below
The header and the data are read in one store transaction, so the positions are the ones the
findings were produced at. In JSON, empty header values are null and positions are objects; in
CSV and XLSX, they are empty text and compact JSON text.

Data section: one row per evidence item (a finding without evidence gives one row with the
evidence columns empty); findings ordered by first_seen then id, evidence in the order the rule
gave it; columns COLUMNS:
  finding_id, rule, name, severity, status, first_seen, last_seen, resolved_at, resolution,
  keys, summary, history, evidence_kind, coordinates, evidence_time, values
history is a JSON list, oldest first, of {"at", "status" (the status it changed to), "by"
("oncewatch" or the person), "reason" (a close's reason, else null), "note"}; XLSX also lays it
out on a sheet "History", one row per change (not hashed: it repeats the data section).
Times are ISO-8601 UTC with microseconds ("2024-05-01T12:00:00.123456Z"). keys and values are
JSON with sorted keys, no spaces and non-ASCII characters as they are; exact decimals are
strings ("12.50"). Empty cells are empty strings. Control characters other than tab and line
feed, and U+FFFE/U+FFFF, are written as \\uXXXX in every cell, so that XLSX (XML, which cannot
hold them, and turns CR into LF) keeps the same text as CSV.

data_sha256 = SHA-256 of the data section written as CSV: the COLUMNS row, then the data rows,
every cell a string, as RFC 4180 and Python's default csv.writer write it: cells separated by
commas, CRLF after every row, a cell in double quotes only when it holds a comma, a double quote
(doubled inside), CR or LF; UTF-8 without BOM. It is the same for
the three formats of one report. To recompute it:
  CSV   hash the bytes from the first line that does not start with '#' to the end of the file
        (`sed -n '/^[^#]/,$p' report.csv | sha256sum`);
  XLSX  write the "Evidence" sheet (the data section, every cell text) as above and hash that;
  JSON  flatten "findings" into rows as `rows()` does, write them as above and hash that.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import hmac
import io
import json
import re
import zipfile
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from openpyxl import Workbook, load_workbook
from openpyxl.cell import WriteOnlyCell
from openpyxl.cell.cell import ERROR_CODES

from oncewatch.core.config import Config
from oncewatch.core.exact_json import from_json, plain
from oncewatch.core.names import BINLOG_CHECKPOINT, KAFKA_CHECKPOINT, split_partition_key
from oncewatch.store import Store, open_reader
from oncewatch.store.codec import HistoryEntry
from oncewatch.store.queries import FindingFilter, findings_with_history

if TYPE_CHECKING:
    from openpyxl.worksheet._write_only import WriteOnlyWorksheet

REPORT_VERSION = "oncewatch-report/2"
FORMATS = ("csv", "json", "xlsx")

FINDING_FIELDS = ("id", "rule", "name", "severity", "status", "first_seen", "last_seen", "resolved_at",
                  "resolution", "keys", "summary", "history")
EVIDENCE_FIELDS = ("kind", "coordinates", "time", "values")
COLUMNS = ("finding_id", *FINDING_FIELDS[1:], "evidence_kind", "coordinates", "evidence_time", "values")
HISTORY_COLUMNS = HistoryEntry._fields  # XLSX sheet "History"
# What XML 1.0 cannot hold or does not keep (CR becomes LF when read back).
NOT_IN_XML = re.compile(r"[\x00-\x08\x0b-\x1f\ufffe\uffff]")
# The CSV of the data section is hashed (and, for a CSV report, kept) in pieces of about this many characters.
SECTION_CHUNK = 1 << 20


class ReportError(ValueError):
    """A file given to `verify()` is not an oncewatch report of the stated format."""


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


def _cells(values: Iterable[Any]) -> list[str]:
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


# ---------------------------------------------------------------- reading the store

def _filter(rule: str | None, status: str | None, since: dt.datetime | None,
            until: dt.datetime | None) -> FindingFilter:
    """The pages' filter, so the Reports page counts what the report holds."""
    return FindingFilter(rules=(rule,) if rule else (), statuses=(status,) if status else (),
                         since=_epoch(since) if since else None, until=_epoch(until) if until else None)


def _history(entries: list[HistoryEntry]) -> list[dict[str, Any]]:
    return [{"at": iso(h.at), "status": h.status, "by": h.by, "reason": h.reason, "note": h.note} for h in entries]


def _finding_dict(row: tuple, history: list[HistoryEntry], plain_of: Callable[[Any], Any],
                  hide: Callable[[Any], Any]) -> dict[str, Any]:
    """A finding as plain JSON data for people, from its store row (FINDING_COLUMNS) and history:
    ISO times, exact decimals as strings (`plain_of` makes keys and evidence plain), masked by `hide`."""
    fid, rule, name, severity, status, keys, summary, first_seen, last_seen, resolved_at, resolution, evidence = row
    return {
        "id": fid, "rule": rule, "name": name, "severity": severity, "status": status,
        "first_seen": iso(first_seen), "last_seen": iso(last_seen), "resolved_at": iso(resolved_at),
        "resolution": resolution, "keys": hide(plain_of(keys)), "summary": summary, "history": _history(history),
        "evidence": [{"kind": e["kind"], "coordinates": e["coordinates"], "time": iso(e["time"]),
                      "values": hide(e["values"])} for e in plain_of(evidence)],
    }


def _findings(store: Store, flt: FindingFilter, hide: Callable[[Any], Any]) -> Iterator[dict[str, Any]]:
    for row, history in findings_with_history(store, flt):
        yield _finding_dict(row, history, _plain_json, hide)


def findings_json(store: Store, *, rule: str | None = None, status: str | None = None,
                  since: dt.datetime | None = None, until: dt.datetime | None = None) -> list[dict[str, Any]]:
    """What `oncewatch findings --format json` prints, and the "findings" of a JSON report: findings
    by rule and status, seen during [since, until), ordered by first_seen then id, with their history."""
    with store.snapshot():
        return list(_findings(store, _filter(rule, status, since, until), _unchanged))


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

def _finding_rows(f: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One finding of `findings_json` output: its cells (FINDING_FIELDS) and its rows of the data section."""
    head = _cells(f[name] for name in FINDING_FIELDS)
    if not f["evidence"]:
        return head, [head + [""] * len(EVIDENCE_FIELDS)]
    return head, [head + _cells(e[name] for name in EVIDENCE_FIELDS) for e in f["evidence"]]


def rows(findings: list[dict[str, Any]]) -> list[list[str]]:
    """The data section: one row of COLUMNS per evidence item of `findings_json` output."""
    return [line for f in findings for line in _finding_rows(f)[1]]


def _csv(table: Iterable[Iterable[str]]) -> bytes:
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
        self._writer.writerow(COLUMNS)

    def add(self, lines: list[list[str]]) -> None:
        self._writer.writerows(lines)
        self.rows += len(lines)
        if self._buf.tell() >= SECTION_CHUNK:
            self._flush()

    def _flush(self) -> None:
        chunk = self._buf.getvalue().encode()
        self._buf.seek(0)
        self._buf.truncate()
        self._sha.update(chunk)
        if self.chunks is not None:
            self.chunks.append(chunk)

    def sha256(self) -> str:
        self._flush()
        return self._sha.hexdigest()


def data_section(data: list[list[str]]) -> bytes:
    """The canonical bytes that data_sha256 covers (module docstring)."""
    return _csv([COLUMNS, *data])


def _sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ---------------------------------------------------------------- writers

def _header_items(header: dict[str, Any]) -> list[tuple[str, str]]:
    return [(k, _text(v)) for k, v in header.items()]


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
        block = "".join(f"# {k}: {v}".rstrip() + "\r\n" for k, v in _header_items(header)).encode()
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


class _XlsxWriter:
    """Sheets Report, Findings, Evidence and History, streamed to openpyxl's temporary files (write-only
    mode); the Report sheet, first in the book, is filled last, when the hash is known."""

    keeps_section = False

    def __init__(self) -> None:
        self.book = Workbook(write_only=True)
        self.report, self.findings, self.evidence, self.history = map(
            self._sheet, ("Report", "Findings", "Evidence", "History"))
        self._append(self.findings, [*COLUMNS[:len(FINDING_FIELDS)], "evidence_items"])
        self._append(self.evidence, COLUMNS)
        self._append(self.history, HISTORY_COLUMNS)

    def _sheet(self, title: str) -> WriteOnlyWorksheet:
        ws = self.book.create_sheet(title)
        ws.freeze_panes = "A2"
        return ws

    @staticmethod
    def _append(ws: WriteOnlyWorksheet, line: Iterable[Any]) -> None:
        ws.append(_as_text(ws, line))

    def add(self, finding: dict[str, Any], cells: list[str], lines: list[list[str]]) -> None:
        self._append(self.findings, [*cells, len(finding["evidence"])])
        for line in lines:
            self._append(self.evidence, line)
        for h in finding["history"]:
            self._append(self.history, [finding["id"], *_cells(h[name] for name in HISTORY_COLUMNS[1:])])

    def finish(self, header: dict[str, Any], section: _Section) -> bytes:
        for line in [("field", "value"), *_header_items(header)]:
            self._append(self.report, line)
        out = io.BytesIO()
        self.book.save(out)
        return out.getvalue()


WRITERS: dict[str, Callable[[], _Writer]] = {"csv": _CsvWriter, "json": _JsonWriter, "xlsx": _XlsxWriter}


def _kafka_order(item: tuple[str, int]) -> tuple[str, int]:
    return split_partition_key(item[0])


def export(store: Store, fmt: str, *, rule: str | None = None, status: str | None = None,
           since: dt.datetime | None = None, until: dt.datetime | None = None, mask: bool = False,
           mask_fields: Collection[str] = (), mask_key: bytes | None = None, config_fingerprint: str,
           now: dt.datetime | None = None) -> bytes:
    """One report as the bytes of a file of format `fmt` (module docstring).

    `mask=True` masks the values of `mask_fields` (the config's export.mask_fields) with a keyed
    hash when `mask_key` (export.mask_key) is given, else with "***".
    SQL selects the findings; they are read and written one at a time, so only the file being
    made grows with their number.
    """
    if fmt not in WRITERS:
        raise ValueError(f"unknown report format {fmt!r}: use one of {', '.join(FORMATS)}")
    if mask and not mask_fields:
        raise ValueError("mask=True needs mask_fields: pass the config's export.mask_fields")
    masking = Mask(frozenset(f.lower() for f in mask_fields), mask_key) if mask else None
    hide = masking.apply if masking else _unchanged
    writer = WRITERS[fmt]()
    section = _Section(keep=writer.keeps_section)
    found = 0
    with store.snapshot():
        binlog = store.checkpoint(BINLOG_CHECKPOINT)
        kafka = store.checkpoint(KAFKA_CHECKPOINT) or {}
        for finding in _findings(store, _filter(rule, status, since, until), hide):
            cells, lines = _finding_rows(finding)
            section.add(lines)
            writer.add(finding, cells, lines)
            found += 1
    header = {
        "report": REPORT_VERSION,
        "generated_at": iso(_epoch(now or dt.datetime.now(dt.timezone.utc))),
        "since": iso(_epoch(since)) if since else None,
        "until": iso(_epoch(until)) if until else None,
        "rule": rule, "status": status,
        "mask": masking.kind if masking else "off",
        "masked_fields": sorted(masking.fields) if masking else [],
        "binlog_position": binlog,
        "kafka_positions": dict(sorted(kafka.items(), key=_kafka_order)),
        "config_sha256": config_fingerprint,
        "findings": found, "evidence_rows": section.rows,
        "data_sha256": section.sha256(),
    }
    return writer.finish(header, section)


# ---------------------------------------------------------------- verification

def _read_csv(data: bytes) -> tuple[str | None, bytes]:
    pos, claimed = 0, None
    while data.startswith(b"#", pos):
        end = data.find(b"\n", pos) + 1 or len(data)  # find() gives -1 on a last line without newline
        name, _, value = data[pos:end].decode(errors="replace").removeprefix("#").partition(":")
        claimed = value.strip() if name.strip() == "data_sha256" else claimed
        pos = end
    return claimed, data[pos:]


def _read_json(data: bytes) -> tuple[str | None, bytes]:
    try:
        doc = json.loads(data)
        return doc["header"].get("data_sha256"), data_section(rows(doc["findings"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"not an oncewatch JSON report ({exc}); was it written by `oncewatch export`?") from exc


def _read_xlsx(data: bytes) -> tuple[str | None, bytes]:
    try:
        wb = load_workbook(io.BytesIO(data), read_only=True)
        header = dict(wb["Report"].iter_rows(min_row=2, values_only=True))
        table = [["" if v is None else str(v) for v in line] for line in wb["Evidence"].iter_rows(values_only=True)]
        wb.close()
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise ReportError(f"not an oncewatch XLSX report ({exc}); was it written by `oncewatch export`?") from exc
    return header.get("data_sha256"), _csv(table)


READERS: dict[str, Callable[[bytes], tuple[str | None, bytes]]] = {
    "csv": _read_csv, "json": _read_json, "xlsx": _read_xlsx}


def verify(data: bytes, fmt: str) -> bool:
    """Whether the data section of a report still has the SHA-256 its header states."""
    if fmt not in READERS:
        raise ValueError(f"unknown report format {fmt!r}: use one of {', '.join(FORMATS)}")
    claimed, section = READERS[fmt](data)
    if not claimed:
        raise ReportError(f"no data_sha256 in the header: not an oncewatch {fmt} report")
    return hmac.compare_digest(claimed, _sha256(section))


# ---------------------------------------------------------------- for the dashboard

def report(cfg: Config, fmt: str, *, rule: str | None = None, status: str | None = None,
           since: dt.datetime | None = None, until: dt.datetime | None = None, mask: bool = False) -> bytes:
    """The auditor's report `oncewatch export` writes, as bytes for a download button."""
    with closing(open_reader(cfg.store.path)) as store:
        return export(store, fmt, rule=rule, status=status, since=since, until=until, mask=mask,
                      mask_fields=cfg.export.mask_fields, mask_key=cfg.export.key() if mask else None,
                      config_fingerprint=cfg.fingerprint())
