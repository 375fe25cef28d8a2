"""The pages where an operator decides: Approvals (approve once or always, deny; history), Access (pairing
codes approved or refused, allowed senders revoked) and Cron (jobs added, edited, enabled, disabled,
removed; next fires; run history). Each change goes through the writer as the CLI's does, checked with the
same rules and worded with the same messages, and is audited with the account's name."""

from __future__ import annotations

import time

from aiohttp import web

from common import cron
from common.errors import InvalidInput
from common.personas import list_packs
from common.stores import access_store, approval_store, cron_store, session_store
from common.stores import dashboard_views_store as views
from schema import messages as m
from services.control.dashboard.app import SESSION, Dashboard, FormError

RUNS_SHOWN = 30


def _by(request: web.Request) -> str:
    return f"dashboard:{request[SESSION].username}"


# ------------------------------------------------------------------ approvals


def _approvals_page(d: Dashboard, request: web.Request, status: int = 200, error: str = "") -> web.Response:
    with d.deps.read() as conn:
        pending = []
        for a in approval_store.pending(conn):
            session = session_store.get(conn, a.session_id) if a.session_id else None
            pending.append({"a": a, "chat": f"{session.instance}:{session.chat}" if session else "-"})
        decided = views.decided_approvals(conn)
    return d.render(request, "approvals.html", status=status, error=error, pending=pending, decided=decided)


async def approvals(d: Dashboard, request: web.Request) -> web.StreamResponse:
    return _approvals_page(d, request)


async def decide(d: Dashboard, request: web.Request) -> web.StreamResponse:
    form = await request.post()
    approval_id = str(form.get("id", "")).strip().upper()[:64]
    decision = str(form.get("decision", ""))
    if decision not in ("once", "always", "deny"):
        return _approvals_page(d, request, 400, f"decision must be once, always or deny, not {decision[:20]!r}")
    with d.deps.read() as conn:
        approval = approval_store.get(conn, approval_id)
    if approval is None:
        return _approvals_page(d, request, 400, f"no approval {approval_id}; see the list below")
    approve, always = decision != "deny", decision == "always"
    try:
        await d.write(m.DecideApproval(approval_id=approval_id, approve=approve, decided_by=_by(request),
                                       always=always, grant_pattern=approval.arguments if always else ""),
                      f"approval {approval_id}")
    except FormError as exc:
        return _approvals_page(d, request, 400, str(exc))
    await d.audit(request, "approval.approved" if approve else "approval.denied", approval_id, always=always,
                  agent=approval.agent, tool=approval.tool)
    return d.done(request, "/approvals", f"{'Approved' if approve else 'Denied'} {approval_id}"
                                         f"{' (always)' if always else ''} ({approval.agent}: {approval.tool}).")


# ------------------------------------------------------------------ access


def _access_page(d: Dashboard, request: web.Request, status: int = 200, error: str = "") -> web.Response:
    now = time.time()
    with d.deps.read() as conn:
        codes = access_store.pending(conn, now)
        allowed = access_store.allowed(conn)
    cfg = d.deps.config()
    configured = [(platform, gw.id, list(gw.allow)) for platform in ("telegram", "slack", "whatsapp")
                  for gw in getattr(cfg.gateways, platform) if gw.allow]
    return d.render(request, "access.html", status=status, error=error, codes=codes, allowed=allowed,
                    configured=configured)


async def access(d: Dashboard, request: web.Request) -> web.StreamResponse:
    return _access_page(d, request)


async def pairing(d: Dashboard, request: web.Request) -> web.StreamResponse:
    form = await request.post()
    code = str(form.get("code", "")).strip().upper()[:32]
    approve = request.match_info["action"] == "approve"
    op = (m.ApprovePairing(code=code, approved_by=_by(request)) if approve
          else m.RefusePairing(code=code, refused_by=_by(request)))
    try:
        await d.write(op, f"pairing {code}")
    except FormError as exc:
        return _access_page(d, request, 400, str(exc))
    await d.audit(request, "pairing.approved" if approve else "pairing.refused", code)
    return d.done(request, "/access", f"Approved {code}: its sender may now talk to the agent." if approve
                  else f"Refused {code}: its sender is not let in (they may ask again later).")


async def revoke(d: Dashboard, request: web.Request) -> web.StreamResponse:
    form = await request.post()
    instance, sender = str(form.get("instance", ""))[:64], str(form.get("sender", ""))[:200]
    try:
        await d.write(m.RevokeSender(instance=instance, sender=sender, revoked_by=_by(request)), "revoke")
    except FormError as exc:
        return _access_page(d, request, 400, str(exc))
    return d.done(request, "/access", f"Revoked {sender} on {instance}: they get a pairing code next time.")


# ------------------------------------------------------------------ cron


def _cron_page(d: Dashboard, request: web.Request, status: int = 200, error: str = "", form=None,
               editing: str = "") -> web.Response:
    now = time.time()
    with d.deps.read() as conn:
        jobs = []
        for job in cron_store.list_all(conn):
            last = cron_store.last_run_of(conn, job.id)
            state, next_at = cron.job_state(job, last, now)
            jobs.append({"job": job, "state": state, "next": cron.local_iso(next_at, job.tz) if next_at else "-",
                         "last": f"{last[0]} {cron.local_iso(last[1], job.tz)}" if last else "-"})
        runs = cron_store.recent_runs(conn, None, RUNS_SHOWN)
    agents = [p.id for p in list_packs(d.deps.paths)]
    instances = sorted(cron.deliver_instances(d.deps.config()))
    values = dict(form) if form is not None else {"tz": "UTC", "agent": "default" if "default" in agents else ""}
    if editing and form is None:
        job = next((j["job"] for j in jobs if j["job"].name == editing), None)
        if job is not None:
            values = {"name": job.name, "original": job.name, "schedule": job.schedule, "tz": job.tz,
                      "at": "" if job.schedule else cron.local_iso(job.run_at or 0, job.tz)[:16],
                      "prompt": job.prompt, "deliver_to": f"{job.deliver_instance}:{job.deliver_chat}",
                      "agent": job.agent, "misfire_grace": f"{job.misfire_grace_s or 0:g}"}
    return d.render(request, "cron.html", status=status, error=error, jobs=jobs, runs=runs, agents=agents,
                    instances=instances, values=values, local_iso=cron.local_iso)


async def cron_page(d: Dashboard, request: web.Request) -> web.StreamResponse:
    return _cron_page(d, request, editing=request.query.get("edit", "")[:100])


def _cron_op(d: Dashboard, form, by: str, now: float) -> tuple[m.CronAdd, float]:
    """The job a form describes, checked as `starling cron add` checks it (InvalidInput with its words)."""
    name = cron.check_name(str(form.get("name", "")))
    prompt = str(form.get("prompt", ""))
    cron.check_prompt(prompt)
    tz = cron.zone(str(form.get("tz", "") or "UTC")).key
    schedule_text, at_text = str(form.get("schedule", "")).strip(), str(form.get("at", "")).strip()
    if bool(schedule_text) == bool(at_text):
        raise InvalidInput("give a schedule (a cron expression) or a time to run once, not both")
    if schedule_text:
        schedule, run_at = " ".join(schedule_text.split()), 0.0
        first = cron.check_schedule(schedule, tz, now)
    else:
        schedule, run_at = "", cron.parse_at(at_text, tz, now, label="run once at")
        first = run_at
    instance, chat = cron.parse_deliver_to(str(form.get("deliver_to", "")), cron.deliver_instances(d.deps.config()))
    grace_text = str(form.get("misfire_grace", "") or "0")
    try:
        grace = cron.check_grace(float(grace_text))
    except ValueError:
        raise InvalidInput(f"misfire grace must be a number of seconds, not {grace_text[:20]!r}") from None
    agent = str(form.get("agent", "") or "default")
    if not (d.deps.paths.agents_dir / agent).is_dir() or "/" in agent or agent.startswith("."):
        raise InvalidInput(f"no agent {agent!r} (see `starling agent list`)")
    return m.CronAdd(name=name, prompt=prompt, agent=agent, deliver_instance=instance, deliver_chat=chat,
                     schedule=schedule, tz=tz, run_at=run_at, created_by=by, misfire_grace_s=grace), first


async def cron_save(d: Dashboard, request: web.Request) -> web.StreamResponse:
    """Add a job, or with ``original`` edit one: the old job is removed and the new one added (its run
    history starts over, as after `starling cron rm` and `cron add`)."""
    form = await request.post()
    original = str(form.get("original", ""))[:100]
    now = time.time()
    try:
        op, first = _cron_op(d, form, _by(request), now)
        if original:
            with d.deps.read() as conn:
                if cron_store.get_by_name(conn, original) is None:
                    raise FormError(f"cron job {original!r}: no cron job named {original!r}")
                if op.name != original and cron_store.get_by_name(conn, op.name) is not None:
                    raise FormError(f"cron job {op.name!r} was not added: a cron job named {op.name!r} already exists")
            await d.write(m.CronRemove(name=original), f"cron job {original!r}")
        job_id = (await d.write(op, f"cron job {op.name!r} was not added")).id
    except (InvalidInput, FormError) as exc:
        return _cron_page(d, request, 400, str(exc), form=form)
    await d.audit(request, "cron.edited" if original else "cron.added", op.name, job_id=job_id,
                  schedule=op.schedule, tz=op.tz, run_at=op.run_at, agent=op.agent,
                  deliver_to=f"{op.deliver_instance}:{op.deliver_chat}", was=original)
    what = f"schedule '{op.schedule}' ({op.tz})" if op.schedule else f"once ({op.tz})"
    verb = "Saved" if original else "Added"
    return d.done(request, "/cron", f"{verb} cron job {op.name!r} (id {job_id}): {what}, first run"
                                    f" {cron.local_iso(first, op.tz)}, agent {op.agent}, delivering to"
                                    f" {op.deliver_instance}:{op.deliver_chat}.")


async def cron_change(d: Dashboard, request: web.Request) -> web.StreamResponse:
    form = await request.post()
    name, action = str(form.get("name", ""))[:100], request.match_info["action"]
    user = request[SESSION].username
    op, done = {
        "enable": (m.CronSetEnabled(name=name, enabled=True),
                   f"Enabled cron job {name!r}: it runs from its next scheduled time."),
        "disable": (m.CronSetEnabled(name=name, enabled=False, reason=f"by {user} (dashboard)"),
                    f"Disabled cron job {name!r}."),
        "remove": (m.CronRemove(name=name), f"Removed cron job {name!r}."),
    }[action]
    try:
        await d.write(op, f"cron job {name!r}")
    except FormError as exc:
        return _cron_page(d, request, 400, str(exc))
    await d.audit(request, f"cron.{action}d" if action != "remove" else "cron.removed", name)
    return d.done(request, "/cron", done)


ROUTES = [
    ("GET", "/approvals", approvals, "view"),
    ("POST", "/approvals/decide", decide, "change"),
    ("GET", "/access", access, "view"),
    ("POST", "/access/{action:approve|refuse}", pairing, "change"),
    ("POST", "/access/revoke", revoke, "change"),
    ("GET", "/cron", cron_page, "view"),
    ("POST", "/cron/save", cron_save, "change"),
    ("POST", "/cron/{action:enable|disable|remove}", cron_change, "change"),
]
