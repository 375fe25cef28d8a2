"""The dashboard: Starling run from a browser, served by the control service at / (services/control/main.py
installs it). Server-rendered pages (aiohttp, Jinja2 templates in templates/), a little plain JavaScript in
static/ for the live parts (the log tail over Server-Sent Events, the linking QR code), nothing from a CDN.

No account, no page: every route but /login, /setup and /static needs a session (auth.py); the API under
/api/ stays token-only and knows nothing of sessions. Writes go where the CLI's go (the writer, the
secrets file, the persona packs), with the same checks and words, and each is audited with the account."""

from __future__ import annotations

from aiohttp import web

from services.control.dashboard import (
    views_config, views_logs, views_ops, views_status, views_talk, views_whatsapp,
)
from services.control.dashboard.app import HERE, Dashboard, Deps

__all__ = ["Dashboard", "Deps", "install"]


def install(app: web.Application, deps: Deps) -> Dashboard:
    """Add the dashboard's routes to the control service's application."""
    dashboard = Dashboard(deps)
    for module in (views_status, views_talk, views_ops, views_config, views_logs, views_whatsapp):
        for method, path, handler, kind in module.ROUTES:
            app.router.add_route(method, path, dashboard.guarded(handler, kind))
    for method, path, handler in views_status.PUBLIC:
        app.router.add_route(method, path, _public(dashboard, handler))
    app.router.add_static("/static/", HERE / "static")
    return dashboard


def _public(dashboard: Dashboard, handler):
    async def page(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(dashboard, request)
        except web.HTTPException:
            raise
        except Exception as exc:  # noqa: BLE001 - never a stack trace in a page
            return dashboard.failure(request, exc)

    return page
