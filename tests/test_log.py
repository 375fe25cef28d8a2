"""Tests for common.log: JSON lines with the standard keys, context binding, and redaction."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import structlog

from common.log import get_logger, register_secret, setup_logging


@pytest.fixture
def stream():
    out = io.StringIO()
    yield out
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_one_json_line_per_event(stream):
    log = setup_logging("writer", stream=stream)
    log.info("one")
    log.warning("two")
    assert ["one", "two"] == [e["event"] for e in lines(stream)]


def test_standard_keys(stream):
    setup_logging("writer", stream=stream).info("started", batch=3)
    event = lines(stream)[0]
    assert ("writer", "info", 3, True, True) == (
        event["service"], event["level"], event["batch"], event["ts"].endswith("Z"), isinstance(event["pid"], int))


def test_level_filter(stream):
    log = setup_logging("writer", stream=stream, level="warning")
    log.info("hidden")
    log.warning("shown")
    assert ["shown"] == [e["event"] for e in lines(stream)]


def test_contextvars_are_merged(stream):
    log = setup_logging("runner", stream=stream)
    structlog.contextvars.bind_contextvars(session_id="s1")
    log.info("turn")
    assert "s1" == lines(stream)[0]["session_id"]


def test_get_logger_binds(stream):
    setup_logging("runner", stream=stream)
    get_logger(message_id="m7").info("sent")
    assert "m7" == lines(stream)[0]["message_id"]


def test_non_json_values_are_rendered_as_text(stream):
    setup_logging("runner", stream=stream).info("x", path=Path("/tmp/x"))
    assert "/tmp/x" == lines(stream)[0]["path"]


def test_secret_redacted_in_event_and_fields(stream):
    register_secret("sk-topsecret-1")
    setup_logging("runner", stream=stream).info("key sk-topsecret-1 used", header="Bearer sk-topsecret-1")
    event = lines(stream)[0]
    assert ("key [redacted] used", "Bearer [redacted]") == (event["event"], event["header"])


def test_secret_redacted_in_nested_values(stream):
    register_secret("sk-topsecret-2")
    setup_logging("runner", stream=stream).info("req", body={"auth": ["x", {"k": "sk-topsecret-2"}]})
    assert {"auth": ["x", {"k": "[redacted]"}]} == lines(stream)[0]["body"]


def test_secret_redacted_in_exception(stream):
    register_secret("sk-topsecret-3")
    log = setup_logging("runner", stream=stream)
    try:
        raise RuntimeError("bad token sk-topsecret-3")
    except RuntimeError:
        log.exception("failed")
    assert (False, True) == (
        "sk-topsecret-3" in stream.getvalue(), "bad token [redacted]" in lines(stream)[0]["exception"])


def test_secret_redacted_in_unknown_objects(stream):
    register_secret("sk-topsecret-4")

    class Holder:
        def __str__(self) -> str:
            return "holder(sk-topsecret-4)"

    setup_logging("runner", stream=stream).info("obj", obj=Holder())
    assert "holder([redacted])" == lines(stream)[0]["obj"]


def test_longer_secret_redacted_whole(stream):
    register_secret("abcd1234")
    register_secret("abcd1234efgh")
    setup_logging("runner", stream=stream).info("abcd1234efgh")
    assert "[redacted]" == lines(stream)[0]["event"]


def test_short_values_are_not_registered(stream):
    register_secret("ab")
    setup_logging("runner", stream=stream).info("ab cd")
    assert "ab cd" == lines(stream)[0]["event"]


def test_a_secret_is_redacted_encoded_too(stream):
    import base64

    register_secret("sk-topsecret-encoded-5")
    encoded = base64.b64encode(b"sk-topsecret-encoded-5").decode()
    setup_logging("runner", stream=stream).info("body", b64=encoded, hex=b"sk-topsecret-encoded-5".hex(" "))
    event = lines(stream)[0]
    assert encoded[4:-4] not in stream.getvalue() and "[redacted]" in event["b64"]
    assert "[redacted]" == event["hex"]
