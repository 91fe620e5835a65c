"""What a setup exposes (core.exposure): secret files others may read and listeners off loopback,
warned about by `check-config` and at the monitor's start."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from devservices.shop_monitor import free_port
from oncewatch import cli
from oncewatch.core import exposure
from oncewatch.core.config import parse
from oncewatch.monitor import Monitor, SourceUnavailableError


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_listeners_are_fine(host: str) -> None:
    assert exposure.is_loopback(host) and exposure.listener(host, "/metrics", "fix it") is None


@pytest.mark.parametrize("host, where", [("0.0.0.0", "0.0.0.0"), ("::", "::"), ("10.1.2.3", "10.1.2.3"),
                                         ("", "every interface"), (None, "every interface"),
                                         ("dashboard.example", "dashboard.example")])
def test_other_listeners_are_warned_about(host: str | None, where: str) -> None:
    found = exposure.listener(host, "/metrics", "bind it to 127.0.0.1")
    assert found.event == exposure.LISTENER_NOT_LOOPBACK
    assert found.message == f"/metrics listens on {where}, so other machines can reach it; bind it to 127.0.0.1"
    assert found.facts == {"listener": "/metrics", "host": where}


@pytest.mark.parametrize("mode, warned", [(0o600, False), (0o400, False), (0o640, True), (0o604, True),
                                          (0o620, True), (0o644, True)])
def test_secret_files_open_to_group_or_others(tmp_path: Path, mode: int, warned: bool) -> None:
    secret = tmp_path / "secret"
    secret.write_text("canary-Qq41\n")
    secret.chmod(mode)
    found = exposure.secret_file(secret, "mysql.password_file")
    assert (found is not None) == warned
    if found:
        assert found.message == (f"mysql.password_file {secret} is open to its group or others (mode {mode:o}); "
                                 f"`chmod 600 {secret}` so that only its owner can read it")
        assert "canary-Qq41" not in repr(found)


def test_a_missing_secret_file_is_left_to_its_reader(tmp_path: Path) -> None:
    assert exposure.secret_file(tmp_path / "absent", "mysql.password_file") is None


def config(tmp_path: Path, mysql_port: int = 3306, **metrics: object) -> dict:
    secret = tmp_path / "mysql-password"
    secret.write_text("canary-Qq41\n")
    secret.chmod(0o644)
    return {"mysql": {"user": "oncewatch", "password_file": str(secret), "tables": ["shop.orders"],
                      "port": mysql_port, "connect_timeout_seconds": 1.0},
            "store": {"path": str(tmp_path / "store.db")}, "metrics": metrics}


def test_the_config_s_listener_and_secret_files(tmp_path: Path) -> None:
    found = exposure.of_config(parse(config(tmp_path, host="0.0.0.0"), base=tmp_path))
    assert [(e.event, e.facts.get("host") or e.facts.get("path")) for e in found] == [
        (exposure.LISTENER_NOT_LOOPBACK, "0.0.0.0"), (exposure.SECRET_FILE_OPEN, str(tmp_path / "mysql-password"))]
    assert "[metrics] host = \"127.0.0.1\"" in found[0].message
    assert [e.event for e in exposure.of_config(parse(config(tmp_path, host="0.0.0.0", port=0), base=tmp_path))] == [
        exposure.SECRET_FILE_OPEN], "no /metrics at all: nothing listens"


def test_check_config_prints_the_warnings(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "oncewatch.toml"
    path.write_text('[mysql]\nuser = "u"\npassword_file = "pw"\ntables = ["s.t"]\n[metrics]\nhost = "0.0.0.0"\n')
    (tmp_path / "pw").write_text("canary-Qq41\n")
    (tmp_path / "pw").chmod(0o644)
    assert cli.main(["check-config", str(path)]) == cli.EXIT_OK
    out, err = capsys.readouterr()
    assert '"host": "0.0.0.0"' in out
    assert err.splitlines() == [
        "oncewatch: warning: /metrics listens on 0.0.0.0, so other machines can reach it; set [metrics] host = "
        "\"127.0.0.1\" unless Prometheus scrapes from another machine, and then firewall the port",
        f"oncewatch: warning: mysql.password_file {tmp_path / 'pw'} is open to its group or others (mode 644); "
        f"`chmod 600 {tmp_path / 'pw'}` so that only its owner can read it"]
    assert "canary-Qq41" not in out + err


def test_the_monitor_warns_at_its_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before anything else, so the warning is there even when a source then refuses the monitor."""
    cfg = parse(config(tmp_path, mysql_port=free_port(), host="0.0.0.0", port=free_port()), base=tmp_path)
    with caplog.at_level(logging.WARNING, logger="oncewatch"), pytest.raises(SourceUnavailableError):
        Monitor(cfg).run()
    warned = [(r.levelname, r.event) for r in caplog.records if r.name == "oncewatch.monitor"]
    assert warned == [("WARNING", exposure.LISTENER_NOT_LOOPBACK), ("WARNING", exposure.SECRET_FILE_OPEN)]
    assert "canary-Qq41" not in caplog.text
