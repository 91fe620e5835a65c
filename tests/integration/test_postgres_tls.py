"""The PostgreSQL store over TLS with `sslmode = "verify-full"` (issue 46): the dev server has ssl on with the
stack's certificates (devservices.postgres, devservices.tls), which name `localhost` only. A monitor whose store is
reached that way finds what the plaintext monitor of the same short run found; dialling 127.0.0.1 with
verify-full, the name the certificate lacks, is refused (exit 2, a store error) with a message naming the keys."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w

from devservices import base, postgres, tls
from devservices.shop_monitor import findings, oncewatch, run_until_idle, shop_config
from oncewatch.core.config import PostgresTarget

from .recorded_run import RULES, assert_same, short_run
from .shop_monitor import IDLE

VERIFY_FULL = {"sslmode": "verify-full", "sslrootcert": str(tls.FILES.ca)}


@pytest.fixture(scope="module")
def schema() -> Iterator[PostgresTarget]:
    with postgres.new_schema() as target:
        yield target


def config(folder: Path, topic: str, target: PostgresTarget, host: str = tls.SERVER_NAME) -> Path:
    """A monitor of the short run with its store in `target`'s schema, reached at `host` over verify-full TLS."""
    folder.mkdir(exist_ok=True)
    path = shop_config(folder, topic=topic, rules=RULES, postgres=target)
    data = tomllib.loads(path.read_text())
    data["store"].update(url=target.url.replace(f"@{base.HOST}:", f"@{host}:"), **VERIFY_FULL)
    path.write_text(tomli_w.dumps(data))
    return path


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, schema):
    base = tmp_path_factory.mktemp("postgres_tls")
    start, topic, plaintext = short_run(base, first=lambda topic: config(base / "tls", topic, schema))
    return base, topic, plaintext


def test_a_store_over_verify_full_tls_gives_the_plaintext_findings(recorded, schema) -> None:
    base, topic, plaintext = recorded
    assert plaintext, "the run has faults: the baseline must find some"
    secured = config(base / "tls", topic, schema)
    run_until_idle(secured, idle=IDLE)
    assert_same(findings(secured), plaintext)


def test_verify_full_refuses_a_host_the_certificate_does_not_name(recorded, schema, tmp_path) -> None:
    _, topic, _ = recorded
    result = oncewatch("findings", "--config", str(config(tmp_path / "wrong", topic, schema, host=base.HOST)),
                       check=False)
    said = result.stdout + result.stderr
    assert result.returncode == 2, said  # a store the command cannot use, as every store error
    assert 'does not match host name "127.0.0.1"' in said and "store.sslmode" in said, said[-3000:]
