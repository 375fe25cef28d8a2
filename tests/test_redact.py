"""Redaction (common.redact): each form of a secret value that real tools print is found, ordinary text is left
alone, every value Starling knows is registered at start, and in a runner process none reaches a tool result,
a model request, a stored turn, the FTS index or the audit."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
import urllib.parse
from pathlib import Path

import msgspec
import pytest

from common import redact
from common.config import load_config
from common.home import ensure_token_file, paths_for
from common.redact import MIN_SECRET_LEN, REDACTED, Registry
from common.secrets import register_known_secrets, set_secret
from schema import messages as m

# Long enough to run over two dump lines, with characters URL-encoding changes.
SECRET = "tok-3f9aQ7zL-0123456789-abcdef/SECRET+x="
PLAIN = f"head: {SECRET} :tail\n"


def registry(*values: str) -> Registry:
    reg = Registry()
    reg.add(values)
    return reg


def sh(command: str, cwd: Path) -> str:
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=10,
                          check=True).stdout


# --- decoders: they read a tool's output back, to show that the raw output holds the secret ---------------

def _b64(text: str) -> bytes:
    joined = "".join(text.split()).replace("-", "+").replace("_", "/")
    return base64.b64decode(joined + "=" * (-len(joined) % 4))


def _hex_tokens(text: str, offsets: bool) -> bytes:
    tokens = []
    for line in text.splitlines():
        words = line.split()
        tokens += words[1:] if offsets else words
    return bytes.fromhex("".join(t for t in tokens if re.fullmatch(r"[0-9A-Fa-f]+", t) and len(t) % 2 == 0))


def _xxd_reverse(text: str) -> bytes:
    return subprocess.run(["xxd", "-r"], input=text.encode(), capture_output=True, timeout=10).stdout


def _hexdump_c(text: str) -> bytes:
    return bytes.fromhex("".join(line[10:58] for line in text.splitlines()))


def _od_c(text: str, offsets: bool) -> bytes:
    words = [w for line in text.splitlines() for w in (line.split()[1:] if offsets else line.split())]
    return "".join(w for w in words if len(w) == 1).encode()


def _hex_prefixed(text: str) -> bytes:
    return bytes(int(h, 16) for h in re.findall(r"(?:0x|\\x|%)([0-9A-Fa-f]{2})", text))


# (name, a command over the file f holding PLAIN, a decoder of its output)
FORMS = [
    ("as is", "cat f", str.encode),
    ("rev", "rev f", lambda t: t[::-1].encode()),
    ("base64", "base64 f", _b64),
    ("base64 after 1 byte", "(printf x; cat f) | base64 -w0", _b64),
    ("base64 after 2 bytes", "(printf xy; cat f) | base64 -w0", _b64),
    ("base64 wrapped at 20", "base64 -w 20 f", _b64),
    ("base64 url-safe unpadded", "base64 -w0 f | tr '+/' '-_' | tr -d =", _b64),
    ("xxd -p", "xxd -p f", lambda t: bytes.fromhex("".join(t.split()))),
    ("xxd -p -u", "xxd -p -u f", lambda t: bytes.fromhex("".join(t.split()))),
    ("xxd", "xxd f", _xxd_reverse),
    ("xxd -u -g1", "xxd -u -g1 f", _xxd_reverse),
    ("xxd -i", "xxd -i f", _hex_prefixed),
    ("hexdump -C", "hexdump -C f", _hexdump_c),
    ("od -c", "od -c f", lambda t: _od_c(t, offsets=True)),
    ("od -An -c", "od -An -c f", lambda t: _od_c(t, offsets=False)),
    ("od -An -tx1", "od -An -tx1 f", lambda t: _hex_tokens(t, offsets=False)),
    ("od -tx1", "od -tx1 f", lambda t: _hex_tokens(t, offsets=True)),
    ("fold -w1", "fold -w1 f", lambda t: "".join(t.split()).encode()),
    ("spaced out", "sed 's/./& /g' f", lambda t: "".join(t.split()).encode()),
    ("url, every byte", "od -An -tx1 -v f | tr -d ' \\n' | sed 's/../%&/g'", _hex_prefixed),
    ("url, every byte, lower", "od -An -tx1 -v f | tr -d ' \\n' | sed 's/../%&/g' | tr A-F a-f", _hex_prefixed),
    ("url, reserved only", "sed 's/\\//%2F/g; s/+/%2B/g; s/=/%3D/g; s/:/%3A/g; s/ /%20/g' f",
     lambda t: urllib.parse.unquote(t).encode()),
    ("url, reserved only, lower", "sed 's/\\//%2f/g; s/+/%2b/g; s/=/%3d/g' f", lambda t: urllib.parse.unquote(t).encode()),
    ("\\x escapes", "od -An -tx1 -v f | tr -d ' \\n' | sed 's/../\\\\x&/g'", _hex_prefixed),
    ("colon hex", "od -An -tx1 -v f | tr -s ' \\n' ':'", lambda t: _hex_prefixed(re.sub(r"([0-9a-f]{2})", r"%\1", t))),
]


def leaks(decode, text: str) -> bool:
    """Whether most of the secret can still be read back from ``text`` (what redaction left, joined)."""
    try:
        decoded = decode(text.replace(REDACTED, ""))
    except (ValueError, UnicodeDecodeError, subprocess.SubprocessError):
        return False
    return SECRET[3:-3].encode() in decoded


@pytest.mark.parametrize("name,command,decode", FORMS, ids=[f[0] for f in FORMS])
def test_each_form_a_tool_prints_is_redacted(tmp_path, name, command, decode):
    (tmp_path / "f").write_text(PLAIN)
    raw = sh(command, tmp_path)
    assert SECRET.encode() in decode(raw), f"{name}: the tool's output should hold the secret"
    assert registry("some-other-value-1234").redact(raw) == raw  # only the secret's own forms are touched
    out = registry(SECRET).redact(raw)
    assert REDACTED in out and not leaks(decode, out), out


@pytest.mark.parametrize("prefix", range(6))
@pytest.mark.parametrize("urlsafe", [False, True])
def test_base64_inside_a_longer_blob_at_every_alignment(prefix, urlsafe):
    data = bytes(range(100, 100 + prefix)) + SECRET.encode() + b"\x00\xff trailing bytes"
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    for blob in (encode(data).decode(), encode(data).decode().rstrip("=")):
        assert SECRET.encode() in _b64(blob)
        out = registry(SECRET).redact(f"blob={blob};")
        assert REDACTED in out and out.startswith("blob=") and out.endswith(";")
        assert encode(SECRET.encode()[3:-3]).decode()[4:-4] not in out


def test_json_escaped_and_non_ascii_values():
    value = 'pa"ss\\wörd-0123456789'
    reg = registry(value)
    for text in (json.dumps({"k": value}), json.dumps({"k": value}, ensure_ascii=False)):
        assert value not in text and json.loads(text) == {"k": value}
        assert {"k": REDACTED} == json.loads(reg.redact(text))  # found escaped, and still JSON
    assert REDACTED == reg.redact(value.encode().hex(" "))


def test_ordinary_text_is_left_alone_with_many_secrets_registered():
    reg = registry(*(f"secret-value-{i:02d}-{'x' * (i % 7)}-abcdefgh" for i in range(50)))
    samples = [
        Path(__file__).read_text(),
        sh("xxd -l 4096 /bin/ls; od -An -tx1 -N 2048 /bin/ls; od -c -N 2048 /bin/ls; base64 -w 76 /bin/ls | head -50",
           Path("/")),
        "\n".join(str(i) for i in range(20000)),
        "a b c d e f g h i j k l m n o p\n" * 20,
        "Total: 50% done, 100%25 URL-ish %41%42 text\n",
    ]
    for text in samples:
        assert reg.redact(text) == text


def test_short_values_are_not_redacted():
    reg = registry("none", "abcde")
    assert "none of abcde" == reg.redact("none of abcde")
    assert MIN_SECRET_LEN == 6


def test_a_longer_secret_is_redacted_whole_and_two_near_each_other_too():
    reg = registry("abcd1234", "abcd1234efgh")
    assert f"x {REDACTED} y" == reg.redact("x abcd1234efgh y")
    assert f"x {REDACTED}, {REDACTED} y" == reg.redact("x abcd1234efgh, abcd1234 y")


def test_redact_is_fast_on_a_megabyte_with_fifty_secrets():
    reg = registry(*(f"Sx{i:03d}-" + base64.b64encode(bytes([i]) * 24).decode() for i in range(50)))
    reg.redact("warm up: the patterns are built here")
    text = (Path(__file__).read_text() * 40)[: 1 << 20]
    started = time.process_time()
    out = reg.redact(text)
    spent = time.process_time() - started
    assert out == text
    assert spent < 0.3, f"{spent * 1000:.0f} ms of CPU for 1 MB (bench/redact.py measures it properly)"


# --- the values a process knows ----------------------------------------------------------------------------


def test_a_watched_file_is_read_again_when_it_changes(tmp_path):
    secrets_file = tmp_path / "secrets.json"
    set_secret(secrets_file, "first", "first-value-123456")
    reg = Registry()
    reg.watch(secrets_file, lambda data: json.loads(data).values())
    assert REDACTED == reg.redact("first-value-123456")
    assert "later-value-654321" == reg.redact("later-value-654321")
    set_secret(secrets_file, "later", "later-value-654321")
    reg.refresh()
    assert REDACTED == reg.redact("later-value-654321")


@pytest.fixture
def fresh_registry(monkeypatch):
    monkeypatch.setattr(redact, "_registry", Registry())


def test_every_secret_starling_knows_is_registered_at_start(tmp_path, monkeypatch, fresh_registry):
    (tmp_path / "config.toml").write_text(
        '[[gateways.telegram]]\nid = "main"\nagent = "default"\ntoken = "telegram-main"\n'
        '[[gateways.slack]]\nid = "team"\nagent = "default"\nmode = "events"\nsigning_secret = "slack-signing"\n')
    cfg = load_config(tmp_path / "config.toml")
    paths = paths_for(tmp_path, cfg)
    paths.data_dir.mkdir(parents=True)
    paths.secrets_file.write_text(json.dumps({"unused-by-config": "file-only-value-0001"}))  # by another process
    monkeypatch.setenv("TELEGRAM_MAIN", "123456:env-only-telegram-token")
    monkeypatch.setenv("STARLING_SECRET_SLACK_SIGNING", "env-only-signing-secret-0002")
    monkeypatch.setenv("STARLING_SECRET_NOT_IN_CONFIG", "env-only-extra-value-0003")
    session = ensure_token_file(paths.session_secret_file).decode()
    control = ensure_token_file(paths.control_token_file).decode()
    values = ["file-only-value-0001", "123456:env-only-telegram-token", "env-only-signing-secret-0002",
              "env-only-extra-value-0003", session, control]
    assert all(redact.redact(v) == v for v in values)  # nothing known before
    register_known_secrets(paths, cfg)
    assert [REDACTED] * len(values) == [redact.redact(v) for v in values]
    assert redact.redact(base64.b64encode(control.encode()).decode()).startswith(REDACTED)


def test_session_secret_from_the_environment_and_a_token_file_made_later(tmp_path, monkeypatch, fresh_registry):
    cfg = load_config_text(tmp_path, "")
    paths = paths_for(tmp_path, cfg)
    paths.data_dir.mkdir(parents=True)
    monkeypatch.setenv("SESSION_SECRET", "session-secret-from-env-0004")
    register_known_secrets(paths, cfg)
    assert REDACTED == redact.redact("session-secret-from-env-0004")
    control = ensure_token_file(paths.control_token_file).decode()  # control made it after this process started
    redact.refresh()
    assert REDACTED == redact.redact(f"token {control[::-1]}").split()[-1]


def load_config_text(folder: Path, text: str):
    (folder / "config.toml").write_text(text)
    return load_config(folder / "config.toml")


def test_a_bus_message_is_redacted_field_by_field_and_its_json_stays_json(fresh_registry):
    redact.register_secret("sk-in-a-message-0005")
    meta = json.dumps({"tool_calls": [{"id": "c1", "name": "shell", "arguments": {"command": "echo sk-in-a-message-0005"}}]})
    op = m.AppendTurn(session_id=1, worker="w", role="assistant", content="key: sk-in-a-message-0005", meta=meta)
    out = redact.redact_struct(op)
    assert ("key: [redacted]", "echo [redacted]") == (
        out.content, json.loads(out.meta)["tool_calls"][0]["arguments"]["command"])
    finish = m.FinishTurn(turn_id=1, worker="w", ok=True, answer="ok", replies=[m.Reply(text="sk-in-a-message-0005")])
    assert REDACTED == redact.redact_struct(finish).replies[0].text
    untouched = m.ClaimTurn(worker="runner:1", lease_s=30)
    assert redact.redact_struct(untouched) is untouched
    assert msgspec.json.decode(msgspec.json.encode(out), type=m.AppendTurn) == out


# --- through the real shell tool -----------------------------------------------------------------------------


def _output(content: str) -> str:
    return content.split("\n", 1)[1]  # after the "[exit code 0]" line


SHELL_FORMS = [
    ("rev", "rev leak.txt", lambda t: t[::-1].encode()),
    ("base64", "base64 leak.txt", _b64),
    ("xxd -p", "xxd -p leak.txt", lambda t: bytes.fromhex("".join(t.split()))),
    ("od -c", "od -c leak.txt", lambda t: _od_c(t, offsets=True)),
    ("od -An -tx1", "od -An -tx1 leak.txt", lambda t: _hex_tokens(t, offsets=False)),
    ("url, every byte", "while IFS= read -r -n1 c; do printf '%%%02X' \"'$c\"; done < leak.txt", _hex_prefixed),
    ("url, reserved only", "sed 's/\\//%2F/g; s/+/%2B/g; s/=/%3D/g' leak.txt", lambda t: urllib.parse.unquote(t).encode()),
]


@pytest.mark.parametrize("name,command,decode", SHELL_FORMS, ids=[f[0] for f in SHELL_FORMS])
def test_a_shell_command_printing_a_secret_encoded_returns_none_of_it(home, fresh_registry, name, command, decode):
    import asyncio

    from services.runner.tools import registry as tools
    from tests.tool_helpers import make_ctx

    ctx = make_ctx(home)
    ctx.approved = True  # what the classifier thinks of the command is not the point here
    (home.paths.private_workspace(ctx.agent) / "leak.txt").write_text(PLAIN)
    raw = asyncio.run(tools.execute(ctx, "shell", {"command": command}))
    assert "ok" == raw.outcome and SECRET.encode() in decode(_output(raw.content)), raw.content
    redact.register_secret(SECRET)
    result = asyncio.run(tools.execute(ctx, "shell", {"command": command}))
    assert "ok" == result.outcome and REDACTED in result.content
    assert not leaks(decode, _output(result.content)), result.content


# --- in a runner process: tool results, model requests, stored turns, FTS, audit -------------------------------

FILE_ONLY = "fileonlypassphrase7f3a9c0d"  # in secrets.json under a name no config uses: never resolved
ENV_TOKEN = "8142:envonlytelegramtokenZq9X"  # only in the environment, under the name the config gives
LATER = "storedwhilerunning5b1e77aa"  # set with the runner already up


def test_a_runner_redacts_every_known_value_from_what_it_sends_and_stores(monkeypatch):
    from common.stores import audit_store, recall_store
    from tests.procs import Proc, start_writer
    from tests.runner_stack import converse, own_home, reader, started, tool_results

    gateway = '[[gateways.telegram]]\nid = "tg"\nagent = "default"\ntoken = "telegram-main"\n'
    monkeypatch.setenv("TELEGRAM_MAIN", ENV_TOKEN)
    with own_home(edit=lambda text: text + gateway) as home:
        paths = home.paths
        set_secret(paths.secrets_file, "backup-passphrase", FILE_ONLY)
        session = paths.session_secret_file.read_text().strip()
        control = ensure_token_file(paths.control_token_file).decode()
        forms = {"file only": FILE_ONLY, "env token, base64": base64.b64encode(ENV_TOKEN.encode()).decode(),
                 "session secret, reversed": session[::-1], "control token, hex": control.encode().hex()}
        (paths.shared_workspace / "leak.txt").write_text("\n".join(forms.values()) + "\n")
        (paths.agents_dir / "default" / "MEMORY.md").write_text(f"The backup passphrase is {FILE_ONLY}.\n")
        started(home, start_writer(home))
        started(home, Proc(home, "runner"))
        home.fake.add({"tool_call": {"name": "file_read", "arguments": {"path": "leak.txt"}}},
                      {"tool_call": {"name": "file_write", "arguments": {"path": "copy.txt", "content": FILE_ONLY}}},
                      {"text": "All read."})
        accepted, replies = converse(home, "leak-chat", "read leak.txt and copy the passphrase")
        assert ["All read."] == replies
        (paths.shared_workspace / "later.txt").write_text(LATER + "\n")
        set_secret(paths.secrets_file, "later", LATER)  # by another process, the runner running
        home.fake.add({"tool_call": {"name": "file_read", "arguments": {"path": "later.txt"}}}, {"text": "Read."})
        converse(home, "leak-chat", "and later.txt")

        # the tool ran with the real value (so the call held it), and what the model got back held none
        assert FILE_ONLY == (paths.shared_workspace / "copy.txt").read_text()
        requests = [r["body"] for r in home.fake.requests("openai")]
        results = [content for body in requests for _, content in tool_results(body)]
        assert any(REDACTED in c and "\n" in c for c in results) and any(REDACTED in c for c in results[-1:])
        sent = json.dumps(requests)
        values = [*forms.values(), ENV_TOKEN, session, control, LATER]
        assert [] == [v for v in values if v in sent]
        assert f"The backup passphrase is {REDACTED}." in requests[0]["messages"][0]["content"]  # the system prompt

        conn = reader(home)
        stored = paths.db_file.read_bytes() + (paths.db_file.parent / "starling.db-wal").read_bytes()
        assert [] == [v for v in values if v.encode() in stored]
        assert [] == recall_store.search(conn, FILE_ONLY) + recall_store.search(conn, LATER)
        audit = audit_store.tools_for_session(conn, accepted.session_id)
        assert ["file_read", "file_write", "file_read"] == [a.tool for a in audit]
        assert REDACTED in audit[1].arguments and FILE_ONLY not in audit[1].arguments


def test_a_secret_pasted_into_a_chat_is_not_stored(writer_home):
    """The writer redacts an inbound message's text before it becomes a turn (and so the FTS index)."""
    import asyncio
    import uuid

    from common import db
    from common.db import read_tx
    from common.secrets import set_secret
    from common.stores import turn_store
    from schema import messages as m

    value = "sk-pasted-" + uuid.uuid4().hex
    set_secret(writer_home.paths.secrets_file, "pasted", value)
    time.sleep(1.2)  # the writer looks at secrets.json at most once a second

    async def send():
        async with writer_home.client("gateway") as c:
            return await c.call(m.Inbound(agent="default", instance="t", chat="paste", sender="u", text=f"key: {value}",
                                          dedupe_keys=[uuid.uuid4().hex]))

    accepted = asyncio.run(send())
    conn = db.open_reader(writer_home.paths.db_file)
    with read_tx(conn) as c:
        text = turn_store.get(c, accepted.turn_id).content
    assert value not in text and "key: " in text
