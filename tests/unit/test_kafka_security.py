"""`[kafka]`'s security keys (core.kafka_security) and the client settings made of them (collectors.kafka_client):
each mistake named by its key, the secrets read late and never printed, OAUTHBEARER's token file read again when
it changes. The brokers themselves are tests/integration/test_kafka_security.py's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from oncewatch import cli
from oncewatch.collectors.kafka_client import TokenFile, connection
from oncewatch.core.config import ConfigError, parse

MYSQL = {"mysql": {"user": "oncewatch", "password_env": "OW_TEST_PW", "tables": ["shop.orders"]}}
TOPICS = {"bootstrap_servers": ["localhost:9093"], "topics": [{"name": "events", "format": "json", "required": []}]}
CANARY = "canary-sasl-Kq27"


@pytest.fixture
def files(tmp_path: Path) -> Path:
    for name in ("ca.pem", "client.pem", "client.key", "token"):
        (tmp_path / name).write_text(f"{name}\n")
    (tmp_path / "sasl_pw").write_text(CANARY + "\n")
    return tmp_path


def kafka(files: Path, **keys: object) -> dict:
    return parse({**MYSQL, "kafka": {**TOPICS, **keys}}, base=files)


SCRAM = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "ow",
         "sasl_password_file": "sasl_pw", "ssl_cafile": "ca.pem"}


@pytest.mark.parametrize("keys, message", [
    ({"security_protocol": "TLS"}, r"^kafka\.security_protocol: must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, "
                                   r"SASL_SSL, got 'TLS'"),
    ({"security_protocol": "SASL_SSL"}, r"^kafka\.sasl_mechanism: missing \(required\)"),
    ({**SCRAM, "sasl_mechanism": "GSSAPI"}, r"^kafka\.sasl_mechanism: must be one of PLAIN, SCRAM-SHA-256"),
    ({**SCRAM, "sasl_username": None}, r"^kafka\.sasl_username: missing \(required for SCRAM-SHA-512\)"),
    ({**SCRAM, "sasl_password_file": None}, r"^kafka\.sasl_password_env: missing: give sasl_password_env or"),
    ({**SCRAM, "sasl_password": "hunter2"}, r"^kafka\.sasl_password: secrets are not read from the config file"),
    ({**SCRAM, "ssl_cafile": "nope.pem"}, r"^kafka\.ssl_cafile: no such file '.*nope\.pem'"),
    ({**SCRAM, "sasl_mechanism": "OAUTHBEARER"}, r"^kafka\.sasl_oauth_token_file: missing \(required for "
                                                 r"OAUTHBEARER"),
    ({**SCRAM, "sasl_oauth_token_file": "token"}, r"^kafka\.sasl_oauth_token_file: only for sasl_mechanism "
                                                  r"OAUTHBEARER"),
    ({"sasl_mechanism": "PLAIN"}, r"^kafka\.sasl_mechanism: only for security_protocol SASL_PLAINTEXT or "
                                  r"SASL_SSL, and it is PLAINTEXT"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": "ow",
      "sasl_password_env": "X", "ssl_cafile": "ca.pem"}, r"^kafka\.ssl_cafile: only for security_protocol SSL or "
                                                          r"SASL_SSL, and it is SASL_PLAINTEXT"),
    ({"security_protocol": "SSL", "ssl_keyfile": "client.key"}, r"^kafka\.ssl_certfile: missing: ssl_keyfile is"),
    ({"security_protocol": "SSL", "ssl_key_password_env": "K"}, r"^kafka\.ssl_key_password_env: there is no "),
    ({"security_protocol": "SSL", "ssl_check_hostname": "no"}, r"^kafka\.ssl_check_hostname: expected true or "
                                                               r"false, got 'no'"),
])
def test_errors_name_the_key(files: Path, keys: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        kafka(files, **{k: v for k, v in keys.items() if v is not None})


def test_plaintext_by_default(files: Path) -> None:
    assert connection(kafka(files).kafka) == {"bootstrap_servers": ["localhost:9093"],
                                              "security_protocol": "PLAINTEXT"}


def test_scram_over_tls_settings_with_the_password_read_when_the_client_is_made(files: Path) -> None:
    cfg = kafka(files, **SCRAM).kafka
    (files / "sasl_pw").write_text("renewed\n")
    assert connection(cfg) == {
        "bootstrap_servers": ["localhost:9093"], "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "ow", "sasl_plain_password": "renewed", "ssl_cafile": str(files / "ca.pem"),
        "ssl_certfile": None, "ssl_keyfile": None, "ssl_password": None, "ssl_check_hostname": True}


def test_mutual_tls_with_a_key_password_from_the_environment(files: Path, monkeypatch) -> None:
    monkeypatch.setenv("OW_KEY_PW", "k3y")
    cfg = kafka(files, security_protocol="SSL", ssl_cafile="ca.pem", ssl_certfile="client.pem",
                ssl_keyfile="client.key", ssl_key_password_env="OW_KEY_PW", ssl_check_hostname=False).kafka
    settings = connection(cfg)
    assert (settings["ssl_certfile"], settings["ssl_keyfile"], settings["ssl_password"],
            settings["ssl_check_hostname"]) == (str(files / "client.pem"), str(files / "client.key"), "k3y", False)
    monkeypatch.delenv("OW_KEY_PW")
    with pytest.raises(ConfigError, match=r"OW_KEY_PW is not set \(named by kafka\.ssl_key_password_env\)"):
        connection(cfg)


def test_oauthbearer_token_file_is_read_again_when_it_changes(files: Path) -> None:
    cfg = kafka(files, security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", sasl_oauth_token_file="token").kafka
    provider = connection(cfg)["sasl_oauth_token_provider"]
    assert isinstance(provider, TokenFile) and provider.token() == "token"
    (files / "token").write_text("renewed-token-longer\n")
    assert provider.token() == "renewed-token-longer"
    stat = (files / "token").stat()
    (files / "token").write_text("same-size-token-here\n")  # same size: the new mtime tells
    os.utime(files / "token", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert provider.token() == "same-size-token-here"


def test_check_config_prints_where_the_secrets_are_never_them(files: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("OW_TEST_PW", "mysql-canary")
    config = files / "c.toml"
    config.write_text('[mysql]\nuser = "u"\npassword_env = "OW_TEST_PW"\ntables = ["s.t"]\n'
                      '[kafka]\nbootstrap_servers = ["localhost:9093"]\nsecurity_protocol = "SASL_SSL"\n'
                      'sasl_mechanism = "SCRAM-SHA-512"\nsasl_username = "ow"\nsasl_password_file = "sasl_pw"\n'
                      'ssl_cafile = "ca.pem"\n[[kafka.topics]]\nname = "events"\nrequired = []\n')
    assert cli.main(["check-config", "--config", str(config)]) == cli.EXIT_OK
    out = capsys.readouterr().out
    security = json.loads(out)["kafka"]["security"]
    assert security["sasl_password"] == f"******** (from file {files / 'sasl_pw'})"
    assert CANARY not in out and "mysql-canary" not in out
