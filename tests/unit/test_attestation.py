"""Period attestations (issue 45, items 4-5): `oncewatch attest` then `oncewatch verify` passes; an edit of any byte
of the attestation or of the one before it in its chain, or another key, exits 5."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import shlex
import shutil
import stat
from decimal import Decimal
from pathlib import Path

import pytest
from openpyxl import load_workbook

from devservices import scenario
from oncewatch import cli
from oncewatch.core.config import ConfigError, describe, load, parse
from oncewatch.core.records import VERDICT_VERIFIED, VERDICT_VIOLATED, TradeVerdict
from oncewatch.dashboards import attestation, attestation_keys, attestation_xlsx
from oncewatch.dashboards.attestation_check import check
from oncewatch.store import verdicts
from tests.conftest import SQLITE_ONLY, StoreTarget, store_section

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)
T0 = NOW.timestamp() - 600  # the scenario's t0
DAY = dt.timedelta(days=1)
SINCE, UNTIL = NOW - DAY, NOW + dt.timedelta(minutes=5)

# Beside the scenario's own (devservices.scenario.trade_verdicts: T1001 violated by F1, T1002-T1005 verified, T1006
# pending): a trade without an amount, one verified and then violated by a later finding, one two days before.
VERIFIED_FIRST = [
    TradeVerdict("T1007", "O1007", None, VERDICT_VERIFIED, None, T0 + 22, T0 + 53),
    TradeVerdict("T1008", "O1008", Decimal("20.00"), VERDICT_VERIFIED, None, T0 + 25, T0 + 56),
    TradeVerdict("T0999", "O999", Decimal("7.00"), VERDICT_VERIFIED, None, T0 - 2 * 86400, T0 - 2 * 86400 + 30),
]
LATER = [TradeVerdict("T1008", "O1008", Decimal("20.00"), VERDICT_VIOLATED, "F7", T0 + 25, T0 + 90)]


def seed(target: StoreTarget) -> None:
    store = scenario.seed(target, now=NOW.timestamp())
    for batch in (VERIFIED_FIRST, LATER):
        with store.batch() as tx:
            verdicts.save(tx, batch, 60.0)
    store.close()


def keys(folder: Path) -> tuple[Path, Path]:
    assert cli.main(["attest-key", "--out", str(folder)]) == cli.EXIT_OK
    return folder / "attest.key", folder / "attest.pub"


@pytest.fixture
def shop(tmp_path: Path, store_target: StoreTarget) -> Path:
    """A config naming the scenario's store with the verdicts above, a signing key and a folder of attestations."""
    seed(store_target)
    keys(tmp_path / "keys")
    cfg = tmp_path / "oncewatch.toml"
    cfg.write_text(f'[mysql]\nuser = "oncewatch"\ntables = ["shop.orders"]\n\n{store_section(store_target)}\n'
                   '[attest]\nkey_file = "keys/attest.key"\ndirectory = "attestations"\n')
    return cfg


def attest(cfg: Path, since: dt.datetime = SINCE, until: dt.datetime = UNTIL, *more: str) -> int:
    return cli.main(["attest", "--config", str(cfg), "--since", since.isoformat(), "--until", until.isoformat(),
                     *more])


def verify(path: Path, public: Path, *more: str) -> int:
    return cli.main(["verify", str(path), "--public-key", str(public), *more])


def made(cfg: Path) -> list[Path]:
    return sorted((cfg.parent / "attestations").glob("*.json"))


# ---------------------------------------------------------------- what it says

def test_attest_then_verify_passes_and_says_the_periods_trades_findings_and_coverage(shop: Path, capsys) -> None:
    assert attest(shop) == cli.EXIT_OK
    [path] = made(shop)
    assert path.name == "attestation-000001-20261130T120000Z-20261201T120500Z.json"
    doc = json.loads(path.read_bytes())
    assert list(doc) == list(attestation.FIELDS)
    assert (doc["sequence"], doc["previous"], doc["since"], doc["until"]) == (
        1, None, "2026-11-30T12:00:00.000000Z", "2026-12-01T12:05:00.000000Z")
    assert doc["config_sha256"] == load(shop).content_sha256
    # the trade two days before the period is not in it; the one without an amount is counted apart
    assert doc["trades"] == {
        "verified": {"trades": 5, "amount": "999.50", "unpriced": 1},
        "violated": {"trades": 2, "amount": "119.00", "unpriced": 0},
        "pending": {"trades": 1, "amount": "30.00", "unpriced": 0},
        "all": {"trades": 8, "amount": "1148.50", "unpriced": 1}}
    assert doc["verified_share"] == {"trades": "0.625000", "amount": "0.870265"}  # 999.50 / 1148.50, rounded down
    # [slo]'s 60 s: T1005 was verified 180 s after its commit
    assert doc["objective"] == {"objective": "0.999", "within_seconds": 60.0,
                                "verified_within": {"trades": 4, "amount": "949.50", "unpriced": 1},
                                "share": {"trades": "0.500000", "amount": "0.826730"}, "met": False}
    assert doc["violated_by_rule"] == {"F1": {"trades": 1, "amount": "99.00", "unpriced": 0},
                                       "F7": {"trades": 1, "amount": "20.00", "unpriced": 0}}
    assert [(t["trade_no"], t["verdict"], t["rule"], t["verified_at"]) for t in doc["open_trades"]] == [
        ("T1001", "violated", "F1", None), ("T1008", "violated", "F7", "2026-12-01T11:50:56.000000Z"),
        ("T1006", "pending", None, None)]
    # every finding of the period, with its history and why it ended
    assert [f["id"] for f in doc["findings"]] == ["f1-t1001", "f7-o502", "f7-o504", "f2-o505", "f9-o503", "f9-o506",
                                                  "f9-o507"]
    ended = {f["id"]: (f["status"], f["resolution"], f["closed"]) for f in doc["findings"]}
    assert ended["f2-o505"] == ("resolved", "refunded T2006", None)
    assert {f["id"]: f["evidence_items"] for f in doc["findings"]}["f1-t1001"] == 2
    # the binlog's GTIDs and Kafka offsets of the period, and how far the monitor had read
    binlog, kafka = doc["coverage"]["binlog"], doc["coverage"]["kafka"]
    assert binlog["gtids"] == {"0": {"first": "0-1-4701", "last": "0-1-4705"}}
    assert binlog["transactions"] == 5 and binlog["kept_since"] == "2026-12-01T11:50:00.000000Z"
    assert {k: (v["first"], v["last"], v["records"]) for k, v in kafka["partitions"].items()} == {
        "shop.events/0": (100, 100, 1), "shop.events/1": (200, 201, 2), "shop.events/2": (50, 51, 2)}
    assert doc["xlsx"]["file"] == path.with_suffix(".xlsx").name
    assert doc["signature"]["algorithm"] == "Ed25519"
    capsys.readouterr()
    assert verify(path, shop.parent / "keys/attest.pub") == cli.EXIT_OK
    key = attestation_keys.public_key((shop.parent / "keys/attest.pub").read_bytes())
    assert f"signature (key public_key_sha256 {attestation_keys.key_id(key)}), hashes and chain verify" in \
        capsys.readouterr().out
    assert doc["signature"]["public_key_sha256"] == attestation_keys.key_id(key)


@SQLITE_ONLY
def test_a_closed_finding_says_who_closed_it_and_why(shop: Path, store_target: StoreTarget) -> None:
    from oncewatch.store import open_writer, reviews

    store = open_writer(store_target)
    reviews.close(store, ["f9-o503"], by="alice", reason="false_positive", note="a test order", now=T0 + 200)
    store.close()
    assert attest(shop) == cli.EXIT_OK
    f = next(f for f in json.loads(made(shop)[0].read_bytes())["findings"] if f["id"] == "f9-o503")
    assert f["status"] == "closed"
    assert f["closed"] == {"at": "2026-12-01T11:53:20.000000Z", "by": "alice", "reason": "false_positive",
                           "note": "a test order"}
    assert f["history"][-1]["reason"] == "false_positive"


@SQLITE_ONLY
def test_the_xlsx_holds_the_same_content_typed(shop: Path) -> None:
    assert attest(shop) == cli.EXIT_OK
    path = made(shop)[0]
    doc = json.loads(path.read_bytes())
    book = load_workbook(path.with_suffix(".xlsx"), read_only=True)
    assert book.sheetnames == list(attestation_xlsx.SHEETS)
    rows = {name: [list(r) for r in book[name].iter_rows(values_only=True)] for name in attestation_xlsx.SHEETS}
    assert rows["Trades"][1:] == [["verified", 5, 999.5, 1], ["violated", 2, 119, 0], ["pending", 1, 30, 0],
                                  ["all", 8, 1148.5, 1]]
    trade = dict(zip(rows["Open trades"][0], rows["Open trades"][1]))
    assert trade["committed_at"] == dt.datetime(2026, 12, 1, 11, 50, 5) and trade["amount"] == 99
    assert [r[0] for r in rows["Findings"][1:]] == [f["id"] for f in doc["findings"]]
    header = {r[0]: r[1:] for r in rows["Attestation"][1:]}
    assert header["sequence"] == ["1", 1] and header["since"][1] == dt.datetime(2026, 11, 30, 12)
    assert ["binlog", "GTID domain 0", "0-1-4701", "0-1-4705"] in rows["Coverage"]  # openpyxl drops empty ends
    assert ["kafka", "shop.events/1", 200, 201, 2] in rows["Coverage"]
    # the XLSX is covered by the signature through the SHA-256 its JSON records
    book.close()
    key = attestation_keys.public_key((shop.parent / "keys/attest.pub").read_bytes())
    xlsx_path = path.with_suffix(".xlsx")
    changed = f"{xlsx_path}: changed since {path.name} was signed (its SHA-256 is not the one recorded there)"
    original = xlsx_path.read_bytes()
    xlsx_path.write_bytes(flipped(original, len(original) // 2))
    assert check(path, key).problems[0] == changed
    # a figure changed in Excel is placed
    book = load_workbook(io.BytesIO(original))
    book["Trades"]["B3"] = 0
    book["Findings"]["E2"] = "resolved"
    book.save(xlsx_path)
    assert check(path, key).problems == [
        changed, f"{xlsx_path}: sheet Trades, row 3, column trades: says '0', the attestation gives '2'",
        f"{xlsx_path}: sheet Findings, row 2, column status: says 'resolved', the attestation gives 'open'"]


@SQLITE_ONLY
def test_verify_tells_an_attestation_from_a_report(shop: Path, capsys) -> None:
    assert attest(shop) == cli.EXIT_OK
    path = made(shop)[0]
    capsys.readouterr()
    assert cli.main(["verify", str(path)]) == cli.EXIT_CONFIG  # no key: it cannot be checked, and it says how
    assert "is an attestation: check it with the public key" in capsys.readouterr().err
    # its XLSX is checked through the JSON beside it, which records the XLSX's SHA-256
    assert verify(path.with_suffix(".xlsx"), shop.parent / "keys/attest.pub") == cli.EXIT_OK
    assert f"checking {path}" in capsys.readouterr().err
    assert verify(path, shop.parent / "keys/attest.key") == cli.EXIT_CONFIG  # the private key is not the one to give
    assert "not an Ed25519 public key in PEM" in capsys.readouterr().err
    # a report is still a report, with a key or without
    report = shop.parent / "report.json"
    assert cli.main(["export", "--config", str(shop), "--format", "json", "--out", str(report)]) == cli.EXIT_OK
    assert verify(report, shop.parent / "keys/attest.pub") == cli.EXIT_OK
    assert "data_sha256 and report_sha256 match" in capsys.readouterr().out


# ---------------------------------------------------------------- tampering

def flipped(data: bytes, at: int) -> bytes:
    """`data` with the byte at `at` changed (to another printable byte, so that the text may still parse)."""
    b = data[at]
    return data[:at] + bytes([b ^ 0x01 if b ^ 0x01 != 0x0a else 0x20]) + data[at + 1:]


@SQLITE_ONLY
def test_an_edit_of_any_byte_of_the_attestation_exits_5(shop: Path, tmp_path: Path, capsys) -> None:
    # ten seconds of the scenario: one trade, one finding, every kind of field, a file small enough to try each byte
    start = dt.datetime.fromtimestamp(T0, dt.timezone.utc)
    assert attest(shop, start, start + dt.timedelta(seconds=10)) == cli.EXIT_OK
    path = made(shop)[0]
    doc = json.loads(path.read_bytes())
    binlog = doc["coverage"]["binlog"]
    assert (len(doc["findings"]), doc["trades"]["all"]["trades"], binlog["transactions"]) == (1, 1, 4)
    data = path.read_bytes()
    key = attestation_keys.public_key((shop.parent / "keys/attest.pub").read_bytes())
    copy = tmp_path / "attestations" / "edited.json"
    unnoticed = []
    for at in range(len(data)):
        copy.write_bytes(flipped(data, at))
        if not check(copy, key).problems:
            unnoticed.append(at)
    assert unnoticed == []
    # through the command, an edit of a figure is named where it is
    path.write_bytes(data.replace(b'"amount": "99.00"', b'"amount": "9.00"', 1))
    assert data.count(b'"amount": "99.00"') > 1
    capsys.readouterr()
    assert verify(path, shop.parent / "keys/attest.pub") == cli.EXIT_TAMPERED
    err = capsys.readouterr().err
    assert f"{path}: field trades: changed" in err and "signature: does not verify" in err


@SQLITE_ONLY
def test_chained_periods_verify_and_an_edit_of_any_byte_of_the_previous_exits_5(shop: Path, capsys) -> None:
    start = dt.datetime.fromtimestamp(T0, dt.timezone.utc)  # two short periods: small files, each byte tried
    middle = start + dt.timedelta(seconds=10)
    assert attest(shop, start, middle) == cli.EXIT_OK
    assert attest(shop, middle, middle + dt.timedelta(seconds=10)) == cli.EXIT_OK
    first, second = made(shop)
    doc = json.loads(second.read_bytes())
    assert doc["sequence"] == 2
    assert doc["previous"] == {"sequence": 1, "file": first.name, "sha256": attestation.sha256_hex(first.read_bytes()),
                               "since": "2026-12-01T11:50:00.000000Z", "until": "2026-12-01T11:50:10.000000Z"}
    public = shop.parent / "keys/attest.pub"
    capsys.readouterr()
    assert verify(second, public) == cli.EXIT_OK
    assert f"({second.name}, {second.with_suffix('.xlsx').name}, {first.name}" in capsys.readouterr().out
    key = attestation_keys.public_key(public.read_bytes())
    data = first.read_bytes()
    for at in range(0, len(data), 5):  # the link is the SHA-256 of every byte; each try checks both files whole
        first.write_bytes(flipped(data, at))
        assert any(p.startswith(f"{first}: not the attestation {second.name} chains to")
                   for p in check(second, key).problems), at
    first.write_bytes(data)
    # the previous given by hand, and one that is not the one it chains to
    assert verify(second, public, "--previous", str(first)) == cli.EXIT_OK
    assert verify(second, public, "--previous", str(second)) == cli.EXIT_TAMPERED
    # a chain whose previous is not at hand verifies what is, and says so
    first.rename(first.with_name("elsewhere.json"))
    capsys.readouterr()
    assert verify(second, public) == cli.EXIT_OK
    assert "the chain before it is not checked" in capsys.readouterr().err


@SQLITE_ONLY
def test_another_key_exits_5(shop: Path, tmp_path: Path, capsys) -> None:
    assert attest(shop) == cli.EXIT_OK
    path = made(shop)[0]
    _, other_public = keys(tmp_path / "other")
    capsys.readouterr()
    assert verify(path, other_public) == cli.EXIT_TAMPERED
    assert "signature: made with another key" in capsys.readouterr().err
    # re-signed with another key after an edit: the key given is not the one that signed it
    other = attestation_keys.private_key((tmp_path / "other/attest.key").read_bytes(), "test")
    doc = json.loads(path.read_bytes())
    doc["trades"]["violated"]["trades"] = 0
    path.write_bytes(attestation.render(attestation.sign(doc, other)))
    assert verify(path, shop.parent / "keys/attest.pub") == cli.EXIT_TAMPERED
    assert "made with another key" in capsys.readouterr().err
    # and a signature value copied in under the right key's id does not verify
    doc = attestation.sign(doc, other)
    doc["signature"]["public_key_sha256"] = attestation_keys.key_id(attestation_keys.public_key(
        (shop.parent / "keys/attest.pub").read_bytes()))
    path.write_bytes(attestation.render(doc))
    assert verify(path, shop.parent / "keys/attest.pub") == cli.EXIT_TAMPERED
    assert "signature: does not verify with the public key given" in capsys.readouterr().err


@SQLITE_ONLY
def test_attest_refuses_an_overlapping_period_and_a_changed_previous(shop: Path, capsys) -> None:
    assert attest(shop, SINCE, NOW) == cli.EXIT_OK
    capsys.readouterr()
    assert attest(shop, NOW - dt.timedelta(hours=1), UNTIL) == cli.EXIT_CONFIG
    assert "give --since 2026-12-01T12:00:00.000000Z or later" in capsys.readouterr().err
    first = made(shop)[0]
    first.write_bytes(first.read_bytes().replace(b'"sequence": 1', b'"sequence": 7'))
    assert attest(shop, NOW, UNTIL) == cli.EXIT_TAMPERED
    assert "does not verify, so nothing is chained to it" in capsys.readouterr().err
    assert len(made(shop)) == 1
    assert attest(shop, UNTIL, SINCE) == cli.EXIT_CONFIG
    capsys.readouterr()
    # without a directory an attestation needs --out; without [attest] there is no key to sign with
    text = shop.read_text()
    shop.write_text(text.replace('directory = "attestations"\n', ""))
    assert attest(shop) == cli.EXIT_CONFIG
    assert "give --out FILE, or [attest] directory" in capsys.readouterr().err
    assert attest(shop, SINCE, UNTIL, "--out", str(shop.parent / "elsewhere/day.json")) == cli.EXIT_OK
    assert (shop.parent / "elsewhere/day.xlsx").is_file()
    shop.write_text(text[:text.index("[attest]")])
    assert attest(shop, SINCE, UNTIL, "--out", str(shop.parent / "day.json")) == cli.EXIT_CONFIG
    assert "config error: attest: missing" in capsys.readouterr().err


# ---------------------------------------------------------------- keys and config

@SQLITE_ONLY
def test_the_key_pair_is_private_and_its_public_key_is_printed(shop: Path, tmp_path: Path, capsys) -> None:
    private = shop.parent / "keys/attest.key"
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    capsys.readouterr()
    assert cli.main(["attest-key", "--config", str(shop)]) == cli.EXIT_OK
    assert capsys.readouterr().out == (shop.parent / "keys/attest.pub").read_text()
    assert cli.main(["attest-key", "--out", str(shop.parent / "keys")]) == cli.EXIT_CONFIG  # never over a key
    assert "exists" in capsys.readouterr().err
    # the private key is in no output of check-config and in no log line of attest
    assert cli.main(["check-config", "--config", str(shop)]) == cli.EXIT_OK
    assert attest(shop) == cli.EXIT_OK
    out = capsys.readouterr()
    secret = private.read_text().splitlines()[1]
    assert secret not in out.out + out.err
    assert json.loads(out.out)["attest"]["key"].startswith("********")
    private.chmod(0o644)  # a key others may read is said, not refused
    assert cli.main(["check-config", "--config", str(shop)]) == cli.EXIT_OK
    assert f"attest.key_file {private} is open to its group or others (mode 644)" in capsys.readouterr().err


@pytest.mark.parametrize("attest_table, message", [
    ({}, r"^attest\.key_file: missing: attestations are signed with an Ed25519 private key"),
    ({"key": "-----BEGIN PRIVATE KEY-----"}, r"^attest\.key: secrets are not read from the config file"),
    ({"key_file": "k", "directory": ""}, r"^attest\.directory: expected a folder's path"),
    ({"key_file": "k", "folder": "a"}, r"^attest\.folder: unknown key"),
])
def test_attest_config_errors_name_their_key(attest_table: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse({"mysql": {"user": "u", "tables": ["s.t"]}, "attest": attest_table})


def test_a_key_that_is_not_ed25519_is_refused_naming_its_key(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (tmp_path / "ec.key").write_bytes(pem)
    (tmp_path / "junk.key").write_text("not a key")
    (tmp_path / "empty.key").write_text("")
    for name, message in (("ec.key", r"not an Ed25519 key \(ECPrivateKey\)"),
                          ("junk.key", "not a PEM private key without a passphrase"),
                          ("empty.key", "the key is empty"), ("absent.key", None)):
        cfg = parse({"mysql": {"user": "u", "tables": ["s.t"]}, "attest": {"key_file": name}}, base=tmp_path)
        # a file that cannot be read is named by Secret.value: "attest.key_file /path: cannot read it"
        pattern = rf"^attest\.key_file: {message}" if message else r"^attest\.key_file \S+/absent\.key: cannot read it"
        with pytest.raises(ConfigError, match=pattern):
            attestation_keys.signing_key(cfg)
    assert "not a key" not in json.dumps(describe(cfg))


# ---------------------------------------------------------------- the README's walkthrough

README = Path(__file__).resolve().parents[2] / "README.md"


def run_block(block: str) -> list[int]:
    """Each command of a README `sh` block, as written (an `oncewatch` command run in this process)."""
    codes = []
    for line in block.strip().splitlines():
        argv = shlex.split(line, comments=True)
        assert argv[0] == "oncewatch", line
        codes.append(cli.main(argv[1:]))
    return codes


def test_the_readmes_auditor_walkthrough_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README, Period attestations: make the key and two days' attestations, hand over the files and the public key,
    check them in a folder with no config and no store; then one byte of the first day's changed exits 5."""
    section = re.search(r"^## Period attestations\n(.*?)^## ", README.read_text(), re.M | re.S)[1]
    keygen, operator, auditor = re.findall(r"```sh\n(.*?)```", section, re.S)
    shop, office = tmp_path / "shop", tmp_path / "auditor"
    shop.mkdir()
    office.mkdir()
    seed(str(shop / "oncewatch.db"))
    (shop / "oncewatch.toml").write_text('[mysql]\nuser = "oncewatch"\ntables = ["shop.orders"]\n\n'
                                         '[store]\npath = "oncewatch.db"\n\n'
                                         + re.search(r"```toml\n(.*?)```", section, re.S)[1])
    monkeypatch.chdir(shop)
    assert run_block(keygen) == [cli.EXIT_OK]
    assert run_block(operator) == [cli.EXIT_OK] * 3
    for path in [*(shop / "attestations").iterdir(), shop / "keys/attest.pub"]:  # handed over
        shutil.copy(path, office)
    monkeypatch.chdir(office)
    assert run_block(auditor) == [cli.EXIT_OK]
    [first] = office.glob("attestation-000001-*.json")
    assert json.loads(first.read_bytes())["trades"]["all"]["trades"] == 8  # the day the scenario's trades are in
    first.write_bytes(flipped(first.read_bytes(), 100))
    assert run_block(auditor) == [cli.EXIT_TAMPERED]
