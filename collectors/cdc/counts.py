"""What the CDC assemblers (Debezium's, collectors.cdc.assemble; Canal's, collectors.canal) count of the records
they read beyond the transactions: records that cannot be read exactly, kept in quarantine, and records read again
after a connector's restart, as runs per partition."""

from __future__ import annotations

import logging

from oncewatch.core.records import QuarantinedRows, Replay

log = logging.getLogger("oncewatch.collectors.cdc")


class Unreadable:
    """Records of the CDC topics that cannot be read exactly: logged and counted by their Kafka coordinates, and
    kept in quarantine with the next transaction handed on (either format's assembler)."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.records = 0
        self.held: list[QuarantinedRows] = []

    def add(self, part: str, offset: int, table: str, reason: str, detail: str) -> None:
        self.records += 1
        at = f"{part}@{offset}"
        log.error(self.message, extra={"event": "cdc_record_unreadable", "at": at, "reason": reason,
                                       "detail": detail})
        self.held.append(QuarantinedRows(txid="", binlog_file=part, event_pos=offset, table=table, reason=reason,
                                         detail=f"{at}: {detail}"))

    def take(self) -> list[QuarantinedRows]:
        out, self.held = self.held, []
        return out


class ReplayRuns:
    """Records read again (a connector restart replays what it wrote since its last offset flush), as runs per
    partition: a run grows while its partition gives replayed records and ends at the first that is not."""

    def __init__(self) -> None:
        self.records = 0
        self.current: dict[str, Replay] = {}  # per partition, the run it is in, if any
        self.grown: dict[str, Replay] = {}  # the runs that grew since the last take()

    def replayed(self, partition: str, offset: int, txid: str) -> None:
        self.records += 1
        run = self.current.get(partition)
        run = (Replay(partition, offset, offset, 1, txid, txid) if run is None
               else run._replace(last=offset, records=run.records + 1, last_gtid=txid))
        self.current[partition] = self.grown[partition] = run

    def ended(self, partition: str) -> None:
        """A record of `partition` that is not a replay."""
        self.current.pop(partition, None)

    def take(self) -> tuple[Replay, ...]:
        out, self.grown = tuple(self.grown.values()), {}
        return out
