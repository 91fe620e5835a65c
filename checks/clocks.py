"""The clocks of the absence rules while the streams are busy: up to when each side has been read
(docs/architecture.md §4).

F7 judges a change's event lost only once the Kafka clock passes the change's grace: an event is
never "missing" while Kafka has not been read up to where it should have appeared. F3 (an order
stuck in pending) and F8/F9 (an event with no change of its own) are judged on the binlog clock
likewise. Under steady traffic neither stream is read to its end at the instant it is asked, so
each clock advances from what the reader has vouched for: an end learned at a known time, once
applied, vouches for everything before that time.
"""

from __future__ import annotations

from collections.abc import Iterable

from oncewatch.core.gtids import GtidSet
from oncewatch.core.records import Heartbeat, PartitionStatus


def kafka_watermark(partitions: Iterable[PartitionStatus], applied: dict[str, int], newest_ms: dict[str, int],
                    previous: float, settling: bool = False) -> float:
    """A time such that every event stamped earlier has been applied, while the stream is busy.

    `applied` is the next offset the engine has taken in per partition key, `newest_ms` the
    newest record timestamp applied from it. A partition applied up to its last known end
    vouches for everything produced before that end was learned; one still behind vouches up to
    the newest event applied from it. A partition with nothing applied vouches for nothing, and
    the clock stays at `previous`. Under steady traffic the stream is never "caught up" at the
    instant it is asked, so without the first rule the clock would stand still and lost events
    would never be judged.

    `settling`: the broker was away and its producers may still be appending what they kept meanwhile (the events
    collector's settle, `producer_delivery_seconds`). Nothing vouches then, a partition behind neither: each producer
    appends its own backlog, stamped when it was sent, so a partition's newest event says nothing of the older ones
    another producer has still to append."""
    if settling:
        return previous
    marks: list[float] = []
    for part in partitions:
        if applied.get(part.key, 0) >= part.end:
            marks.append(part.end_at)
        elif part.key in newest_ms:
            marks.append(newest_ms[part.key] / 1000)
        else:
            return previous
    return min(marks, default=previous)


BinlogEnd = tuple[float, GtidSet]  # (the time just before the server was asked, its binlog's end then)


def binlog_watermark(ends: list[BinlogEnd], applied: GtidSet) -> tuple[float | None, list[BinlogEnd]]:
    """(the newest time up to which the binlog is applied, the ends not applied yet).

    `ends` are the server's binlog ends (@@gtid_binlog_pos) as probed, each with the time taken just
    before it was asked for, oldest first; `applied` the GTID set the engine has taken in. An end
    applied in every domain vouches for every transaction committed before it was asked for (MariaDB
    writes a transaction to its binlog before the commit returns), so the clock is that time; None
    when no end is applied yet. Without this the busy binlog's clock is the newest header time, whole
    seconds, which held F3 and F9 back by up to a second and more."""
    covered = None
    for i, (at, end) in enumerate(ends):
        if any(applied.get(domain, (0, -1))[1] < seq for domain, (_, seq) in end.items()):
            return covered, ends[i:]
        covered = at
    return covered, []


END_MARGIN = 0.001  # an END stamped t (whole seconds) vouches for every commit stamped before t: just before it


def heartbeat_watermark(beats: Iterable[Heartbeat], previous: Heartbeat | None,
                        unended_seconds: float) -> tuple[float | None, Heartbeat | None]:
    """(the newest time a CDC connector's heartbeats vouch for, None if they vouch for none; the last heartbeat, to
    pass as `previous` next time). The change clock of CDC source mode while the tables it reads are quiet.

    A heartbeat's time alone vouches for nothing: Debezium writes one after any binlog event once its interval is
    up, also while it reads far behind the binlog's end (a task restarted, a paused connector resumed), and it
    carries no binlog position. What it does say is where it stands among the connector's records. Two heartbeats
    in a row with nothing of the connector's between them, and no transaction of it open, mean its binlog reader
    handled no transaction in between: it was at the binlog's end, waiting (the server sends it heartbeats then),
    unless it was cut off from the server the whole time. Two such gaps in a row, around heartbeat k-1, would need
    it cut off twice in a row with a reconnect between that read nothing, so every commit before heartbeat k-1's
    time was read before it, and (the caller's part) applied: that time is vouched for. A backlog read after a
    reconnect or a resume puts its records between the heartbeats, and nothing is vouched for until it is read.

    A transaction begun and not ended keeps a gap from being quiet: a large one may stream rows of tables not read
    between heartbeats. But Debezium writes a BEGIN for every binlog transaction and an END only at a commit, and a
    DDL (CREATE, TRUNCATE, GRANT ...) has none, so its BEGIN stays open until the next transaction begins: on a shop
    gone quiet after a DDL the clock would stand still. An open transaction after which the connector wrote nothing
    read for `unended_seconds` (cdc.unended_transaction_seconds) is taken as ended.

    A busy binlog is never quiet, even when no table the monitor reads changes: the connector writes a BEGIN and an
    END for every transaction, of tables it does not capture too (`event_count` 0). But an END says how far it has
    read: it writes a transaction's records, then its END, in binlog order, so every transaction committed before
    that one was written before it, and (the caller's part) read and applied by the time a heartbeat written after
    it is placed. The END's `ts_ms` is its commit's binlog time in whole seconds; a transaction committed after it
    in the same second has that time too, so it vouches for just before it. Without this, another schema's traffic
    held the clock at the shop's last commit, and F3, F8 and F9 with it, for as long as that traffic went on."""
    vouched = None
    for beat in beats:
        if previous is not None and _quiet(previous, unended_seconds) and _quiet(beat, unended_seconds):
            vouched = max(vouched or 0.0, previous.at)
        if beat.ended:
            vouched = max(vouched or 0.0, beat.ended - END_MARGIN)
        previous = beat
    return vouched, previous


def _quiet(beat: Heartbeat, unended_seconds: float) -> bool:
    return beat.between == 0 and (not beat.open or beat.open_quiet >= unended_seconds)
