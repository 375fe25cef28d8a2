"""One small live call to each outside service a home depends on, for `starling doctor --deep`: a one-token
model answer per provider, Telegram's getMe, Slack's auth.test, the WhatsApp Cloud API's phone number.

Each probe returns a Probe (ok or not, and a one-line reason a person can act on); none raises for an
answer it does not like. Secret values are resolved here, sent only in the headers or the URL path the
platform wants, and scrubbed (with the log redactor) from every reason, which never quotes a URL that
holds a token.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from common.config import Config, Provider, Slack, Telegram, WhatsApp, is_local_url
from common.errors import MissingSecret, StarlingError
from common.log import redact
from common.secrets import resolve_secret

TIMEOUT_S = 15.0
NO_KEY = "none"  # a key whose value is this sends no auth header (as the runner's providers)
ANTHROPIC_VERSION = "2023-06-01"  # the Messages API version the runner speaks
_MAX_TEXT = 200


@dataclass(frozen=True)
class Probe:
    name: str  # "model default", "telegram main", ...
    ok: bool
    reason: str


class _Skip(Exception):
    """The probe cannot be made (a secret is missing); the reason says why."""


class _Failed(Exception):
    """The call was made and did not work; the reason says how."""


def _secret(name: str, secrets_file: Path, key: str) -> str:
    try:
        return resolve_secret(name, secrets_file, key=key).strip()
    except MissingSecret:
        raise _Skip(f"secret {name!r} ({key}) is not set") from None
    except StarlingError as exc:
        raise _Skip(str(exc)) from None


def _server_text(body: Any, raw: bytes) -> str:
    """The error message an API put in its answer (OpenAI, Anthropic, Graph: error.message; Slack: error)."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("description"):  # Telegram
            return str(body["description"])
    return " ".join(raw[:300].decode("utf-8", "replace").split())


def _short(text: str) -> str:
    text = redact(text)
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 1] + "…"


async def _call(session: aiohttp.ClientSession, method: str, url: str, what: str, **kw: Any) -> tuple[int, Any, bytes]:
    """(status, JSON body or None, raw body); no answer (refused, timed out) raises _Failed."""
    try:
        async with session.request(method, url, timeout=aiohttp.ClientTimeout(total=TIMEOUT_S), **kw) as resp:
            raw = await resp.content.read(1024 * 1024)
            status = resp.status
    except asyncio.TimeoutError:
        raise _Failed(f"{what}: no answer within {TIMEOUT_S:.0f} s") from None
    except aiohttp.ClientError as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise _Failed(f"{what}: cannot connect ({reason})") from None
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    return status, body, raw


# ------------------------------------------------------------------ the model


def model_request(provider: Provider, key: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(url, headers, body) of the smallest answer a provider gives: one token."""
    base = provider.base_url.rstrip("/")
    prompt = [{"role": "user", "content": "Reply with OK."}]
    headers = {"content-type": "application/json"}
    if provider.kind == "anthropic":
        url = f"{base}/messages" if base.endswith("/v1") else f"{base}/v1/messages"
        headers["anthropic-version"] = ANTHROPIC_VERSION
        if key:
            headers["x-api-key"] = key
        return url, headers, {"model": provider.model, "max_tokens": 1, "messages": prompt}
    body: dict[str, Any] = {"model": provider.model, "messages": prompt}
    # api.openai.com's reasoning models refuse max_tokens; every other server takes it
    body["max_completion_tokens" if "//api.openai.com" in base else "max_tokens"] = 1
    if key:
        headers["authorization"] = f"Bearer {key}"
    return f"{base}/chat/completions", headers, body


async def probe_model(session: aiohttp.ClientSession, name: str, provider: Provider, secrets_file: Path) -> Probe:
    label = f"model {name}"
    try:
        try:
            key = _secret(provider.api_key, secrets_file, f"providers.{name}.api_key")
        except _Skip:
            if not is_local_url(provider.base_url):
                raise
            key = ""  # a local server: no key, no auth header
        key = "" if key.lower() == NO_KEY else key
        url, headers, body = model_request(provider, key)
        status, answer, raw = await _call(session, "POST", url, f"{provider.base_url}", json=body, headers=headers)
    except _Skip as exc:
        return Probe(label, False, f"not tried: {exc}")
    except _Failed as exc:
        return Probe(label, False, str(exc))
    if status == 200 and isinstance(answer, dict) and ("choices" in answer or "content" in answer):
        return Probe(label, True, f"{provider.model} at {provider.base_url} answered")
    return Probe(label, False, f"{provider.model} at {provider.base_url}: HTTP {status}: {_short(_server_text(answer, raw))}")


# ------------------------------------------------------------------ the platforms


async def probe_telegram(session: aiohttp.ClientSession, index: int, gw: Telegram, secrets_file: Path) -> Probe:
    label = f"telegram {gw.id}"
    try:
        token = _secret(gw.token, secrets_file, f"gateways.telegram[{index}].token")
        status, body, raw = await _call(session, "GET", f"{gw.api_base.rstrip('/')}/bot{token}/getMe",
                                        f"{gw.api_base} getMe")
    except _Skip as exc:
        return Probe(label, False, f"not tried: {exc}")
    except _Failed as exc:
        return Probe(label, False, str(exc))
    if status == 200 and isinstance(body, dict) and body.get("ok"):
        username = (body.get("result") or {}).get("username") or "?"
        return Probe(label, True, f"getMe: the bot is @{username}")
    return Probe(label, False, f"getMe: HTTP {status}: {_short(_server_text(body, raw))}"
                               + (" (check the token)" if status in (401, 404) else ""))


async def probe_slack(session: aiohttp.ClientSession, index: int, gw: Slack, secrets_file: Path) -> Probe:
    label = f"slack {gw.id}"
    try:
        token = _secret(gw.bot_token, secrets_file, f"gateways.slack[{index}].bot_token")
        status, body, raw = await _call(session, "POST", f"{gw.api_base.rstrip('/')}/auth.test",
                                        f"{gw.api_base} auth.test", headers={"authorization": f"Bearer {token}"})
    except _Skip as exc:
        return Probe(label, False, f"not tried: {exc}")
    except _Failed as exc:
        return Probe(label, False, str(exc))
    if not (status == 200 and isinstance(body, dict) and body.get("ok")):
        return Probe(label, False, f"auth.test: HTTP {status}: {_short(_server_text(body, raw))}")
    said = f"auth.test: bot {body.get('user') or '?'} in workspace {body.get('team') or '?'}"
    if gw.mode != "socket":
        return Probe(label, True, said)
    try:  # Socket Mode's app-level token: a connection URL is asked for and not used (it expires unused)
        app_token = _secret(gw.app_token, secrets_file, f"gateways.slack[{index}].app_token")
        status, body, raw = await _call(session, "POST", f"{gw.api_base.rstrip('/')}/apps.connections.open",
                                        f"{gw.api_base} apps.connections.open",
                                        headers={"authorization": f"Bearer {app_token}"})
    except _Skip as exc:
        return Probe(label, False, f"{said}; Socket Mode not tried: {exc}")
    except _Failed as exc:
        return Probe(label, False, f"{said}; {exc}")
    if status == 200 and isinstance(body, dict) and body.get("ok"):
        return Probe(label, True, f"{said}; the app token opens Socket Mode")
    return Probe(label, False, f"{said}; apps.connections.open (the app token): HTTP {status}:"
                               f" {_short(_server_text(body, raw))}")


async def probe_whatsapp(session: aiohttp.ClientSession, index: int, gw: WhatsApp, paths_whatsapp: Path,
                         secrets_file: Path) -> Probe:
    label = f"whatsapp {gw.id}"
    if gw.mode == "linked":  # no API to ask: the session is what there is to check
        if (paths_whatsapp / gw.id / "check.enc").exists():
            return Probe(label, True, "linked mode: a session is stored (the gateway connects with it)")
        return Probe(label, False, f"linked mode: not linked yet: `starling whatsapp link {gw.id}`")
    try:
        token = _secret(gw.access_token, secrets_file, f"gateways.whatsapp[{index}].access_token")
        status, body, raw = await _call(
            session, "GET", f"{gw.api_base.rstrip('/')}/{gw.phone_number_id}", f"{gw.api_base} phone number",
            params={"fields": "display_phone_number,verified_name"}, headers={"authorization": f"Bearer {token}"})
    except _Skip as exc:
        return Probe(label, False, f"not tried: {exc}")
    except _Failed as exc:
        return Probe(label, False, str(exc))
    if status == 200 and isinstance(body, dict) and body.get("id"):
        number = body.get("display_phone_number") or body["id"]
        return Probe(label, True, f"phone number {number}" + (f" ({body['verified_name']})"
                                                               if body.get("verified_name") else ""))
    return Probe(label, False, f"phone number {gw.phone_number_id}: HTTP {status}: {_short(_server_text(body, raw))}")


async def probe_all(cfg: Config, secrets_file: Path, whatsapp_dir: Path) -> list[Probe]:
    """Every probe of this config at once: each provider, then each gateway instance."""
    async with aiohttp.ClientSession() as session:
        calls = [probe_model(session, name, p, secrets_file) for name, p in cfg.providers.items()]
        calls += [probe_telegram(session, i, gw, secrets_file) for i, gw in enumerate(cfg.gateways.telegram)]
        calls += [probe_slack(session, i, gw, secrets_file) for i, gw in enumerate(cfg.gateways.slack)]
        calls += [probe_whatsapp(session, i, gw, whatsapp_dir, secrets_file)
                  for i, gw in enumerate(cfg.gateways.whatsapp)]
        return list(await asyncio.gather(*calls))
