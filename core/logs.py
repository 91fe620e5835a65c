"""Structured logs: one JSON object per line on stderr.

Callers pass facts as `extra={...}`; nothing here adds secrets or personal data, and callers
must not either (log coordinates and counts, never row values or passwords).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
               "msg": record.getMessage()}
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(out, default=str)


def setup(level: str | None = None) -> None:
    """JSON lines on stderr at `level`, else $ONCEWATCH_LOG_LEVEL, else INFO."""
    level = (level or os.environ.get("ONCEWATCH_LOG_LEVEL") or "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.Formatter.converter = time.gmtime
