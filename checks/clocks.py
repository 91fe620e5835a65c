"""The Kafka clock of the absence rules: up to when the Kafka side has been read (DESIGN §4).

F7 judges a change's event lost only once this clock passes the change's grace: an event is
never "missing" while Kafka has not been read up to where it should have appeared.
"""

from __future__ import annotations

from collections.abc import Iterable

from oncewatch.core.records import PartitionStatus


def kafka_watermark(partitions: Iterable[PartitionStatus], applied: dict[str, int], newest_ms: dict[str, int],
                    previous: float) -> float:
    """A time such that every event stamped earlier has been applied, while the stream is busy.

    `applied` is the next offset the engine has taken in per partition key, `newest_ms` the
    newest record timestamp applied from it. A partition applied up to its last known end
    vouches for everything produced before that end was learned; one still behind vouches up to
    the newest event applied from it. A partition with nothing applied vouches for nothing, and
    the clock stays at `previous`. Under steady traffic the stream is never "caught up" at the
    instant it is asked, so without the first rule the clock would stand still and lost events
    would never be judged."""
    marks: list[float] = []
    for part in partitions:
        if applied.get(part.key, 0) >= part.end:
            marks.append(part.end_at)
        elif part.key in newest_ms:
            marks.append(newest_ms[part.key] / 1000)
        else:
            return previous
    return min(marks, default=previous)
