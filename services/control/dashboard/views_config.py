"""Agents (persona files shown and edited with a dated backup first, skills, the agent's settings) and
Secrets (names and where each resolves from; set, replace or remove a value). A secret's value is never
sent back to the browser, never put in a message, a log line or the audit; a form that fails is shown
again empty."""

from __future__ import annotations

import asyncio
import os
import re

from aiohttp import web

from common import persona_files
from common.config import SECRET_NAME_PATTERN, referenced_secrets
from common.errors import ConfigError, InvalidInput, StarlingError
from common.personas import PACK_FILES, SKILLS_DIR, list_packs, load_settings, load_skills_file
from common.secrets import env_names, list_secrets, remove_secret, set_secret
from services.control.dashboard.app import Dashboard

SOURCE_TEXT = {"env": "environment", "file": "secrets.json", "missing": "missing"}
SECRET_NAME_RULE = "expected 1-64 characters of A-Z a-z 0-9 _ . -, starting with a letter or digit"


# ------------------------------------------------------------------ agents


async def agents(d: Dashboard, request: web.Request) -> web.StreamResponse:
    packs = await asyncio.to_thread(list_packs, d.deps.paths)
    return d.render(request, "agents.html", packs=packs)


def _agent_page(d: Dashboard, request: web.Request, agent: str, status: int = 200, error: str = "",
                draft: tuple[str, str] | None = None) -> web.Response:
    pack = persona_files.pack_of(d.deps.paths, agent)
    files = []
    for name in PACK_FILES:
        path = pack / name
        text = path.read_text("utf-8", "replace") if path.is_file() else ""
        if draft is not None and draft[0] == name:
            text = draft[1]  # what the person typed, kept so a failed save loses nothing
        files.append({"name": name, "text": text, "exists": path.is_file(),
                      "editable": name in persona_files.EDITABLE})
    try:
        settings, settings_error = load_settings(pack), ""
    except ConfigError as exc:
        settings, settings_error = None, str(exc)
    try:
        listed, skills_error = load_skills_file(pack).skills, ""
    except ConfigError as exc:
        listed, skills_error = [], str(exc)
    folder = pack / SKILLS_DIR
    skills = sorted(p.parent.name for p in folder.glob("*/SKILL.md")) if folder.is_dir() else []
    return d.render(request, "agent.html", status=status, error=error, agent=agent, files=files,
                    settings=settings, settings_error=settings_error, skills=skills, listed=listed,
                    skills_error=skills_error)


async def agent(d: Dashboard, request: web.Request) -> web.StreamResponse:
    try:
        return _agent_page(d, request, request.match_info["id"])
    except InvalidInput as exc:
        return d.plain(request, 404, str(exc))


async def agent_save(d: Dashboard, request: web.Request) -> web.StreamResponse:
    agent_id = request.match_info["id"]
    form = await request.post()
    name, text = str(form.get("file", "")), str(form.get("text", ""))
    try:
        copy = await asyncio.to_thread(persona_files.save, d.deps.paths, agent_id, name, text)
    except InvalidInput as exc:
        try:
            return _agent_page(d, request, agent_id, 400, str(exc), draft=(name, text))
        except InvalidInput:
            return d.plain(request, 404, str(exc))
    await d.audit(request, "agent.file_saved", f"{agent_id}/{name}", bytes=len(text.encode()),
                  backup=copy.name if copy else "")
    kept = f"; the previous version is kept as {copy.name}" if copy else ""
    return d.done(request, f"/agents/{agent_id}", f"Saved {name} of agent {agent_id}{kept}.")


# ------------------------------------------------------------------ secrets


def _secrets_page(d: Dashboard, request: web.Request, status: int = 200, error: str = "") -> web.Response:
    used = referenced_secrets(d.deps.config())
    rows = [{"name": i.name, "source": SOURCE_TEXT[i.source], "used_by": used.get(i.name, ""),
             "shadowed": i.source == "env"} for i in list_secrets(d.deps.paths.secrets_file, used)]
    return d.render(request, "secrets.html", status=status, error=error, rows=rows)


async def secrets_page(d: Dashboard, request: web.Request) -> web.StreamResponse:
    try:
        return _secrets_page(d, request)
    except StarlingError as exc:  # a corrupt secrets.json: its message never quotes the file
        return d.plain(request, 500, str(exc))


def _name(form) -> str:
    name = str(form.get("name", "")).strip()
    if not re.match(SECRET_NAME_PATTERN, name):
        # the CLI's rule, without repeating what was typed (it may be the value, pasted in the wrong field)
        raise InvalidInput(f"invalid secret name: {SECRET_NAME_RULE}")
    return name


async def secret_set(d: Dashboard, request: web.Request) -> web.StreamResponse:
    form = await request.post()
    value = str(form.get("value", ""))
    try:
        name = _name(form)
        if not value:
            raise InvalidInput(f"secret {name!r}: refusing to store an empty value")
        await asyncio.to_thread(set_secret, d.deps.paths.secrets_file, name, value)
    except (InvalidInput, StarlingError) as exc:
        return _secrets_page(d, request, 400, str(exc))
    del value, form
    await d.audit(request, "secret.set", name)  # the name only
    shadow = next((var for var in env_names(name) if _env(var)), "")
    note = f" ${shadow} is set in the control service's environment and wins over secrets.json." if shadow else ""
    return d.done(request, "/secrets", f"Stored secret {name!r} in secrets.json.{note}")


def _env(var: str) -> bool:
    return bool(os.environ.get(var))


async def secret_remove(d: Dashboard, request: web.Request) -> web.StreamResponse:
    form = await request.post()
    try:
        name = _name(form)
        if not await asyncio.to_thread(remove_secret, d.deps.paths.secrets_file, name):
            raise InvalidInput(f"no secret {name!r} in {d.deps.paths.secrets_file}")
    except (InvalidInput, StarlingError) as exc:
        return _secrets_page(d, request, 400, str(exc))
    await d.audit(request, "secret.removed", name)
    used = referenced_secrets(d.deps.config()).get(name)
    note = f" Config key {used} still refers to {name!r}." if used else ""
    return d.done(request, "/secrets", f"Removed secret {name!r} from secrets.json.{note}")


ROUTES = [
    ("GET", "/agents", agents, "view"),
    ("GET", "/agents/{id}", agent, "view"),
    ("POST", "/agents/{id}/save", agent_save, "change"),
    ("GET", "/secrets", secrets_page, "view"),
    ("POST", "/secrets/set", secret_set, "change"),
    ("POST", "/secrets/remove", secret_remove, "change"),
]
