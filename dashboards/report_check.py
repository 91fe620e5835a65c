"""`oncewatch verify`: whether a report still shows what `oncewatch export` wrote, and where it does not.

`check()` reads a report of any format back (`READERS`) into its header fields and its data section as
text, recomputes data_sha256 and report_sha256 (dashboards.reports says what they cover), and places each
difference: a header field by fields_sha256, a data cell by its row's row_sha256 and columns_sha256, an
XLSX sheet's cell by comparing Summary, Findings and History with what the Evidence rows give
(`reports.Derived`) and each typed time with its exact text; a sheet added or removed, a field added to a
JSON finding, are named too.
"""

from __future__ import annotations

import csv
import datetime as dt
import hmac
import io
import json
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from openpyxl import load_workbook
from openpyxl.utils import get_column_letter
from openpyxl.utils.datetime import from_excel, to_excel

from oncewatch.dashboards.reports import (AMOUNT_FIELDS, COLUMNS, EVIDENCE_FIELDS, EVIDENCE_SHEET_COLUMNS, EXACT,
                                          FINDING_FIELDS, FINDINGS_COLUMNS, FORMATS, HEADER_FIELDS, HISTORY_COLUMNS,
                                          REPORT_COLUMNS, ROW_DIGEST, SHEETS, SUMMARY_COLUMNS, TIME_FIELDS,
                                          TYPED_HEADER, ColumnHashes, Derived, canonical_json, cells_text, csv_bytes,
                                          fields_sha256, finding_lines, header_items, header_sha256, ms_iso,
                                          number_text, row_sha256, sha256_hex, when_of)


class ReportError(ValueError):
    """A file given to `verify()` is not an oncewatch report of the stated format."""


def shown(name: str, text: str) -> str:
    """What `_read` gives back for a cell `_typed` wrote from `text`: times to the millisecond."""
    when = when_of(text) if name in TIME_FIELDS else None
    return text if when is None else ms_iso(from_excel(to_excel(when)))


def cell_text(name: str, value: Any, number_format: str) -> str:
    """A cell of a typed sheet, as read back, as text."""
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return ms_iso(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if name in AMOUNT_FIELDS:
            return number_text(value, number_format)
        return str(int(value)) if float(value).is_integer() else repr(value)
    return str(value)


@dataclass(frozen=True)
class _Parts:
    """What a reader found in a report: the header as (field, text) pairs in the file's order, the data
    section as rows of text (COLUMNS first) and as the bytes data_sha256 covers, where a header field and a
    data row are in the file, and what it found changed on the way (sheets that no longer say what the data
    section says, fields that are not the report's)."""

    header: list[tuple[str, str]]
    table: list[list[str]]
    section: bytes
    header_at: Callable[[int, str], str]
    row_at: Callable[[int], str]
    problems: tuple[str, ...] = ()


def _read_csv(data: bytes) -> _Parts:
    pos, header = 0, []
    while data.startswith(b"#", pos):
        end = data.find(b"\n", pos) + 1 or len(data)  # find() gives -1 on a last line without newline
        name, _, value = data[pos:end].decode(errors="replace").removeprefix("#").partition(":")
        header.append((name.strip(), value.strip()))
        pos = end
    table = list(csv.reader(io.StringIO(data[pos:].decode(errors="replace"), newline="")))
    return _Parts(header, table, data[pos:], lambda i, name: f"header field {name} (line {i + 1})",
                  lambda i: f"data row {i + 1}" + (f" (finding {table[i + 1][0]})" if table[i + 1] else ""))


JSON_FINDING_FIELDS = frozenset({*FINDING_FIELDS, "evidence", "rows_sha256"})


# Format 3's data section: its JSON reports are flattened with its columns (nothing placed a change then).
V3 = "oncewatch-report/3"
LEGACY = frozenset({"oncewatch-report/1", "oncewatch-report/2", V3})  # formats without fields_sha256
V3_FINDING_FIELDS = tuple(f for f in FINDING_FIELDS if f != "key_fields")
V3_EVIDENCE_FIELDS = tuple(f for f in EVIDENCE_FIELDS if f != "fields")
V3_COLUMNS = tuple(c for c in COLUMNS if c not in ("key_fields", "evidence_fields", "row_sha256"))


def _v3_rows(findings: list[dict[str, Any]]) -> list[list[str]]:
    out = [list(V3_COLUMNS)]
    for f in findings:
        head = cells_text(f[name] for name in V3_FINDING_FIELDS)
        out += [head + cells_text(e[name] for name in V3_EVIDENCE_FIELDS) for e in f["evidence"]] or \
            [head + [""] * len(V3_EVIDENCE_FIELDS)]
    return out


def _read_json(data: bytes) -> _Parts:
    try:
        doc = json.loads(data)
        header, findings = header_items(doc["header"]), doc["findings"]
        if doc["header"].get("report") == V3:
            table = _v3_rows(findings)
            return _Parts(header, table, csv_bytes(table), lambda i, name: f"header field {name}",
                          lambda i: f"finding row {i + 1}")
        problems, table, places = [], [list(COLUMNS)], []
        for i, f in enumerate(findings):
            label = f"finding {i + 1} ({f.get('id')})"
            problems += [f"{label}: field {k} {'added' if k in f else 'removed'}"
                         for k in sorted(JSON_FINDING_FIELDS ^ f.keys())]
            items = f.get("evidence") or []
            for j, e in enumerate(items):
                problems += [f"{label}, evidence item {j + 1}: field {k} {'added' if k in e else 'removed'}"
                             for k in sorted(set(EVIDENCE_FIELDS) ^ e.keys())]
            complete = {**dict.fromkeys(FINDING_FIELDS), **f,
                        "evidence": [{**dict.fromkeys(EVIDENCE_FIELDS), **e} for e in items]}
            stated = f.get("rows_sha256") or []
            for j, line in enumerate(finding_lines(complete)[1]):
                table.append([*line[:-1], str(stated[j]) if j < len(stated) else ""])
                places.append(f"{label}, evidence item {j + 1}" if items else label)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ReportError(f"not an oncewatch JSON report ({exc}); was it written by `oncewatch export`?") from exc
    return _Parts(header, table, csv_bytes(table), lambda i, name: f"header field {name}",
                  lambda i: places[i], tuple(problems))


def _texts(cells: Iterable[Any], columns: Sequence[str]) -> list[str]:
    """A typed sheet's row as text (`_read`), as wide as `columns`."""
    cells = list(cells)
    cells += [None] * (len(columns) - len(cells))
    return [cell_text(name, getattr(c, "value", None), getattr(c, "number_format", "General") or "General")
            for name, c in zip(columns, cells)] + [cell_text("", getattr(c, "value", None), "General")
                                                   for c in cells[len(columns):]]


def _evidence_rows(ws: Any, problems: list[str]) -> list[list[str]]:
    """The data section from a typed Evidence sheet: each time from its exact text, which the typed cell
    beside it must show."""
    rows = ws.iter_rows()
    names = _texts(next(rows, ()), ())
    if names != list(EVIDENCE_SHEET_COLUMNS):
        problems.append("sheet Evidence, row 1: the column names were changed")
    exact = {c: EVIDENCE_SHEET_COLUMNS.index(c + EXACT) for c in COLUMNS if c in TIME_FIELDS}
    table = [list(COLUMNS)]
    for n, cells in enumerate(rows, start=2):
        texts = _texts(cells, EVIDENCE_SHEET_COLUMNS)
        line = []
        for i, name in enumerate(COLUMNS):
            if name in exact:
                line.append(texts[exact[name]])
                if texts[i] != shown(name, texts[exact[name]]):
                    problems.append(f"sheet Evidence, row {n} (finding {texts[0]}), column {name}: shows "
                                    f"{texts[i]!r}, its exact text is {texts[exact[name]]!r}")
            else:
                line.append(texts[i])
        table.append(line + texts[len(EVIDENCE_SHEET_COLUMNS):])
    return table


def _derived_problems(wb: Any, table: list[list[str]]) -> list[str]:
    """Where the Summary, Findings and History sheets no longer say what the data section says."""
    derived, findings, history = Derived(), [], []
    data = table[1:]
    start = 0
    for i in range(1, len(data) + 1):
        if i == len(data) or data[i][0] != data[start][0]:
            row, entries = derived.add(data[start:i])
            findings.append(row)
            history += entries
            start = i
    problems: list[str] = []
    for name, columns, expected in (("Summary", SUMMARY_COLUMNS, derived.summary()),
                                    ("Findings", FINDINGS_COLUMNS, findings), ("History", HISTORY_COLUMNS, history)):
        found = [_texts(cells, columns) for cells in wb[name].iter_rows()]
        if not found or found[0][:len(columns)] != list(columns):
            problems.append(f"sheet {name}, row 1: the column names were changed")
        problems += [f"sheet {name}, row {n}: a row its data rows do not give (column "
                     f"{', '.join(c for c, text in zip(columns, got) if text)})"
                     for n, got in enumerate(found[len(expected) + 1:], start=len(expected) + 2)]
        if len(found) - 1 < len(expected):
            problems.append(f"sheet {name}: {len(found) - 1} rows, its data rows give {len(expected)}: rows were "
                            "removed")
        for n, (got, want) in enumerate(zip(found[1:], expected), start=2):
            expected_texts = [shown(c, text) for c, text in zip(columns, want)] + [""] * (len(got) - len(columns))
            names = [*columns, *(get_column_letter(j + 1) for j in range(len(columns), len(got)))]
            problems += [f"sheet {name}, row {n} ({columns[0]} {want[0]}), column {names[j]}: says {g!r}, the "
                         f"Evidence sheet gives {w!r}" for j, (g, w) in enumerate(zip(got, expected_texts)) if g != w]
    return problems


def _read_xlsx(data: bytes) -> _Parts:
    try:
        wb = load_workbook(io.BytesIO(data), read_only=True)
        report = [_texts(cells, REPORT_COLUMNS) for cells in wb["Report"].iter_rows(min_row=2)]
        header = [(line[0], line[1]) for line in report]
        problems: list[str] = []
        if dict(header).get("report") == V3:  # every Evidence cell text, no other sheet hashed
            table = [["" if v is None else str(v) for v in line] for line in wb["Evidence"].iter_rows(values_only=True)]
        else:
            if wb.sheetnames != list(SHEETS):
                problems.append(f"the sheets are {', '.join(wb.sheetnames)}; the report wrote {', '.join(SHEETS)}")
            problems += [f"sheet Report, row {n} (header field {name}), column typed: shows {typed!r}, its value is "
                         f"{text!r}" for n, (name, text, typed, *_) in enumerate(report, start=2)
                         if typed != (shown(name, text) if name in TYPED_HEADER else "")]
            table = _evidence_rows(wb["Evidence"], problems)
            problems += _derived_problems(wb, table)
        wb.close()
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise ReportError(f"not an oncewatch XLSX report ({exc}); was it written by `oncewatch export`?") from exc
    return _Parts(header, table, csv_bytes(table), lambda i, name: f"sheet Report, row {i + 2} (header field {name})",
                  lambda i: f"sheet Evidence, row {i + 2} (finding {table[i + 1][0]})", tuple(problems))


READERS: dict[str, Callable[[bytes], _Parts]] = {"csv": _read_csv, "json": _read_json, "xlsx": _read_xlsx}


def _json_field(claimed: dict[str, str], name: str) -> dict[str, str] | None:
    try:
        value = json.loads(claimed[name])
    except (KeyError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _header_problems(parts: _Parts, claimed: dict[str, str]) -> list[str]:
    """The header fields added, removed, or without the digest fields_sha256 states (format 4 and later)."""
    if claimed.get("report") in LEGACY:
        return []
    out = [f"{parts.header_at(i, name)}: a field the report did not have"
           for i, (name, _) in enumerate(parts.header) if name not in HEADER_FIELDS]
    out += [f"header field {name}: removed" for name in HEADER_FIELDS if name not in claimed]
    digests = _json_field(claimed, "fields_sha256")
    if digests is None:
        return out + ([f"{_header_at(parts, 'fields_sha256')}: changed"] if "fields_sha256" in claimed else [])
    out += [f"{parts.header_at(i, name)}: changed" for i, (name, text) in enumerate(parts.header)
            if name in digests and not hmac.compare_digest(str(digests[name]), sha256_hex(text.encode())[:ROW_DIGEST])]
    if not out and claimed["fields_sha256"] != canonical_json(fields_sha256(parts.header)):
        out.append(f"{_header_at(parts, 'fields_sha256')}: changed")
    if not out and not hmac.compare_digest(claimed.get("report_sha256", ""), header_sha256(parts.header)):
        out.append(f"{_header_at(parts, 'report_sha256')}: changed")
    return out


def _header_at(parts: _Parts, name: str) -> str:
    return next((parts.header_at(i, k) for i, (k, _) in enumerate(parts.header) if k == name), f"header field {name}")


def _data_problems(parts: _Parts, claimed: dict[str, str]) -> list[str]:
    """Where the data section was changed: rows by their row_sha256, columns by columns_sha256."""
    if parts.table[0] != list(COLUMNS):
        return ["the data section's row of column names was changed"]
    data = parts.table[1:]
    out = [f"{parts.row_at(i)}: {len(line)} cells, the report wrote {len(COLUMNS)}"
           for i, line in enumerate(data) if len(line) != len(COLUMNS)]
    rows = [i for i, line in enumerate(data) if len(line) == len(COLUMNS) and row_sha256(line[:-1]) != line[-1]]
    stated = _json_field(claimed, "columns_sha256") or {}
    hashes = ColumnHashes()
    hashes.add(data)
    columns = [c for c, digest in hashes.digests().items() if stated.get(c) != digest]
    if claimed.get("evidence_rows", "").isdigit() and int(claimed["evidence_rows"]) != len(data):
        out.append(f"{len(data)} data rows, the header counts {claimed['evidence_rows']}: rows were added or removed")
    for i in rows:
        changed = [c for c in columns if c != "row_sha256"] or columns or ["a cell"]
        out += [f"{parts.row_at(i)}, column {c}: changed" for c in changed]
    if not rows and columns:
        out.append(f"column {', '.join(columns)}: changed, or rows moved")
    return out


def check(data: bytes, fmt: str) -> list[str]:
    """What in a report no longer matches the hashes its header states (empty: it is as written), each
    difference with where it is: the sheet, row and column, the header field, the finding.
    data_sha256 is recomputed over the data section, report_sha256 over the header; in an XLSX report the
    other sheets are compared with what the data section gives."""
    if fmt not in READERS:
        raise ValueError(f"unknown report format {fmt!r}: use one of {', '.join(FORMATS)}")
    parts = READERS[fmt](data)
    claimed = dict(parts.header)
    if not claimed.get("data_sha256") and "fields_sha256" not in claimed:
        raise ReportError(f"no data_sha256 in the header: not an oncewatch {fmt} report")
    problems = _header_problems(parts, claimed)
    if not hmac.compare_digest(claimed.get("data_sha256", ""), sha256_hex(parts.section)):
        if "columns_sha256" in claimed:
            problems += _data_problems(parts, claimed)
        problems.append("the data section does not have the data_sha256 the header states: a cell was changed, "
                        "added or removed")
    problems += parts.problems  # the other sheets: after the data section, which they are compared with
    if "report_sha256" not in claimed:
        problems.append("no report_sha256 in the header: a report of format 1 or 2, whose header no hash covers")
    elif not hmac.compare_digest(claimed["report_sha256"], header_sha256(parts.header)):
        problems.append("the header does not have the report_sha256 it states: a header field was changed")
    return problems


def verify(data: bytes, fmt: str) -> bool:
    """Whether a report still has both hashes its header states (`check` says what differs)."""
    return not check(data, fmt)
