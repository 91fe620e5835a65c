"""Structured logs: one JSON object per line on stderr.

Callers pass facts as `extra={...}`; nothing here adds secrets or personal data, and callers
must not either (log coordinates and counts, never row values or passwords).

A line logged with `exc_info` carries the exception's last line in `exc` (what to grep for) and
its whole traceback, every frame and every chained cause, in `traceback`; one with `stack_info`
carries the stack in `stack`. Both stay inside the one JSON line (newlines escaped), so the log
is still one object per line and a person reporting a bug has every frame.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
# Settings whose values a library may log (kafka-python logs its whole configuration at DEBUG, the SASL and key
# passwords and the OAUTHBEARER token provider included): masked wherever a log record's arguments hold them.
SECRET_SETTINGS = re.compile(r"password|secret|token", re.IGNORECASE)
MASK = "********"


def _masked(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: MASK if isinstance(k, str) and SECRET_SETTINGS.search(k) and v is not None else _masked(v)
                for k, v in value.items()}
    return value


class SecretsMasked(logging.Filter):
    """Masks the secret settings in the arguments of a record (a library's configuration dict)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, Mapping):
            record.args = _masked(record.args)
        elif isinstance(record.args, tuple) and any(isinstance(a, Mapping) for a in record.args):
            record.args = tuple(_masked(a) for a in record.args)
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
               "msg": record.getMessage()}
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            text = self.formatException(record.exc_info)
            out["exc"] = text.splitlines()[-1]
            out["traceback"] = text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


def setup(level: str | None = None) -> None:
    """JSON lines on stderr at `level`, else $ONCEWATCH_LOG_LEVEL, else INFO.

    The Kafka client logs every connection and metadata refresh at INFO; its loggers stay at
    $ONCEWATCH_KAFKA_LOG_LEVEL, else WARNING (DEBUG when the whole log is), so that what the
    monitor says is not drowned. Python
    warnings of the libraries become log lines too (logger "py.warnings"), never bare text."""
    level = (level or os.environ.get("ONCEWATCH_LOG_LEVEL") or "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(SecretsMasked())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    kafka = os.environ.get("ONCEWATCH_KAFKA_LOG_LEVEL") or ("DEBUG" if level == "DEBUG" else "WARNING")
    logging.getLogger("kafka").setLevel(kafka.upper())
    logging.captureWarnings(True)
    logging.Formatter.converter = time.gmtime
