"""The rows of a CDC connector's first snapshot that it writes again (issue 42, at-least-once delivery).

A Kafka Connect worker that dies during a Debezium connector's initial snapshot, or whose task moves to another
worker then, has the connector take the snapshot again from its start at the restart (its offsets say one was
under way, or none were flushed yet): each table read before the stop comes again, at new offsets.
`SnapshotPasses` tells such a row from one not read yet, so that the monitor applies it once and counts it as a
replay. Rows are told by their image: a row that changed between the two passes is what the table holds now and
is taken in, one that did not is a replay. A row with a primary key is in a pass once, so one seen before is a
replay wherever the topics' partitions are read up to; a table without one may hold equal rows, so there each
pass of the table (from its record marked `first` or `first_in_data_collection`, in its partition's order) gives
again as many of an image as a pass before took in, and only those are replays.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from typing import Any

log = logging.getLogger("oncewatch.collectors.cdc")


def _image_key(db: str, table: str, after: Any) -> bytes:
    # a 128-bit digest, not the image: a large table's snapshot is held until the connector streams
    return hashlib.blake2b(repr((db, table, after)).encode(), digest_size=16).digest()


class SnapshotPasses:
    """The row images of the first snapshot, per table, from its first record until the table's first change streamed."""

    def __init__(self) -> None:
        self.taken: dict[str, Counter[bytes]] = {}  # per table, the rows taken in over every pass, by image
        self.matched: dict[str, Counter[bytes]] = {}  # per table without a key: how many its pass under way gave

    def again(self, record: Any) -> bool:
        """True when `record` (a collectors.cdc.DataRecord of op r) is a row that a pass before this one gave."""
        table = f"{record.db}.{record.table}"
        taken = self.taken.setdefault(table, Counter())
        if record.snapshot_first:
            if taken:
                log.warning("the connector takes its snapshot of a table again from its start (its worker stopped, or "
                            "its task moved, during the snapshot): the rows read before are counted as replays, not "
                            "taken in again", extra={"event": "cdc_snapshot_restarted", "table": table,
                                                     "at": f"{record.part}@{record.offset}",
                                                     "rows_before": sum(taken.values())})
            self.matched[table] = Counter()
        key = _image_key(record.db, record.table, record.after)
        if record.pk:
            seen = taken[key] > 0
        else:
            matched = self.matched.setdefault(table, Counter())
            seen = matched[key] < taken[key]
            matched[key] += 1
        if not seen:
            taken[key] += 1
        return seen

    def streamed(self, table: str) -> None:
        """The connector streams changes of `table` ("schema.table"): its first snapshot of it is over for good."""
        self.taken.pop(table, None)
        self.matched.pop(table, None)
