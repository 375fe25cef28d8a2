"""Tests for common.config: defaults, validation, and errors that name file, key and reason."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import msgspec
import pytest

from common.config import Config, Provider, default_config_text, load_config, referenced_secrets
from common.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def error_for(tmp_path: Path, text: str) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert path == info.value.file
    return info.value


def test_empty_file_gives_defaults(tmp_path):
    assert Config() == load_config(write(tmp_path, ""))


def test_default_config_text_loads_to_defaults(tmp_path):
    assert Config() == load_config(write(tmp_path, default_config_text()))


def _all_keys(tp: typing.Any) -> set[str]:
    keys: set[str] = set()
    for name, hint in typing.get_type_hints(tp, include_extras=True).items():
        keys.add(name)
        while typing.get_origin(hint) is typing.Annotated:
            hint = typing.get_args(hint)[0]
        for inner in (hint, *typing.get_args(hint)):
            for cls in (inner, *typing.get_args(inner)):
                if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
                    keys |= _all_keys(cls)
    return keys


def test_default_config_text_mentions_every_key():
    text = default_config_text()
    line = r"^(# )?({k} = |\[+([a-z_]+\.)*{k}(\.[a-z_]+)*\]+)"
    missing = {k for k in _all_keys(Config) if not re.search(line.format(k=k), text, re.M)}
    assert set() == missing


def test_default_config_text_gateway_examples_load(tmp_path):
    text = re.sub(r"^# (\[\[gateways|\[mcp\.|[a-z_]+ = )", r"\1", default_config_text(), flags=re.M)
    text = text.replace('phone_number_id = ""', 'phone_number_id = "1234"')
    cfg = load_config(write(tmp_path, text))
    assert ["main", "team", "phone"] == [gw.id for gw in cfg.gateways.all()]


def test_default_provider():
    expected = Provider(
        kind="openai", base_url="https://api.openai.com/v1", api_key="openai",
        model="gpt-4o-mini", context_window=128000,
    )
    assert {"default": expected} == Config().providers


def test_anthropic_provider_defaults_url_and_key_by_kind(tmp_path):
    cfg = load_config(write(tmp_path, '[providers.claude]\nkind = "anthropic"\nmodel = "m"\n'))
    provider = cfg.providers["claude"]
    assert ("https://api.anthropic.com", "anthropic") == (provider.base_url, provider.api_key)


def test_gateway_entry_takes_design_defaults(tmp_path):
    cfg = load_config(write(tmp_path, '[[gateways.telegram]]\nid = "main"\n'))
    gw = cfg.gateways.telegram[0]
    assert ("default", "telegram-main", "polling", []) == (gw.agent, gw.token, gw.mode, gw.allow)


def test_missing_file(tmp_path):
    path = tmp_path / "config.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert (path, "-", "file not found; run `starling init`") == (
        info.value.file, info.value.key, info.value.reason)


def test_str_is_file_key_reason(tmp_path):
    err = error_for(tmp_path, "[runner]\nprocesses = 0\n")
    assert f"{tmp_path / 'config.toml'}: runner.processes: expected `int` >= 1, got 0" == str(err)


def test_toml_syntax_error(tmp_path):
    err = error_for(tmp_path, "data_dir = = 1\n")
    assert ("-", True) == (err.key, err.reason.startswith("invalid TOML: ") and "line 1" in err.reason)


def test_unknown_key_names_the_key(tmp_path):
    err = error_for(tmp_path, '[control]\nlisen = "127.0.0.1:1"\n')
    assert ("control.lisen", "unknown key; expected one of: listen, allow_remote, public_url, dashboard") == (
        err.key, err.reason)


def test_unknown_top_level_key(tmp_path):
    err = error_for(tmp_path, "colour = 1\n")
    assert ("colour", True) == (err.key, err.reason.startswith("unknown key; expected one of: data_dir"))


def test_wrong_type(tmp_path):
    err = error_for(tmp_path, "[control]\nlisten = 7820\n")
    assert ("control.listen", "expected `str`, got `int`") == (err.key, err.reason)


def test_bad_literal_lists_choices(tmp_path):
    err = error_for(tmp_path, '[[gateways.telegram]]\nid = "main"\nmode = "push"\n')
    assert ("gateways.telegram[0].mode", "expected one of \"polling\" | \"webhook\", got 'push'") == (
        err.key, err.reason)


def test_missing_required_key(tmp_path):
    err = error_for(tmp_path, '[[gateways.slack]]\nagent = "default"\n')
    assert ("gateways.slack[0].id", "required key is missing") == (err.key, err.reason)


def test_error_inside_provider_names_the_provider(tmp_path):
    err = error_for(tmp_path, '[providers.a]\nmodel = "m"\n[providers.b]\nmodel = "m"\ncontext_window = 0\n')
    assert ("providers.b.context_window", "expected `int` >= 1, got 0") == (err.key, err.reason)


def test_bad_provider_name(tmp_path):
    err = error_for(tmp_path, '[providers."My Model"]\nmodel = "m"\n')
    assert ("providers.My Model", True) == (err.key, err.reason.startswith("expected an id"))


def test_bad_gateway_id(tmp_path):
    err = error_for(tmp_path, '[[gateways.telegram]]\nid = "Main"\n')
    assert ("gateways.telegram[0].id", True) == (err.key, err.reason.endswith("got 'Main'"))


def test_bad_agent_id(tmp_path):
    err = error_for(tmp_path, '[[gateways.telegram]]\nid = "main"\nagent = "../x"\n')
    assert "gateways.telegram[0].agent" == err.key


def test_duplicate_gateway_id(tmp_path):
    err = error_for(tmp_path, '[[gateways.slack]]\nid = "a"\n[[gateways.slack]]\nid = "a"\n')
    assert ("gateways.slack[1].id", "gateway id 'a' is already used by gateways.slack[0]") == (err.key, err.reason)


def test_same_id_on_two_platforms_is_refused(tmp_path):
    err = error_for(tmp_path, '[[gateways.telegram]]\nid = "a"\n[[gateways.slack]]\nid = "a"\n')
    assert ("gateways.slack[0].id", "gateway id 'a' is already used by gateways.telegram[0]") == (
        err.key, err.reason)


def test_cli_is_a_reserved_gateway_id(tmp_path):
    err = error_for(tmp_path, '[[gateways.telegram]]\nid = "cli"\n')
    assert ("gateways.telegram[0].id", True) == (err.key, "terminal" in err.reason)


def test_bad_listen(tmp_path):
    err = error_for(tmp_path, '[control]\nlisten = "localhost"\n')
    assert ("control.listen", "expected host:port, e.g. 127.0.0.1:7820, got 'localhost'") == (
        err.key, err.reason)


def test_ipv6_listen_is_accepted(tmp_path):
    assert "[::1]:7820" == load_config(write(tmp_path, '[control]\nlisten = "[::1]:7820"\n')).control.listen


@pytest.mark.parametrize("listen", ["0.0.0.0:7820", "[::]:7820", "192.0.2.10:7820", "control.example:7820"])
def test_a_non_loopback_control_listen_is_refused_without_allow_remote(tmp_path, listen):
    err = error_for(tmp_path, f'[control]\nlisten = "{listen}"\n')
    assert ("control.listen", True, True) == (err.key, "not a loopback address" in err.reason,
                                              "allow_remote = true" in err.reason)


def test_a_non_loopback_control_listen_is_taken_with_allow_remote(tmp_path):
    cfg = load_config(write(tmp_path, '[control]\nlisten = "0.0.0.0:7820"\nallow_remote = true\n'))
    assert ("0.0.0.0:7820", True) == (cfg.control.listen, cfg.control.allow_remote)


@pytest.mark.parametrize("listen", ["127.0.0.1:7820", "127.8.9.10:1", "localhost:7820", "[::1]:7820"])
def test_loopback_control_listens_need_no_allow_remote(tmp_path, listen):
    assert listen == load_config(write(tmp_path, f'[control]\nlisten = "{listen}"\n')).control.listen


def test_secret_value_in_config_is_not_echoed(tmp_path):
    err = error_for(tmp_path, '[[gateways.telegram]]\nid = "main"\ntoken = "123456:AAbbCCdd"\n')
    assert ("gateways.telegram[0].token", False) == (err.key, "AAbbCCdd" in str(err))


def test_max_context_ratio_above_one(tmp_path):
    err = error_for(tmp_path, "[conversation]\nmax_context_ratio = 1.5\n")
    assert ("conversation.max_context_ratio", "expected `float` <= 1.0, got 1.5") == (err.key, err.reason)


def test_max_context_ratio_zero(tmp_path):
    err = error_for(tmp_path, "[conversation]\nmax_context_ratio = 0.0\n")
    assert "conversation.max_context_ratio" == err.key


def test_runner_processes_upper_bound(tmp_path):
    err = error_for(tmp_path, "[runner]\nprocesses = 65\n")
    assert ("runner.processes", "expected `int` <= 64, got 65") == (err.key, err.reason)


def test_retention_days_at_least_one(tmp_path):
    err = error_for(tmp_path, "[retention]\naudit_days = 0\n")
    assert "retention.audit_days" == err.key


def test_reset_boundary_hour_range(tmp_path):
    err = error_for(tmp_path, "[session_memory.reset]\nboundary_hour = 24\n")
    assert ("session_memory.reset.boundary_hour", "expected `int` <= 23, got 24") == (err.key, err.reason)


def test_webhook_mode_needs_public_url(tmp_path):
    err = error_for(tmp_path, '[[gateways.telegram]]\nid = "main"\nmode = "webhook"\n')
    assert ("gateways.telegram[0].public_url", 'required when mode = "webhook"') == (err.key, err.reason)


def test_bus_endpoint_scheme(tmp_path):
    err = error_for(tmp_path, '[bus]\nwriter_endpoint = "http://x"\n')
    assert "bus.writer_endpoint" == err.key


def test_alert_to_must_name_a_gateway(tmp_path):
    err = error_for(tmp_path, '[health]\nalert_to = "ops:42"\n')
    assert ("health.alert_to", "no gateway with id 'ops'") == (err.key, err.reason)


def test_alert_to_format(tmp_path):
    err = error_for(tmp_path, '[health]\nalert_to = "ops"\n')
    assert ("health.alert_to", 'expected "instance:chat"') == (err.key, err.reason)


def test_referenced_secrets_name_their_keys(tmp_path):
    cfg = load_config(write(tmp_path, '[[gateways.telegram]]\nid = "main"\ntoken = "tg"\n'))
    found = referenced_secrets(cfg)
    assert ("providers.default.api_key", "gateways.telegram[0].token") == (found["openai"], found["tg"])


def test_allow_accepts_numeric_ids_as_text(tmp_path):
    cfg = load_config(write(tmp_path, '[[gateways.telegram]]\nid = "main"\nallow = [12345, "678"]\n'))
    assert ["12345", "678"] == cfg.gateways.telegram[0].allow


def test_gateway_listen_is_checked(tmp_path):
    err = error_for(tmp_path, '[[gateways.slack]]\nid = "team"\nlisten = "7831"\n')
    assert "gateways.slack[0].listen" == err.key


def test_a_pasted_api_key_is_refused_without_echoing_it(tmp_path):
    value = "sk-proj-AbCdEf0123456789AbCdEf0123456789"
    err = error_for(tmp_path, f'[providers.default]\nkind = "openai"\nmodel = "m"\napi_key = "{value}"\n')
    assert ("providers.default.api_key", False, True) == (err.key, value in str(err), "name" in err.reason)


def test_ordinary_secret_names_are_accepted(tmp_path):
    cfg = load_config(write(tmp_path, '[providers.default]\nmodel = "m"\napi_key = "openrouter-key-2"\n'))
    assert "openrouter-key-2" == cfg.providers["default"].api_key
