"""Period attestations (issue 45): what a period's trades and findings were, signed and chained, for auditors.

`oncewatch attest` and the dashboard's Reports page call `make()`: it reads one period [since, until) from the
store in one read transaction, writes its XLSX, then the JSON attestation, which records the XLSX's SHA-256 and
the SHA-256 of the attestation before it, and is signed with the Ed25519 key of `[attest]`. `oncewatch verify
FILE --public-key PUB` (dashboards.attestation_check) checks it with the public key alone: no store, no config.

The JSON file is `render(document)`: json.dumps(indent=2, ensure_ascii=False) and a line feed, fields in this order:
  attestation        format version, "oncewatch-attestation/1"
  sequence           its place in its chain: 1 for the first, else the previous one's + 1
  generated_at       when it was made (ISO-8601 UTC with microseconds)
  since, until       the period [since, until)
  config_sha256      Config.content_sha256 of the config it was made with (`oncewatch check-config` prints it)
  previous           null for the first of a chain, else {"sequence", "file" (its file name), "sha256" (of its
                     file's bytes: an edit of any byte of it breaks the link), "since", "until"}
  coverage           what the period's data came from: "binlog": the transactions committed in it that the store
                     keeps ("transactions", "gtids": per GTID domain its "first" and "last" GTID, "other": the first
                     and last id that is no GTID), "read_to" (the monitor's binlog checkpoint when it was made) and
                     "kept_since" (the oldest row change the store keeps: retention prunes older ones); "kafka": per
                     "topic/partition" the "first" and "last" offset and the "records" with a timestamp in the
                     period, and "read_to" (the next offset the monitor reads there)
  trades             the trades (successful payments) committed in the period by verdict: "verified", "violated",
                     "pending" and "all", each {"trades", "amount" (exact, in the shop's unit), "unpriced" (trades
                     without an amount, left out of "amount")}
  verified_share     {"trades", "amount"}: verified / all, six decimals rounded down (null when there are none)
  objective          the config's [slo] and how the period stands against it: "objective" (a share of the money),
                     "within_seconds", "verified_within" (the trades verified within that time of their commit, as
                     in "trades"), "share" (theirs of all, as verified_share) and "met" (the share of the amount
                     at least the objective; null without trades)
  violated_by_rule   per rule, the violated trades it touched first ({"trades", "amount", "unpriced"})
  open_trades        every violated and pending trade: {"trade_no", "order_id", "amount", "verdict", "rule" (the
                     first that touched it), "committed_at", "reached_at" (its verdict), "verified_at" (a trade
                     verified before a later finding violated it)}, by committed_at (verified trades are counted,
                     not listed)
  findings           every finding seen during the period (last_seen >= since and first_seen < until), by
                     first_seen then id, as the reports give them (dashboards.reports), without the evidence
                     ("evidence_items" counts it: `oncewatch export` gives it) but with its "history" and
                     "closed" (for a closed finding the close that stands: {"at", "by", "reason", "note"}; a
                     resolved finding's reason is its "resolution")
  xlsx               {"file", "sha256"} of the XLSX made with it, or null
  digests            "fields": per field above, the first 16 hex digits of the SHA-256 of its canonical JSON;
                     "findings": the same per finding, by id: they tell `oncewatch verify` where an edit is
  attestation_sha256 SHA-256 of the canonical JSON (sorted keys, no spaces, UTF-8) of the fields above
  signature          {"algorithm": "Ed25519", "public_key_sha256" (SHA-256 of the raw 32-byte public key),
                     "value" (base64 of the Ed25519 signature of that same canonical JSON)}

The XLSX (dashboards.attestation_xlsx) holds the same content typed; the JSON's signature covers it through its
SHA-256. The keys: dashboards.attestation_keys.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import os
from collections.abc import Iterable, Mapping
from contextlib import closing
from dataclasses import dataclass
from decimal import ROUND_DOWN, Decimal
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from oncewatch.core import gtids
from oncewatch.core.config import Config, SloConfig
from oncewatch.core.exact_json import plain
from oncewatch.core.names import BINLOG_CHECKPOINT, CDC_CHECKPOINT, CLOSED, KAFKA_CHECKPOINT, partition_key
from oncewatch.core.records import VERDICT_PENDING, VERDICT_VERIFIED, VERDICT_VIOLATED, TradeVerdict
from oncewatch.dashboards.attestation_keys import key_id, signing_key
from oncewatch.dashboards.attestation_xlsx import xlsx
from oncewatch.dashboards.reports import (_filter, _findings, _rule_order, _unchanged, canonical_json, iso, roles_of,
                                          sha256_hex)
from oncewatch.store import Store, open_reader
from oncewatch.store.queries import event_offsets, oldest_kept, transactions_committed

log = logging.getLogger("oncewatch.attest")

VERSION = "oncewatch-attestation/1"
SIGNED = ("attestation", "sequence", "generated_at", "since", "until", "config_sha256", "previous", "coverage",
          "trades", "verified_share", "objective", "violated_by_rule", "open_trades", "findings", "xlsx", "digests")
FIELDS = (*SIGNED, "attestation_sha256", "signature")
VERDICTS = (VERDICT_VERIFIED, VERDICT_VIOLATED, VERDICT_PENDING)
ALGORITHM = "Ed25519"
DIGEST = 16  # hex digits of a field's or a finding's digest
SHARE = Decimal("0.000001")
# What a finding of the reports keeps in an attestation: its evidence is counted, not copied.
FINDING_FIELDS = ("id", "rule", "name", "severity", "status", "first_seen", "last_seen", "resolved_at", "resolution",
                  "closed", "keys", "summary", "amount_involved", "evidence_items", "history")


class AttestError(ValueError):
    """An attestation that cannot be made as asked (a period that overlaps its chain's, a previous one that does
    not verify); the message says what to do."""


class ChainBrokenError(AttestError):
    """The attestation to chain to does not verify with this key: it was changed, or another key signed it."""

    def __init__(self, path: Path, problems: list[str]):
        super().__init__(f"{path} does not verify, so nothing is chained to it: " + "; ".join(problems))
        self.problems = problems


# ---------------------------------------------------------------- the document

def render(document: Mapping[str, Any]) -> bytes:
    """The attestation file's bytes: a document is written only this way, so that `oncewatch verify` can tell an
    edit of any byte, layout included."""
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()


def signed_bytes(document: Mapping[str, Any]) -> bytes:
    """What attestation_sha256 and the signature cover: the canonical JSON of the fields before them."""
    return canonical_json({k: document[k] for k in SIGNED if k in document}).encode()


def digest(value: Any) -> str:
    return sha256_hex(canonical_json(value).encode())[:DIGEST]


def digests(document: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The "digests" field of a document (module docstring); of any JSON object (verify reads edited ones)."""
    findings = document.get("findings") if isinstance(document.get("findings"), list) else []
    return {"fields": {k: digest(document[k]) for k in SIGNED if k != "digests" and k in document},
            "findings": {str(f.get("id")): digest(f) for f in findings if isinstance(f, dict)}}


def sign(document: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """The document with its digests, attestation_sha256 and signature."""
    document = {k: v for k, v in document.items() if k in SIGNED}
    document["digests"] = digests(document)
    body = signed_bytes(document)
    return {**document, "attestation_sha256": sha256_hex(body),
            "signature": {"algorithm": ALGORITHM, "public_key_sha256": key_id(key.public_key()),
                          "value": base64.b64encode(key.sign(body)).decode()}}


def signature_holds(document: Mapping[str, Any], key: Ed25519PublicKey) -> bool:
    signature = document.get("signature")
    try:
        key.verify(base64.b64decode(signature["value"], validate=True), signed_bytes(document))
    except (InvalidSignature, TypeError, KeyError, ValueError):
        return False
    return True


def _amounts(verdicts: Iterable[TradeVerdict]) -> dict[str, Any]:
    trades, unpriced, amount = 0, 0, Decimal(0)
    for v in verdicts:
        trades += 1
        if v.amount is None:
            unpriced += 1
        else:
            amount += v.amount
    return {"trades": trades, "amount": str(amount), "unpriced": unpriced}


def _share(part: Decimal, whole: Decimal) -> str | None:
    return str((part / whole).quantize(SHARE, rounding=ROUND_DOWN)) if whole else None


def _shares(part: dict[str, Any], whole: dict[str, Any]) -> dict[str, str | None]:
    return {"trades": _share(Decimal(part["trades"]), Decimal(whole["trades"])),
            "amount": _share(Decimal(part["amount"]), Decimal(whole["amount"]))}


def trade_figures(verdicts: list[TradeVerdict], slo: SloConfig) -> dict[str, Any]:
    """The "trades", "verified_share", "objective", "violated_by_rule" and "open_trades" fields, from the period's
    verdicts and the config's [slo]."""
    by_verdict = {name: [v for v in verdicts if v.verdict == name] for name in VERDICTS}
    trades = {name: _amounts(by_verdict[name]) for name in VERDICTS}
    trades["all"] = _amounts(verdicts)
    share = _shares(trades[VERDICT_VERIFIED], trades["all"])
    within = _amounts(v for v in by_verdict[VERDICT_VERIFIED]
                      if (v.reached_at or v.committed_at) - v.committed_at <= slo.within_seconds)
    within_share = _shares(within, trades["all"])
    objective = {"objective": str(Decimal(repr(slo.objective))), "within_seconds": slo.within_seconds,
                 "verified_within": within, "share": within_share,
                 "met": None if within_share["amount"] is None else Decimal(within_share["amount"]) >= Decimal(
                     repr(slo.objective))}
    rules = sorted({v.rule or "" for v in by_verdict[VERDICT_VIOLATED]}, key=_rule_order)
    by_rule = {rule: _amounts(v for v in by_verdict[VERDICT_VIOLATED] if (v.rule or "") == rule) for rule in rules}
    listed = sorted(by_verdict[VERDICT_VIOLATED] + by_verdict[VERDICT_PENDING], key=lambda v: (v.committed_at,
                                                                                               v.trade_no))
    return {"trades": trades, "verified_share": share, "objective": objective, "violated_by_rule": by_rule,
            "open_trades": [{"trade_no": v.trade_no, "order_id": v.order_id,
                             "amount": None if v.amount is None else str(v.amount), "verdict": v.verdict,
                             "rule": v.rule, "committed_at": iso(v.committed_at), "reached_at": iso(v.reached_at),
                             "verified_at": iso(v.verified_at)}
                            for v in listed]}


def _binlog(store: Store, since: float, until: float) -> dict[str, Any]:
    ranges: dict[str, dict[str, Any]] = {}
    other: dict[str, str] = {}
    count = 0
    for txid in transactions_committed(store, since, until):
        count += 1
        parsed = gtids.parse(txid)
        if parsed is None:
            other.setdefault("first", txid)
            other["last"] = txid
            continue
        span = ranges.setdefault(str(parsed[0]), {"first": txid, "last": txid, "_low": parsed[2], "_high": parsed[2]})
        if parsed[2] < span["_low"]:
            span.update(first=txid, _low=parsed[2])
        if parsed[2] > span["_high"]:
            span.update(last=txid, _high=parsed[2])
    kept = oldest_kept(store)
    return {"transactions": count,
            "gtids": {d: {"first": r["first"], "last": r["last"]} for d, r in sorted(ranges.items(),
                                                                                   key=lambda i: int(i[0]))},
            "other": other or None, "read_to": plain(store.checkpoint(BINLOG_CHECKPOINT)),
            "kept_since": iso(kept)}


def _kafka(store: Store, since: float, until: float) -> dict[str, Any]:
    read_to = {**(store.checkpoint(CDC_CHECKPOINT) or {}), **(store.checkpoint(KAFKA_CHECKPOINT) or {})}
    partitions = {partition_key(topic, partition): {"first": first, "last": last, "records": records,
                                                    "read_to": read_to.get(partition_key(topic, partition))}
                  for topic, partition, first, last, records in event_offsets(store, since, until)}
    return {"partitions": partitions, "read_to": dict(sorted(read_to.items()))}


def _closed(history: list[dict[str, Any]], status: str) -> dict[str, Any] | None:
    """The close that stands of a closed finding (its last), as the history gives it."""
    if status != CLOSED:
        return None
    closes = [h for h in history if h["status"] == CLOSED]
    return {k: closes[-1][k] for k in ("at", "by", "reason", "note")} if closes else None


def _finding(f: dict[str, Any]) -> dict[str, Any]:
    extra = {"closed": _closed(f["history"], f["status"]), "evidence_items": len(f["evidence"])}
    return {name: extra[name] if name in extra else f[name] for name in FINDING_FIELDS}


def content(store: Store, cfg: Config, since: dt.datetime, until: dt.datetime, *, sequence: int,
            previous: dict[str, Any] | None, now: dt.datetime) -> dict[str, Any]:
    """An attestation's fields up to "findings" (module docstring), read in one store transaction."""
    start, end = since.timestamp(), until.timestamp()
    with store.snapshot():
        verdicts = store.trade_verdicts(since=start, until=end)
        coverage = {"binlog": _binlog(store, start, end), "kafka": _kafka(store, start, end)}
        findings = [_finding(f) for f in _findings(store, _filter(None, None, since, until), _unchanged,
                                                   roles_of(cfg.domain, cfg.announce), cfg.domain)]
    return {"attestation": VERSION, "sequence": sequence, "generated_at": iso(now.timestamp()),
            "since": iso(start), "until": iso(end), "config_sha256": cfg.content_sha256, "previous": previous,
            "coverage": coverage, **trade_figures(verdicts, cfg.slo), "findings": findings}


# ---------------------------------------------------------------- a chain's files

@dataclass(frozen=True)
class Listed:
    """One attestation file of a folder, as its fields say (not verified: `oncewatch verify` does that)."""

    path: Path
    sequence: int
    since: str
    until: str
    generated_at: str
    trades: dict[str, Any]
    findings: int


def read(path: Path) -> dict[str, Any]:
    """An attestation file's document; AttestError when it is not one."""
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise AttestError(f"{path}: cannot be read as an attestation ({exc})") from None
    if not isinstance(document, dict) or document.get("attestation") != VERSION:
        raise AttestError(f"{path}: not an oncewatch attestation (no \"attestation\": \"{VERSION}\")")
    return document


def listing(directory: str | Path) -> list[Listed]:
    """The attestations of a folder, by sequence (files that are not one are left out)."""
    out = []
    folder = Path(directory)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            d = read(path)
            out.append(Listed(path, int(d["sequence"]), d["since"], d["until"], d["generated_at"], d["trades"],
                              len(d["findings"])))
        except (AttestError, KeyError, TypeError, ValueError):
            continue
    return sorted(out, key=lambda item: (item.sequence, item.generated_at))


def link(path: Path) -> dict[str, Any]:
    """The "previous" field of the attestation that chains to the one at `path`."""
    data = path.read_bytes()
    d = read(path)
    return {"sequence": d["sequence"], "file": path.name, "sha256": sha256_hex(data), "since": d["since"],
            "until": d["until"]}


def file_name(sequence: int, since: dt.datetime, until: dt.datetime) -> str:
    stamp = "%Y%m%dT%H%M%SZ"
    return (f"attestation-{sequence:06d}-{since.astimezone(dt.timezone.utc).strftime(stamp)}-"
            f"{until.astimezone(dt.timezone.utc).strftime(stamp)}.json")


# ---------------------------------------------------------------- making one

@dataclass(frozen=True)
class Made:
    path: Path
    xlsx_path: Path
    document: dict[str, Any]


def make(cfg: Config, since: dt.datetime, until: dt.datetime, *, out: Path | None = None,
         previous: Path | None = None, force: bool = False, now: dt.datetime | None = None) -> Made:
    """Make, sign and write the attestation of [since, until): the JSON at `out` (default: a new file in
    `[attest] directory`) and its XLSX beside it (`.xlsx` for `.json`). It chains to `previous`, else to the
    newest attestation in the directory, which must verify with this key and end no later than `since`."""
    if since >= until:
        raise AttestError("--since must be earlier than --until")
    key = signing_key(cfg)
    directory = Path(cfg.attest.directory) if cfg.attest.directory else None
    if previous is None and directory is not None and (chain := listing(directory)):
        previous = chain[-1].path
    before = None
    if previous is not None:
        from oncewatch.dashboards.attestation_check import check

        problems = check(previous, key.public_key(), chain=False).problems
        if problems:
            raise ChainBrokenError(previous, problems)
        before = link(previous)
        if dt.datetime.fromisoformat(before["until"].replace("Z", "+00:00")) > since:
            raise AttestError(f"the period starts before the one of {previous} ends ({before['until']}): the "
                              f"periods of one chain do not overlap; give --since {before['until']} or later")
    sequence = before["sequence"] + 1 if before else 1
    if out is None:
        if directory is None:
            raise AttestError("give --out FILE, or [attest] directory = \"DIR\" in the config for the attestations")
        out = directory / file_name(sequence, since, until)
    out = Path(out)
    xlsx_path = out.with_suffix(".xlsx")
    for path in (out, xlsx_path):
        if not force and os.path.lexists(path):
            raise FileExistsError(f"{path} exists: give another --out path, or add --force to write over it")
    now = now or dt.datetime.now(dt.timezone.utc)
    with closing(open_reader(cfg.store.target)) as store:
        document = content(store, cfg, since, until, sequence=sequence, previous=before, now=now)
    book = xlsx(document)
    document = sign({**document, "xlsx": {"file": xlsx_path.name, "sha256": sha256_hex(book)}}, key)
    out.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if force else "xb"
    with open(xlsx_path, mode) as f:
        f.write(book)
    with open(out, mode) as f:
        f.write(render(document))
    log.info("attestation written", extra={"event": "attestation_written", "path": str(out),
                                           "sequence": sequence, "attestation_sha256": document["attestation_sha256"],
                                           "public_key_sha256": document["signature"]["public_key_sha256"]})
    return Made(out, xlsx_path, document)
