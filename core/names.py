"""The names every box shares, each in one place: rules, checkpoints, health components, partition keys.

A name written here is part of the store's contents (checkpoints, health rows) or of what people
and Prometheus see (rule ids, collector labels): change one only with a migration in mind.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Rule(NamedTuple):
    id: str
    name: str
    severity: str  # the default; F9 is info when the duplicate's payloads are equal


# docs/architecture.md §4.
RULES: dict[str, Rule] = {r.id: r for r in (
    Rule("F1", "duplicate_effect", "critical"),
    Rule("F2", "double_charge", "critical"),
    Rule("F3", "stuck_pending", "warning"),
    Rule("F4", "illegal_transition", "critical"),
    Rule("F5", "amount_mismatch", "critical"),
    Rule("F6", "invalid_callback_status", "warning"),
    Rule("F7", "missing_event", "critical"),
    Rule("F8", "orphan_event", "critical"),
    Rule("F9", "duplicate_event", "critical"),
    Rule("F10", "event_delay", "warning"),
    Rule("F11", "offset_drift", "warning"),
    Rule("F12", "partition_skew", "warning"),
    # the CDC pipeline's own completeness ([cdc] mode = "check", checks.pipeline); F15, F16 in source mode too
    Rule("F13", "cdc_lost", "critical"),
    Rule("F14", "cdc_phantom", "critical"),
    Rule("F15", "cdc_replay", "info"),
    Rule("F16", "cdc_transaction_incomplete", "warning"),
)}
SEVERITIES = ("critical", "warning", "info")
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
# A finding's lifecycle (docs/architecture.md §3). The engine knows the facts: OPEN, or RESOLVED when it saw the
# fact end. A person acknowledges (ACKNOWLEDGED: seen, being handled) or closes (CLOSED: decided,
# with a reason); both are kept in the store and end when the fact does, when the acknowledgement
# lapses or the accepted risk expires, or (a close) when the fact is seen again.
OPEN, ACKNOWLEDGED, CLOSED, RESOLVED = "open", "acknowledged", "closed", "resolved"
STATUSES = (OPEN, ACKNOWLEDGED, CLOSED, RESOLVED)
# Why a person closes a finding: fixed, a false positive, a risk accepted until a date, the
# duplicate of another finding.
CLOSE_REASONS = ("fixed", "false_positive", "accepted_risk", "duplicate")

# Checkpoints: how far each input was read, written with what it produced.
BINLOG_CHECKPOINT = "binlog"
KAFKA_CHECKPOINT = "kafka_events"
KAFKA_KNOWN_CHECKPOINT = "kafka_known"  # what the events reader knew of the broker (core.protocol.BrokerKnown)
CDC_CHECKPOINT = "cdc"  # CDC mode: the change source's topic offsets (its GTID set is in BINLOG_CHECKPOINT)
CDC_GTID_CHECKPOINT = "cdc_gtid"  # CDC check mode: the GTID set the CDC topics have delivered (the binlog's is apart)

# Health components: one row each in the store, written by the monitor every second.
BINLOG = "binlog"
KAFKA_EVENTS = "kafka_events"
KAFKA_OFFSETS = "kafka_offsets"
CDC = "cdc"  # CDC check mode: the CDC topics read beside the binlog, to check the pipeline against it
MONITOR = "monitor"
FORKSERVER = "forkserver"  # the process the readers' processes are forked from (a part of /metrics' CPU per part)
STORE_WRITER = "store"  # the process that writes the monitor's checkpoints (a part of /metrics' CPU per part)
COLLECTORS = (BINLOG, KAFKA_EVENTS, KAFKA_OFFSETS, CDC)

# The monitor's verdict on itself (oncewatch.monitor.verdict); its last health row once stopped says so.
HEALTHY, DEGRADED, FAILING, STOPPED = "healthy", "degraded", "failing", "stopped"
VERDICTS = (HEALTHY, DEGRADED, FAILING, STOPPED)

# Why a Kafka record was quarantined (oncewatch.collectors.kafka_formats), each counted on /metrics.
NOT_UTF8, NOT_JSON, NULL_VALUE = "not_utf8", "not_json", "null_value"
MISSING_PATH, WRONG_TYPE, TOO_LARGE = "missing_path", "wrong_type", "too_large"
# The parser itself failed on the record (a case its checks missed: a bug to report) or kafka-python
# could not decode the record batch it is in (a header key that is not UTF-8).
UNPARSEABLE = "unparseable"
QUARANTINE_REASONS = (NOT_UTF8, NOT_JSON, NULL_VALUE, MISSING_PATH, WRONG_TYPE, TOO_LARGE, UNPARSEABLE)
# Why a binlog rows event was quarantined (oncewatch.collectors.binlog): a value its charset cannot decode, or
# anything else the replication library failed on.
UNDECODABLE = "undecodable"
BINLOG_QUARANTINE_REASONS = (UNDECODABLE, UNPARSEABLE)

# State rows beside the engine's entries.
ENGINE_STATS = "engine_stats"
# While a first start's bootstrap runs: its progress (a store holding it was interrupted mid-way).
BOOTSTRAP = "bootstrap"


def key_text(value: Any) -> str:
    """A key (order, trade_no, announced key) as the text both streams agree on: a VARBINARY
    column's bytes are the text they hold, as the event's JSON carries it, not "b'...'"; a
    composite key's parts joined by "/" (a tuple from a row, a list once through JSON)."""
    kind = value.__class__
    if kind is str:  # nearly every key: the fast way out (this runs several times per record)
        return value
    if kind is bytes:
        return value.decode("utf-8", "backslashreplace")
    if kind is tuple or kind is list:
        return "/".join(map(key_text, value))
    return str(value)


def key_of(row: dict[str, Any], columns: tuple[str, ...]) -> Any:
    """The key a row holds in `columns`: the value of the one column, or a tuple of a composite key's parts;
    None when any part is NULL."""
    if len(columns) == 1:
        return row.get(columns[0])
    parts = tuple(map(row.get, columns))
    return None if None in parts else parts


def partition_key(topic: str, partition: int) -> str:
    """'topic/partition': how checkpoints, health rows and evidence name one Kafka partition."""
    return f"{topic}/{partition}"


def split_partition_key(key: str) -> tuple[str, int]:
    """The inverse of `partition_key`: split at the last "/"."""
    topic, _, partition = key.rpartition("/")
    return topic, int(partition)


# Entity kinds of the store's drill-down index ('kind:value'); a bare value is looked up as each.
ENTITY_KINDS = ("trade_no", "order_key")
