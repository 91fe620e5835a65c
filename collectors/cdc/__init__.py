"""Committed transactions rebuilt from a CDC pipeline's topics: the change source of CDC mode (issue 15).

The package is in three parts: `decode` reads Debezium's records (no I/O), `assemble` makes committed transactions of
them (the pure `Assembler`; `counts` keeps what it and Canal's assembler, collectors.canal, count and quarantine) and
`read` is the Kafka reader, `CdcCollector`, which drives either format's assembler. Import the reader from
`oncewatch.collectors.cdc.read`: the package itself imports no Kafka client.

Debezium writes each captured table's changes to its own topic and, with
`provide.transaction.metadata=true`, every transaction's BEGIN and END to `<prefix>.transaction`;
each data record names its transaction (`transaction.id`, the MariaDB GTID, and `total_order`).
`Assembler` (no I/O) takes both and hands on `Transaction`s in commit order, the order of the
transaction topic, each once its END has come and every record the END counts for the watched
tables has too; the rows are those the binlog collector would give for the same transaction
(collectors.debezium_rows reads the values; a primary-key change, which Debezium writes as a delete,
a tombstone and an insert, is one update again; tombstones are dropped). A TRUNCATE is a
`SchemaChange`, as in the binlog; Debezium gives its transaction a BEGIN and no END, so a
transaction whose BEGIN is followed by another's is over there (Assembler says how its record is
placed).

A transaction whose END counts records that have not come within `grace_seconds` is handed on
with what came, and counted (`incomplete`): the stream never stops behind a lost record. A record
that cannot be read exactly is quarantined with its coordinates. `CdcCollector` reads the topics
from the offsets its caller stored (`positions()`: per partition the first record of a transaction
not yet handed on), so a restart hands nothing on twice and loses nothing.

A Kafka Connect worker restarted (killed, stopped, its task restarted) resumes from its last flushed
offset and writes again what it wrote since (issue 42). A transaction already handed on, or older
than one whose BEGIN was read, that comes again is skipped by its GTID, and counted (`replays`). One
under way comes again from where the offset lies: its BEGIN again, records of rows already held
(known by what the binlog fixes, `row_of`: skipped and counted), `total_order` from 1 again, and an END
that counts what the restarted connector wrote alone. Its records are then known to be in once the
connector has written a later transaction's records in each partition of its tables (a partition is
written in order; the transaction topic is not in order with the tables' topics, and an END can be on
it before records sent before it, which a killed worker then sends again), or after the grace. The
grace of a transaction whose records have not come runs while the connector writes (WRITING_SECONDS),
not while it is away: a worker's restart took 35 s here, and what it had not sent came after it.
"""

from oncewatch.collectors.cdc.assemble import GRACE_SECONDS, WRITING_SECONDS, Assembler, row_of
from oncewatch.collectors.cdc.counts import ReplayRuns, Unreadable
from oncewatch.collectors.cdc.decode import NEW_KEY, OLD_KEY, DataRecord, Schemas, read_record

__all__ = ["GRACE_SECONDS", "NEW_KEY", "OLD_KEY", "WRITING_SECONDS", "Assembler", "DataRecord", "ReplayRuns",
           "Schemas", "Unreadable", "read_record", "row_of"]
