"""deploy/oncewatch.service (README "Running it in production") as systemd reads it: `systemd-analyze verify` finds
nothing to say about it, and `systemd-analyze security` rates its hardening well. systemd-analyze comes with
Debian's systemd package, which the dev stack installs (devservices.base DEBIAN_PACKAGES)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from devservices.shop_monitor import ROOT

UNIT = ROOT / "deploy" / "oncewatch.service"
INSTALLED = "/opt/oncewatch/bin/oncewatch"  # where the unit expects the wheel's entry point
# systemd's exposure scale: 0 (locked down) to 100 (no hardening at all); `systemd-analyze security` prints it /10.
EXPOSURE_AT_MOST = 20


def analyze(*args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze is missing: run `make services` (python -m devservices.stack up) to install it"
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60, cwd="/")


def here(tmp_path: Path) -> Path:
    """The unit with this checkout's own `oncewatch` in ExecStart (verify checks that the command exists)."""
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED} run --config /etc/oncewatch/oncewatch.toml" in text
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace(INSTALLED, str(Path(sys.executable).with_name("oncewatch"))))
    return unit


def test_systemd_verifies_the_unit_without_a_word(tmp_path: Path) -> None:
    result = analyze("verify", str(here(tmp_path)))
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_the_unit_runs_unprivileged_and_hardened(tmp_path: Path) -> None:
    text = UNIT.read_text()
    assert "User=oncewatch" in text and "NoNewPrivileges=yes" in text
    result = analyze("security", "--offline=yes", f"--threshold={EXPOSURE_AT_MOST}", str(here(tmp_path)))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
