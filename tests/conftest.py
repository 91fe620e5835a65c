"""The store every store test runs on: a SQLite file, and (an integration test: it needs the dev
stack's server) a PostgreSQL schema of its own, dropped afterwards (issue 18: both stores pass one suite)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devservices.postgres import new_schema
from oncewatch.core.config import PostgresTarget

StoreTarget = str | PostgresTarget
SQLITE, POSTGRESQL = "sqlite", "postgresql"
BOTH = [SQLITE, pytest.param(POSTGRESQL, marks=pytest.mark.integration)]
# For a test whose store is only the stage it plays on (a login, a page's wording): SQLite alone.
SQLITE_ONLY = pytest.mark.parametrize("store_target", [SQLITE], indirect=True)
# For what only PostgreSQL can do: writers in transactions at once.
POSTGRES_ONLY = pytest.mark.parametrize("store_target", [BOTH[1]], indirect=True)


@pytest.fixture(params=BOTH)
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreTarget]:
    """Where a test's store is: `Store(store_target)`, `open_monitor(store_target)`, a config's [store]."""
    if request.param == SQLITE:
        yield str(tmp_path / "s.db")
        return
    with new_schema() as target:
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
