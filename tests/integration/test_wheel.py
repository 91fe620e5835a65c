"""The wheel works outside the checkout: built, installed into a fresh venv in a temporary folder,
then `oncewatch check-config`, `alerts`, `grafana` and `dashboard` run from there.

The venv sees nothing of the source tree: the test runs the installed console script with the
temporary folder as working directory, and checks that the package imported is the installed one
and that no generic top-level name (checks, store, ...) was installed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from devservices import scenario
from devservices.shop_monitor import free_port

ROOT = Path(__file__).resolve().parents[2]
GENERIC = ("checks", "collectors", "dashboards", "store", "core", "shop", "devservices")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin folder of a fresh venv with the built wheel installed (not editable)."""
    work = tmp_path_factory.mktemp("wheel")
    # From a copy of the tree (symlinks kept): setuptools builds through build/ in the source folder,
    # and a build/ left there by an earlier run would ship files the tree no longer has.
    source = work / "src"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".devstack*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis",
        "*.jar"))  # the dev services' jars are no part of the package
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(work / "dist"), str(source)],
                   check=True, capture_output=True, timeout=600)
    wheel, = (work / "dist").glob("oncewatch-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # uv (the checkout's, make venv installs it): what pip installs, from the cache make venv filled, in a sixth
    # of pip's time
    subprocess.run([str(Path(sys.executable).parent / "uv"), "pip", "install", "-q", "--python",
                    str(venv / "bin" / "python"), str(wheel)], check=True, capture_output=True, timeout=900)
    return venv / "bin"


def run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(bin_dir / "oncewatch"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def config_for(folder: Path, store: Path) -> Path:
    secret = folder / "password"
    secret.write_text("not-used\n")
    config = folder / "oncewatch.toml"
    config.write_text(f'[mysql]\nuser = "oncewatch"\npassword_file = "{secret}"\ntables = ["shop.orders"]\n\n'
                      f'[store]\npath = "{store}"\n')
    return config


def test_only_the_oncewatch_package_is_installed(installed: Path) -> None:
    site = next((installed.parent / "lib").glob("python3*/site-packages"))
    assert (site / "oncewatch" / "checks" / "engine.py").is_file()
    assert (site / "oncewatch" / "dashboards" / "app.py").is_file()
    assert not [name for name in GENERIC if (site / name).exists()]
    where = subprocess.run([str(installed / "python"), "-c", "import oncewatch; print(oncewatch.__file__)"],
                           cwd=installed.parent, capture_output=True, text=True, check=True).stdout
    assert Path(where.strip()).is_relative_to(site)


def test_check_config_alerts_and_grafana_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    config = config_for(tmp_path, tmp_path / "store.db")
    checked = run(installed, "check-config", str(config), cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["mysql"]["tables"] == ["shop.orders"]
    alerts = run(installed, "alerts", cwd=tmp_path)
    assert alerts.returncode == 0 and "alert: OncewatchReaderFailed" in alerts.stdout
    out = tmp_path / "board.json"
    grafana = run(installed, "grafana", "--out", str(out), cwd=tmp_path)
    assert grafana.returncode == 0, grafana.stderr
    assert json.loads(out.read_text())["templating"]["list"][0]["name"] == "datasource"


def test_dashboard_from_the_wheel_answers_its_health_check(installed: Path, tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    scenario.seed(str(store)).close()
    config = config_for(tmp_path, store)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.Popen([str(installed / "oncewatch"), "dashboard", "--config", str(config), "--port", str(port)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = proc.stdout.readline()  # printed once the health check answers, before anything else
        if first.strip() != f"oncewatch dashboard on http://127.0.0.1:{port}":
            proc.terminate()  # read() waits for the end of the output: end the server first
            pytest.fail(first + proc.stdout.read())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=10) as resp:
            assert resp.status == 200 and resp.read() == b"ok"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_dashboard_without_a_store_says_so(installed: Path, tmp_path: Path) -> None:
    config = config_for(tmp_path, tmp_path / "none.db")
    result = run(installed, "dashboard", "--config", str(config), "--port", str(free_port()), cwd=tmp_path)
    assert result.returncode == 2 and "there is no store at" in result.stderr
