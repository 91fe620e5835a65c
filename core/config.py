"""The one TOML file that describes a shop to oncewatch (docs/architecture.md §5), loaded into frozen objects.

Everything is validated at load time; every error names the dotted key and what is wrong
(`ConfigError: mysql.port: expected an integer, got 'abc'`). Secrets are never read from
the TOML itself: `password_env` names an environment variable, `password_file` a file.
`describe()` gives the resolved config with secrets masked, for `oncewatch check-config`.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
import zoneinfo
from dataclasses import dataclass, fields, is_dataclass
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from oncewatch.core import kafka_security
from oncewatch.core.domain import Announce, Domain, Rules, parse_announce, parse_domain, parse_rules
from oncewatch.core.kafka_security import KafkaSecurity
from oncewatch.core.sections import MASK, ConfigError, Secret, Section, existing_file, qualified_table, read_secret
from oncewatch.core.tables import Watched, is_pattern


# ---------------------------------------------------------------- sections

@dataclass(frozen=True)
class MySQLConfig:
    host: str
    port: int
    user: str
    password: Secret
    server_id: int
    tables: tuple[str, ...]
    commit_time_columns: dict[str, str]
    connect_timeout: float
    read_timeout: float
    heartbeat_seconds: float
    reconnect_max_seconds: float
    # TLS for the replication stream and the SELECTs alike: the server's CA, a client certificate and its key
    # (an account REQUIRE X509), and whether the server's certificate must name `host`
    ssl_ca: str | None = None
    ssl_cert: str | None = None
    ssl_key: str | None = None
    ssl_verify_identity: bool = False

    @cached_property
    def watched(self) -> Watched:
        """Which entry of `tables` a real table falls under (entries may be patterns)."""
        return Watched(self.tables)


@dataclass(frozen=True)
class TopicConfig:
    name: str
    format: str  # json | debezium | canal
    # logical key -> dotted payload path, or the paths of a composite key's parts (in key order)
    paths: dict[str, str | tuple[str, ...]]
    required: tuple[str, ...]
    # What F9 compares of two events announcing one key: only these paths, or all but these (an envelope's
    # own id and time differ between two sends of one business fact); both empty: the whole payload.
    compare: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    amount_scale: Decimal = Decimal(1)  # the `amount` path's value is divided by this (100: cents)


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: tuple[str, ...]
    client_id: str
    topics: tuple[TopicConfig, ...]
    consumer_groups: tuple[str, ...]
    max_record_bytes: int
    offsets_poll_seconds: float
    request_timeout_seconds: float
    start_from: str = "latest"  # where partitions without a checkpoint start on the first run
    metadata_refresh_seconds: float = 5.0  # how often new topics/partitions are looked for
    # After the broker was away: how long its producers may still append records stamped before it came back
    # (their delivery.timeout.ms); the Kafka clock vouches for nothing new meanwhile (collectors.kafka_events).
    producer_delivery_seconds: float = 120.0
    lag_history_points: int = 60  # (end offset, time) points kept per partition for lag seconds
    security: KafkaSecurity = KafkaSecurity()  # every client's protocol, SASL and TLS (core.kafka_security)


@dataclass(frozen=True)
class CdcConfig:
    """`[cdc]`: the watched tables' changes read from a CDC pipeline's topics instead of the binlog."""

    format: str  # debezium, canal
    topic_prefix: str = ""  # debezium: the connector's topic.prefix: <prefix>.<schema>.<table>, <prefix>.transaction
    transaction_grace_seconds: float = 30.0  # how long a transaction's END waits for the records it counts
    # where a first start reads the topics from: "earliest" (the connector's snapshot, then every change since),
    # or "latest" (changes from now on, into a monitor whose state starts empty)
    start_from: str = "earliest"
    # "source": the topics are the change source, in the binlog's place; "check": the binlog stays the source and
    # the topics are checked against it, row for row (checks.pipeline, F13-F16)
    mode: str = "source"
    topics: tuple[str, ...] = ()  # canal: the topics its MQ producer writes the watched tables' FlatMessages to
    time_zone: str = "UTC"  # canal: the zone its server writes TIMESTAMP values in (its JVM's default zone)
    # debezium: the topic of the connector's heartbeats (its heartbeat.interval.ms), which move the change clock
    # (F3's, F8's, F9's) while the topics are quiet; "": none, the clock moves only with the commits delivered
    heartbeat_topic: str = ""
    # debezium: a transaction begun and never ended (Debezium writes a BEGIN and no END for a DDL) holds the change
    # clock until the connector has written nothing read for this long (checks.clocks.heartbeat_watermark)
    unended_transaction_seconds: float = 30.0


@dataclass(frozen=True)
class GroupConfig:
    """`[group]`: this instance is one of several that judge as one (oncewatch.monitor.group): a Kafka consumer
    group on oncewatch's own topics, on a shared PostgreSQL store."""

    name: str  # the group: its topics are oncewatch.<name>.records (shards partitions) and oncewatch.<name>.lease
    shards: int = 12  # the internal topic's partitions: fixed for the group's life (each is a shard's state)
    member: str = ""  # this instance's name in the group, on /metrics and the pages ("": host-pid)
    commit_seconds: float = 0.5  # between two commits of a shard's findings, state and offset
    mark_seconds: float = 0.25  # between two clock marks a router writes to every shard
    # the group's topics' replicas (a router writes with acks=all, which protects nothing on 1); the dev stack's
    # single broker needs 1
    replication_factor: int = 3
    purge_seconds: float = 30.0  # between two purges of the records every shard has committed past


@dataclass(frozen=True)
class PostgresTarget:
    """A store in a PostgreSQL database: its URL (no password in it) and where the password is."""

    url: str
    password: Secret = Secret()
    # libpq's TLS settings (sslmode, sslrootcert, sslcert, sslkey), as [store] gives them: (name, value) pairs
    tls: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return self.url


MAX_CHECKPOINT_SECONDS = 60.0
WRITERS = ("judge", "process")  # store.writer
# The smallest store.max_bytes: below it the engine's open state, the findings and the schema of a small shop
# would fill the budget with no raw record kept.
MIN_MAX_BYTES = 16 * 2**20


@dataclass(frozen=True)
class StoreConfig:
    path: str
    # Open-state entries per kind the engine keeps in memory; older ones wait in the store (checks.horizon).
    memory_entries: int = 20_000
    # Raw row changes, events and chart points older than this are pruned (store.retention); 0 keeps them all.
    retention_hours: float = 168.0
    postgres: PostgresTarget | None = None  # `url = "postgresql://..."`: the shared store instead of `path`
    # Seconds between two saves of the engine's state with the read positions and the raw records read since
    # (oncewatch.monitor.writer); a kill -9 replays at most this much. A new or changed finding saves at once.
    checkpoint_seconds: float = 1.0
    # The store's disk budget in bytes (store.retention): past it the oldest raw records go, whatever their age;
    # findings and their evidence never. 0: no budget (retention_hours alone bounds the store).
    max_bytes: int = 0
    # Who writes the checkpoints (oncewatch.monitor.saver): the judge itself ("judge"), or a process of its own
    # ("process") while the judge goes on with the rules, for a machine with cores to spare.
    writer: str = "judge"

    @property
    def target(self) -> str | PostgresTarget:
        """What `oncewatch.store` opens: the SQLite file's path, or the PostgreSQL database."""
        return self.postgres if self.postgres is not None else self.path


@dataclass(frozen=True)
class MetricsConfig:
    host: str
    port: int
    # Open findings served one series each (oncewatch_finding_paging), the oldest first; the others are counted
    # in oncewatch_findings_paging_overflow, so a flood of findings cannot flood Prometheus.
    paging_max_findings: int = 100


# Row and payload fields holding personal data, masked in exports with --mask. trade_no and
# order_no are not among them: auditors need them to match the report with the books.
DEFAULT_MASK_FIELDS = ("user_id", "customer_id", "phone", "mobile", "email", "name", "real_name", "address",
                       "id_card", "card_no", "ip")


@dataclass(frozen=True)
class ExportConfig:
    """`[export]`: which fields `--mask` hides, and the key that makes masked values comparable."""

    mask_fields: tuple[str, ...] = DEFAULT_MASK_FIELDS
    mask_key: Secret = Secret()

    def key(self) -> bytes | None:
        """The HMAC key for masked values, or None when none is configured (values become "***")."""
        if not (self.mask_key.env or self.mask_key.file):
            return None
        value = self.mask_key.value()
        if not value:
            raise ConfigError("export.mask_key: the key is empty; put a long random string in the "
                              "variable or file named by mask_key_env / mask_key_file")
        return value.encode()


@dataclass(frozen=True)
class AttestConfig:
    """`[attest]`: the Ed25519 private key period attestations are signed with (a PEM file, `key_file`, or its text
    in `key_env`: a secret), and the folder they are kept in, where the next one finds the one it chains to."""

    key: Secret
    directory: str | None = None

    @property
    def key_name(self) -> str:
        """The dotted key the private key was given by, for errors: attest.key_file or attest.key_env."""
        return f"{self.key.key}_{'file' if self.key.file else 'env'}"

    def private_pem(self) -> bytes:
        """The private key's PEM text (read when an attestation is signed, never logged)."""
        value = self.key.value()
        if not value:
            raise ConfigError(f"{self.key_name}: the key is empty; make a key pair with `oncewatch attest-key --out "
                              f"DIR` and name its private key file in {self.key.key}_file")
        return value.encode()


@dataclass(frozen=True)
class SloConfig:
    """`[slo]`: the exactly-once objective (issue 45): the share of the money paid (in the unit the payments'
    amounts are in, after amount_scale) that is verified within `within_seconds` of its commit. `unit` is how
    people write that unit (the Overview's tile: "99.98% of ¥ in 24 h"); `window_hours` is the tile's window."""

    objective: float = 0.999
    within_seconds: float = 60.0
    unit: str = ""
    window_hours: float = 24.0


@dataclass(frozen=True)
class Config:
    source: str
    mysql: MySQLConfig
    kafka: KafkaConfig | None
    store: StoreConfig
    metrics: MetricsConfig
    domain: Domain
    announce: tuple[Announce, ...]
    rules: Rules
    export: ExportConfig = ExportConfig()
    cdc: CdcConfig | None = None  # None: the binlog is the change source
    group: GroupConfig | None = None  # None: one instance judges everything
    slo: SloConfig = SloConfig()
    attest: AttestConfig | None = None  # None: no period attestations are signed
    # The config hash on exports and in `oncewatch check-config`: SHA-256 of the file's content as parsed (canonical
    # JSON: sorted keys, no spaces): the same settings give the same hash whatever path, layout or comments the file
    # has. The file holds no secret (only where each comes from), so nothing needs masking first.
    content_sha256: str = ""


JSON_PATH_KEYS = ("event_type", "trade_no", "order_key", "effect_id", "amount", "status")
COMPOSITE_PATH_KEYS = ("order_key", "effect_id")  # keys that may be made of several paths
TOPIC_FORMATS = ("json", "debezium", "canal")


def _mysql(s: Section, base: Path, *, login: bool = True) -> MySQLConfig:
    """`login`: the monitor connects to MySQL (not in CDC mode, where `user` may be left out)."""
    tables = tuple(qualified_table(t, s.key("tables")) for t in s.str_list("tables", required=True, nonempty=True))
    for i, table in enumerate(tables):
        if table in tables[:i]:
            raise ConfigError(f"{s.key('tables')}: {table!r} is listed twice")
    columns = s.table("commit_time_columns")
    for table, column in columns.items():
        if table not in tables:
            raise ConfigError(f"{s.key('commit_time_columns')}.{table}: not one of mysql.tables")
        if not isinstance(column, str):
            raise ConfigError(f"{s.key('commit_time_columns')}.{table}: expected a column name")
    cfg = MySQLConfig(
        host=s.str("host", "127.0.0.1"),
        port=s.int("port", 3306, minimum=1, maximum=65535),
        user=s.str("user", None if login else "", required=login),
        password=read_secret(s, base),
        server_id=s.int("server_id", 4242, minimum=1, maximum=2**32 - 1),
        tables=tables,
        commit_time_columns=dict(columns),
        connect_timeout=s.float("connect_timeout_seconds", 5.0, minimum=0.1),
        read_timeout=s.float("read_timeout_seconds", 30.0, minimum=1.0),
        heartbeat_seconds=s.float("heartbeat_seconds", 5.0, minimum=0.5),
        reconnect_max_seconds=s.float("reconnect_max_seconds", 30.0, minimum=0.1),
        ssl_ca=existing_file(s, "ssl_ca", base),
        ssl_cert=existing_file(s, "ssl_cert", base),
        ssl_key=existing_file(s, "ssl_key", base),
        ssl_verify_identity=s.bool("ssl_verify_identity", False),
    )
    if cfg.ssl_key and not cfg.ssl_cert:
        raise ConfigError(f"{s.key('ssl_cert')}: missing: ssl_key is the key of a client certificate")
    if cfg.ssl_verify_identity and not cfg.ssl_ca:
        raise ConfigError(f"{s.key('ssl_verify_identity')}: needs ssl_ca, the CA the server's certificate is "
                          f"checked against")
    s.done()
    return cfg


def _topic(s: Section) -> TopicConfig:
    name = s.str("name", required=True)
    fmt = s.str("format", "json", choices=TOPIC_FORMATS)
    paths_section = s.section("paths")
    paths: dict[str, str | tuple[str, ...]] = {}
    for k in JSON_PATH_KEYS:
        if k in paths_section.data:
            parts = paths_section.names(k)
            if len(parts) > 1 and k not in COMPOSITE_PATH_KEYS:
                raise ConfigError(f"{paths_section.key(k)}: one path only; a list of paths (a composite key) is "
                                  f"for {', '.join(COMPOSITE_PATH_KEYS)}")
            paths[k] = parts[0] if len(parts) == 1 else parts
    paths_section.done()
    required = s.str_list("required", ["event_type"] if fmt == "json" else [])
    for r in required:
        if r not in paths:
            raise ConfigError(f"{s.key('required')}: '{r}' has no entry in {paths_section.path}")
    compare, ignore = s.str_list("compare"), s.str_list("ignore")
    if compare and ignore:
        raise ConfigError(f"{s.key('ignore')}: give compare (the paths F9 compares) or ignore (the paths it "
                          f"leaves out), not both")
    if (compare or ignore) and fmt != "json":
        raise ConfigError(f"{s.key('compare' if compare else 'ignore')}: only for json topics (F9 compares the "
                          f"events announcing one key)")
    scale = Decimal(s.scale())
    s.done()
    return TopicConfig(name=name, format=fmt, paths=paths, required=required, compare=compare, ignore=ignore,
                       amount_scale=scale)


def _kafka(s: Section, base: Path) -> KafkaConfig:
    topics = tuple(_topic(t) for t in s.sections("topics"))
    if not topics:
        raise ConfigError(f"{s.key('topics')}: configure at least one [[kafka.topics]]")
    names = [t.name for t in topics]
    if len(set(names)) != len(names):
        raise ConfigError(f"{s.key('topics')}: topic listed twice")
    cfg = KafkaConfig(
        bootstrap_servers=s.str_list("bootstrap_servers", required=True, nonempty=True),
        client_id=s.str("client_id", "oncewatch"),
        topics=topics,
        consumer_groups=s.str_list("consumer_groups"),
        max_record_bytes=s.int("max_record_bytes", 1_048_576, minimum=1),
        offsets_poll_seconds=s.float("offsets_poll_seconds", 5.0, minimum=0.1),
        request_timeout_seconds=s.float("request_timeout_seconds", 10.0, minimum=1.0),
        start_from=s.str("start_from", "latest", choices=("earliest", "latest")),
        metadata_refresh_seconds=s.float("metadata_refresh_seconds", 5.0, minimum=0.1),
        producer_delivery_seconds=s.float("producer_delivery_seconds", 120.0, minimum=0.0),
        lag_history_points=s.int("lag_history_points", 60, minimum=2, maximum=10_000),
        security=kafka_security.parse(s, base),
    )
    s.done()
    return cfg


CDC_FORMATS = ("debezium", "canal")


def heartbeat_topic(prefix: str) -> str:
    """Debezium's default heartbeat topic for a connector's `topic.prefix`."""
    return f"__debezium-heartbeat.{prefix}"
CDC_MODES = ("source", "check")


def _cdc(s: Section, kafka: KafkaConfig | None, mysql: MySQLConfig) -> CdcConfig:
    fmt = s.str("format", "debezium", choices=CDC_FORMATS)
    canal = fmt == "canal"
    cfg = CdcConfig(format=fmt, topic_prefix=s.str("topic_prefix", "" if canal else None, required=not canal),
                    transaction_grace_seconds=s.float("transaction_grace_seconds", 30.0 if not canal else 1.0,
                                                      minimum=0.1),
                    start_from=s.str("start_from", "earliest", choices=("earliest", "latest")),
                    mode=s.str("mode", "source", choices=CDC_MODES),
                    topics=tuple(s.str_list("topics", required=canal, nonempty=canal)),
                    time_zone=s.str("time_zone", "UTC"),
                    heartbeat_topic=s.str("heartbeat_topic",
                                          "" if canal else heartbeat_topic(str(s.data.get("topic_prefix", "")))),
                    unended_transaction_seconds=s.float("unended_transaction_seconds", 30.0, minimum=1.0))
    if "capture_seconds" in s.data:
        raise ConfigError(f"{s.key('capture_seconds')}: no longer read: the change clock is what the connector "
                          f"vouches for, its heartbeats (cdc.heartbeat_topic; README, [cdc]), never the host's clock "
                          f"minus a guess; remove the key and give the connector heartbeat.interval.ms")
    s.done()
    if canal and cfg.heartbeat_topic:
        raise ConfigError(f"{s.key('heartbeat_topic')}: Canal writes no heartbeats to Kafka; leave it out")
    if canal and cfg.topic_prefix:
        raise ConfigError(f"{s.key('topic_prefix')}: Canal's topics are named by its canal.mq.topic, not a prefix; "
                          f"list them in cdc.topics")
    if not canal and cfg.topics:
        raise ConfigError(f"{s.key('topics')}: Debezium's topics follow from cdc.topic_prefix; leave cdc.topics out")
    if canal and cfg.mode == "check":
        raise ConfigError(f"{s.key('mode')}: Canal's FlatMessage carries no GTID, so its rows cannot be lined up "
                          f"with the binlog's; mode \"check\" needs format = \"debezium\"")
    try:
        zoneinfo.ZoneInfo(cfg.time_zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"{s.key('time_zone')}: {cfg.time_zone!r} is not an IANA time zone (\"UTC\", "
                          f"\"Asia/Shanghai\")") from exc
    if cfg.mode == "check" and cfg.start_from != "earliest":
        raise ConfigError(f"{s.key('start_from')}: in mode \"check\" the topics are read from the earliest offset "
                          f"(every binlog row since the monitor's start must be found on them); leave it out")
    if kafka is None:
        raise ConfigError(f"{s.key('format')}: a CDC change source is read from Kafka; configure [kafka] "
                          f"bootstrap_servers")
    patterns = [t for t in mysql.tables if is_pattern(t)]
    if patterns:
        raise ConfigError(f"mysql.tables: {patterns[0]!r} is a pattern; with [cdc] every watched table is named "
                          f"(its topic is <topic_prefix>.<schema>.<table>)")
    return cfg


def _listen(s: Section, default_port: int) -> MetricsConfig:
    cfg = MetricsConfig(host=s.str("host", "127.0.0.1"), port=s.int("port", default_port, minimum=0, maximum=65535),
                        paging_max_findings=s.int("paging_max_findings", MetricsConfig.paging_max_findings,
                                                  minimum=0))
    s.done()
    return cfg


def _slo(s: Section) -> SloConfig:
    objective = s.float("objective", SloConfig.objective)
    if not 0 < objective < 1:
        raise ConfigError(f"{s.key('objective')}: a share of the money between 0 and 1, exclusive (0.999 for 99.9%), "
                          f"got {objective}")
    within = s.float("within_seconds", SloConfig.within_seconds)
    if within <= 0:
        raise ConfigError(f"{s.key('within_seconds')}: must be more than 0 seconds, got {within}")
    window = s.float("window_hours", SloConfig.window_hours)
    if window <= 0:
        raise ConfigError(f"{s.key('window_hours')}: must be more than 0 hours, got {window}")
    unit = s.opt_str("unit") or ""
    s.done()
    return SloConfig(objective, within, unit, window)


def _export(s: Section, base: Path) -> ExportConfig:
    cfg = ExportConfig(mask_fields=s.str_list("mask_fields", list(DEFAULT_MASK_FIELDS), nonempty=True),
                       mask_key=read_secret(s, base, "mask_key"))
    s.done()
    return cfg


def _attest(s: Section, base: Path) -> AttestConfig:
    key = read_secret(s, base, "key")
    directory = s.opt_str("directory")
    s.done()
    if not key.given:
        raise ConfigError(f"{s.key('key_file')}: missing: attestations are signed with an Ed25519 private key; make a "
                          f"pair with `oncewatch attest-key --out DIR` and give key_file = \"DIR/attest.key\"")
    if directory is not None and not directory:
        raise ConfigError(f"{s.key('directory')}: expected a folder's path, got an empty string")
    if directory is not None and not Path(directory).is_absolute():
        directory = str((base / directory).resolve())
    return AttestConfig(key=key, directory=directory)


def parse(data: dict[str, Any], source: str = "<memory>", base: Path | None = None) -> Config:
    base = base or Path.cwd()
    root = Section(data, "")
    # the CDC change source needs no database login; a check of the pipeline reads the binlog too
    cdc_source = "cdc" in data and isinstance(data["cdc"], dict) and data["cdc"].get("mode", "source") == "source"
    mysql = _mysql(root.section("mysql", required=True), base, login=not cdc_source)
    kafka_section = root.section("kafka")
    kafka = _kafka(kafka_section, base) if kafka_section.data else None
    cdc_section = root.section("cdc")
    cdc = _cdc(cdc_section, kafka, mysql) if "cdc" in data else None  # an empty [cdc] is missing its prefix
    store_s = root.section("store")
    postgres = _postgres(store_s, base)
    store_path = store_s.str("path", "oncewatch.db")
    memory_entries = store_s.int("memory_entries", StoreConfig.memory_entries, minimum=1000)
    retention_hours = store_s.float("retention_hours", StoreConfig.retention_hours)
    checkpoint_seconds = store_s.float("checkpoint_seconds", StoreConfig.checkpoint_seconds)
    if checkpoint_seconds > MAX_CHECKPOINT_SECONDS:
        raise ConfigError(f"store.checkpoint_seconds: at most {MAX_CHECKPOINT_SECONDS:g} (what a kill -9 replays, and "
                          f"the records held in memory until then), got {checkpoint_seconds:g}")
    max_bytes = store_s.size("max_bytes", 0, minimum=MIN_MAX_BYTES, why="the engine's open state and the findings "
                             "must fit with room for raw records")
    if max_bytes and postgres is not None:
        raise ConfigError("store.max_bytes: a budget for a SQLite store only; a PostgreSQL store's disk is its "
                          "database's to budget (store.retention_hours bounds what the monitor keeps there)")
    writer = store_s.str("writer", StoreConfig.writer, choices=WRITERS)
    store_s.done()
    if store_path != ":memory:" and not Path(store_path).is_absolute():
        store_path = str((base / store_path).resolve())
    metrics = _listen(root.section("metrics"), 9464)
    export = _export(root.section("export"), base)
    domain = parse_domain(root.section("domain"), mysql)
    announce = parse_announce(root.sections("announce"), mysql, kafka, domain)
    rules = parse_rules(root.section("rules"))
    group = _group(root.section("group"), cdc, postgres) if "group" in data else None
    slo = _slo(root.section("slo"))
    attest = _attest(root.section("attest"), base) if "attest" in data else None
    root.done()
    return Config(source=source, mysql=mysql, kafka=kafka,
                  store=StoreConfig(store_path, memory_entries, retention_hours, postgres, checkpoint_seconds,
                                    max_bytes, writer),
                  metrics=metrics,
                  domain=domain,
                  announce=announce, rules=rules, export=export, cdc=cdc, group=group, slo=slo, attest=attest,
                  content_sha256=content_sha256(data))


def _group(s: Section, cdc: CdcConfig | None, postgres: PostgresTarget | None) -> GroupConfig:
    name = s.str("name", None, required=True)
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", name):
        raise ConfigError(f"{s.key('name')}: {name!r} names Kafka topics: letters, digits, '.', '_', '-'")
    cfg = GroupConfig(name=name, shards=s.int("shards", GroupConfig.shards, minimum=1),
                      member=s.str("member", ""),
                      commit_seconds=s.float("commit_seconds", GroupConfig.commit_seconds, minimum=0.05),
                      mark_seconds=s.float("mark_seconds", GroupConfig.mark_seconds, minimum=0.05),
                      replication_factor=s.int("replication_factor", GroupConfig.replication_factor, minimum=1),
                      purge_seconds=s.float("purge_seconds", GroupConfig.purge_seconds, minimum=1.0))
    s.done()
    if cdc is None or cdc.mode != "source":
        raise ConfigError(f"{s.key('name')}: the instances of a group share the work of a CDC change source; "
                          f"configure [cdc] with mode = \"source\"")
    if postgres is None:
        raise ConfigError(f"{s.key('name')}: the instances of a group share one store; give [store] url = "
                          f"\"postgresql://...\"")
    return cfg


SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def _postgres(s: Section, base: Path) -> PostgresTarget | None:
    """`[store] url`, a PostgreSQL database instead of the SQLite file at `path`; its password from
    `password_env` or `password_file` (or libpq's own PGPASSWORD / ~/.pgpass when neither is given)."""
    url = s.opt_str("url")
    if url is None:
        for name in ("password_env", "password_file", "sslmode", "sslrootcert", "sslcert", "sslkey"):
            if name in s.data:
                raise ConfigError(f"{s.key(name)}: only a PostgreSQL store (url) has a password or TLS settings")
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname or len(parts.path) < 2:
        raise ConfigError(f"{s.key('url')}: expected postgresql://USER@HOST:PORT/DATABASE, got {url!r}")
    if parts.password is not None:
        raise ConfigError(f"{s.key('url')}: secrets are not read from the config file; take the password out of "
                          f"the URL and give password_env = \"VAR\" or password_file = \"/path\"")
    if "path" in s.data:
        raise ConfigError(f"{s.key('path')}: give path (a SQLite store) or url (PostgreSQL), not both")
    tls = [("sslmode", s.str("sslmode", choices=SSLMODES))] if "sslmode" in s.data else []
    tls += [(name, path) for name in ("sslrootcert", "sslcert", "sslkey")
            if (path := existing_file(s, name, base)) is not None]
    if dict(tls).get("sslmode", "").startswith("verify") and "sslrootcert" not in dict(tls):
        raise ConfigError(f"{s.key('sslrootcert')}: missing: sslmode {dict(tls)['sslmode']} checks the server's "
                          f"certificate against this CA file")
    return PostgresTarget(url, read_secret(s, base), tuple(tls))


def content_sha256(data: dict[str, Any]) -> str:
    """SHA-256 of a parsed config file as canonical JSON (TOML dates and times as ISO text)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def load(path: str | Path) -> Config:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the config file ({exc.strerror})") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc})") from exc
    return parse(data, source=str(p), base=p.resolve().parent)


def describe(cfg: Any) -> Any:
    """The resolved config as plain data, secrets masked (only where they come from is shown)."""
    if isinstance(cfg, Secret):
        where = f"env {cfg.env}" if cfg.env else f"file {cfg.file}" if cfg.file else "none"
        return f"{MASK} (from {where})"
    if is_dataclass(cfg):
        return {f.name: describe(getattr(cfg, f.name)) for f in fields(cfg)}
    if isinstance(cfg, dict):
        return {k: describe(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [describe(v) for v in cfg]
    return cfg


__all__ = ["AttestConfig", "Config", "ConfigError", "MySQLConfig", "KafkaConfig", "TopicConfig", "ExportConfig",
           "StoreConfig", "MetricsConfig", "load", "parse", "describe"]
