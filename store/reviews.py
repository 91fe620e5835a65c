"""A person's part of a finding's lifecycle (docs/architecture.md §3): acknowledge, close, and their end.

An acknowledgement says someone has seen an open finding and owns it: it stops the page, and
lapses after a while (`until`) if the finding is still open, so it pages again. A close is a
decision with a reason (names.CLOSE_REASONS): an accepted risk lasts until its expiry, a duplicate
names the finding it duplicates. The monitor ends a review when the fact does (resolved), when
it is seen again after a close (newer evidence: reopened, same id; store.batch), or when `until`
passes (`expire`). Every change is a row of finding_history, which the exports carry.

These run in the CLI's or the dashboard's process, beside the monitor: each is one short store
transaction, serialised with the monitor's by SQLite.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from oncewatch.core.names import ACKNOWLEDGED, CLOSE_REASONS, CLOSED, OPEN
from oncewatch.store.batch import MONITOR, Batch
from oncewatch.store.codec import HISTORY_COLUMNS, HistoryEntry
from oncewatch.store.store import Store


class ReviewError(ValueError):
    """A review that cannot be made; the message names the finding and what to do."""


def acknowledge(store: Store, ids: Sequence[str], *, by: str, note: str, until: float, now: float) -> None:
    """Acknowledge open (or already acknowledged) findings until `until`."""
    with store.batch() as tx:
        _check(tx, ids, (OPEN, ACKNOWLEDGED), "acknowledge")
        _review(tx, ids, ACKNOWLEDGED, by=by, reason=None, duplicate_of=None, note=note, at=now, until=until)


def close(store: Store, ids: Sequence[str], *, by: str, reason: str, note: str, now: float,
          until: float | None = None, duplicate_of: str | None = None) -> None:
    """Close open or acknowledged findings with a reason; an accepted risk needs `until`, a duplicate
    the finding it duplicates."""
    if reason not in CLOSE_REASONS:
        raise ReviewError(f"reason {reason!r}: use one of {', '.join(CLOSE_REASONS)}")
    if reason == "accepted_risk" and (until is None or until <= now):
        raise ReviewError("an accepted risk needs an expiry in the future (--until)")
    if reason != "accepted_risk" and until is not None:
        raise ReviewError("only an accepted risk has an expiry (--until)")
    if (reason == "duplicate") != (duplicate_of is not None):
        raise ReviewError("a duplicate names the finding it duplicates (--of ID), and only a duplicate does")
    with store.batch() as tx:
        _check(tx, ids, (OPEN, ACKNOWLEDGED), "close")
        if duplicate_of is not None:
            _check(tx, [duplicate_of], None, "name as the original of a duplicate")
        _review(tx, ids, CLOSED, by=by, reason=reason, duplicate_of=duplicate_of, note=note, at=now, until=until)


def expire(tx: Batch, now: float) -> int:
    """Reviews whose `until` has passed end: the finding is open again (the monitor's writer calls
    this every second). Returns how many ended."""
    ended = tx.conn.execute("SELECT finding_id, state FROM reviews WHERE until IS NOT NULL AND until <= ?",
                            (now,)).fetchall()
    if not ended:
        return 0
    tx.add_history([(fid, now, OPEN, MONITOR, None, "acknowledgement lapsed" if state == ACKNOWLEDGED
                     else "accepted risk expired") for fid, state in ended])
    tx.conn.executemany("UPDATE findings SET status = 'open' WHERE id = ? AND status IN ('acknowledged', 'closed')",
                        [(fid,) for fid, _ in ended])
    tx.conn.executemany("DELETE FROM reviews WHERE finding_id = ?", [(fid,) for fid, _ in ended])
    return len(ended)


def history(store: Store, ids: Iterable[str]) -> dict[str, list[HistoryEntry]]:
    """Every recorded status change of those findings, oldest first."""
    ids = list(ids)
    out: dict[str, list[HistoryEntry]] = {fid: [] for fid in ids}
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        for row in store.conn.execute(
                f"SELECT {HISTORY_COLUMNS} FROM finding_history "
                f"WHERE finding_id IN ({','.join('?' * len(chunk))}) ORDER BY at, rowid", chunk):
            out[row[0]].append(HistoryEntry(*row))
    return out


def _check(tx: Batch, ids: Sequence[str], allowed: tuple[str, ...] | None, action: str) -> None:
    if not ids:
        raise ReviewError(f"name at least one finding id to {action}")
    found = dict(tx.conn.execute(f"SELECT id, status FROM findings WHERE id IN ({','.join('?' * len(ids))})",
                                 list(ids)).fetchall())
    for fid in ids:
        if fid not in found:
            raise ReviewError(f"{fid}: no such finding (see `oncewatch findings --config FILE`)")
        if allowed is not None and found[fid] not in allowed:
            raise ReviewError(f"{fid} is {found[fid]}: only an {' or '.join(allowed)} finding can be told to {action}")


def _review(tx: Batch, ids: Sequence[str], state: str, *, by: str, reason: str | None, duplicate_of: str | None,
            note: str, at: float, until: float | None) -> None:
    tx.conn.executemany(
        "INSERT INTO reviews (finding_id, state, by, reason, duplicate_of, note, at, until) VALUES (?,?,?,?,?,?,?,?) "
        "ON CONFLICT(finding_id) DO UPDATE SET state=excluded.state, by=excluded.by, reason=excluded.reason, "
        "duplicate_of=excluded.duplicate_of, note=excluded.note, at=excluded.at, until=excluded.until",
        [(fid, state, by, reason, duplicate_of, note, at, until) for fid in ids])
    tx.conn.executemany("UPDATE findings SET status = ? WHERE id = ?", [(state, fid) for fid in ids])
    detail = f"{note} (duplicate of {duplicate_of})" if duplicate_of else note
    tx.add_history([(fid, at, state, by, reason, detail) for fid in ids])
