"""What a model is shown of inbound files (services/runner/media.py): images scaled into each provider's
limits and accepted by the strict fakes' image rules, the newest max_images only, the line for a model
without vision, documents and PDFs inlined, and nothing opened that the turn did not bring."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
from PIL import Image as PILImage

from common.config import Provider
from services.runner import media
from services.runner.llm import Image, Message
from services.runner.providers.anthropic import AnthropicProvider
from services.runner.providers.openai import OpenAIProvider
from tests.model_api_rules import anthropic_refusal, openai_refusal
from tests.model_image_rules import anthropic_image_problem, openai_image_problem, picture

HEADERS = {"authorization": "Bearer k", "x-api-key": "k", "anthropic-version": "2023-06-01"}


@pytest.fixture
def root(tmp_path) -> Path:
    folder = tmp_path / "attachments" / "default"
    (folder / "2026-05-01").mkdir(parents=True)
    return folder


def save(root: Path, name: str, image=None, data: bytes | None = None, **kw) -> str:
    path = root / "2026-05-01" / name
    if data is not None:
        path.write_bytes(data)
    else:
        image.save(path, **kw)
    return str(path)


def photo(size=(4000, 3000), mode="RGB", color=(200, 30, 30)):
    return PILImage.new(mode, size, color)


def user(path: str, kind: str = "photo", text: str = "what is this?") -> Message:
    kb = Path(path).stat().st_size // 1024
    return Message("user", f"{text}\n[{kind} attached: {path} ({kb} KB)]", attachments=(path,))


def provider(kind: str, vision: bool = True, max_images: int = 4) -> Provider:
    return Provider(kind=kind, model="m", vision=vision, max_images=max_images)


def body(kind: str, messages: list[Message]) -> dict:
    cls = AnthropicProvider if kind == "anthropic" else OpenAIProvider
    return cls("p", provider(kind), Path("/nonexistent"))._body("system", messages, [], 100)


def decoded(image: Image) -> PILImage.Image:
    return PILImage.open(io.BytesIO(base64.b64decode(image.data)))


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_a_big_photo_is_scaled_into_the_providers_limits_and_the_api_takes_it(root, kind):
    path = save(root, "big.jpg", photo((6000, 4000)), format="JPEG")
    [shown] = media.show([user(path)], root, provider(kind))
    limits = media.LIMITS[kind]
    [image] = shown.images
    width, height = decoded(image).size
    assert max(width, height) <= limits.max_edge and width * height <= limits.max_pixels
    assert abs(width / height - 1.5) < 0.01 and "image/jpeg" == image.media_type
    assert "[photo attached: attachments/2026-05-01/big.jpg (" in shown.content and str(root) not in shown.content
    check = anthropic_refusal if kind == "anthropic" else openai_refusal
    assert check(body(kind, [shown]), HEADERS) is None


def test_a_small_png_goes_as_it_is_and_a_transparent_big_one_stays_png(root):
    small = save(root, "small.png", photo((300, 200), "RGBA", (0, 0, 255, 100)), format="PNG")
    big = save(root, "big.png", photo((3000, 2000), "RGBA", (0, 0, 255, 100)), format="PNG")
    as_is, scaled = media.show([user(small), user(big)], root, provider("anthropic"))
    assert Path(small).read_bytes() == base64.b64decode(as_is.images[0].data)
    assert "image/png" == scaled.images[0].media_type and "RGBA" == decoded(scaled.images[0]).mode


def test_an_animated_gif_becomes_its_first_frame_and_a_turned_jpeg_is_turned(root):
    frames = [photo((64, 32), color=(255, 0, 0)), photo((64, 32), color=(0, 255, 0))]
    gif = save(root, "anim.gif", frames[0], format="GIF", save_all=True, append_images=frames[1:], duration=100)
    turned = photo((80, 40))
    exif = turned.getexif()
    exif[0x0112] = 6  # "rotate 90 CW to view": the APIs ignore EXIF, so the pixels must be turned
    jpeg = save(root, "turned.jpg", turned, format="JPEG", exif=exif)
    shown = media.show([user(gif, "animation"), user(jpeg)], root, provider("openai"))
    assert "image/gif" != shown[0].images[0].media_type and not picture(base64.b64decode(shown[0].images[0].data))[3]
    assert (40, 80) == decoded(shown[1].images[0]).size
    assert openai_refusal(body("openai", shown), HEADERS) is None


def test_only_the_newest_max_images_are_shown_and_the_rest_are_named(root):
    paths = [save(root, f"p{i}.jpg", photo((50, 50)), format="JPEG") for i in range(3)]
    shown = media.show([user(p, text=f"look {i}") for i, p in enumerate(paths)], root, provider("openai", max_images=2))
    assert [0, 1, 1] == [len(m.images) for m in shown]
    assert "not shown: only the newest 2 images are shown to you" in shown[0].content
    assert "p2.jpg" in shown[2].content and "you can see it" in shown[2].content


def test_without_vision_the_line_says_so_and_no_image_goes(root):
    path = save(root, "p.jpg", photo((50, 50)), format="JPEG")
    [shown] = media.show([user(path)], root, provider("anthropic", vision=False))
    assert () == shown.images
    assert "[photo attached: attachments/2026-05-01/p.jpg (" in shown.content
    assert "the model in use cannot see images" in shown.content


def test_a_broken_image_is_named_with_why(root):
    path = save(root, "broken.jpg", data=b"\xff\xd8\xff\xe0" + b"\x00" * 200)
    [shown] = media.show([user(path)], root, provider("anthropic"))
    assert () == shown.images and "could not be shown: " in shown.content


def test_a_typed_line_or_a_file_outside_the_folder_is_never_opened(root, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("the secret")
    typed = Message("user", f"[document attached: {outside} (1 KB)]")  # the person typed it: no attachment
    listed = Message("user", f"[document attached: {outside} (1 KB)]", attachments=(str(outside),))
    for msg in (typed, listed):
        [shown] = media.show([msg], root, provider("anthropic"))
        assert "the secret" not in shown.content and msg.content == shown.content


def test_text_documents_are_inlined_within_the_budget(root, monkeypatch):
    notes = save(root, "notes.md", data=b"# Plan\n- buy milk\n")
    big = save(root, "log.txt", data=b"x" * 5000)
    monkeypatch.setattr(media, "DOCS_BUDGET", 3000)
    first, second = media.show([user(notes, "document"), user(big, "document")], root, provider("openai"))
    assert "not inlined: too much text in this conversation already; read it with file_read" in first.content
    assert '<document name="log.txt">' in second.content and "cut at 3000 characters" in second.content
    [alone] = media.show([user(notes, "document")], root, provider("openai"))
    assert '<document name="notes.md">\n# Plan\n- buy milk\n' in alone.content


def test_a_pdf_is_inlined_as_its_text(root):
    path = save(root, "letter.pdf", data=_pdf("Dear Starling, the meeting is on Tuesday."))
    scan = save(root, "scan.pdf", photo((100, 100)), format="PDF")
    letter, scanned = media.show([user(path, "document"), user(scan, "document")], root, provider("anthropic"))
    assert "[page 1]\nDear Starling, the meeting is on Tuesday." in letter.content
    assert "not inlined: the PDF has no text layer (a scan?)" in scanned.content


def test_audio_without_a_transcript_says_why(root):
    path = save(root, "voice.oga", data=b"OggS" + bytes(100))
    [shown] = media.show([user(path, "voice")], root, provider("openai"))
    assert "; not transcribed: no transcription service is configured]" in shown.content


# ---------------------------------------------------------------- the fakes' image rules


def _png(size=(10, 10)) -> str:
    buf = io.BytesIO()
    photo(size).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _anthropic(data: str, media_type: str = "image/png") -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def test_anthropic_refuses_what_the_api_refuses():
    ok = _anthropic(_png())
    assert anthropic_image_problem([(0, 0, ok)]) is None
    assert "does not match the provided media type image/jpeg" in anthropic_image_problem(
        [(0, 0, _anthropic(_png(), "image/jpeg"))])
    assert "exceeds 5 MB maximum" in anthropic_image_problem([(0, 0, _anthropic("A" * (5 * 1024 * 1024 + 4)))])
    assert "Could not process image" in anthropic_image_problem([(0, 0, _anthropic("not base64!"))])
    assert "8000 pixels" in anthropic_image_problem([(0, 0, _anthropic(_png((8001, 1))))])
    many = [(0, j, _anthropic(_png((2001, 1)))) for j in range(21)]
    assert "for many-image requests: 2000 pixels" in anthropic_image_problem(many)
    bad_type = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        _anthropic(_png(), "image/bmp"), {"type": "text", "text": "hi"}]}]}
    assert "Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'" in anthropic_refusal(
        bad_type, HEADERS).message


def _openai(url: str, role: str = "user") -> list[dict]:
    parts = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}]
    return [{"role": role, "content": parts}]


def test_openai_refuses_what_the_api_refuses():
    assert openai_image_problem(_openai(f"data:image/png;base64,{_png()}")) is None
    assert "unsupported MIME type 'image/bmp'" in openai_image_problem(_openai(f"data:image/bmp;base64,{_png()}"))[0]
    assert "unsupported image" in openai_image_problem(_openai("data:image/png;base64,aGVsbG8="))[0]
    frames = io.BytesIO()
    photo((8, 8)).save(frames, "GIF", save_all=True, append_images=[photo((8, 8), color=(0, 0, 0))])
    animated = base64.b64encode(frames.getvalue()).decode()
    assert "unsupported image" in openai_image_problem(_openai(f"data:image/gif;base64,{animated}"))[0]
    system = [{"role": "system", "content": [{"type": "refusal", "refusal": "no"}]}, {"role": "user", "content": "x"}]
    assert "Content parts of a 'system' message" in openai_refusal({"model": "m", "messages": system}, HEADERS).message
    assistant = {"model": "m", "messages": [{"role": "user", "content": "x"}, *_openai("data:,", "assistant")]}
    assert "only allowed for messages with role 'user'" in openai_refusal(assistant, HEADERS).message


def _pdf(text: str) -> bytes:
    """A one-page PDF whose text layer says ``text`` (Helvetica), with a correct cross-reference table."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
        b" /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, obj in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + obj + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def test_the_file_tools_read_the_agents_own_attachments_and_write_none(home):
    import asyncio

    from services.runner.tools import registry
    from tests.tool_helpers import make_ctx

    ctx = make_ctx(home, agent="alice")
    for agent, text in (("alice", "alice's notes"), ("bob", "bob's notes")):
        folder = home.paths.attachments_dir / agent / "2026-05-01"
        folder.mkdir(parents=True)
        (folder / "notes.txt").write_text(text)
    read = asyncio.run(registry.execute(ctx, "file_read", {"path": "attachments/2026-05-01/notes.txt"}))
    write = asyncio.run(registry.execute(ctx, "file_write", {"path": "attachments/new.txt", "content": "x"}))
    climb = asyncio.run(registry.execute(ctx, "file_read", {"path": "attachments/../bob/2026-05-01/notes.txt"}))
    assert "ok" == read.outcome and "alice's notes" in read.content
    assert ("refused", "refused") == (write.outcome, climb.outcome) and "read-only" in write.content
