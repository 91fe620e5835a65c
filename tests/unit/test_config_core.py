"""Config loading: every error names its key; secrets never come from, or go back to, the file."""

from __future__ import annotations

import json

import pytest

from oncewatch import cli
from oncewatch.core.config import ConfigError, SloConfig, describe, load, parse

BASE = {"mysql": {"user": "oncewatch", "password_env": "OW_TEST_PW", "tables": ["shop.orders"]}}
KAFKA = {"kafka": {"bootstrap_servers": ["127.0.0.1:9092"],
                   "topics": [{"name": "events", "format": "json", "required": []}]}}


def with_mysql(**changes):
    return {"mysql": {**BASE["mysql"], **changes}}


@pytest.mark.parametrize("data, message", [
    ({}, r"^mysql: missing \(required\)$"),
    ({"mysql": {"tables": ["shop.orders"]}}, r"^mysql\.user: missing"),
    (with_mysql(port="abc"), r"^mysql\.port: expected an integer, got 'abc'"),
    (with_mysql(port=70000), r"^mysql\.port: must be between 1 and 65535"),
    (with_mysql(tables=["orders"]), r"^mysql\.tables: expected 'schema\.table', got 'orders'"),
    (with_mysql(tables=[]), r"^mysql\.tables: must list at least one"),
    (with_mysql(prot=3306), r"^mysql\.prot: unknown key"),
    (with_mysql(password="hunter2"), r"^mysql\.password: secrets are not read from the config file"),
    (with_mysql(password_file="/x", password_env="Y"), r"^mysql\.password_env: give password_env or"),
    (with_mysql(commit_time_columns={"shop.other": "updated_at"}), r"commit_time_columns\.shop\.other: not one of"),
    (with_mysql(ssl_ca="/nonexistent/ca.pem"), r"^mysql\.ssl_ca: no such file '/nonexistent/ca\.pem'"),
    (with_mysql(ssl_key="/etc/hostname"), r"^mysql\.ssl_cert: missing: ssl_key is the key of a client certificate"),
    (with_mysql(ssl_verify_identity=True), r"^mysql\.ssl_verify_identity: needs ssl_ca"),
    (with_mysql(ssl_verify_identity="yes"), r"^mysql\.ssl_verify_identity: expected true or false"),
    ({**BASE, "store": {"path": 3}}, r"^store\.path: expected a non-empty string"),
    ({**BASE, "store": {"memory_entries": 10}}, r"^store\.memory_entries: must be at least 1000, got 10$"),
    ({**BASE, "store": {"memory_entries": "all"}}, r"^store\.memory_entries: expected an integer"),
    ({**BASE, "store": {"checkpoint_seconds": 61}}, r"^store\.checkpoint_seconds: at most 60 \(what a kill -9"),
    ({**BASE, "store": {"checkpoint_seconds": -1}}, r"^store\.checkpoint_seconds: must be at least 0"),
    ({**BASE, "store": {"writer": "thread"}}, r"^store\.writer: must be one of judge, process, got 'thread'"),
    ({**BASE, "store": {"max_bytes": "lots"}}, r"^store\.max_bytes: expected a size in bytes, an integer or a number"),
    ({**BASE, "store": {"max_bytes": "1 MiB"}}, r"^store\.max_bytes: at least 16 MiB \(the engine's open state"),
    ({**BASE, "store": {"max_bytes": 1000}}, r"^store\.max_bytes: at least 16 MiB"),
    ({**BASE, "store": {"max_bytes": True}}, r"^store\.max_bytes: expected a size in bytes"),
    ({**BASE, "store": {"url": "postgresql://ow@h/db", "max_bytes": "1 GB"}},
     r"^store\.max_bytes: a budget for a SQLite store only"),
    ({**BASE, "store": {"url": "mysql://h/db"}}, r"^store\.url: expected postgresql://USER@HOST:PORT/DATABASE"),
    ({**BASE, "store": {"url": "postgresql://ow@h:5432/"}}, r"^store\.url: expected postgresql://"),
    ({**BASE, "store": {"url": "postgresql://ow:hunter2@h/db"}}, r"^store\.url: secrets are not read from the config"),
    ({**BASE, "store": {"url": "postgresql://ow@h/db", "path": "x.db"}}, r"^store\.path: give path \(a SQLite"),
    ({**BASE, "store": {"url": "postgresql://ow@h/db", "password": "x"}}, r"^store\.password: secrets are not read"),
    ({**BASE, "store": {"password_env": "PW"}}, r"^store\.password_env: only a PostgreSQL store \(url\) has a"),
    ({**BASE, "store": {"sslmode": "require"}}, r"^store\.sslmode: only a PostgreSQL store \(url\) has a"),
    ({**BASE, "store": {"url": "postgresql://ow@h/db", "sslmode": "on"}}, r"^store\.sslmode: must be one of disable"),
    ({**BASE, "store": {"url": "postgresql://ow@h/db", "sslmode": "verify-full"}},
     r"^store\.sslrootcert: missing: sslmode verify-full checks"),
    ({**BASE, "store": {"url": "postgresql://ow@h/db", "sslcert": "/nonexistent.pem"}},
     r"^store\.sslcert: no such file"),
    ({**BASE, "metrics": {"port": "x"}}, r"^metrics\.port: expected an integer"),
    ({**BASE, "slo": {"objective": 99.9}}, r"^slo\.objective: a share of the money between 0 and 1"),
    ({**BASE, "slo": {"objective": "high"}}, r"^slo\.objective: expected a number"),
    ({**BASE, "slo": {"within_seconds": 0}}, r"^slo\.within_seconds: must be more than 0 seconds"),
    ({**BASE, "slo": {"unit": 3}}, r"^slo\.unit: expected a string"),
    ({**BASE, "slo": {"window": 24}}, r"^slo\.window: unknown key"),
    ({**BASE, "cdc": {"topic_prefix": "cdc"}}, r"^cdc\.format: a CDC change source is read from Kafka"),
    ({**BASE, **KAFKA, "cdc": {}}, r"^cdc\.topic_prefix: missing"),
    ({**BASE, **KAFKA, "cdc": {"topic_prefix": "cdc", "format": "avro"}}, r"^cdc\.format: "),
    ({**BASE, **KAFKA, "cdc": {"topic_prefix": "cdc", "start_from": "now"}}, r"^cdc\.start_from: "),
    ({**with_mysql(tables=["shop_*.orders"]), **KAFKA, "cdc": {"topic_prefix": "cdc"}},
     r"^mysql\.tables: 'shop_\*\.orders' is a pattern; with \[cdc\]"),
])
def test_errors_name_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        parse(data)


@pytest.mark.parametrize("value, size", [(0, 0), (52428800, 52428800), ("50 MiB", 50 * 2**20), ("2GB", 2 * 10**9),
                                         ("1.5 GiB", int(1.5 * 2**30))])
def test_a_budget_is_bytes_or_a_size_with_its_unit(value, size):
    assert parse({**BASE, "store": {"max_bytes": value}}).store.max_bytes == size


def test_secret_is_read_late_and_masked(monkeypatch, tmp_path):
    cfg = parse(BASE, base=tmp_path)
    monkeypatch.setenv("OW_TEST_PW", "canary-Zx81")
    assert cfg.mysql.password.value() == "canary-Zx81"
    shown = json.dumps(describe(cfg))
    assert "canary-Zx81" not in shown and "env OW_TEST_PW" in shown
    monkeypatch.delenv("OW_TEST_PW")
    with pytest.raises(ConfigError, match="OW_TEST_PW is not set"):
        cfg.mysql.password.value()


def test_a_postgresql_store_is_named_by_url_with_its_password_apart(monkeypatch, tmp_path):
    cfg = parse({**BASE, "store": {"url": "postgresql://ow@db.internal:5432/oncewatch", "password_env": "OW_STORE_PW"}},
                base=tmp_path)
    monkeypatch.setenv("OW_STORE_PW", "canary-Pg42")
    assert cfg.store.target.url == "postgresql://ow@db.internal:5432/oncewatch"
    assert cfg.store.target.password.value() == "canary-Pg42"
    assert "canary-Pg42" not in json.dumps(describe(cfg))
    assert parse(BASE, base=tmp_path).store.target == str(tmp_path / "oncewatch.db")  # a SQLite file by default


def test_relative_paths_are_relative_to_the_config_file(tmp_path):
    (tmp_path / "ow.toml").write_text('[mysql]\nuser = "u"\npassword_file = "pw.txt"\ntables = ["s.t"]\n'
                                      '[store]\npath = "data/ow.db"\n')
    cfg = load(tmp_path / "ow.toml")
    assert cfg.mysql.password.file == str(tmp_path / "pw.txt")
    assert cfg.store.path == str(tmp_path / "data" / "ow.db")


def test_check_config_cli_masks_and_exit_codes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OW_TEST_PW", "canary-Zx81")
    good = tmp_path / "good.toml"
    good.write_text('[mysql]\nuser = "u"\npassword_env = "OW_TEST_PW"\ntables = ["s.t"]\n')
    assert cli.main(["check-config", str(good)]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert json.loads(out)["mysql"]["password"].startswith("********")
    assert "canary-Zx81" not in out
    bad = tmp_path / "bad.toml"
    bad.write_text('[mysql]\nuser = "u"\ntables = "s.t"\n')
    assert cli.main(["check-config", str(bad)]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "mysql.tables: expected a list" in err and "Traceback" not in err
    broken = tmp_path / "broken.toml"
    broken.write_text("[mysql\n")
    assert cli.main(["check-config", str(broken)]) == cli.EXIT_CONFIG
    assert "not valid TOML" in capsys.readouterr().err
    assert cli.main(["check-config", str(tmp_path / "absent.toml")]) == cli.EXIT_CONFIG
    assert "cannot read the config file" in capsys.readouterr().err


def test_in_cdc_mode_the_monitor_needs_no_mysql_login():
    """The change source is the connector's topics: [mysql] only names the watched tables."""
    cfg = parse({"mysql": {"tables": ["shop.orders"]}, **KAFKA, "cdc": {"topic_prefix": "cdc"}})
    assert cfg.mysql.user == "" and cfg.cdc.topic_prefix == "cdc" and cfg.cdc.start_from == "earliest"


GROUP_BASE = {"mysql": {"tables": ["shop.orders"]}, **KAFKA, "cdc": {"topic_prefix": "cdc"},
              "store": {"url": "postgresql://ow@h/db"}}


@pytest.mark.parametrize("changes, message", [
    ({"group": {}}, r"^group\.name: missing"),
    ({"group": {"name": "a b"}}, r"^group\.name: 'a b' names Kafka topics"),
    ({"group": {"name": "g", "shards": 0}}, r"^group\.shards: must be at least 1"),
    ({"group": {"name": "g", "shard": 3}}, r"^group\.shard: unknown key"),
    ({"group": {"name": "g", "replication_factor": 0}}, r"^group\.replication_factor: must be at least 1, got 0"),
    ({"group": {"name": "g", "replication_factor": "3"}}, r"^group\.replication_factor: expected an integer"),
    ({"group": {"name": "g", "purge_seconds": 0.5}}, r"^group\.purge_seconds: "),
    ({"group": {"name": "g"}, "store": {}}, r"^group\.name: the instances of a group share one store"),
    ({"group": {"name": "g"}, "cdc": {"topic_prefix": "cdc", "mode": "check"}, "mysql": with_mysql()["mysql"]},
     r"^group\.name: the instances of a group share the work of a CDC change source"),
])
def test_a_group_needs_a_cdc_source_and_a_shared_store_and_names_the_key(changes, message):
    with pytest.raises(ConfigError, match=message):
        parse({**GROUP_BASE, **changes})


def test_a_group_of_instances_is_configured_by_its_name():
    cfg = parse({**GROUP_BASE, "group": {"name": "shop", "shards": 6}})
    assert (cfg.group.name, cfg.group.shards, cfg.group.member) == ("shop", 6, "")
    # three replicas unless told: acks=all protects nothing on one (the dev stack's configs say 1)
    assert (cfg.group.replication_factor, cfg.group.purge_seconds) == (3, 30.0)
    one = parse({**GROUP_BASE, "group": {"name": "shop", "replication_factor": 1, "purge_seconds": 5}}).group
    assert (one.replication_factor, one.purge_seconds) == (1, 5.0)


def test_the_slo_has_defaults_and_takes_its_keys():
    assert parse(BASE).slo == SloConfig(0.999, 60.0, "", 24.0)
    got = parse({**BASE, "slo": {"objective": 0.9995, "within_seconds": 30, "unit": "¥", "window_hours": 1}}).slo
    assert got == SloConfig(0.9995, 30.0, "¥", 1.0)
