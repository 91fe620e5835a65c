"""Exports and findings of one shop run, by an older oncewatch and by this one, compared byte for byte (issue 47).

A change to how the store keeps its records must not change a report. This records one run of the simulated
shop with every fault, then has each version judge it from the same starting store (made by the older
version, which this one then brings up to its own layout) with the same config file, and compares:
`oncewatch findings`, and `oncewatch export` as CSV, JSON and XLSX. A report's header says when it was made
(generated_at, and the digests over it: fields_sha256's entry, report_sha256); everything else must be equal,
the data section byte for byte. No consumer group is polled: F11 and F12 judge the groups' lag as it is when
the monitor runs, which no two runs see alike. `--same` runs this version twice instead: the floor, what two runs of one
version give.

    .venv/bin/python bench/export_identity.py --older /path/to/an/older/checkout [--orders 400]

The older checkout needs its own .venv (`make venv` there); both read the dev services of this checkout.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devservices.shop_monitor import new_topic, shop_config, shop_settings  # noqa: E402
from oncewatch import shop  # noqa: E402

HERE = Path(__file__).resolve().parent.parent
MADE_AT = ("generated_at", "report_sha256")  # the header fields that say when a report was made


def oncewatch(checkout: Path, *args: str) -> bytes:
    """`oncewatch ARGS` of the checkout (its own .venv), run from inside it; its output."""
    done = subprocess.run([str(checkout / ".venv/bin/python"), "-m", "oncewatch.cli", *args], cwd=checkout,
                          capture_output=True, timeout=600, env={**os.environ, "PYTHONPATH": str(checkout)})
    if done.returncode:
        raise SystemExit(f"{checkout}: oncewatch {' '.join(args)} exited {done.returncode}: {done.stderr.decode()}")
    return done.stdout


def judged(checkout: Path, config: Path, start: Path, out: Path) -> dict[str, bytes]:
    """The findings and reports of the checkout's monitor over the recorded run, from the starting store."""
    store = config.parent / "store.db"
    for old in config.parent.glob("store.db*"):
        old.unlink()
    shutil.copy(start, store)
    oncewatch(checkout, "run", "--config", str(config), "--until-idle", "3")
    got = {"findings": oncewatch(checkout, "findings", "--config", str(config))}
    for fmt in ("csv", "json", "xlsx"):
        path = out / f"report.{fmt}"
        oncewatch(checkout, "export", "--config", str(config), "--format", fmt, "--out", str(path), "--force",
                  "--since", "2000-01-01T00:00:00Z", "--until", "2100-01-01T00:00:00Z")
        got[fmt] = path.read_bytes()
    return got


def without_made_at(name: str, data: bytes) -> object:
    """What must be equal of an output: all of it but when a report was made."""
    if name == "json":
        doc = json.loads(data)
        header = {k: v for k, v in doc["header"].items() if k not in MADE_AT}
        header["fields_sha256"] = {k: v for k, v in header.get("fields_sha256", {}).items() if k not in MADE_AT}
        return {**doc, "header": header}
    if name == "csv":
        return [line for line in data.decode().splitlines()
                if not line.startswith(tuple(f"# {f}:" for f in (*MADE_AT, "fields_sha256")))]
    if name == "xlsx":
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            # the sheets' cells; the Report sheet's made-at rows differ, every other sheet must not
            return {n: z.read(n) for n in z.namelist() if n.startswith("xl/worksheets/") and "sheet1" not in n}
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--older", type=Path, help="an older checkout with its own .venv")
    ap.add_argument("--same", action="store_true", help="this version twice (the floor)")
    ap.add_argument("--orders", type=int, default=400)
    args = ap.parse_args()
    first = HERE if args.same else args.older
    if first is None:
        raise SystemExit("give --older CHECKOUT or --same")
    work = Path(tempfile.mkdtemp(prefix="oncewatch-identity-"))
    topic = new_topic()
    shop.run(shop_settings(topic, orders=0, reset=True))
    folder = work / "monitor"
    folder.mkdir()
    # no consumer groups polled: F11 and F12 read their lag as it is when the monitor runs, which no two runs see alike
    config = shop_config(folder, topic=topic, consumer_groups=[])
    oncewatch(first, "run", "--config", str(config), "--until-idle", "1")  # the first checkpoint, before the run
    start = work / "start.db"
    shutil.copy(folder / "store.db", start)  # the monitor stopped cleanly: its WAL is in the file
    shop.run(shop_settings(topic, seed=21, orders=args.orders, rate=100, faults="all"))
    print(f"recorded {args.orders} orders with every fault on topic {topic}")
    outputs = {}
    for name, checkout in (("first", first), ("second", HERE)):
        out = work / name
        out.mkdir()
        outputs[name] = judged(checkout, config, start, out)
    same = True
    for what in outputs["first"]:
        a, b = outputs["first"][what], outputs["second"][what]
        equal = without_made_at(what, a) == without_made_at(what, b)
        same &= equal
        verdict = "identical" if a == b else "equal but for when it was made" if equal else "DIFFERENT"
        print(f"{what:8} {len(a):9,} B and {len(b):9,} B: {verdict}")
    print(f"work dir: {work}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
