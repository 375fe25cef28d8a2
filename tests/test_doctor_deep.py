"""`starling doctor --deep`: one live call to each model and each gateway's API, against the fakes in tests/."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import pytest

from common.cli.main import main
from common.config import default_config_text
from common.secrets import set_secret
from tests.fake_models import FakeModels
from tests.fake_slack import DEFAULT_APP_TOKEN, DEFAULT_BOT_TOKEN, FakeSlack
from tests.fake_telegram import DEFAULT_TOKEN as TELEGRAM_TOKEN
from tests.fake_telegram import FakeTelegram
from tests.fake_whatsapp import DEFAULT_PHONE_NUMBER_ID, FakeWhatsApp
from tests.fake_whatsapp import DEFAULT_TOKEN as WHATSAPP_TOKEN
from tests.procs import REPO

SECRET_VARS = ("OPENAI", "ANTHROPIC", "TELEGRAM_MAIN", "SLACK_BOT", "SLACK_APP", "WHATSAPP_TOKEN")


@pytest.fixture
def root(capsys, monkeypatch) -> Path:
    for var in SECRET_VARS:
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(f"STARLING_SECRET_{var}", raising=False)
    root = Path(tempfile.mkdtemp(prefix="st", dir="/tmp"))
    assert 0 == main(["--home", str(root), "init"])
    capsys.readouterr()
    yield root
    shutil.rmtree(root, ignore_errors=True)


def config(models_url: str, anthropic_url: str, tg: str, slack: str, wa: str) -> str:
    base = default_config_text().replace('base_url = "https://api.openai.com/v1"', f'base_url = "{models_url}"')
    return base + f"""
[providers.claude]
kind = "anthropic"
base_url = "{anthropic_url}"
api_key = "anthropic"
model = "claude-test"

[[gateways.telegram]]
id = "main"
api_base = "{tg}"

[[gateways.slack]]
id = "team"
api_base = "{slack}"

[[gateways.whatsapp]]
id = "phone"
phone_number_id = "{DEFAULT_PHONE_NUMBER_ID}"
api_base = "{wa}"
"""


def set_secrets(root: Path, **values: str) -> None:
    for name, value in values.items():
        set_secret(root / "data/secrets.json", name.replace("_", "-"), value)


GOOD = {"openai": "sk-good-openai-key", "anthropic": "sk-ant-good", "telegram_main": TELEGRAM_TOKEN,
        "slack_bot": DEFAULT_BOT_TOKEN, "slack_app": DEFAULT_APP_TOKEN, "slack_signing": "x",
        "whatsapp_token": WHATSAPP_TOKEN, "whatsapp_app_secret": "s", "whatsapp_verify": "v"}


async def deep(root: Path) -> tuple[int, dict]:
    """`starling doctor --deep --json` as a process of its own, while the fakes serve in this event loop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "common.cli", "--home", str(root), "doctor", "--deep", "--json", cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 50)
    try:
        return proc.returncode, json.loads(out)
    except ValueError:
        raise AssertionError(f"doctor printed no JSON (exit {proc.returncode}): {out[-2000:]!r} {err[-2000:]!r}") from None


def deep_checks(report: dict) -> dict[str, tuple[str, str]]:
    return {c["reason"].split(":", 1)[0]: (c["status"], c["reason"]) for c in report["checks"]
            if c["name"] in ("model", "gateway")}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_deep_tries_each_model_and_each_gateway_api(root):
    async def go():
        async with FakeModels() as models, FakeTelegram() as tg, FakeSlack() as sl, FakeWhatsApp() as wa:
            (root / "config.toml").write_text(config(models.openai_url, models.anthropic_url, tg.url,
                                                     sl.api_base, wa.api_base))
            set_secrets(root, **GOOD)
            rc, report = await deep(root)
            sent = [(r["api"], r["body"].get("max_tokens")) for r in models.requests]
            return rc, deep_checks(report), sorted(sent, key=str), [r["method"] for r in tg.requests()]
    rc, checks, sent, tg_methods = run(go())
    assert (0, ["ok"] * 5, [("anthropic", 1), ("openai", 1)], ["getMe"]) == (
        rc, [s for s, _ in checks.values()], sent, tg_methods), checks
    assert (True, True, True) == ("@" in checks["telegram main"][1],
                                  "the app token opens Socket Mode" in checks["slack team"][1],
                                  "phone number" in checks["whatsapp phone"][1])


def test_deep_fails_each_rejected_key_and_never_prints_one(root, capsys):
    async def go():
        async with FakeModels() as models, FakeTelegram() as tg, FakeSlack() as sl, FakeWhatsApp() as wa:
            (root / "config.toml").write_text(config(models.openai_url, models.anthropic_url, tg.url,
                                                     sl.api_base, wa.api_base))
            set_secrets(root, **{**GOOD, "telegram_main": "999:wrong-telegram-token-value",
                                 "slack_bot": "xoxb-wrong-slack-token-value",
                                 "whatsapp_token": "EAAwrongwhatsapptokenvalue"})
            return await deep(root)
    rc, report = run(go())
    checks = deep_checks(report)
    text = json.dumps(report)
    assert (1, "fail", "fail", "fail") == (rc, checks["telegram main"][0], checks["slack team"][0],
                                           checks["whatsapp phone"][0]), checks
    assert (True, True, False, False, False) == (
        "HTTP 401" in checks["telegram main"][1], "invalid_auth" in checks["slack team"][1],
        "wrong-telegram-token-value" in text, "xoxb-wrong" in text, "EAAwrong" in text)


def test_a_model_that_refuses_the_key_fails_with_its_status(root):
    async def go():
        async with FakeModels([{"status": 401, "message": "Incorrect API key provided", "api": "openai"}]) as models:
            (root / "config.toml").write_text(default_config_text().replace(
                'base_url = "https://api.openai.com/v1"', f'base_url = "{models.openai_url}"'))
            set_secrets(root, openai="sk-rejected-key-value")
            return await deep(root)
    rc, report = run(go())
    [(status, reason)] = deep_checks(report).values()
    assert (1, "fail", True, True, False) == (rc, status, "HTTP 401" in reason, "Incorrect API key" in reason,
                                              "sk-rejected-key-value" in json.dumps(report))


def test_a_local_model_without_a_key_is_tried_without_an_auth_header(root):
    async def go():
        async with FakeModels(keyless=True) as models:
            (root / "config.toml").write_text(default_config_text().replace(
                'base_url = "https://api.openai.com/v1"', f'base_url = "{models.openai_url}"'))
            rc, report = await deep(root)
            return rc, report, [r["headers"].get("authorization") for r in models.requests]
    rc, report, auth = run(go())
    assert (0, [("ok", True)], [None]) == (rc, [(s, "answered" in r) for s, r in deep_checks(report).values()], auth)


def test_an_unreachable_model_fails_saying_so(root):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (root / "config.toml").write_text(default_config_text().replace(
        'base_url = "https://api.openai.com/v1"', f'base_url = "http://127.0.0.1:{port}/v1"'))

    async def go():
        return await deep(root)
    rc, report = run(go())
    [(status, reason)] = deep_checks(report).values()
    assert (1, "fail", True) == (rc, status, "cannot connect" in reason)


def test_deep_fails_a_socket_mode_app_token_slack_refuses(root):
    async def go():
        async with FakeModels() as models, FakeSlack() as sl:
            (root / "config.toml").write_text(default_config_text().replace(
                'base_url = "https://api.openai.com/v1"', f'base_url = "{models.openai_url}"')
                + f'\n[[gateways.slack]]\nid = "team"\napi_base = "{sl.api_base}"\n')
            set_secrets(root, openai="sk-good", slack_bot=DEFAULT_BOT_TOKEN, slack_app="xapp-1-wrong-app-token")
            return await deep(root)
    rc, report = run(go())
    status, reason = deep_checks(report)["slack team"]
    assert (1, "fail", True, True) == (rc, status, "auth.test: bot" in reason, "apps.connections.open" in reason)
