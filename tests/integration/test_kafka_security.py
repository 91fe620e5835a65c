"""The monitor through the dev stack's secured Kafka listeners (devservices.tls), issue 46.

One short shop run (every fault on) is read by three monitors from the same starting store: over PLAINTEXT (the
baseline), over SASL_SSL with SCRAM-SHA-512, and over mutual TLS; the secured ones find exactly what the plaintext
one found. Then five misconfigurations each end `oncewatch run` with exit 3 and a message naming the key to fix
and the broker's (or the TLS layer's) reason, with no secret in what it prints.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devservices import base, tls
from devservices.shop_monitor import findings, run_until_idle

from .recorded_run import assert_same, copied, refused, short_run
from .shop_monitor import IDLE

SASL_SSL = {"bootstrap_servers": [f"{tls.SERVER_NAME}:{tls.KAFKA_SASL_SSL_PORT}"], "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": tls.SCRAM_USER,
            "sasl_password_file": str(tls.SCRAM_PASSWORD_FILE), "ssl_cafile": str(tls.FILES.ca)}
MUTUAL_TLS = {"bootstrap_servers": [f"{tls.SERVER_NAME}:{tls.KAFKA_SSL_PORT}"], "security_protocol": "SSL",
              "ssl_cafile": str(tls.FILES.ca), "ssl_certfile": str(tls.FILES.client_cert),
              "ssl_keyfile": str(tls.FILES.client_key)}
SYSTEM_CAS = "/etc/ssl/certs/ca-certificates.crt"  # a real CA bundle that did not sign the stack's certificates
WRONG_PASSWORD = "canary-wrong-scram-5Jx"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return short_run(tmp_path_factory.mktemp("kafka_security"))


def oauthbearer(folder: Path, lifetime_seconds: float) -> dict[str, object]:
    """[kafka] keys for OAUTHBEARER over SASL_SSL, its token in a file in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    token = folder / "kafka.token"
    token.write_text(tls.unsecured_token(lifetime_seconds) + "\n")
    return {"bootstrap_servers": SASL_SSL["bootstrap_servers"], "security_protocol": "SASL_SSL",
            "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_file": str(token), "ssl_cafile": str(tls.FILES.ca)}


@pytest.mark.parametrize("name", ["SASL_SSL SCRAM-SHA-512", "mutual TLS", "SASL_SSL OAUTHBEARER"])
def test_the_secured_listener_gives_the_plaintext_findings(recorded, tmp_path, name) -> None:
    start, topic, plaintext = recorded
    assert plaintext, "the run has faults: the baseline must find some"
    kafka = {"SASL_SSL SCRAM-SHA-512": SASL_SSL, "mutual TLS": MUTUAL_TLS}.get(name) or oauthbearer(tmp_path, 3600)
    config = copied(start, topic, tmp_path / "secured", **kafka)
    run_until_idle(config, idle=IDLE)
    assert_same(findings(config), plaintext)


MISCONFIGURED = [
    # kafka-python often loses the broker's own words ("Authentication failed during authentication due to invalid
    # credentials with SASL mechanism SCRAM-SHA-512") with the close that follows them: collectors.kafka_client
    ("wrong SCRAM password", {**SASL_SSL, "sasl_password_env": "OW_KAFKA_PW", "sasl_password_file": None},
     "kafka.sasl_password_env / kafka.sasl_password_file", "SCRAM-SHA-512"),
    ("unknown CA", {**SASL_SSL, "ssl_cafile": SYSTEM_CAS}, "kafka.ssl_cafile",
     "certificate verify failed: self-signed certificate in certificate chain"),
    ("wrong host name", {**SASL_SSL, "bootstrap_servers": [f"{base.HOST}:{tls.KAFKA_SASL_SSL_PORT}"]},
     "kafka.ssl_check_hostname", "IP address mismatch"),
    ("plaintext against SASL_SSL", {"bootstrap_servers": SASL_SSL["bootstrap_servers"]}, "kafka.security_protocol",
     ""),
    ("no client certificate", {**MUTUAL_TLS, "ssl_certfile": None, "ssl_keyfile": None}, "kafka.ssl_certfile",
     "alert bad certificate"),
]


def test_an_expired_oauthbearer_token_exits_3_naming_the_token_file(recorded, tmp_path) -> None:
    start, topic, _ = recorded
    said = refused(copied(start, topic, tmp_path / "wrong", request_timeout_seconds=3.0,
                          **oauthbearer(tmp_path, -60))).stderr
    assert "kafka.sasl_oauth_token_file" in said.splitlines()[-1], said[-3000:]


@pytest.mark.parametrize("case, kafka, key, reason", MISCONFIGURED, ids=[m[0] for m in MISCONFIGURED])
def test_a_misconfigured_client_exits_3_naming_the_key(recorded, tmp_path, case, kafka, key, reason) -> None:
    start, topic, _ = recorded
    config = copied(start, topic, tmp_path / "wrong", request_timeout_seconds=3.0, **kafka)
    result = refused(config, {"OW_KAFKA_PW": WRONG_PASSWORD})
    said = result.stdout + result.stderr
    assert key in said and reason in said, said[-3000:]
    assert said.splitlines()[-1].startswith("oncewatch: cannot reach Kafka"), said[-3000:]
    assert WRONG_PASSWORD not in said and tls.scram_password() not in said
