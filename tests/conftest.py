"""The store every store test runs on: a SQLite file, and (an integration test: it needs the dev
stack's server) a PostgreSQL schema of its own, dropped afterwards (issue 18: both stores pass one suite)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from oncewatch.core.config import PostgresTarget
from oncewatch.core.sections import Secret

StoreTarget = str | PostgresTarget
SQLITE, POSTGRESQL = "sqlite", "postgresql"
BOTH = [SQLITE, pytest.param(POSTGRESQL, marks=pytest.mark.integration)]


@contextmanager
def postgres_schema() -> Iterator[PostgresTarget]:
    """A new, empty schema in the dev stack's store database, as a store target; dropped at the end."""
    import psycopg

    from devservices import postgres
    from devservices.stack import secret_file

    name = f"t_{uuid.uuid4().hex[:12]}"
    password = secret_file(postgres.STORE_PASSWORD_FILE)
    with psycopg.connect(postgres.url(), password=password, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield PostgresTarget(f"{postgres.url()}?options=-csearch_path%3D{name}",
                             Secret(file=str(postgres.STORE_PASSWORD_FILE)))
    finally:
        with psycopg.connect(postgres.url(), password=password, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(f"DROP SCHEMA {name} CASCADE")


@pytest.fixture(params=BOTH)
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreTarget]:
    """Where a test's store is: `Store(store_target)`, `open_monitor(store_target)`, a config's [store]."""
    if request.param == SQLITE:
        yield str(tmp_path / "s.db")
        return
    with postgres_schema() as target:
        yield target


def store_keys(target: StoreTarget) -> str:
    """The lines of a config's [store] table that name `target`."""
    if isinstance(target, PostgresTarget):
        return f'url = "{target.url}"\npassword_file = "{target.password.file}"\n'
    return f'path = "{target}"\n'


def store_section(target: StoreTarget) -> str:
    """The [store] table of a config file that names `target`."""
    return "[store]\n" + store_keys(target)


def name_store(monkeypatch: pytest.MonkeyPatch, target: StoreTarget) -> None:
    """ONCEWATCH_STORE set to `target`: a PostgreSQL URL's password then comes, as libpq takes it, from PGPASSWORD."""
    from oncewatch.dashboards import views

    monkeypatch.setenv(views.ENV_STORE, str(target))
    if isinstance(target, PostgresTarget):
        monkeypatch.setenv("PGPASSWORD", target.password.value())
