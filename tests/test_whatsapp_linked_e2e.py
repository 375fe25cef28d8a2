"""Linked-device mode end to end with the real processes (writer, runner, gateway, the CLI) and the fake
client of tests/fake_linked.py passed in place of neonize (tests/linked_gateway.py): the gateway waits
unlinked, `starling whatsapp link` asks it to pair and shows the QR code it sends back, the gateway takes
the session, a message is answered through the writer and the runner, a picture is fetched through the
kit, a stranger gets a pairing code, and `unlink` while the gateway runs logs it out. The link state is
read where `starling status` reads it (the heartbeats)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from common import db
from common.stores import beat_store
from services.gateway.whatsapp.linking import render_qr
from tests.fake_linked import ACCOUNT, DIR_ENV
from tests.gateway_stack import GatewayStack
from tests.procs import REPO, wait_until

OWNER = "4915112345678"
STRANGER = "4915100000001"


class _NoPlatform:
    def stop(self) -> None:
        pass


class LinkedStack(GatewayStack):
    service = "gateway.whatsapp"
    module = "tests.linked_gateway"

    def start_fake(self, root: Path, **kw):
        return _NoPlatform()

    def gateway_config(self, gateway: str) -> tuple[str, dict[str, str]]:
        return f'[[gateways.whatsapp]]\nid = "wa"\nmode = "linked"\nallow = ["+{OWNER}"]\n', {}

    def detail(self) -> str:
        conn = self.reader()
        try:
            with db.read_tx(conn):
                return " | ".join(b.detail for b in beat_store.all_beats(conn) if b.service == "gateway-whatsapp")
        finally:
            conn.close()

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "common.cli", "--home", str(self.home.root), *args],
                              cwd=REPO, capture_output=True, text=True, timeout=60)


def sent(fake: Path, to: str) -> list[dict]:
    path = fake / "wa" / "sent.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["chat"] == to]


def inbound(fake: Path, name: str, **msg) -> None:
    inbox = fake / "wa" / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    tmp = inbox / f".{name}.tmp"
    tmp.write_text(json.dumps(msg))
    tmp.rename(inbox / f"{name}.json")


def test_link_answer_and_unlink_through_the_real_processes(tmp_path, monkeypatch):
    fake = tmp_path / "fake-linked"
    monkeypatch.setenv(DIR_ENV, str(fake))
    stack = LinkedStack()
    try:
        stack.start_gateway()
        wait_until(lambda: "wa: linked-device unlinked" in stack.detail(), timeout=10, what="the unlinked state")

        linked = stack.cli("whatsapp", "link")
        assert 0 == linked.returncode, linked.stderr
        # the QR as drawn (segno's blocks, or the raw code where segno is not installed)
        assert "Scan this with WhatsApp" in linked.stdout and render_qr("2@fake-qr-ref,fake-noise-key,fake-identity,fake-adv") in linked.stdout
        assert f"Linked wa as +{ACCOUNT}" in linked.stdout
        wait_until(lambda: f"wa: linked-device linked as +{ACCOUNT}" in stack.detail(), timeout=10,
                   what="the gateway to take the session")
        names = sorted(p.name for p in (stack.home.paths.whatsapp_dir / "wa").glob("*.enc"))
        assert ["check.enc", "identity.enc", "link.enc"] == [n for n in names if n != "ratchet.enc"]

        inbound(fake, "001", id="3EB0M1", chat=OWNER, sender=OWNER, text="hello from the phone")
        wait_until(lambda: sent(fake, OWNER), timeout=20, what="the agent's answer")
        assert not (fake / "wa" / "inbox" / "001.json").exists()  # acked after the writer had it
        (fake / "wa" / "media").mkdir()
        (fake / "wa" / "media" / "H1").write_bytes(b"\x89PNG a fake picture")
        inbound(fake, "003", id="3EB0M3", chat=OWNER, sender=OWNER, text="look", kind="image", media="H1")
        wait_until(lambda: len(stack.user_turns("wa", OWNER)) == 2, timeout=20, what="the picture's turn")
        turn = stack.user_turns("wa", OWNER)[1]
        saved = re.fullmatch(r"look\n\[image attached: (\S+) \(0 KB\)\]", turn)
        assert saved, turn  # fetched by the kit (Channel.download) and described where it was saved
        assert b"\x89PNG a fake picture" == Path(saved.group(1)).read_bytes()
        assert Path(saved.group(1)).is_relative_to(stack.home.paths.attachments_dir)
        inbound(fake, "002", id="3EB0M2", chat=STRANGER, sender=STRANGER, text="who are you?")
        wait_until(lambda: sent(fake, STRANGER), timeout=20, what="the stranger's pairing code")
        assert "starling pairing approve" in sent(fake, STRANGER)[0]["text"]

        again = stack.cli("whatsapp", "link", "wa")
        assert 1 == again.returncode and "whatsapp unlink wa" in again.stderr

        unlinked = stack.cli("whatsapp", "unlink", "wa")
        assert 0 == unlinked.returncode, unlinked.stderr
        assert "unlinked: WhatsApp removed this device" in unlinked.stdout
        wait_until(lambda: "wa: linked-device unlinked: unlinked by the operator" in stack.detail(), timeout=10,
                   what="the unlinked state after unlink")
        assert [] == list((stack.home.paths.whatsapp_dir / "wa").glob("*.enc"))
        assert stack.gateway.alive()
    finally:
        stack.stop()
        os.environ.pop(DIR_ENV, None)


def test_a_missing_library_is_a_clear_error_in_status(tmp_path, monkeypatch):
    # neonize made unimportable for the gateway process (the test suite installs it): a package of that
    # name first on its path that fails to import, as a missing or broken install does
    shadow = tmp_path / "shadow" / "neonize"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("No module named \'neonize\'")\n')
    monkeypatch.setenv("PYTHONPATH", f"{shadow.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    stack = LinkedStack()
    stack.module = ""  # the production program, with neonize as it finds it
    try:
        stack.start_gateway()
        wait_until(lambda: "error: linked-device mode needs the neonize library" in stack.detail(), timeout=10,
                   what="the install hint in the status")
        assert "pip install -e '.[whatsapp-linked]'" in stack.detail()
    finally:
        stack.stop()
