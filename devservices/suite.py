"""`make test`'s suite: two pytest sessions side by side, the integration tests and the unit tests.

The integration tests share the dev services, and some restart them, so they run one after another in
one session (tests/integration/conftest.py orders them and starts the demo beside the first ones).
The unit tests need no server: they run meanwhile in a session of their own on the machine's other
core, instead of first in line (about a minute and a half of every run). Their output is kept in a
file and printed after the integration session's, so the two never interleave; the suite fails if
either session does. Arguments are passed to both sessions (`python -m devservices.suite -x`).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    with tempfile.TemporaryDirectory(prefix="oncewatch-unit-") as tmp:
        output = Path(tmp) / "unit.out"
        with open(output, "wb") as out:
            # A basetemp of its own: the two sessions never clean up each other's tmp_path folders.
            unit = subprocess.Popen([sys.executable, "-m", "pytest", "-m", "not integration", "-p", "no:cacheprovider",
                                     "--basetemp", str(Path(tmp) / "basetemp"), *args],
                                    stdout=out, stderr=subprocess.STDOUT)
            try:
                integration = subprocess.call([sys.executable, "-m", "pytest", "-m", "integration", *args])
            finally:
                unit_code = unit.wait()
        print("\n==== the unit tests (run beside the integration tests) ====", flush=True)
        sys.stdout.write(output.read_text(errors="replace"))
    print(f"\nsuite: integration tests exit {integration}, unit tests exit {unit_code}", flush=True)
    return integration or unit_code


if __name__ == "__main__":
    sys.exit(main())
