"""`oncewatch verify ATTESTATION --public-key PUB`: whether a period attestation is as it was signed, and where not.

It needs the files and the signer's public key only (no store, no config: an auditor's machine). `check()` reads
the JSON, and says each difference: a file no longer written the way oncewatch writes one (an edit of any byte
that leaves the values alone), a field or a finding whose digest differs from the one signed, attestation_sha256,
a signature made with another key or that the content no longer has, an XLSX whose SHA-256 is not the one signed
(and, the attestation unchanged, its cells that no longer say what the attestation says);
then it follows the chain: the previous attestation (given, or by its file name in the same folder) must have the
SHA-256 this one records, and is checked the same way, back to the first of the chain or a file not at hand.
"""

from __future__ import annotations

import hmac
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from openpyxl import load_workbook

from oncewatch.dashboards.attestation import ALGORITHM, FIELDS, VERSION, digests, render, signature_holds, signed_bytes
from oncewatch.dashboards.attestation_keys import key_id
from oncewatch.dashboards.attestation_xlsx import TYPED_HEADER, sheets
from oncewatch.dashboards.report_check import _texts, shown
from oncewatch.dashboards.reports import sha256_hex


@dataclass
class Checked:
    """What `check` found: problems (any one means the attestation or its chain was changed: exit 5) and notes
    (what could not be checked, and what was), each naming its file."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked: list[Path] = field(default_factory=list)


def _layout(data: bytes, document: dict[str, Any]) -> str | None:
    """Where the file's bytes differ from the way oncewatch writes its document, if they do."""
    written = render(document)
    if written == data:
        return None
    for n, (got, want) in enumerate(zip(data.split(b"\n"), written.split(b"\n")), start=1):
        if got != want:
            return f"line {n}"
    return "its end"


def _fields(document: dict[str, Any]) -> list[str]:
    names = list(document)
    out = [f"field {k}: not one of an attestation's" for k in names if k not in FIELDS]
    out += [f"field {k}: removed" for k in FIELDS if k not in document]
    if not out and names != list(FIELDS):
        out.append("the fields were put in another order")
    return out


def _digest_problems(document: dict[str, Any]) -> list[str]:
    """Fields and findings whose content is not what their signed digests say."""
    stated = document.get("digests")
    if not isinstance(stated, dict) or not isinstance(stated.get("fields"), dict):
        return ["field digests: changed (it no longer says where an edit is)"]
    now = digests(document)
    out = [f"field {k}: changed" for k, d in now["fields"].items()
           if not hmac.compare_digest(str(stated["fields"].get(k, "")), d)]
    findings = stated.get("findings") if isinstance(stated.get("findings"), dict) else {}
    out += [f"finding {fid}: changed" for fid, d in now["findings"].items()
            if fid in findings and not hmac.compare_digest(str(findings[fid]), d)]
    out += [f"finding {fid}: added" for fid in now["findings"] if fid not in findings]
    out += [f"finding {fid}: removed" for fid in findings if fid not in now["findings"]]
    return out


def _one(path: Path, data: bytes, key: Ed25519PublicKey, found: Checked) -> dict[str, Any] | None:
    """The checks of one attestation file; its document when it could be read as one."""
    try:
        document = json.loads(data)
    except ValueError as exc:
        found.problems.append(f"{path}: no longer valid JSON ({exc}): changed or damaged")
        return None
    if not isinstance(document, dict) or document.get("attestation") != VERSION:
        found.problems.append(f"{path}: not an oncewatch attestation any more (its \"attestation\" field is not "
                              f"\"{VERSION}\")")
        return None
    problems = _fields(document)
    if not problems:
        problems += _digest_problems(document)
        if not hmac.compare_digest(str(document["attestation_sha256"]), sha256_hex(signed_bytes(document))):
            problems.append("attestation_sha256: not the SHA-256 of the content it states")
        signature = document["signature"] if isinstance(document["signature"], dict) else {}
        if signature.get("algorithm") != ALGORITHM:
            problems.append(f"signature: algorithm {signature.get('algorithm')!r}, not {ALGORITHM}")
        elif signature.get("public_key_sha256") != key_id(key):
            problems.append(f"signature: made with another key (public_key_sha256 {signature.get('public_key_sha256')}"
                            f", the key given is {key_id(key)})")
        elif not signature_holds(document, key):
            problems.append("signature: does not verify with the public key given: the content was changed after "
                            "it was signed")
    where = _layout(data, document)
    if where is not None:
        problems.append(f"the file is not as oncewatch wrote it: changed at {where}")
    found.problems += [f"{path}: {p}" for p in problems]
    _companion(path, document, found, placed=not problems)
    return document


def _companion(path: Path, document: dict[str, Any], found: Checked, *, placed: bool) -> None:
    """The XLSX the attestation records the SHA-256 of, when it lies beside it; with `placed` (the attestation
    itself unchanged), a changed one's cells are compared with what the attestation gives, to say where."""
    book = document.get("xlsx")
    if not isinstance(book, dict) or not isinstance(book.get("file"), str):
        return
    xlsx_path = path.with_name(Path(book["file"]).name)
    if not xlsx_path.is_file():
        found.notes.append(f"{xlsx_path}: not found beside {path.name}, not checked")
        return
    data = xlsx_path.read_bytes()
    if hmac.compare_digest(sha256_hex(data), str(book.get("sha256"))):
        found.checked.append(xlsx_path)
        return
    found.problems.append(f"{xlsx_path}: changed since {path.name} was signed (its SHA-256 is not the one "
                          f"recorded there)")
    if placed:
        found.problems += [f"{xlsx_path}: {p}" for p in xlsx_changes(data, document)]


def _expected(name: str, columns: tuple[str, ...], row: list[str]) -> list[str]:
    """A sheet's row as it reads back: the Attestation sheet types its third cell from the second, the others
    each cell by its column's name (times to the millisecond Excel keeps)."""
    if name == "Attestation":
        return [row[0], row[1], shown(row[0], row[1]) if row[0] in TYPED_HEADER else ""]
    return [shown(c, text) for c, text in zip(columns, row)]


def xlsx_changes(data: bytes, document: dict[str, Any]) -> list[str]:
    """Where an attestation's XLSX no longer says what the attestation says: sheets, rows and cells."""
    try:
        wb = load_workbook(io.BytesIO(data), read_only=True)
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
        return [f"no longer a readable XLSX ({exc})"]
    out = []
    expected = sheets(document)
    if wb.sheetnames != list(expected):
        out.append(f"the sheets are {', '.join(wb.sheetnames)}; the attestation wrote {', '.join(expected)}")
    for name, (columns, rows) in expected.items():
        if name not in wb.sheetnames:
            continue
        got = [_texts(cells, columns) for cells in wb[name].iter_rows()]
        want = [list(columns), *(_expected(name, columns, row) for row in rows)]
        if len(got) != len(want):
            out.append(f"sheet {name}: {len(got) - 1} rows, the attestation gives {len(want) - 1}")
        for n, (g, w) in enumerate(zip(got, want), start=1):
            w = w + [""] * (len(g) - len(w))
            out += [f"sheet {name}, row {n}, column {columns[j] if j < len(columns) else j + 1}: says {a!r}, the "
                    f"attestation gives {b!r}" for j, (a, b) in enumerate(zip(g, w)) if a != b]
    wb.close()
    return out or ["every cell still says what the attestation says: the file's other bytes were changed"]


def check(path: Path, key: Ed25519PublicKey, *, previous: Path | None = None, chain: bool = True) -> Checked:
    """Check the attestation at `path` with the signer's public key, then (with `chain`) the attestations before
    it: `previous` for the first link, else the file its "previous" field names in the same folder."""
    found = Checked()
    seen: set[Path] = set()
    at: Path | None = path
    while at is not None and at.resolve() not in seen:
        seen.add(at.resolve())
        found.checked.append(at)
        document = _one(at, at.read_bytes(), key, found)
        link = document.get("previous") if document else None
        if not chain or not isinstance(link, dict):
            if chain and previous is not None and at == path and document is not None:
                found.problems.append(f"{path}: the first of its chain (it records no previous attestation), but "
                                      f"{previous} was given as its previous one")
            break
        nxt = previous if at == path and previous is not None else at.with_name(Path(str(link.get("file"))).name)
        if not nxt.is_file():
            found.notes.append(f"{at}: its previous attestation {link.get('file')} (sequence {link.get('sequence')}) "
                               f"is not at hand: the chain before it is not checked; give --previous FILE")
            break
        if not hmac.compare_digest(sha256_hex(nxt.read_bytes()), str(link.get("sha256"))):
            found.problems.append(f"{nxt}: not the attestation {at.name} chains to: its SHA-256 is not the one "
                                  f"recorded in {at.name} (changed since, or another file)")
        at = nxt
    return found


def chain_rows(directory: Path, key: Ed25519PublicKey) -> list[dict[str, Any]]:
    """The Reports page's table of a folder's attestations, newest first: what each says and whether it verifies
    with `key`, its link to the one before it included. The chain is walked once from the newest; a file it does
    not reach is checked alone."""
    from oncewatch.dashboards.attestation import listing

    items = listing(directory)
    found = check(items[-1].path, key) if items else Checked()
    for item in items:
        if item.path not in found.checked:
            alone = check(item.path, key, chain=False)
            found.problems += alone.problems
    rows = []
    for item in reversed(items):
        problems = [p.removeprefix(f"{item.path}: ") for p in found.problems if p.startswith(f"{item.path}: ")]
        trades = item.trades
        rows.append({"sequence": item.sequence, "since": item.since, "until": item.until,
                     "verified": trades.get("verified", {}).get("trades"),
                     "violated": trades.get("violated", {}).get("trades"),
                     "pending": trades.get("pending", {}).get("trades"),
                     "amount verified": trades.get("verified", {}).get("amount"), "findings": item.findings,
                     "verifies": "NO: " + "; ".join(problems) if problems else "yes", "file": item.path.name})
    return rows
