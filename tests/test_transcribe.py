"""Voice notes to text (services/runner/transcribe.py) against the strict fake transcription server: the
multipart request the real API expects, the transcript in place of the line, failures that say why, what
the fake refuses as the real service does, and the writer's SetTurnText held to the turn's lease."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import msgspec
import pytest
import structlog

from common import db
from common.config import Config
from common.errors import WriteRejected
from common.secrets import set_secret
from common.stores import recall_store, turn_store
from schema import messages as m
from services.runner import transcribe
from services.runner.llm import Message
from tests.fake_transcription import MAX_BYTES, FakeTranscription

OGG = b"OggS\x00\x02" + os.urandom(600)
LOG = structlog.get_logger()


def config(url: str, **transcription) -> Config:
    return msgspec.convert({
        "providers": {"default": {"model": "m"}, "whisper": {"base_url": url, "api_key": "whisper-key", "model": "m"}},
        "transcription": {"provider": "whisper", "language": "en", **transcription},
    }, Config)


@pytest.fixture
def place(tmp_path) -> tuple[Path, Path]:
    root = tmp_path / "attachments" / "default"
    (root / "2026-05-01").mkdir(parents=True)
    secrets = tmp_path / "secrets.json"
    set_secret(secrets, "whisper-key", "sk-whisper-test-1234")
    return root, secrets


def voice(root: Path, name: str = "tg-1-2-0-voice-abc.oga", data: bytes = OGG, kind: str = "voice") -> Message:
    path = root / "2026-05-01" / name
    path.write_bytes(data)
    return Message("user", f"[{kind} attached: {path} ({len(data) // 1024} KB)]", attachments=(str(path),))


def hear(msg: Message, url: str, place, **kw) -> str | None:
    root, secrets = place
    return asyncio.run(transcribe.hear(msg, config(url, **kw), secrets, root, LOG))


def run(fake: FakeTranscription, fn):
    async def go():
        async with fake:
            return await asyncio.to_thread(fn, fake.url)
    return asyncio.run(go())


def test_a_voice_note_becomes_its_transcript_sent_as_the_api_expects(place):
    fake = FakeTranscription([{"text": " Buy milk on the way home. "}])
    text = run(fake, lambda url: hear(voice(place[0]), url, place))
    assert "[voice note, transcribed] Buy milk on the way home." == text
    [request] = fake.requests
    assert "invalid" not in request
    fields = request["fields"]
    assert {"filename": "audio.ogg", "content_type": "audio/ogg", "size": len(OGG)} == {
        k: fields["file"][k] for k in ("filename", "content_type", "size")}
    assert ("whisper-1", "en", "json") == (fields["model"], fields["language"], fields["response_format"])


def test_a_failing_service_is_retried_then_the_line_says_why(place, monkeypatch):
    monkeypatch.setattr(transcribe, "BACKOFF_S", 0.01)
    fake = FakeTranscription([{"status": 503, "message": "overloaded"}] * 3)
    msg = voice(place[0], kind="voice note")
    text = run(fake, lambda url: hear(msg, url, place))
    assert 3 == len(fake.requests)
    assert text.startswith(msg.content[:-1] + "; not transcribed: the service answered HTTP 503: overloaded")
    assert text.endswith("(3 tries)]")
    assert hear(Message("user", text, attachments=msg.attachments), "http://127.0.0.1:9", place) is None  # once


def test_a_refusal_is_not_retried_and_what_the_api_cannot_take_is_not_sent(place):
    fake = FakeTranscription()
    refused = run(fake, lambda url: hear(voice(place[0]), url, place, model="no-such-model"))
    amr_note = voice(place[0], "v.amr", b"#!AMR\n" + bytes(50), "audio")
    amr = run(FakeTranscription(), lambda url: hear(amr_note, url, place))
    big = run(FakeTranscription(), lambda url: hear(voice(place[0], "big.ogg"), url, place, max_mb=0.0001))
    assert 1 == len(fake.requests) and "Invalid model 'no-such-model'" in refused
    assert "not transcribed: its format (amr) is not one the transcription service takes" in amr
    assert "not transcribed: it is 0.0 MB, over the 0.0001 MB the service takes" in big


def test_nothing_to_do_without_transcription_or_audio(place):
    root, _ = place
    assert hear(voice(root), "http://127.0.0.1:9", place, provider="") is None
    photo = root / "2026-05-01" / "p.jpg"
    photo.write_bytes(b"\xff\xd8\xff" + bytes(10))
    assert hear(Message("user", f"[photo attached: {photo} (0 KB)]", attachments=(str(photo),)),
                "http://127.0.0.1:9", place) is None


@pytest.mark.parametrize("change,fragment", [
    (lambda f: f.pop("model"), "you must provide a model parameter"),
    (lambda f: f.update(file=("voice.oga", "audio/ogg", OGG)), "Invalid file format. Supported formats:"),
    (lambda f: f.update(file=("voice.ogg", "audio/ogg", b"RIFF" + bytes(60))), "Audio file might be corrupted"),
    (lambda f: f.update(language="english"), "Language parameter must be specified in ISO-639-1 format"),
    (lambda f: f.update(model="gpt-4o-transcribe", response_format="srt"), "is not compatible with model"),
])
def test_the_fake_refuses_what_the_api_refuses(change, fragment):
    import aiohttp

    fields = {"file": ("voice.ogg", "audio/ogg", OGG), "model": "whisper-1", "response_format": "json"}
    change(fields)

    async def go():
        async with FakeTranscription() as fake, aiohttp.ClientSession() as session:
            form = aiohttp.FormData()
            for name, value in fields.items():
                if name == "file":
                    form.add_field("file", value[2], filename=value[0], content_type=value[1])
                else:
                    form.add_field(name, value)
            async with session.post(f"{fake.url}/audio/transcriptions", data=form,
                                    headers={"authorization": "Bearer k"}) as resp:
                return resp.status, await resp.json()

    status, body = asyncio.run(go())
    assert 400 == status and fragment in body["error"]["message"]


def test_the_fake_refuses_no_key_and_more_than_25_mb():
    import aiohttp

    async def go():
        async with FakeTranscription() as fake, aiohttp.ClientSession() as session:
            url = f"{fake.url}/audio/transcriptions"
            async with session.post(url, data=b"x") as no_key:
                first = no_key.status
            async with session.post(url, data=b"x" * (MAX_BYTES + 1), headers={
                    "authorization": "Bearer k", "content-type": "multipart/form-data; boundary=b"}) as big:
                return first, big.status, (await big.json())["error"]["message"]

    no_key, too_big, message = asyncio.run(go())
    assert (401, 413) == (no_key, too_big) and "Maximum content size limit (26214400) exceeded" in message


def test_only_the_holder_of_a_turn_may_rewrite_it_and_recall_finds_the_transcript(writer_home):
    async def go():
        async with writer_home.client("runner") as c:
            await c.call(m.Inbound(agent="default", instance="t", chat="voice", sender="u", text="[voice attached: x]",
                                   dedupe_keys=["voice:1"]))
            claim = await c.call(m.ClaimTurn(worker="w1", lease_s=30))
            with pytest.raises(WriteRejected) as other:
                await c.call(m.SetTurnText(turn_id=claim.turn_id, worker="w2", content="stolen"))
            await c.call(m.SetTurnText(turn_id=claim.turn_id, worker="w1",
                                       content="[voice note, transcribed] pelicans at dawn"))
            return claim.turn_id, other.value.code

    turn_id, code = asyncio.run(go())
    conn = db.open_reader(writer_home.paths.db_file)
    with db.read_tx(conn):
        stored = turn_store.get(conn, turn_id).content
        hits = recall_store.search(conn, "pelicans")
    assert ("lease_lost", "[voice note, transcribed] pelicans at dawn") == (code, stored)
    assert [turn_id] == [h.turn_id for h in hits]


@pytest.mark.parametrize("text,key,fragment", [
    ('[transcription]\nprovider = "nope"\n', "transcription.provider", "no [providers.nope]; expected one of: default"),
    ('[providers.claude]\nkind = "anthropic"\nmodel = "m"\n[transcription]\nprovider = "claude"\n',
     "transcription.provider", "needs an OpenAI-compatible one"),
    ('[transcription]\nprovider = "default"\nlanguage = "english"\n', "transcription.language", "expected"),
])
def test_the_config_names_what_is_wrong(tmp_path, text, key, fragment):
    from common.config import load_config
    from common.errors import ConfigError

    (tmp_path / "config.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "config.toml")
    assert key in str(err.value) and fragment in str(err.value)
