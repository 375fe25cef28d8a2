"""The dashboard's HTTP layer with aiohttp's test client, against a real writer and SQLite file: no account no
page, logins and their limits, CSRF, roles, each form's checks in the CLI's words, and no secret value in
any answer."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from common import cron, db
from common.errors import InvalidInput
from common.personas import create_pack
from common.stores import dashboard_store
from schema import messages as m
from services.control.dashboard import views_config, views_logs, views_ops, views_status, views_talk, views_whatsapp
from tests.dashboard_client import PASSWORD, add_account, csrf_of, dashboard, login, post
from tests.procs import make_home, remove_home, start_writer

SECRET_VALUE = "sk-dashboard-test-value-Zq81vX"
GET_PAGES = ["/", "/conversations", "/approvals", "/access", "/cron", "/agents", "/agents/default", "/secrets",
             "/usage", "/logs", "/logs?source=db", "/whatsapp", "/conversations?q=hello"]


@pytest.fixture(scope="module")
def home():
    h = make_home('[[gateways.telegram]]\nid = "main"\ntoken = "telegram-main"\n')
    create_pack(h.paths, "default")
    writer = start_writer(h)

    async def accounts():
        await add_account(h, "alice")
        await add_account(h, "victor", role="viewer")
        await add_account(h, "locky")
        await add_account(h, "rita")

    asyncio.run(accounts())
    yield h
    writer.stop()
    remove_home(h)


def run(home, scenario):
    async def go():
        async with dashboard(home) as client:
            return await scenario(client)

    return asyncio.run(go())


def audit_rows(home) -> list[dashboard_store.AuditRow]:
    conn = db.open_reader(home.paths.db_file)
    try:
        with db.read_tx(conn):
            return dashboard_store.recent_audit(conn, 1000)
    finally:
        conn.close()


def test_no_account_no_page(home):
    async def scenario(client):
        paths = [p for module in (views_status, views_talk, views_ops, views_config, views_logs, views_whatsapp)
                 for method, p, _h, _k in module.ROUTES if method == "GET"]
        answers = {}
        for path in paths:
            path = path.replace("{id}", "default").replace("{path:.+}", "x.png")
            r = await client.get(path, allow_redirects=False)
            answers[path] = (r.status, r.headers.get("Location", "").split("?")[0])
        posted = await client.post("/cron/save", data={"name": "x"}, allow_redirects=False)
        return answers, posted.status

    answers, posted = run(home, scenario)
    assert all(answer == (303, "/login") for answer in answers.values()), answers
    assert posted == 403


def test_login_sets_a_strict_http_only_cookie_and_logout_ends_it(home):
    async def scenario(client):
        wrong = await login(client, "alice", "not the password at all")
        wrong_text = await wrong.text()
        good = await login(client, "alice")
        cookie = good.headers.getall("Set-Cookie")
        inside = await client.get("/", allow_redirects=False)
        await post(client, "/logout", {})
        after = await client.get("/", allow_redirects=False)
        return wrong.status, wrong_text, good.status, cookie, inside.status, after.status

    wrong, wrong_text, good, cookies, inside, after = run(home, scenario)
    assert (401, 303, 200, 303) == (wrong, good, inside, after)
    assert "Wrong name or password." in wrong_text
    session = next(c for c in cookies if c.startswith("starling_session="))
    assert "HttpOnly" in session and "SameSite=Strict" in session and "Secure" not in session
    actions = [(r.actor, r.action) for r in audit_rows(home)]
    assert ("dashboard:alice", "dashboard.login") in actions and ("dashboard:alice", "dashboard.logout") in actions


def test_https_public_url_makes_the_cookie_secure(home):
    import msgspec

    cfg = msgspec.structs.replace(home.cfg, control=msgspec.structs.replace(
        home.cfg.control, public_url="https://starling.example.org"))

    async def go():
        async with dashboard(home, cfg) as client:
            page = await client.get("/login")
            token = csrf_of(await page.text())
            # over https the browser sends the Secure login cookie back; this test client speaks http
            r = await client.post("/login", data={"csrf": token, "name": "alice", "password": PASSWORD},
                                  headers={"Cookie": f"starling_login={token}"}, allow_redirects=False)
            return page.headers.getall("Set-Cookie"), r.status, r.headers.getall("Set-Cookie")

    first, status, cookies = asyncio.run(go())
    assert 303 == status and "Secure" in next(c for c in first if c.startswith("starling_login="))
    session = next(c for c in cookies if c.startswith("__Host-starling="))
    assert "Secure" in session and "HttpOnly" in session and "Path=/" in session and "SameSite=Strict" in session


def test_every_form_needs_the_csrf_token(home):
    async def scenario(client):
        no_token = await client.post("/login", data={"name": "alice", "password": PASSWORD}, allow_redirects=False)
        await login(client, "alice")
        missing = await client.post("/secrets/set", data={"name": "x", "value": "y"}, allow_redirects=False)
        wrong = await client.post("/secrets/set", data={"csrf": "forged", "name": "x", "value": "y"},
                                  allow_redirects=False)
        token = csrf_of(await (await client.get("/")).text())
        foreign = await client.post("/secrets/set", data={"csrf": token, "name": "x", "value": "y"},
                                    headers={"Origin": "https://evil.example"}, allow_redirects=False)
        return no_token.status, missing.status, wrong.status, foreign.status

    assert (403, 403, 403, 403) == run(home, scenario)
    assert not home.paths.secrets_file.exists() or "x" not in json.loads(home.paths.secrets_file.read_text())


def test_a_viewer_looks_but_changes_nothing(home):
    async def scenario(client):
        await login(client, "victor")
        statuses = {page: (await client.get(page)).status for page in GET_PAGES}
        refused = await post(client, "/cron/save", {"name": "viewer-job", "schedule": "@daily", "tz": "UTC",
                                                     "prompt": "p", "deliver_to": "main:1", "agent": "default"})
        text = await refused.text()
        out = await post(client, "/logout", {})
        return statuses, refused.status, text, out.status

    statuses, refused, text, out = run(home, scenario)
    assert {200} == set(statuses.values()) - {403}, statuses  # the WhatsApp code is an admin's
    assert 403 == refused and "viewer" in text and 303 == out
    conn = db.open_reader(home.paths.db_file)
    with db.read_tx(conn):
        from common.stores import cron_store
        assert cron_store.get_by_name(conn, "viewer-job") is None
    conn.close()


def test_failed_logins_lock_the_account_and_are_audited(home):
    async def scenario(client):
        texts = []
        for _ in range(5):
            texts.append(await (await login(client, "locky", "wrong password, again")).text())
        right = await login(client, "locky")
        return texts, right.status, await right.text()

    texts, status, text = run(home, scenario)
    assert "now locked" in texts[-1] and "Wrong name or password." in texts[0]
    assert 401 == status and "This account is locked after 5 failed logins" in text
    failed = [r for r in audit_rows(home) if r.action == "dashboard.login_failed" and r.target == "locky"]
    assert len(failed) == 6 and json.loads(failed[0].detail)["locked"] is True


def test_too_many_failures_from_one_address_wait(home):
    async def scenario(client):
        statuses = [(await login(client, f"nobody{i}", "x" * 12)).status for i in range(21)]
        text = await (await login(client, "alice")).text()
        return statuses, text

    statuses, text = run(home, scenario)
    assert statuses[:20] == [401] * 20 and statuses[20] == 429
    assert "Too many failed logins from this address" in text  # even the right password waits
    unknown = [r for r in audit_rows(home) if r.action == "dashboard.login_failed" and r.actor == "dashboard:?"]
    assert unknown and all(r.target == "" and "nobody" not in r.detail for r in unknown)


def _cli_message(check) -> str:
    try:
        check()
    except InvalidInput as exc:
        return str(exc)
    raise AssertionError("expected InvalidInput")


def test_cron_form_checks_in_the_cli_words_and_adds_edits_removes(home):
    base = {"name": "morning", "schedule": "0 9 * * mon-fri", "at": "", "tz": "Europe/Berlin",
            "prompt": "Good morning!", "deliver_to": "main:42", "agent": "default", "misfire_grace": "0"}
    bad = {
        "schedule": ({"schedule": "61 * * * *"}, _cli_message(lambda: cron.check_schedule("61 * * * *", "UTC", 0))),
        "zone": ({"tz": "Mars/Olympus"}, _cli_message(lambda: cron.zone("Mars/Olympus"))),
        "deliver": ({"deliver_to": "nowhere:1"}, _cli_message(
            lambda: cron.parse_deliver_to("nowhere:1", cron.deliver_instances(home.cfg)))),
        "agent": ({"agent": "ghost"}, "no agent 'ghost' (see `starling agent list`)"),
        "name": ({"name": "bad/name"}, _cli_message(lambda: cron.check_name("bad/name"))),
    }

    async def scenario(client):
        await login(client, "alice")
        seen = {}
        for key, (change, _) in bad.items():
            r = await post(client, "/cron/save", {**base, **change}, "/cron")
            seen[key] = (r.status, await r.text())
        added = await post(client, "/cron/save", base, "/cron")
        listing = await (await client.get("/cron")).text()
        again = await post(client, "/cron/save", base, "/cron")
        again_text = await again.text()
        edited = await post(client, "/cron/save", {**base, "original": "morning", "prompt": "Wake up"}, "/cron")
        disabled = await post(client, "/cron/disable", {"name": "morning"}, "/cron")
        listing2 = await (await client.get("/cron")).text()
        removed = await post(client, "/cron/remove", {"name": "morning"}, "/cron")
        gone = await post(client, "/cron/remove", {"name": "morning"}, "/cron")
        return seen, added.status, listing, again.status, again_text, edited.status, disabled.status, listing2, \
            removed.status, await gone.text()

    seen, added, listing, again, again_text, edited, disabled, listing2, removed, gone = run(home, scenario)
    for key, (_, message) in bad.items():
        status, text = seen[key]
        assert 400 == status and message.replace("'", "&#39;") in text, (key, message)
    assert 303 == added and "morning" in listing and "0 9 * * mon-fri" in listing
    assert 400 == again and "a cron job named &#39;morning&#39; already exists" in again_text
    assert (303, 303, 303) == (edited, disabled, removed) and "disabled" in listing2
    assert "no cron job named &#39;morning&#39;" in gone
    actions = [r.action for r in audit_rows(home) if r.actor == "dashboard:alice"]
    for action in ("dashboard.cron.added", "dashboard.cron.edited", "dashboard.cron.disabled", "dashboard.cron.removed"):
        assert action in actions


def _park_a_turn(home, tool: str = "shell") -> str:
    """A pending approval as a runner makes one: an inbound turn claimed, then parked."""
    approval_id = uuid.uuid4().hex[:6].upper()

    async def go():
        async with home.client("runner-test") as c:
            await c.call(m.Inbound(agent="default", instance="main", chat="7", sender="u", text="please list files",
                                   dedupe_keys=[uuid.uuid4().hex]))
            claim = await c.call(m.ClaimTurn(worker="runner-test"))
            await c.call(m.ParkTurn(turn_id=claim.turn_id, worker="runner-test", approval_id=approval_id, tool=tool,
                                    arguments='{"command": "ls -la"}', reason="runs a command"))

    asyncio.run(go())
    return approval_id


def test_approvals_are_decided_through_the_writer(home):
    first, second = _park_a_turn(home), _park_a_turn(home)

    async def scenario(client):
        await login(client, "alice")
        page = await (await client.get("/approvals")).text()
        unknown = await post(client, "/approvals/decide", {"id": "NOPE99", "decision": "once"}, "/approvals")
        once = await post(client, "/approvals/decide", {"id": first, "decision": "always"}, "/approvals")
        deny = await post(client, "/approvals/decide", {"id": second, "decision": "deny"}, "/approvals")
        twice = await post(client, "/approvals/decide", {"id": second, "decision": "once"}, "/approvals")
        return page, await unknown.text(), once.status, deny.status, await twice.text()

    page, unknown, once, deny, twice = run(home, scenario)
    assert first in page and "ls -la" in page
    assert "no approval NOPE99" in unknown and (303, 303) == (once, deny)
    assert f"approval {second}: approval {second} is already denied" in twice
    conn = db.open_reader(home.paths.db_file)
    with db.read_tx(conn):
        from common.stores import approval_store
        a, b = approval_store.get(conn, first), approval_store.get(conn, second)
        grants = approval_store.grants(conn, "default", "shell")
    conn.close()
    assert ("approved", "dashboard:alice", "denied") == (a.state, a.decided_by, b.state)
    assert '{"command": "ls -la"}' in grants


def test_access_forms_say_what_the_cli_says(home):
    async def scenario(client):
        await login(client, "alice")
        unknown = await post(client, "/access/approve", {"code": "ZZZZ2222"}, "/access")
        refused = await post(client, "/access/refuse", {"code": "ZZZZ2222"}, "/access")
        revoke = await post(client, "/access/revoke", {"instance": "main", "sender": "nobody"}, "/access")
        return await unknown.text(), await refused.text(), await revoke.text()

    unknown, refused, revoke = run(home, scenario)
    assert "pairing ZZZZ2222: no pairing code &#39;ZZZZ2222&#39;" in unknown
    assert "pairing ZZZZ2222: no pairing code" in refused
    assert "&#39;nobody&#39; is not an allowed sender of &#39;main&#39;" in revoke


def test_a_secret_value_never_comes_back(home):
    async def scenario(client):
        await login(client, "alice")
        stored = await post(client, "/secrets/set", {"name": "dash-test", "value": SECRET_VALUE}, "/secrets")
        wrong_field = await post(client, "/secrets/set", {"name": SECRET_VALUE + " oops", "value": ""}, "/secrets")
        empty = await post(client, "/secrets/set", {"name": "dash-empty", "value": ""}, "/secrets")
        bodies = [await (await client.get(page)).text() for page in GET_PAGES]
        bodies += [await stored.text(), await wrong_field.text(), await empty.text()]
        listing = bodies[GET_PAGES.index("/secrets")]
        removed = await post(client, "/secrets/remove", {"name": "dash-test"}, "/secrets")
        again = await post(client, "/secrets/remove", {"name": "dash-test"}, "/secrets")
        return stored.status, wrong_field.status, bodies, listing, removed.status, await again.text()

    stored, wrong_field, bodies, listing, removed, again = run(home, scenario)
    assert 303 == stored and 400 == wrong_field and 303 == removed
    assert "dash-test" in listing and "secrets.json" in listing
    assert not any(SECRET_VALUE in body for body in bodies)
    assert any("invalid secret name: expected 1-64 characters" in body for body in bodies)
    assert any("refusing to store an empty value" in body for body in bodies)
    assert "no secret &#39;dash-test&#39;" in again
    assert not any(SECRET_VALUE in r.detail or SECRET_VALUE in r.target for r in audit_rows(home))
    assert any(r.action == "dashboard.secret.set" and r.target == "dash-test" for r in audit_rows(home))


def test_persona_files_are_backed_up_then_saved_and_checked(home):
    identity = home.paths.agents_dir / "default" / "IDENTITY.md"
    before = identity.read_text()

    async def scenario(client):
        await login(client, "alice")
        saved = await post(client, "/agents/default/save", {"file": "IDENTITY.md", "text": "# Identity\n\n- Name: Dash\n"},
                           "/agents/default")
        bad = await post(client, "/agents/default/save", {"file": "config.toml", "text": "max_stepz = 3\n"},
                         "/agents/default")
        other = await post(client, "/agents/default/save", {"file": "../x.md", "text": "no"}, "/agents/default")
        return saved.status, await bad.text(), await other.text()

    saved, bad, other = run(home, scenario)
    assert 303 == saved and "- Name: Dash" in identity.read_text()
    backups = list((home.paths.backups_dir / "default").glob("*-IDENTITY.md"))
    assert backups and backups[-1].read_text() == before and oct(backups[-1].stat().st_mode & 0o777) == "0o600"
    assert "max_stepz: unknown key" in bad and "max_stepz = 3" in bad  # the draft is kept, the file not changed
    assert "max_stepz" not in (home.paths.agents_dir / "default" / "config.toml").read_text()
    assert "is not a persona file that can be edited here" in other


def test_search_highlights_hits_and_text_is_escaped(home):
    async def go():
        async with home.client("gw") as c:
            await c.call(m.Inbound(agent="default", instance="main", chat="99", sender="u",
                                   text="the quick brown fox <script>alert(1)</script>", dedupe_keys=[uuid.uuid4().hex]))

    asyncio.run(go())

    async def scenario(client):
        await login(client, "alice")
        found = await (await client.get("/conversations?q=fox")).text()
        listing = await (await client.get("/conversations?instance=main&chat=99")).text()
        session_id = int(listing.split('href="/conversations/')[1].split('"')[0])
        transcript = await (await client.get(f"/conversations/{session_id}")).text()
        missing = await client.get("/conversations/999999")
        return found, transcript, missing.status, await missing.text()

    found, transcript, missing, missing_text = run(home, scenario)
    assert "<mark>fox</mark>" in found and "<script>alert" not in found
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in transcript and "<script>alert" not in transcript
    assert 404 == missing and "session 999999 does not exist" in missing_text and "Traceback" not in missing_text


def test_a_failing_page_shows_no_stack_trace(home):
    good = home.paths.secrets_file.read_bytes() if home.paths.secrets_file.exists() else None
    home.paths.secrets_file.write_text("{not json")
    try:
        async def scenario(client):
            await login(client, "alice")
            r = await client.get("/secrets")
            usage = await client.get("/usage?days=abc")
            return r.status, await r.text(), usage.status, await usage.text()

        status, text, usage_status, usage_text = run(home, scenario)
    finally:
        if good is None:
            home.paths.secrets_file.unlink()
        else:
            home.paths.secrets_file.write_bytes(good)
    assert 500 == status and "corrupt secrets file: not valid JSON" in text and "Traceback" not in text
    assert 400 == usage_status and "days must be a whole number" in usage_text


def test_the_setup_link_makes_the_first_account_only_while_there_is_none(home):
    from common import dashboard_setup

    token = dashboard_setup.create(home.paths)

    async def scenario(client):
        bogus = await client.get("/setup?token=nope")
        form = await client.get(f"/setup?token={token}")
        used = await client.post("/setup", data={"token": token, "name": "first", "password": PASSWORD,
                                                 "again": PASSWORD}, allow_redirects=False)
        return bogus.status, form.status, used.status, await used.text()

    bogus, form, used, text = run(home, scenario)
    assert (404, 200, 400) == (bogus, form, used)  # accounts exist already: the writer refuses it
    assert "the first account was made already" in text


def test_the_whatsapp_linking_code_is_shown_to_admins_only():
    from common import whatsapp_qr

    h = make_home('[[gateways.whatsapp]]\nid = "phone"\nmode = "linked"\n')
    writer = start_writer(h)
    try:
        asyncio.run(add_account(h, "wanda"))
        asyncio.run(add_account(h, "vic", role="viewer"))

        async def scenario(client):
            await login(client, "wanda")
            empty = await client.get("/whatsapp/qr.svg?instance=phone")
            whatsapp_qr.write(h.paths, "phone", "qr", "2@fake-qr-ref,abc,def")
            page = await (await client.get("/whatsapp")).text()
            svg = await client.get("/whatsapp/qr.svg?instance=phone")
            state = await (await client.get("/whatsapp/state?instance=phone")).json()
            await post(client, "/logout", {})
            await login(client, "vic")
            viewer = await client.get("/whatsapp/qr.svg?instance=phone")
            return empty.status, page, svg.status, svg.content_type, await svg.text(), state, viewer.status

        empty, page, status, kind, drawing, state, viewer = asyncio.run(_with(h, scenario))
    finally:
        writer.stop()
        remove_home(h)
    assert 404 == empty and "Scan this with WhatsApp" in page
    assert (200, "image/svg+xml") == (status, kind) and "<svg" in drawing
    assert ("qr", False) == (state["kind"], state["running"]) and 403 == viewer


async def _with(h, scenario):
    async with dashboard(h) as client:
        return await scenario(client)
