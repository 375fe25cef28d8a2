"""supervisord killed -9 during a Telegram stream (DESIGN "The rule of durability"): the home runs under
supervisord (`starling up`) with the fake Bot API and a fake model; supervisord dies without a word, its
services live on as orphans, and `starling up` again brings a new supervisord whose services take over from
them (the orphans are gone, none answers twice). Every message answered once, in order."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from common.personas import create_pack
from common.pids import alive
from common.secrets import set_secret
from common.supervisor import Supervisor
from tests.fake_models import FakeModelsProcess
from tests.fake_telegram import DEFAULT_TOKEN, FakeTelegramProcess
from tests.gateway_stack import Feeder, base_config, check_sequence, stream_plan
from tests.procs import REPO, make_home, remove_home, wait_until
from tests.whatsapp_stack import free_port

USERS = [2001, 2002, 2003]
PER_CHAT = 8
SCHEDULE = [0.0, 0.6, 1.2, 1.8, 2.4, 3.0, 3.6, 4.2]


def starling(home, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.cli", "--home", str(home.root), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def supervised_home():
    root = Path(tempfile.mkdtemp(prefix="st", dir="/tmp"))
    tg = model = home = None
    pids: list[int] = []
    try:
        tg = FakeTelegramProcess(root / "fake-tg").start()
        model = FakeModelsProcess(root / "fake-model").start()
        home = make_home(
            base_config(model.openai_url)
            + f'[control]\nlisten = "127.0.0.1:{free_port()}"\n'
            + '[conversation]\nqueue = "followup"\n'  # one answer per message: the check counts them
            + "[gateways]\noutbox_lease_s = 3\n"
            + f'[[gateways.telegram]]\nid = "tg"\ntoken = "tg-token"\napi_base = "{tg.url}"\n'
            + f"allow = [{', '.join(map(str, USERS))}]\n",
            root=root)
        set_secret(home.paths.secrets_file, "openai", "sk-test-not-a-real-key-1234")
        set_secret(home.paths.secrets_file, "tg-token", DEFAULT_TOKEN)
        create_pack(home.paths, "default")
        home.tg, home.pids = tg, pids
        yield home
    finally:
        if home is not None:
            starling(home, "down")
            sup = Supervisor(home.paths)
            if sup.reachable():
                os.kill(sup.supervisord_pid(), signal.SIGKILL)
            for pid in pids:  # orphans a failed test left behind
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
        for fake in (tg, model):
            if fake is not None:
                fake.stop()
        remove_home(home) if home is not None else None


def test_supervisord_killed_during_a_stream_and_up_again_loses_nothing():
    with supervised_home() as home:
        up = starling(home, "up", "--timeout", "60")
        assert up.returncode == 0, up.stdout + up.stderr

        def send(user: int, k: int) -> str:
            text = f"chat {user} message {k}"
            home.tg.message(text, user=user)
            return text

        with Feeder(stream_plan(USERS, SCHEDULE, 0.3), send) as feed:
            wait_until(lambda: len(home.tg.sent()) >= 3, timeout=15, what="the first replies")
            sup = Supervisor(home.paths)
            orphans = [p.pid for p in sup.processes() if p.pid]
            home.pids.extend(orphans)
            os.kill(sup.supervisord_pid(), signal.SIGKILL)
            wait_until(lambda: not sup.reachable(), timeout=10, what="supervisord to be gone")
            assert any(alive(pid) for pid in orphans)  # its services live on without it
            again = starling(home, "up", "--timeout", "60")
            assert again.returncode == 0, again.stdout + again.stderr
        expected = feed.finish()

        want = {f"echo: {t}" for texts in expected.values() for t in texts}
        wait_until(lambda: want <= {r["text"] for r in home.tg.sent()}, timeout=45, interval=0.2,
                   what="every message to be answered")
        wait_until(lambda: not any(alive(pid) for pid in orphans), timeout=10, what="the orphans to be gone")
        got: dict[int, list[str]] = defaultdict(list)
        for r in home.tg.sent():
            got[r["chat_id"]].append(r["text"])
        duplicates = {u: check_sequence(f"chat {u}", expected[u], got[u]) for u in USERS}
        assert sum(duplicates.values()) <= 1, duplicates  # at most the one reply in flight at the takeover
        status = starling(home, "status")
        assert status.returncode == 0, status.stdout + status.stderr
