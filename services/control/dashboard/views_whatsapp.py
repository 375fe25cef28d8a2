"""WhatsApp linking in the browser: the QR code (or pair code) that `starling whatsapp link` is showing,
read from the file it keeps while it runs (common/whatsapp_qr.py), and a button that runs that same command
for an instance (a process of its own: the control service imports no gateway). Admins only: the code
links a phone to this Starling."""

from __future__ import annotations

import asyncio
import os
import sys
import time

from aiohttp import web

from common import whatsapp_qr
from services.control.dashboard.app import SESSION, Dashboard

LINK_TIMEOUT_S = 180


def _instances(d: Dashboard) -> list[str]:
    return [gw.id for gw in d.deps.config().gateways.whatsapp if gw.mode == "linked"]


def _admin_only(d: Dashboard, request: web.Request) -> web.Response | None:
    if request[SESSION].role != "admin":
        return d.plain(request, 403, "Only an admin may see a linking code: it links a phone to this Starling.")
    return None


def _state(d: Dashboard, instance: str) -> dict:
    shown = whatsapp_qr.read(d.deps.paths, instance)
    proc = d.links.get(instance)
    running = proc is not None and proc.returncode is None
    return {"instance": instance, "kind": shown["kind"] if shown else "", "pair": shown["code"]
            if shown and shown["kind"] == "pair" else "", "since": shown["at"] if shown else 0,
            "running": running, "exit": None if proc is None or running else proc.returncode,
            "output": _output(d, instance)}


def _output_file(d: Dashboard, instance: str):
    return d.deps.paths.run_dir / f"whatsapp-link-{instance}.out"


def _output(d: Dashboard, instance: str) -> str:
    """The command's last words, without its terminal QR drawing."""
    try:
        text = _output_file(d, instance).read_text(errors="replace")
    except OSError:
        return ""
    lines = [line for line in text.splitlines() if line.strip() and not set(line) <= set(" █▀▄")]
    return "\n".join(lines[-6:])


async def whatsapp(d: Dashboard, request: web.Request) -> web.StreamResponse:
    if (refused := _admin_only(d, request)) is not None:
        return refused
    states = [_state(d, instance) for instance in _instances(d)]
    return d.render(request, "whatsapp.html", states=states, stamp=int(time.time()))


async def state(d: Dashboard, request: web.Request) -> web.StreamResponse:
    if (refused := _admin_only(d, request)) is not None:
        return refused
    instance = request.query.get("instance", "")
    if instance not in _instances(d):
        raise web.HTTPNotFound()
    return web.json_response(_state(d, instance), headers={"Cache-Control": "no-store"})


async def qr(d: Dashboard, request: web.Request) -> web.StreamResponse:
    if (refused := _admin_only(d, request)) is not None:
        return refused
    instance = request.query.get("instance", "")
    shown = whatsapp_qr.read(d.deps.paths, instance) if instance in _instances(d) else None
    if shown is None or shown["kind"] != "qr":
        raise web.HTTPNotFound()
    drawing = whatsapp_qr.svg(shown["code"])
    if drawing is None:
        return web.Response(status=501, text="segno is not installed (pip install -e '.[whatsapp-linked]')")
    return web.Response(text=drawing, content_type="image/svg+xml", headers={"Cache-Control": "no-store"})


async def link(d: Dashboard, request: web.Request) -> web.StreamResponse:
    form = await request.post()
    instance = str(form.get("instance", ""))
    if instance not in _instances(d):
        return d.plain(request, 400, f"no [[gateways.whatsapp]] with mode = \"linked\" and id {instance[:64]!r}")
    proc = d.links.get(instance)
    if proc is not None and proc.returncode is None:
        return d.done(request, "/whatsapp", f"Linking {instance} is running already: scan the code below.")
    out = open(_output_file(d, instance), "wb")
    try:
        d.links[instance] = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "common.cli", "--home", str(d.deps.paths.home), "whatsapp", "link", instance,
            "--timeout", str(LINK_TIMEOUT_S), stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    finally:
        out.close()
    await d.audit(request, "whatsapp.link_started", instance)
    return d.done(request, "/whatsapp", f"Linking {instance}: the code shows below within seconds.")


ROUTES = [
    ("GET", "/whatsapp", whatsapp, "view"),
    ("GET", "/whatsapp/state", state, "view"),
    ("GET", "/whatsapp/qr.svg", qr, "view"),
    ("POST", "/whatsapp/link", link, "change"),
]
