"""Tests for common.secrets: resolution order, secrets.json handling, and that values never leak."""

from __future__ import annotations

import io
import json
import os
import stat

import pytest
import structlog

from common.config import Config
from common.errors import MissingSecret, StarlingError
from common.home import paths_for
from common.log import setup_logging
from common.secrets import (
    SecretInfo, env_names, list_secret_names, list_secrets, remove_secret, resolve_secret,
    session_secret, set_secret,
)


@pytest.fixture
def secrets_file(tmp_path, monkeypatch):
    for var in ("TELEGRAM_MAIN", "STARLING_SECRET_TELEGRAM_MAIN", "SESSION_SECRET"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "secrets.json"


def test_env_names():
    assert ("TELEGRAM_MAIN", "STARLING_SECRET_TELEGRAM_MAIN") == env_names("telegram-main")


def test_env_names_dot_becomes_underscore():
    assert ("A_B", "STARLING_SECRET_A_B") == env_names("a.b")


def test_resolve_from_file(secrets_file):
    set_secret(secrets_file, "telegram-main", "file-value")
    assert "file-value" == resolve_secret("telegram-main", secrets_file)


def test_resolve_prefixed_env_beats_file(secrets_file, monkeypatch):
    set_secret(secrets_file, "telegram-main", "file-value")
    monkeypatch.setenv("STARLING_SECRET_TELEGRAM_MAIN", "prefixed-value")
    assert "prefixed-value" == resolve_secret("telegram-main", secrets_file)


def test_resolve_plain_env_beats_prefixed(secrets_file, monkeypatch):
    monkeypatch.setenv("STARLING_SECRET_TELEGRAM_MAIN", "prefixed-value")
    monkeypatch.setenv("TELEGRAM_MAIN", "plain-value")
    assert "plain-value" == resolve_secret("telegram-main", secrets_file)


def test_empty_env_counts_as_unset(secrets_file, monkeypatch):
    set_secret(secrets_file, "telegram-main", "file-value")
    monkeypatch.setenv("TELEGRAM_MAIN", "")
    assert "file-value" == resolve_secret("telegram-main", secrets_file)


def test_missing_secret_says_how_to_set_it(secrets_file):
    with pytest.raises(MissingSecret) as info:
        resolve_secret("telegram-main", secrets_file, key="gateways.telegram[0].token")
    text = str(info.value)
    assert (True, True, True, True) == (
        "TELEGRAM_MAIN" in text, "STARLING_SECRET_TELEGRAM_MAIN" in text,
        "starling secret set telegram-main --value-stdin" in text, "gateways.telegram[0].token" in text)


def test_missing_secret_attributes(secrets_file):
    with pytest.raises(MissingSecret) as info:
        resolve_secret("x-key", secrets_file, key="providers.default.api_key")
    assert ("x-key", "providers.default.api_key") == (info.value.name, info.value.key)


def test_resolved_value_is_redacted_from_logs(secrets_file):
    set_secret(secrets_file, "telegram-main", "tok-98765-value")
    stream = io.StringIO()
    value = resolve_secret("telegram-main", secrets_file)
    try:
        setup_logging("test", stream=stream).info("calling", url=f"https://x/bot{value}/getMe")
    finally:
        structlog.reset_defaults()
    assert "tok-98765-value" not in stream.getvalue()


def test_secrets_file_is_0600_json(secrets_file):
    set_secret(secrets_file, "b", "2222")
    set_secret(secrets_file, "a", "1111")
    assert (0o600, {"a": "1111", "b": "2222"}) == (
        stat.S_IMODE(os.stat(secrets_file).st_mode), json.loads(secrets_file.read_text()))


def test_set_overwrites(secrets_file):
    set_secret(secrets_file, "a", "old-value")
    set_secret(secrets_file, "a", "new-value")
    assert "new-value" == resolve_secret("a", secrets_file)


def test_set_rejects_bad_name(secrets_file):
    with pytest.raises(StarlingError):
        set_secret(secrets_file, "../etc", "sv-removable")


def test_set_rejects_empty_value(secrets_file):
    with pytest.raises(StarlingError):
        set_secret(secrets_file, "a", "")


def test_list_secret_names(secrets_file):
    set_secret(secrets_file, "zeta", "zzzz")
    set_secret(secrets_file, "alpha", "aaaa")
    assert ["alpha", "zeta"] == list_secret_names(secrets_file)


def test_list_secret_names_without_file(secrets_file):
    assert [] == list_secret_names(secrets_file)


def test_list_secrets_reports_sources(secrets_file, monkeypatch):
    set_secret(secrets_file, "telegram-main", "file-value")
    set_secret(secrets_file, "slack-bot", "file-value")
    monkeypatch.setenv("TELEGRAM_MAIN", "env-value")
    expected = [SecretInfo("openai", "missing"), SecretInfo("slack-bot", "file"), SecretInfo("telegram-main", "env")]
    assert expected == list_secrets(secrets_file, names=["openai"])


def test_remove_secret(secrets_file):
    set_secret(secrets_file, "a", "sv-removable")
    assert (True, []) == (remove_secret(secrets_file, "a"), list_secret_names(secrets_file))


def test_remove_absent_secret(secrets_file):
    assert False is remove_secret(secrets_file, "a")


def test_corrupt_json_names_file_without_contents(secrets_file):
    secrets_file.write_text('{"a": "hunter2-value",')
    with pytest.raises(StarlingError) as info:
        resolve_secret("a", secrets_file)
    assert (True, False) == (str(secrets_file) in str(info.value), "hunter2" in str(info.value))


def test_wrong_shape_names_file_without_contents(secrets_file):
    secrets_file.write_text('{"a": ["hunter2-value"]}')
    with pytest.raises(StarlingError) as info:
        list_secret_names(secrets_file)
    assert f"{secrets_file}: corrupt secrets file: expected a JSON object mapping names to string values" == str(
        info.value)


def test_session_secret_from_env(secrets_file, tmp_path, monkeypatch):
    monkeypatch.setenv("SESSION_SECRET", "env-session-secret")
    assert b"env-session-secret" == session_secret(paths_for(tmp_path, Config()))


def test_session_secret_generated_once(secrets_file, tmp_path):
    (tmp_path / "data").mkdir()
    paths = paths_for(tmp_path, Config())
    first = session_secret(paths)
    assert (first, 0o600) == (session_secret(paths), stat.S_IMODE(os.stat(paths.session_secret_file).st_mode))
