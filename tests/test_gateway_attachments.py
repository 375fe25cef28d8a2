"""Inbound files: where they land, whatever the platform calls them."""

from __future__ import annotations

import asyncio
import stat

from services.gateway import attachments
from services.gateway.channel import FileRef, InboundMessage


class _Log:
    def warning(self, *a, **kw):
        pass


def fetch(tmp_path, chat: str, name: str, content: bytes, seq: int = 0, cap: int = 10_000,
          timeout_s: float = 5.0, delay: float = 0.0) -> InboundMessage:
    msg = InboundMessage(chat=chat, sender="u", text="", dedupe_keys=["k"], platform_msg_id="5")

    async def download(ref: FileRef):
        async def gen():
            await asyncio.sleep(delay)
            yield content
        return gen()

    into = attachments.Into(tmp_path, "agent", "inst", cap, 0.0)
    asyncio.run(attachments.attach(msg, seq, FileRef("document", "r", 0, name), download, into, _Log(),
                                   timeout_s=timeout_s))
    return msg


def saved_path(msg: InboundMessage):
    assert 1 == len(msg.attachments), msg.text
    from pathlib import Path
    return Path(msg.attachments[0])


def test_two_chats_with_the_same_message_id_and_a_crafted_name_get_their_own_files(tmp_path):
    a = saved_path(fetch(tmp_path, "chat-a", "x/contract.pdf", b"alice"))
    b = saved_path(fetch(tmp_path, "chat-b", "x/contract.pdf", b"bob"))
    assert a != b and (b"alice", b"bob") == (a.read_bytes(), b.read_bytes())
    assert 0o600 == stat.S_IMODE(a.stat().st_mode)


def test_a_name_cannot_climb_out_of_the_folder(tmp_path):
    for name in ("../../../etc/passwd", "..", "/abs/olute", ".hidden", "a\x00b"):
        path = saved_path(fetch(tmp_path, "../../up", name, b"x"))
        assert path.parent == tmp_path / "agent" / "1970-01-01" and not path.name.startswith(".")


def test_two_files_of_one_message_keep_their_own_bytes(tmp_path):
    one = saved_path(fetch(tmp_path, "c", "image.png", b"one", seq=0))
    two = saved_path(fetch(tmp_path, "c", "image.png", b"two", seq=1))
    assert (b"one", b"two") == (one.read_bytes(), two.read_bytes())


def test_over_the_cap_or_too_slow_is_described_not_saved(tmp_path):
    big = fetch(tmp_path, "c", "big.bin", b"x" * 2000, cap=1000)
    slow = fetch(tmp_path, "c", "slow.bin", b"x", timeout_s=0.05, delay=1.0)
    assert ([], [], ) == (big.attachments, slow.attachments)
    assert "over the" in big.text and "took longer" in slow.text
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # no partial file left behind
