"""The layers of the pipeline (pyproject.toml [tool.importlinter]) hold, and a wrong import breaks them.

lint-imports runs on the tree as it is, then on copies of it with one deliberate wrong import
each: the leaf importing the store, a rule importing sqlite3, a box imported by its folder name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"


def lint(package_parent: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run([str(LINT), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=package_parent,
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_every_contract() -> None:
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("core/leak.py", "from oncewatch.store import Store\n", "The pipeline's layers"),
    ("checks/leak.py", "import sqlite3\n", "checks are pure"),
    ("dashboards/leak.py", "from oncewatch.checks.engine import Engine\n", "surfaces only read the store"),
    ("collectors/leak.py", "from oncewatch.store import Store\n", "The pipeline's layers"),
    ("monitor/leak.py", "from checks.engine import Engine\n", "one import root"),
])
def test_a_wrong_import_breaks_its_contract(tmp_path: Path, module: str, line: str, contract: str) -> None:
    copy = tmp_path / "oncewatch"
    shutil.copytree(ROOT / "oncewatch", copy, ignore=shutil.ignore_patterns("__pycache__"))  # symlinks followed
    (copy / module).write_text(line)
    result = lint(tmp_path)
    assert result.returncode != 0, result.stdout
    broken = result.stdout.split("Broken contracts", 1)[1]
    assert contract in broken and f"oncewatch.{module[:-3].replace('/', '.')}" in broken
