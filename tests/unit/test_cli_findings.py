"""`oncewatch findings` and `oncewatch export`: the files agree with `findings --format json`; errors exit 2."""

from __future__ import annotations

import base64
import csv
import io
import itertools
import json
import os
from pathlib import Path

import openpyxl
import pytest

from oncewatch.cli import EXIT_CONFIG, EXIT_OK, EXIT_TAMPERED, main
from oncewatch.core.config import DEFAULT_MASK_FIELDS, ConfigError, load
from oncewatch.core.records import QuarantinedRecord
from oncewatch.dashboards import report_check, reports
from oncewatch.store import Store
from tests.conftest import StoreTarget, store_section
from tests.unit.test_reports import BINLOG, seed


def write_config(tmp_path: Path, extra: str = "", store: StoreTarget = "oncewatch.db") -> Path:
    path = tmp_path / "oncewatch.toml"
    path.write_text(f'[mysql]\nuser = "oncewatch"\ntables = ["shop.orders"]\n\n{store_section(store)}{extra}')
    return path


@pytest.fixture
def config(tmp_path: Path, store_target: StoreTarget) -> Path:
    seed(store_target).close()
    return write_config(tmp_path, store=store_target)


@pytest.fixture
def file_config(tmp_path: Path) -> Path:
    """`config` with the store in the file tmp_path/oncewatch.db (what only a SQLite store has)."""
    seed(tmp_path / "oncewatch.db").close()
    return write_config(tmp_path)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def findings_json(capsys, config: Path, *filters: str) -> list[dict]:
    code, out, _ = run(capsys, "findings", "--config", str(config), "--format", "json", *filters)
    assert code == EXIT_OK
    return json.loads(out)


def test_findings_json_and_filters(capsys, config):
    assert [f["id"] for f in findings_json(capsys, config)] == ["f-dup", "f-amount", "f-drift"]
    assert [f["id"] for f in findings_json(capsys, config, "--status", "resolved")] == ["f-amount"]
    assert [f["id"] for f in findings_json(capsys, config, "--rule", "F1", "--status", "open")] == ["f-dup"]
    assert findings_json(capsys, config)[0]["evidence"][0]["values"]["after"]["amount"] == "12.50"


def test_findings_table(capsys, config):
    code, out, _ = run(capsys, "findings", "--config", str(config))
    assert code == EXIT_OK
    assert [line.split()[0] for line in out.splitlines()] == ["id", "f-dup", "f-amount", "f-drift"]


def test_exports_agree_with_findings_json(capsys, config, tmp_path):
    expected = findings_json(capsys, config)
    files = {}
    for fmt in reports.FORMATS:
        files[fmt] = tmp_path / f"report.{fmt}"
        code, _, err = run(capsys, "export", "--config", str(config), "--format", fmt, "--out", str(files[fmt]))
        assert code == EXIT_OK, err
        assert report_check.verify(files[fmt].read_bytes(), fmt)

    doc = json.loads(files["json"].read_text())
    assert [{k: v for k, v in f.items() if k != "rows_sha256"} for f in doc["findings"]] == expected
    assert doc["header"]["binlog_position"] == BINLOG
    assert doc["header"]["config_sha256"] == load(config).content_sha256

    # CSV: one row per evidence item, in order, each carrying its finding's fields.
    lines = [line for line in files["csv"].read_text().splitlines(keepends=True) if not line.startswith("#")]
    table = list(csv.DictReader(io.StringIO("".join(lines), newline="")))
    assert [r["finding_id"] for r in table] == [f["id"] for f in expected for _ in f["evidence"] or [None]]
    for f in expected:
        mine = [r for r in table if r["finding_id"] == f["id"]]
        assert all((r["rule"], r["status"], r["first_seen"], r["resolved_at"] or None, json.loads(r["keys"]))
                   == (f["rule"], f["status"], f["first_seen"], f["resolved_at"], f["keys"]) for r in mine)
        assert [{"kind": r["evidence_kind"], "table": r["evidence_table"] or None, "key": r["evidence_key"] or None,
                 "amount": r["evidence_amount"] or None, "status": r["evidence_status"] or None,
                 "coordinates": r["coordinates"], "time": r["evidence_time"],
                 "values": json.loads(r["values"]), "fields": r["evidence_fields"]}
                for r in mine if r["evidence_kind"]] == f["evidence"]

    wb = openpyxl.load_workbook(files["xlsx"])
    sheet = [dict(zip(reports.FINDING_FIELDS, row)) for row in wb["Findings"].iter_rows(min_row=2, values_only=True)]
    assert [(r["id"], r["status"], r["last_seen"].isoformat(timespec="milliseconds")) for r in sheet] == \
        [(f["id"], f["status"], f["last_seen"][:23]) for f in expected]
    evidence = [row for row in wb["Evidence"].iter_rows(min_row=2, values_only=True)]
    assert [r[0] for r in evidence] == [r["finding_id"] for r in table]


def test_export_time_range(capsys, config, tmp_path):
    out = tmp_path / "may2.json"
    code, _, _ = run(capsys, "export", "--config", str(config), "--format", "json", "--since", "2024-05-02",
                     "--until", "2024-05-04T00:00:00+08:00", "--out", str(out))
    assert code == EXIT_OK
    doc = json.loads(out.read_text())
    assert [f["id"] for f in doc["findings"]] == ["f-drift"]
    assert (doc["header"]["since"], doc["header"]["until"]) == ("2024-05-02T00:00:00.000000Z",
                                                               "2024-05-03T16:00:00.000000Z")


@pytest.mark.parametrize("value", ["yesterday", "2024-13-01", "2024-05-01T25:00"])
def test_export_refuses_a_time_that_is_not_iso(capsys, config, tmp_path, value):
    with pytest.raises(SystemExit) as exit_:
        main(["export", "--config", str(config), "--format", "csv", "--since", value, "--out", str(tmp_path / "x")])
    assert exit_.value.code == EXIT_CONFIG
    assert "not an ISO-8601 date or datetime" in capsys.readouterr().err


def test_export_refuses_an_empty_range(capsys, config, tmp_path):
    code, _, err = run(capsys, "export", "--config", str(config), "--format", "csv", "--since", "2024-05-02",
                       "--until", "2024-05-01", "--out", str(tmp_path / "x.csv"))
    assert code == EXIT_CONFIG and "--since must be earlier than --until" in err
    assert not (tmp_path / "x.csv").exists()


def test_missing_store_is_a_clear_error(capsys, tmp_path):
    config = write_config(tmp_path)
    for argv in (["findings"], ["export", "--format", "csv", "--out", str(tmp_path / "x.csv")]):
        code, _, err = run(capsys, *argv, "--config", str(config))
        assert code == EXIT_CONFIG
        assert f"there is no store at {tmp_path / 'oncewatch.db'}" in err and "oncewatch run" in err
    assert not (tmp_path / "oncewatch.db").exists()  # read-only: nothing created


def test_a_file_that_is_not_a_store_is_a_clear_error(capsys, tmp_path):
    (tmp_path / "oncewatch.db").write_text("not sqlite")
    code, _, err = run(capsys, "findings", "--config", str(write_config(tmp_path)))
    assert code == EXIT_CONFIG and "is not an oncewatch store" in err


def test_export_never_writes_over_the_store_not_even_with_force(capsys, file_config, tmp_path, monkeypatch):
    config = file_config
    store = tmp_path / "oncewatch.db"
    before = store.read_bytes()
    (tmp_path / "link.db").symlink_to(store)
    os.link(store, tmp_path / "hard.db")
    monkeypatch.chdir(tmp_path)
    names = [str(store), "oncewatch.db", "link.db", "hard.db", *(f"{store}{s}" for s in ("-wal", "-shm", ".lock"))]
    for out, force in itertools.product(names, ((), ("--force",))):
        code, _, err = run(capsys, "export", "--config", str(config), "--format", "csv", "--out", out, *force)
        assert code == EXIT_CONFIG, (out, force, err)
        assert f"--out {out} is the store's own file ({store}): an export never writes over the store" in err
    assert store.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard.db", "link.db", "oncewatch.db", "oncewatch.toml"]
    assert [f["id"] for f in findings_json(capsys, config)] == ["f-dup", "f-amount", "f-drift"]


def test_export_writes_over_an_existing_file_only_with_force(capsys, config, tmp_path):
    out = tmp_path / "report.json"
    out.write_text("last month's report")
    argv = ["export", "--config", str(config), "--format", "json", "--out", str(out)]
    code, _, err = run(capsys, *argv)
    assert code == EXIT_CONFIG and f"{out} exists: give another --out path, or add --force to write over it" in err
    assert out.read_text() == "last month's report"
    code, _, err = run(capsys, *argv, "--force")
    assert code == EXIT_OK, err
    assert report_check.verify(out.read_bytes(), "json")


@pytest.mark.parametrize("command", ["alerts", "alert-tests", "grafana"])
def test_shipped_files_write_over_an_existing_file_only_with_force(capsys, tmp_path, command):
    out = tmp_path / "mine.yml"
    out.write_text("my own rules")
    code, _, err = run(capsys, command, "--out", str(out))
    assert code == EXIT_CONFIG and f"{out} exists" in err and out.read_text() == "my own rules"
    code, _, err = run(capsys, command, "--out", str(out), "--force")
    assert code == EXIT_OK and out.read_text() != "my own rules"


def test_export_mask_uses_the_configured_fields_and_key(capsys, tmp_path, monkeypatch):
    seed(tmp_path / "oncewatch.db").close()
    monkeypatch.setenv("OW_TEST_MASK_KEY", "k3y-for-tests")
    config = write_config(tmp_path, '\n[export]\nmask_fields = ["phone"]\nmask_key_env = "OW_TEST_MASK_KEY"\n')
    out = tmp_path / "masked.json"
    code, _, _ = run(capsys, "export", "--config", str(config), "--format", "json", "--mask", "--out", str(out))
    assert code == EXIT_OK
    text = out.read_text()
    assert "13800000000" not in text and "k3y-for-tests" not in text and "张三" in text
    header = json.loads(text)["header"]
    assert (header["mask"], header["masked_fields"]) == ("hmac-sha256", ["phone"])


def test_export_config_section(tmp_path, monkeypatch):
    assert load(write_config(tmp_path)).export.mask_fields == DEFAULT_MASK_FIELDS
    assert load(write_config(tmp_path)).export.key() is None
    with pytest.raises(ConfigError, match="export.mask_fields: must list at least one entry"):
        load(write_config(tmp_path, "\n[export]\nmask_fields = []\n"))
    with pytest.raises(ConfigError, match="export.mask_key: secrets are not read from the config file"):
        load(write_config(tmp_path, '\n[export]\nmask_key = "inline"\n'))
    monkeypatch.setenv("OW_TEST_EMPTY_KEY", "")
    with pytest.raises(ConfigError, match="export.mask_key: the key is empty"):
        load(write_config(tmp_path, '\n[export]\nmask_key_env = "OW_TEST_EMPTY_KEY"\n')).export.key()


def test_quarantine_lists_records_with_coordinates_reason_and_bytes(capsys, config, store_target):
    store = Store(store_target)
    with store.batch() as tx:
        tx.add_quarantined([
            QuarantinedRecord("shop.events", 2, 17, 1_714_557_600_000, "unparseable",
                              "the debezium parser failed: KeyError: 'field'", 9, "{\"x\": 1}", key=b"\xffk",
                              value=b"{\"x\": 1}", headers=(("trace", b"abc"), ("\xe9", None), ("\udcffk", b"\xfe")),
                              timestamp_type="CreateTime"),
            QuarantinedRecord("shop.events", 0, 3, 1_714_557_600_500, "too_large", "2000000 bytes", 2_000_000,
                              "{\"type\": ", value=None)])
    store.close()
    code, out, _ = run(capsys, "quarantine", "--config", str(config), "--format", "json")
    rows = json.loads(out)["kafka"]
    assert code == EXIT_OK and [r["coordinates"] for r in rows] == ["shop.events/0@3", "shop.events/2@17"]
    assert rows[1] | {"detail": None} == {
        "coordinates": "shop.events/2@17", "topic": "shop.events", "partition": 2, "offset": 17,
        "timestamp": "2024-05-01T10:00:00.000Z", "timestamp_type": "CreateTime", "reason": "unparseable",
        "detail": None, "size": 9, "preview": "{\"x\": 1}", "key": "\\xffk",
        "value_base64": base64.b64encode(b"{\"x\": 1}").decode(),
        "headers": [["trace", "abc"], ["\xe9", None], ["\\xffk", "\\xfe"]]}
    assert rows[0]["value_base64"] is None
    code, out, _ = run(capsys, "quarantine", "--config", str(config))
    assert out.splitlines()[0] == "shop.events/0@3  2024-05-01T10:00:00.500Z  too_large  2000000 bytes  2000000 bytes"


def test_an_unknown_rule_is_a_usage_error_not_an_empty_answer(capsys, config):
    with pytest.raises(SystemExit) as exit_:
        main(["findings", "--config", str(config), "--rule", "F99"])
    assert exit_.value.code == 2 and "invalid choice: 'F99'" in capsys.readouterr().err


def test_check_config_takes_config_as_every_command_does_and_the_old_bare_file(capsys, config):
    assert run(capsys, "check-config", "--config", str(config))[0] == EXIT_OK
    assert run(capsys, "check-config", str(config))[0] == EXIT_OK
    code, _, err = run(capsys, "check-config")
    assert code == EXIT_CONFIG and "give the config once, as --config FILE" in err


def test_one_config_file_gives_one_hash_from_any_path(capsys, file_config, tmp_path, monkeypatch):
    """The hash is of the file's content: by absolute path, relative path or a copy elsewhere with other
    comments and layout, one hash; a changed setting, another (issue 14)."""
    config = file_config
    expected = load(config).content_sha256
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "copy"
    elsewhere.mkdir()
    (elsewhere / "oncewatch.toml").write_text("# a copy\n" + config.read_text().replace("\n\n", "\n\n\n"))
    assert {load(p).content_sha256 for p in (config, Path("oncewatch.toml"), Path("copy/../oncewatch.toml"),
                                             elsewhere / "oncewatch.toml")} == {expected}
    code, out, _ = run(capsys, "check-config", "--config", "oncewatch.toml")
    assert code == EXIT_OK and json.loads(out)["content_sha256"] == expected
    (elsewhere / "oncewatch.toml").write_text(config.read_text().replace("oncewatch.db", "other.db"))
    assert load(elsewhere / "oncewatch.toml").content_sha256 != expected


@pytest.mark.parametrize("fmt", reports.FORMATS)
def test_verify_accepts_a_fresh_export_and_rejects_one_changed_cell(capsys, config, tmp_path, fmt):
    out = tmp_path / f"report.{fmt}"
    assert run(capsys, "export", "--config", str(config), "--format", fmt, "--out", str(out))[0] == EXIT_OK
    code, said, _ = run(capsys, "verify", str(out))
    assert code == EXIT_OK and "match" in said
    changed = tmp_path / f"changed.{fmt}"
    if fmt == "xlsx":
        wb = openpyxl.load_workbook(out)
        wb["Evidence"]["B2"] = "F2"  # the rule of the first row
        wb.save(changed)
    elif fmt == "csv":
        changed.write_bytes(out.read_bytes().replace(b"13800000000", b"13800000001", 1))
    else:
        changed.write_bytes(out.read_bytes().replace(b'"F1"', b'"F2"', 1))
    code, _, err = run(capsys, "verify", str(changed))
    assert code == EXIT_TAMPERED and "data section does not have the data_sha256" in err


def test_verify_says_what_it_cannot_read(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    assert run(capsys, "verify", str(tmp_path / "notes.txt"))[0] == EXIT_CONFIG
    (tmp_path / "fake.csv").write_text("a,b\r\n")
    code, _, err = run(capsys, "verify", str(tmp_path / "fake.csv"))
    assert code == EXIT_CONFIG and "no data_sha256" in err
