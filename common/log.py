"""Structured logging: one JSON line per event on stdout, with every known secret value redacted."""

from __future__ import annotations

import os
import sys
from collections import deque
from typing import Any, TextIO

import msgspec
import structlog

from common import redact as redaction
from common.redact import MIN_SECRET_LEN, REDACTED, redact, redact_value, register_secret

# The engine lives in common.redact; these names stay importable from here for the callers that log.
__all__ = ["REDACTED", "MIN_SECRET_LEN", "register_secret", "redact", "redact_value", "setup_logging", "get_logger"]


def _redact_processor(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    if not redaction.active():
        return event_dict
    return {k: redact_value(v) for k, v in event_dict.items()}


def _add_process(service: str) -> structlog.types.Processor:
    def processor(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        event_dict.setdefault("service", service)
        event_dict["pid"] = os.getpid()  # read per event: correct after a fork
        return event_dict

    return processor


_encoder = msgspec.json.Encoder(enc_hook=str)

# Warnings and errors kept for the daemon log (common/daemon_log.py sends them to the writer); None until a
# service asks for them, so a CLI or a test logs as before.
_kept: deque | None = None
KEPT_LEVELS = frozenset(("warning", "error", "critical", "exception"))


def keep_warnings(maxlen: int = 2000) -> deque:
    """From now on every warning or error line (redacted, as printed) is also queued here; the oldest
    go first when nobody drains it."""
    global _kept
    if _kept is None:
        _kept = deque(maxlen=maxlen)
    return _kept


def _keep_processor(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    if _kept is not None and event_dict.get("level") in KEPT_LEVELS:
        _kept.append(dict(event_dict))
    return event_dict
_FIRST = ("ts", "level", "service", "event")


def _render(_logger: Any, _name: str, event_dict: dict[str, Any]) -> str:
    ordered = {k: event_dict[k] for k in _FIRST if k in event_dict}
    ordered.update(event_dict)
    # A last pass over the rendered line catches values that only became text in the encoder.
    return redact(_encoder.encode(ordered).decode())


def setup_logging(
    service: str, *, stream: TextIO | None = None, level: str = "info"
) -> structlog.typing.FilteringBoundLogger:
    """Configure this process's logging once at start-up and return its logger."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
            _add_process(service),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            _redact_processor,
            _keep_processor,
            _render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level.lower()),
        logger_factory=structlog.WriteLoggerFactory(file=stream or sys.stdout),
        cache_logger_on_first_use=True,
    )
    return structlog.get_logger()


def get_logger(**bind: Any) -> structlog.typing.FilteringBoundLogger:
    """A logger with the given keys bound to every event it writes."""
    return structlog.get_logger(**bind)
