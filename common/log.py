"""Structured logging: one JSON line per event on stdout, with every known secret value redacted."""

from __future__ import annotations

import os
import sys
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
