"""Checks before anything is read: the sources answer, let the monitor in and are set up as it needs."""

from __future__ import annotations

import logging

import pymysql
from kafka import errors as kerrors

from oncewatch.collectors.binlog import connect, watched_tables
from oncewatch.collectors.kafka_client import bootstrap_failures, refusal
from oncewatch.collectors.kafka_events import admin_client
from oncewatch.core.config import Config, ConfigError
from oncewatch.core.tables import is_pattern

log = logging.getLogger("oncewatch.monitor.preflight")

REQUIRED_BINLOG_SETTINGS = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
                            "binlog_row_metadata": "FULL"}


class MonitorError(RuntimeError):
    """The monitor cannot go on; the message says why and what to do."""


class SourceUnavailableError(MonitorError):
    """A source cannot be reached or refuses the monitor's account at start-up."""


def preflight_mysql(cfg: Config) -> None:
    """The server is reachable, lets the monitor in, has the binlog settings the collector relies on
    and has every watched table (a pattern may match none yet: that is logged)."""
    m = cfg.mysql
    try:
        conn = connect(m)
    except pymysql.err.OperationalError as exc:
        code = exc.args[0] if exc.args else None
        if code == 1045:
            raise SourceUnavailableError(
                f"MySQL at {m.host}:{m.port} refused user {m.user!r} (wrong password or no such account); "
                f"check mysql.password_env / mysql.password_file, or, for an account that requires TLS or a client "
                f"certificate, mysql.ssl_ca / mysql.ssl_cert / mysql.ssl_key (the server: {exc.args[-1]})") from exc
        reason = str(exc.args[-1])
        if "CERTIFICATE_VERIFY_FAILED" in reason or "SSL" in reason:
            key = ("mysql.ssl_verify_identity (and mysql.host)" if "mismatch" in reason.lower()
                   or "hostname" in reason.lower() else "mysql.ssl_ca")
            raise SourceUnavailableError(f"TLS to MySQL at {m.host}:{m.port} failed ({reason}); check {key}") from exc
        raise SourceUnavailableError(f"cannot reach MySQL at {m.host}:{m.port} ({exc.args[-1]}); check "
                                     f"mysql.host and mysql.port and that the server runs") from exc
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN (%s, %s, %s, %s)",
                        tuple(REQUIRED_BINLOG_SETTINGS))
            found = {k.lower(): str(v).upper() for k, v in cur.fetchall()}
            for name, want in REQUIRED_BINLOG_SETTINGS.items():
                if found.get(name) != want:
                    raise SourceUnavailableError(f"MySQL at {m.host}:{m.port} has {name}={found.get(name)}; "
                                                 f"oncewatch needs {name}={want} (see README)")
            found = watched_tables(cur, m)
            for entry in m.tables:
                if is_pattern(entry) and not any(e == entry for e, _, _ in found):
                    log.warning("no table matches a pattern of mysql.tables yet; its shards are read once created",
                                extra={"event": "pattern_matches_nothing", "pattern": entry})
            for entry, schema, name in found:
                try:
                    cur.execute(f"SELECT 1 FROM `{schema}`.`{name}` LIMIT 0")
                except pymysql.err.MySQLError as exc:
                    raise ConfigError(f"mysql.tables: {schema}.{name} does not exist or user {m.user!r} may not "
                                      f"SELECT it ({exc.args[-1]})") from exc
    finally:
        conn.close()


def preflight_kafka(cfg: Config) -> None:
    """The brokers answer (topics that do not exist yet are waited for, not an error)."""
    if cfg.kafka is None:
        return
    with bootstrap_failures() as failures:
        try:
            admin_client(cfg.kafka).close()
        except kerrors.KafkaError as exc:
            key, reason = refusal(cfg.kafka, failures)
            raise SourceUnavailableError(f"cannot reach Kafka at {', '.join(cfg.kafka.bootstrap_servers)} over "
                                         f"{cfg.kafka.security.protocol} ({type(exc).__name__}): {reason}; check "
                                         f"{key}") from exc
