"""`oncewatch run` on a bad setup: one specific line naming the problem, the documented exit code, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devservices import base, mariadb

from .conftest import write_config_file


def run_cli(config_text: str, tmp_path, env_pw: str | None = None) -> subprocess.CompletedProcess:
    path = write_config_file(config_text, tmp_path)
    env = {"PATH": "/usr/bin:/bin", "OW_PW": env_pw} if env_pw is not None else {"PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "oncewatch.cli", "run", "--config", str(path), "--until-idle", "1"],
                          capture_output=True, text=True, timeout=60, env=env)


def mysql_section(tmp_path, *, port=base.MARIADB_PORT, password=f'password_file = "{mariadb.MONITOR_PASSWORD_FILE}"',
                  tables='["owtest.does_not_exist_xyz"]') -> str:
    return f"""
[mysql]
host = "127.0.0.1"
port = {port}
user = "oncewatch"
{password}
tables = {tables}
connect_timeout_seconds = 2

[store]
path = "{tmp_path / 'store.db'}"
"""


@pytest.mark.parametrize("case, code, message", [
    ("unknown table", 2, "mysql.tables: owtest.does_not_exist_xyz does not exist or user 'oncewatch' may not SELECT"),
    ("unreachable host", 3, "cannot reach MySQL at 127.0.0.1:1"),
    ("wrong password", 3, "refused user 'oncewatch' (wrong password or no such account)"),
    ("missing key", 2, "mysql.user: missing (required)"),
    ("wrong type", 2, "mysql.port: expected an integer, got '13306'"),
    ("unset secret", 2, "environment variable OW_PW is not set"),
])
def test_startup_error(case, code, message, tmp_path):
    env_pw = None
    if case == "unknown table":
        text = mysql_section(tmp_path)
    elif case == "unreachable host":
        text = mysql_section(tmp_path, port=1)
    elif case == "wrong password":
        text, env_pw = mysql_section(tmp_path, password='password_env = "OW_PW"'), "canary-wrong-Q7"
    elif case == "missing key":
        text = mysql_section(tmp_path).replace('user = "oncewatch"\n', "")
    elif case == "wrong type":
        text = mysql_section(tmp_path, port='"13306"')
    else:
        text = mysql_section(tmp_path, password='password_env = "OW_PW"')
    result = run_cli(text, tmp_path, env_pw)
    assert result.returncode == code, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "canary-wrong-Q7" not in result.stderr + result.stdout
