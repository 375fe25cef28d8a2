"""Structured logging: one JSON line per event on stdout, with every known secret value redacted."""

from __future__ import annotations

import os
import re
import sys
import threading
from typing import Any, TextIO

import msgspec
import structlog

REDACTED = "[redacted]"
MIN_SECRET_LEN = 4  # shorter values would redact ordinary words; no real token is this short

_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None
_lock = threading.Lock()


def register_secret(value: str) -> None:
    """Redact value from every log line written from now on, in this process."""
    global _pattern
    if len(value) < MIN_SECRET_LEN or value in _secrets:
        return
    with _lock:
        _secrets.add(value)
        # Longest first, so a secret that contains another is redacted whole.
        ordered = sorted(_secrets, key=len, reverse=True)
        _pattern = re.compile("|".join(re.escape(s) for s in ordered))


def redact(text: str) -> str:
    """text with every registered secret value replaced by [redacted]."""
    pattern = _pattern
    return pattern.sub(REDACTED, text) if pattern is not None else text


def redact_value(value: Any) -> Any:
    """``value`` with every registered secret replaced, through dicts (keys too), lists and bytes."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k) if isinstance(k, str) else k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return redact(bytes(value).decode("utf-8", "replace"))
    return value


def _redact_processor(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    if _pattern is None:
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
