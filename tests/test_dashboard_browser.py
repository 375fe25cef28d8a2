"""The dashboard in a real browser: Debian's headless chromium driven by Playwright, against real processes
(a writer, a runner, the control service and a strict fake model). Log in and see the services; set the
model provider's key and see the runner use it; approve a tool call the model asked for and see the turn
finish; add a cron job; follow the log tail. Every page is saved as a screenshot under the test's temporary
folder, and a blank one fails. Skipped only where chromium (or Playwright) is not installed."""

from __future__ import annotations

import asyncio
import re
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from common import db
from common.stores import approval_store, cron_store, turn_store
from schema import messages as m
from tests.dashboard_client import PASSWORD, add_account
from tests.fake_models import fingerprint
from tests.procs import Proc, start_writer, wait_until
from tests.runner_stack import GATEWAY, collect, own_home
from tests.whatsapp_stack import free_port

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
KEY = "sk-set-from-the-dashboard-7731"

if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
    pytest.skip("chromium is not installed (apt-get install chromium; .ci/run does it)", allow_module_level=True)
playwright_sync = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")


@pytest.fixture(scope="module")
def stack():
    port = free_port()
    with own_home(lambda text: f'[control]\nlisten = "127.0.0.1:{port}"\n' + text, key=False) as home:
        home.procs.append(start_writer(home))
        home.procs.append(Proc(home, "runner"))
        home.procs.append(Proc(home, "control"))
        home.base = f"http://127.0.0.1:{port}"
        asyncio.run(add_account(home, "alice"))
        wait_until(lambda: _answers(home.base), 20, what="the control service")
        yield home


def _answers(base: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(base + "/livez", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dashboard-screens")


@pytest.fixture(scope="module")
def page(stack):
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        tab = context.new_page()
        tab.set_default_timeout(15_000)
        yield tab
        context.close()
        browser.close()


def shoot(page, shots: Path, name: str) -> Path:
    """A full-page screenshot; it fails when blank (one colour, or nearly)."""
    from PIL import Image, ImageStat

    path = shots / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    with Image.open(path) as image:
        grey = image.convert("L")
        spread = ImageStat.Stat(grey).stddev[0]
        colours = len(grey.getcolors(256 * 256) or [])
    assert spread > 5 and colours > 8, f"{path} looks blank (stddev {spread:.1f}, {colours} shades)"
    return path


def apart(fn, *args, **kw):
    """Run ``fn`` in a thread of its own: Playwright's sync API keeps an event loop running in this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args, **kw).result()


def inbound(home, chat: str, text: str):
    async def go():
        async with home.client("gateway") as c:
            return await c.call(m.Inbound(agent="default", instance=GATEWAY, chat=chat, sender="u1", text=text,
                                          dedupe_keys=[uuid.uuid4().hex]))

    return apart(asyncio.run, go())


def reader(home):
    return db.open_reader(home.paths.db_file)


def test_log_in_and_see_the_services(stack, page, shots):
    page.goto(stack.base + "/")
    assert "/login" in page.url
    shoot(page, shots, "login")
    page.fill("input[name=name]", "alice")
    page.fill("input[name=password]", "not the password")
    page.click("button[type=submit]")
    assert "Wrong name or password." in page.content()
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("#services")
    services = page.inner_text("#services")
    for name in ("writer", "runner", "control"):
        assert name in services
    shoot(page, shots, "overview")


def test_set_the_model_key_and_see_the_runner_use_it(stack, page, shots):
    inbound(stack, "key-chat", "hello before the key")
    before = apart(collect, stack, "key-chat", replies=1, timeout=30)
    assert before and "rejected the API key" in before[0]  # no key yet: the strict fake refuses the call
    page.goto(stack.base + "/secrets")
    assert "missing" in page.inner_text("#secrets")
    page.fill("input[name=name]", "openai")
    page.fill("input[name=value]", KEY)
    page.click("form[action='/secrets/set'] button")
    page.wait_for_selector(".flash.ok")
    assert "Stored secret 'openai'" in page.inner_text(".flash.ok") and KEY not in page.content()
    shoot(page, shots, "secrets")
    stack.fake.clear()
    second = inbound(stack, "key-chat", "hello with the key")
    assert ["echo: hello with the key"] == apart(collect, stack, "key-chat", replies=1, timeout=30)
    used = [r["headers"].get("authorization") for r in stack.fake.requests("openai")]
    assert fingerprint(f"Bearer {KEY}") in used
    assert "done" == turn_store.get(reader(stack), second.turn_id).state


def test_approve_a_tool_call_and_see_the_turn_finish(stack, page, shots):
    stack.fake.add({"tool_call": {"name": "shell", "arguments": {"command": "touch approved.txt"}}},
                   {"text": "Done: the file exists."})
    accepted = inbound(stack, "approve-chat", "please create approved.txt")
    wait_until(lambda: approval_store.for_turn(reader(stack), accepted.turn_id) is not None, 30,
               what="the approval")
    approval = approval_store.for_turn(reader(stack), accepted.turn_id)
    page.goto(stack.base + "/approvals")
    card = page.locator(f"#approval-{approval.id}")
    assert "touch approved.txt" in card.inner_text()
    shoot(page, shots, "approvals")
    card.locator("button[value=once]").click()
    page.wait_for_selector(".flash.ok")
    assert f"Approved {approval.id}" in page.inner_text(".flash.ok")
    wait_until(lambda: turn_store.get(reader(stack), accepted.turn_id).state == "done", 30, what="the turn")
    assert (stack.paths.workspace_dir / "private" / "default" / "approved.txt").exists()
    page.goto(stack.base + f"/conversations/{accepted.session_id}")
    page.wait_for_selector("text=Done: the file exists.")
    assert "touch approved.txt" in page.content()
    shoot(page, shots, "transcript")


def test_add_a_cron_job(stack, page, shots):
    page.goto(stack.base + "/cron")
    page.fill("#job-form input[name=name]", "browser-job")
    page.fill("#job-form input[name=schedule]", "30 7 * * *")
    page.fill("#job-form input[name=tz]", "Europe/Berlin")
    page.fill("#job-form input[name=deliver_to]", "cli:browser")
    page.fill("#job-form textarea[name=prompt]", "Say good morning.")
    page.click("#job-form button[type=submit]")
    page.wait_for_selector(".flash.ok")
    assert "Added cron job 'browser-job'" in page.inner_text(".flash.ok")
    assert "30 7 * * *" in page.inner_text("#cron-jobs")
    shoot(page, shots, "cron")
    job = cron_store.get_by_name(reader(stack), "browser-job")
    assert ("Europe/Berlin", "cli", "browser", "dashboard:alice") == (job.tz, job.deliver_instance, job.deliver_chat,
                                                                      job.created_by)


def test_follow_the_log_tail(stack, page, shots):
    page.goto(stack.base + "/logs?service=runner&level=info")
    page.wait_for_selector("#log-lines")
    marker = f"tail-{uuid.uuid4().hex[:8]}"
    accepted = inbound(stack, "tail-chat", f"hello {marker}")
    # a live row (added by the EventSource) carrying this turn's id shows without a reload
    page.wait_for_selector(f"#log-lines tr.live >> text=turn_id={accepted.turn_id}", timeout=20_000)
    shoot(page, shots, "logs")
    page.goto(stack.base + f"/logs?id={accepted.turn_id}&level=debug")
    rows = page.inner_text("#log-lines")
    assert str(accepted.turn_id) in rows and re.search(r"runner", rows)


def test_every_other_page_renders(stack, page, shots):
    for name, path in (("conversations", "/conversations"), ("search", "/conversations?q=hello"),
                       ("access", "/access"), ("agents", "/agents"), ("agent", "/agents/default"),
                       ("usage", "/usage"), ("whatsapp", "/whatsapp"), ("daemon-log", "/logs?source=db")):
        page.goto(stack.base + path)
        assert "Traceback" not in page.content()
        shoot(page, shots, name)
    page.goto(stack.base + "/usage")
    assert page.locator("svg.chart").count() == 2
