"""What the model is shown of a person's inbound files, in place of the line the gateway wrote for each.

- Images go to a provider marked ``vision = true`` as image parts, scaled to that provider's limits
  (Pillow): at most ``max_images`` in one request, the newest first; the others keep their line, saying
  why they are not shown. Without vision the line says the model cannot see it.
- Text documents (txt, md, csv, json, source code, ...) and PDFs (their text, pypdf) are inlined up to
  a cap, the newest first; past the budget the line points at the file tools.
- Audio keeps its line (a transcript already replaced the line when there was one: transcribe.py).
- Every line names the file as the file tools read it, ``attachments/<date>/<name>``, never the home's path.

Only the files listed in a turn's own attachments, and lying under ``data/attachments/<agent>/``, are
opened: a person who types "[photo attached: /etc/passwd (1 KB)]" gets nothing read. The work is CPU
(decoding, scaling, PDF text), so ``show`` is meant for a thread; results are cached by file and mtime.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import math
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from services.runner.llm import Image, Message

DOC_CHARS = 20_000  # of one document inlined
DOCS_BUDGET = 60_000  # of all documents inlined in one request, the newest first
PDF_PAGES = 50
MAX_SOURCE_PIXELS = 60_000_000  # larger pictures are not decoded at all (a decompression bomb, or worse)
TEXT_SNIFF = 4096
TEXT_SUFFIXES = frozenset((
    "txt md markdown rst csv tsv json jsonl ndjson yaml yml toml ini cfg conf log xml html htm css js mjs ts tsx"
    " jsx py rb go rs c h cc cpp hpp java kt swift sh bash zsh sql r lua pl php scala cs ex exs erl hs ml tex"
    " diff patch env properties gradle make cmake dockerfile vue svelte srt vtt").split())
AUDIO_KINDS = ("voice", "voice note", "audio")
_IMAGE_BRANDS = (b"heic", b"heix", b"avif", b"mif1")
_MEDIA_TYPES = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif", "WEBP": "image/webp"}


@dataclass(frozen=True)
class Limits:
    """What a provider takes in one image: pixels on the long edge and in all, and encoded bytes."""

    max_edge: int
    max_pixels: int
    max_bytes: int
    base64_counts: bool  # the byte limit applies to the base64 text (Anthropic), not to the file (OpenAI)


# Anthropic: 8000x8000 px at most (2000x2000 when a request holds more than 20 images) and 5 MB of base64
# per image; images over 1568 px on the long edge or about 1.15 megapixels are scaled down by the API
# anyway, so they are sent at that size. OpenAI: 20 MB per image; high detail fits an image into 2048 px.
LIMITS = {
    "anthropic": Limits(max_edge=1568, max_pixels=1_150_000, max_bytes=5 * 1024 * 1024, base64_counts=True),
    "openai": Limits(max_edge=2048, max_pixels=2048 * 2048, max_bytes=20 * 1024 * 1024, base64_counts=False),
}


def line_pattern(path: str) -> re.Pattern:
    """The gateway's line for the file at ``path`` (services/gateway/attachments.describe), with any note after it."""
    return re.compile(r"\[(?P<kind>[^\[\]\n]{1,40}) attached: " + re.escape(path)
                      + r" \((?P<kb>\d+) KB\)(?P<note>[^\]\n]*)\]")


def file_of(root: Path, path: str) -> Path | None:
    """``path`` as a file inside ``root`` (the agent's attachments folder), else None."""
    try:
        real = Path(os.path.realpath(path))
        base = Path(os.path.realpath(root))
    except (OSError, ValueError):
        return None
    if base not in real.parents or not real.is_file():
        return None
    return real


def shown_path(root: Path, real: Path) -> str:
    """How the file tools name an attachment: attachments/<date>/<name>."""
    return "attachments/" + real.relative_to(Path(os.path.realpath(root))).as_posix()


def sniff(path: Path) -> str:
    """image | pdf | text | audio | other, from the file's first bytes (and its suffix for text)."""
    try:
        with open(path, "rb") as f:
            head = f.read(TEXT_SNIFF)
    except OSError:
        return "other"
    if head.startswith(b"%PDF-"):
        return "pdf"
    if head.startswith((b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*")) \
            or (head[:4] == b"RIFF" and head[8:12] == b"WEBP") \
            or (head[4:8] == b"ftyp" and head[8:12] in _IMAGE_BRANDS):
        return "image"
    if audio_format(head) not in ("", "mp4"):
        return "audio"
    if path.suffix.lower().lstrip(".") in TEXT_SUFFIXES or path.name.lower() in ("dockerfile", "makefile"):
        return "text" if b"\x00" not in head else "other"
    if head and b"\x00" not in head:
        try:
            head.decode("utf-8")
            return "text"
        except UnicodeDecodeError as exc:
            return "text" if exc.start >= len(head) - 4 else "other"  # a character cut at the sniff's end
    return "other"


def audio_format(head: bytes) -> str:
    """The container of an audio file from its first bytes, as the transcription API names formats ("" if none)."""
    if head.startswith(b"OggS"):
        return "ogg"
    if head.startswith(b"fLaC"):
        return "flac"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head.startswith(b"\x1aE\xdf\xa3"):
        return "webm"
    if head.startswith(b"ID3") or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE6 == 0xE2):
        return "mp3"  # an ID3 tag, or an MPEG audio frame header (layer III or II)
    if head[4:8] == b"ftyp" and head[8:12] not in _IMAGE_BRANDS:
        return "m4a" if head[8:11] in (b"M4A", b"M4B") else "mp4"  # mp4: audio or video, as the sender says
    if head.startswith(b"#!AMR"):
        return "amr"
    if len(head) > 1 and head[0] == 0xFF and head[1] & 0xF6 == 0xF0:
        return "aac"  # ADTS
    return ""


# ---------------------------------------------------------------- what a request shows


def show(messages: list[Message], attachments_root: Path, provider) -> list[Message]:
    """``messages`` with each user message's attachment lines rewritten and its images attached, for the
    provider ``provider`` (a config Provider: kind, vision, max_images)."""
    limits = LIMITS.get(provider.kind, LIMITS["openai"])
    images_left = provider.max_images if provider.vision else 0
    chars_left = DOCS_BUDGET
    out = list(messages)
    for index in range(len(out) - 1, -1, -1):  # the newest first: they get the images and the text budget
        msg = out[index]
        if msg.role != "user" or not msg.attachments:
            continue
        content, images = msg.content, []
        for path in msg.attachments:
            found = line_pattern(path).search(content)
            real = file_of(attachments_root, path) if found else None
            if real is None:
                continue
            kind, kb, note = found["kind"], found["kb"], found["note"]
            head = f"[{kind} attached: {shown_path(attachments_root, real)} ({kb} KB)"
            what = sniff(real)
            if what == "image":
                if not provider.vision:
                    line = f"{head}; the model in use cannot see images]"
                elif images_left <= 0:
                    line = f"{head}; not shown: only the newest {provider.max_images} images are shown to you]"
                else:
                    image = scaled(str(real), *_stamp(real), limits)
                    if isinstance(image, Image):
                        images.append(image)
                        images_left -= 1
                        line = f"{head}; you can see it]"
                    else:
                        line = f"{head}; could not be shown: {image}]"
            elif what in ("text", "pdf"):
                text = document(str(real), *_stamp(real), what)
                if chars_left <= 0 or text.startswith("\x00"):
                    why = text[1:] if text.startswith("\x00") else "too much text in this conversation already"
                    tool = "; read it with file_read" if what == "text" else ""
                    line = f"{head}; not inlined: {why}{tool}]"
                else:
                    part = text[:min(DOC_CHARS, chars_left)]
                    chars_left -= len(part)
                    cut = (f"\n[… cut at {len(part)} characters; the rest: file_read with offset]"
                           if len(part) < len(text) else "")
                    line = f"{head}{note}]\n<document name=\"{real.name}\">\n{part}{cut}\n</document>"
            elif kind in AUDIO_KINDS:
                line = f"{head}{note or '; not transcribed: no transcription service is configured'}]"
            else:
                line = f"{head}{note}]"
            content = content[:found.start()] + line + content[found.end():]
        out[index] = dataclasses.replace(msg, content=content, images=tuple(images))
    return out


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


# ---------------------------------------------------------------- images


@lru_cache(maxsize=16)
def scaled(path: str, _mtime_ns: int, _size: int, limits: Limits) -> Image | str:
    """The image at ``path`` within ``limits`` (a JPEG, PNG, GIF or WebP the APIs take), or why not."""
    from PIL import Image as PILImage, ImageOps, UnidentifiedImageError

    try:
        with PILImage.open(path) as im:
            width, height = im.size
            if width * height > MAX_SOURCE_PIXELS:
                return f"it is too large to open ({width}x{height} pixels)"
            fmt = im.format or ""
            animated = bool(getattr(im, "is_animated", False))
            turned = im.getexif().get(0x0112, 1) not in (None, 1)  # EXIF orientation: the APIs ignore it
            scale = min(1.0, limits.max_edge / max(width, height), math.sqrt(limits.max_pixels / (width * height)))
            if fmt in _MEDIA_TYPES and not animated and not turned and scale >= 1.0:
                raw = Path(path).read_bytes()
                if _fits(len(raw), limits):
                    return Image(_MEDIA_TYPES[fmt], base64.b64encode(raw).decode("ascii"))
            if fmt == "JPEG":  # decode at a fraction of the size straight away: fast, and little memory
                im.draft("RGB", (max(1, int(width * scale)), max(1, int(height * scale))))
            im.seek(0)
            frame = ImageOps.exif_transpose(im)
            return _encode(frame, limits)
    except (UnidentifiedImageError, PILImage.DecompressionBombError) as exc:
        return f"it is not an image the model can take ({type(exc).__name__})"
    except (OSError, ValueError, SyntaxError) as exc:  # Pillow reports a broken file as any of these
        return f"it could not be decoded ({exc})"


def _fits(size: int, limits: Limits) -> bool:
    return (4 * math.ceil(size / 3) if limits.base64_counts else size) <= limits.max_bytes


def _encode(frame, limits: Limits) -> Image | str:
    """``frame`` scaled into the limits and encoded: PNG when it has transparency, else JPEG; smaller and
    smaller until it fits."""
    from PIL import Image as PILImage

    alpha = frame.mode in ("RGBA", "LA", "PA") or (frame.mode == "P" and "transparency" in frame.info)
    frame = frame.convert("RGBA" if alpha else "RGB")
    width, height = frame.size
    scale = min(1.0, limits.max_edge / max(width, height), math.sqrt(limits.max_pixels / (width * height)))
    for attempt in range(6):
        size = (max(1, int(width * scale)), max(1, int(height * scale)))  # floor: never past a limit
        picture = frame if size == frame.size else frame.resize(size, PILImage.LANCZOS)
        buf = io.BytesIO()
        if alpha and attempt < 2:
            picture.save(buf, "PNG", optimize=True)
            media = "image/png"
        else:
            if alpha:
                flat = PILImage.new("RGB", picture.size, (255, 255, 255))
                flat.paste(picture, mask=picture.getchannel("A"))
                picture = flat
            picture.save(buf, "JPEG", quality=85 if attempt < 3 else 70, optimize=True)
            media = "image/jpeg"
        if _fits(buf.tell(), limits):
            return Image(media, base64.b64encode(buf.getvalue()).decode("ascii"))
        scale *= 0.75
    return "it stays too large for the model even scaled down"


# ---------------------------------------------------------------- documents


@lru_cache(maxsize=32)
def document(path: str, _mtime_ns: int, _size: int, what: str) -> str:
    """The text of a document (up to a little over DOC_CHARS), or "\\x00" + why there is none."""
    if what == "pdf":
        return _pdf_text(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(DOC_CHARS * 4 + 4)
    except OSError as exc:
        return f"\x00it could not be read ({exc.strerror})"
    return raw.decode("utf-8", "replace")[: DOC_CHARS + 1]


def _pdf_text(path: str) -> str:
    try:
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError
    except ImportError:  # pragma: no cover - a dependency of the package
        return "\x00PDF text needs pypdf, which is not installed"
    try:
        reader = PdfReader(path)
        if reader.is_encrypted and not reader.decrypt(""):
            return "\x00the PDF is encrypted"
        parts, total = [], 0
        for number, page in enumerate(reader.pages[:PDF_PAGES], start=1):
            text = (page.extract_text() or "").strip()
            if text:
                parts.append(f"[page {number}]\n{text}")
                total += len(text)
            if total > DOC_CHARS:
                break
    except (PdfReadError, OSError, ValueError, KeyError, TypeError) as exc:
        return f"\x00the PDF could not be read ({type(exc).__name__})"
    if not parts:
        return "\x00the PDF has no text layer (a scan?)"
    pages = len(reader.pages)
    more = f"\n[the PDF has {pages} pages; the first {PDF_PAGES} were read]" if pages > PDF_PAGES else ""
    return "\n\n".join(parts)[: DOC_CHARS + 1] + more
