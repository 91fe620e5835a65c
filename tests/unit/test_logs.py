"""The terminal shows the monitor's own JSON lines: Kafka client chatter and library warnings are
kept down or made log lines (issue 14, item 4)."""

from __future__ import annotations

import json
import traceback
import logging
import warnings
from collections.abc import Iterator

import pytest

from oncewatch.core import logs


@pytest.fixture
def restored() -> Iterator[None]:
    root, kafka = logging.getLogger(), logging.getLogger("kafka")
    handlers, level, kafka_level = root.handlers[:], root.level, kafka.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    kafka.setLevel(kafka_level)
    logging.captureWarnings(False)


def lines(err: str) -> list[dict]:
    return [json.loads(line) for line in err.splitlines()]


@pytest.mark.parametrize("level, kafka_env, kafka_info_shown", [
    ("INFO", None, False), ("DEBUG", None, True), ("INFO", "INFO", True)])
def test_kafka_client_chatter_stays_below_warning_unless_asked_for(
        restored, capsys, monkeypatch, level, kafka_env, kafka_info_shown) -> None:
    monkeypatch.setenv("ONCEWATCH_LOG_LEVEL", level)
    if kafka_env:
        monkeypatch.setenv("ONCEWATCH_KAFKA_LOG_LEVEL", kafka_env)
    else:
        monkeypatch.delenv("ONCEWATCH_KAFKA_LOG_LEVEL", raising=False)
    logs.setup()
    logging.getLogger("kafka.cluster").info("Updated cluster metadata")
    logging.getLogger("kafka.conn").warning("connection lost")
    logging.getLogger("oncewatch.monitor").info("started")
    shown = [(d["logger"], d["msg"]) for d in lines(capsys.readouterr().err)]
    assert ("kafka.conn", "connection lost") in shown and ("oncewatch.monitor", "started") in shown
    assert (("kafka.cluster", "Updated cluster metadata") in shown) is kafka_info_shown


def test_kafka_clients_configuration_is_logged_without_its_secrets(restored, capsys, monkeypatch) -> None:
    """kafka-python logs a client's whole configuration at DEBUG, passwords included (issue 46)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    monkeypatch.setenv("ONCEWATCH_LOG_LEVEL", "DEBUG")
    logs.setup()
    with pytest.raises(KafkaError):  # nothing listens on port 1: the client logs its configuration, then gives up
        KafkaAdminClient(bootstrap_servers="127.0.0.1:1", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                         sasl_plain_username="ow", sasl_plain_password="canary-pw-Zq3", ssl_password="canary-key-Xr9",
                         bootstrap_timeout_ms=300, request_timeout_ms=300)
    err = capsys.readouterr().err
    started = [d["msg"] for d in lines(err) if d["msg"].startswith("Starting KafkaAdminClient with configuration")]
    assert started and "'sasl_plain_password': '********'" in started[0] and "'sasl_plain_username': 'ow'" in started[0]
    assert "canary-pw-Zq3" not in err and "canary-key-Xr9" not in err


def test_a_library_warning_is_a_json_log_line(restored, capsys, monkeypatch) -> None:
    monkeypatch.delenv("ONCEWATCH_LOG_LEVEL", raising=False)
    logs.setup()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("Unknown table 'x'", UserWarning, stacklevel=1)
    [line] = lines(capsys.readouterr().err)
    assert line["logger"] == "py.warnings" and line["level"] == "warning" and "Unknown table 'x'" in line["msg"]


def deepest() -> None:
    raise ValueError("the bug itself")


def middle() -> None:
    try:
        deepest()
    except ValueError as exc:
        raise RuntimeError("while handling it") from exc


def test_an_exception_logs_its_whole_traceback_in_one_field(restored, capsys, monkeypatch) -> None:
    """Every frame of the exception and of its cause is in the JSON line (issue 42, observation 7); `exc`
    keeps the last line, the one to grep for."""
    monkeypatch.delenv("ONCEWATCH_LOG_LEVEL", raising=False)
    logs.setup()
    try:
        middle()
    except RuntimeError as exc:
        raised = exc
        logging.getLogger("oncewatch.test").error("failed", exc_info=True, extra={"event": "x_failed"})
    [line] = lines(capsys.readouterr().err)
    assert line["event"] == "x_failed" and line["exc"] == "RuntimeError: while handling it"
    for exc in (raised, raised.__cause__):
        for frame in traceback.extract_tb(exc.__traceback__):
            assert f'File "{frame.filename}", line {frame.lineno}, in {frame.name}' in line["traceback"], frame
    assert "ValueError: the bug itself" in line["traceback"] and "direct cause" in line["traceback"]


def test_stack_info_is_logged_whole(restored, capsys, monkeypatch) -> None:
    monkeypatch.delenv("ONCEWATCH_LOG_LEVEL", raising=False)
    logs.setup()
    logging.getLogger("oncewatch.test").warning("where am I", stack_info=True)
    [line] = lines(capsys.readouterr().err)
    assert line["stack"].startswith("Stack (most recent call last):")
    assert "in test_stack_info_is_logged_whole" in line["stack"]
