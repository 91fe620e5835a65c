"""The monitor reading MariaDB over TLS (issue 46): the binlog stream and the SELECTs of its preflight and
bootstrap through the stack's TLS (devservices.tls), as an account that requires a client certificate
(REQUIRE X509). The short run of recorded_run.short_run read this way gives the plaintext findings; without the
certificate, with a CA that did not sign the server's, or checking the server's name against 127.0.0.1 (its
certificate names localhost only), `oncewatch run` exits 3 naming the key."""

from __future__ import annotations

import pytest

from devservices import tls
from devservices.shop_monitor import findings, run_until_idle

from .recorded_run import assert_same, copied, refused, short_run
from .shop_monitor import IDLE

X509 = {"user": tls.X509_USER, "ssl_ca": str(tls.FILES.ca), "ssl_cert": str(tls.FILES.client_cert),
        "ssl_key": str(tls.FILES.client_key)}
SYSTEM_CAS = "/etc/ssl/certs/ca-certificates.crt"  # a real CA bundle that did not sign the stack's certificates


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return short_run(tmp_path_factory.mktemp("mysql_tls"))


def test_an_account_requiring_x509_over_tls_gives_the_plaintext_findings(recorded, tmp_path) -> None:
    start, topic, plaintext = recorded
    assert plaintext, "the run has faults: the baseline must find some"
    config = copied(start, topic, tmp_path / "tls", mysql=X509)
    run_until_idle(config, idle=IDLE)
    assert_same(findings(config), plaintext)


MISCONFIGURED = [
    ("no client certificate", {**X509, "ssl_cert": None, "ssl_key": None}, "mysql.ssl_cert", "Access denied"),
    ("unknown CA", {**X509, "ssl_ca": SYSTEM_CAS}, "mysql.ssl_ca", "certificate verify failed"),
    ("wrong host name", {**X509, "ssl_verify_identity": True}, "mysql.ssl_verify_identity",
     "IP address mismatch"),
]


@pytest.mark.parametrize("case, mysql, key, reason", MISCONFIGURED, ids=[m[0] for m in MISCONFIGURED])
def test_a_misconfigured_tls_exits_3_naming_the_key(recorded, tmp_path, case, mysql, key, reason) -> None:
    start, topic, _ = recorded
    result = refused(copied(start, topic, tmp_path / "wrong", mysql=mysql))
    said = result.stdout + result.stderr
    assert key in said and reason in said, said[-3000:]
