"""An image and a voice note end to end on each platform: the platform's fake, the gateway, the writer, the
runner, a strict fake vision model (Anthropic or OpenAI, image rules as the APIs check them) and the strict
fake transcription server, each a process of its own. The photo reaches the model as an image part within
the provider's limits; the voice note is uploaded as the API expects and its transcript becomes the
person's text, stored, answered and found by the model."""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image as PILImage

from tests.fake_transcription import FakeTranscriptionProcess

OGG = b"OggS\x00\x02\x00\x00" + bytes(range(256)) * 4
SAID = "please water the tomatoes at six"


@pytest.fixture(scope="module")
def ears(tmp_path_factory):
    fake = FakeTranscriptionProcess(tmp_path_factory.mktemp("ears"), [{"text": SAID}] * 3).start()
    yield fake
    fake.stop()


def extra(ears, kind: str) -> str:
    model_url = "{MODEL_URL}" + ("/v1" if kind == "openai" else "")
    return (f'[providers.eyes]\nkind = "{kind}"\nbase_url = "{model_url}"\napi_key = "openai"\n'
            'model = "fake-vision"\nvision = true\nmax_images = 2\n'
            f'[providers.ears]\nbase_url = "{ears.api_url}"\napi_key = "openai"\nmodel = "unused"\n'
            '[transcription]\nprovider = "ears"\nlanguage = "en"\n')


def use_vision(stack) -> None:
    pack = stack.home.paths.agents_dir / "default" / "config.toml"
    pack.write_text(pack.read_text().replace('provider = "default"', 'provider = "eyes"'))


def jpeg(size=(3000, 2000)) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", size, (220, 40, 40)).save(buf, "JPEG")
    return buf.getvalue()


def check_sight_and_hearing(stack, kind: str, ears, instance: str, chat: str, label: str = "voice note") -> None:
    requests = stack.fake_model.requests(kind)
    assert requests and not [r["invalid"] for r in requests if "invalid" in r]  # the strict fake took every one
    images = [_image_of(kind, part) for r in requests for msg in r["body"]["messages"]
              if isinstance(msg.get("content"), list) for part in msg["content"] if _image_of(kind, part)]
    assert images, "no image reached the model"
    width, height = PILImage.open(io.BytesIO(base64.b64decode(images[0]))).size
    limit = 1568 if kind == "anthropic" else 2048
    assert max(width, height) <= limit and abs(width / height - 1.5) < 0.01
    photo_turn, voice_turn = stack.user_turns(instance, chat)[-2:]
    assert "[photo attached: " in photo_turn or "[image attached: " in photo_turn
    assert f"[{label}, transcribed] {SAID}" in voice_turn and "attached:" not in voice_turn
    assert stack.model_saw(SAID) or any(SAID in json.dumps(r["body"]) for r in requests)
    uploads = [r["fields"]["file"] for r in ears.requests() if "invalid" not in r and r["fields"].get("file")]
    assert any(u["content_type"].startswith("audio/") and u["filename"].endswith((".ogg", ".m4a")) for u in uploads)
    assert not [r["invalid"] for r in ears.requests() if "invalid" in r]


def _image_of(kind: str, part) -> str:
    if not isinstance(part, dict):
        return ""
    if kind == "anthropic" and part.get("type") == "image":
        return part["source"]["data"]
    if kind == "openai" and part.get("type") == "image_url":
        return part["image_url"]["url"].split(",", 1)[1]
    return ""


def test_telegram_a_photo_and_a_voice_note(ears):
    from tests.telegram_stack import OWNER, Stack

    stack = Stack(extra=extra(ears, "anthropic"))
    try:
        use_vision(stack)
        stack.start_gateway()
        stack.tg.photo(jpeg(), caption="what colour is this?", user=OWNER)
        stack.replies(OWNER, 1)
        stack.tg.voice(OGG, user=OWNER)
        replies = stack.replies(OWNER, 2)
        assert SAID in replies[-1]["text"]  # the fake model echoes the person's last text
        check_sight_and_hearing(stack, "anthropic", ears, "tg", str(OWNER))
    finally:
        stack.stop()


def test_slack_an_image_and_an_audio_clip(ears):
    from tests.slack_stack import OWNER, SlackStack

    stack = SlackStack(extra=extra(ears, "openai"))
    try:
        use_vision(stack)
        stack.start_gateway()
        shot = stack.sl.add_file(jpeg(), name="shot.jpg", mimetype="image/jpeg")
        stack.sl.message("D0OWNER", OWNER, "what is this?", channel_type="im", files=[shot])
        stack.posted("D0OWNER", 1)
        m4a = b"\x00\x00\x00\x20ftypM4A \x00\x00\x02\x00" + bytes(600)
        clip = stack.sl.add_file(m4a, name="audio_message.m4a", mimetype="audio/mp4")
        stack.sl.message("D0OWNER", OWNER, "", channel_type="im", files=[clip])
        replies = stack.posted("D0OWNER", 2)
        assert SAID in replies[-1]["text"]
        check_sight_and_hearing(stack, "openai", ears, "sl", "D0OWNER", label="audio")
    finally:
        stack.stop()


def test_whatsapp_an_image_and_a_voice_note(ears):
    from tests.whatsapp_stack import OWNER, WhatsAppStack

    stack = WhatsAppStack(extra=extra(ears, "anthropic"))
    try:
        use_vision(stack)
        stack.start_gateway()
        stack.wa.message(OWNER, type="image", content=jpeg(), caption="what is this?", mime_type="image/jpeg")
        stack.replies(OWNER, 1)
        stack.wa.message(OWNER, type="audio", content=OGG, mime_type="audio/ogg; codecs=opus", voice=True)
        replies = stack.replies(OWNER, 2)
        assert SAID in (replies[-1].get("text") or "")
        check_sight_and_hearing(stack, "anthropic", ears, "wa", OWNER)
    finally:
        stack.stop()
